//===- Interpreter.cpp - Reference interpreter for the kiln dialect -------===//
#include "reference/Interpreter.h"
#include "reference/Attention.h"

#include "dialects/kiln/Elementwise.h"

#include "dialects/kiln/ElementTypes.h"
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "runtime/core/Random.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

using namespace mlir;

namespace kiln::interp {

namespace {
/// Rounds a double to bfloat16 (8 exponent bits, 8 significand bits) to
/// nearest even, in one step (no intermediate float).
double toBF16(double x) {
  if (!std::isfinite(x) || x == 0)
    return x;
  int e;
  double m = std::frexp(x, &e); // x = m * 2^e, 0.5 <= |m| < 1
  if (e < -132)                 // below half the smallest bf16 subnormal
    return std::copysign(0.0, x);
  int bits = e >= -125 ? 8 : 8 - (-125 - e); // subnormals keep fewer bits
  double scaled = std::ldexp(m, bits);
  double r = std::nearbyint(scaled); // default rounding: to nearest even
  double y = std::ldexp(r, e - bits);
  return std::fabs(y) > 3.3895313892515355e38 ? std::copysign(INFINITY, x) : y;
}
} // namespace

double roundTo(Elem e, double x) {
  switch (e) {
  case Elem::F64: return x;
  case Elem::F32: return static_cast<float>(x);
  case Elem::F16: return static_cast<double>(static_cast<_Float16>(x));
  case Elem::BF16: return toBF16(x);
  default: return x;
  }
}

Tensor Tensor::zeros(Elem elem, std::vector<int64_t> shape) {
  Tensor t;
  t.elem = elem;
  t.shape = std::move(shape);
  int64_t n = t.numel();
  if (isFloat(elem))
    t.f.assign(n, 0.0);
  else
    t.i.assign(n, 0);
  return t;
}

Tensor Tensor::none() {
  Tensor t;
  t.absent = true;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

bool elemOf(Type t, Elem &out) {
  if (auto rt = dyn_cast<RankedTensorType>(t))
    t = rt.getElementType();
  std::optional<Elem> e = toElementType(t);
  if (e)
    out = *e;
  return e.has_value();
}

Tensor fromType(Type t) {
  auto rt = cast<RankedTensorType>(t);
  Elem e = Elem::F32;
  elemOf(rt, e);
  return Tensor::zeros(e, std::vector<int64_t>(rt.getShape().begin(), rt.getShape().end()));
}

namespace {

std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Iterates over all multi-indices of `shape`, calling fn(index, linear).
template <typename Fn>
void forEachIndex(const std::vector<int64_t> &shape, Fn fn) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    fn(idx, k);
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d])
        break;
      idx[d] = 0;
    }
  }
}

class Interpreter {
public:
  Interpreter(const Options &o, GroupExchange *group) : opts_(o), group_(group) {}

  bool run(func::FuncOp fn, const std::vector<Tensor> &args,
           std::vector<Tensor> &results, std::string &error) {
    Block &body = fn.getBody().front();
    if (args.size() != body.getNumArguments()) {
      error = "@" + fn.getSymName().str() + " takes " +
              std::to_string(body.getNumArguments()) + " arguments, got " +
              std::to_string(args.size());
      return false;
    }
    for (auto [i, a] : llvm::enumerate(body.getArguments())) {
      Tensor want = fromType(a.getType());
      if (want.shape != args[i].shape || want.elem != args[i].elem) {
        error = "argument " + std::to_string(i) + " of @" +
                fn.getSymName().str() + " has the wrong type or shape";
        return false;
      }
      vals_[a] = args[i];
    }
    if (group_) {
      if (!group_->coordinate(kPipelineAxis, stage_))
        stage_ = 0; // a grid without "pp" is one stage
    } else {
      pipelineNeedsGrid_ = meshAxisSize(fn, kPipelineAxis) > 1;
    }
    for (Operation &op : body) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        // A result computed by another stage does not exist here.
        for (Value v : ret.getOperands()) {
          auto it = vals_.find(v);
          results.push_back(it == vals_.end() ? Tensor::none() : it->second);
        }
        return true;
      }
      if (!step(&op)) {
        std::string loc;
        llvm::raw_string_ostream os(loc);
        os << op.getLoc();
        error = err_.empty() ? "interpreter: unsupported op '" +
                                   op.getName().getStringRef().str() + "' at " + loc
                             : "interpreter: '" + op.getName().getStringRef().str() +
                                   "' at " + loc + ": " + err_;
        return false;
      }
    }
    error = "@" + fn.getSymName().str() + " has no return";
    return false;
  }

