//===- Builtins.cpp - Tensor builtins -------------------------------------===//
//
// Elementwise functions, matmul, reshape, transpose, slice, dropout,
// reductions and activations, and the builtin table entries that call
// them (softmax, comparisons, where, concat, cast, cross_entropy, ...).
//
//===----------------------------------------------------------------------===//
#include "frontend/elaborate/Elaborator.h"

#include "dialects/kiln/Elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::frontend::elab {

//===----------------------------------------------------------------------===//
// Tensor building blocks
//===----------------------------------------------------------------------===//

namespace {

template <typename OpT>
mlir::Value buildUnary(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x) {
  return b.create<OpT>(loc, x).getResult();
}

/// An elementwise function of one tensor (or one number): its name, the
/// kiln op it builds, whether it takes integer tensors, and whether it can
/// be a layer's activation. One row per function: the builtin, the
/// activation list and the messages read it; its value on a number is the
/// op's scalar semantics (dialects/kiln/Elementwise.h), as the back ends'.
struct UnaryFn {
  const char *name;
  mlir::Value (*build)(mlir::OpBuilder &, mlir::Location, mlir::Value);
  bool integers;
  bool activation;
};

const UnaryFn kUnaryFns[] = {
    {"sqrt", buildUnary<SqrtOp>, false, false},
    {"rsqrt", buildUnary<RsqrtOp>, false, false},
    {"exp", buildUnary<ExpOp>, false, false},
    {"log", buildUnary<LogOp>, false, false},
    {"tanh", buildUnary<TanhOp>, false, true},
    {"abs", buildUnary<AbsOp>, true, false},
    {"sigmoid", buildUnary<SigmoidOp>, false, true},
    {"relu", buildUnary<ReluOp>, true, true},
    {"silu", buildUnary<SiluOp>, false, true},
    {"softplus", buildUnary<SoftplusOp>, false, true},
};

/// The value of function `name` on the number `v`, from the scalar table.
double valueOn(llvm::StringRef name, double v) {
  std::string op = ("kiln." + name).str();
  for (const elementwise_table::Entry &e : elementwise_table::entries())
    if (op == e.name)
      return e.reference(v, 0.0);
  return std::nan("");
}

const UnaryFn *findUnaryFn(llvm::StringRef name) {
  for (const UnaryFn &f : kUnaryFns)
    if (name == f.name)
      return &f;
  return nullptr;
}

/// The activations' names for messages: "relu, gelu, gelu_tanh, tanh, ...".
std::string activationNames() {
  std::string out = "relu, gelu, gelu_tanh";
  for (const UnaryFn &f : kUnaryFns)
    if (f.activation && llvm::StringRef(f.name) != "relu")
      out += std::string(", ") + f.name;
  return out;
}

} // namespace

Val Elaborator::unaryTensorFn(const std::string &fn, const Val &x,
                              SourceLoc l) {
  const UnaryFn *f = findUnaryFn(fn);
  if (!f)
    fail(l, "unknown function '" + fn + "'");
  if (x.isNumber()) {
    if (fn == "abs" && x.kind == Val::Kind::Int && x.i != std::numeric_limits<int64_t>::min())
      return scalarInt(x.i < 0 ? -x.i : x.i, l);
    double v = x.num(), r = valueOn(fn, v);
    if (!std::isfinite(r))
      fail(l, fn + "(" + fmtDouble(v) + ") is not a finite number");
    return scalarFloat(r, l);
  }
  if (f->integers)
    expectTensor(x, "the argument of " + fn + "()");
  else
    expectFloatTensor(x, "the argument of " + fn + "()");
  if (x.dtype == DType::I1)
    fail(x.loc, fn + "() does not apply to boolean tensors");
  countOp(l);
  return tensor(f->build(b_, loc(l), x.value), x.shape, x.dtype, l);
}

