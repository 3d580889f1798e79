//===- CudaEmitter.cpp - CUDA C++ for Kiln's kernels ----------------------===//
//
// Every value of a kernel is computed "elementally": emit(v, index) writes
// the statements that compute v at one index (a list of C++ expressions, one
// per dimension) and returns the local variable that holds it. Index maps
// (broadcast, reshape, transpose, slice, pad, concat, gather) rewrite the
// index and recurse; elementwise ops recurse at the same index; inputs are
// loads; reductions are read from where their stage left them (shared memory
// in row kernels, a register or shared scalar in column kernels). Values are
// memoised per (value, index) within the current loop body.
//
//===----------------------------------------------------------------------===//
#include "compiler/CudaEmitter.h"

#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringMap.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <sstream>

using namespace mlir;

namespace kiln {

namespace {

RankedTensorType tensorOf(Value v) { return cast<RankedTensorType>(v.getType()); }

int64_t product(ArrayRef<int64_t> s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// How values of an element type are stored and computed.
struct TypeInfo {
  std::string storage, compute;
  bool isFloat = false, isLow = false; // f16/bf16
  std::string round;                   // rounding after each op ("" if none)
};

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
  if (std::isnan(v))
    return isDouble ? "__longlong_as_double(0x7ff8000000000000ll)" : "__int_as_float(0x7fc00000)";
  if (std::isinf(v))
    return v > 0 ? (isDouble ? "__longlong_as_double(0x7ff0000000000000ll)"
                             : "__int_as_float(0x7f800000)")
                 : (isDouble ? "__longlong_as_double(0xfff0000000000000ll)"
                             : "__int_as_float(0xff800000)");
  std::string s = fmt::format("{:.17g}", v);
  if (s.find_first_of(".eE") == std::string::npos)
    s += ".0";
  return isDouble ? s : s + "f";
}

/// The helpers every generated unit has after the prelude.
const char *kHelpers = R"cuda(
// ---- Kiln's generated-code helpers -----------------------------------------
KILN_DEVICE float kiln_round_half(float x) { return __half2float(__float2half_rn(x)); }
KILN_DEVICE float kiln_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
/// max/min as arith.maximumf/minimumf: NaN if either operand is NaN.
KILN_DEVICE float kiln_maxf(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
KILN_DEVICE float kiln_minf(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
KILN_DEVICE double kiln_maxd(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }
KILN_DEVICE double kiln_mind(double a, double b) { return (a != a || b != b) ? a + b : fmin(a, b); }
/// runtime/core/Random.h's mixer (splitmix64's finaliser).
KILN_DEVICE unsigned long long kiln_mix(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Uniform in [0, 1) from the top 24 bits (plus one: (0, 1]).
KILN_DEVICE double kiln_unit(unsigned long long bits, int plusOne) {
  return double((bits >> 40) + (unsigned long long)plusOne) * (1.0 / 16777216.0);
}
)cuda";

/// One kernel's CUDA code.
class KernelEmitter {
public:
  KernelEmitter(func::FuncOp fn, std::string name, std::string &error)
      : fn_(fn), name_(std::move(name)), error_(error) {}

  LogicalResult run(std::string &code, std::vector<CudaLaunch> &launches);

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
    return failure();
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
  bool isReduction(Operation *op) { return isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op); }
  /// Emits a stage computing `red` over its reduced dims. `outer` gives the
  /// input coordinates that are fixed (rows, or the kept index), by input
  /// dim; the rest are reduced (and, for row kernels, kept-within dims
  /// looped over by warps).
  LogicalResult rowStage(Reduction &r, int64_t rows, ArrayRef<std::string> rowCoords);
  std::string accumulate(Operation *red, const std::string &acc, const std::string &v);
  std::string accInit(Operation *red);

  LogicalResult emitElementwise(std::vector<CudaLaunch> &launches);
  LogicalResult emitRows(int64_t rows, std::vector<CudaLaunch> &launches);
  LogicalResult emitColumns(std::vector<CudaLaunch> &launches);
  LogicalResult emitScatter(ScatterAddOp op, std::vector<CudaLaunch> &launches);
  LogicalResult emitMatmul(MatmulOp op, std::vector<CudaLaunch> &launches);
  /// Stores output `i` at `idx`.
  void store(unsigned i, ArrayRef<std::string> idx);
  std::string signature(const std::string &fname);
  void finish(const std::string &fname, const char *form, int64_t grid, int64_t block,
              std::vector<CudaLaunch> &launches, int64_t shared = 0);

  func::FuncOp fn_;
  std::string name_;
  std::string &error_;
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
constexpr int64_t kMaxWarpRow = 1024;

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
                           int64_t block, std::vector<CudaLaunch> &launches, int64_t shared) {
  code_ += fmt::format("// {}: {} form, grid {}, block {}\n", name_, form, grid, block);
  std::string sig = signature(fname);
  sig.insert(sig.find(" void ") + 6, fmt::format("KILN_BOUNDS({}) ", block));
  code_ += sig + " {\n";
  code_ += body_;
  code_ += "}\nKILN_EMU_SHIM(" + fname + ");\n\n";
  body_.clear();
  CudaLaunch l;
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

std::string KernelEmitter::scalarOp(Operation *op, ArrayRef<std::string> a, const TypeInfo &ti,
                                    const TypeInfo &oti) {
  bool f = oti.isFloat, dbl = oti.compute == "double";
  auto fn = [&](const char *name) {
    return fmt::format("{}{}({})", name, dbl ? "" : "f", a[0]);
  };
  auto lit = [&](double x) { return floatLiteral(x, dbl); };
  if (isa<NegOp>(op)) return "(-" + a[0] + ")";
  if (isa<AbsOp>(op)) return f ? fn("fabs") : fmt::format("({0} < 0 ? -{0} : {0})", a[0]);
  if (isa<ExpOp>(op)) return fn("exp");
  if (isa<LogOp>(op)) return fn("log");
  if (isa<SqrtOp>(op)) return fn("sqrt");
  if (isa<RsqrtOp>(op)) return fmt::format("({} / {})", lit(1.0), fn("sqrt"));
  if (isa<TanhOp>(op)) return fn("tanh");
  if (isa<ErfOp>(op)) return fn("erf");
  if (isa<CosOp>(op)) return fn("cos");
  if (isa<SinOp>(op)) return fn("sin");
  if (isa<SigmoidOp>(op))
    return fmt::format("({} / ({} + {}{}(-{})))", lit(1.0), lit(1.0), "exp", dbl ? "" : "f", a[0]);
  if (isa<ReluOp>(op))
    return f ? fmt::format("(({0} != {0} || {0} > {1}) ? {0} : {1})", a[0], lit(0.0))
             : fmt::format("({0} > 0 ? {0} : 0)", a[0]);
  if (auto g = dyn_cast<GeluOp>(op)) {
    if (g.getApproximation() == GeluApproximation::erf)
      return fmt::format("({1} * {0} * ({2} + erf{4}({0} * {3})))", a[0], lit(0.5), lit(1.0),
                         lit(M_SQRT1_2), dbl ? "" : "f");
    return fmt::format("({1} * {0} * ({2} + tanh{5}({3} * ({0} + {4} * {0} * {0} * {0}))))",
                       a[0], lit(0.5), lit(1.0), lit(std::sqrt(2.0 / M_PI)), lit(0.044715),
                       dbl ? "" : "f");
  }
  if (isa<AddOp>(op)) return fmt::format("({} + {})", a[0], a[1]);
  if (isa<SubOp>(op)) return fmt::format("({} - {})", a[0], a[1]);
  if (isa<MulOp>(op)) return fmt::format("({} * {})", a[0], a[1]);
  if (isa<DivOp>(op)) return fmt::format("({} / {})", a[0], a[1]);
  if (isa<PowOp>(op)) return fmt::format("pow{}({}, {})", dbl ? "" : "f", a[0], a[1]);
  if (isa<MaxOp>(op))
    return f ? fmt::format("{}({}, {})", dbl ? "kiln_maxd" : "kiln_maxf", a[0], a[1])
             : fmt::format("max({}, {})", a[0], a[1]);
  if (isa<MinOp>(op))
    return f ? fmt::format("{}({}, {})", dbl ? "kiln_mind" : "kiln_minf", a[0], a[1])
             : fmt::format("min({}, {})", a[0], a[1]);
  if (auto c = dyn_cast<CompareOp>(op)) {
    const char *o = "==";
    switch (c.getDirection()) {
    case CompareDirection::eq: o = "=="; break;
    case CompareDirection::ne: o = "!="; break;
    case CompareDirection::lt: o = "<"; break;
    case CompareDirection::le: o = "<="; break;
    case CompareDirection::gt: o = ">"; break;
    case CompareDirection::ge: o = ">="; break;
    }
    return fmt::format("({} {} {})", a[0], o, a[1]);
  }
  if (isa<SelectOp>(op)) return fmt::format("({} ? {} : {})", a[0], a[1], a[2]);
  if (isa<CastOp>(op)) {
    if (ti.compute == "bool")
      return fmt::format("({} != 0)", a[0]);
    if (oti.compute == "bool")
      return fmt::format("({} ? ({})1 : ({})0)", a[0], ti.compute, ti.compute);
    return fmt::format("(({}){})", ti.compute, a[0]);
  }
  return "";
}

std::string KernelEmitter::emitOp(Operation *op, ArrayRef<std::string> idx) {
  Value r = op->getResult(0);
  RankedTensorType rt = tensorOf(r);
  TypeInfo ti;
  if (!typeInfo(rt.getElementType(), ti)) {
    (void)fail(op, "unsupported element type");
    return "";
  }
  auto define = [&](const std::string &expr) {
    std::string name = fresh("v");
    std::string e = ti.round.empty() ? expr : ti.round + "(" + expr + ")";
    line(fmt::format("const {} {} = {};", ti.compute, name, e));
    return name;
  };
  if (auto c = dyn_cast<ConstantOp>(op)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense) {
      (void)fail(op, "a constant that is not dense");
      return "";
    }
    auto scalarOf = [&](Attribute a) -> std::string {
      if (auto fa = dyn_cast<FloatAttr>(a))
        return floatLiteral(fa.getValueAsDouble(), ti.compute == "double");
      if (auto ia = dyn_cast<IntegerAttr>(a)) {
        if (ti.compute == "bool")
          return ia.getValue().isZero() ? "false" : "true";
        return fmt::format("({}){}", ti.compute, ia.getValue().getSExtValue());
      }
      return "0";
    };
    if (dense.isSplat())
      return scalarOf(dense.getSplatValue<Attribute>());
    std::string name = fresh("kiln_const");
    std::string vals;
    for (Attribute a : dense.getValues<Attribute>())
      vals += (vals.empty() ? "" : ", ") + scalarOf(a);
    constants_ += fmt::format("__device__ const {} {}[{}] = {{{}}};\n",
                              ti.compute == "bool" ? "bool" : ti.compute, name,
                              rt.getNumElements(), vals);
    return define(fmt::format("{}[{}]", name, linear(idx, rt.getShape())));
  }
  if (auto iota = dyn_cast<IotaOp>(op))
    return define(fmt::format("({}){}", ti.compute, idx[iota.getDim()]));
  if (auto bc = dyn_cast<BroadcastInDimOp>(op)) {
    RankedTensorType in = bc.getOperand().getType();
    SmallVector<std::string> oi;
    for (auto [i, d] : llvm::enumerate(bc.getDims()))
      oi.push_back(in.getDimSize(i) == 1 && rt.getDimSize(d) != 1 ? std::string("0") : idx[d]);
    return emit(bc.getOperand(), oi);
  }
  if (auto rs = dyn_cast<ReshapeOp>(op)) {
    RankedTensorType in = rs.getOperand().getType();
    if (in.getShape() == rt.getShape())
      return emit(rs.getOperand(), idx);
    std::string lin = fresh("l");
    line(fmt::format("const int {} = {};", lin, linear(idx, rt.getShape())));
    return emit(rs.getOperand(), delinear(lin, in.getShape()));
  }
  if (auto t = dyn_cast<TransposeOp>(op)) {
    ArrayRef<int64_t> perm = t.getPermutation();
    SmallVector<std::string> oi(perm.size());
    for (size_t d = 0; d < perm.size(); ++d)
      oi[perm[d]] = idx[d];
    return emit(t.getOperand(), oi);
  }
  if (auto s = dyn_cast<SliceOp>(op)) {
    SmallVector<std::string> oi;
    for (size_t d = 0; d < idx.size(); ++d) {
      int64_t st = s.getStart()[d], sr = s.getStride()[d];
      oi.push_back(st == 0 && sr == 1 ? idx[d] : fmt::format("({} + {} * {})", st, sr, idx[d]));
    }
    return emit(s.getOperand(), oi);
  }
  if (auto pad = dyn_cast<PadOp>(op)) {
    RankedTensorType in = pad.getOperand().getType();
    std::string ok = fresh("ok");
    std::string cond = "true";
    SmallVector<std::string> oi;
    for (size_t d = 0; d < idx.size(); ++d) {
      int64_t lo = pad.getLow()[d], step = pad.getInterior()[d] + 1, n = in.getDimSize(d);
      if (lo == 0 && step == 1 && pad.getHigh()[d] == 0) {
        oi.push_back(idx[d]);
        continue;
      }
      std::string t = fresh("p");
      line(fmt::format("const int {} = {} - ({});", t, idx[d], lo));
      cond += fmt::format(" && {0} >= 0 && {0} % {1} == 0 && {0} / {1} < {2}", t, step, n);
      oi.push_back(fmt::format("min(max({} / {}, 0), {})", t, step, n - 1));
    }
    line(fmt::format("const bool {} = {};", ok, cond));
    std::string x = emit(pad.getOperand(), oi);
    return define(fmt::format("({} ? {} : {})", ok, x,
                              floatLiteral(pad.getValue().convertToDouble(),
                                           ti.compute == "double")));
  }
  if (auto c = dyn_cast<ConcatOp>(op)) {
    int64_t dim = c.getDim(), offset = 0;
    std::string expr;
    SmallVector<std::pair<std::string, std::string>> parts; // condition, value
    for (Value in : c.getInputs()) {
      int64_t n = tensorOf(in).getDimSize(dim);
      SmallVector<std::string> oi(idx.begin(), idx.end());
      oi[dim] = fmt::format("min(max({} - {}, 0), {})", idx[dim], offset, n - 1);
      parts.push_back({fmt::format("{} < {}", idx[dim], offset + n), emit(in, oi)});
      offset += n;
    }
    expr = parts.back().second;
    for (int i = int(parts.size()) - 2; i >= 0; --i)
      expr = fmt::format("({} ? {} : {})", parts[i].first, parts[i].second, expr);
    return define(expr);
  }
  if (auto g = dyn_cast<GatherOp>(op)) {
    RankedTensorType table = g.getOperand().getType();
    RankedTensorType ind = g.getIndices().getType();
    int64_t axis = g.getAxis(), ir = ind.getRank();
    SmallVector<std::string> ii(idx.begin() + axis, idx.begin() + axis + ir);
    std::string raw = emit(g.getIndices(), ii);
    std::string row = fresh("g");
    line(fmt::format("const int {} = (int)min(max((long long){}, 0ll), {}ll);", row, raw,
                     table.getDimSize(axis) - 1));
    SmallVector<std::string> ti2(idx.begin(), idx.begin() + axis);
    ti2.push_back(row);
    for (int64_t d = axis + ir; d < int64_t(idx.size()); ++d)
      ti2.push_back(idx[d]);
    return emit(g.getOperand(), ti2);
  }
  if (auto d = dyn_cast<DropoutOp>(op)) {
    std::string seed = emit(d.getSeed(), {});
    uint64_t salt = uint64_t(d.getSalt());
    uint64_t saltMix = salt; // mix(salt), as runtime/core/Random.h
    saltMix += 0x9E3779B97F4A7C15ull;
    saltMix = (saltMix ^ (saltMix >> 30)) * 0xBF58476D1CE4E5B9ull;
    saltMix = (saltMix ^ (saltMix >> 27)) * 0x94D049BB133111EBull;
    saltMix ^= saltMix >> 31;
    std::string bits = fresh("b");
    line(fmt::format("const unsigned long long {} = kiln_mix(kiln_mix((unsigned long long){} ^ "
                     "0x{:x}ull) + (unsigned long long)({}));",
                     bits, seed, saltMix, linear(idx, rt.getShape())));
    double rate = d.getRate().convertToDouble();
    std::string x = emit(d.getOperand(), idx);
    return define(fmt::format("(kiln_unit({}, 0) >= {} ? {} * {} : {})", bits,
                              floatLiteral(rate, true), x,
                              floatLiteral(1.0 / (1.0 - rate), ti.compute == "double"),
                              floatLiteral(0.0, ti.compute == "double")));
  }
  if (auto rnd = dyn_cast<RandomOp>(op)) {
    std::string seed = emit(rnd.getSeed(), {});
    uint64_t salt = uint64_t(rnd.getSalt());
    salt += 0x9E3779B97F4A7C15ull;
    salt = (salt ^ (salt >> 30)) * 0xBF58476D1CE4E5B9ull;
    salt = (salt ^ (salt >> 27)) * 0x94D049BB133111EBull;
    salt ^= salt >> 31;
    std::string keyed = fresh("k");
    line(fmt::format("const unsigned long long {} = kiln_mix((unsigned long long){} ^ 0x{:x}ull);",
                     keyed, seed, salt));
    std::string lin = linear(idx, rt.getShape());
    if (rnd.getDistribution() == RandomDistribution::normal) {
      std::string k2 = fresh("k");
      line(fmt::format("const unsigned long long {} = 2ull * (unsigned long long)({});", k2, lin));
      return define(fmt::format(
          "({0})(sqrt(-2.0 * log(kiln_unit(kiln_mix({1} + {2}), 1))) * "
          "cos(6.283185307179586 * kiln_unit(kiln_mix({1} + {2} + 1ull), 0)))",
          ti.compute, keyed, k2));
    }
    return define(fmt::format("({})kiln_unit(kiln_mix({} + (unsigned long long)({})), 0)",
                              ti.compute, keyed, lin));
  }
  if (isElementwiseOp(op)) {
    TypeInfo oti;
    typeInfo(tensorOf(op->getOperand(isa<SelectOp>(op) ? 1 : 0)).getElementType(), oti);
    SmallVector<std::string> a;
    for (Value v : op->getOperands())
      a.push_back(emit(v, idx));
    std::string e = scalarOp(op, a, ti, oti);
    if (e.empty()) {
      (void)fail(op, "no scalar form");
      return "";
    }
    return define(e);
  }
  (void)fail(op, isReduction(op) ? "a reduction outside a reduction kernel form"
                                 : "no elemental form");
  return "";
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

//===----------------------------------------------------------------------===//
// Elementwise: a grid-stride loop per output shape
//===----------------------------------------------------------------------===//

LogicalResult KernelEmitter::emitElementwise(std::vector<CudaLaunch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  // A launch per output shape, and at most 8 outputs per launch: one
  // thread's share of a wide multi-output kernel (13 optimizer updates) would
  // not fit in registers; shared scalar work is recomputed per launch.
  //
  // Outputs written over an input (parameters and optimizer state updated
  // in place) constrain the split: a launch that overwrites X must not run
  // before a launch that still reads X. Outputs of one shape that touch the
  // same overwritten input stay in one launch; across shapes, readers are
  // ordered before the writer.
  unsigned numOut = yields.size();
  SmallVector<int> writesInput(numOut, -1); // kernel arg overwritten, or -1
  SmallVector<llvm::DenseSet<unsigned>> reads(numOut);
  for (unsigned o = 0; o < numOut; ++o) {
    for (auto &[arg, num] : argOf_)
      if (num == outArg_[o])
        writesInput[o] = int(num);
    llvm::DenseSet<Value> seen;
    SmallVector<Value> work{yields[o]};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (!seen.insert(v).second)
        continue;
      if (isa<BlockArgument>(v)) {
        if (argOf_.count(v))
          reads[o].insert(argOf_.lookup(v));
        continue;
      }
      for (Value x : v.getDefiningOp()->getOperands())
        work.push_back(x);
    }
  }
  auto conflict = [&](unsigned a, unsigned b) {
    return (writesInput[a] >= 0 && reads[b].count(unsigned(writesInput[a]))) ||
           (writesInput[b] >= 0 && reads[a].count(unsigned(writesInput[b])));
  };
  std::map<SmallVector<int64_t>, SmallVector<unsigned>> byShape;
  for (auto [i, y] : llvm::enumerate(yields))
    byShape[SmallVector<int64_t>(tensorOf(y).getShape())].push_back(unsigned(i));
  std::vector<std::pair<SmallVector<int64_t>, SmallVector<unsigned>>> groups;
  for (auto &[shape, all] : byShape) {
    // Components of outputs linked by in-place hazards, packed into launches.
    SmallVector<unsigned> comp(all.size());
    for (unsigned i = 0; i < all.size(); ++i)
      comp[i] = i;
    std::function<unsigned(unsigned)> root = [&](unsigned i) {
      return comp[i] == i ? i : comp[i] = root(comp[i]);
    };
    for (unsigned i = 0; i < all.size(); ++i)
      for (unsigned j = i + 1; j < all.size(); ++j)
        if (conflict(all[i], all[j]))
          comp[root(i)] = root(j);
    std::map<unsigned, SmallVector<unsigned>> members;
    for (unsigned i = 0; i < all.size(); ++i)
      members[root(i)].push_back(all[i]);
    SmallVector<SmallVector<unsigned>> comps;
    for (unsigned i = 0; i < all.size(); ++i)
      if (root(i) == i)
        comps.push_back(members[i]);
    SmallVector<unsigned> cur;
    for (auto &c : comps) {
      if (!cur.empty() && cur.size() + c.size() > 8) {
        groups.push_back({shape, cur});
        cur.clear();
      }
      cur.append(c.begin(), c.end());
    }
    if (!cur.empty())
      groups.push_back({shape, cur});
  }
  // Order the launches: a launch that reads X before the one overwriting it.
  {
    size_t g = groups.size();
    std::vector<SmallVector<size_t>> after(g);
    std::vector<int> indegree(g, 0);
    for (size_t a = 0; a < g; ++a)
      for (size_t w = 0; w < g; ++w)
        if (a != w && llvm::any_of(groups[a].second, [&](unsigned ra) {
              return llvm::any_of(groups[w].second, [&](unsigned ow) {
                return writesInput[ow] >= 0 && reads[ra].count(unsigned(writesInput[ow]));
              });
            })) {
          after[a].push_back(w);
          ++indegree[w];
        }
    std::vector<std::pair<SmallVector<int64_t>, SmallVector<unsigned>>> ordered;
    std::vector<bool> done(g, false);
    while (ordered.size() < g) {
      size_t next = g;
      for (size_t i = 0; i < g && next == g; ++i)
        if (!done[i] && indegree[i] == 0)
          next = i;
      if (next == g)
        return fail(nullptr, "outputs of different shapes written over inputs that each "
                             "other's outputs read");
      done[next] = true;
      for (size_t w : after[next])
        --indegree[w];
      ordered.push_back(groups[next]);
    }
    groups = std::move(ordered);
  }
  for (auto &[shape, outs] : groups) {
    int64_t n = product(shape);
    // float4 when every output is f32 and every value on the way is
    // elementwise at this shape (or a broadcast scalar): each input is then
    // read at the output's index.
    bool vec = n % 4 == 0 && n >= 4 && !shape.empty();
    llvm::SetVector<Value> identityArgs; // in first-use order: the source must be deterministic
    std::function<void(Value)> check = [&](Value v) {
      if (!vec)
        return;
      if (isa<BlockArgument>(v)) {
        if (tensorOf(v).getShape() == ArrayRef<int64_t>(shape) && tensorOf(v).getElementType().isF32())
          identityArgs.insert(v);
        else if (tensorOf(v).getRank() != 0)
          vec = false;
        return;
      }
      Operation *op = v.getDefiningOp();
      if (isa<ConstantOp>(op))
        return;
      if (auto bc = dyn_cast<BroadcastInDimOp>(op)) {
        if (tensorOf(bc.getOperand()).getNumElements() != 1)
          vec = false;
        else
          check(bc.getOperand());
        return;
      }
      if (!isElementwiseOp(op) || tensorOf(v).getShape() != ArrayRef<int64_t>(shape)) {
        if (tensorOf(v).getRank() != 0)
          vec = false;
        for (Value o : op->getOperands())
          check(o);
        return;
      }
      for (Value o : op->getOperands())
        check(o);
    };
    for (unsigned o : outs) {
      if (!tensorOf(yields[o]).getElementType().isF32())
        vec = false;
      check(yields[o]);
    }
    std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
    int64_t block = 256;
    int64_t work = vec ? n / 4 : n;
    int64_t grid = std::min<int64_t>((work + block - 1) / block, 4096);
    indent_ = 1;
    memo_.clear();
    memo_.emplace_back();
    line("const int stride = gridDim.x * blockDim.x;");
    if (vec) {
      line(fmt::format("for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < {}; q += stride) {{",
                       n / 4));
      push();
      llvm::DenseMap<Value, std::string> vecs;
      for (Value a : identityArgs) {
        std::string va = fresh("va");
        line(fmt::format("const float4 {} = reinterpret_cast<const float4 *>(a{})[q];", va,
                         argOf_.lookup(a)));
        vecs[a] = va;
      }
      SmallVector<std::string> results;
      for (size_t j = 0; j < outs.size(); ++j) {
        results.push_back(fresh("r"));
        line(fmt::format("float {}[4];", results.back()));
      }
      const char *comp[] = {"x", "y", "z", "w"};
      for (int c = 0; c < 4; ++c) {
        for (Value a : identityArgs)
          laneRead_[a] = vecs[a] + "." + comp[c];
        line("{");
        push();
        std::string lin = fresh("e");
        line(fmt::format("const int {} = 4 * q + {};", lin, c));
        SmallVector<std::string> idx = delinear(lin, shape);
        for (auto [j, o] : llvm::enumerate(outs))
          line(fmt::format("{}[{}] = {};", results[j], c, emit(yields[o], idx)));
        pop();
        line("}");
      }
      laneRead_.clear();
      for (auto [j, o] : llvm::enumerate(outs))
        line(fmt::format("reinterpret_cast<float4 *>(a{0})[q] = make_float4({1}[0], {1}[1], "
                         "{1}[2], {1}[3]);",
                         outArg_[o], results[j]));
      pop();
      line("}");
    } else {
      line(fmt::format("for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < {}; e += stride) {{",
                       n));
      push();
      SmallVector<std::string> idx = delinear("e", shape);
      for (unsigned o : outs)
        store(o, idx);
      pop();
      line("}");
    }
    if (!error_.empty())
      return failure();
    finish(fname, vec ? "elementwise(float4)" : "elementwise", grid, block, launches);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Rows: a warp or a block per row, a stage per reduction
//===----------------------------------------------------------------------===//

LogicalResult KernelEmitter::rowStage(Reduction &r, int64_t rows,
                                      ArrayRef<std::string> rowCoords) {
  Operation *red = r.op;
  RankedTensorType in = tensorOf(red->getOperand(0));
  ArrayRef<int64_t> axes = red->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  for (int64_t a : axes)
    if (a < rows)
      return fail(red, "a reduction over a row dimension in a row kernel");
  SmallVector<int64_t> within, reduced, withinSizes, reducedSizes;
  for (int64_t d = rows; d < in.getRank(); ++d) {
    if (llvm::is_contained(axes, d)) {
      reduced.push_back(d);
      reducedSizes.push_back(in.getDimSize(d));
    } else {
      within.push_back(d);
      withinSizes.push_back(in.getDimSize(d));
    }
  }
  int64_t k = product(withinSizes), n = product(reducedSizes);
  Type et = tensorOf(red->getResult(0)).getElementType();
  TypeInfo ti;
  typeInfo(et, ti);
  if (!ti.isFloat)
    return fail(red, "integer reductions");
  std::string acc = fresh("acc"), store = fresh("red");
  r.storage = store;
  r.keptWithin = within;
  r.indexed = true;
  double scale = isa<ReduceMeanOp>(red) ? 1.0 / double(n) : 1.0;
  auto finalize = [&](const std::string &a) {
    std::string e = scale == 1.0 ? a : fmt::format("{} * {}", a, floatLiteral(scale, ti.compute == "double"));
    return ti.round.empty() ? e : ti.round + "(" + e + ")";
  };
  auto inputIndex = [&](ArrayRef<std::string> kc, ArrayRef<std::string> nc) {
    SmallVector<std::string> idx(in.getRank());
    for (int64_t d = 0; d < rows; ++d)
      idx[d] = rowCoords[d];
    for (auto [i, d] : llvm::enumerate(within))
      idx[d] = kc[i];
    for (auto [i, d] : llvm::enumerate(reduced))
      idx[d] = nc[i];
    return idx;
  };
  bool isMax = isa<ReduceMaxOp>(red);
  // One warp reduces each kept-within element `k` of the loop `kLoop`
  // opens: lanes stride over the reduced elements, the butterfly leaves the
  // total in every lane, `result(acc)` stores it.
  auto warpReduce = [&](const std::string &kLoop,
                        const std::function<std::string(const std::string &)> &result) {
    line(kLoop);
    push();
    SmallVector<std::string> kc = delinear("k", withinSizes);
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(fmt::format("for (int n = kiln_lane(); n < {}; n += 32) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", reducedSizes);
    std::string v = emit(red->getOperand(0), inputIndex(kc, nc));
    line(accumulate(red, acc, v));
    pop();
    line("}");
    line(fmt::format("{} = {}({});", acc, isMax ? "kiln_warp_max" : "kiln_warp_sum", acc));
    line(result(finalize(acc)));
    pop();
    line("}");
  };
  if (warpRows_) {
    // The row's warp does every k in turn. One value (k == 1) stays in a
    // register of every lane; several go to the warp's slice of shared
    // memory.
    if (k == 1) {
      r.indexed = false;
      line(fmt::format("{} {};", ti.compute, store));
    } else {
      line(fmt::format("__shared__ {} {}[{}];", ti.compute, store, kRowsPerBlock * k));
    }
    line("{");
    push();
    warpReduce(fmt::format("for (int k = 0; k < {}; ++k) {{", k), [&](const std::string &v) {
      return k == 1 ? fmt::format("{} = {};", store, v)
                    : fmt::format("if (kiln_lane() == 0) {}[kiln_warp() * {} + k] = {};", store,
                                  k, v);
    });
    pop();
    line("}");
    if (k > 1)
      line("__syncwarp();");
    return error_.empty() ? success() : failure();
  }
  line(fmt::format("__shared__ {} {}[{}];", ti.compute, store, k));
  line("{");
  push();
  if (k == 1) {
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", reducedSizes);
    std::string v = emit(red->getOperand(0), inputIndex({}, nc));
    line(accumulate(red, acc, v));
    pop();
    line("}");
    line(fmt::format("{} = {}({}, {});", acc, isMax ? "kiln_block_max" : "kiln_block_sum", acc,
                     ti.compute == "double" ? "kiln_scratch_d" : "kiln_scratch"));
    line(fmt::format("if (threadIdx.x == 0) {}[0] = {};", store, finalize(acc)));
  } else { // a warp per kept-within element
    warpReduce(fmt::format("for (int k = kiln_warp(); k < {}; k += blockDim.x / 32) {{", k),
               [&](const std::string &v) {
                 return fmt::format("if (kiln_lane() == 0) {}[k] = {};", store, v);
               });
  }
  pop();
  line("}");
  line("__syncthreads();");
  return error_.empty() ? success() : failure();
}

LogicalResult KernelEmitter::emitRows(int64_t rows, std::vector<CudaLaunch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  // The rows: the leading dims of the row-shaped outputs.
  SmallVector<int64_t> rowShape;
  for (Value y : yields)
    if (tensorOf(y).getRank() >= rows) {
      rowShape.assign(tensorOf(y).getShape().begin(), tensorOf(y).getShape().begin() + rows);
      break;
    }
  if (int64_t(rowShape.size()) != rows)
    return fail(nullptr, "no output has the row dimensions");
  int64_t numRows = product(rowShape);
  // The largest row: threads per block.
  int64_t widest = 1;
  auto widen = [&](Value v) {
    auto t = tensorOf(v);
    if (t.getRank() >= rows && t.getShape().take_front(rows) == ArrayRef<int64_t>(rowShape))
      widest = std::max(widest, product(t.getShape().drop_front(rows)));
  };
  for (Operation &op : b.without_terminator()) {
    for (Value v : op.getOperands())
      widen(v);
    for (Value v : op.getResults())
      widen(v);
  }
  // Rows of up to kMaxWarpRow elements: a warp per row, kRowsPerBlock rows
  // per block, no block-wide barrier (softmax over 64-256 keys, layer_norm
  // over 128-768 features). Wider rows: a block per row.
  warpRows_ = widest <= kMaxWarpRow;
  int64_t block = warpRows_ ? 32 * kRowsPerBlock : widest >= 256 ? 256 : widest > 64 ? 128 : 64;
  int64_t grid = warpRows_ ? (numRows + kRowsPerBlock - 1) / kRowsPerBlock : numRows;
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  std::string rowVar = "blockIdx.x", lane = "threadIdx.x", step = "blockDim.x";
  if (warpRows_) {
    line(fmt::format("const int row = blockIdx.x * {} + kiln_warp();", kRowsPerBlock));
    line(fmt::format("if (row >= {}) return; // the whole warp: no barriers follow", numRows));
    rowVar = "row";
    lane = "kiln_lane()";
    step = "32";
  } else {
    line("__shared__ float kiln_scratch[32];");
    line("__shared__ double kiln_scratch_d[32]; // f64 reductions");
  }
  SmallVector<std::string> rowCoords = delinear(rowVar, rowShape);
  for (Operation &op : b.without_terminator()) {
    if (!isReduction(&op))
      continue;
    Reduction &r = reductions_[&op];
    r.op = &op;
    if (failed(rowStage(r, rows, rowCoords)))
      return failure();
  }
  for (auto [i, y] : llvm::enumerate(yields)) {
    RankedTensorType t = tensorOf(y);
    bool rowShaped = t.getRank() >= rows && t.getShape().take_front(rows) == ArrayRef<int64_t>(rowShape);
    SmallVector<int64_t> inner = rowShaped ? SmallVector<int64_t>(t.getShape().drop_front(rows))
                                           : SmallVector<int64_t>(t.getShape());
    if (!rowShaped)
      line(fmt::format("if ({} == 0)", rowVar));
    line(fmt::format("for (int e = {}; e < {}; e += {}) {{", lane, product(inner), step));
    push();
    SmallVector<std::string> idx;
    if (rowShaped)
      idx.append(rowCoords.begin(), rowCoords.end());
    SmallVector<std::string> ic = delinear("e", inner);
    idx.append(ic.begin(), ic.end());
    store(unsigned(i), idx);
    pop();
    line("}");
  }
  if (!error_.empty())
    return failure();
  finish(fname, warpRows_ ? "rows(warp per row)" : "rows(block per row)", grid, block, launches);
  warpRows_ = false;
  return success();
}

//===----------------------------------------------------------------------===//
// Columns: reductions over leading dims (siblings share the pass)
//===----------------------------------------------------------------------===//

LogicalResult KernelEmitter::emitColumns(std::vector<CudaLaunch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  SmallVector<Operation *> reds;
  for (Operation &op : b.without_terminator())
    if (isReduction(&op))
      reds.push_back(&op);
  if (reds.empty())
    return emitElementwise(launches);
  RankedTensorType in = tensorOf(reds.front()->getOperand(0));
  ArrayRef<int64_t> axes = reds.front()->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
  for (Operation *r : reds)
    if (tensorOf(r->getOperand(0)).getShape() != in.getShape() ||
        r->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef() != axes)
      return fail(r, "column reductions of different shapes in one kernel");
  SmallVector<int64_t> kept = keptDims(reds.front());
  SmallVector<int64_t> keptSizes, redDims, redSizes;
  for (int64_t d : kept)
    keptSizes.push_back(in.getDimSize(d));
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (!llvm::is_contained(kept, d)) {
      redDims.push_back(d);
      redSizes.push_back(in.getDimSize(d));
    }
  int64_t k = product(keptSizes), n = product(redSizes);
  // Outputs: reduced-shape values (one per kept index) and input-shape ones.
  SmallVector<unsigned> reducedOuts, fullOuts, otherOuts;
  auto reducedShaped = [&](Value y) {
    return llvm::any_of(reds, [&](Operation *r) {
      return tensorOf(r->getResult(0)).getShape() == tensorOf(y).getShape();
    });
  };
  for (auto [i, y] : llvm::enumerate(yields)) {
    if (reducedShaped(y))
      reducedOuts.push_back(unsigned(i));
    else if (tensorOf(y).getShape() == in.getShape())
      fullOuts.push_back(unsigned(i));
    else
      return fail(y.getDefiningOp(), "an output of neither the input nor the reduced shape");
  }
  // The output index of a reduced-shape value for kept coordinates kc.
  auto reducedIndex = [&](Value y, ArrayRef<std::string> kc) {
    RankedTensorType t = tensorOf(y);
    SmallVector<std::string> idx;
    if (t.getRank() == in.getRank()) { // keepdims
      for (int64_t d = 0; d < in.getRank(); ++d) {
        auto it = llvm::find(kept, d);
        idx.push_back(it == kept.end() ? std::string("0") : kc[it - kept.begin()]);
      }
    } else {
      idx.assign(kc.begin(), kc.end());
    }
    return idx;
  };
  auto fullIndex = [&](ArrayRef<std::string> kc, ArrayRef<std::string> nc) {
    SmallVector<std::string> idx(in.getRank());
    for (auto [i, d] : llvm::enumerate(kept))
      idx[d] = kc[i];
    for (auto [i, d] : llvm::enumerate(redDims))
      idx[d] = nc[i];
    return idx;
  };
  // A thread per kept index when there are many and each column is short;
  // otherwise a block per kept index.
  bool threadPerColumn = k >= 8192 || (k >= 1024 && n <= 256);
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  if (threadPerColumn) {
    line("const int k = blockIdx.x * blockDim.x + threadIdx.x;");
    line(fmt::format("if (k >= {}) return;", k));
  } else {
    line("const int k = blockIdx.x;");
    line("__shared__ float kiln_scratch[32];");
    line("__shared__ double kiln_scratch_d[32]; // f64 reductions");
  }
  SmallVector<std::string> kc = delinear("k", keptSizes);
  for (Operation *red : reds) {
    TypeInfo ti;
    typeInfo(tensorOf(red->getResult(0)).getElementType(), ti);
    if (!ti.isFloat)
      return fail(red, "integer reductions");
    std::string acc = fresh("acc");
    bool isMax = isa<ReduceMaxOp>(red);
    double scale = isa<ReduceMeanOp>(red) ? 1.0 / double(n) : 1.0;
    std::string fin = scale == 1.0 ? acc : fmt::format("{} * {}", acc, floatLiteral(scale, ti.compute == "double"));
    if (!ti.round.empty())
      fin = ti.round + "(" + fin + ")";
    line(fmt::format("{} {} = {};", ti.compute, acc, accInit(red)));
    line(threadPerColumn ? fmt::format("for (int n = 0; n < {}; ++n) {{", n)
                         : fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", redSizes);
    line(accumulate(red, acc, emit(red->getOperand(0), fullIndex(kc, nc))));
    pop();
    line("}");
    Reduction &r = reductions_[red];
    r.op = red;
    r.indexed = false;
    if (threadPerColumn) {
      r.storage = fresh("red");
      line(fmt::format("const {} {} = {};", ti.compute, r.storage, fin));
    } else {
      r.storage = fresh("red");
      line(fmt::format("{} = {}({}, {});", acc, isMax ? "kiln_block_max" : "kiln_block_sum", acc,
                       ti.compute == "double" ? "kiln_scratch_d" : "kiln_scratch"));
      line(fmt::format("__shared__ {} {};", ti.compute, r.storage));
      line(fmt::format("if (threadIdx.x == 0) {} = {};", r.storage, fin));
      line("__syncthreads();");
    }
  }
  if (!threadPerColumn && !reducedOuts.empty())
    line("if (threadIdx.x == 0) {");
  else if (!reducedOuts.empty())
    line("{");
  push();
  for (unsigned o : reducedOuts)
    store(o, reducedIndex(yields[o], kc));
  pop();
  if (!reducedOuts.empty())
    line("}");
  for (unsigned o : fullOuts) {
    line(threadPerColumn ? fmt::format("for (int n = 0; n < {}; ++n) {{", n)
                         : fmt::format("for (int n = threadIdx.x; n < {}; n += blockDim.x) {{", n));
    push();
    SmallVector<std::string> nc = delinear("n", redSizes);
    store(o, fullIndex(kc, nc));
    pop();
    line("}");
  }
  if (!error_.empty())
    return failure();
  int64_t block = threadPerColumn ? 256 : (n >= 256 ? 256 : n > 64 ? 128 : 64);
  finish(fname, threadPerColumn ? "columns(thread per column)" : "columns(block per column)",
         threadPerColumn ? (k + 255) / 256 : k, block, launches);
  return success();
}

//===----------------------------------------------------------------------===//
// Scatter and non-library matmuls
//===----------------------------------------------------------------------===//

LogicalResult KernelEmitter::emitScatter(ScatterAddOp op, std::vector<CudaLaunch> &launches) {
  RankedTensorType res = op.getType(), idxT = op.getIndices().getType();
  int64_t axis = op.getAxis(), outer = 1, inner = 1, rowsN = res.getDimSize(axis);
  for (int64_t d = 0; d < axis; ++d)
    outer *= res.getDimSize(d);
  for (int64_t d = axis + 1; d < res.getRank(); ++d)
    inner *= res.getDimSize(d);
  int64_t m = idxT.getNumElements();
  Value y = fusion_.getBlock().getTerminator()->getOperand(0);
  if (y != op.getResult())
    return fail(op, "a scatter_add kernel must output the scatter");
  TypeInfo ti;
  typeInfo(res.getElementType(), ti);
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  // Each thread owns one (outer, inner) column of the result: zero it, then
  // add the updates in index order (deterministic, no atomics).
  line("const int c = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (c >= {}) return;", outer * inner));
  line(fmt::format("const int o = c / {}, in = c % {};", inner, inner));
  line(fmt::format("for (int r = 0; r < {}; ++r) a{}[(o * {} + r) * {} + in] = {};", rowsN,
                   outArg_[0], rowsN, inner,
                   ti.isLow ? "kiln_from_float<" + ti.storage + ">(0.0f)" : "0"));
  line(fmt::format("for (int j = 0; j < {}; ++j) {{", m));
  push();
  // indices in row-major order of their own shape; updates [outer, m, inner]
  SmallVector<std::string> ji = delinear("j", idxT.getShape());
  std::string raw = emit(op.getIndices(), ji);
  line(fmt::format("const int r = (int)min(max((long long){}, 0ll), {}ll);", raw, rowsN - 1));
  std::string lin = fresh("u");
  line(fmt::format("const int {} = (o * {} + j) * {} + in;", lin, m, inner));
  SmallVector<std::string> ui = delinear(lin, op.getUpdates().getType().getShape());
  std::string u = emit(op.getUpdates(), ui);
  std::string slot = fmt::format("a{}[(o * {} + r) * {} + in]", outArg_[0], rowsN, inner);
  if (ti.isLow)
    line(fmt::format("{0} = kiln_from_float<{1}>(kiln_to_float({0}) + {2});", slot, ti.storage, u));
  else
    line(fmt::format("{} += {};", slot, u));
  pop();
  line("}");
  if (!error_.empty())
    return failure();
  finish(fname, "scatter", (outer * inner + 255) / 256, 256, launches);
  return success();
}

LogicalResult KernelEmitter::emitMatmul(MatmulOp op, std::vector<CudaLaunch> &launches) {
  // Only f64 and integer matmuls reach a kernel (f32, f16 and bf16 are
  // cuBLASLt steps): a plain thread-per-output dot product.
  RankedTensorType lt = op.getLhs().getType(), rt = op.getRhs().getType(), ot = op.getType();
  int64_t r = ot.getRank(), m = ot.getDimSize(r - 2), n = ot.getDimSize(r - 1);
  int64_t kk = op.getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2) : lt.getDimSize(lt.getRank() - 1);
  int64_t total = ot.getNumElements();
  std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
  indent_ = 1;
  memo_.clear();
  memo_.emplace_back();
  line("const int e = blockIdx.x * blockDim.x + threadIdx.x;");
  line(fmt::format("if (e >= {}) return;", total));
  SmallVector<std::string> idx = delinear("e", ot.getShape());
  TypeInfo oti;
  typeInfo(ot.getElementType(), oti);
  line(fmt::format("{} acc = 0;", oti.compute == "double" ? "double" : oti.compute == "float" ? "float" : oti.compute));
  line(fmt::format("for (int t = 0; t < {}; ++t) {{", kk));
  push();
  auto operandIndex = [&](RankedTensorType tt, bool transpose, bool lhs) {
    SmallVector<std::string> oi;
    for (int64_t d = 0; d < tt.getRank() - 2; ++d)
      oi.push_back(idx[d]);
    std::string row = lhs ? idx[r - 2] : "t", col = lhs ? "t" : idx[r - 1];
    if (transpose)
      std::swap(row, col);
    oi.push_back(row);
    oi.push_back(col);
    return oi;
  };
  std::string a = emit(op.getLhs(), operandIndex(lt, op.getTransposeLhs(), true));
  std::string bb = emit(op.getRhs(), operandIndex(rt, op.getTransposeRhs(), false));
  line(fmt::format("acc += {} * {};", a, bb));
  pop();
  line("}");
  std::string target = fmt::format("a{}[e]", outArg_[0]);
  line(oti.isLow ? fmt::format("{} = kiln_from_float<{}>(acc);", target, oti.storage)
                 : fmt::format("{} = acc;", target));
  (void)m;
  (void)n;
  if (!error_.empty())
    return failure();
  finish(fname, "matmul", (total + 127) / 128, 128, launches);
  return success();
}

LogicalResult KernelEmitter::run(std::string &code, std::vector<CudaLaunch> &launches) {
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

} // namespace

/// softmax, log_softmax, layer_norm and cross_entropy as primitives (the
/// decompositions the CPU lowering uses), inside every fusion.
void decomposeForCuda(ModuleOp module) {
  RewritePatternSet patterns(module.getContext());
  populateKilnDecompositionPatterns(patterns);
  GreedyRewriteConfig config;
  config.enableRegionSimplification = GreedySimplifyRegionLevel::Disabled;
  (void)applyPatternsAndFoldGreedily(module, std::move(patterns), config);
}

FailureOr<CudaProgram> emitCuda(ModuleOp neutral, const program::Program &program,
                                std::string &error) {
  OwningOpRef<ModuleOp> copy = cast<ModuleOp>(neutral->clone());
  decomposeForCuda(*copy);
  CudaProgram out;
  out.source = "// Generated by kilnc: CUDA kernels of " + std::to_string(program.kernels.size()) +
               " Kiln kernels.\n";
  out.source += "// The prelude (runtime/cuda/kiln_cuda.h) is prepended when compiling.\n";
  out.source += kHelpers;
  out.kernels.resize(program.kernels.size());
  for (auto [i, k] : llvm::enumerate(program.kernels)) {
    auto fn = copy->lookupSymbol<func::FuncOp>(k.symbol);
    if (!fn) {
      error = "kernel " + k.symbol + " has no target-neutral form";
      return failure();
    }
    KernelEmitter e(fn, k.symbol, error);
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