private:
  Options opts_;
  GroupExchange *group_ = nullptr;
  std::string err_; ///< why eval() failed, when it knows
  /// The values this process holds: a value defined by an op of another
  /// stage (or one this process is not a party to) is never entered.
  llvm::DenseMap<Value, Tensor> vals_;
  int64_t stage_ = 0; ///< this process's coordinate on kPipelineAxis
  /// A single-process run of a module with more than one pipeline stage.
  bool pipelineNeedsGrid_ = false;

  /// This process's coordinate on mesh axis `axis`: 0 in a single-process
  /// run, -1 if the grid has no such axis.
  int64_t coordinateOn(StringRef axis) {
    int64_t c = 0;
    if (group_ && !group_->coordinate(axis.str(), c))
      return -1;
    return c;
  }

  /// Whether evaluating `op` on this process reads its operands: a
  /// transfer reads its operand on the sender only, a broadcast on the root
  /// only.
  bool readsOperands(Operation *op) {
    if (auto t = dyn_cast<TransferOp>(op))
      return coordinateOn(t.getAxis()) == int64_t(t.getFrom());
    if (auto b = dyn_cast<CollectiveBroadcastOp>(op))
      return coordinateOn(b.getAxis()) == int64_t(b.getRoot());
    return true;
  }

  /// Runs one op of the function body on this process: skips it if it
  /// belongs to another stage (its results are never entered), and fails
  /// naming both stages if it reads a value this process does not hold.
  bool step(Operation *op) {
    if (auto s = op->getAttrOfType<IntegerAttr>("kiln.stage")) {
      if (pipelineNeedsGrid_) {
        err_ = "this op has kiln.stage = " + std::to_string(s.getInt()) +
               " and the module's mesh has " +
               std::to_string(meshAxisSize(op, kPipelineAxis)) + " pipeline stages on '" +
               kPipelineAxis +
               "': run it on a process grid (interp::ProcessGrid::run), not a single-process run";
        return false;
      }
      if (s.getInt() != stage_)
        return true;
    }
    for (auto [k, v] : llvm::enumerate(op->getOperands()))
      if (!vals_.count(v) && readsOperands(op)) {
        err_ = notHeld(op, unsigned(k), v);
        return false;
      }
    return eval(op);
  }

  /// Why operand `k` (value `v`, not held here) cannot be read by `op`.
  std::string notHeld(Operation *op, unsigned k, Value v) {
    std::string runs = "runs on every stage";
    if (auto s = op->getAttrOfType<IntegerAttr>("kiln.stage"))
      runs = "runs on stage " + std::to_string(s.getInt());
    std::string from = "a value";
    if (Operation *def = v.getDefiningOp()) {
      std::string stage = "another stage";
      if (auto s = def->getAttrOfType<IntegerAttr>("kiln.stage"))
        stage = "stage " + std::to_string(s.getInt());
      else if (auto t = dyn_cast<TransferOp>(def))
        stage = "stage " + std::to_string(t.getTo());
      std::string loc;
      llvm::raw_string_ostream os(loc);
      os << def->getLoc();
      from = "a value of " + stage + " ('" + def->getName().getStringRef().str() + "' at " +
             loc + ")";
    }
    return runs + " but reads operand #" + std::to_string(k) + ", " + from +
           ", which this process (stage " + std::to_string(stage_) + " on '" + kPipelineAxis +
           "') does not hold: values cross stages only through kiln.transfer (a compiler "
           "bug)";
  }

  const Tensor &in(Value v) { return vals_[v]; }
  double rnd(Elem e, double x) const { return opts_.exactF64 ? x : roundTo(e, x); }
  void set(Value v, Tensor t) {
    if (isFloat(t.elem))
      for (double &x : t.f)
        x = rnd(t.elem, x);
    vals_[v] = std::move(t);
  }
  static Tensor like(Value v) { return fromType(v.getType()); }

  /// Stores a computed double into element k of t (ints truncated/wrapped).
  static void store(Tensor &t, int64_t k, double x) {
    if (isFloat(t.elem)) {
      t.f[k] = x;
    } else if (t.elem == Elem::I1) {
      t.i[k] = x != 0;
    } else if (t.elem == Elem::I32) {
      t.i[k] = int64_t(int32_t(int64_t(x)));
    } else {
      t.i[k] = int64_t(x);
    }
  }

  template <typename Fn> bool unary(Operation *op, Fn fn) {
    const Tensor &x = in(op->getOperand(0));
    Tensor y = like(op->getResult(0));
    if (!isFloat(x.elem)) { // integers stay exact (neg, abs, relu)
      StringRef name = op->getName().getStringRef();
      for (int64_t k = 0; k < y.numel(); ++k) {
        int64_t v = x.i[k];
        int64_t r = name == "kiln.neg" ? int64_t(0 - uint64_t(v))
                    : name == "kiln.abs" ? (v < 0 ? int64_t(0 - uint64_t(v)) : v)
                    : name == "kiln.relu" ? std::max<int64_t>(v, 0)
                                          : int64_t(fn(double(v)));
        y.i[k] = y.elem == Elem::I32 ? int64_t(int32_t(r)) : r;
      }
      set(op->getResult(0), std::move(y));
      return true;
    }
    for (int64_t k = 0; k < y.numel(); ++k)
      store(y, k, fn(x.at(k)));
    set(op->getResult(0), std::move(y));
    return true;
  }

  template <typename Fn> bool binary(Operation *op, Fn fn) {
    const Tensor &a = in(op->getOperand(0));
    const Tensor &b = in(op->getOperand(1));
    Tensor y = like(op->getResult(0));
    bool ints = !isFloat(a.elem);
    for (int64_t k = 0; k < y.numel(); ++k) {
      if (ints)
        y.i[k] = fn.ints(a.i[k], b.i[k]);
      else
        y.f[k] = fn.floats(a.f[k], b.f[k]);
    }
    if (ints && y.elem == Elem::I32)
      for (int64_t &v : y.i)
        v = int64_t(int32_t(v));
    set(op->getResult(0), std::move(y));
    return true;
  }

  bool eval(Operation *op);
  bool constant(ConstantOp op);
  bool broadcast(BroadcastInDimOp op);
  bool reduce(Operation *op, ArrayRef<int64_t> axes, int kind);
  bool matmul(MatmulOp op);
  bool transpose(TransposeOp op);
  bool slice(SliceOp op);
  bool pad(PadOp op);
  bool concat(ConcatOp op);
  bool gather(GatherOp op);
  bool scatterAdd(ScatterAddOp op);
  bool softmax(Operation *op, int64_t axis, bool log);
  bool layerNorm(LayerNormOp op);
  bool crossEntropy(CrossEntropyOp op);
  bool collective(Operation *op, StringRef axis, int kind, int64_t dim);
  bool transfer(TransferOp op);
  bool broadcastFromRoot(CollectiveBroadcastOp op);
  bool fusion(FusionOp op);

  AttentionAttrs attentionAttrs(Value seed, APFloat scale, bool causal, APFloat dropout,
                                uint64_t salt) {
    AttentionAttrs a;
    a.scale = scale.convertToDouble();
    a.causal = causal;
    a.dropout = dropout.convertToDouble();
    a.seed = seed ? uint64_t(in(seed).i[0]) : 0;
    a.salt = salt;
    return a;
  }
  bool attention(AttentionOp op) {
    Tensor out = like(op.getResult()), lse = like(op.getLse());
    const Tensor *mask = op.getMask() ? &in(op.getMask()) : nullptr;
    attentionForward(in(op.getQuery()), in(op.getKey()), in(op.getValue()), mask,
                     attentionAttrs(op.getSeed(), op.getScale(), op.getCausal(),
                                    op.getDropout(), uint64_t(op.getSalt())),
                     out, lse);
    set(op.getResult(), std::move(out));
    set(op.getLse(), std::move(lse));
    return true;
  }
  bool attentionGrad(AttentionGradOp op) {
    Tensor dq = like(op.getQueryGrad()), dk = like(op.getKeyGrad()),
           dv = like(op.getValueGrad());
    const Tensor *mask = op.getMask() ? &in(op.getMask()) : nullptr;
    attentionBackward(in(op.getQuery()), in(op.getKey()), in(op.getValue()), in(op.getOut()),
                      in(op.getLse()), in(op.getGrad()), mask,
                      attentionAttrs(op.getSeed(), op.getScale(), op.getCausal(),
                                     op.getDropout(), uint64_t(op.getSalt())),
                      dq, dk, dv);
    set(op.getQueryGrad(), std::move(dq));
    set(op.getKeyGrad(), std::move(dk));
    set(op.getValueGrad(), std::move(dv));
    return true;
  }
};

