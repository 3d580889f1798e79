//===- Values.cpp - Values, scalars and shapes ----------------------------===//
//
// The value type and its descriptions, shapes with dimension names,
// tensors and constants of an element type, broadcasting, typed argument
// accessors, and scalar and elementwise arithmetic.
//
//===----------------------------------------------------------------------===//
#include "frontend/elaborate/Elaborator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

namespace kiln::frontend::elab {

std::string str(const Shape &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      out += ", ";
    if (!s[i].name.empty())
      out += s[i].name + "=";
    out += std::to_string(s[i].size);
  }
  return out + "]";
}

std::string fmtDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const char *kindName(const Val &v) {
  switch (v.kind) {
  case Val::Kind::Tensor: return "a tensor";
  case Val::Kind::Int: return "an integer";
  case Val::Kind::Float: return "a number";
  case Val::Kind::Bool: return "a boolean";
  case Val::Kind::Str: return "a string";
  case Val::Kind::List: return "a list";
  case Val::Kind::Func: return "a function";
  case Val::Kind::Init: return "an initialiser";
  case Val::Kind::Type: return "an element type";
  }
  return "a value";
}

std::string describe(const Val &v) {
  if (v.isTensor())
    return std::string(dtypeName(v.dtype)) + " tensor " + str(v.shape);
  return kindName(v);
}

//===----------------------------------------------------------------------===//
// Errors and locations
//===----------------------------------------------------------------------===//

Location Elaborator::loc(SourceLoc l) {
  Location result = FileLineColLoc::get(&ctx_, file_.name(), l.line, l.col);
  for (auto it = callStack_.rbegin(); it != callStack_.rend(); ++it)
    result = CallSiteLoc::get(result, *it);
  return result;
}

void Elaborator::countOp(SourceLoc l) {
  if (++opCount_ > opts_.maxOps)
    fail(l, "the model grows past " + std::to_string(opts_.maxOps) +
                " ops; reduce repeat counts or model size");
}

//===----------------------------------------------------------------------===//
// Types and tensors
//===----------------------------------------------------------------------===//

RankedTensorType Elaborator::tensorType(const Shape &s, DType t, SourceLoc l) {
  SmallVector<int64_t> dims;
  int64_t count = 1;
  for (const Dim &d : s) {
    if (d.size < 1 || d.size > kMaxDimSize)
      fail(l, "dimension " + (d.name.empty() ? "" : "'" + d.name + "' ") +
                  "of size " + std::to_string(d.size) +
                  " is out of range (expected 1 to " +
                  std::to_string(kMaxDimSize) + ")");
    if (count > kMaxTensorElements / d.size)
      fail(l, "tensor " + str(s) + " has more than " +
                  std::to_string(kMaxTensorElements) + " elements");
    count *= d.size;
    dims.push_back(d.size);
  }
  return RankedTensorType::get(dims, toMlirType(t, b_));
}

Val Elaborator::tensor(mlir::Value v, Shape s, DType t, SourceLoc l) {
  Val r;
  r.kind = Val::Kind::Tensor;
  r.value = v;
  r.shape = std::move(s);
  r.dtype = t;
  r.loc = l;
  return r;
}

Val Elaborator::scalarInt(int64_t v, SourceLoc l, std::string name) {
  Val r;
  r.kind = Val::Kind::Int;
  r.i = v;
  r.loc = l;
  r.s = std::move(name);
  return r;
}
Val Elaborator::scalarFloat(double v, SourceLoc l) {
  Val r;
  r.kind = Val::Kind::Float;
  r.f = v;
  r.loc = l;
  return r;
}

Val Elaborator::splat(const Shape &s, DType t, double v, SourceLoc l) {
  checkFits(v, t, l);
  RankedTensorType type = tensorType(s, t, l);
  Attribute a;
  if (isFloat(t))
    a = FloatAttr::get(type.getElementType(), v);
  else
    a = IntegerAttr::get(type.getElementType(), static_cast<int64_t>(v));
  return tensor(create<ConstantOp>(l, DenseElementsAttr::get(type, a)), s, t,
                l);
}

