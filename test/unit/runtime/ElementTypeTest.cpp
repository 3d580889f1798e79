//===- ElementTypeTest.cpp - The one element-type enum --------------------===//
//
// Names are what the artifact stores, so they must round-trip exactly and
// never depend on enumerator order; sizes are what buffer offsets are
// computed from.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/ElementType.h"
#include "runtime/core/Program.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

namespace {

using kiln::ElementType;

TEST(ElementType, NamesRoundTrip) {
  std::set<std::string> names;
  for (ElementType t : kiln::kElementTypes) {
    std::string name = kiln::dtypeName(t);
    EXPECT_TRUE(names.insert(name).second) << name << " is used twice";
    std::optional<ElementType> back = kiln::parseElementType(name);
    ASSERT_TRUE(back.has_value()) << name;
    EXPECT_EQ(*back, t) << name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"f32", "f64", "f16", "bf16", "i32",
                                          "i64", "i1"}));
}

TEST(ElementType, ParseRejectsOtherSpellings) {
  for (const char *s : {"", "F32", "float", "bool", "i8", "f8", "f32 ", "index"})
    EXPECT_FALSE(kiln::parseElementType(s).has_value()) << "'" << s << "'";
  ElementType t = ElementType::I64;
  EXPECT_FALSE(kiln::parseDType("fp32", t));
  EXPECT_EQ(t, ElementType::I64) << "a failed parse leaves the value alone";
  EXPECT_TRUE(kiln::parseDType("bf16", t));
  EXPECT_EQ(t, ElementType::BF16);
}

TEST(ElementType, BytesAndKinds) {
  EXPECT_EQ(kiln::dtypeBytes(ElementType::F64), 8);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::I64), 8);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::F32), 4);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::I32), 4);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::F16), 2);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::BF16), 2);
  EXPECT_EQ(kiln::dtypeBytes(ElementType::I1), 1);
  int floats = 0, ints = 0;
  for (ElementType t : kiln::kElementTypes) {
    floats += kiln::isFloat(t);
    ints += kiln::isInteger(t);
    EXPECT_FALSE(kiln::isFloat(t) && kiln::isInteger(t)) << kiln::dtypeName(t);
  }
  EXPECT_EQ(floats, 4);
  EXPECT_EQ(ints, 2) << "i1 is a boolean, not an integer";
}

TEST(ElementType, IsTheProgramsDType) {
  static_assert(std::is_same_v<kiln::program::DType, ElementType>);
  EXPECT_STREQ(kiln::program::dtypeName(kiln::program::DType::BF16), "bf16");
  EXPECT_EQ(kiln::program::dtypeBytes(kiln::program::DType::I1), 1);
}

} // namespace