struct AddF { double floats(double a, double b) const { return a + b; } int64_t ints(int64_t a, int64_t b) const { return int64_t(uint64_t(a) + uint64_t(b)); } };
struct SubF { double floats(double a, double b) const { return a - b; } int64_t ints(int64_t a, int64_t b) const { return int64_t(uint64_t(a) - uint64_t(b)); } };
struct MulF { double floats(double a, double b) const { return a * b; } int64_t ints(int64_t a, int64_t b) const { return int64_t(uint64_t(a) * uint64_t(b)); } };
struct DivF { double floats(double a, double b) const { return a / b; } int64_t ints(int64_t a, int64_t b) const { return b == 0 ? 0 : (a == INT64_MIN && b == -1) ? a : a / b; } };
struct PowF { double floats(double a, double b) const { return std::pow(a, b); } int64_t ints(int64_t, int64_t) const { return 0; } };
struct MaxF { double floats(double a, double b) const { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); } int64_t ints(int64_t a, int64_t b) const { return std::max(a, b); } };
struct MinF { double floats(double a, double b) const { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); } int64_t ints(int64_t a, int64_t b) const { return std::min(a, b); } };

bool Interpreter::eval(Operation *op) {
  // Unary elementwise ops: their scalar semantics come from the one table
  // (dialects/kiln/Elementwise.h) the CPU and CUDA code are built from.
  if (const elementwise_table::Entry *e = elementwise_table::lookup(op); e && e->arity == 1)
    return unary(op, [e](double x) { return e->reference(x, 0.0); });
  return llvm::TypeSwitch<Operation *, bool>(op)
      .Case([&](ConstantOp o) { return constant(o); })
      .Case([&](IotaOp o) {
        Tensor y = like(o.getResult());
        int64_t dim = o.getDim();
        forEachIndex(y.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
          store(y, k, double(idx[dim]));
        });
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](CastOp o) {
        const Tensor &x = in(o.getOperand());
        Tensor y = like(o.getResult());
        for (int64_t k = 0; k < y.numel(); ++k) {
          if (!isFloat(x.elem) && !isFloat(y.elem)) { // int -> int: exact
            int64_t v = x.i[k];
            y.i[k] = y.elem == Elem::I1 ? v != 0
                     : y.elem == Elem::I32 ? int64_t(int32_t(v)) : v;
            continue;
          }
          double v = x.at(k);
          if (!isFloat(y.elem) && y.elem != Elem::I1) {
            // Float -> int truncates; out of range (and NaN) saturates.
            double lo = y.elem == Elem::I32 ? -2147483648.0 : -9223372036854775808.0;
            double hi = y.elem == Elem::I32 ? 2147483647.0 : 9223372036854774784.0;
            v = std::isnan(v) ? 0.0 : std::clamp(std::trunc(v), lo, hi);
          }
          store(y, k, v);
        }
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](AddOp o) { return binary(o, AddF()); })
      .Case([&](SubOp o) { return binary(o, SubF()); })
      .Case([&](MulOp o) { return binary(o, MulF()); })
      .Case([&](DivOp o) { return binary(o, DivF()); })
      .Case([&](PowOp o) { return binary(o, PowF()); })
      .Case([&](MaxOp o) { return binary(o, MaxF()); })
      .Case([&](MinOp o) { return binary(o, MinF()); })
      .Case([&](CompareOp o) {
        const Tensor &a = in(o.getLhs()), &b = in(o.getRhs());
        Tensor y = like(o.getResult());
        CompareDirection d = o.getDirection();
        for (int64_t k = 0; k < y.numel(); ++k) {
          double x = a.at(k), z = b.at(k);
          if (!isFloat(a.elem)) { // exact integer comparison
            int64_t p = a.i[k], q = b.i[k];
            x = p < q ? -1 : p > q ? 1 : 0;
            z = 0;
          }
          bool r = false;
          switch (d) {
          case CompareDirection::eq: r = x == z; break;
          case CompareDirection::ne: r = x != z; break;
          case CompareDirection::lt: r = x < z; break;
          case CompareDirection::le: r = x <= z; break;
          case CompareDirection::gt: r = x > z; break;
          case CompareDirection::ge: r = x >= z; break;
          }
          y.i[k] = r;
        }
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](SelectOp o) {
        const Tensor &p = in(o.getPred()), &a = in(o.getOnTrue()), &b = in(o.getOnFalse());
        Tensor y = like(o.getResult());
        for (int64_t k = 0; k < y.numel(); ++k) {
          if (isFloat(y.elem))
            y.f[k] = p.i[k] ? a.f[k] : b.f[k];
          else
            y.i[k] = p.i[k] ? a.i[k] : b.i[k];
        }
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](BroadcastInDimOp o) { return broadcast(o); })
      .Case([&](ReduceSumOp o) { return reduce(o, o.getAxes(), 0); })
      .Case([&](ReduceMeanOp o) { return reduce(o, o.getAxes(), 1); })
      .Case([&](ReduceMaxOp o) { return reduce(o, o.getAxes(), 2); })
      .Case([&](MatmulOp o) { return matmul(o); })
      .Case([&](ReshapeOp o) {
        Tensor y = in(o.getOperand());
        y.shape = like(o.getResult()).shape;
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](TransposeOp o) { return transpose(o); })
      .Case([&](OptimizationBarrierOp o) {
        set(o.getResult(), in(o.getOperand()));
        return true;
      })
      .Case([&](SliceOp o) { return slice(o); })
      .Case([&](PadOp o) { return pad(o); })
      .Case([&](ConcatOp o) { return concat(o); })
      .Case([&](GatherOp o) { return gather(o); })
      .Case([&](ScatterAddOp o) { return scatterAdd(o); })
      .Case([&](SoftmaxOp o) { return softmax(o, o.getAxis(), false); })
      .Case([&](LogSoftmaxOp o) { return softmax(o, o.getAxis(), true); })
      .Case([&](LayerNormOp o) { return layerNorm(o); })
      .Case([&](CrossEntropyOp o) { return crossEntropy(o); })
      .Case([&](AllReduceOp o) {
        return collective(o, o.getAxis(), int(o.getReduction()), -1);
      })
      .Case([&](ReduceScatterOp o) {
        return collective(o, o.getAxis(), int(o.getReduction()), o.getDim());
      })
      .Case([&](AllGatherOp o) { return collective(o, o.getAxis(), -1, o.getDim()); })
      .Case([&](TransferOp o) { return transfer(o); })
      .Case([&](CollectiveBroadcastOp o) { return broadcastFromRoot(o); })
      .Case([&](FusionOp o) { return fusion(o); })
      .Case([&](AttentionOp o) { return attention(o); })
      .Case([&](AttentionGradOp o) { return attentionGrad(o); })
      .Case([&](DropoutOp o) {
        const Tensor &x = in(o.getOperand());
        uint64_t seed = uint64_t(in(o.getSeed()).i[0]);
        uint64_t salt = uint64_t(o.getSalt());
        double rate = o.getRate().convertToDouble();
        double scale = 1.0 / (1.0 - rate);
        Tensor y = like(o.getResult());
        for (int64_t k = 0; k < y.numel(); ++k)
          y.f[k] = random::uniform(seed, salt, k) >= rate ? x.f[k] * scale : 0.0;
        set(o.getResult(), std::move(y));
        return true;
      })
      .Case([&](RandomOp o) {
        uint64_t seed = uint64_t(in(o.getSeed()).i[0]);
        uint64_t salt = uint64_t(o.getSalt());
        bool normal = o.getDistribution() == RandomDistribution::normal;
        Tensor y = like(o.getResult());
        for (int64_t k = 0; k < y.numel(); ++k)
          y.f[k] = normal ? random::normal(seed, salt, k) : random::uniform(seed, salt, k);
        set(o.getResult(), std::move(y));
        return true;
      })
      .Default([](Operation *) { return false; });
}