Shape Elaborator::broadcastShapes(const Shape &a, const Shape &c, SourceLoc l,
                                  const std::string &what) {
  size_t rank = std::max(a.size(), c.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const Dim *x = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
    const Dim *y = i < rank - c.size() ? nullptr : &c[i - (rank - c.size())];
    if (x && y && x->size != y->size && x->size != 1 && y->size != 1)
      fail(l, "cannot " + what + " tensors of shapes " + str(a) + " and " +
                  str(c) + ": dim " + std::to_string(int64_t(i) - int64_t(rank)) +
                  " is " + std::to_string(x->size) + " vs " +
                  std::to_string(y->size) + " (sizes must match or be 1)");
    if (x && y)
      out[i] = x->size == 1 ? *y : *x;
    else
      out[i] = x ? *x : *y;
  }
  return out;
}

Val Elaborator::broadcastTo(const Val &t, const Shape &target, SourceLoc l) {
  if (t.shape.size() == target.size() &&
      std::equal(t.shape.begin(), t.shape.end(), target.begin()))
    return t;
  size_t offset = target.size() - t.shape.size();
  SmallVector<int64_t> dims;
  for (size_t i = 0; i < t.shape.size(); ++i)
    dims.push_back(int64_t(offset + i));
  RankedTensorType type = tensorType(target, t.dtype, l);
  return tensor(create<BroadcastInDimOp>(l, type, t.value, dims), target,
                t.dtype, l);
}

void Elaborator::checkFits(double v, DType t, SourceLoc l) {
  if (std::isinf(v) || std::isnan(v))
    return; // explicit infinities (e.g. masks) are intended
  double limit = t == DType::F64 ? 1.79e308
                 : t == DType::F16 ? 65504.0
                 : t == DType::I32 ? 2147483647.0
                 : t == DType::I64 ? 9.2e18 : 3.4028234e38;
  bool isIntType = t == DType::I32 || t == DType::I64;
  if (std::fabs(v) > limit || (t == DType::I32 && v < -2147483648.0))
    fail(l, "the number " + fmtDouble(v) + " does not fit in " +
                dtypeName(t) + (isIntType ? "" : " (it would become infinity)"));
}

Val Elaborator::toTensorLike(const Val &scalar, const Val &like, SourceLoc l) {
  if (scalar.kind == Val::Kind::Bool)
    fail(scalar.loc, "a boolean cannot be used in tensor arithmetic");
  if (!scalar.isNumber())
    fail(scalar.loc, std::string("expected a tensor or a number, got ") +
                         kindName(scalar));
  if (!isFloat(like.dtype) && scalar.kind == Val::Kind::Float)
    fail(scalar.loc, "cannot combine the number " + fmtDouble(scalar.f) +
                         " with an integer tensor; cast the tensor first");
  if (!isFloat(like.dtype)) { // exact: no trip through double
    if (like.dtype == DType::I32 &&
        (scalar.i < INT32_MIN || scalar.i > INT32_MAX))
      fail(l, "the number " + std::to_string(scalar.i) + " does not fit in i32");
    RankedTensorType type = tensorType(like.shape, like.dtype, l);
    return tensor(create<ConstantOp>(
                      l, DenseElementsAttr::get(
                             type, IntegerAttr::get(type.getElementType(), scalar.i))),
                  like.shape, like.dtype, l);
  }
  return splat(like.shape, like.dtype, scalar.num(), l);
}

Val Elaborator::expectTensor(const Val &v, const std::string &what) {
  if (!v.isTensor())
    fail(v.loc, what + " must be a tensor, got " + describe(v));
  return v;
}

void Elaborator::expectF32(const Val &v, const std::string &layer) {
  expectTensor(v, "the input of " + layer);
  if (v.dtype != DType::F32)
    fail(v.loc, layer + " computes in f32 (its parameters are f32) but its "
                "input is " + describe(v) + "; use cast(x, f32)");
}

Val Elaborator::expectFloatTensor(const Val &v, const std::string &what) {
  expectTensor(v, what);
  if (!isFloat(v.dtype))
    fail(v.loc, what + " must be a floating-point tensor, got " +
                    describe(v) + "; use cast(x, f32)");
  return v;
}

