//===- Emitter.cpp - CUDA C++ for Kiln's kernels: the common parts --------===//
//
// The element types, literals and generated-code helpers, a kernel's
// signature and launch record, loads and stores, and the choice of kernel
// form (KernelEmitter::run); emitCuda() assembles the translation unit.
// The forms live in Elementwise.cpp, Rows.cpp, Columns.cpp, Scatter.cpp and
// Matmul.cpp; the elemental values in Values.cpp.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/Elementwise.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Passes.h"
#include "runtime/core/Random.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;

namespace kiln {
namespace cudagen {

bool typeInfo(Type t, TypeInfo &ti) {
  if (t.isF32()) ti = {"float", "float", true, false, ""};
  else if (t.isF64()) ti = {"double", "double", true, false, ""};
  else if (t.isF16()) ti = {"__half", "float", true, true, "kiln_round_half"};
  else if (t.isBF16()) ti = {"__nv_bfloat16", "float", true, true, "kiln_round_bf16"};
  else if (t.isInteger(32)) ti = {"int", "int", false, false, ""};
  else if (t.isInteger(64)) ti = {"long long", "long long", false, false, ""};
  else if (t.isInteger(1)) ti = {"unsigned char", "bool", false, false, ""};
  else return false;
  return true;
}

std::string floatLiteral(double v, bool isDouble) {
  return elementwise_table::cudaFloatLiteral(v, isDouble);
}

const char *const kHelpers = R"cuda(
// ---- Kiln's generated-code helpers -----------------------------------------
KILN_DEVICE float kiln_round_half(float x) { return __half2float(__float2half_rn(x)); }
KILN_DEVICE float kiln_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
/// max/min as arith.maximumf/minimumf: NaN if either operand is NaN.
KILN_DEVICE float kiln_maxf(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
KILN_DEVICE float kiln_minf(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
KILN_DEVICE double kiln_maxd(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }
KILN_DEVICE double kiln_mind(double a, double b) { return (a != a || b != b) ? a + b : fmin(a, b); }
)cuda";

/// runtime/core/Random.h's hash in CUDA, written from its constants.
static std::string randomHelpers() {
  namespace r = random;
  std::string s = "/// runtime/core/Random.h's mixer (splitmix64's finaliser).\n"
                  "KILN_DEVICE unsigned long long kiln_mix(unsigned long long x) {\n";
  s += fmt::format("  x += 0x{:X}ull;\n", r::kMixIncrement);
  for (const r::MixRound &m : r::kMixRounds)
    s += fmt::format("  x = (x ^ (x >> {})) * 0x{:X}ull;\n", m.shift, m.multiplier);
  s += fmt::format("  return x ^ (x >> {});\n}}\n", r::kMixFinalShift);
  constexpr uint64_t unitSteps = uint64_t(1) << (64 - r::kUnitShift);
  static_assert(r::kUnitScale * double(unitSteps) == 1.0);
  s += fmt::format("/// Uniform in [0, 1) from the top {} bits (plus one: (0, 1]).\n"
                   "KILN_DEVICE double kiln_unit(unsigned long long bits, int plusOne) {{\n"
                   "  return double((bits >> {}) + (unsigned long long)plusOne) * (1.0 / {}.0);\n"
                   "}}\n",
                   64 - r::kUnitShift, r::kUnitShift, unitSteps);
  return s;
}

std::string helpers() { return kHelpers + randomHelpers(); }

std::string KernelEmitter::signature(const std::string &fname) {
  std::string s = "KILN_KERNEL void " + fname + "(";
  for (unsigned i = 0; i < fn_.getNumArguments(); ++i) {
    auto mt = cast<MemRefType>(fn_.getArgument(i).getType());
    TypeInfo ti;
    typeInfo(mt.getElementType(), ti);
    s += fmt::format("{}{}{}* __restrict__ a{}", i ? ", " : "", written_[i] ? "" : "const ",
                     ti.storage, i);
  }
  return s + ")";
}

void KernelEmitter::finish(const std::string &fname, const char *form, int64_t grid,
                           int64_t block, std::vector<gpu::Launch> &launches, int64_t shared) {
  code_ += fmt::format("// {}: {} form, grid {}, block {}\n", name_, form, grid, block);
  std::string sig = signature(fname);
  sig.insert(sig.find(" void ") + 6, fmt::format("KILN_BOUNDS({}) ", block));
  code_ += sig + " {\n";
  code_ += body_;
  code_ += "}\nKILN_EMU_SHIM(" + fname + ");\n\n";
  body_.clear();
  gpu::Launch l;
  l.function = fname;
  l.grid[0] = std::max<int64_t>(grid, 1);
  l.block[0] = block;
  l.sharedBytes = shared;
  l.form = form;
  launches.push_back(l);
}

std::string KernelEmitter::accInit(Operation *red) {
  Type et = tensorOf(red->getResult(0)).getElementType();
  bool dbl = et.isF64();
  if (isa<ReduceMaxOp>(red))
    return floatLiteral(-INFINITY, dbl);
  return floatLiteral(0.0, dbl);
}

std::string KernelEmitter::accumulate(Operation *red, const std::string &acc,
                                      const std::string &v) {
  Type et = tensorOf(red->getResult(0)).getElementType();
  if (isa<ReduceMaxOp>(red))
    return fmt::format("{} = {}({}, {});", acc, et.isF64() ? "kiln_maxd" : "kiln_maxf", acc, v);
  return fmt::format("{} += {};", acc, v);
}

SmallVector<int64_t> KernelEmitter::keptDims(Operation *red) {
  ArrayRef<int64_t> axes = red->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  SmallVector<int64_t> kept;
  for (int64_t d = 0; d < tensorOf(red->getOperand(0)).getRank(); ++d)
    if (!llvm::is_contained(axes, d))
      kept.push_back(d);
  return kept;
}

std::string KernelEmitter::readReduction(Reduction &r, ArrayRef<std::string> idx) {
  if (!r.indexed)
    return r.storage;
  // The kept-within coordinates from the output index.
  bool keepdims = bool(r.op->getAttr("keepdims"));
  SmallVector<int64_t> kept = keptDims(r.op);
  RankedTensorType in = tensorOf(r.op->getOperand(0));
  SmallVector<std::string> coords;
  SmallVector<int64_t> sizes;
  for (int64_t d : r.keptWithin) {
    int64_t pos = keepdims ? d : llvm::find(kept, d) - kept.begin();
    coords.push_back(idx[pos]);
    sizes.push_back(in.getDimSize(d));
  }
  if (warpRows_) // each warp's values of the kept-within dims
    return fmt::format("{}[kiln_warp() * {} + {}]", r.storage, product(sizes),
                       linear(coords, sizes));
  return fmt::format("{}[{}]", r.storage, linear(coords, sizes));
}

std::string KernelEmitter::emit(Value v, ArrayRef<std::string> idx) {
  std::string k = key(v, idx);
  if (std::string found = lookup(k); !found.empty())
    return found;
  std::string result;
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    if (auto it = laneRead_.find(v); it != laneRead_.end() && !idx.empty())
      result = it->second;
    else {
      unsigned a = argOf_.lookup(v);
      TypeInfo ti;
      typeInfo(tensorOf(v).getElementType(), ti);
      std::string load = fmt::format("a{}[{}]", a, linear(idx, tensorOf(v).getShape()));
      std::string expr = ti.isLow ? "kiln_to_float(" + load + ")"
                         : ti.compute == "bool" ? "(" + load + " != 0)"
                                                : load;
      result = fresh("v");
      line(fmt::format("const {} {} = {};", ti.compute, result, expr));
    }
  } else {
    Operation *op = v.getDefiningOp();
    if (auto it = reductions_.find(op); it != reductions_.end())
      result = readReduction(it->second, idx);
    else
      result = emitOp(op, idx);
  }
  if (!result.empty())
    memo_.back()[k] = result;
  return result;
}

void KernelEmitter::store(unsigned i, ArrayRef<std::string> idx) {
  Value y = fusion_.getBlock().getTerminator()->getOperand(i);
  std::string v = emit(y, idx);
  TypeInfo ti;
  typeInfo(tensorOf(y).getElementType(), ti);
  std::string target =
      fmt::format("a{}[{}]", outArg_[i], linear(idx, tensorOf(y).getShape()));
  if (ti.isLow)
    line(fmt::format("{} = kiln_from_float<{}>({});", target, ti.storage, v));
  else if (ti.compute == "bool")
    line(fmt::format("{} = (unsigned char)({} ? 1 : 0);", target, v));
  else
    line(fmt::format("{} = {};", target, v));
}

LogicalResult KernelEmitter::run(std::string &code, std::vector<gpu::Launch> &launches) {
  written_.assign(fn_.getNumArguments(), false);
  for (Operation &op : fn_.getBody().front()) {
    if (auto f = dyn_cast<FusionOp>(op))
      fusion_ = f;
    if (auto m = dyn_cast<bufferization::MaterializeInDestinationOp>(op)) {
      auto arg = cast<BlockArgument>(m.getDest());
      written_[arg.getArgNumber()] = true;
      outArg_.push_back(arg.getArgNumber());
    }
  }
  if (!fusion_)
    return fail(nullptr, "the kernel has no kiln.fusion");
  for (auto [i, v] : llvm::enumerate(fusion_.getInputs())) {
    auto t = v.getDefiningOp<bufferization::ToTensorOp>();
    argOf_[fusion_.getBlock().getArgument(i)] = cast<BlockArgument>(t.getMemref()).getArgNumber();
  }
  for (Operation &op : fusion_.getBlock())
    for (Value v : op.getResults())
      if (tensorOf(v).getNumElements() >= (int64_t(1) << 31))
        return fail(&op, "tensors of 2^31 or more elements");
  for (Value v : fusion_.getOperands())
    if (tensorOf(v).getNumElements() >= (int64_t(1) << 31))
      return fail(nullptr, "tensors of 2^31 or more elements");

  // Composite ops become primitives; cross_entropy(none) too.
  Block &b = fusion_.getBlock();
  SmallVector<Operation *> ops;
  for (Operation &op : b.without_terminator())
    ops.push_back(&op);
  StringRef kind = fusion_.getKind();
  LogicalResult r = success();
  ScatterAddOp scatter;
  MatmulOp matmul;
  for (Operation *op : ops) {
    if (auto s = dyn_cast<ScatterAddOp>(op))
      scatter = s;
    if (auto m = dyn_cast<MatmulOp>(op))
      matmul = m;
  }
  bool anyReduction = llvm::any_of(ops, [&](Operation *op) { return isReduction(op); });
  if (scatter)
    r = emitScatter(scatter, launches);
  else if (matmul)
    r = emitMatmul(matmul, launches);
  else if (kind == "row_reduction" && anyReduction)
    r = emitRows(fusion_.getRows(), launches);
  else if (kind == "column_reduction" || (anyReduction && fusion_.getRows() == 0))
    r = emitColumns(launches);
  else if (anyReduction)
    r = emitRows(fusion_.getRows(), launches);
  else
    r = emitElementwise(launches);
  if (failed(r))
    return failure();
  code = constants_ + code_;
  return success();
}

} // namespace cudagen

/// softmax, log_softmax, layer_norm and cross_entropy as primitives (the
/// decompositions the CPU lowering uses), inside every fusion.
static void decomposeForCuda(ModuleOp module) {
  RewritePatternSet patterns(module.getContext());
  populateKilnDecompositionPatterns(patterns);
  GreedyRewriteConfig config;
  config.enableRegionSimplification = GreedySimplifyRegionLevel::Disabled;
  (void)applyPatternsAndFoldGreedily(module, std::move(patterns), config);
}

FailureOr<CudaProgram> emitCuda(ModuleOp neutral, const program::Program &program,
                                std::string &error, const CudaEmitOptions &options) {
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>(neutral->clone());
  markRoundingPoints(*copy);
  decomposeForCuda(*copy);
  CudaProgram out;
  out.source = "// Generated by kilnc: CUDA kernels of " + std::to_string(program.kernels.size()) +
               " Kiln kernels.\n";
  out.source += "// The prelude (runtime/cuda/kiln_cuda.h) is prepended when compiling.\n";
  out.source += cudagen::helpers();
  out.kernels.resize(program.kernels.size());
  for (auto [i, k] : llvm::enumerate(program.kernels)) {
    auto fn = copy->lookupSymbol<func::FuncOp>(k.symbol);
    if (!fn) {
      error = "kernel " + k.symbol + " has no target-neutral form";
      return failure();
    }
    cudagen::KernelEmitter e(fn, k.symbol, error, options);
    std::string code;
    if (failed(e.run(code, out.kernels[i])))
      return failure();
    out.source += "\n// ---- " + k.symbol + " (" + k.kind + "): ";
    for (size_t j = 0; j < k.locs.size() && j < 4; ++j)
      out.source += (j ? ", " : "") + k.locs[j];
    out.source += "\n" + code;
  }
  return out;
}

} // namespace kiln
