//===- Summary.h - What a compiled model contains ---------------*- C++ -*-===//
//
// `kilnc MODEL.kiln` (and `--emit=summary`) prints this: ops by kind, the
// parameters with shapes, initialisers and counts, inputs, outputs and the
// train configuration.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_SUMMARY_H
#define KILN_COMPILER_SUMMARY_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>
#include <vector>

namespace kiln {

struct ModelSummary {
  struct Tensor {
    std::string name, layer, type, init;
    int64_t count = 0;
  };
  std::string model, source;
  int64_t numOps = 0;
  std::map<std::string, int64_t> opCounts;
  std::vector<Tensor> params, inputs, outputs;
  int64_t paramCount = 0;
  /// Parameters not created by position_embedding (nanoGPT's count).
  int64_t paramCountNoPosition = 0;
  std::string train;
  /// deterministic = "devices": the chunking ("devices, 8 chunks of 2 rows
  /// per global batch of 16, 4 per device"), else empty.
  std::string deterministic;
  /// Ops per function of the training program, when it was built.
  std::vector<std::pair<std::string, int64_t>> program;
  /// On a mesh of several devices: the memory per device for plain data
  /// parallelism, ZeRO-1 and ZeRO-2 (printZeroMemory), else empty.
  std::string memory;
};

/// Adds the op count of every function in `module` to `summary.program`,
/// and on a mesh of several devices the memory report to `summary.memory`.
void addProgram(ModelSummary &summary, mlir::ModuleOp module);

/// Reads the summary off a module built by the frontend (func @forward).
ModelSummary summarize(mlir::ModuleOp module);
void print(const ModelSummary &summary, llvm::raw_ostream &os);

} // namespace kiln

#endif // KILN_COMPILER_SUMMARY_H
