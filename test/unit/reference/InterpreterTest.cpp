//===- InterpreterTest.cpp - Unit tests for the reference interpreter -----===//
//
// Op-level tests of kiln::interp::run (reference/Interpreter.h) against
// hand-computed values. Each test parses a small module with func.func @f
// and checks @f's results element by element.
//
// Tolerances: results of f32 functions are rounded to f32 after every op, so
// a value computed from a transcendental function is checked to a relative
// error of 1e-6 (f32 carries ~6e-8); values that are exact in binary (sums of
// small integers, halves, bf16/f16 grid points) are checked for equality
// (tolerance 0 below). Statistical checks (dropout, random) state their
// bounds where they are made; all use fixed seeds, so they are deterministic.
//
// Link with KilnReference (and GTest::gtest_main).
//
//===----------------------------------------------------------------------===//
#include "reference/Interpreter.h"
#include "dialects/kiln/KilnDialect.h"
#include "runtime/core/Random.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using kiln::interp::Elem;
using kiln::interp::Tensor;

class InterpreterTest : public ::testing::Test {
protected:
  InterpreterTest() {
    ctx_.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
  }

  /// Parses `src` (which must define func.func @f); null on failure.
  mlir::func::FuncOp parse(const std::string &src) {
    module_ = mlir::parseSourceString<mlir::ModuleOp>(src, &ctx_);
    if (!module_)
      return {};
    return module_->lookupSymbol<mlir::func::FuncOp>("f");
  }

  /// Parses `src`, runs @f on `args` and returns its results. Parse and run
  /// errors fail the test (the returned vector is then empty).
  std::vector<Tensor> run(const std::string &src,
                          const std::vector<Tensor> &args = {},
                          bool exactF64 = false) {
    mlir::func::FuncOp fn = parse(src);
    EXPECT_TRUE(static_cast<bool>(fn)) << "cannot parse, or no @f in:\n" << src;
    if (!fn)
      return {};
    std::vector<Tensor> results;
    std::string error;
    kiln::interp::Options options;
    options.exactF64 = exactF64;
    bool ok = kiln::interp::run(fn, args, results, error, options);
    EXPECT_TRUE(ok) << error;
    if (!ok)
      results.clear();
    return results;
  }

  mlir::MLIRContext ctx_;
  mlir::OwningOpRef<mlir::ModuleOp> module_;
};

/// A float tensor of element type `elem` holding `values` (not rounded).
Tensor floats(Elem elem, std::vector<int64_t> shape, std::vector<double> values) {
  Tensor t = Tensor::zeros(elem, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  t.f = std::move(values);
  return t;
}

/// An integer (or i1) tensor holding `values`.
Tensor ints(Elem elem, std::vector<int64_t> shape, std::vector<int64_t> values) {
  Tensor t = Tensor::zeros(elem, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  t.i = std::move(values);
  return t;
}

/// Checks element type, shape and values; `relTol` 0 asks for equality,
/// otherwise |got - want| <= relTol * max(1, |want|).
void expectFloats(const Tensor &t, Elem elem, const std::vector<int64_t> &shape,
                  const std::vector<double> &want, double relTol,
                  const char *what) {
  SCOPED_TRACE(what);
  EXPECT_STREQ(kiln::interp::name(t.elem), kiln::interp::name(elem));
  EXPECT_EQ(t.shape, shape);
  ASSERT_EQ(t.f.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    if (relTol == 0)
      EXPECT_EQ(t.f[k], want[k]) << "element " << k;
    else
      EXPECT_NEAR(t.f[k], want[k], relTol * std::max(1.0, std::fabs(want[k])))
          << "element " << k;
  }
}

void expectInts(const Tensor &t, Elem elem, const std::vector<int64_t> &shape,
                const std::vector<int64_t> &want, const char *what) {
  SCOPED_TRACE(what);
  EXPECT_STREQ(kiln::interp::name(t.elem), kiln::interp::name(elem));
  EXPECT_EQ(t.shape, shape);
  EXPECT_EQ(t.i, want);
}

//===----------------------------------------------------------------------===//
// Op-level tests, inputs as constants
//===----------------------------------------------------------------------===//

// Every float unary op on x = [-2, -0.5, 0, 0.5, 2] (log, sqrt, rsqrt on
// [0.25, 1, 4]); values from the C library / closed forms, f32-rounded.
TEST_F(InterpreterTest, UnaryFloat) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
  %x = kiln.constant dense<[-2.0, -0.5, 0.0, 0.5, 2.0]> : tensor<5xf32>
  %p = kiln.constant dense<[0.25, 1.0, 4.0]> : tensor<3xf32>
  %0 = kiln.neg %x : tensor<5xf32>
  %1 = kiln.abs %x : tensor<5xf32>
  %2 = kiln.exp %x : tensor<5xf32>
  %3 = kiln.tanh %x : tensor<5xf32>
  %4 = kiln.sigmoid %x : tensor<5xf32>
  %5 = kiln.relu %x : tensor<5xf32>
  %6 = kiln.erf %x : tensor<5xf32>
  %7 = kiln.cos %x : tensor<5xf32>
  %8 = kiln.sin %x : tensor<5xf32>
  %9 = kiln.gelu erf, %x : tensor<5xf32>
  %10 = kiln.gelu tanh, %x : tensor<5xf32>
  %11 = kiln.log %p : tensor<3xf32>
  %12 = kiln.sqrt %p : tensor<3xf32>
  %13 = kiln.rsqrt %p : tensor<3xf32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13 : tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<5xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
}
)mlir");
  ASSERT_EQ(r.size(), 14u);
  expectFloats(r[0], Elem::F32, {5}, {2.0, 0.5, -0.0, -0.5, -2.0}, 0, "neg");
  expectFloats(r[1], Elem::F32, {5}, {2.0, 0.5, 0.0, 0.5, 2.0}, 0, "abs");
  expectFloats(r[2], Elem::F32, {5},
               {0.1353352832, 0.6065306597, 1.0, 1.648721271, 7.389056099},
               1e-06, "exp");
  expectFloats(r[3], Elem::F32, {5},
               {-0.9640275801, -0.4621171573, 0.0, 0.4621171573, 0.9640275801},
               1e-06, "tanh");
  expectFloats(r[4], Elem::F32, {5},
               {0.119202922, 0.3775406688, 0.5, 0.6224593312, 0.880797078},
               1e-06, "sigmoid");
  expectFloats(r[5], Elem::F32, {5}, {0.0, 0.0, 0.0, 0.5, 2.0}, 0, "relu");
  expectFloats(r[6], Elem::F32, {5},
               {-0.995322265, -0.5204998778, 0.0, 0.5204998778, 0.995322265},
               1e-06, "erf");
  expectFloats(r[7], Elem::F32, {5},
               {-0.4161468365, 0.8775825619, 1.0, 0.8775825619, -0.4161468365},
               1e-06, "cos");
  expectFloats(r[8], Elem::F32, {5},
               {-0.9092974268, -0.4794255386, 0.0, 0.4794255386, 0.9092974268},
               1e-06, "sin");
  expectFloats(r[9], Elem::F32, {5},
               {-0.0455002639, -0.1542687694, 0.0, 0.3457312306, 1.954499736},
               1e-06, "gelu erf");
  expectFloats(r[10], Elem::F32, {5},
               {-0.04540230591, -0.1542859902, 0.0, 0.3457140098, 1.954597694},
               1e-06, "gelu tanh");
  expectFloats(r[11], Elem::F32, {3}, {-1.386294361, 0.0, 1.386294361}, 1e-06, "log");
  expectFloats(r[12], Elem::F32, {3}, {0.5, 1.0, 2.0}, 0, "sqrt (exact: 0.5, 1, 2)");
  expectFloats(r[13], Elem::F32, {3}, {2.0, 1.0, 0.5}, 0, "rsqrt (exact: 2, 1, 0.5)");
}

// neg, abs and relu on i32 (the integer-capable unary ops).
TEST_F(InterpreterTest, UnaryInt) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xi32>, tensor<3xi32>, tensor<3xi32>) {
  %x = kiln.constant dense<[-3, 0, 5]> : tensor<3xi32>
  %0 = kiln.neg %x : tensor<3xi32>
  %1 = kiln.abs %x : tensor<3xi32>
  %2 = kiln.relu %x : tensor<3xi32>
  return %0, %1, %2 : tensor<3xi32>, tensor<3xi32>, tensor<3xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 3u);
  expectInts(r[0], Elem::I32, {3}, {3, 0, -5}, "neg");
  expectInts(r[1], Elem::I32, {3}, {3, 0, 5}, "abs");
  expectInts(r[2], Elem::I32, {3}, {0, 0, 5}, "relu");
}

