//===- Package.h - Writing a .kpack artifact ---------------------*- C++ -*-===//
//
// writePackage() assembles the sections docs/artifact.md defines from a
// compiled program: the manifest (signature, train config, compiler and
// source identity), initial parameters and optimizer state (from @init on
// the reference interpreter, with the given seed; all-zero values optionally
// listed by name instead of stored), the buffer plan and
// schedule, the CPU kernels as LLVM bitcode, and provenance.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_PACKAGE_H
#define KILN_COMPILER_PACKAGE_H

#include "compiler/Codegen.h"
#include "runtime/core/Artifact.h"

#include <string>
#include <vector>

namespace kiln {

struct PackageInputs {
  std::string sourcePath, sourceText;
  std::string target = "cpu";
  uint64_t seed = 0;
  /// Sections of other targets (kernels.cuda.*), appended as given.
  std::vector<artifact::Section> extraSections;
  /// The manifest's "kernels" entry for CUDA (JSON text), when present.
  std::string cudaManifest;
  /// Leave initial values whose bytes are all zero (optimizer moments,
  /// zero-initialised biases) out of the initializers section; the manifest
  /// lists them under "zero_initializers" and Package::open re-creates them.
  bool omitZeroInitializers = false;
};

Expected<std::vector<artifact::Section>>
buildPackage(mlir::ModuleOp module, const CompiledProgram &compiled,
             const PackageInputs &inputs);

} // namespace kiln

#endif // KILN_COMPILER_PACKAGE_H
