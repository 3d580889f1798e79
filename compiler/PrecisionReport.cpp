//===- PrecisionReport.cpp - Where a mixed-precision program rounds -------===//
#include "compiler/PrecisionReport.h"
#include "compiler/Codegen.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"
#include "passes/Precision.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/JSON.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;

namespace kiln {
namespace {

/// "file:line:col" without the directories (as the fusion report).
std::string shortLoc(Location loc) {
  std::string l = locString(loc);
  size_t slash = l.rfind('/');
  return slash == std::string::npos ? l : l.substr(slash + 1);
}

std::string typeStr(Type t, bool shape) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt)
    return "?";
  std::string s;
  llvm::raw_string_ostream os(s);
  os << rt.getElementType();
  if (shape) {
    os << "[";
    llvm::interleave(rt.getShape(), os, "x");
    os << "]";
  }
  return s;
}

std::string opName(Operation *op) {
  StringRef n = op->getName().getStringRef();
  n.consume_front("kiln.");
  return n.str();
}

std::string producerOf(func::FuncOp fn, Value v) {
  if (auto a = dyn_cast<BlockArgument>(v)) {
    unsigned i = a.getArgNumber();
    if (auto p = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
      return "param " + p.str();
    if (auto in = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr))
      return "input " + in.str();
    return "argument " + std::to_string(i);
  }
  return opName(v.getDefiningOp());
}

std::string consumersOf(Value v) {
  std::vector<std::string> names;
  for (Operation *u : v.getUsers()) {
    std::string n = isa<func::ReturnOp>(u) ? "return" : opName(u);
    if (!llvm::is_contained(names, n))
      names.push_back(n);
  }
  std::string out;
  for (const std::string &n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(unused)" : out;
}

bool isLow(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  return rt && (rt.getElementType().isBF16() || rt.getElementType().isF16());
}

/// What a rounding did to a constant, when it is more than a small error.
std::string roundedNote(const PrecisionReport::Rounded &c) {
  if (std::isinf(c.to))
    return ": overflows to infinity";
  if (c.to == 0 && c.from != 0)
    return ": underflows to 0";
  if ((c.to == 1 || c.to == -1) && c.from != c.to)
    return fmt::format(": becomes exactly {:g} (keep the op in fp32: precision = fp32 "
                       "on the call, or fp32_layers)",
                       c.to);
  return "";
}

} // namespace

PrecisionReport collectPrecisionReport(ModuleOp module) {
  PrecisionReport r;
  if (auto p = module->getAttrOfType<StringAttr>(kPrecisionAttr))
    r.precision = p.str();
  if (auto m = module->getAttrOfType<StringAttr>(kPrecisionModeAttr))
    r.mode = m.str();
  auto fn = module.lookupSymbol<func::FuncOp>("forward");
  if (!fn)
    return r;
  fn.walk([&](Operation *op) {
    if (auto k = dyn_cast<ConstantOp>(op)) {
      auto info = op->getAttrOfType<DictionaryAttr>(kPrecisionRoundedFromAttr);
      auto from = info ? info.getAs<FloatAttr>("value") : FloatAttr();
      auto where = info ? info.getAs<StringAttr>("loc") : StringAttr();
      auto splat = dyn_cast<SplatElementsAttr>(k.getValue());
      if (from && splat && isa<FloatType>(splat.getElementType())) {
        PrecisionReport::Rounded e;
        std::string l = where ? where.str() : locString(op->getLoc());
        size_t slash = l.rfind('/');
        e.loc = slash == std::string::npos ? l : l.substr(slash + 1);
        e.from = from.getValueAsDouble();
        e.to = splat.getSplatValue<APFloat>().convertToDouble();
        e.type = typeStr(k.getType(), /*shape=*/false);
        e.consumers = consumersOf(k.getResult());
        r.rounded.push_back(std::move(e));
      }
      return;
    }
    if (op == fn.getOperation() || isa<func::ReturnOp>(op))
      return;
    auto rule = op->getAttrOfType<StringAttr>(kPrecisionRuleAttr);
    if (auto c = dyn_cast<CastOp>(op)) {
      PrecisionReport::Cast e;
      e.loc = shortLoc(op->getLoc());
      e.from = typeStr(c->getOperand(0).getType(), /*shape=*/true);
      e.to = typeStr(c->getResult(0).getType(), /*shape=*/false);
      e.producer = producerOf(fn, c->getOperand(0));
      e.consumers = consumersOf(c->getResult(0));
      if (rule) {
        e.rule = rule.str();
        r.castsByRule[e.rule]++;
        r.casts.push_back(std::move(e));
      } else {
        r.userCasts.push_back(std::move(e));
      }
      return;
    }
    bool anyFloat = false, low = false;
    for (Type t : op->getResultTypes())
      if (auto rt = dyn_cast<RankedTensorType>(t);
          rt && isa<FloatType>(rt.getElementType())) {
        anyFloat = true;
        low |= isLow(t);
      }
    if (!anyFloat)
      return;
    (low ? r.lowOps : r.fp32Ops)++;
    if (rule) {
      PrecisionReport::Kept k;
      k.loc = shortLoc(op->getLoc());
      k.op = opName(op);
      k.type = typeStr(op->getResult(0).getType(), /*shape=*/true);
      k.rule = rule.str();
      k.statistics = low;
      r.kept.push_back(std::move(k));
    }
  });
  return r;
}