// i64 stays exact beyond 2^53 (no trip through double), including casts.
TEST_F(InterpreterTest, Int64IsExact) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2xi64>, tensor<2xi64>, tensor<2xi32>) {
  %x = kiln.constant dense<[9007199254740993, -9223372036854775807]> : tensor<2xi64>
  %0 = kiln.neg %x : tensor<2xi64>
  %1 = kiln.abs %x : tensor<2xi64>
  %2 = kiln.cast %x : tensor<2xi64> -> tensor<2xi32>
  return %0, %1, %2 : tensor<2xi64>, tensor<2xi64>, tensor<2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 3u);
  expectInts(r[0], Elem::I64, {2}, {-9007199254740993, 9223372036854775807}, "neg");
  expectInts(r[1], Elem::I64, {2}, {9007199254740993, 9223372036854775807}, "abs");
  // 9007199254740993 = 2^53 + 1 -> low 32 bits = 1; -(2^63 - 1) -> low bits 1
  expectInts(r[2], Elem::I32, {2}, {1, 1}, "cast to i32 wraps");
}

// Rounding goes straight from double to f16 (no double rounding via f32):
// exp(0.007298) = 1.0073247..., nearest f16 is 1.0068359375 (spacing 2^-10),
// but rounding first to f32 then to f16 could land elsewhere on ties.
TEST(InterpreterRounding, HalfAndBFloatRoundOnce) {
  EXPECT_EQ(kiln::interp::roundTo(Elem::F16, 1.0 + 1.5 / 1024.0 + 1e-12),
            1.0 + 2.0 / 1024.0);
  EXPECT_EQ(kiln::interp::roundTo(Elem::F16, 1.0 + 0.5 / 1024.0), 1.0); // tie: even
  EXPECT_EQ(kiln::interp::roundTo(Elem::BF16, 1.0 + 1.0 / 256.0), 1.0); // tie: even
  EXPECT_EQ(kiln::interp::roundTo(Elem::BF16, 1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
  EXPECT_EQ(kiln::interp::roundTo(Elem::BF16, 1.0 + 1.0 / 256.0 + 1e-12), 1.0 + 2.0 / 256.0);
  EXPECT_TRUE(std::isinf(kiln::interp::roundTo(Elem::BF16, 3.5e38)));
}

// add sub mul div max min on a = [1.5, -2, 3, 0.5], b = [0.5, 4, -2, 2];
// pow([2, 9, 0.25, 1.5], [3, 0.5, -1, 2]) = [8, 3, 4, 2.25]. All exact in f32.
TEST_F(InterpreterTest, BinaryFloat) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %a = kiln.constant dense<[1.5, -2.0, 3.0, 0.5]> : tensor<4xf32>
  %b = kiln.constant dense<[0.5, 4.0, -2.0, 2.0]> : tensor<4xf32>
  %base = kiln.constant dense<[2.0, 9.0, 0.25, 1.5]> : tensor<4xf32>
  %exp = kiln.constant dense<[3.0, 0.5, -1.0, 2.0]> : tensor<4xf32>
  %0 = kiln.add %a, %b : tensor<4xf32>
  %1 = kiln.sub %a, %b : tensor<4xf32>
  %2 = kiln.mul %a, %b : tensor<4xf32>
  %3 = kiln.div %a, %b : tensor<4xf32>
  %4 = kiln.max %a, %b : tensor<4xf32>
  %5 = kiln.min %a, %b : tensor<4xf32>
  %6 = kiln.pow %base, %exp : tensor<4xf32>
  return %0, %1, %2, %3, %4, %5, %6 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
)mlir");
  ASSERT_EQ(r.size(), 7u);
  expectFloats(r[0], Elem::F32, {4}, {2.0, 2.0, 1.0, 2.5}, 0, "add");
  expectFloats(r[1], Elem::F32, {4}, {1.0, -6.0, 5.0, -1.5}, 0, "sub");
  expectFloats(r[2], Elem::F32, {4}, {0.75, -8.0, -6.0, 1.0}, 0, "mul");
  expectFloats(r[3], Elem::F32, {4}, {3.0, -0.5, -1.5, 0.25}, 0, "div");
  expectFloats(r[4], Elem::F32, {4}, {1.5, 4.0, 3.0, 2.0}, 0, "max");
  expectFloats(r[5], Elem::F32, {4}, {0.5, -2.0, -2.0, 0.5}, 0, "min");
  expectFloats(r[6], Elem::F32, {4}, {8.0, 3.0, 4.0, 2.25}, 1e-06, "pow");
}

// Integer add sub mul div max min: division truncates toward zero
// (7 / -2 = -3, -7 / 2 = -3).
TEST_F(InterpreterTest, BinaryInt) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) {
  %a = kiln.constant dense<[7, -7, 7, 6]> : tensor<4xi32>
  %b = kiln.constant dense<[2, 2, -2, 3]> : tensor<4xi32>
  %0 = kiln.add %a, %b : tensor<4xi32>
  %1 = kiln.sub %a, %b : tensor<4xi32>
  %2 = kiln.mul %a, %b : tensor<4xi32>
  %3 = kiln.div %a, %b : tensor<4xi32>
  %4 = kiln.max %a, %b : tensor<4xi32>
  %5 = kiln.min %a, %b : tensor<4xi32>
  return %0, %1, %2, %3, %4, %5 : tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 6u);
  expectInts(r[0], Elem::I32, {4}, {9, -5, 5, 9}, "add");
  expectInts(r[1], Elem::I32, {4}, {5, -9, 9, 3}, "sub");
  expectInts(r[2], Elem::I32, {4}, {14, -14, -14, 18}, "mul");
  expectInts(r[3], Elem::I32, {4}, {3, -3, -3, 2}, "div");
  expectInts(r[4], Elem::I32, {4}, {7, 2, 7, 6}, "max");
  expectInts(r[5], Elem::I32, {4}, {2, -7, -2, 3}, "min");
}

// i32 arithmetic wraps modulo 2^32 (INT32_MAX + 1 = INT32_MIN,
// 65536 * 65536 = 0), i64 modulo 2^64; reduce_sum of i32 wraps too.
TEST_F(InterpreterTest, IntegerWraparound) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xi32>, tensor<3xi32>, tensor<3xi32>, tensor<2xi64>, tensor<2xi64>, tensor<i32>) {
  %a = kiln.constant dense<[2147483647, -2147483648, 65536]> : tensor<3xi32>
  %b = kiln.constant dense<[1, 1, 65536]> : tensor<3xi32>
  %c = kiln.constant dense<[9223372036854775807, 4294967296]> : tensor<2xi64>
  %d = kiln.constant dense<[1, 4294967296]> : tensor<2xi64>
  %0 = kiln.add %a, %b : tensor<3xi32>
  %1 = kiln.sub %a, %b : tensor<3xi32>
  %2 = kiln.mul %a, %b : tensor<3xi32>
  %3 = kiln.add %c, %d : tensor<2xi64>
  %4 = kiln.mul %c, %d : tensor<2xi64>
  %s = kiln.constant dense<[2147483647, 1]> : tensor<2xi32>
  %5 = kiln.reduce_sum %s axes = [0] : tensor<2xi32> -> tensor<i32>
  return %0, %1, %2, %3, %4, %5 : tensor<3xi32>, tensor<3xi32>, tensor<3xi32>, tensor<2xi64>, tensor<2xi64>, tensor<i32>
}
)mlir");
  ASSERT_EQ(r.size(), 6u);
  expectInts(r[0], Elem::I32, {3}, {-2147483648, -2147483647, 131072}, "add");
  expectInts(r[1], Elem::I32, {3}, {2147483646, 2147483647, 0}, "sub");
  expectInts(r[2], Elem::I32, {3}, {2147483647, -2147483648, 0}, "mul");
  expectInts(r[3], Elem::I64, {2}, {INT64_MIN, 8589934592}, "add");
  expectInts(r[4], Elem::I64, {2}, {INT64_MAX, 0}, "mul");
  expectInts(r[5], Elem::I32, {}, {-2147483648}, "reduce_sum");
}

// compare in every direction on f32 [1, 2, 3] vs [2, 2, 2]; i64 values that
// differ by 1 above 2^53 (equal as doubles) compare exactly.
TEST_F(InterpreterTest, Compare) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<2xi1>, tensor<2xi1>, tensor<3xi1>) {
  %a = kiln.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = kiln.constant dense<[2.0, 2.0, 2.0]> : tensor<3xf32>
  %0 = kiln.compare eq, %a, %b : tensor<3xf32>
  %1 = kiln.compare ne, %a, %b : tensor<3xf32>
  %2 = kiln.compare lt, %a, %b : tensor<3xf32>
  %3 = kiln.compare le, %a, %b : tensor<3xf32>
  %4 = kiln.compare gt, %a, %b : tensor<3xf32>
  %5 = kiln.compare ge, %a, %b : tensor<3xf32>
  %c = kiln.constant dense<[9007199254740993, -5]> : tensor<2xi64>
  %d = kiln.constant dense<[9007199254740992, -5]> : tensor<2xi64>
  %6 = kiln.compare gt, %c, %d : tensor<2xi64>
  %7 = kiln.compare eq, %c, %d : tensor<2xi64>
  %i = kiln.constant dense<[-1, 0, 1]> : tensor<3xi32>
  %z = kiln.constant dense<0> : tensor<3xi32>
  %8 = kiln.compare le, %i, %z : tensor<3xi32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8 : tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<2xi1>, tensor<2xi1>, tensor<3xi1>
}
)mlir");
  ASSERT_EQ(r.size(), 9u);
  expectInts(r[0], Elem::I1, {3}, {0, 1, 0}, "eq");
  expectInts(r[1], Elem::I1, {3}, {1, 0, 1}, "ne");
  expectInts(r[2], Elem::I1, {3}, {1, 0, 0}, "lt");
  expectInts(r[3], Elem::I1, {3}, {1, 1, 0}, "le");
  expectInts(r[4], Elem::I1, {3}, {0, 0, 1}, "gt");
  expectInts(r[5], Elem::I1, {3}, {0, 1, 1}, "ge");
  expectInts(r[6], Elem::I1, {2}, {1, 0}, "i64 gt");
  expectInts(r[7], Elem::I1, {2}, {0, 1}, "i64 eq");
  expectInts(r[8], Elem::I1, {3}, {1, 1, 0}, "i32 le");
}