Val Elaborator::matmul(const Val &a, const Val &c, bool ta, bool tb,
                       SourceLoc l) {
  if (a.dtype != c.dtype || a.dtype == DType::I1)
    fail(l, "matmul needs two numeric tensors of one element type, got " +
                describe(a) + " and " + describe(c));
  if (a.shape.size() < 2 || c.shape.size() < 2)
    fail(l, "matmul needs tensors of rank >= 2, got " + describe(a) +
                " and " + describe(c));
  size_t ar = a.shape.size(), cr = c.shape.size();
  const Dim &m = ta ? a.shape[ar - 1] : a.shape[ar - 2];
  const Dim &ka = ta ? a.shape[ar - 2] : a.shape[ar - 1];
  const Dim &kc = tb ? c.shape[cr - 1] : c.shape[cr - 2];
  const Dim &n = tb ? c.shape[cr - 2] : c.shape[cr - 1];
  if (ka.size != kc.size)
    fail(l, "matmul of " + str(a.shape) + " and " + str(c.shape) +
                ": the inner dimensions differ (" + std::to_string(ka.size) +
                " vs " + std::to_string(kc.size) + ")");
  Shape batchA(a.shape.begin(), a.shape.end() - 2);
  Shape batchC(c.shape.begin(), c.shape.end() - 2);
  if (!batchA.empty() && !batchC.empty() && batchA != batchC)
    fail(l, "matmul of " + str(a.shape) + " and " + str(c.shape) +
                ": batch dimensions " + str(batchA) + " and " + str(batchC) +
                " differ (they must match, or one side has none)");
  Shape out = batchA.empty() ? batchC : batchA;
  out.push_back(m);
  out.push_back(n);
  RankedTensorType type = tensorType(out, a.dtype, l);
  countOp(l);
  auto op = b_.create<MatmulOp>(loc(l), type, a.value, c.value,
                                ta ? b_.getUnitAttr() : UnitAttr(),
                                tb ? b_.getUnitAttr() : UnitAttr());
  return tensor(op.getResult(), out, a.dtype, l);
}

Val Elaborator::reshape(const Val &x, const Shape &s, SourceLoc l) {
  int64_t a = 1, c = 1;
  for (const Dim &d : x.shape)
    a *= d.size;
  for (const Dim &d : s) {
    if (d.size < 1 || c > kMaxTensorElements / d.size)
      fail(l, "reshape target " + str(s) + " is invalid");
    c *= d.size;
  }
  if (a != c)
    fail(l, "cannot reshape " + str(x.shape) + " (" + std::to_string(a) +
                " elements) to " + str(s) + " (" + std::to_string(c) +
                " elements)");
  if (x.shape == s)
    return tensor(x.value, s, x.dtype, l);
  return tensor(create<ReshapeOp>(l, tensorType(s, x.dtype, l), x.value), s,
                x.dtype, l);
}

Val Elaborator::transpose(const Val &x, const std::vector<int64_t> &perm,
                          SourceLoc l) {
  if (perm.size() != x.shape.size())
    fail(l, "transpose of rank-" + std::to_string(x.shape.size()) +
                " tensor needs a permutation of " +
                std::to_string(x.shape.size()) + " axes");
  std::vector<bool> seen(perm.size(), false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(perm.size()) || seen[p])
      fail(l, "transpose needs a permutation of 0.." +
                  std::to_string(perm.size() - 1));
    seen[p] = true;
    out.push_back(x.shape[p]);
  }
  SmallVector<int64_t> p(perm.begin(), perm.end());
  return tensor(create<TransposeOp>(l, x.value, p), out, x.dtype, l);
}

Val Elaborator::sliceAxis(const Val &x, int64_t axis, int64_t start,
                          int64_t end, int64_t step, SourceLoc l) {
  int64_t size = x.shape[axis].size;
  if (start < 0)
    start += size;
  if (end < 0)
    end += size;
  if (step < 1)
    fail(l, "slice step must be >= 1, got " + std::to_string(step));
  if (start < 0 || start > end || end > size)
    fail(l, "slice [" + std::to_string(start) + ":" + std::to_string(end) +
                ":" + std::to_string(step) + "] is out of range for axis " +
                std::to_string(axis) + " of size " + std::to_string(size));
  if (start == end)
    fail(l, "slice is empty; Kiln tensors have no zero-size dimensions");
  SmallVector<int64_t> starts(x.shape.size(), 0), limits, steps(x.shape.size(), 1);
  for (const Dim &d : x.shape)
    limits.push_back(d.size);
  starts[axis] = start;
  limits[axis] = end;
  steps[axis] = step;
  Shape out = x.shape;
  out[axis] = Dim{(end - start - 1) / step + 1, ""};
  return tensor(create<SliceOp>(l, x.value, starts, limits, steps), out,
                x.dtype, l);
}