//===----------------------------------------------------------------------===//
// Argument accessors
//===----------------------------------------------------------------------===//

Val Elaborator::tensorArg(const Args &a, size_t i) {
  return expectTensor(arg(a, i), "argument '" + a.names[i] + "' of " +
                                     a.callee + "()");
}
int64_t Elaborator::intArg(const Args &a, size_t i,
                           std::optional<int64_t> def) {
  if (!a.has(i)) {
    if (!def)
      fail(a.callLoc, a.callee + "() needs argument '" + a.names[i] + "'");
    return *def;
  }
  const Val &v = arg(a, i);
  if (v.kind == Val::Kind::Int)
    return v.i;
  fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                  "() must be an integer, got " + describe(v) +
                  (v.kind == Val::Kind::Float ? " (use // for integer division)"
                                              : ""));
}
double Elaborator::floatArg(const Args &a, size_t i, double def) {
  if (!a.has(i))
    return def;
  const Val &v = arg(a, i);
  if (!v.isNumber())
    fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                    "() must be a number, got " + describe(v));
  return v.num();
}
bool Elaborator::boolArg(const Args &a, size_t i, bool def) {
  if (!a.has(i))
    return def;
  const Val &v = arg(a, i);
  if (v.kind != Val::Kind::Bool)
    fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                    "() must be true or false, got " + describe(v));
  return v.b;
}
Val Elaborator::initArg(const Args &a, size_t i, Val def) {
  if (!a.has(i))
    return def;
  const Val &v = arg(a, i);
  if (v.kind == Val::Kind::Init)
    return v;
  if (v.kind == Val::Kind::Func && (v.s == "zeros" || v.s == "ones"))
    return makeInit(v.s, 0, 0, v.loc);
  fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                  "() must be an initialiser (normal(std), uniform(low, "
                  "high), zeros or ones), got " + describe(v));
}
int64_t Elaborator::axisArg(const Args &a, size_t i, int64_t rank,
                            int64_t def) {
  int64_t ax = a.has(i) ? intArg(a, i) : def;
  return normAxis(ax, rank, a.has(i) ? arg(a, i).loc : a.callLoc);
}
int64_t Elaborator::normAxis(int64_t ax, int64_t rank, SourceLoc l) {
  if (ax < -rank || ax >= rank)
    fail(l, "axis " + std::to_string(ax) + " is out of range for a tensor "
                "of rank " + std::to_string(rank) + " (expected " +
                std::to_string(-rank) + " to " + std::to_string(rank - 1) +
                ")");
  return ax < 0 ? ax + rank : ax;
}
std::vector<int64_t> Elaborator::intListArg(const Args &a, size_t i) {
  const Val &v = arg(a, i);
  std::vector<int64_t> out;
  if (v.kind == Val::Kind::Int)
    return {v.i};
  if (v.kind != Val::Kind::List)
    fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                    "() must be a list of integers, got " + describe(v));
  for (const Val &x : v.items) {
    if (x.kind != Val::Kind::Int)
      fail(x.loc, "expected an integer in this list, got " + describe(x));
    out.push_back(x.i);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Scalar and elementwise arithmetic
//===----------------------------------------------------------------------===//

Val Elaborator::scalarArith(const std::string &op, const Val &a, const Val &c,
                            SourceLoc l) {
  if (a.kind == Val::Kind::Int && c.kind == Val::Kind::Int) {
    int64_t r = 0;
    bool overflow = false;
    if (op == "+")
      overflow = __builtin_add_overflow(a.i, c.i, &r);
    else if (op == "-")
      overflow = __builtin_sub_overflow(a.i, c.i, &r);
    else if (op == "*")
      overflow = __builtin_mul_overflow(a.i, c.i, &r);
    else if (op == "//") {
      if (c.i == 0)
        fail(l, "integer division by zero");
      if (a.i == std::numeric_limits<int64_t>::min() && c.i == -1)
        fail(l, "integer overflow in division");
      r = a.i / c.i;
      if ((a.i % c.i != 0) && ((a.i < 0) != (c.i < 0)))
        --r; // floor, as Python
    } else if (op == "**" && c.i >= 0) {
      // Exponentiation by squaring: O(log exponent), overflow-checked.
      r = 1;
      int64_t base = a.i, e = c.i;
      while (e > 0 && !overflow) {
        if (e & 1)
          overflow = __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e > 0 && !overflow)
          overflow = __builtin_mul_overflow(base, base, &base);
      }
    } else if (op == "/") {
      if (c.i == 0)
        fail(l, "division by zero");
      return scalarFloat(double(a.i) / double(c.i), l);
    } else if (op == "**") {
      double v = std::pow(double(a.i), double(c.i));
      if (!std::isfinite(v))
        fail(l, "'**' gives a non-finite number");
      return scalarFloat(v, l);
    } else {
      fail(l, "operator '" + op + "' needs tensors");
    }
    if (overflow)
      fail(l, "integer overflow in '" + op + "'");
    return scalarInt(r, l);
  }
  double x = a.num(), y = c.num(), r = 0;
  if (op == "+") r = x + y;
  else if (op == "-") r = x - y;
  else if (op == "*") r = x * y;
  else if (op == "/" || op == "//") {
    if (y == 0)
      fail(l, "division by zero");
    r = op == "/" ? x / y : std::floor(x / y);
  } else if (op == "**") r = std::pow(x, y);
  else
    fail(l, "operator '" + op + "' needs tensors");
  if (!std::isfinite(r))
    fail(l, "'" + op + "' gives a non-finite number");
  return scalarFloat(r, l);
}