// select picks on_true where the predicate is set, on floats and ints.
TEST_F(InterpreterTest, Select) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xf32>, tensor<3xi32>) {
  %p = kiln.constant dense<[true, false, true]> : tensor<3xi1>
  %a = kiln.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = kiln.constant dense<[10.0, 20.0, 30.0]> : tensor<3xf32>
  %c = kiln.constant dense<[1, 2, 3]> : tensor<3xi32>
  %d = kiln.constant dense<[10, 20, 30]> : tensor<3xi32>
  %0 = kiln.select %p, %a, %b : tensor<3xi1>, tensor<3xf32>
  %1 = kiln.select %p, %c, %d : tensor<3xi1>, tensor<3xi32>
  return %0, %1 : tensor<3xf32>, tensor<3xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 2u);
  expectFloats(r[0], Elem::F32, {3}, {1.0, 20.0, 3.0}, 0, "float");
  expectInts(r[1], Elem::I32, {3}, {1, 20, 3}, "int");
}

// cast: float -> int truncates toward zero; -> i1 tests for non-zero;
// int -> float is exact; f32 -> bf16 rounds to nearest even (1 + 2^-8 is a tie
// and goes down to 1; 1 + 3 * 2^-8 is a tie and goes up to 1 + 2^-6;
// 1 + 2^-7 is representable; pi -> 3.140625); f32 -> f16 likewise (1 + 2^-11
// ties to 1, 1 + 2^-10 stays); f64 0.1 -> f32 0.100000001490116.
TEST_F(InterpreterTest, Cast) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<5xi32>, tensor<3xi1>, tensor<2xf32>, tensor<4xbf16>, tensor<2xf16>, tensor<1xf32>, tensor<3xi1>, tensor<2xf32>, tensor<2xi64>) {
  %x = kiln.constant dense<[2.7, -2.7, 0.5, -0.5, 3.0]> : tensor<5xf32>
  %0 = kiln.cast %x : tensor<5xf32> -> tensor<5xi32>
  %y = kiln.constant dense<[0.0, 0.5, -1.0]> : tensor<3xf32>
  %1 = kiln.cast %y : tensor<3xf32> -> tensor<3xi1>
  %i = kiln.constant dense<[-3, 7]> : tensor<2xi32>
  %2 = kiln.cast %i : tensor<2xi32> -> tensor<2xf32>
  %h = kiln.constant dense<[1.00390625, 1.01171875, 1.0078125, 3.14159274]> : tensor<4xf32>
  %3 = kiln.cast %h : tensor<4xf32> -> tensor<4xbf16>
  %g = kiln.constant dense<[1.00048828125, 1.0009765625]> : tensor<2xf32>
  %4 = kiln.cast %g : tensor<2xf32> -> tensor<2xf16>
  %d = kiln.constant dense<[0.1]> : tensor<1xf64>
  %5 = kiln.cast %d : tensor<1xf64> -> tensor<1xf32>
  %j = kiln.constant dense<[0, 3, -1]> : tensor<3xi32>
  %6 = kiln.cast %j : tensor<3xi32> -> tensor<3xi1>
  %k = kiln.constant dense<[true, false]> : tensor<2xi1>
  %7 = kiln.cast %k : tensor<2xi1> -> tensor<2xf32>
  %l = kiln.constant dense<[-7.9, 1.0e10]> : tensor<2xf32>
  %8 = kiln.cast %l : tensor<2xf32> -> tensor<2xi64>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8 : tensor<5xi32>, tensor<3xi1>, tensor<2xf32>, tensor<4xbf16>, tensor<2xf16>, tensor<1xf32>, tensor<3xi1>, tensor<2xf32>, tensor<2xi64>
}
)mlir");
  ASSERT_EQ(r.size(), 9u);
  expectInts(r[0], Elem::I32, {5}, {2, -2, 0, 0, 3}, "f32 -> i32");
  expectInts(r[1], Elem::I1, {3}, {0, 1, 1}, "f32 -> i1");
  expectFloats(r[2], Elem::F32, {2}, {-3.0, 7.0}, 0, "i32 -> f32");
  expectFloats(r[3], Elem::BF16, {4}, {1.0, 1.015625, 1.0078125, 3.140625}, 0, "f32 -> bf16");
  expectFloats(r[4], Elem::F16, {2}, {1.0, 1.0009765625}, 0, "f32 -> f16");
  expectFloats(r[5], Elem::F32, {1}, {0.10000000149011612}, 0, "f64 -> f32");
  expectInts(r[6], Elem::I1, {3}, {0, 1, 1}, "i32 -> i1");
  expectFloats(r[7], Elem::F32, {2}, {1.0, 0.0}, 0, "i1 -> f32");
  expectInts(r[8], Elem::I64, {2}, {-7, 10000000000}, "f32 -> i64");
}

// Splat and dense constants of every element kind.
TEST_F(InterpreterTest, Constant) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2x2xf32>, tensor<2x2xi32>, tensor<3xi1>, tensor<1xf64>, tensor<2xi64>, tensor<2xi1>) {
  %0 = kiln.constant dense<2.5> : tensor<2x2xf32>
  %1 = kiln.constant dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>
  %2 = kiln.constant dense<[true, false, true]> : tensor<3xi1>
  %3 = kiln.constant dense<[0.1]> : tensor<1xf64>
  %4 = kiln.constant dense<[-9223372036854775808, 42]> : tensor<2xi64>
  %5 = kiln.constant dense<true> : tensor<2xi1>
  return %0, %1, %2, %3, %4, %5 : tensor<2x2xf32>, tensor<2x2xi32>, tensor<3xi1>, tensor<1xf64>, tensor<2xi64>, tensor<2xi1>
}
)mlir");
  ASSERT_EQ(r.size(), 6u);
  expectFloats(r[0], Elem::F32, {2, 2}, {2.5, 2.5, 2.5, 2.5}, 0, "splat f32");
  expectInts(r[1], Elem::I32, {2, 2}, {1, 2, 3, 4}, "dense i32");
  expectInts(r[2], Elem::I1, {3}, {1, 0, 1}, "dense i1");
  expectFloats(r[3], Elem::F64, {1}, {0.10000000000000001}, 0, "f64 is not rounded");
  expectInts(r[4], Elem::I64, {2}, {INT64_MIN, 42}, "dense i64");
  expectInts(r[5], Elem::I1, {2}, {1, 1}, "splat i1");
}

// iota holds the index along its dim.
TEST_F(InterpreterTest, Iota) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2x3xi32>, tensor<2x3xf32>, tensor<3xi64>) {
  %0 = kiln.iota dim = 0 : tensor<2x3xi32>
  %1 = kiln.iota dim = 1 : tensor<2x3xf32>
  %2 = kiln.iota dim = 0 : tensor<3xi64>
  return %0, %1, %2 : tensor<2x3xi32>, tensor<2x3xf32>, tensor<3xi64>
}
)mlir");
  ASSERT_EQ(r.size(), 3u);
  expectInts(r[0], Elem::I32, {2, 3}, {0, 0, 0, 1, 1, 1}, "dim 0");
  expectFloats(r[1], Elem::F32, {2, 3}, {0.0, 1.0, 2.0, 0.0, 1.0, 2.0}, 0, "dim 1");
  expectInts(r[2], Elem::I64, {3}, {0, 1, 2}, "i64");
}

// broadcast_in_dim: [3] -> [2,3] (dims [1]); [2,1] -> [2,3] (size-1 dim
// repeated); [] -> [2,2]; [2] -> [2,3] (dims [0]); i32.
TEST_F(InterpreterTest, BroadcastInDim) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x2xf32>, tensor<2x3xf32>, tensor<2x2xi32>) {
  %a = kiln.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %0 = kiln.broadcast_in_dim %a, dims = [1] : tensor<3xf32> -> tensor<2x3xf32>
  %b = kiln.constant dense<[[10.0], [20.0]]> : tensor<2x1xf32>
  %1 = kiln.broadcast_in_dim %b, dims = [0, 1] : tensor<2x1xf32> -> tensor<2x3xf32>
  %c = kiln.constant dense<7.0> : tensor<f32>
  %2 = kiln.broadcast_in_dim %c, dims = [] : tensor<f32> -> tensor<2x2xf32>
  %d = kiln.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %3 = kiln.broadcast_in_dim %d, dims = [0] : tensor<2xf32> -> tensor<2x3xf32>
  %i = kiln.constant dense<[5, 6]> : tensor<2xi32>
  %4 = kiln.broadcast_in_dim %i, dims = [1] : tensor<2xi32> -> tensor<2x2xi32>
  return %0, %1, %2, %3, %4 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x2xf32>, tensor<2x3xf32>, tensor<2x2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 5u);
  expectFloats(r[0], Elem::F32, {2, 3}, {1.0, 2.0, 3.0, 1.0, 2.0, 3.0}, 0, "[3] dims [1]");
  expectFloats(r[1], Elem::F32, {2, 3},
               {10.0, 10.0, 10.0, 20.0, 20.0, 20.0},
               0, "[2,1] dims [0,1]");
  expectFloats(r[2], Elem::F32, {2, 2}, {7.0, 7.0, 7.0, 7.0}, 0, "scalar");
  expectFloats(r[3], Elem::F32, {2, 3}, {1.0, 1.0, 1.0, 2.0, 2.0, 2.0}, 0, "[2] dims [0]");
  expectInts(r[4], Elem::I32, {2, 2}, {5, 6, 5, 6}, "i32");
}

