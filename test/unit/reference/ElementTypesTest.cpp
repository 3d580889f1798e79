//===- ElementTypesTest.cpp - kiln::ElementType from and to MLIR ----------===//
#include "reference/Interpreter.h"
#include "dialects/kiln/ElementTypes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <type_traits>

namespace {

using kiln::ElementType;

TEST(ElementTypes, MlirRoundTrip) {
  mlir::MLIRContext ctx;
  mlir::Builder b(&ctx);
  for (ElementType t : kiln::kElementTypes) {
    mlir::Type m = kiln::toMlirType(t, b);
    std::string printed;
    llvm::raw_string_ostream os(printed);
    m.print(os);
    EXPECT_EQ(printed, kiln::dtypeName(t)) << "MLIR spells it the same way";
    std::optional<ElementType> back = kiln::toElementType(m);
    ASSERT_TRUE(back.has_value()) << kiln::dtypeName(t);
    EXPECT_EQ(*back, t);
  }
}

TEST(ElementTypes, OtherTypesHaveNone) {
  mlir::MLIRContext ctx;
  mlir::Builder b(&ctx);
  EXPECT_FALSE(kiln::toElementType(b.getIndexType()).has_value());
  EXPECT_FALSE(kiln::toElementType(b.getI8Type()).has_value());
  EXPECT_FALSE(kiln::toElementType(b.getF80Type()).has_value());
  EXPECT_FALSE(
      kiln::toElementType(mlir::RankedTensorType::get({2}, b.getF32Type()))
          .has_value())
      << "a tensor is not an element type";
}

TEST(ElementTypes, InterpreterUsesTheSharedEnum) {
  static_assert(std::is_same_v<kiln::interp::Elem, ElementType>);
  EXPECT_STREQ(kiln::interp::name(kiln::interp::Elem::BF16), "bf16");
}

} // namespace