bool Interpreter::constant(ConstantOp op) {
  Tensor y = like(op.getResult());
  auto dense = dyn_cast<DenseElementsAttr>(op.getValue());
  if (!dense)
    return false;
  if (isFloat(y.elem)) {
    int64_t k = 0;
    if (dense.isSplat()) {
      std::fill(y.f.begin(), y.f.end(), dense.getSplatValue<APFloat>().convertToDouble());
    } else {
      for (APFloat v : dense.getValues<APFloat>())
        y.f[k++] = v.convertToDouble();
    }
  } else {
    bool isBool = y.elem == Elem::I1;
    auto get = [&](const APInt &v) { return isBool ? int64_t(v.getBoolValue()) : v.getSExtValue(); };
    if (dense.isSplat()) {
      std::fill(y.i.begin(), y.i.end(), get(dense.getSplatValue<APInt>()));
    } else {
      int64_t k = 0;
      for (APInt v : dense.getValues<APInt>())
        y.i[k++] = get(v);
    }
  }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::broadcast(BroadcastInDimOp op) {
  const Tensor &x = in(op.getOperand());
  Tensor y = like(op.getResult());
  std::vector<int64_t> xs = stridesOf(x.shape);
  ArrayRef<int64_t> dims = op.getDims();
  forEachIndex(y.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t src = 0;
    for (size_t i = 0; i < dims.size(); ++i)
      src += (x.shape[i] == 1 ? 0 : idx[dims[i]]) * xs[i];
    if (isFloat(y.elem))
      y.f[k] = x.f[src];
    else
      y.i[k] = x.i[src];
  });
  set(op.getResult(), std::move(y));
  return true;
}