// reduce_sum / reduce_mean / reduce_max of x = [[1,2,3],[4,5,6]] with and
// without keepdims; max of all-negative values; a rank-3 sum over axes [0, 2];
// f32 sums accumulate in double (1e8 + 1 - 1e8 = 1, f32 steps would give 0);
// i32 max.
TEST_F(InterpreterTest, Reduce) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2xf32>, tensor<1x3xf32>, tensor<f32>, tensor<2x1xf32>, tensor<2xf32>, tensor<1x3xf32>, tensor<f32>, tensor<2xf32>, tensor<f32>, tensor<i32>) {
  %x = kiln.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %0 = kiln.reduce_sum %x axes = [1] : tensor<2x3xf32> -> tensor<2xf32>
  %1 = kiln.reduce_sum %x axes = [0] keepdims : tensor<2x3xf32> -> tensor<1x3xf32>
  %2 = kiln.reduce_mean %x axes = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  %3 = kiln.reduce_mean %x axes = [1] keepdims : tensor<2x3xf32> -> tensor<2x1xf32>
  %4 = kiln.reduce_max %x axes = [1] : tensor<2x3xf32> -> tensor<2xf32>
  %5 = kiln.reduce_max %x axes = [0] keepdims : tensor<2x3xf32> -> tensor<1x3xf32>
  %n = kiln.constant dense<[-3.0, -1.0, -2.0]> : tensor<3xf32>
  %6 = kiln.reduce_max %n axes = [0] : tensor<3xf32> -> tensor<f32>
  %r = kiln.constant dense<[[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]> : tensor<2x2x2xf32>
  %7 = kiln.reduce_sum %r axes = [0, 2] : tensor<2x2x2xf32> -> tensor<2xf32>
  %big = kiln.constant dense<[1.0e8, 1.0, -1.0e8]> : tensor<3xf32>
  %8 = kiln.reduce_sum %big axes = [0] : tensor<3xf32> -> tensor<f32>
  %i = kiln.constant dense<[-5, -2, -9]> : tensor<3xi32>
  %9 = kiln.reduce_max %i axes = [0] : tensor<3xi32> -> tensor<i32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8, %9 : tensor<2xf32>, tensor<1x3xf32>, tensor<f32>, tensor<2x1xf32>, tensor<2xf32>, tensor<1x3xf32>, tensor<f32>, tensor<2xf32>, tensor<f32>, tensor<i32>
}
)mlir");
  ASSERT_EQ(r.size(), 10u);
  expectFloats(r[0], Elem::F32, {2}, {6.0, 15.0}, 0, "sum axes [1]");
  expectFloats(r[1], Elem::F32, {1, 3}, {5.0, 7.0, 9.0}, 0, "sum axes [0] keepdims");
  expectFloats(r[2], Elem::F32, {}, {3.5}, 0, "mean of all");
  expectFloats(r[3], Elem::F32, {2, 1}, {2.0, 5.0}, 0, "mean axes [1] keepdims");
  expectFloats(r[4], Elem::F32, {2}, {3.0, 6.0}, 0, "max axes [1]");
  expectFloats(r[5], Elem::F32, {1, 3}, {4.0, 5.0, 6.0}, 0, "max axes [0] keepdims");
  expectFloats(r[6], Elem::F32, {}, {-1.0}, 0, "max of negatives");
  expectFloats(r[7], Elem::F32, {2}, {14.0, 22.0}, 0, "rank-3 sum axes [0, 2]");
  expectFloats(r[8], Elem::F32, {}, {1.0}, 0, "double accumulation");
  expectInts(r[9], Elem::I32, {}, {-2}, "i32 max");
}

// A = [[1,2,3],[4,5,6]], B = [[7,8],[9,10],[11,12]], A B = [[58,64],[139,154]],
// with A and/or B given transposed (transpose_lhs / transpose_rhs), batched
// ([A, 2A] x [B, B]), a batched lhs with a rank-2 rhs, a rank-2 lhs with a
// batched rhs, and in i32.
TEST_F(InterpreterTest, Matmul) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2x2xf32>, tensor<2x2x2xf32>, tensor<2x2x2xf32>, tensor<2x2xi32>) {
  %a = kiln.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %at = kiln.constant dense<[[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]> : tensor<3x2xf32>
  %b = kiln.constant dense<[[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]> : tensor<3x2xf32>
  %bt = kiln.constant dense<[[7.0, 9.0, 11.0], [8.0, 10.0, 12.0]]> : tensor<2x3xf32>
  %0 = kiln.matmul %a, %b : tensor<2x3xf32>, tensor<3x2xf32> -> tensor<2x2xf32>
  %1 = kiln.matmul %at, %b transpose_lhs : tensor<3x2xf32>, tensor<3x2xf32> -> tensor<2x2xf32>
  %2 = kiln.matmul %a, %bt transpose_rhs : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x2xf32>
  %3 = kiln.matmul %at, %bt transpose_lhs transpose_rhs : tensor<3x2xf32>, tensor<2x3xf32> -> tensor<2x2xf32>
  %a2 = kiln.constant dense<[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]]> : tensor<2x2x3xf32>
  %b2 = kiln.constant dense<[[[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]], [[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]]> : tensor<2x3x2xf32>
  %4 = kiln.matmul %a2, %b2 : tensor<2x2x3xf32>, tensor<2x3x2xf32> -> tensor<2x2x2xf32>
  %5 = kiln.matmul %a2, %b : tensor<2x2x3xf32>, tensor<3x2xf32> -> tensor<2x2x2xf32>
  %b3 = kiln.constant dense<[[[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]], [[14.0, 16.0], [18.0, 20.0], [22.0, 24.0]]]> : tensor<2x3x2xf32>
  %6 = kiln.matmul %a, %b3 : tensor<2x3xf32>, tensor<2x3x2xf32> -> tensor<2x2x2xf32>
  %ai = kiln.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>
  %bi = kiln.constant dense<[[7, 8], [9, 10], [11, 12]]> : tensor<3x2xi32>
  %7 = kiln.matmul %ai, %bi : tensor<2x3xi32>, tensor<3x2xi32> -> tensor<2x2xi32>
  return %0, %1, %2, %3, %4, %5, %6, %7 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2x2xf32>, tensor<2x2x2xf32>, tensor<2x2x2xf32>, tensor<2x2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 8u);
  expectFloats(r[0], Elem::F32, {2, 2}, {58.0, 64.0, 139.0, 154.0}, 0, "A B");
  expectFloats(r[1], Elem::F32, {2, 2}, {58.0, 64.0, 139.0, 154.0}, 0, "transpose_lhs");
  expectFloats(r[2], Elem::F32, {2, 2}, {58.0, 64.0, 139.0, 154.0}, 0, "transpose_rhs");
  expectFloats(r[3], Elem::F32, {2, 2}, {58.0, 64.0, 139.0, 154.0}, 0, "both transposes");
  expectFloats(r[4], Elem::F32, {2, 2, 2},
               {58.0, 64.0, 139.0, 154.0, 116.0, 128.0, 278.0, 308.0},
               0, "batched");
  expectFloats(r[5], Elem::F32, {2, 2, 2},
               {58.0, 64.0, 139.0, 154.0, 116.0, 128.0, 278.0, 308.0},
               0, "batched lhs, rank-2 rhs");
  expectFloats(r[6], Elem::F32, {2, 2, 2},
               {58.0, 64.0, 139.0, 154.0, 116.0, 128.0, 278.0, 308.0},
               0, "rank-2 lhs, batched rhs");
  expectInts(r[7], Elem::I32, {2, 2}, {58, 64, 139, 154}, "i32");
}

// reshape keeps the row-major order; transpose: result dim i is operand
// dim perm[i] (for perm [2, 0, 1] of a [2,3,4] x, y[a][b][c] = x[b][c][a]).
TEST_F(InterpreterTest, ReshapeTranspose) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3x2xf32>, tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<6xi32>) {
  %x = kiln.constant dense<[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]> : tensor<2x3xf32>
  %0 = kiln.reshape %x : tensor<2x3xf32> -> tensor<3x2xf32>
  %1 = kiln.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
  %v = kiln.constant dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0, 22.0, 23.0]> : tensor<24xf32>
  %r = kiln.reshape %v : tensor<24xf32> -> tensor<2x3x4xf32>
  %2 = kiln.transpose %r perm = [2, 0, 1] : tensor<2x3x4xf32> -> tensor<4x2x3xf32>
  %i = kiln.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>
  %3 = kiln.reshape %i : tensor<2x3xi32> -> tensor<6xi32>
  return %0, %1, %2, %3 : tensor<3x2xf32>, tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<6xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 4u);
  expectFloats(r[0], Elem::F32, {3, 2}, {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}, 0, "reshape");
  expectFloats(r[1], Elem::F32, {3, 2}, {0.0, 3.0, 1.0, 4.0, 2.0, 5.0}, 0, "transpose [1, 0]");
  expectFloats(r[2], Elem::F32, {4, 2, 3},
               {0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 1.0, 5.0, 9.0, 13.0, 17.0, 21.0, 2.0, 6.0, 10.0, 14.0, 18.0, 22.0, 3.0, 7.0, 11.0, 15.0, 19.0, 23.0},
               0, "transpose [2, 0, 1]");
  expectInts(r[3], Elem::I32, {6}, {1, 2, 3, 4, 5, 6}, "i32 reshape");
}

