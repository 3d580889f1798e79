//===- Kernels.cpp - Kernel formation: kernel funcs from kiln.fusion groups ===//
//
// Every kernel step's func.func on memrefs (the kernel module) and its twin
// without CPU row pieces (the CUDA emitter's input); identical kernels are
// emitted once. Row pieces split a kernel along dimension 0 for the CPU's
// threads. See compiler/Generator.h.
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/ElementTypes.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <fmt/format.h>

#include <algorithm>

using namespace mlir;

namespace kiln::codegen {

using program::DType;


bool toDType(Type t, DType &out) {
  std::optional<DType> e = toElementType(t);
  if (e)
    out = *e;
  return e.has_value();
}

RankedTensorType tensorOf(Value v) { return cast<RankedTensorType>(v.getType()); }

/// The splat value of a constant (possibly reshaped or broadcast), or null.
Attribute splatValue(Value v) {
  Operation *def = v.getDefiningOp();
  if (auto c = dyn_cast_or_null<ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    return dense && dense.isSplat() ? dense.getSplatValue<Attribute>() : Attribute();
  }
  if (isa_and_nonnull<ReshapeOp, BroadcastInDimOp>(def))
    return splatValue(def->getOperand(0));
  return {};
}

/// Estimated floating-point operations of one op (for the fusion report):
/// what the op's CostOpInterface says (KilnOps.td); 0 for data movement.
int64_t estimateFlops(Operation *op) {
  if (op->getNumResults() == 0)
    return 0;
  if (auto cost = dyn_cast<CostOpInterface>(op))
    return cost.estimateFlops();
  return 0; // data movement
}

namespace {

/// How a kernel splits into independent pieces along dimension 0 on the CPU
/// (intra-op parallelism). Piece-shaped values hold `rows` of the `n` rows;
/// the others ("whole" values such as a causal mask) are computed in full by
/// every piece.
struct Pieces {
  int64_t chunks = 1, n = 0, rows = 0;
  llvm::DenseSet<Value> sliced; ///< body values that hold one piece
};

/// Ops that can produce just the rows of one piece without reading rows.
bool generatesPieces(Operation *op) {
  if (auto iota = dyn_cast<IotaOp>(op))
    return iota.getDim() != 0;
  return isa<BroadcastInDimOp>(op) || bool(splatValue(op->getResult(0)));
}

/// Plans the pieces of a kernel whose body is `body` (a kiln.fusion body):
/// every output must be piece-shaped with the same dim 0 size, every op
/// row-local over dim 0, every input read the same way by all its users.
Pieces planPieces(Block &body) {
  Pieces none, p;
  auto yield = body.getTerminator();
  if (yield->getNumOperands() == 0)
    return none;
  for (Value v : yield->getOperands()) {
    RankedTensorType t = tensorOf(v);
    if (t.getRank() == 0)
      return none;
    if (p.n == 0)
      p.n = t.getDimSize(0);
    if (t.getDimSize(0) != p.n)
      return none;
  }
  if (p.n < 2)
    return none;
  llvm::DenseMap<Value, bool> inputMode; // block arg -> read by rows
  int64_t work = 0;
  for (Operation &op : body.without_terminator()) {
    if (isa<ConstantOp>(op))
      continue; // placed per use below
    if (isa<DropoutOp, RandomOp>(op))
      return none; // values depend on the global element index
    // An iota along dim 0 is never piece-shaped (generatesPieces): it is a
    // whole value, which every piece computes in full (a causal mask).
    SmallVector<bool> byRows;
    int64_t maxRows = rowLocality(&op, byRows);
    Value r = op.getResult(0);
    RankedTensorType rt = tensorOf(r);
    bool anyPiece = false, anyWholeByRows = false;
    for (auto [i, v] : llvm::enumerate(op.getOperands())) {
      bool rowsRead = byRows[i] && maxRows >= 1;
      if (isa<BlockArgument>(v)) {
        auto [it, fresh] = inputMode.try_emplace(v, rowsRead);
        if (!fresh && it->second != rowsRead)
          return none; // read by rows in one place, whole in another
        if (rowsRead && tensorOf(v).getDimSize(0) != p.n)
          return none;
        anyPiece |= rowsRead;
        continue;
      }
      if (splatValue(v))
        continue; // a splat constant fits any piece
      if (rowsRead) {
        if (p.sliced.count(v))
          anyPiece = true;
        else
          anyWholeByRows = true;
      } else if (p.sliced.count(v)) {
        return none; // a piece read whole
      }
    }
    bool piece = anyPiece || (maxRows >= 1 && rt.getRank() >= 1 && rt.getDimSize(0) == p.n &&
                              generatesPieces(&op));
    if (piece) {
      if (maxRows < 1 || rt.getRank() == 0 || rt.getDimSize(0) != p.n || anyWholeByRows)
        return none;
      for (Value res : op.getResults())
        p.sliced.insert(res);
      work = std::max(work, rt.getNumElements());
      for (Value v : op.getOperands())
        if (isa<BlockArgument>(v))
          work = std::max(work, tensorOf(v).getNumElements());
    } else if (rt.getNumElements() > 4096) {
      return none; // a large whole value would be recomputed by every piece
    }
  }
  for (auto [arg, rowsRead] : inputMode)
    if (rowsRead)
      p.sliced.insert(arg);
  for (Value v : yield->getOperands())
    if (!p.sliced.count(v))
      return none;
  // The largest divisor of n up to 64 that leaves at least 4096 elements of
  // work per piece.
  for (int64_t c = std::min<int64_t>(p.n, 64); c > 1; --c)
    if (p.n % c == 0 && work / c >= 4096) {
      p.chunks = c;
      p.rows = p.n / c;
      return p;
    }
  return none;
}

} // namespace

/// Creates (or reuses) the kernel computing `members` (ops of a fusion
/// body, in order) from the body values `ins` into the body values
/// `outs`. `kind` and `rows` come from the fusion. `ties` asks for outputs
/// written over inputs (output index -> input index: a parameter update
/// over the old value); they are honoured, and left in the list, only for
/// one-loop kernels, which read every element before writing it. A tied
/// output has no argument of its own: the kernel writes it through the
/// input's.
FailureOr<int> Generator::makeKernel(ArrayRef<Operation *> members, ArrayRef<Value> ins,
                                     ArrayRef<Value> outs, StringRef kind, int64_t rows,
                                     SmallVectorImpl<std::pair<unsigned, unsigned>> &ties) {
  OpBuilder b(ctx_);
  Location loc = UnknownLoc::get(ctx_);
  // A standalone fusion op with exactly these members: the unit the
  // lowering (and the CUDA emitter) consumes.
  auto scratch = ModuleOp::create(loc);
  b.setInsertionPointToEnd(scratch.getBody());
  SmallVector<Type> inTypes, outTypes;
  for (Value v : ins)
    inTypes.push_back(v.getType());
  for (Value v : outs)
    outTypes.push_back(v.getType());
  auto proto = b.create<func::FuncOp>(loc, "proto", b.getFunctionType(inTypes, outTypes));
  Block *pb = proto.addEntryBlock();
  b.setInsertionPointToStart(pb);
  SmallVector<Value> protoIns(pb->getArguments().begin(), pb->getArguments().end());
  auto fusion = b.create<FusionOp>(loc, outTypes, protoIns, b.getStringAttr(kind),
                                   b.getI64IntegerAttr(rows));
  Block *fb = new Block();
  fusion.getBody().push_back(fb);
  IRMapping map;
  for (Value v : ins)
    map.map(v, fb->addArgument(v.getType(), loc));
  OpBuilder fbb = OpBuilder::atBlockEnd(fb);
  for (Operation *m : members)
    fbb.clone(*m, map);
  SmallVector<Value> yielded;
  for (Value v : outs)
    yielded.push_back(map.lookup(v));
  fbb.create<YieldOp>(loc, yielded);
  b.create<func::ReturnOp>(loc, fusion.getResults());

  // Row pieces for the CPU's threads.
  Pieces pieces = planPieces(*fb);
  bool split = pieces.chunks > 1;
  bool denseConstants = llvm::any_of(fb->getOperations(), [](Operation &o) {
    auto c = dyn_cast<ConstantOp>(o);
    auto d = c ? dyn_cast<DenseElementsAttr>(c.getValue()) : DenseElementsAttr();
    return c && (!d || !d.isSplat());
  });
  if (!isSingleLoopFusion(fusion) || denseConstants)
    ties.clear();
  auto tiedInput = [&](unsigned out) -> int {
    for (auto [o, i] : ties)
      if (o == out)
        return int(i);
    return -1;
  };
  auto piece = [&](Type t) { // the type of one piece of a sliced value
    auto rt = cast<RankedTensorType>(t);
    SmallVector<int64_t> shape(rt.getShape());
    shape[0] = pieces.rows;
    return RankedTensorType::get(shape, rt.getElementType());
  };

  b.setInsertionPointToEnd(kernels_->getBody());
  SmallVector<Type> argTypes;
  auto memrefOf = [](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return MemRefType::get(t.getShape(), t.getElementType());
  };
  for (Value v : ins)
    argTypes.push_back(memrefOf(v));
  SmallVector<int> outArg; // kernel argument of each output
  for (auto [i, v] : llvm::enumerate(outs)) {
    int tied = tiedInput(unsigned(i));
    outArg.push_back(tied >= 0 ? tied : int(argTypes.size()));
    if (tied < 0)
      argTypes.push_back(memrefOf(v));
  }
  int numBufferArgs = int(argTypes.size());
  if (split)
    argTypes.push_back(b.getIndexType()); // which piece
  auto fn = b.create<func::FuncOp>(loc, "kernel", b.getFunctionType(argTypes, {}));
  // Distinct arguments never overlap (the plan gives a step's outputs
  // memory of their own; an output written over an input is tied to it).
  for (int i = 0; i < numBufferArgs; ++i)
    fn.setArgAttr(i, "llvm.noalias", b.getUnitAttr());
  Block *body = fn.addEntryBlock();
  b.setInsertionPointToStart(body);
  Value offset;
  if (split)
    offset = b.create<arith::MulIOp>(loc, body->getArguments().back(),
                                     b.create<arith::ConstantIndexOp>(loc, pieces.rows));
  // A memref argument, or the rows [offset, offset + rows) of it.
  auto view = [&](Value memref, bool slice) -> Value {
    if (!slice)
      return memref;
    auto mt = cast<MemRefType>(memref.getType());
    SmallVector<OpFoldResult> offsets(mt.getRank(), b.getIndexAttr(0));
    SmallVector<OpFoldResult> sizes, strides(mt.getRank(), b.getIndexAttr(1));
    offsets[0] = offset;
    for (int64_t d = 0; d < mt.getRank(); ++d)
      sizes.push_back(b.getIndexAttr(d == 0 ? pieces.rows : mt.getDimSize(d)));
    return b.create<memref::SubViewOp>(loc, memref, offsets, sizes, strides);
  };
  SmallVector<Value> kernelIns;
  SmallVector<Type> kernelOutTypes;
  for (auto [i, arg] : llvm::enumerate(fb->getArguments())) {
    bool slice = split && pieces.sliced.count(arg);
    kernelIns.push_back(b.create<bufferization::ToTensorOp>(
        loc, slice ? piece(arg.getType()) : cast<RankedTensorType>(arg.getType()),
        view(body->getArgument(i), slice), /*restrict=*/true, /*writable=*/false));
  }
  for (Value v : yielded)
    kernelOutTypes.push_back(split ? piece(v.getType()) : v.getType());
  // Output views come first: empty-tensor elimination can then build each
  // result in its destination (the view must dominate the computation),
  // instead of in a temporary copied there at the end.
  SmallVector<Value> outViews;
  for (size_t i = 0; i < yielded.size(); ++i)
    outViews.push_back(view(body->getArgument(outArg[i]), split));
  auto kf = b.create<FusionOp>(loc, kernelOutTypes, kernelIns, b.getStringAttr(kind),
                               b.getI64IntegerAttr(rows));
  Block *kb = new Block();
  kf.getBody().push_back(kb);
  IRMapping km;
  for (auto [arg, in] : llvm::zip(fb->getArguments(), kernelIns))
    km.map(arg, kb->addArgument(in.getType(), loc));
  OpBuilder kbb = OpBuilder::atBlockEnd(kb);
  for (Operation &op : fb->without_terminator()) {
    if (split && isa<ConstantOp>(op)) {
      // Splats are rebuilt at the shape of each use (piece or whole).
      continue;
    }
    IRMapping local = km;
    if (split) {
      for (Value operand : op.getOperands()) {
        if (!isa_and_nonnull<ConstantOp>(operand.getDefiningOp()))
          continue;
        SmallVector<bool> byRows;
        int64_t maxRows = rowLocality(&op, byRows);
        unsigned idx = 0;
        for (auto [j, o] : llvm::enumerate(op.getOperands()))
          if (o == operand)
            idx = unsigned(j);
        bool pieceUse = pieces.sliced.count(op.getResult(0)) && byRows[idx] && maxRows >= 1;
        if (pieceUse)
          local.map(operand, kbb.create<ConstantOp>(
                                 loc, DenseElementsAttr::get(piece(operand.getType()),
                                                             splatValue(operand))));
        else
          local.map(operand, kbb.clone(*operand.getDefiningOp())->getResult(0));
      }
    }
    Operation *clone = kbb.clone(op, local);
    clone->setLoc(loc);
    if (split && pieces.sliced.count(op.getResult(0))) {
      for (Value r : clone->getResults())
        r.setType(piece(r.getType()));
      if (auto s = dyn_cast<SliceOp>(clone)) { // dim 0 is whole: limit = rows
        SmallVector<int64_t> limit(s.getLimit());
        limit[0] = pieces.rows;
        s.setLimit(limit);
      }
    }
    for (auto [r, c] : llvm::zip(op.getResults(), clone->getResults()))
      km.map(r, c);
  }
  SmallVector<Value> kyield;
  for (Value v : fb->getTerminator()->getOperands())
    kyield.push_back(km.lookup(v));
  kbb.create<YieldOp>(loc, kyield);
  for (auto [i, r] : llvm::enumerate(kf.getResults())) {
    auto m = b.create<bufferization::MaterializeInDestinationOp>(loc, TypeRange{}, r,
                                                                 outViews[i]);
    m.setRestrict(true);
    m.setWritable(true);
  }
  b.create<func::ReturnOp>(loc);

  // The same kernel without CPU pieces, for other targets (the CUDA
  // emitter): buffer arguments only, the fusion on whole tensors.
  OpBuilder nb(ctx_);
  nb.setInsertionPointToEnd(scratch.getBody());
  SmallVector<Type> neutralArgs(argTypes.begin(), argTypes.begin() + numBufferArgs);
  auto neutral = nb.create<func::FuncOp>(loc, "neutral", nb.getFunctionType(neutralArgs, {}));
  Block *nbody = neutral.addEntryBlock();
  nb.setInsertionPointToStart(nbody);
  IRMapping nmap;
  for (auto [i, v] : llvm::enumerate(protoIns))
    nmap.map(v, nb.create<bufferization::ToTensorOp>(
                    loc, cast<RankedTensorType>(v.getType()), nbody->getArgument(i),
                    /*restrict=*/true, /*writable=*/false));
  Operation *nf = nb.clone(*fusion, nmap);
  for (auto [i, r] : llvm::enumerate(nf->getResults())) {
    auto m = nb.create<bufferization::MaterializeInDestinationOp>(
        loc, TypeRange{}, r, nbody->getArgument(outArg[i]));
    m.setRestrict(true);
    m.setWritable(true);
  }
  nb.create<func::ReturnOp>(loc);
  for (unsigned i = 0; i < neutralArgs.size(); ++i)
    neutral.setArgAttr(i, "llvm.noalias", nb.getUnitAttr());

  // Strip locations so identical kernels print identically, then dedupe.
  fn->walk([&](Operation *o) { o->setLoc(loc); });
  std::string key;
  {
    llvm::raw_string_ostream os(key);
    OpPrintingFlags flags;
    flags.printGenericOpForm();
    fn->print(os, flags);
  }
  Operation *main = members.back();
  for (Operation *m : llvm::reverse(members))
    if (!isa<ConstantOp>(m)) {
      main = m;
      break;
    }
  auto it = kernelByKey_.find(key);
  int index;
  if (it != kernelByKey_.end()) {
    fn->erase();
    index = it->second;
  } else {
    index = int(prog_.kernels.size());
    std::string where = locString(main->getLoc());
    std::string opName = main->getName().stripDialect().str();
    std::string line;
    if (size_t c = where.rfind(':'); c != std::string::npos && c > 0) {
      size_t l = where.rfind(':', c - 1);
      if (l != std::string::npos)
        line = "_L" + where.substr(l + 1, c - l - 1);
    }
    int64_t counted = llvm::count_if(members, [](Operation *m) { return !isa<ConstantOp>(m); });
    std::string name = counted <= 1
                           ? fmt::format("k{}_{}{}", index, opName, line)
                           : fmt::format("k{}_fused{}_{}{}", index, counted, opName, line);
    fn.setSymName(name + "_body");
    program::Kernel k;
    k.symbol = name;
    k.op = main->getName().getStringRef().str();
    k.numArgs = numBufferArgs;
    k.chunks = int(pieces.chunks);
    // Outputs written over inputs (one loop nest reads each element
    // before writing it).
    k.inPlaceSafe = !ties.empty();
    k.numInputs = int(ins.size());
    for (int a = int(ins.size()); a < numBufferArgs; ++a)
      k.writes.push_back(a);
    for (auto [o, i] : ties)
      k.writes.push_back(int(i));
    llvm::sort(k.writes);
    for (Operation *m : members) {
      if (isa<ConstantOp>(m))
        continue;
      k.ops.push_back(m->getName().getStringRef().str());
      k.flops += estimateFlops(m);
      for (Value r : m->getResults()) { // the narrowest float type computed
        DType t;
        auto rt = dyn_cast<RankedTensorType>(r.getType());
        if (!rt || !toDType(rt.getElementType(), t))
          continue;
        auto rank = [](DType d) {
          return d == DType::BF16 ? 0 : d == DType::F16 ? 1 : d == DType::F32 ? 2 : 3;
        };
        if ((t == DType::BF16 || t == DType::F16 || t == DType::F32) &&
            rank(t) < rank(k.lowestFloat))
          k.lowestFloat = t;
      }
    }
    k.kind = kind.str();
    prog_.kernels.push_back(k);
    kernelByKey_[key] = index;
    auto copy = cast<func::FuncOp>(neutral->clone());
    copy.setSymName(name);
    copy->walk([&](Operation *o) { o->setLoc(loc); });
    neutral_->push_back(copy);
  }
  auto &locs = prog_.kernels[index].locs;
  for (Operation *m : members) {
    std::string l = locString(m->getLoc());
    if (!l.empty() && !llvm::is_contained(locs, l))
      locs.push_back(l);
  }
  scratch->erase();
  return index;
}

} // namespace kiln::codegen