// kind: 0 sum, 1 mean, 2 max. Accumulates in double.
bool Interpreter::reduce(Operation *op, ArrayRef<int64_t> axes, int kind) {
  const Tensor &x = in(op->getOperand(0));
  Tensor y = like(op->getResult(0));
  int64_t outN = y.numel();
  std::vector<double> acc(outN, kind == 2 ? -std::numeric_limits<double>::infinity() : 0.0);
  std::vector<int64_t> ints(outN, kind == 2 ? INT64_MIN : 0);
  // Strides of the kept dims in the output (reduced dims contribute 0).
  std::vector<int64_t> keptShape;
  for (size_t d = 0; d < x.shape.size(); ++d)
    if (!llvm::is_contained(axes, int64_t(d)))
      keptShape.push_back(x.shape[d]);
  std::vector<int64_t> ks = stridesOf(keptShape), os(x.shape.size(), 0);
  for (size_t d = 0, j = 0; d < x.shape.size(); ++d)
    if (!llvm::is_contained(axes, int64_t(d)))
      os[d] = ks[j++];
  bool isF = isFloat(x.elem);
  forEachIndex(x.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      o += idx[d] * os[d];
    if (isF) {
      double v = x.f[k];
      if (kind == 2)
        acc[o] = (std::isnan(v) || std::isnan(acc[o])) ? NAN : std::max(acc[o], v);
      else
        acc[o] += v;
    } else {
      ints[o] = kind == 2 ? std::max(ints[o], x.i[k]) : int64_t(uint64_t(ints[o]) + uint64_t(x.i[k]));
    }
  });
  int64_t count = x.numel() / std::max<int64_t>(1, outN);
  for (int64_t k = 0; k < outN; ++k) {
    if (isF)
      y.f[k] = kind == 1 ? acc[k] / double(count) : acc[k];
    else
      store(y, k, double(ints[k]));
  }
  if (!isF && y.elem == Elem::I64)
    y.i = ints;
  set(op->getResult(0), std::move(y));
  return true;
}