// Strided slices: [0..9][1:8:3] = [1, 4, 7]; [0..9][2:9:4] = [2, 6] (the
// limit is not reached); rows 0, 2 and columns 1, 3 of a 3x4 matrix 0..11.
TEST_F(InterpreterTest, Slice) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2xi32>) {
  %x = kiln.constant dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]> : tensor<10xf32>
  %0 = kiln.slice %x start = [1] limit = [8] stride = [3] : tensor<10xf32> -> tensor<3xf32>
  %1 = kiln.slice %x start = [2] limit = [9] stride = [4] : tensor<10xf32> -> tensor<2xf32>
  %m = kiln.constant dense<[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]> : tensor<3x4xf32>
  %2 = kiln.slice %m start = [0, 1] limit = [3, 4] stride = [2, 2] : tensor<3x4xf32> -> tensor<2x2xf32>
  %i = kiln.constant dense<[5, 6, 7, 8]> : tensor<4xi32>
  %3 = kiln.slice %i start = [1] limit = [4] stride = [2] : tensor<4xi32> -> tensor<2xi32>
  return %0, %1, %2, %3 : tensor<3xf32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 4u);
  expectFloats(r[0], Elem::F32, {3}, {1.0, 4.0, 7.0}, 0, "stride 3");
  expectFloats(r[1], Elem::F32, {2}, {2.0, 6.0}, 0, "stride 4");
  expectFloats(r[2], Elem::F32, {2, 2}, {1.0, 3.0, 9.0, 11.0}, 0, "2-d stride 2");
  expectInts(r[3], Elem::I32, {2}, {6, 8}, "i32");
}

// pad [1, 2] with low 1, high 2, interior 2, value 9 -> [9, 1, 9, 9, 2, 9, 9];
// a 2x2 matrix with interior rows and a low column; i32 with value -1.
TEST_F(InterpreterTest, Pad) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<7xf32>, tensor<4x3xf32>, tensor<4xi32>) {
  %x = kiln.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %0 = kiln.pad %x low = [1] high = [2] interior = [2] value = 9.0 : tensor<2xf32> -> tensor<7xf32>
  %m = kiln.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %1 = kiln.pad %m low = [0, 1] high = [1, 0] interior = [1, 0] value = 0.0 : tensor<2x2xf32> -> tensor<4x3xf32>
  %i = kiln.constant dense<[5, 6]> : tensor<2xi32>
  %2 = kiln.pad %i low = [0] high = [1] interior = [1] value = -1.0 : tensor<2xi32> -> tensor<4xi32>
  return %0, %1, %2 : tensor<7xf32>, tensor<4x3xf32>, tensor<4xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 3u);
  expectFloats(r[0], Elem::F32, {7}, {9.0, 1.0, 9.0, 9.0, 2.0, 9.0, 9.0}, 0, "1-d");
  expectFloats(r[1], Elem::F32, {4, 3},
               {0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0},
               0, "2-d");
  expectInts(r[2], Elem::I32, {4}, {5, -1, 6, -1}, "i32");
}

// concat along dim 0 and dim 1, three inputs, i32.
TEST_F(InterpreterTest, Concat) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3x2xf32>, tensor<2x3xf32>, tensor<5xi32>) {
  %a = kiln.constant dense<[[1.0, 2.0]]> : tensor<1x2xf32>
  %b = kiln.constant dense<[[3.0, 4.0], [5.0, 6.0]]> : tensor<2x2xf32>
  %0 = kiln.concat %a, %b dim = 0 : tensor<1x2xf32>, tensor<2x2xf32> -> tensor<3x2xf32>
  %c = kiln.constant dense<[[1.0], [2.0]]> : tensor<2x1xf32>
  %1 = kiln.concat %c, %b dim = 1 : tensor<2x1xf32>, tensor<2x2xf32> -> tensor<2x3xf32>
  %i = kiln.constant dense<[1, 2]> : tensor<2xi32>
  %j = kiln.constant dense<[3]> : tensor<1xi32>
  %2 = kiln.concat %i, %j, %i dim = 0 : tensor<2xi32>, tensor<1xi32>, tensor<2xi32> -> tensor<5xi32>
  return %0, %1, %2 : tensor<3x2xf32>, tensor<2x3xf32>, tensor<5xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 3u);
  expectFloats(r[0], Elem::F32, {3, 2}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, 0, "dim 0");
  expectFloats(r[1], Elem::F32, {2, 3}, {1.0, 3.0, 4.0, 2.0, 5.0, 6.0}, 0, "dim 1");
  expectInts(r[2], Elem::I32, {5}, {1, 2, 3, 1, 2}, "three inputs");
}

// gather (numpy take): rows [2, 0, 2] of a 4x2 table; rank-2 indices;
// axis 1; out-of-range indices clamp (-1 -> 0, 7 -> 3); i64 indices.
TEST_F(InterpreterTest, Gather) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3x2xf32>, tensor<2x1x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xi32>) {
  %t = kiln.constant dense<[[0.0, 1.0], [10.0, 11.0], [20.0, 21.0], [30.0, 31.0]]> : tensor<4x2xf32>
  %i = kiln.constant dense<[2, 0, 2]> : tensor<3xi32>
  %0 = kiln.gather %t[%i] axis = 0 : tensor<4x2xf32>, tensor<3xi32> -> tensor<3x2xf32>
  %j = kiln.constant dense<[[3], [1]]> : tensor<2x1xi32>
  %1 = kiln.gather %t[%j] axis = 0 : tensor<4x2xf32>, tensor<2x1xi32> -> tensor<2x1x2xf32>
  %m = kiln.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %k = kiln.constant dense<[2, 0]> : tensor<2xi64>
  %2 = kiln.gather %m[%k] axis = 1 : tensor<2x3xf32>, tensor<2xi64> -> tensor<2x2xf32>
  %c = kiln.constant dense<[-1, 7]> : tensor<2xi32>
  %3 = kiln.gather %t[%c] axis = 0 : tensor<4x2xf32>, tensor<2xi32> -> tensor<2x2xf32>
  %ti = kiln.constant dense<[5, 6, 7]> : tensor<3xi32>
  %l = kiln.constant dense<[2, 2]> : tensor<2xi32>
  %4 = kiln.gather %ti[%l] axis = 0 : tensor<3xi32>, tensor<2xi32> -> tensor<2xi32>
  return %0, %1, %2, %3, %4 : tensor<3x2xf32>, tensor<2x1x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 5u);
  expectFloats(r[0], Elem::F32, {3, 2}, {20.0, 21.0, 0.0, 1.0, 20.0, 21.0}, 0, "axis 0");
  expectFloats(r[1], Elem::F32, {2, 1, 2}, {30.0, 31.0, 10.0, 11.0}, 0, "rank-2 indices");
  expectFloats(r[2], Elem::F32, {2, 2}, {3.0, 1.0, 6.0, 4.0}, 0, "axis 1, i64 indices");
  expectFloats(r[3], Elem::F32, {2, 2}, {0.0, 1.0, 30.0, 31.0}, 0, "clamped");
  expectInts(r[4], Elem::I32, {2}, {7, 7}, "i32 table");
}

