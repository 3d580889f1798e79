//===- KernelEmitter.h - One kernel's CUDA C++ (internal) -------*- C++ -*-===//
//
// Shared by the files of compiler/cuda/: every value of a kernel is computed
// "elementally": emit(v, index) writes the statements that compute v at one
// index (a list of C++ expressions, one per dimension) and returns the local
// variable that holds it. Index maps (broadcast, reshape, transpose, slice,
// pad, concat, gather) rewrite the index and recurse; elementwise ops recurse
// at the same index; inputs are loads; reductions are read from where their
// stage left them (shared memory in row kernels, a register or shared scalar
// in column kernels). Values are memoised per (value, index) within the
// current loop body.
//
// Emitter.cpp holds the common parts (signature, loads, stores, the choice of
// form), Values.cpp the elemental values, and one file per kernel form:
// Elementwise.cpp, Rows.cpp, Columns.cpp, Scatter.cpp, Matmul.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_CUDA_KERNELEMITTER_H
#define KILN_COMPILER_CUDA_KERNELEMITTER_H

#include "compiler/cuda/Emitter.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace kiln::cudagen {

using mlir::ArrayRef;
using mlir::Block;
using mlir::LogicalResult;
using mlir::Operation;
using mlir::RankedTensorType;
using mlir::SmallVector;
using mlir::Type;
using mlir::Value;
namespace func = mlir::func;

inline RankedTensorType tensorOf(Value v) { return mlir::cast<RankedTensorType>(v.getType()); }