Val Elaborator::index(const Expr &e, Env &env) {
  // x[i, a:b:c, ..., j]: one kiln.slice over all axes (numpy's basic
  // indexing, without clamping), then a reshape that drops the axes given
  // an integer index.
  Val x = eval(*e.args[0], env);
  size_t numItems = e.args.size() - 1;
  auto intItem = [&](const Expr &item, const char *what) {
    Val v = eval(item, env);
    if (v.kind != Val::Kind::Int)
      fail(item.loc, std::string(what) + " must be an integer, got " +
                         describe(v) + " (indices are compile-time "
                         "constants)");
    return v.i;
  };
  if (x.kind == Val::Kind::List) {
    const Expr &item = *e.args[1];
    if (numItems != 1 || item.kind == Expr::Kind::Slice ||
        item.kind == Expr::Kind::Ellipsis)
      fail(item.loc, "a tuple or list takes one integer index, as in t[0]");
    int64_t n = x.items.size(), i = intItem(item, "an index");
    if (i < -n || i >= n)
      fail(item.loc, "index " + std::to_string(i) + " is out of range for " +
                         "a list of " + std::to_string(n) + " element(s)");
    return x.items[i < 0 ? i + n : i];
  }
  if (!x.isTensor())
    fail(e.loc, "cannot index " + describe(x) + "; only tensors, tuples and "
                "lists can be indexed");
  int64_t rank = x.shape.size();
  const Expr *ellipsis = nullptr;
  for (size_t k = 1; k <= numItems; ++k)
    if (e.args[k]->kind == Expr::Kind::Ellipsis) {
      if (ellipsis)
        fail(e.args[k]->loc, "an index holds at most one '...'");
      ellipsis = e.args[k].get();
    }
  int64_t named = int64_t(numItems) - (ellipsis ? 1 : 0);
  if (named > rank) {
    // Point at the first item past the last axis.
    int64_t seen = 0;
    SourceLoc extra = e.loc;
    for (size_t k = 1; k <= numItems; ++k)
      if (e.args[k]->kind != Expr::Kind::Ellipsis && ++seen == rank + 1) {
        extra = e.args[k]->loc;
        break;
      }
    fail(extra, "too many indices: " + describe(x) + " has " +
                    std::to_string(rank) + " axes but the index names " +
                    std::to_string(named));
  }
  // The item for each axis (null: the whole axis).
  std::vector<const Expr *> items;
  for (size_t k = 1; k <= numItems; ++k) {
    if (e.args[k]->kind == Expr::Kind::Ellipsis)
      items.insert(items.end(), rank - named, nullptr);
    else
      items.push_back(e.args[k].get());
  }
  items.resize(rank, nullptr);
  SmallVector<int64_t> starts(rank, 0), limits, steps(rank, 1);
  Shape sliced = x.shape, kept;
  bool changed = false;
  for (int64_t ax = 0; ax < rank; ++ax) {
    int64_t size = x.shape[ax].size;
    limits.push_back(size);
    const Expr *item = items[ax];
    if (!item) {
      kept.push_back(x.shape[ax]);
      continue;
    }
    std::string axis = "axis " + std::to_string(ax) + " of size " +
                       std::to_string(size);
    if (item->kind != Expr::Kind::Slice) {
      int64_t i = intItem(*item, "an index");
      if (i < -size || i >= size)
        fail(item->loc, "index " + std::to_string(i) + " is out of range for " +
                            axis + " (" + describe(x) + ")");
      starts[ax] = i < 0 ? i + size : i;
      limits[ax] = starts[ax] + 1;
      sliced[ax] = Dim{1, ""};
      changed = true;
      continue;
    }
    const ExprPtr &a = item->args[0], &b = item->args[1], &c = item->args[2];
    int64_t step = c ? intItem(*c, "a slice step") : 1;
    if (step < 1)
      fail(c->loc, "slice step must be >= 1, got " + std::to_string(step) +
                       " (Kiln has no reversed slices)");
    auto bound = [&](const ExprPtr &p, int64_t def, const char *what) {
      if (!p)
        return def;
      int64_t v = intItem(*p, what);
      int64_t n = v < 0 ? v + size : v;
      if (n < 0 || n > size)
        fail(p->loc, std::string(what) + " " + std::to_string(v) +
                         " is out of range for " + axis +
                         " (bounds are not clamped)");
      return n;
    };
    int64_t start = bound(a, 0, "slice start");
    int64_t end = bound(b, size, "slice end");
    if (start >= end)
      fail(item->loc, "slice " + std::to_string(start) + ":" +
                          std::to_string(end) + " of " + axis +
                          " is empty; Kiln tensors have no zero-size "
                          "dimensions");
    starts[ax] = start;
    limits[ax] = end;
    steps[ax] = step;
    if (start == 0 && end == size && step == 1) {
      kept.push_back(x.shape[ax]);
      continue;
    }
    sliced[ax] = Dim{(end - start - 1) / step + 1, ""};
    kept.push_back(sliced[ax]);
    changed = true;
  }
  if (!changed)
    return x;
  Val y = tensor(create<SliceOp>(e.loc, x.value, starts, limits, steps),
                 sliced, x.dtype, e.loc);
  if (kept.size() != sliced.size())
    y = reshape(y, kept, e.loc);
  return y;
}