// scatter_add sums repeated indices: updates [[1,2],[3,4],[5,6],[7,8]] at
// rows [0, 2, 0, 2] of a 3x2 zero tensor -> [[6,8],[0,0],[10,12]]; along axis 1;
// an out-of-range index clamps to the last row; i32.
TEST_F(InterpreterTest, ScatterAdd) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3x2xf32>, tensor<2x2xf32>, tensor<3x1xf32>, tensor<2xi32>) {
  %u = kiln.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]> : tensor<4x2xf32>
  %i = kiln.constant dense<[0, 2, 0, 2]> : tensor<4xi32>
  %0 = kiln.scatter_add %u[%i] axis = 0 : tensor<4x2xf32>, tensor<4xi32> -> tensor<3x2xf32>
  %v = kiln.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %j = kiln.constant dense<[1, 1, 0]> : tensor<3xi32>
  %1 = kiln.scatter_add %v[%j] axis = 1 : tensor<2x3xf32>, tensor<3xi32> -> tensor<2x2xf32>
  %w = kiln.constant dense<[[4.0], [5.0]]> : tensor<2x1xf32>
  %k = kiln.constant dense<[9, 9]> : tensor<2xi64>
  %2 = kiln.scatter_add %w[%k] axis = 0 : tensor<2x1xf32>, tensor<2xi64> -> tensor<3x1xf32>
  %ui = kiln.constant dense<[1, 2, 3]> : tensor<3xi32>
  %l = kiln.constant dense<[1, 1, 0]> : tensor<3xi32>
  %3 = kiln.scatter_add %ui[%l] axis = 0 : tensor<3xi32>, tensor<3xi32> -> tensor<2xi32>
  return %0, %1, %2, %3 : tensor<3x2xf32>, tensor<2x2xf32>, tensor<3x1xf32>, tensor<2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 4u);
  expectFloats(r[0], Elem::F32, {3, 2}, {6.0, 8.0, 0.0, 0.0, 10.0, 12.0}, 0, "repeated rows");
  expectFloats(r[1], Elem::F32, {2, 2}, {3.0, 3.0, 6.0, 9.0}, 0, "axis 1");
  expectFloats(r[2], Elem::F32, {3, 1}, {0.0, 0.0, 9.0}, 0, "clamped");
  expectInts(r[3], Elem::I32, {2}, {3, 3}, "i32");
}

// softmax / log_softmax of [1, 2, 3] = [0.0900, 0.2447, 0.6652] /
// [-2.4076, -1.4076, -0.4076]; along axis 0 of [[0, 1], [0, 3]]; large equal
// logits do not overflow (the max is subtracted).
TEST_F(InterpreterTest, Softmax) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xf32>, tensor<3xf32>, tensor<2x2xf32>, tensor<3xf32>, tensor<2xf32>) {
  %x = kiln.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %0 = kiln.softmax %x axis = 0 : tensor<3xf32>
  %1 = kiln.log_softmax %x axis = 0 : tensor<3xf32>
  %m = kiln.constant dense<[[0.0, 1.0], [0.0, 3.0]]> : tensor<2x2xf32>
  %2 = kiln.softmax %m axis = 0 : tensor<2x2xf32>
  %big = kiln.constant dense<[1000.0, 1000.0, 0.0]> : tensor<3xf32>
  %3 = kiln.softmax %big axis = 0 : tensor<3xf32>
  %b2 = kiln.constant dense<[1000.0, 1000.0]> : tensor<2xf32>
  %4 = kiln.log_softmax %b2 axis = 0 : tensor<2xf32>
  return %0, %1, %2, %3, %4 : tensor<3xf32>, tensor<3xf32>, tensor<2x2xf32>, tensor<3xf32>, tensor<2xf32>
}
)mlir");
  ASSERT_EQ(r.size(), 5u);
  expectFloats(r[0], Elem::F32, {3}, {0.09003057317, 0.2447284711, 0.6652409558}, 1e-06, "softmax");
  expectFloats(r[1], Elem::F32, {3},
               {-2.407605964, -1.407605964, -0.4076059644},
               1e-06, "log_softmax");
  expectFloats(r[2], Elem::F32, {2, 2}, {0.5, 0.119202922, 0.5, 0.880797078}, 1e-06, "axis 0");
  expectFloats(r[3], Elem::F32, {3}, {0.5, 0.5, 0.0}, 1e-06, "large logits");
  expectFloats(r[4], Elem::F32, {2}, {-0.6931471806, -0.6931471806}, 1e-06, "large log_softmax");
}

// layer_norm of [1, 2, 3, 4]: mean 2.5, biased variance 1.25; with epsilon
// 0.75, var + eps = 2, so x^ = [-1.5, -0.5, 0.5, 1.5] / sqrt(2). Scale [1, 2, 1, 2]
// and bias [0, 0, 1, 1]; a constant row normalises to 0; the default
// epsilon 1e-5.
TEST_F(InterpreterTest, LayerNorm) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<2x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<4xf32>) {
  %x = kiln.constant dense<[[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]]> : tensor<2x4xf32>
  %0 = kiln.layer_norm %x {epsilon = 7.500000e-01 : f64} : tensor<2x4xf32>
  %y = kiln.constant dense<[[1.0, 2.0, 3.0, 4.0]]> : tensor<1x4xf32>
  %g = kiln.constant dense<[1.0, 2.0, 1.0, 2.0]> : tensor<4xf32>
  %b = kiln.constant dense<[0.0, 0.0, 1.0, 1.0]> : tensor<4xf32>
  %1 = kiln.layer_norm %y scale(%g : tensor<4xf32>) bias(%b : tensor<4xf32>) {epsilon = 7.500000e-01 : f64} : tensor<1x4xf32>
  %2 = kiln.layer_norm %y bias(%b : tensor<4xf32>) {epsilon = 7.500000e-01 : f64} : tensor<1x4xf32>
  %z = kiln.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %3 = kiln.layer_norm %z : tensor<4xf32>
  return %0, %1, %2, %3 : tensor<2x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<4xf32>
}
)mlir");
  ASSERT_EQ(r.size(), 4u);
  expectFloats(r[0], Elem::F32, {2, 4},
               {-1.060660172, -0.3535533906, 0.3535533906, 1.060660172, 0.0, 0.0, 0.0, 0.0},
               1e-06, "plain");
  expectFloats(r[1], Elem::F32, {1, 4},
               {-1.060660172, -0.7071067812, 1.353553391, 3.121320344},
               1e-06, "scale and bias");
  expectFloats(r[2], Elem::F32, {1, 4},
               {-1.060660172, -0.3535533906, 1.353553391, 2.060660172},
               1e-06, "bias only");
  expectFloats(r[3], Elem::F32, {4},
               {-1.34163542, -0.4472118067, 0.4472118067, 1.34163542},
               1e-06, "default epsilon");
}

// cross_entropy of logits [[1,2,3],[1,1,1]] with targets [2, 0]:
// logsumexp - logit[target] = [0.407606, log 3 = 1.098612]; mean, sum, none;
// rank-3 logits; an out-of-range target clamps to the last class.
TEST_F(InterpreterTest, CrossEntropy) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<f32>, tensor<f32>, tensor<2xf32>, tensor<1x2xf32>, tensor<2xf32>) {
  %z = kiln.constant dense<[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %t = kiln.constant dense<[2, 0]> : tensor<2xi32>
  %0 = kiln.cross_entropy %z, %t reduction = mean : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  %1 = kiln.cross_entropy %z, %t reduction = sum : tensor<2x3xf32>, tensor<2xi32> -> tensor<f32>
  %2 = kiln.cross_entropy %z, %t reduction = none : tensor<2x3xf32>, tensor<2xi32> -> tensor<2xf32>
  %z3 = kiln.constant dense<[[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]]> : tensor<1x2x3xf32>
  %t3 = kiln.constant dense<[[2, 0]]> : tensor<1x2xi64>
  %3 = kiln.cross_entropy %z3, %t3 reduction = none : tensor<1x2x3xf32>, tensor<1x2xi64> -> tensor<1x2xf32>
  %tc = kiln.constant dense<[5, 0]> : tensor<2xi32>
  %4 = kiln.cross_entropy %z, %tc reduction = none : tensor<2x3xf32>, tensor<2xi32> -> tensor<2xf32>
  return %0, %1, %2, %3, %4 : tensor<f32>, tensor<f32>, tensor<2xf32>, tensor<1x2xf32>, tensor<2xf32>
}
)mlir");
  ASSERT_EQ(r.size(), 5u);
  expectFloats(r[0], Elem::F32, {}, {0.7531091266}, 1e-06, "mean");
  expectFloats(r[1], Elem::F32, {}, {1.506218253}, 1e-06, "sum");
  expectFloats(r[2], Elem::F32, {2}, {0.4076059644, 1.098612289}, 1e-06, "none");
  expectFloats(r[3], Elem::F32, {1, 2}, {0.4076059644, 1.098612289}, 1e-06, "rank 3");
  expectFloats(r[4], Elem::F32, {2}, {0.4076059644, 1.098612289}, 1e-06, "clamped target");
}

// optimization_barrier is the identity.
TEST_F(InterpreterTest, OptimizationBarrier) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f() -> (tensor<3xf32>, tensor<2xi32>) {
  %x = kiln.constant dense<[1.0, -2.0, 3.5]> : tensor<3xf32>
  %0 = kiln.optimization_barrier %x : tensor<3xf32>
  %i = kiln.constant dense<[4, 5]> : tensor<2xi32>
  %1 = kiln.optimization_barrier %i : tensor<2xi32>
  return %0, %1 : tensor<3xf32>, tensor<2xi32>
}
)mlir");
  ASSERT_EQ(r.size(), 2u);
  expectFloats(r[0], Elem::F32, {3}, {1.0, -2.0, 3.5}, 0, "f32");
  expectInts(r[1], Elem::I32, {2}, {4, 5}, "i32");
}
//===----------------------------------------------------------------------===//
// Dropout and random
//===----------------------------------------------------------------------===//