bool Interpreter::matmul(MatmulOp op) {
  const Tensor &a = in(op.getLhs()), &b = in(op.getRhs());
  Tensor y = like(op.getResult());
  bool ta = op.getTransposeLhs(), tb = op.getTransposeRhs();
  size_t ar = a.shape.size(), br = b.shape.size(), yr = y.shape.size();
  int64_t M = y.shape[yr - 2], N = y.shape[yr - 1];
  int64_t K = ta ? a.shape[ar - 2] : a.shape[ar - 1];
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < yr; ++d)
    batch *= y.shape[d];
  bool aBatched = ar > 2, bBatched = br > 2;
  if (isFloat(a.elem)) {
    for (int64_t p = 0; p < batch; ++p) {
      const double *A = a.f.data() + (aBatched ? p * M * K : 0);
      const double *B = b.f.data() + (bBatched ? p * K * N : 0);
      double *C = y.f.data() + p * M * N;
      cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                  tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), 1.0,
                  A, ta ? int(M) : int(K), B, tb ? int(K) : int(N), 0.0, C,
                  int(N));
    }
  } else {
    for (int64_t p = 0; p < batch; ++p)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          int64_t s = 0;
          for (int64_t k = 0; k < K; ++k) {
            int64_t av = a.i[(aBatched ? p * M * K : 0) + (ta ? k * M + m : m * K + k)];
            int64_t bv = b.i[(bBatched ? p * K * N : 0) + (tb ? n * K + k : k * N + n)];
            s += av * bv;
          }
          store(y, p * M * N + m * N + n, double(s));
        }
  }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::transpose(TransposeOp op) {
  const Tensor &x = in(op.getOperand());
  Tensor y = like(op.getResult());
  std::vector<int64_t> xs = stridesOf(x.shape);
  ArrayRef<int64_t> perm = op.getPermutation();
  forEachIndex(y.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t src = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      src += idx[d] * xs[perm[d]];
    if (isFloat(y.elem)) y.f[k] = x.f[src]; else y.i[k] = x.i[src];
  });
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::slice(SliceOp op) {
  const Tensor &x = in(op.getOperand());
  Tensor y = like(op.getResult());
  std::vector<int64_t> xs = stridesOf(x.shape);
  forEachIndex(y.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t src = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      src += (op.getStart()[d] + idx[d] * op.getStride()[d]) * xs[d];
    if (isFloat(y.elem)) y.f[k] = x.f[src]; else y.i[k] = x.i[src];
  });
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::pad(PadOp op) {
  const Tensor &x = in(op.getOperand());
  Tensor y = like(op.getResult());
  double v = op.getValue().convertToDouble();
  for (int64_t k = 0; k < y.numel(); ++k)
    store(y, k, v);
  std::vector<int64_t> ys = stridesOf(y.shape);
  forEachIndex(x.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t dst = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      dst += (op.getLow()[d] + idx[d] * (op.getInterior()[d] + 1)) * ys[d];
    if (isFloat(y.elem)) y.f[dst] = x.f[k]; else y.i[dst] = x.i[k];
  });
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::concat(ConcatOp op) {
  Tensor y = like(op.getResult());
  int64_t dim = op.getDim();
  std::vector<int64_t> ys = stridesOf(y.shape);
  int64_t offset = 0;
  for (Value v : op.getInputs()) {
    const Tensor &x = in(v);
    forEachIndex(x.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
      int64_t dst = 0;
      for (size_t d = 0; d < idx.size(); ++d)
        dst += (idx[d] + (int64_t(d) == dim ? offset : 0)) * ys[d];
      if (isFloat(y.elem)) y.f[dst] = x.f[k]; else y.i[dst] = x.i[k];
    });
    offset += x.shape[dim];
  }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::gather(GatherOp op) {
  const Tensor &x = in(op.getOperand()), &ix = in(op.getIndices());
  Tensor y = like(op.getResult());
  int64_t axis = op.getAxis();
  int64_t outer = 1, inner = 1, n = x.shape[axis];
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  int64_t m = ix.numel();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j) {
      int64_t r = std::clamp<int64_t>(ix.i[j], 0, n - 1);
      for (int64_t q = 0; q < inner; ++q) {
        int64_t dst = (o * m + j) * inner + q, src = (o * n + r) * inner + q;
        if (isFloat(y.elem)) y.f[dst] = x.f[src]; else y.i[dst] = x.i[src];
      }
    }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::scatterAdd(ScatterAddOp op) {
  const Tensor &u = in(op.getUpdates()), &ix = in(op.getIndices());
  Tensor y = like(op.getResult());
  int64_t axis = op.getAxis();
  int64_t outer = 1, inner = 1, n = y.shape[axis];
  for (int64_t d = 0; d < axis; ++d) outer *= y.shape[d];
  for (size_t d = axis + 1; d < y.shape.size(); ++d) inner *= y.shape[d];
  int64_t m = ix.numel();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j) {
      int64_t r = std::clamp<int64_t>(ix.i[j], 0, n - 1);
      for (int64_t q = 0; q < inner; ++q) {
        int64_t src = (o * m + j) * inner + q, dst = (o * n + r) * inner + q;
        if (isFloat(y.elem)) y.f[dst] += u.f[src]; else y.i[dst] += u.i[src];
      }
    }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::softmax(Operation *op, int64_t axis, bool log) {
  const Tensor &x = in(op->getOperand(0));
  Tensor y = like(op->getResult(0));
  int64_t n = x.shape[axis], outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t q = 0; q < inner; ++q) {
      auto at = [&](int64_t j) { return (o * n + j) * inner + q; };
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j)
        mx = std::max(mx, x.f[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j)
        s += std::exp(x.f[at(j)] - mx);
      for (int64_t j = 0; j < n; ++j)
        y.f[at(j)] = log ? x.f[at(j)] - mx - std::log(s) : std::exp(x.f[at(j)] - mx) / s;
    }
  set(op->getResult(0), std::move(y));
  return true;
}

