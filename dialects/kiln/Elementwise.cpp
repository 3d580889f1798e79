//===- Elementwise.cpp - Scalar semantics of the elementwise ops ----------===//
//
// One entry per op: {name, arity, reference (double), CUDA expression,
// arith/math body}. The CUDA and MLIR forms are those the CUDA emitter and
// the linalg lowering have always produced (test/codegen pins both); the
// reference is what they compute, in double.
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/Elementwise.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

using namespace mlir;

namespace kiln::elementwise_table {

std::string cudaFloatLiteral(double v, bool isDouble) {
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

std::string CudaOperands::fn(const char *name) const {
  return fmt::format("{}{}({})", name, suffix(), a[0]);
}

Value ScalarOperands::f(double v) const {
  return b.create<arith::ConstantOp>(loc, t, b.getFloatAttr(t, v));
}

Value ScalarOperands::i(int64_t v) const {
  return b.create<arith::ConstantOp>(loc, t, b.getIntegerAttr(t, v));
}

namespace {

double gelu(double x, bool tanhForm) {
  if (!tanhForm)
    return 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2));
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

/// A float op with an integer twin: picks by the operand type.
template <typename F, typename I> Value fi(const ScalarOperands &s) {
  return s.isFloat ? s.b.create<F>(s.loc, s.a[0], s.a[1]).getResult()
                   : s.b.create<I>(s.loc, s.a[0], s.a[1]).getResult();
}

using S = const ScalarOperands &;
using C = const CudaOperands &;

const Entry kEntries[] = {
    // --- unary ----------------------------------------------------------
    {"kiln.neg", 1, [](double x, double) { return -x; },
     [](C c) { return "(-" + c.a[0] + ")"; },
     [](S s) {
       return s.isFloat ? s.b.create<arith::NegFOp>(s.loc, s.a[0]).getResult()
                        : s.b.create<arith::SubIOp>(s.loc, s.i(0), s.a[0]).getResult();
     }},
    {"kiln.abs", 1, [](double x, double) { return std::fabs(x); },
     [](C c) { return c.isFloat ? c.fn("fabs") : fmt::format("({0} < 0 ? -{0} : {0})", c.a[0]); },
     [](S s) {
       return s.isFloat ? s.b.create<math::AbsFOp>(s.loc, s.a[0]).getResult()
                        : s.b.create<math::AbsIOp>(s.loc, s.a[0]).getResult();
     }},
    {"kiln.exp", 1, [](double x, double) { return std::exp(x); },
     [](C c) { return c.fn("exp"); },
     [](S s) -> Value { return s.b.create<math::ExpOp>(s.loc, s.a[0]); }},
    {"kiln.log", 1, [](double x, double) { return std::log(x); },
     [](C c) { return c.fn("log"); },
     [](S s) -> Value { return s.b.create<math::LogOp>(s.loc, s.a[0]); }},
    {"kiln.sqrt", 1, [](double x, double) { return std::sqrt(x); },
     [](C c) { return c.fn("sqrt"); },
     [](S s) -> Value { return s.b.create<math::SqrtOp>(s.loc, s.a[0]); }},
    // 1 / sqrt(x): math.rsqrt has no LLVM lowering in MLIR 19
    {"kiln.rsqrt", 1, [](double x, double) { return 1.0 / std::sqrt(x); },
     [](C c) { return fmt::format("({} / {})", c.lit(1.0), c.fn("sqrt")); },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(s.loc, s.f(1.0), s.b.create<math::SqrtOp>(s.loc, s.a[0]));
     }},
    {"kiln.tanh", 1, [](double x, double) { return std::tanh(x); },
     [](C c) { return c.fn("tanh"); },
     [](S s) -> Value { return s.b.create<math::TanhOp>(s.loc, s.a[0]); }},
    {"kiln.erf", 1, [](double x, double) { return std::erf(x); },
     [](C c) { return c.fn("erf"); },
     [](S s) -> Value { return s.b.create<math::ErfOp>(s.loc, s.a[0]); }},
    {"kiln.cos", 1, [](double x, double) { return std::cos(x); },
     [](C c) { return c.fn("cos"); },
     [](S s) -> Value { return s.b.create<math::CosOp>(s.loc, s.a[0]); }},
    {"kiln.sin", 1, [](double x, double) { return std::sin(x); },
     [](C c) { return c.fn("sin"); },
     [](S s) -> Value { return s.b.create<math::SinOp>(s.loc, s.a[0]); }},
    // 1 / (1 + e^-x)
    {"kiln.sigmoid", 1, [](double x, double) { return 1.0 / (1.0 + std::exp(-x)); },
     [](C c) {
       return fmt::format("({} / ({} + {}{}(-{})))", c.lit(1.0), c.lit(1.0), "exp", c.suffix(),
                          c.a[0]);
     },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(
           s.loc, s.f(1.0),
           s.b.create<arith::AddFOp>(
               s.loc, s.f(1.0),
               s.b.create<math::ExpOp>(s.loc, s.b.create<arith::NegFOp>(s.loc, s.a[0]))));
     }},
    // x / (1 + e^-x) (SiLU, swish)
    {"kiln.silu", 1, [](double x, double) { return x / (1.0 + std::exp(-x)); },
     [](C c) {
       return fmt::format("({} / ({} + exp{}(-{})))", c.a[0], c.lit(1.0), c.suffix(), c.a[0]);
     },
     [](S s) -> Value {
       return s.b.create<arith::DivFOp>(
           s.loc, s.a[0],
           s.b.create<arith::AddFOp>(
               s.loc, s.f(1.0),
               s.b.create<math::ExpOp>(s.loc, s.b.create<arith::NegFOp>(s.loc, s.a[0]))));
     }},
    // max(x, 0); NaN stays NaN (arith.maximumf)
    {"kiln.relu", 1, [](double x, double) { return (x != x || x > 0) ? x : 0.0; },
     [](C c) {
       return c.isFloat ? fmt::format("(({0} != {0} || {0} > {1}) ? {0} : {1})", c.a[0], c.lit(0.0))
                        : fmt::format("({0} > 0 ? {0} : 0)", c.a[0]);
     },
     [](S s) {
       return s.isFloat ? s.b.create<arith::MaximumFOp>(s.loc, s.a[0], s.f(0.0)).getResult()
                        : s.b.create<arith::MaxSIOp>(s.loc, s.a[0], s.i(0)).getResult();
     }},
    // x Phi(x) = x/2 (1 + erf(x / sqrt 2))
    {"kiln.gelu(erf)", 1, [](double x, double) { return gelu(x, false); },
     [](C c) {
       return fmt::format("({1} * {0} * ({2} + erf{4}({0} * {3})))", c.a[0], c.lit(0.5),
                          c.lit(1.0), c.lit(M_SQRT1_2), c.suffix());
     },
     [](S s) -> Value {
       Value x = s.a[0], half = s.f(0.5);
       Value inner =
           s.b.create<math::ErfOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, x, s.f(M_SQRT1_2)));
       return s.b.create<arith::MulFOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, half, x),
                                        s.b.create<arith::AddFOp>(s.loc, s.f(1.0), inner));
     }},
    // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    {"kiln.gelu(tanh)", 1, [](double x, double) { return gelu(x, true); },
     [](C c) {
       return fmt::format("({1} * {0} * ({2} + tanh{5}({3} * ({0} + {4} * {0} * {0} * {0}))))",
                          c.a[0], c.lit(0.5), c.lit(1.0), c.lit(std::sqrt(2.0 / M_PI)),
                          c.lit(0.044715), c.suffix());
     },
     [](S s) -> Value {
       Value x = s.a[0], half = s.f(0.5);
       Value x3 = s.b.create<arith::MulFOp>(s.loc, x, s.b.create<arith::MulFOp>(s.loc, x, x));
       Value u = s.b.create<arith::MulFOp>(
           s.loc, s.f(std::sqrt(2.0 / M_PI)),
           s.b.create<arith::AddFOp>(s.loc, x,
                                     s.b.create<arith::MulFOp>(s.loc, s.f(0.044715), x3)));
       Value inner = s.b.create<math::TanhOp>(s.loc, u);
       return s.b.create<arith::MulFOp>(s.loc, s.b.create<arith::MulFOp>(s.loc, half, x),
                                        s.b.create<arith::AddFOp>(s.loc, s.f(1.0), inner));
     }},
    // --- binary ---------------------------------------------------------
    {"kiln.add", 2, [](double x, double y) { return x + y; },
     [](C c) { return fmt::format("({} + {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::AddFOp, arith::AddIOp>(s); }},
    {"kiln.sub", 2, [](double x, double y) { return x - y; },
     [](C c) { return fmt::format("({} - {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::SubFOp, arith::SubIOp>(s); }},
    {"kiln.mul", 2, [](double x, double y) { return x * y; },
     [](C c) { return fmt::format("({} * {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::MulFOp, arith::MulIOp>(s); }},
    {"kiln.div", 2, [](double x, double y) { return x / y; },
     [](C c) { return fmt::format("({} / {})", c.a[0], c.a[1]); },
     [](S s) { return fi<arith::DivFOp, arith::DivSIOp>(s); }},
    {"kiln.pow", 2, [](double x, double y) { return std::pow(x, y); },
     [](C c) { return fmt::format("pow{}({}, {})", c.suffix(), c.a[0], c.a[1]); },
     [](S s) -> Value { return s.b.create<math::PowFOp>(s.loc, s.a[0], s.a[1]); }},
    // NaN if either operand is NaN (arith.maximumf / minimumf)
    {"kiln.max", 2,
     [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); },
     [](C c) {
       return c.isFloat ? fmt::format("{}({}, {})", c.isDouble ? "kiln_maxd" : "kiln_maxf", c.a[0], c.a[1])
                        : fmt::format("max({}, {})", c.a[0], c.a[1]);
     },
     [](S s) { return fi<arith::MaximumFOp, arith::MaxSIOp>(s); }},
    {"kiln.min", 2,
     [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y); },
     [](C c) {
       return c.isFloat ? fmt::format("{}({}, {})", c.isDouble ? "kiln_mind" : "kiln_minf", c.a[0], c.a[1])
                        : fmt::format("min({}, {})", c.a[0], c.a[1]);
     },
     [](S s) { return fi<arith::MinimumFOp, arith::MinSIOp>(s); }},
};

} // namespace

llvm::ArrayRef<Entry> entries() { return kEntries; }

const Entry *lookup(Operation *op) {
  llvm::StringRef name = op->getName().getStringRef();
  std::string key = name.str();
  if (auto g = dyn_cast<GeluOp>(op))
    key += g.getApproximation() == GeluApproximation::erf ? "(erf)" : "(tanh)";
  for (const Entry &e : kEntries)
    if (key == e.name)
      return &e;
  return nullptr;
}

} // namespace kiln::elementwise_table
