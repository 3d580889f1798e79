//===- Values.cpp - A kernel's values, computed elementally -----------------===//
//
// emitOp() writes the statements that compute one op's result at one index:
// constants, iota, the index maps (broadcast, reshape, transpose, slice, pad,
// concat, gather), random and dropout, and scalarOp() for the elementwise
// ops.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/Elementwise.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"
#include "runtime/core/Random.h"

#include <fmt/format.h>

#include <cmath>

using namespace mlir;

namespace kiln::cudagen {

std::string KernelEmitter::scalarOp(Operation *op, ArrayRef<std::string> a, const TypeInfo &ti,
                                    const TypeInfo &oti) {
  // Arithmetic: dialects/kiln/Elementwise.cpp's table.
  if (const elementwise_table::Entry *e = elementwise_table::lookup(op))
    return e->cuda(elementwise_table::CudaOperands{a, oti.isFloat, oti.compute == "double"});
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

std::string KernelEmitter::rounded(Operation *op, const TypeInfo &ti, const std::string &e) {
  return ti.round.empty() || !op->hasAttr(kRoundAttr) ? e : ti.round + "(" + e + ")";
}

std::string KernelEmitter::emitOp(Operation *op, ArrayRef<std::string> idx) {
  Value r = op->getResult(0);
  RankedTensorType rt = tensorOf(r);
  TypeInfo ti;
  if (!typeInfo(rt.getElementType(), ti)) {
    (void)fail(op, "unsupported element type");
    return "";
  }
  // bf16/f16 are storage types (docs/dialect.md, "Element types"): values
  // stay in float registers, rounded where stored (store(): kiln_from_float)
  // and at every kiln op whose result is of the low type (kRoundAttr: the
  // same bits fused or not), not inside an op's own arithmetic or a
  // decomposed op's statistics.
  auto define = [&](const std::string &expr) {
    std::string name = fresh("v");
    std::string e = isa<CastOp>(op) && !ti.round.empty() ? ti.round + "(" + expr + ")"
                                                         : rounded(op, ti, expr);
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
    uint64_t saltMix = random::mix(uint64_t(d.getSalt()));
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
    uint64_t salt = random::mix(uint64_t(rnd.getSalt()));
    std::string keyed = fresh("k");
    line(fmt::format("const unsigned long long {} = kiln_mix((unsigned long long){} ^ 0x{:x}ull);",
                     keyed, seed, salt));
    std::string lin = linear(idx, rt.getShape());
    if (rnd.getDistribution() == RandomDistribution::normal) {
      std::string k2 = fresh("k");
      line(fmt::format("const unsigned long long {} = 2ull * (unsigned long long)({});", k2, lin));
      return define(fmt::format(
          "({0})(sqrt(-2.0 * log(kiln_unit(kiln_mix({1} + {2}), 1))) * "
          "cos({3} * kiln_unit(kiln_mix({1} + {2} + 1ull), 0)))",
          ti.compute, keyed, k2, random::kTwoPi));
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

} // namespace kiln::cudagen