Val Elaborator::dropout(const Val &x, double p, SourceLoc l) {
  expectFloatTensor(x, "the argument of dropout()");
  if (!(p >= 0.0 && p < 1.0))
    fail(l, "dropout probability " + fmtDouble(p) + " must be in [0, 1)");
  if (p == 0.0)
    return x;
  if (!dropoutSeed_) {
    OpBuilder::InsertionGuard guard(b_);
    RankedTensorType type = RankedTensorType::get({}, b_.getI64Type());
    BlockArgument arg = entry_->addArgument(type, loc(l));
    NamedAttrList attrs;
    attrs.append(KilnDialect::kInputAttr, b_.getStringAttr("dropout_seed"));
    inputAttrs_.push_back(attrs);
    inputNames_.push_back("dropout_seed");
    dropoutSeed_ = tensor(arg, {}, DType::I64, l);
  }
  countOp(l);
  auto op = b_.create<DropoutOp>(loc(l), x.value, dropoutSeed_->value,
                                 b_.getF64FloatAttr(p),
                                 b_.getI64IntegerAttr(dropoutSalt_++));
  return tensor(op.getResult(), x.shape, x.dtype, l);
}

Val Elaborator::reduce(const std::string &fn, const Val &x,
                       const std::vector<int64_t> &axes0, bool keepdims,
                       SourceLoc l) {
  if (fn == "mean")
    expectFloatTensor(x, "the argument of mean()");
  if (x.dtype == DType::I1)
    fail(l, fn + "() does not apply to boolean tensors");
  int64_t rank = x.shape.size();
  std::vector<int64_t> axes;
  for (int64_t a : axes0)
    axes.push_back(normAxis(a, rank, l));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(l, fn + "() got the same axis twice");
  Shape out;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(axes.begin(), axes.end(), d) == axes.end())
      out.push_back(x.shape[d]);
    else if (keepdims)
      out.push_back(Dim{1, ""});
  }
  RankedTensorType type = tensorType(out, x.dtype, l);
  SmallVector<int64_t> ax(axes.begin(), axes.end());
  UnitAttr keep = keepdims ? b_.getUnitAttr() : UnitAttr();
  mlir::Value r;
  DenseI64ArrayAttr axAttr = b_.getDenseI64ArrayAttr(ax);
  if (fn == "sum") r = create<ReduceSumOp>(l, type, x.value, axAttr, keep);
  else if (fn == "mean") r = create<ReduceMeanOp>(l, type, x.value, axAttr, keep);
  else r = create<ReduceMaxOp>(l, type, x.value, axAttr, keep);
  return tensor(r, out, x.dtype, l);
}