inline int64_t product(ArrayRef<int64_t> s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// How values of an element type are stored and computed.
struct TypeInfo {
  std::string storage, compute;
  bool isFloat = false, isLow = false; // f16/bf16
  std::string round;                   // rounding at a cast to the type ("" if none)
};

bool typeInfo(Type t, TypeInfo &ti);

/// A C++ literal for `v` (float with an `f` suffix, or double); NaN and
/// infinities by their bits.
std::string floatLiteral(double v, bool isDouble);

/// The helpers every generated unit has after the prelude (max/min,
/// rounding, and runtime/core/Random.h's hash as kiln_mix and kiln_unit).
std::string helpers();

/// How emitScatterChunks splits a scatter_add of `m` indices into `rows`
/// rows: `cols` threads per block (0: the partials do not fit, use another
/// form), `tiles` blocks across inner, `chunks` chunks of `chunk` indices
/// (chunks <= 1: use another form).
struct ScatterChunking {
  int64_t cols = 0, tiles = 0, chunks = 0, chunk = 0;
};
ScatterChunking scatterChunking(int64_t outer, int64_t inner, int64_t rows, int64_t m,
                                int64_t computeBytes);

/// One kernel's CUDA code.
class KernelEmitter {
public:
  KernelEmitter(func::FuncOp fn, std::string name, std::string &error,
                const CudaEmitOptions &options = {})
      : fn_(fn), name_(std::move(name)), error_(error), columnTiles_(options.columnTiles),
        scatterChunks_(options.scatterChunks), halfVectors_(options.halfVectors) {}

  LogicalResult run(std::string &code, std::vector<gpu::Launch> &launches);

private:
  // --- output ----------------------------------------------------------------
  void line(const std::string &s) { body_ += std::string(indent_ * 2, ' ') + s + "\n"; }
  std::string fresh(const char *prefix) { return fmt::format("{}{}", prefix, counter_++); }
  void push() { memo_.emplace_back(); ++indent_; }
  void pop() { memo_.pop_back(); --indent_; }
  LogicalResult fail(Operation *op, const std::string &why) {
    if (error_.empty())
      error_ = fmt::format("kernel {}: {} has no CUDA form: {}", name_,
                           op ? op->getName().getStringRef().str() : std::string("?"), why);
    return mlir::failure();
  }

  // --- indices ---------------------------------------------------------------
  std::string linear(ArrayRef<std::string> idx, ArrayRef<int64_t> shape) {
    if (shape.empty())
      return "0";
    std::string s = idx[0];
    for (size_t d = 1; d < shape.size(); ++d)
      s = fmt::format("({}) * {} + {}", s, shape[d], idx[d]);
    return s;
  }
  /// Declares the coordinates of linear index `lin` in `shape`.
  SmallVector<std::string> delinear(const std::string &lin, ArrayRef<int64_t> shape) {
    SmallVector<std::string> out(shape.size());
    int64_t stride = 1;
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      std::string v = fresh("i");
      if (shape[d] == 1)
        line(fmt::format("const int {} = 0;", v));
      else if (d == 0)
        line(fmt::format("const int {} = ({}) / {};", v, lin, stride));
      else
        line(fmt::format("const int {} = (({}) / {}) % {};", v, lin, stride, shape[d]));
      out[d] = v;
      stride *= shape[d];
    }
    return out;
  }

  // --- values ----------------------------------------------------------------
  std::string key(Value v, ArrayRef<std::string> idx) {
    std::string k = fmt::format("{}", v.getAsOpaquePointer());
    for (const std::string &i : idx)
      k += "|" + i;
    return k;
  }
  std::string lookup(const std::string &k) {
    for (auto it = memo_.rbegin(); it != memo_.rend(); ++it)
      if (auto f = it->find(k); f != it->end())
        return f->second;
    return "";
  }
  std::string emit(Value v, ArrayRef<std::string> idx);
  std::string emitOp(Operation *op, ArrayRef<std::string> idx);
  std::string scalarOp(Operation *op, ArrayRef<std::string> a, const TypeInfo &ti,
                       const TypeInfo &operandType);

  /// Where a reduction's result lives.
  struct Reduction {
    Operation *op;
    std::string storage; ///< shared array (rows), shared scalar or register (columns)
    SmallVector<int64_t> keptWithin; ///< row kernels: kept dims >= rows
    bool indexed = false;           ///< storage[k] (rows) or a scalar
  };
  std::string readReduction(Reduction &r, ArrayRef<std::string> idx);
  /// The coordinates of a reduction's input index for its output index.
  SmallVector<int64_t> keptDims(Operation *red);
  bool isReduction(Operation *op) { return mlir::isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op); }
  /// Emits a stage computing `red` over its reduced dims. `outer` gives the
  /// input coordinates that are fixed (rows, or the kept index), by input
  /// dim; the rest are reduced (and, for row kernels, kept-within dims
  /// looped over by warps).
  LogicalResult rowStage(Reduction &r, int64_t rows, ArrayRef<std::string> rowCoords);
  std::string accumulate(Operation *red, const std::string &acc, const std::string &v);
  std::string accInit(Operation *red);
  /// `e`, rounded to the low type `ti` when `op` is a rounding point
  /// (kRoundAttr, passes/Passes.h): the value every consumer in the kernel
  /// reads, as if it had been stored.
  std::string rounded(Operation *op, const TypeInfo &ti, const std::string &e);

  LogicalResult emitElementwise(std::vector<gpu::Launch> &launches);
  /// The `elementwise(vec8)` loop over `shape` for outputs `outs`, each of
  /// `identityArgs` read at the output's index.
  void emitHalfVectors(ArrayRef<int64_t> shape, ArrayRef<unsigned> outs,
                       ArrayRef<Value> identityArgs);
  LogicalResult emitRows(int64_t rows, std::vector<gpu::Launch> &launches);
  LogicalResult emitColumns(std::vector<gpu::Launch> &launches);
  LogicalResult emitColumnTiles(
      llvm::ArrayRef<mlir::Operation *> reds, int64_t k, int64_t n,
      llvm::ArrayRef<int64_t> keptSizes, llvm::ArrayRef<int64_t> redSizes,
      llvm::ArrayRef<unsigned> reducedOuts,
      llvm::function_ref<llvm::SmallVector<std::string>(llvm::ArrayRef<std::string>,
                                                        llvm::ArrayRef<std::string>)>
          fullIndex,
      llvm::function_ref<llvm::SmallVector<std::string>(mlir::Value,
                                                        llvm::ArrayRef<std::string>)>
          reducedIndex,
      std::vector<gpu::Launch> &launches);
  LogicalResult emitScatter(ScatterAddOp op, std::vector<gpu::Launch> &launches);
  void scatterRow(ScatterAddOp op, int64_t rowsN);
  std::string scatterUpdate(ScatterAddOp op, int64_t m, int64_t inner);
  LogicalResult emitScatterByRow(ScatterAddOp op, const std::string &fname, int64_t outer,
                                 int64_t inner, int64_t rowsN, int64_t m, const TypeInfo &ti,
                                 std::vector<gpu::Launch> &launches);
  LogicalResult emitScatterChunks(ScatterAddOp op, const std::string &fname, int64_t outer,
                                  int64_t inner, int64_t rowsN, int64_t m,
                                  const ScatterChunking &ch, const TypeInfo &ti,
                                  std::vector<gpu::Launch> &launches);
  LogicalResult emitMatmul(MatmulOp op, std::vector<gpu::Launch> &launches);
  /// Stores output `i` at `idx`.
  void store(unsigned i, ArrayRef<std::string> idx);
  std::string signature(const std::string &fname);
  void finish(const std::string &fname, const char *form, int64_t grid, int64_t block,
              std::vector<gpu::Launch> &launches, int64_t shared = 0);

  func::FuncOp fn_;
  std::string name_;
  std::string &error_;
  bool columnTiles_; ///< CudaEmitOptions::columnTiles
  bool scatterChunks_; ///< CudaEmitOptions::scatterChunks
  bool halfVectors_; ///< CudaEmitOptions::halfVectors
  FusionOp fusion_;
  Block *body_block_ = nullptr;
  llvm::DenseMap<Value, unsigned> argOf_;   ///< fusion block arg -> kernel arg
  SmallVector<unsigned> outArg_;            ///< fusion result -> kernel arg
  SmallVector<bool> written_;               ///< kernel arg is written
  std::vector<llvm::StringMap<std::string>> memo_;
  llvm::DenseMap<Operation *, Reduction> reductions_;
  std::string body_, code_, constants_;
  int indent_ = 0, counter_ = 0, kernelCount_ = 0;
  /// Vectorised elementwise loops: block arg -> "va.x"-style lane reads.
  llvm::DenseMap<Value, std::string> laneRead_;
  /// Row kernels: one warp per row (kRowsPerBlock rows per block) instead
  /// of one block per row.
  bool warpRows_ = false;
};

/// Rows per block (one per warp) in the warp-per-row form; rows of at most
/// kMaxWarpRow elements use it (up to 32 elements per lane).
constexpr int64_t kRowsPerBlock = 8;
/// scatter_add by row element (every thread reads every index) up to this
/// many rows and rows x indices.
constexpr int64_t kMaxScatterRows = 1024;
constexpr int64_t kMaxScatterWork = int64_t(1) << 24;
constexpr int64_t kMaxWarpRow = 1024;

/// The chunked scatter_add (`scatter(chunks)`): a block's rows x columns
/// partials in static shared memory (at most this many bytes), chunks of at
/// least kScatterMinChunk indices and at most kScatterMaxChunks chunks, and
/// at most kScatterMaxPartials elements of global scratch.
constexpr int64_t kScatterSharedBytes = 40 * 1024;
constexpr int64_t kScatterMinChunk = 64;
constexpr int64_t kScatterMaxChunks = 1024;
constexpr int64_t kScatterMaxPartials = int64_t(1) << 26;


} // namespace kiln::cudagen

#endif // KILN_COMPILER_CUDA_KERNELEMITTER_H