bool Interpreter::layerNorm(LayerNormOp op) {
  const Tensor &x = in(op.getOperand());
  const Tensor *g = op.getScale() ? &in(op.getScale()) : nullptr;
  const Tensor *b = op.getBias() ? &in(op.getBias()) : nullptr;
  Tensor y = like(op.getResult());
  int64_t n = x.shape.back(), rows = x.numel() / n;
  double eps = op.getEpsilon().convertToDouble();
  for (int64_t r = 0; r < rows; ++r) {
    const double *row = x.f.data() + r * n;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mean += row[j];
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= double(n);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < n; ++j) {
      double v = (row[j] - mean) * rstd;
      if (g) v *= g->f[j];
      if (b) v += b->f[j];
      y.f[r * n + j] = v;
    }
  }
  set(op.getResult(), std::move(y));
  return true;
}

bool Interpreter::crossEntropy(CrossEntropyOp op) {
  const Tensor &z = in(op.getLogits()), &t = in(op.getTargets());
  Tensor y = like(op.getResult());
  int64_t c = z.shape.back(), rows = z.numel() / c;
  double total = 0;
  std::vector<double> per(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const double *row = z.f.data() + r * c;
    double mx = -std::numeric_limits<double>::infinity(), s = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - mx);
    int64_t target = std::clamp<int64_t>(t.i[r], 0, c - 1);
    per[r] = mx + std::log(s) - row[target];
    total += per[r];
  }
  switch (op.getReduction()) {
  case LossReduction::mean: y.f[0] = total / double(rows); break;
  case LossReduction::sum: y.f[0] = total; break;
  case LossReduction::none: y.f = per; break;
  }
  set(op.getResult(), std::move(y));
  return true;
}

/// kiln.all_reduce (dim < 0), reduce_scatter (kind >= 0, dim) and
/// all_gather (kind < 0): `kind` is a CollectiveReduction. The group's
/// contributions combine in member order, ((x0 + x1) + x2) + ..., each
/// partial result rounded to the element type as a device computing in that
/// type would; mean is that sum divided by the group size (docs/parallel.md).
bool Interpreter::collective(Operation *op, StringRef axis, int kind, int64_t dim) {
  const Tensor &x = in(op->getOperand(0));
  Tensor y = like(op->getResult(0));
  std::vector<Tensor> all;
  int64_t member = 0;
  if (!group_) {
    int64_t n = meshAxisSize(op, axis);
    if (n != 1) {
      err_ = "a collective over mesh axis '" + axis.str() + "' of size " + std::to_string(n) +
             " needs a process grid (interp::ProcessGrid::run), not a single-process run";
      return false;
    }
    all.push_back(x);
  } else if (!group_->exchange(axis.str(), x, all, member, err_)) {
    return false;
  }
  for (const Tensor &t : all)
    if (t.absent || t.shape != x.shape || t.elem != x.elem) {
      err_ = "the members of the group over '" + axis.str() +
             "' contributed tensors of different shapes or types (do all processes run the "
             "same program?)";
      return false;
    }
  int64_t n = int64_t(all.size());
  bool isF = isFloat(x.elem);
  if (kind < 0) { // all_gather: concatenate along dim in member order
    std::vector<int64_t> ys = stridesOf(y.shape);
    for (int64_t m = 0; m < n; ++m)
      forEachIndex(x.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
        int64_t dst = 0;
        for (size_t d = 0; d < idx.size(); ++d)
          dst += (idx[d] + (int64_t(d) == dim ? m * x.shape[d] : 0)) * ys[d];
        if (isF) y.f[dst] = all[m].f[k]; else y.i[dst] = all[m].i[k];
      });
    set(op->getResult(0), std::move(y));
    return true;
  }
  // The reduction over the whole operand, then (reduce_scatter) this
  // member's block of `dim`.
  auto red = CollectiveReduction(kind);
  Tensor r = Tensor::zeros(x.elem, x.shape);
  for (int64_t k = 0; k < x.numel(); ++k) {
    if (isF) {
      double acc = all[0].f[k];
      for (int64_t m = 1; m < n; ++m) {
        double v = all[m].f[k];
        switch (red) {
        case CollectiveReduction::sum:
        case CollectiveReduction::mean: acc = rnd(x.elem, acc + v); break;
        case CollectiveReduction::max: acc = MaxF().floats(acc, v); break;
        case CollectiveReduction::min: acc = MinF().floats(acc, v); break;
        }
      }
      if (red == CollectiveReduction::mean)
        acc = rnd(x.elem, acc / double(n));
      r.f[k] = acc;
    } else {
      int64_t acc = all[0].i[k];
      for (int64_t m = 1; m < n; ++m) {
        int64_t v = all[m].i[k];
        switch (red) {
        case CollectiveReduction::sum:
        case CollectiveReduction::mean: acc = AddF().ints(acc, v); break;
        case CollectiveReduction::max: acc = std::max(acc, v); break;
        case CollectiveReduction::min: acc = std::min(acc, v); break;
        }
      }
      if (red == CollectiveReduction::mean)
        acc = DivF().ints(acc, n);
      r.i[k] = x.elem == Elem::I32 ? int64_t(int32_t(acc)) : x.elem == Elem::I1 ? acc != 0 : acc;
    }
  }
  if (dim < 0) {
    set(op->getResult(0), std::move(r));
    return true;
  }
  std::vector<int64_t> rs = stridesOf(r.shape);
  forEachIndex(y.shape, [&](const std::vector<int64_t> &idx, int64_t k) {
    int64_t src = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      src += (idx[d] + (int64_t(d) == dim ? member * y.shape[d] : 0)) * rs[d];
    if (isF) y.f[k] = r.f[src]; else y.i[k] = r.i[src];
  });
  set(op->getResult(0), std::move(y));
  return true;
}