Val Elaborator::arith(const std::string &op, const Val &a0, const Val &c0,
                      SourceLoc l) {
  if (a0.isNumber() && c0.isNumber())
    return scalarArith(op, a0, c0, l);
  if (op == "@") {
    expectTensor(a0, "the left operand of '@'");
    expectTensor(c0, "the right operand of '@'");
    return matmul(a0, c0, false, false, l);
  }
  if (!a0.isTensor() && !c0.isTensor())
    fail(l, std::string("operator '") + op + "' cannot combine " +
                kindName(a0) + " and " + kindName(c0));
  Val a = a0.isTensor() ? a0 : toTensorLike(a0, c0, l);
  Val c = c0.isTensor() ? c0 : toTensorLike(c0, a0, l);
  if (a.dtype != c.dtype)
    fail(l, std::string("operator '") + op + "' needs operands of one "
                "element type, got " + describe(a) + " and " + describe(c) +
                "; use cast(x, " + dtypeName(a.dtype) + ")");
  if (a.dtype == DType::I1)
    fail(l, std::string("operator '") + op + "' does not apply to boolean "
                "tensors");
  if ((op == "**") && !isFloat(a.dtype))
    fail(l, "'**' needs floating-point tensors; cast first");
  if (op == "//" && isFloat(a.dtype))
    fail(l, "'//' is integer division; use '/' for floating-point tensors");
  if ((op == "/" || op == "//") && !isFloat(a.dtype))
    fail(l, "division of integer tensors is not supported; cast them to a "
            "float type first");
  Shape s = broadcastShapes(a.shape, c.shape, l,
                            op == "+" ? "add" : op == "-" ? "subtract"
                            : op == "*" ? "multiply" : op == "**" ? "raise"
                                                                  : "divide");
  a = broadcastTo(a, s, l);
  c = broadcastTo(c, s, l);
  mlir::Value r;
  if (op == "+") r = create<AddOp>(l, a.value, c.value);
  else if (op == "-") r = create<SubOp>(l, a.value, c.value);
  else if (op == "*") r = create<MulOp>(l, a.value, c.value);
  else if (op == "/" || op == "//") r = create<DivOp>(l, a.value, c.value);
  else if (op == "**") r = create<PowOp>(l, a.value, c.value);
  else
    fail(l, "unknown operator '" + op + "'");
  return tensor(r, s, a.dtype, l);
}

} // namespace kiln::frontend::elab