Val Elaborator::activation(const Val &fn, const Val &x, SourceLoc l) {
  if (fn.kind != Val::Kind::Func)
    fail(fn.loc, "expected an activation function (" + activationNames() +
                     ", or a def of one argument), got " + describe(fn));
  auto def = defs_.find(fn.s);
  if (def != defs_.end()) {
    // A user def of one argument (further parameters need defaults),
    // inlined at each use.
    const DefDecl &d = *def->second;
    size_t required = 0;
    for (const Param &p : d.params)
      required += !p.defaultValue;
    bool firstRequired = !d.params.empty() && !d.params[0].defaultValue;
    if (d.params.empty() || required > 1 || (required == 1 && !firstRequired)) {
      std::string sig;
      for (const Param &p : d.params)
        sig += (sig.empty() ? "" : ", ") + p.name + (p.defaultValue ? "=..." : "");
      fail(fn.loc, "'" + d.name + "(" + sig + ")' cannot be an activation: "
                   "it must take one argument (the tensor), as in "
                   "'def act(x) { return x * sigmoid(x) }'; other parameters "
                   "need defaults");
    }
    Val y = callDefOn(d, x, l);
    if (!y.isTensor())
      fail(fn.loc, "activation '" + d.name + "' returned " + describe(y) +
                       ", not a tensor");
    if (y.shape != x.shape || y.dtype != x.dtype)
      fail(fn.loc, "activation '" + d.name + "' must keep its input's shape "
                   "and type: it maps " + describe(x) + " to " + describe(y));
    return y;
  }
  if (fn.s == "gelu" || fn.s == "gelu_tanh") {
    expectFloatTensor(x, "the argument of gelu()");
    auto approx = fn.s == "gelu" ? GeluApproximation::erf : GeluApproximation::tanh;
    return tensor(create<GeluOp>(l, approx, x.value), x.shape, x.dtype, l);
  }
  if (const UnaryFn *f = findUnaryFn(fn.s); f && f->activation)
    return unaryTensorFn(fn.s, x, l);
  fail(fn.loc, "'" + fn.s + "' is not an activation; use " + activationNames() +
                   " or a def of one argument");
}

//===----------------------------------------------------------------------===//
// The tensor builtin table
//===----------------------------------------------------------------------===//