// dropout with rate 0 is the identity (interpreted, not folded). With rate
// 0.5 on 10000 ones, every element is 0 or 1 / (1 - 0.5) = 2, element k is
// kept exactly when random::uniform(seed, salt, k) >= 0.5, and about half
// are kept: |kept - 5000| <= 300 (the binomial standard deviation is 50, so
// this is a 6-sigma bound; seed 42 keeps 4954). The same seed and salt give
// the same mask; another salt gives another mask (seed 42: 4981 of 10000
// positions differ; required: at least 4000).
TEST_F(InterpreterTest, Dropout) {
  Tensor seed = ints(Elem::I64, {}, {42});
  std::vector<Tensor> r = run(R"mlir(
func.func @f(%seed: tensor<i64>) -> (tensor<3xf32>, tensor<10000xf32>, tensor<10000xf32>, tensor<10000xf32>) {
  %x = kiln.constant dense<[1.0, -2.0, 3.5]> : tensor<3xf32>
  %0 = kiln.dropout %x, %seed rate = 0.000000e+00 salt = 1 : tensor<3xf32>, tensor<i64>
  %ones = kiln.constant dense<1.0> : tensor<10000xf32>
  %1 = kiln.dropout %ones, %seed rate = 5.000000e-01 salt = 2 : tensor<10000xf32>, tensor<i64>
  %2 = kiln.dropout %ones, %seed rate = 5.000000e-01 salt = 2 : tensor<10000xf32>, tensor<i64>
  %3 = kiln.dropout %ones, %seed rate = 5.000000e-01 salt = 3 : tensor<10000xf32>, tensor<i64>
  return %0, %1, %2, %3 : tensor<3xf32>, tensor<10000xf32>, tensor<10000xf32>, tensor<10000xf32>
}
)mlir", {seed});
  ASSERT_EQ(r.size(), 4u);
  expectFloats(r[0], Elem::F32, {3}, {1.0, -2.0, 3.5}, 0, "rate 0");
  ASSERT_EQ(r[1].f.size(), 10000u);
  ASSERT_EQ(r[2].f.size(), 10000u);
  ASSERT_EQ(r[3].f.size(), 10000u);
  int64_t kept = 0, differ = 0;
  for (size_t k = 0; k < 10000; ++k) {
    double v = r[1].f[k];
    ASSERT_TRUE(v == 0.0 || v == 2.0) << "element " << k << " is " << v;
    bool keep = kiln::random::uniform(42, 2, k) >= 0.5;
    EXPECT_EQ(v, keep ? 2.0 : 0.0) << "element " << k;
    kept += v == 2.0;
    EXPECT_EQ(r[2].f[k], v) << "same seed and salt, element " << k;
    differ += r[3].f[k] != v;
  }
  EXPECT_NEAR(double(kept), 5000.0, 300.0);
  EXPECT_GE(differ, 4000);
}

// kiln.random: uniform in [0, 1) with mean 0.5 +- 0.02 (the standard error of
// the mean of 10000 draws is 0.0029) and variance 1/12 +- 0.005; normal with
// mean 0 +- 0.05 (standard error 0.01), standard deviation 1 +- 0.05
// (standard error 0.007) and 68.27% +- 2% of the draws within one standard
// deviation (standard error 0.5%). Seed 3 gives 0.5012, 0.0838, 0.0071,
// 1.0031, 68.16%. Every element is the runtime's random::uniform / normal
// of (seed, salt, index), rounded to the result type.
TEST_F(InterpreterTest, Random) {
  Tensor seed = ints(Elem::I64, {}, {3});
  std::vector<Tensor> r = run(R"mlir(
func.func @f(%seed: tensor<i64>) -> (tensor<10000xf32>, tensor<10000xf32>, tensor<10000xf64>) {
  %0 = kiln.random uniform, %seed salt = 7 : tensor<i64> -> tensor<10000xf32>
  %1 = kiln.random normal, %seed salt = 7 : tensor<i64> -> tensor<10000xf32>
  %2 = kiln.random normal, %seed salt = 8 : tensor<i64> -> tensor<10000xf64>
  return %0, %1, %2 : tensor<10000xf32>, tensor<10000xf32>, tensor<10000xf64>
}
)mlir", {seed});
  ASSERT_EQ(r.size(), 3u);
  const size_t n = 10000;
  ASSERT_EQ(r[0].f.size(), n);
  ASSERT_EQ(r[1].f.size(), n);
  ASSERT_EQ(r[2].f.size(), n);
  EXPECT_EQ(r[0].shape, std::vector<int64_t>{10000});
  double sum = 0, sq = 0;
  for (size_t k = 0; k < n; ++k) {
    double u = r[0].f[k];
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, kiln::interp::roundTo(Elem::F32, kiln::random::uniform(3, 7, k)));
    sum += u;
    sq += u * u;
  }
  double mean = sum / n;
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(sq / n - mean * mean, 1.0 / 12.0, 0.005);

  sum = sq = 0;
  int64_t within = 0;
  for (size_t k = 0; k < n; ++k) {
    double z = r[1].f[k];
    EXPECT_EQ(z, kiln::interp::roundTo(Elem::F32, kiln::random::normal(3, 7, k)));
    sum += z;
    sq += z * z;
    within += std::fabs(z) < 1.0;
  }
  mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 1.0, 0.05);
  EXPECT_NEAR(double(within) / n, 0.6827, 0.02);

  // f64 results are not rounded: bit-identical to the runtime's generator.
  for (size_t k = 0; k < n; ++k)
    EXPECT_EQ(r[2].f[k], kiln::random::normal(3, 8, k)) << "element " << k;
}

//===----------------------------------------------------------------------===//
// Arguments, rounding, exactF64
//===----------------------------------------------------------------------===//

// Arguments of every element kind are passed through as given.
TEST_F(InterpreterTest, Arguments) {
  std::vector<Tensor> r = run(R"mlir(
func.func @f(%x: tensor<2xf32>, %i: tensor<2xi32>, %p: tensor<2xi1>, %d: tensor<f64>, %s: tensor<i64>) -> (tensor<2xf32>, tensor<2xi32>, tensor<2xf32>, tensor<f64>, tensor<i64>) {
  %two = kiln.constant dense<2.0> : tensor<2xf32>
  %0 = kiln.mul %x, %two : tensor<2xf32>
  %one = kiln.constant dense<1> : tensor<2xi32>
  %1 = kiln.add %i, %one : tensor<2xi32>
  %nx = kiln.neg %x : tensor<2xf32>
  %2 = kiln.select %p, %x, %nx : tensor<2xi1>, tensor<2xf32>
  return %0, %1, %2, %d, %s : tensor<2xf32>, tensor<2xi32>, tensor<2xf32>, tensor<f64>, tensor<i64>
}
)mlir",
                              {floats(Elem::F32, {2}, {1.5, -4.0}),
                               ints(Elem::I32, {2}, {-1, 41}),
                               ints(Elem::I1, {2}, {0, 1}),
                               floats(Elem::F64, {}, {0.1}),
                               ints(Elem::I64, {}, {INT64_MAX})});
  ASSERT_EQ(r.size(), 5u);
  expectFloats(r[0], Elem::F32, {2}, {3.0, -8.0}, 0, "mul");
  expectInts(r[1], Elem::I32, {2}, {0, 42}, "add");
  expectFloats(r[2], Elem::F32, {2}, {-1.5, -4.0}, 0, "select");
  expectFloats(r[3], Elem::F64, {}, {0.1}, 0, "f64 passed through");
  expectInts(r[4], Elem::I64, {}, {INT64_MAX}, "i64 passed through");
}

// Results are rounded to the declared element type after every op, unless
// Options::exactF64: then nothing is rounded. 0.1 + 0.2 is
// 0.30000000000000004 in double and 0.300000011920928955078125 in f32;
// 1 + 2^-8 becomes 1 in bf16.
TEST_F(InterpreterTest, ExactF64DoesNotRound) {
  const std::string src = R"mlir(
func.func @f(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xbf16>) {
  %0 = kiln.add %a, %b : tensor<2xf32>
  %1 = kiln.div %b, %a : tensor<2xf32>
  %2 = kiln.cast %b : tensor<2xf32> -> tensor<2xbf16>
  return %0, %1, %2 : tensor<2xf32>, tensor<2xf32>, tensor<2xbf16>
}
)mlir";
  // The arguments are used as given (0.1 and 0.2 are not f32 values).
  std::vector<Tensor> args = {floats(Elem::F32, {2}, {0.1, 3.0}),
                              floats(Elem::F32, {2}, {0.2, 1.00390625})};
  std::vector<Tensor> f32 = run(src, args);
  ASSERT_EQ(f32.size(), 3u);
  expectFloats(f32[0], Elem::F32, {2}, {0.300000011920928955078125, 4.00390625}, 0,
               "add, rounded to f32");
  // 0.2 / 0.1 is exactly 2 in double; 1.00390625 / 3 = 0.334635416... rounds
  // to the f32 value 0.3346354067325592.
  expectFloats(f32[1], Elem::F32, {2}, {2.0, 0.3346354067325592}, 0, "div, rounded to f32");
  // bf16 spacing in [0.125, 0.25) is 2^-10: 0.2 -> 205 * 2^-10 = 0.2001953125.
  expectFloats(f32[2], Elem::BF16, {2}, {0.2001953125, 1.0}, 0, "cast, rounded to bf16");

  std::vector<Tensor> exact = run(src, args, /*exactF64=*/true);
  ASSERT_EQ(exact.size(), 3u);
  expectFloats(exact[0], Elem::F32, {2}, {0.1 + 0.2, 4.00390625}, 0, "add, exact");
  expectFloats(exact[1], Elem::F32, {2}, {0.2 / 0.1, 1.00390625 / 3.0}, 0, "div, exact");
  expectFloats(exact[2], Elem::BF16, {2}, {0.2, 1.00390625}, 0, "cast, exact");
}

