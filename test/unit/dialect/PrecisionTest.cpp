//===- PrecisionTest.cpp - The mixed-precision policy table ---------------===//
//
// Every op of the kiln dialect answers PrecisionOpInterface (in its family
// file, dialects/kiln/ops/); the kernel-level ops (kiln.fusion, kiln.yield)
// do not. Also pins the classes the other parts rely on
// (passes/Precision.h).
//
//===----------------------------------------------------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/Precision.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace {

using kiln::PrecisionClass;

/// The policies by op name.
std::map<std::string, kiln::PrecisionPolicy> policies() {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect>();
  std::map<std::string, kiln::PrecisionPolicy> out;
  for (const kiln::NamedPrecisionPolicy &p : kiln::precisionPolicies(&ctx))
    out.emplace(p.op, p.policy);
  return out;
}

TEST(PrecisionPolicyTest, OneEntryPerOp) {
  mlir::MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect>();
  std::set<std::string> ops;
  for (mlir::RegisteredOperationName name : ctx.getRegisteredOperations())
    if (name.getDialectNamespace() == "kiln")
      ops.insert(name.getStringRef().str());
  ASSERT_GT(ops.size(), 40u);
  std::map<std::string, kiln::PrecisionPolicy> table = policies();
  for (const auto &[op, p] : table) {
    EXPECT_TRUE(ops.count(op)) << op << " is not a kiln op";
    // Ops the pass keeps in (or widens to) fp32, or whose statistics it
    // keeps in fp32, name their rule.
    for (auto [c, rule] : {std::pair{p.kiln, p.kilnRule}, std::pair{p.autocast, p.autocastRule}})
      if (c == PrecisionClass::Fp32 || c == PrecisionClass::Fp32Stats || c == PrecisionClass::Low)
        EXPECT_FALSE(kiln::precisionRuleName(rule).empty())
            << op << " (" << kiln::precisionClassName(c).str() << ") needs a rule name";
  }
  for (const std::string &op : ops) {
    bool kernelLevel = op == "kiln.fusion" || op == "kiln.yield";
    EXPECT_EQ(table.count(op), kernelLevel ? 0u : 1u)
        << op << (kernelLevel ? " is kernel-level and has no policy"
                              : " has no PrecisionOpInterface answer");
  }
}

TEST(PrecisionPolicyTest, TheContract) {
  std::map<std::string, kiln::PrecisionPolicy> table = policies();
  auto cls = [&](const char *op) { return table.at(op).kiln; };
  EXPECT_EQ(cls("kiln.matmul"), PrecisionClass::Low);
  EXPECT_EQ(cls("kiln.add"), PrecisionClass::Low);
  EXPECT_EQ(cls("kiln.gelu"), PrecisionClass::Low);
  EXPECT_EQ(cls("kiln.softmax"), PrecisionClass::Fp32Stats);
  EXPECT_EQ(cls("kiln.layer_norm"), PrecisionClass::Fp32Stats);
  for (const char *op : {"kiln.log_softmax", "kiln.cross_entropy", "kiln.exp", "kiln.log",
                         "kiln.pow", "kiln.reduce_sum", "kiln.reduce_mean"})
    EXPECT_EQ(cls(op), PrecisionClass::Fp32) << op;
  for (const char *op : {"kiln.reshape", "kiln.transpose", "kiln.slice", "kiln.concat",
                         "kiln.gather", "kiln.broadcast_in_dim", "kiln.pad", "kiln.dropout"})
    EXPECT_EQ(cls(op), PrecisionClass::Follow) << op;
  EXPECT_EQ(cls("kiln.cast"), PrecisionClass::Keep);
  // autocast: matmul low, its fp32 list fp32, the rest promotes.
  auto ac = [&](const char *op) { return table.at(op).autocast; };
  EXPECT_EQ(ac("kiln.matmul"), PrecisionClass::Low);
  for (const char *op : {"kiln.softmax", "kiln.log_softmax", "kiln.layer_norm", "kiln.cross_entropy",
                         "kiln.exp", "kiln.log", "kiln.pow", "kiln.rsqrt", "kiln.reduce_sum"})
    EXPECT_EQ(ac(op), PrecisionClass::Fp32) << op;
  EXPECT_EQ(ac("kiln.add"), PrecisionClass::Promote);
  EXPECT_EQ(table.count("kiln.fusion"), 0u);
}

} // namespace