bool makeFp32Variant(ModuleOp module, std::string &why) {
  auto fn = module.lookupSymbol<func::FuncOp>("forward");
  bool mixed = false;
  if (fn)
    fn.walk([&](Operation *op) { mixed |= op->hasAttr(kPrecisionRuleAttr); });
  if (mixed) {
    why = "the input module is mixed already (its @forward carries the pass's "
          "casts): "
          "compile the model without precision for the fp32 number";
    return false;
  }
  module->removeAttr(kPrecisionAttr);
  module->removeAttr(kPrecisionModeAttr);
  if (auto t = module->getAttrOfType<DictionaryAttr>(KilnDialect::kTrainAttr)) {
    NamedAttrList l(t.getValue());
    l.erase("precision");
    l.erase("precision_mode");
    module->setAttr(KilnDialect::kTrainAttr,
                    l.getDictionary(module.getContext()));
  }
  return true;
}

int64_t trainStepActivationBytes(ModuleOp module, bool fusion,
                                 std::map<std::string, int64_t> *byType,
                                 std::string &error) {
  CodegenOptions co;
  co.emitLLVM = false;
  co.fusion = fusion;
  auto compiled = compileProgram(module, co, error);
  if (failed(compiled))
    return -1;
  auto it = compiled->activations.find("train_step");
  if (it == compiled->activations.end()) {
    error = "the plan did not find the first micro-batch's loss in @train_step";
    return -1;
  }
  const ActivationMemory &a = it->second;
  if (byType)
    *byType = a.bytesByType;
  return a.bytes;
}