/// kiln.transfer: the sender hands its operand to the receiver through the
/// group (a two-member rendezvous in a ProcessGrid); every other process of
/// the grid skips it.
bool Interpreter::transfer(TransferOp op) {
  std::string axis = op.getAxis().str();
  if (!group_) {
    err_ = "kiln.transfer over mesh axis '" + axis +
           "' needs a process grid (interp::ProcessGrid::run), not a single-process run";
    return false;
  }
  int64_t c = coordinateOn(axis), from = op.getFrom(), to = op.getTo();
  if (c < 0) {
    err_ = "the process grid has no axis '" + axis + "'";
    return false;
  }
  if (c != from && c != to)
    return true; // not a party: the result does not exist here
  Tensor got;
  if (!group_->transfer(axis, from, to, c == from ? in(op.getOperand()) : Tensor::none(), got,
                        err_))
    return false;
  if (c == from)
    return true; // the result exists on the receiver only
  Tensor want = like(op.getResult());
  if (got.absent || got.shape != want.shape || got.elem != want.elem) {
    err_ = "the sender (coordinate " + std::to_string(from) + " on '" + axis +
           "') sent a tensor of another shape or type than the result's (do all processes "
           "run the same program?)";
    return false;
  }
  vals_[op.getResult()] = std::move(got);
  return true;
}

/// kiln.collective_broadcast: every member of the group meets; the root
/// contributes its operand, the others nothing, and all leave with the
/// root's.
bool Interpreter::broadcastFromRoot(CollectiveBroadcastOp op) {
  std::string axis = op.getAxis().str();
  int64_t root = op.getRoot();
  if (!group_) {
    int64_t n = meshAxisSize(op, axis);
    if (n != 1) {
      err_ = "a collective over mesh axis '" + axis + "' of size " + std::to_string(n) +
             " needs a process grid (interp::ProcessGrid::run), not a single-process run";
      return false;
    }
    set(op.getResult(), in(op.getOperand()));
    return true;
  }
  int64_t c = coordinateOn(axis), member = 0;
  std::vector<Tensor> all;
  if (!group_->exchange(axis, c == root ? in(op.getOperand()) : Tensor::none(), all, member,
                        err_))
    return false;
  Tensor want = like(op.getResult());
  if (root >= int64_t(all.size()) || all[size_t(root)].absent ||
      all[size_t(root)].shape != want.shape || all[size_t(root)].elem != want.elem) {
    err_ = "the root (coordinate " + std::to_string(root) + " on '" + axis +
           "') contributed no tensor of the result's shape and type (do all processes run the "
           "same program?)";
    return false;
  }
  vals_[op.getResult()] = std::move(all[size_t(root)]);
  return true;
}

/// kiln.fusion: its members in order, each rounded as the op alone would be
/// (the fused kernel is checked against the unfused program).
bool Interpreter::fusion(FusionOp op) {
  Block &block = op.getBlock();
  for (auto [arg, input] : llvm::zip(block.getArguments(), op.getInputs())) {
    Tensor t = in(input); // copied first: inserting may move the map's values
    vals_[arg] = std::move(t);
  }
  for (Operation &m : op.getMembers()) {
    if (eval(&m))
      continue;
    std::string loc;
    llvm::raw_string_ostream os(loc);
    os << m.getLoc();
    std::string what = "member '" + m.getName().getStringRef().str() + "' at " + loc;
    err_ = err_.empty() ? what + " is not supported" : what + ": " + err_;
    return false;
  }
  auto yield = cast<YieldOp>(block.getTerminator());
  for (auto [r, v] : llvm::zip(op.getResults(), yield.getValues())) {
    Tensor t = in(v);
    vals_[r] = std::move(t);
  }
  return true;
}

} // namespace

bool run(func::FuncOp fn, const std::vector<Tensor> &args,
         std::vector<Tensor> &results, std::string &error,
         const Options &options, GroupExchange *group) {
  Interpreter interp(options, group);
  return interp.run(fn, args, results, error);
}

} // namespace kiln::interp
