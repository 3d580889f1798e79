//===- WidenLowPrecision.cpp - kiln-widen-low-precision
//--------------------===//
//
// bf16 and f16 are storage types (docs/dialect.md, "Element types"): inside
// a kernel every low-precision value is widened to f32 once, where it is
// loaded; every op between the load and the store computes in f32; the
// result is rounded to nearest even once, where it is stored to a bf16/f16
// buffer (the linalg.yield of a generic). So is every value of a kiln op
// whose result type is bf16/f16 (kRoundAttr, passes/Passes.h), including
// an explicit kiln.cast: rounded for its uses inside the kernel too, as if
// it were stored, so fusion does not change the bits. A truncation that
// only ends an f32 accumulation inside a decomposed op (kAccumulatorAttr
// without kRoundAttr: the statistics of softmax and layer_norm) does not
// round a value that is used inside the kernel.
//
// Without the pass, LLVM would round after every op (it legalises bfloat
// arithmetic by promoting each op to float and truncating its result): a
// chain of 20 small additions to 1.0 in bf16 stays at 1.0.
//
// f32, f64 and integer generics are left exactly as they are.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/IRMapping.h"

#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;

namespace kiln {
#define GEN_PASS_DEF_KILNWIDENLOWPRECISIONPASS
#include "passes/Passes.h.inc"

namespace {

bool isLow(Type t) { return t.isBF16() || t.isF16(); }

bool touchesLow(Operation *op) {
  return llvm::any_of(op->getOperandTypes(), isLow) ||
         llvm::any_of(op->getResultTypes(), isLow);
}

/// Rewrites the body of one generic; returns whether it changed.
bool widen(linalg::GenericOp g) {
  Block &body = g.getRegion().front();
  bool any = llvm::any_of(body.getArgumentTypes(), isLow);
  for (Operation &op : body)
    any = any || touchesLow(&op);
  if (!any)
    return false;
  MLIRContext *ctx = g.getContext();
  Type f32 = Float32Type::get(ctx);
  OpBuilder b(ctx);
  // The f32 value of each low-precision value of the body.
  IRMapping wide;
  // Loads: block arguments and values from outside the body, widened once
  // at the top (exact).
  auto widenAtTop = [&](Value v) -> Value {
    OpBuilder::InsertionGuard guard(b);
    if (auto arg = dyn_cast<BlockArgument>(v); arg && arg.getOwner() == &body)
      b.setInsertionPointToStart(&body);
    else if (Operation *def = v.getDefiningOp();
             def && def->getBlock() == &body)
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToStart(&body);
    Value w = b.create<arith::ExtFOp>(v.getLoc(), f32, v);
    wide.map(v, w);
    return w;
  };
  auto wideOf = [&](Value v) -> Value {
    if (!isLow(v.getType()))
      return v;
    if (Value w = wide.lookupOrNull(v))
      return w;
    return widenAtTop(v);
  };
  SmallVector<Operation *> replaced;
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    if (!touchesLow(&op))
      continue;
    Dialect *d = op.getDialect();
    bool compute = d &&
                   (isa<arith::ArithDialect>(d) || isa<math::MathDialect>(d)) &&
                   op.getNumRegions() == 0;
    if (!compute)
      continue; // a load (tensor.extract, ...): widened where first used
    b.setInsertionPoint(&op);
    Location loc = op.getLoc();
    if (auto t = dyn_cast<arith::TruncFOp>(op); t && isLow(t.getType())) {
      Value in = t.getIn();
      if (isLow(in.getType())) // f16 -> bf16: round the f32 value once
        t->setOperand(0, wideOf(in));
      if (t->hasAttr(kAccumulatorAttr) && !t->hasAttr(kRoundAttr) && !isLow(in.getType())) {
        // The end of an f32 accumulation: no rounding inside the kernel.
        wide.map(t.getResult(),
                 in.getType().isF32()
                     ? in
                     : b.create<arith::TruncFOp>(loc, f32, in).getResult());
      } else {
        // A user's cast, or the end of a kiln op's accumulation: a
        // rounding point.
        b.setInsertionPointAfter(&op);
        wide.map(t.getResult(),
                 b.create<arith::ExtFOp>(loc, f32, t.getResult()).getResult());
      }
      continue;
    }
    if (auto e = dyn_cast<arith::ExtFOp>(op); e && isLow(e.getIn().getType())) {
      Value w = wideOf(e.getIn());
      if (e.getType().isF32())
        e.getResult().replaceAllUsesWith(w);
      else
        e.getResult().replaceAllUsesWith(
            b.create<arith::ExtFOp>(loc, e.getType(), w).getResult());
      replaced.push_back(&op);
      continue;
    }
    // Any other arith/math op: the same op on f32.
    OperationState st(loc, op.getName());
    for (Value v : op.getOperands())
      st.operands.push_back(wideOf(v));
    for (Type t : op.getResultTypes())
      st.types.push_back(isLow(t) ? f32 : t);
    for (NamedAttribute a : op.getAttrs()) {
      if (a.getName() == kRoundAttr)
        continue;
      if (auto fa = dyn_cast<FloatAttr>(a.getValue());
          fa && isLow(fa.getType()))
        st.addAttribute(a.getName(),
                        FloatAttr::get(f32, fa.getValueAsDouble()));
      else
        st.addAttribute(a.getName(), a.getValue());
    }
    Operation *w = b.create(st);
    bool round = op.hasAttr(kRoundAttr);
    for (auto [o, n] : llvm::zip(op.getResults(), w->getResults())) {
      if (!isLow(o.getType())) {
        o.replaceAllUsesWith(n);
        continue;
      }
      Value v = n;
      if (round) // a kiln op's result: rounded for its uses here too
        v = b.create<arith::ExtFOp>(loc, f32, b.create<arith::TruncFOp>(loc, o.getType(), n).getResult());
      wide.map(o, v);
    }
    replaced.push_back(&op);
  }
  // Stores: round once.
  llvm::SmallPtrSet<Operation *, 16> computed(replaced.begin(), replaced.end());
  Operation *yield = body.getTerminator();
  b.setInsertionPoint(yield);
  for (OpOperand &o : yield->getOpOperands()) {
    Value v = o.get();
    // Loads and casts are stored as they are (already representable).
    if (isLow(v.getType()) && computed.contains(v.getDefiningOp()))
      o.set(b.create<arith::TruncFOp>(v.getLoc(), v.getType(), wideOf(v)));
  }
  // Uses of the old low-precision results by non-compute ops (none in
  // Kiln's generics but loads' indices, which are integers) keep them.
  for (Operation *op : llvm::reverse(replaced))
    if (op->use_empty())
      op->erase();
  return true;
}

struct KilnWidenLowPrecisionPass
    : impl::KilnWidenLowPrecisionPassBase<KilnWidenLowPrecisionPass> {
  void runOnOperation() override {
    getOperation()->walk([&](linalg::GenericOp g) { widen(g); });
  }
};

} // namespace
} // namespace kiln