TEST(InterpreterHelpers, RoundTo) {
  using kiln::interp::roundTo;
  // bf16 keeps 8 significant bits: near 1 the spacing is 2^-7 = 0.0078125.
  EXPECT_EQ(roundTo(Elem::BF16, 1.00390625), 1.0);      // tie, to even
  EXPECT_EQ(roundTo(Elem::BF16, 1.01171875), 1.015625); // tie, to even
  EXPECT_EQ(roundTo(Elem::BF16, 1.0078125), 1.0078125); // representable
  EXPECT_EQ(roundTo(Elem::BF16, 1.005), 1.0078125);     // nearest
  EXPECT_EQ(roundTo(Elem::BF16, -3.14159274), -3.140625);
  // f16 keeps 11: near 1 the spacing is 2^-10.
  EXPECT_EQ(roundTo(Elem::F16, 1.00048828125), 1.0);    // tie, to even
  EXPECT_EQ(roundTo(Elem::F16, 1.0009765625), 1.0009765625);
  EXPECT_EQ(roundTo(Elem::F16, 65504.0), 65504.0);      // the largest f16
  EXPECT_EQ(roundTo(Elem::F32, 0.1), static_cast<double>(0.1f));
  EXPECT_EQ(roundTo(Elem::F32, 0.1), 0.100000001490116119384765625);
  EXPECT_EQ(roundTo(Elem::F64, 0.1), 0.1);
}

TEST(InterpreterHelpers, ElementKinds) {
  using kiln::interp::isFloat;
  using kiln::interp::name;
  EXPECT_TRUE(isFloat(Elem::F64));
  EXPECT_TRUE(isFloat(Elem::F32));
  EXPECT_TRUE(isFloat(Elem::F16));
  EXPECT_TRUE(isFloat(Elem::BF16));
  EXPECT_FALSE(isFloat(Elem::I64));
  EXPECT_FALSE(isFloat(Elem::I32));
  EXPECT_FALSE(isFloat(Elem::I1));
  EXPECT_STREQ(name(Elem::F64), "f64");
  EXPECT_STREQ(name(Elem::F32), "f32");
  EXPECT_STREQ(name(Elem::F16), "f16");
  EXPECT_STREQ(name(Elem::BF16), "bf16");
  EXPECT_STREQ(name(Elem::I64), "i64");
  EXPECT_STREQ(name(Elem::I32), "i32");
  EXPECT_STREQ(name(Elem::I1), "i1");

  Tensor t = Tensor::zeros(Elem::I32, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.i.size(), 6u);
  EXPECT_TRUE(t.f.empty());
  t.i[4] = -7;
  EXPECT_EQ(t.at(4), -7.0);
  Tensor s = Tensor::zeros(Elem::F32, {});
  EXPECT_EQ(s.numel(), 1);
  ASSERT_EQ(s.f.size(), 1u);
  EXPECT_EQ(s.at(0), 0.0);
}

TEST_F(InterpreterTest, TypesOfValues) {
  mlir::Builder b(&ctx_);
  Elem e = Elem::F32;
  EXPECT_TRUE(kiln::interp::elemOf(mlir::RankedTensorType::get({2}, b.getBF16Type()), e));
  EXPECT_STREQ(kiln::interp::name(e), "bf16");
  EXPECT_TRUE(kiln::interp::elemOf(b.getI1Type(), e)); // a bare element type works too
  EXPECT_STREQ(kiln::interp::name(e), "i1");
  EXPECT_FALSE(kiln::interp::elemOf(mlir::RankedTensorType::get({2}, b.getIndexType()), e));
  Tensor t = kiln::interp::fromType(mlir::RankedTensorType::get({3, 4}, b.getI64Type()));
  EXPECT_STREQ(kiln::interp::name(t.elem), "i64");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t.i, std::vector<int64_t>(12, 0));
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST_F(InterpreterTest, RejectsWrongArguments) {
  mlir::func::FuncOp fn = parse(R"mlir(
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
)mlir");
  ASSERT_TRUE(static_cast<bool>(fn));
  std::vector<Tensor> results;
  std::string error;
  EXPECT_FALSE(kiln::interp::run(fn, {}, results, error));
  EXPECT_NE(error.find("takes 1 arguments, got 0"), std::string::npos) << error;

  error.clear();
  results.clear();
  EXPECT_FALSE(kiln::interp::run(fn, {ints(Elem::I32, {2}, {1, 2})}, results, error));
  EXPECT_NE(error.find("wrong type or shape"), std::string::npos) << error;

  error.clear();
  results.clear();
  EXPECT_FALSE(kiln::interp::run(fn, {floats(Elem::F32, {3}, {1, 2, 3})}, results, error));
  EXPECT_NE(error.find("wrong type or shape"), std::string::npos) << error;

  error.clear();
  results.clear();
  EXPECT_TRUE(kiln::interp::run(fn, {floats(Elem::F32, {2}, {1, 2})}, results, error)) << error;
  ASSERT_EQ(results.size(), 1u);
  expectFloats(results[0], Elem::F32, {2}, {1.0, 2.0}, 0, "identity");
}

// A kiln.fusion (fused IR) runs its members in order, each rounded to its
// element type as the op alone would be: its results equal the unfused
// program's bit for bit (bf16 makes the rounding of each step visible), and
// a constant cloned into the body is evaluated there.
TEST_F(InterpreterTest, FusionRunsItsMembersAsTheUnfusedOps) {
  std::vector<Tensor> args = {floats(Elem::BF16, {3}, {1.0078125, 3.0, -0.3359375}),
                              floats(Elem::BF16, {3}, {0.00390625, 0.00390625, 2.5})};
  std::vector<Tensor> fused = run(R"mlir(
func.func @f(%a: tensor<3xbf16>, %b: tensor<3xbf16>) -> (tensor<3xbf16>, tensor<3xbf16>) {
  %r:2 = kiln.fusion "elementwise" rows = 0 ins(%a, %b) : (tensor<3xbf16>, tensor<3xbf16>) -> (tensor<3xbf16>, tensor<3xbf16>) {
  ^bb0(%x: tensor<3xbf16>, %y: tensor<3xbf16>):
    %c = kiln.constant dense<1.5> : tensor<3xbf16>
    %0 = kiln.add %x, %y : tensor<3xbf16>
    %1 = kiln.mul %0, %c : tensor<3xbf16>
    %2 = kiln.mul %1, %0 : tensor<3xbf16>
    kiln.yield %0, %2 : tensor<3xbf16>, tensor<3xbf16>
  }
  return %r#0, %r#1 : tensor<3xbf16>, tensor<3xbf16>
}
)mlir", args);
  std::vector<Tensor> plain = run(R"mlir(
func.func @f(%x: tensor<3xbf16>, %y: tensor<3xbf16>) -> (tensor<3xbf16>, tensor<3xbf16>) {
  %c = kiln.constant dense<1.5> : tensor<3xbf16>
  %0 = kiln.add %x, %y : tensor<3xbf16>
  %1 = kiln.mul %0, %c : tensor<3xbf16>
  %2 = kiln.mul %1, %0 : tensor<3xbf16>
  return %0, %2 : tensor<3xbf16>, tensor<3xbf16>
}
)mlir", args);
  ASSERT_EQ(fused.size(), 2u);
  ASSERT_EQ(plain.size(), 2u);
  // In bf16 (8 significant bits): 1.0078125 + 0.00390625 = 1 + 1.5/128, a
  // tie, to even 1 + 2/128; 3 + 0.00390625 to 3; -0.3359375 + 2.5 =
  // 2 (1 + 10.5/128), a tie, to 2 (1 + 10/128).
  expectFloats(fused[0], Elem::BF16, {3}, {1.015625, 3.0, 2.15625}, 0, "sum");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(fused[i].f, plain[i].f) << "result " << i;
    EXPECT_FALSE(fused[i].absent);
  }
  EXPECT_EQ(fused[1].f[1], 13.5);
}

// An op the interpreter does not know (here func.call) is an error that
// names the op.
TEST_F(InterpreterTest, RejectsUnsupportedOps) {
  mlir::func::FuncOp fn = parse(R"mlir(
func.func private @g(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = func.call @g(%a) : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
)mlir");
  ASSERT_TRUE(static_cast<bool>(fn));
  std::vector<Tensor> results;
  std::string error;
  EXPECT_FALSE(kiln::interp::run(fn, {floats(Elem::F32, {2}, {1, 2})}, results, error));
  EXPECT_NE(error.find("unsupported op 'func.call'"), std::string::npos) << error;
}

} // namespace