void printPrecisionReport(const PrecisionReport &r, llvm::raw_ostream &os) {
  if (r.precision == "fp32") {
    os << "precision fp32: no rounding points\n";
    if (!r.userCasts.empty()) {
      os << fmt::format("user casts: {} (user cast, respected)\n",
                        r.userCasts.size());
      for (const auto &c : r.userCasts)
        os << fmt::format("  {:<32} {:>14} -> {:<5} {} -> {}\n", c.loc, c.from,
                          c.to, c.producer, c.consumers);
    }
    return;
  }
  os << fmt::format(
      "precision report: {} (mode {}) of @forward after kiln-mixed-precision\n",
      r.precision, r.mode.empty() ? "kiln" : r.mode);
  os << fmt::format("\nrounding points: {} casts inserted\n", r.casts.size());
  for (const auto &c : r.casts)
    os << fmt::format("  {:<32} {:>14} -> {:<5} {} -> {}  [{}]\n", c.loc,
                      c.from, c.to, c.producer, c.consumers, c.rule);
  // (Only when there are some: most models' constants survive rounding.)
  if (!r.rounded.empty())
    os << fmt::format("\nconstants rounded: {} whose value the low type changes\n",
                      r.rounded.size());
  for (const auto &c : r.rounded)
    os << fmt::format("  {:<32} {:.9g} -> {:.9g} in {} (read by {}){}\n", c.loc,
                      c.from, c.to, c.type, c.consumers, roundedNote(c));
  os << fmt::format("\nkept in fp32 (the result, or the statistics inside the "
                    "kernel): {} ops\n",
                    r.kept.size());
  for (const auto &k : r.kept)
    os << fmt::format(
        "  {:<32} {:<14} {:<16} [{}]{}\n", k.loc, k.op, k.type, k.rule,
        k.statistics ? " (low type in and out, fp32 statistics in the kernel)"
                     : "");
  os << fmt::format("\nuser casts: {}\n", r.userCasts.size());
  for (const auto &c : r.userCasts)
    os << fmt::format(
        "  {:<32} {:>14} -> {:<5} {} -> {}  user cast, respected\n", c.loc,
        c.from, c.to, c.producer, c.consumers);
  std::string rules;
  for (auto &[rule, n] : r.castsByRule)
    rules += fmt::format("{}{} {}", rules.empty() ? "" : ", ", rule, n);
  os << fmt::format(
      "\ntotals: {} casts inserted ({}); {} ops in {}, {} ops in fp32 (compute "
      "ops of @forward by result type; casts and constants not counted)\n",
      r.casts.size(), rules.empty() ? "none" : rules, r.lowOps, r.precision,
      r.fp32Ops);
  auto mib = [](int64_t b) {
    return fmt::format("{:.2f} MiB", double(b) / (1 << 20));
  };
  if (r.activationBytes < 0) {
    os << "activation memory: not computed\n";
    return;
  }
  std::string types;
  for (auto &[t, b] : r.activationBytesByType)
    types += fmt::format("{}{} {}", types.empty() ? "" : ", ", t, b);
  os << fmt::format(
      "activation memory of @train_step (saved for backward, as --emit=plan "
      "counts it): {} {} bytes ({}; {})",
      r.precision, r.activationBytes, mib(r.activationBytes), types);
  if (r.fp32ActivationBytes >= 0)
    os << fmt::format("; fp32 {} bytes ({}): {} bytes saved, ratio {:.3f}\n",
                      r.fp32ActivationBytes, mib(r.fp32ActivationBytes),
                      r.fp32ActivationBytes - r.activationBytes,
                      double(r.activationBytes) /
                          double(std::max<int64_t>(1, r.fp32ActivationBytes)));
  else
    os << fmt::format("; fp32: {}\n", r.fp32Note);
}

void printPrecisionReportJson(const PrecisionReport &r, llvm::raw_ostream &os) {
  llvm::json::OStream j(os, 2);
  auto casts = [&](const std::vector<PrecisionReport::Cast> &cs) {
    j.array([&] {
      for (const auto &c : cs)
        j.object([&] {
          j.attribute("loc", c.loc);
          j.attribute("from", c.from);
          j.attribute("to", c.to);
          j.attribute("producer", c.producer);
          j.attribute("consumers", c.consumers);
          if (!c.rule.empty())
            j.attribute("rule", c.rule);
        });
    });
  };
  j.object([&] {
    j.attribute("precision", r.precision);
    j.attribute("mode", r.mode);
    j.attributeBegin("casts");
    casts(r.casts);
    j.attributeEnd();
    j.attributeArray("kept", [&] {
      for (const auto &k : r.kept)
        j.object([&] {
          j.attribute("loc", k.loc);
          j.attribute("op", k.op);
          j.attribute("type", k.type);
          j.attribute("rule", k.rule);
          j.attribute("statistics_only", k.statistics);
        });
    });
    j.attributeArray("rounded_constants", [&] {
      for (const auto &c : r.rounded)
        j.object([&] {
          j.attribute("loc", c.loc);
          j.attribute("from", c.from);
          if (std::isfinite(c.to))
            j.attribute("to", c.to);
          else // JSON has no infinity
            j.attribute("to", c.to > 0 ? "inf" : "-inf");
          j.attribute("type", c.type);
          j.attribute("consumers", c.consumers);
        });
    });
    j.attributeBegin("user_casts");
    casts(r.userCasts);
    j.attributeEnd();
    j.attributeObject("totals", [&] {
      j.attribute("casts", int64_t(r.casts.size()));
      j.attribute("low_ops", r.lowOps);
      j.attribute("fp32_ops", r.fp32Ops);
      j.attributeObject("casts_by_rule", [&] {
        for (auto &[rule, n] : r.castsByRule)
          j.attribute(rule, n);
      });
    });
    j.attributeObject("activation_bytes", [&] {
      j.attribute("mixed", r.activationBytes);
      j.attribute("fp32", r.fp32ActivationBytes);
      if (r.activationBytes >= 0 && r.fp32ActivationBytes >= 0)
        j.attribute("saved", r.fp32ActivationBytes - r.activationBytes);
      if (!r.fp32Note.empty())
        j.attribute("fp32_note", r.fp32Note);
    });
  });
  os << "\n";
}

} // namespace kiln