void Elaborator::registerTensorBuiltins() {
  auto &B = builtins_;
  // Elementwise functions of one tensor (or one number).
  for (const UnaryFn &fn : kUnaryFns) {
    std::string name = fn.name;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x"}, 1);
      return unaryTensorFn(name, arg(a, 0), e.loc);
    };
  }
  for (const char *fn : {"gelu", "gelu_tanh"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x"}, 1);
      Val f;
      f.kind = Val::Kind::Func;
      f.s = name;
      return activation(f, tensorArg(a, 0), e.loc);
    };
  }
  for (const char *fn : {"softmax", "log_softmax"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x", "axis"}, 1);
      Val x = expectFloatTensor(tensorArg(a, 0), "the argument of " + name + "()");
      if (x.shape.empty())
        fail(x.loc, name + "() needs a tensor of rank >= 1");
      int64_t ax = axisArg(a, 1, x.shape.size(), -1);
      IntegerAttr axis = b_.getI64IntegerAttr(ax);
      mlir::Value r = name == "softmax"
                          ? create<SoftmaxOp>(e.loc, x.value, axis)
                          : create<LogSoftmaxOp>(e.loc, x.value, axis);
      return tensor(r, x.shape, x.dtype, e.loc);
    };
  }
  for (const char *fn : {"sum", "mean", "max"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x", "axis", "keepdims"}, 1);
      Val x = tensorArg(a, 0);
      std::vector<int64_t> axes;
      if (a.has(1))
        axes = intListArg(a, 1);
      else
        for (size_t d = 0; d < x.shape.size(); ++d)
          axes.push_back(d);
      return reduce(name, x, axes, boolArg(a, 2, false), e.loc);
    };
  }
  for (const char *fn : {"maximum", "minimum"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"a", "b"}, 2);
      Val x = arg(a, 0), y = arg(a, 1);
      if (x.isNumber() && y.isNumber()) {
        bool takeX = name == "maximum" ? x.num() >= y.num() : x.num() <= y.num();
        return takeX ? x : y;
      }
      if (!x.isTensor() && !y.isTensor())
        fail(e.loc, name + "() needs numbers or tensors");
      Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
      Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
      if (p.dtype != q.dtype || p.dtype == DType::I1)
        fail(e.loc, name + "() needs numeric tensors of one element type, "
                    "got " + describe(p) + " and " + describe(q));
      Shape s = broadcastShapes(p.shape, q.shape, e.loc, "combine");
      p = broadcastTo(p, s, e.loc);
      q = broadcastTo(q, s, e.loc);
      mlir::Value r = name == "maximum" ? create<MaxOp>(e.loc, p.value, q.value)
                                        : create<MinOp>(e.loc, p.value, q.value);
      return tensor(r, s, p.dtype, e.loc);
    };
  }
  static const std::pair<const char *, CompareDirection> comparisons[] = {
      {"equal", CompareDirection::eq},      {"not_equal", CompareDirection::ne},
      {"less", CompareDirection::lt},       {"less_equal", CompareDirection::le},
      {"greater", CompareDirection::gt},    {"greater_equal", CompareDirection::ge}};
  for (const auto &[fn, dir] : comparisons) {
    std::string name = fn;
    CompareDirection d = dir;
    B[name] = [this, name, d](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"a", "b"}, 2);
      Val x = arg(a, 0), y = arg(a, 1);
      if (!x.isTensor() && !y.isTensor())
        fail(e.loc, name + "() compares tensors; got " + describe(x) +
                        " and " + describe(y));
      Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
      Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
      if (p.dtype != q.dtype || p.dtype == DType::I1)
        fail(e.loc, name + "() needs numeric tensors of one element type, "
                    "got " + describe(p) + " and " + describe(q));
      Shape s = broadcastShapes(p.shape, q.shape, e.loc, "compare");
      p = broadcastTo(p, s, e.loc);
      q = broadcastTo(q, s, e.loc);
      return tensor(create<CompareOp>(e.loc, d, p.value, q.value), s,
                    DType::I1, e.loc);
    };
  }
  B["where"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"cond", "a", "b"}, 3);
    Val c = tensorArg(a, 0);
    if (c.dtype != DType::I1)
      fail(c.loc, "where() needs a boolean condition (from less(), equal(), "
                  "...), got " + describe(c));
    Val x = arg(a, 1), y = arg(a, 2);
    if (!x.isTensor() && !y.isTensor())
      fail(e.loc, "where() needs at least one tensor value");
    Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
    Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
    if (p.dtype != q.dtype)
      fail(e.loc, "where() values differ in element type: " + describe(p) +
                      " and " + describe(q));
    Shape s = broadcastShapes(broadcastShapes(p.shape, q.shape, e.loc, "select"),
                              c.shape, e.loc, "select");
    c = broadcastTo(c, s, e.loc);
    p = broadcastTo(p, s, e.loc);
    q = broadcastTo(q, s, e.loc);
    return tensor(create<SelectOp>(e.loc, c.value, p.value, q.value), s,
                  p.dtype, e.loc);
  };
  B["matmul"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"a", "b", "transpose_a", "transpose_b"}, 2);
    return matmul(tensorArg(a, 0), tensorArg(a, 1), boolArg(a, 2, false),
                  boolArg(a, 3, false), e.loc);
  };
  B["reshape"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "shape"}, 2);
    Val x = tensorArg(a, 0);
    const Val &sv = arg(a, 1);
    if (sv.kind != Val::Kind::List)
      fail(sv.loc, "reshape() needs a shape list such as [B, 64, -1]");
    Shape s;
    int inferred = -1;
    int64_t known = 1, total = 1;
    for (const Dim &d : x.shape)
      total *= d.size;
    for (size_t i = 0; i < sv.items.size(); ++i) {
      const Val &d = sv.items[i];
      if (d.kind != Val::Kind::Int)
        fail(d.loc, "a dimension must be an integer, got " + describe(d));
      if (d.i == -1) {
        if (inferred >= 0)
          fail(d.loc, "only one dimension of a reshape may be -1");
        inferred = i;
        s.push_back(Dim{1, ""});
        continue;
      }
      if (d.i < 1 || d.i > kMaxDimSize)
        fail(d.loc, "dimension " + std::to_string(d.i) + " is out of range");
      if (known > kMaxTensorElements / d.i)
        fail(d.loc, "reshape target is too large");
      known *= d.i;
      s.push_back(Dim{d.i, d.s});
    }
    if (inferred >= 0) {
      if (total % known != 0)
        fail(sv.loc, "cannot infer the -1 dimension: " + std::to_string(total) +
                         " elements do not divide by " + std::to_string(known));
      s[inferred].size = total / known;
    }
    return reshape(x, s, e.loc);
  };
  B["transpose"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "perm"}, 1);
    Val x = tensorArg(a, 0);
    std::vector<int64_t> perm;
    if (a.has(1)) {
      perm = intListArg(a, 1);
    } else {
      if (x.shape.size() < 2)
        fail(e.loc, "transpose() without perm swaps the last two axes and "
                    "needs rank >= 2");
      for (size_t i = 0; i < x.shape.size(); ++i)
        perm.push_back(i);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    }
    return transpose(x, perm, e.loc);
  };
  B["slice"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "axis", "start", "end", "step"}, 4);
    Val x = tensorArg(a, 0);
    if (x.shape.empty())
      fail(x.loc, "slice() needs a tensor of rank >= 1");
    int64_t ax = axisArg(a, 1, x.shape.size(), 0);
    return sliceAxis(x, ax, intArg(a, 2), intArg(a, 3), intArg(a, 4, 1), e.loc);
  };
  B["concat"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"tensors", "axis"}, 1);
    const Val &list = arg(a, 0);
    if (list.kind != Val::Kind::List || list.items.empty())
      fail(list.loc, "concat() needs a non-empty list of tensors");
    std::vector<Val> xs;
    for (const Val &v : list.items)
      xs.push_back(expectTensor(v, "each element of concat()'s list"));
    if (xs[0].shape.empty())
      fail(xs[0].loc, "concat() needs tensors of rank >= 1, got a scalar");
    int64_t ax = axisArg(a, 1, xs[0].shape.size(), 0);
    Shape out = xs[0].shape;
    SmallVector<mlir::Value> vals;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Val &v = xs[i];
      if (v.dtype != xs[0].dtype || v.shape.size() != out.size())
        fail(v.loc, "concat() element " + std::to_string(i) + " is " +
                        describe(v) + " but element 0 is " + describe(xs[0]));
      for (size_t d = 0; d < out.size(); ++d)
        if (int64_t(d) != ax && v.shape[d].size != out[d].size)
          fail(v.loc, "concat() element " + std::to_string(i) + " has shape " +
                          str(v.shape) + " but element 0 has " +
                          str(xs[0].shape) + "; only axis " +
                          std::to_string(ax) + " may differ");
      if (i > 0)
        out[ax] = Dim{out[ax].size + v.shape[ax].size, ""};
      vals.push_back(v.value);
    }
    RankedTensorType type = tensorType(out, xs[0].dtype, e.loc);
    return tensor(create<ConcatOp>(e.loc, type, vals, b_.getI64IntegerAttr(ax)),
                  out, xs[0].dtype, e.loc);
  };
  B["cast"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "dtype"}, 2);
    Val x = tensorArg(a, 0);
    const Val &t = arg(a, 1);
    if (t.kind != Val::Kind::Type)
      fail(t.loc, "cast() needs an element type (f64, f32, f16, bf16, i64, "
                  "i32, i1), got " + describe(t));
    if (t.dtype == x.dtype)
      return x;
    return tensor(create<CastOp>(e.loc, tensorType(x.shape, t.dtype, e.loc),
                                 x.value),
                  x.shape, t.dtype, e.loc);
  };
  // The class-index losses (docs/language.md "Losses"): the checks they
  // share, and the reduction argument.
  auto lossArgs = [this](const char *fn, const char *what, const Val &x,
                         const Val &targets) {
    if (!isInteger(targets.dtype))
      fail(targets.loc, std::string(fn) + "() targets must be an integer "
                        "tensor (class indices), got " + describe(targets));
    if (x.shape.empty())
      fail(x.loc, std::string(fn) + "() " + what + " need a class dimension");
    Shape want(x.shape.begin(), x.shape.end() - 1);
    if (targets.shape != want)
      fail(targets.loc, std::string(fn) + "() targets have shape " +
                            str(targets.shape) + " but " + what + " " +
                            str(x.shape) + " need targets " + str(want));
  };
  auto reductionArg = [this](const Args &a, size_t i) {
    if (!a.has(i))
      return LossReduction::mean;
    const Val &r = arg(a, i);
    if (r.kind != Val::Kind::Str ||
        (r.s != "mean" && r.s != "sum" && r.s != "none"))
      fail(r.loc, "reduction must be \"mean\", \"sum\" or \"none\"");
    return r.s == "mean" ? LossReduction::mean
           : r.s == "sum" ? LossReduction::sum : LossReduction::none;
  };
  // -lp[..., t] per position (PyTorch's F.nll_loss), picked with a one-hot
  // select (kiln.iota == targets, as kiln.cross_entropy decomposes), then
  // reduced. The ops stay fp32 under bf16/fp16, as kiln.cross_entropy does
  // (rule loss-fp32): they are tagged as an fp32 override named after the
  // call. The compare against the iota gives the targets' input its range
  // in the artifact (compiler/Package.cpp).
  auto nll = [this](const std::string &fn, Val lp, const Val &targets,
                    LossReduction red, SourceLoc l) {
    std::string outerFp32 = tagger_.fp32;
    if (tagger_.fp32.empty())
      tagger_.fp32 = fn + " at line " + std::to_string(l.line);
    int64_t cls = int64_t(lp.shape.size()) - 1;
    RankedTensorType it = tensorType(lp.shape, targets.dtype, l);
    mlir::Value classes = create<IotaOp>(l, it, b_.getI64IntegerAttr(cls));
    SmallVector<int64_t> lead;
    for (int64_t d = 0; d < cls; ++d)
      lead.push_back(d);
    mlir::Value tb = create<BroadcastInDimOp>(l, it, targets.value, lead);
    mlir::Value hot = create<CompareOp>(l, CompareDirection::eq, classes, tb);
    Val zero = splat(lp.shape, lp.dtype, 0.0, l);
    Val picked = tensor(create<SelectOp>(l, hot, lp.value, zero.value),
                        lp.shape, lp.dtype, l);
    Val sum = reduce("sum", picked, {cls}, false, l);
    Val per = tensor(create<NegOp>(l, sum.value), sum.shape, sum.dtype, l);
    std::vector<int64_t> all;
    for (int64_t d = 0; d < cls; ++d)
      all.push_back(d);
    Val out = per;
    if (red != LossReduction::none)
      out = all.empty() ? per
                        : reduce(red == LossReduction::mean ? "mean" : "sum",
                                 per, all, false, l);
    tagger_.fp32 = outerFp32;
    return out;
  };
  B["cross_entropy"] = [this, lossArgs, reductionArg, nll](const Expr &e,
                                                          Env &env) {
    Args a = bindArgs(e, env, {"logits", "targets", "reduction", "from_logits"}, 2);
    bool fromLogits = boolArg(a, 3, true);
    Val logits = expectFloatTensor(
        tensorArg(a, 0), fromLogits ? "the logits of cross_entropy()"
                                    : "the probabilities of cross_entropy()");
    Val targets = tensorArg(a, 1);
    lossArgs("cross_entropy", fromLogits ? "logits" : "probabilities", logits,
             targets);
    LossReduction red = reductionArg(a, 2);
    if (!fromLogits) {
      // Probabilities (Keras' SparseCategoricalCrossentropy(from_logits =
      // False)): clipped to [eps, 1 - eps] with Keras' epsilon 1e-7, then
      // log, then nll; in fp32 (an fp32 override, as nll above).
      std::string outerFp32 = tagger_.fp32;
      if (tagger_.fp32.empty())
        tagger_.fp32 = "cross_entropy at line " + std::to_string(e.loc.line);
      constexpr double kEps = 1e-7;
      Val lo = splat(logits.shape, logits.dtype, kEps, e.loc);
      Val hi = splat(logits.shape, logits.dtype, 1.0 - kEps, e.loc);
      mlir::Value c = create<MinOp>(
          e.loc, create<MaxOp>(e.loc, logits.value, lo.value), hi.value);
      Val lp = tensor(create<LogOp>(e.loc, c), logits.shape, logits.dtype, e.loc);
      Val out = nll("cross_entropy", lp, targets, red, e.loc);
      tagger_.fp32 = outerFp32;
      return out;
    }
    Shape want(logits.shape.begin(), logits.shape.end() - 1);
    Shape out = red == LossReduction::none ? want : Shape{};
    countOp(e.loc);
    auto op = b_.create<CrossEntropyOp>(loc(e.loc), logits.value,
                                        targets.value, red);
    return tensor(op.getResult(), out, logits.dtype, e.loc);
  };
  B["nll_loss"] = [this, lossArgs, reductionArg, nll](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"log_probs", "targets", "reduction"}, 2);
    Val lp = expectFloatTensor(tensorArg(a, 0), "the log-probabilities of nll_loss()");
    Val targets = tensorArg(a, 1);
    lossArgs("nll_loss", "log-probabilities", lp, targets);
    return nll("nll_loss", lp, targets, reductionArg(a, 2), e.loc);
  };
  B["dropout"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "p"}, 2);
    return dropout(tensorArg(a, 0), floatArg(a, 1, 0), e.loc);
  };
}

} // namespace kiln::frontend::elab
