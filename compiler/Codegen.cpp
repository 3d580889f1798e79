//===- Codegen.cpp - Kernel groups, the buffer plan and CPU code ----------===//
#include "compiler/Codegen.h"

#include "dialects/kiln/ElementTypes.h"
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MathToLibm/MathToLibm.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/Arith/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/ControlFlow/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/ControlFlow/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Linalg/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/MemRef/Transforms/AllocationOpInterfaceImpl.h"
#include "mlir/Dialect/SCF/Transforms/BufferDeallocationOpInterfaceImpl.h"
#include "mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotAnalysis.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/IR/Module.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;

namespace kiln {

namespace {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

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
/// 1 per element for arithmetic, 10 for transcendental functions, a few per
/// input element for reductions and the composite ops.
int64_t estimateFlops(Operation *op) {
  if (op->getNumResults() == 0)
    return 0;
  auto elems = [](Value v) { return tensorOf(v).getNumElements(); };
  int64_t out = elems(op->getResult(0));
  if (isa<ExpOp, LogOp, TanhOp, SigmoidOp, ErfOp, GeluOp, SqrtOp, RsqrtOp, PowOp, SinOp,
          CosOp>(op))
    return 10 * out;
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op))
    return elems(op->getOperand(0));
  if (isa<SoftmaxOp, LogSoftmaxOp>(op))
    return 14 * out;
  if (isa<LayerNormOp>(op))
    return 8 * out;
  if (isa<CrossEntropyOp>(op))
    return 14 * elems(op->getOperand(0));
  if (isa<MatmulOp>(op)) {
    auto lt = tensorOf(op->getOperand(0));
    int64_t k = cast<MatmulOp>(op).getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2)
                                                     : lt.getDimSize(lt.getRank() - 1);
    return 2 * out * k;
  }
  if (isElementwiseOp(op))
    return out;
  return 0; // data movement
}

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

/// One step before buffers are assigned: operands and results are values.
struct VStep {
  Step::Kind kind;
  int kernel = -1;
  SmallVector<Value> ins, outs;
  program::GemmParams gemm;
  std::string loc;
  /// A GEMM's epilogue kernel, its inputs (the GEMM's result among them) and
  /// outputs.
  int epilogue = -1;
  SmallVector<Value> epiIns, epiOuts;
  /// The epilogue as a library epilogue (LtEpilogue), when it is one: the
  /// bias (outside value), the result and pre-activation (fusion results,
  /// or the GEMM's own value for a pre-activation without bias).
  bool lt = false;
  program::LtEpilogue::Activation ltAct = program::LtEpilogue::Activation::None;
  Value ltBias, ltOut, ltAux;
  /// Outputs written over an input (a parameter update over the old value):
  /// (output value, input value); the output has no buffer of its own.
  SmallVector<std::pair<Value, Value>> tied;
};

class Generator {
public:
  Generator(ModuleOp module, bool fusion, std::string &error)
      : module_(module), ctx_(module.getContext()), error_(error), fusion_(fusion) {
    kernels_ = ModuleOp::create(UnknownLoc::get(ctx_));
    neutral_ = ModuleOp::create(UnknownLoc::get(ctx_));
  }

  LogicalResult run() {
    for (const char *name : {"train_step", "eval_step", "predict"}) {
      auto fn = module_.lookupSymbol<func::FuncOp>(name);
      if (!fn)
        continue;
      if (failed(compileFunction(fn)))
        return failure();
    }
    for (int id : scratchIds_)
      prog_.buffers[id].offset += prog_.persistentBytes;
    prog_.arenaBytes = prog_.persistentBytes;
    for (const program::Function &f : prog_.functions)
      prog_.arenaBytes = std::max(prog_.arenaBytes, prog_.persistentBytes + f.scratchBytes);
    // Plan v2: one queue; each step waits for the steps whose memory it
    // touches (offsets are final now).
    for (program::Function &f : prog_.functions)
      program::computeDependencies(prog_, f);
    return success();
  }

  program::Program takeProgram() { return std::move(prog_); }
  std::vector<Refusal> takeRefusals() { return std::move(refusals_); }
  OwningOpRef<ModuleOp> takeKernels() { return std::move(kernels_); }
  OwningOpRef<ModuleOp> takeNeutralKernels() { return std::move(neutral_); }

private:
  LogicalResult fail(Operation *op, const std::string &why) {
    error_ = fmt::format("{}: cannot generate code for '{}': {}",
                         locString(op->getLoc()), op->getName().getStringRef().str(), why);
    return failure();
  }

  static int64_t align(int64_t v) { return (v + 63) / 64 * 64; }

  /// A buffer record for a value of type `t` (offset still unset).
  static Buffer makeBuffer(RankedTensorType t, Role role, const std::string &name) {
    Buffer b;
    b.name = name;
    b.role = role;
    toDType(t.getElementType(), b.dtype);
    b.shape.assign(t.getShape().begin(), t.getShape().end());
    b.bytes = b.numElements() * program::dtypeBytes(b.dtype);
    return b;
  }

  /// The persistent buffer named `name`, created on first use.
  int persistentBuffer(const std::string &name, Role role, RankedTensorType t) {
    int id = prog_.persistent(name);
    if (id >= 0)
      return id;
    Buffer b = makeBuffer(t, role, name);
    b.offset = prog_.persistentBytes;
    prog_.persistentBytes = align(b.offset + b.bytes);
    prog_.buffers.push_back(b);
    return int(prog_.buffers.size()) - 1;
  }

  /// Creates (or reuses) the kernel computing `members` (ops of a fusion
  /// body, in order) from the body values `ins` into the body values
  /// `outs`. `kind` and `rows` come from the fusion. `ties` asks for outputs
  /// written over inputs (output index -> input index: a parameter update
  /// over the old value); they are honoured, and left in the list, only for
  /// one-loop kernels, which read every element before writing it. A tied
  /// output has no argument of its own: the kernel writes it through the
  /// input's.
  FailureOr<int> makeKernel(ArrayRef<Operation *> members, ArrayRef<Value> ins,
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

  Value root(Value v) {
    auto it = alias_.find(v);
    return it == alias_.end() ? v : root(it->second);
  }

  /// A GEMM step for the kiln.matmul `mm` (inside `fusion`, whose operands
  /// are `outer`), with attention's head transposes read or written in place.
  /// Sets s.lt* when the epilogue members `epi` of `mm` (in `fusion`, with
  /// outputs `outs`, values inside the fusion) are what a GEMM library's
  /// epilogue computes: [broadcast of a [n] bias + add], then [relu |
  /// gelu(tanh)]; outputs the activation's result and, for GELU only, the
  /// pre-activation. The GEMM's raw value may be read elsewhere only as that
  /// pre-activation (no bias), whose buffer is then the GEMM's own.
  void matchLtEpilogue(FusionOp fusion, MatmulOp mm, ArrayRef<Operation *> epi,
                       ArrayRef<Value> outs, VStep &s) {
    using Act = program::LtEpilogue::Activation;
    auto ot = cast<RankedTensorType>(mm.getType());
    if (!ot.getElementType().isF32())
      return;
    Value g = mm.getResult(), bias, pre = g, y;
    Act act = Act::None;
    for (Operation *m : epi) {
      if (auto b = dyn_cast<BroadcastInDimOp>(m)) {
        auto a = dyn_cast<BlockArgument>(b.getOperand());
        auto bt = cast<RankedTensorType>(b.getOperand().getType());
        if (bias || !a || bt.getRank() != 1 || b.getDims().size() != 1 ||
            b.getDims()[0] != ot.getRank() - 1 || b.getType() != ot)
          return;
        bias = b.getResult();
      } else if (auto add = dyn_cast<AddOp>(m)) {
        if (pre != g || !bias || !((add.getLhs() == g && add.getRhs() == bias) ||
                                   (add.getRhs() == g && add.getLhs() == bias)))
          return;
        pre = add.getResult();
      } else if (auto r = dyn_cast<ReluOp>(m)) {
        if (y || r.getOperand() != pre)
          return;
        y = r.getResult();
        act = Act::Relu;
      } else if (auto ge = dyn_cast<GeluOp>(m)) {
        if (y || ge.getOperand() != pre || ge.getApproximation() != GeluApproximation::tanh)
          return;
        y = ge.getResult();
        act = Act::GeluTanh;
      } else {
        return; // anything else: the epilogue stays a kernel
      }
    }
    if (bias && pre == g)
      return; // a broadcast bias that nothing adds
    Value out = y ? y : pre;
    if (out == g || !llvm::is_contained(outs, out))
      return;
    bool preOut = y && pre != g && llvm::is_contained(outs, pre);
    auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
    bool gemmOut = llvm::is_contained(yield.getValues(), g);
    // The outputs: `out`, and the pre-activation only as GELU's aux.
    if (outs.size() != 1 + (preOut ? 1 : 0) || (preOut && act != Act::GeluTanh))
      return;
    // The raw GEMM value read outside: only as GELU's pre-activation.
    if (gemmOut && (pre != g || act != Act::GeluTanh))
      return;
    if ((preOut || gemmOut) && ot.getDimSize(ot.getRank() - 1) % 8 != 0)
      return; // cuBLASLt's aux rows are padded to 8 elements
    auto resultOf = [&](Value inner) {
      for (auto [i, v] : llvm::enumerate(yield.getValues()))
        if (v == inner)
          return fusion.getResult(i);
      return Value();
    };
    s.lt = true;
    s.ltAct = act;
    if (bias) {
      auto a = cast<BlockArgument>(cast<BroadcastInDimOp>(bias.getDefiningOp()).getOperand());
      s.ltBias = root(fusion.getOperand(a.getArgNumber()));
    }
    s.ltOut = resultOf(out);
    s.ltAux = preOut ? resultOf(pre) : gemmOut ? g : Value();
  }

  LogicalResult gemmStep(FusionOp fusion, MatmulOp mm, VStep &s) {
    auto outerOf = [&](Value inner) -> Value {
      if (auto a = dyn_cast<BlockArgument>(inner))
        return fusion.getOperand(a.getArgNumber());
      return inner;
    };
    Value lhs = outerOf(mm.getLhs()), rhs = outerOf(mm.getRhs());
    auto lt = cast<RankedTensorType>(mm.getLhs().getType());
    auto rt = cast<RankedTensorType>(mm.getRhs().getType());
    auto ot = cast<RankedTensorType>(mm.getType());
    s.kind = Step::Gemm;
    s.ins = {root(lhs), root(rhs)};
    s.outs = {mm.getResult()};
    program::GemmParams &g = s.gemm;
    // The fusion result that is the raw GEMM value, if any.
    Value outerResult;
    auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
    for (auto [i, v] : llvm::enumerate(yield.getValues()))
      if (v == mm.getResult())
        outerResult = fusion.getResult(i);
    Operation *outT = outerResult && outerResult.hasOneUse() ? *outerResult.getUsers().begin()
                                                             : nullptr;
    bool strided = isHeadMatmul(mm) &&
                   (foldedIn_.count(lhs.getDefiningOp()) || foldedIn_.count(rhs.getDefiningOp()) ||
                    (outT && foldedOut_.count(outT)));
    if (strided) {
      auto layoutOf = [&](Value v, program::MatrixLayout &l) -> Value {
        auto t = cast<RankedTensorType>(v.getType()); // [B, H, R, C]
        int64_t h = t.getDimSize(1), r = t.getDimSize(2), c = t.getDimSize(3);
        if (foldedIn_.count(v.getDefiningOp())) { // stored as [B, R, H, C]
          l = {r * h * c, c, h * c};
          return root(v.getDefiningOp()->getOperand(0));
        }
        l = {h * r * c, r * c, c};
        return root(v);
      };
      s.ins = {layoutOf(lhs, g.lhsLayout), layoutOf(rhs, g.rhsLayout)};
      int64_t h = ot.getDimSize(1), rr = ot.getDimSize(2), cc = ot.getDimSize(3);
      if (outT && foldedOut_.count(outT)) { // write [B, M, H, N]
        g.outLayout = {rr * h * cc, cc, h * cc};
        s.outs = {outT->getResult(0)};
      } else {
        g.outLayout = {h * rr * cc, rr * cc, cc};
      }
      g.heads = h;
    }
    int64_t r = ot.getRank();
    g.m = ot.getDimSize(r - 2);
    g.n = ot.getDimSize(r - 1);
    g.k = mm.getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2) : lt.getDimSize(lt.getRank() - 1);
    g.batch = 1;
    for (int64_t d = 0; d < r - 2; ++d)
      g.batch *= ot.getDimSize(d);
    g.transposeLhs = mm.getTransposeLhs();
    g.transposeRhs = mm.getTransposeRhs();
    if (!toDType(ot.getElementType(), g.dtype))
      return mm.emitOpError("has no library GEMM for its element type");
    g.lhsBatched = lt.getRank() > 2;
    g.rhsBatched = rt.getRank() > 2;
    if (outerResult && s.outs.front() == mm.getResult())
      alias_[outerResult] = mm.getResult();
    return success();
  }

  LogicalResult compileFunction(func::FuncOp fn) {
    alias_.clear();
    Block &block = fn.getBody().front();
    // The GEMM prologue/epilogue decisions: head transposes folded into GEMMs
    // (kiln-fuse leaves them outside every kernel).
    if (fusion_)
      findFoldedTransposes(block, foldedIn_, foldedOut_);
    else
      foldedIn_.clear(), foldedOut_.clear();
    // cross_entropy(mean|sum) is a row reduction (per position) followed by
    // one over every row: two kernel forms, so two ops.
    SmallVector<CrossEntropyOp> losses;
    fn.walk([&](CrossEntropyOp ce) {
      if (ce.getReduction() != LossReduction::none)
        losses.push_back(ce);
    });
    for (CrossEntropyOp ce : losses) {
      OpBuilder b(ce);
      auto targets = cast<RankedTensorType>(ce.getTargets().getType());
      auto perType = RankedTensorType::get(
          targets.getShape(), cast<RankedTensorType>(ce.getLogits().getType()).getElementType());
      Value per = b.create<CrossEntropyOp>(ce.getLoc(), perType, ce.getLogits(), ce.getTargets(),
                                           LossReduction::none);
      SmallVector<int64_t> all;
      for (int64_t d = 0; d < perType.getRank(); ++d)
        all.push_back(d);
      Value total;
      if (ce.getReduction() == LossReduction::mean)
        total = b.create<ReduceMeanOp>(ce.getLoc(), ce.getType(), per,
                                       b.getDenseI64ArrayAttr(all), UnitAttr());
      else
        total = b.create<ReduceSumOp>(ce.getLoc(), ce.getType(), per,
                                      b.getDenseI64ArrayAttr(all), UnitAttr());
      ce.replaceAllUsesWith(total);
      ce.erase();
    }
    FusionOptions fo;
    fo.enabled = fusion_;
    std::vector<FusionRefusal> refusals;
    if (failed(fuseFunction(fn, fo, &refusals))) {
      error_ = "kiln-fuse failed on @" + fn.getSymName().str();
      return failure();
    }
    for (FusionRefusal &r : refusals) {
      Refusal out;
      out.function = fn.getSymName().str();
      out.producer = r.producer;
      out.producerLoc = r.producerLoc;
      out.consumer = r.consumer;
      out.consumerLoc = r.consumerLoc;
      out.rule = r.rule;
      refusals_.push_back(std::move(out));
    }

    std::vector<VStep> steps;
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    // Parameter and state updates that their kernel may write over the old
    // value: the old value's last reader is that kernel.
    llvm::DenseMap<Value, BlockArgument> oldValueOf;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
      if (!name || !isa_and_nonnull<FusionOp>(v.getDefiningOp()))
        continue;
      for (BlockArgument a : block.getArguments()) {
        auto p = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr);
        auto st = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr);
        if (((p && p == name) || (st && st == name)) && a.getType() == v.getType())
          oldValueOf[v] = a;
      }
    }
    auto lastReader = [&](Value a, Operation *f) {
      SmallVector<Value> work{a};
      while (!work.empty()) {
        Value x = work.pop_back_val();
        for (Operation *u : x.getUsers()) {
          if (u == f)
            continue;
          if (isa<func::ReturnOp>(u) || f->isBeforeInBlock(u))
            return false;
          if (isa<ReshapeOp, OptimizationBarrierOp>(u))
            work.push_back(u->getResult(0));
        }
      }
      return true;
    };
    auto tiesOf = [&](FusionOp f, ArrayRef<Value> ins, ArrayRef<Value> outs) {
      SmallVector<std::pair<unsigned, unsigned>> ties;
      auto yield = f.getBlock().getTerminator();
      for (auto [o, inner] : llvm::enumerate(outs)) {
        Value outer;
        for (auto [k, y] : llvm::enumerate(yield->getOperands()))
          if (y == inner)
            outer = f.getResult(k);
        auto it = outer ? oldValueOf.find(outer) : oldValueOf.end();
        if (it == oldValueOf.end() || !lastReader(it->second, f))
          continue;
        for (auto [i, in] : llvm::enumerate(ins)) {
          auto a = dyn_cast<BlockArgument>(in);
          if (a && f.getOperand(a.getArgNumber()) == it->second)
            ties.push_back({unsigned(o), unsigned(i)});
        }
      }
      return ties;
    };
    for (Operation &op : block.without_terminator()) {
      if (isa<ConstantOp>(op) || (isa<ReshapeOp, BroadcastInDimOp>(op) && isCloneable(op.getResult(0))))
        continue; // only read inside kernels, which clone it
      if (foldedIn_.count(&op) || foldedOut_.count(&op))
        continue; // done by the GEMM that reads or writes it
      if (isa<ReshapeOp, OptimizationBarrierOp>(op)) {
        alias_[op.getResult(0)] = root(op.getOperand(0));
        continue;
      }
      auto fusion = dyn_cast<FusionOp>(op);
      if (!fusion)
        return fail(&op, "the op is in no kernel (kiln-fuse left it outside)");
      for (Type t : op.getResultTypes()) {
        DType d;
        auto rt = dyn_cast<RankedTensorType>(t);
        if (!rt || !rt.hasStaticShape() || !toDType(rt.getElementType(), d))
          return fail(&op, "results must be statically shaped tensors of a supported type");
      }
      VStep s;
      SmallVector<Operation *> members;
      for (Operation &m : fusion.getMembers())
        members.push_back(&m);
      Operation *main = members.empty() ? &op : members.back();
      s.loc = locString(main->getLoc());
      auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
      MatmulOp mm;
      for (Operation *m : members)
        if (auto x = dyn_cast<MatmulOp>(m))
          mm = x;
      if (mm && (fusion.getKind() == "gemm_epilogue" || fusion.getKind() == "gemm")) {
        s.loc = locString(mm.getLoc());
        if (failed(gemmStep(fusion, mm, s)))
          return failure();
        // The epilogue: every member after the GEMM, reading its result.
        SmallVector<Operation *> epi;
        for (Operation *m : members)
          if (m != mm.getOperation())
            epi.push_back(m);
        if (!epi.empty()) {
          llvm::SmallPtrSet<Operation *, 8> epiSet(epi.begin(), epi.end());
          SmallVector<Value> ins, outs;
          for (Operation *m : epi)
            for (Value v : m->getOperands()) {
              Operation *d = v.getDefiningOp();
              if ((d && (epiSet.count(d) || isa<ConstantOp>(d))) || llvm::is_contained(ins, v))
                continue;
              ins.push_back(v);
            }
          for (Value v : yield.getValues())
            if (v.getDefiningOp() && epiSet.count(v.getDefiningOp()) &&
                !llvm::is_contained(outs, v))
              outs.push_back(v);
          // The GEMM's own operands are never written over.
          auto ties = tiesOf(fusion, ins, outs);
          llvm::erase_if(ties, [&](auto t) {
            return ins[t.second] == mm.getLhs() || ins[t.second] == mm.getRhs();
          });
          FailureOr<int> k = makeKernel(epi, ins, outs, "elementwise",
                                        cast<RankedTensorType>(mm.getType()).getRank(), ties);
          if (failed(k))
            return failure();
          s.epilogue = *k;
          for (Value v : ins) {
            auto a = dyn_cast<BlockArgument>(v);
            s.epiIns.push_back(a ? root(fusion.getOperand(a.getArgNumber())) : v);
          }
          for (Value v : outs)
            for (auto [i, y] : llvm::enumerate(yield.getValues()))
              if (y == v) {
                s.epiOuts.push_back(fusion.getResult(i));
                break;
              }
          for (auto [o, i] : ties)
            s.tied.push_back({s.epiOuts[o], s.epiIns[i]});
          if (ties.empty() && s.gemm.heads == 0)
            matchLtEpilogue(fusion, mm, epi, outs, s);
        }
        steps.push_back(std::move(s));
        continue;
      }
      if (mm && members.size() != 1)
        return fail(mm, "a matmul that is no library GEMM (f64 or integer) must be a kernel of "
                        "its own");
      s.kind = Step::Kernel;
      SmallVector<Value> ins(fusion.getBlock().getArguments().begin(),
                             fusion.getBlock().getArguments().end());
      SmallVector<Value> outs(yield.getValues().begin(), yield.getValues().end());
      auto ties = tiesOf(fusion, ins, outs);
      FailureOr<int> k = makeKernel(members, ins, outs, fusion.getKind(), fusion.getRows(), ties);
      if (failed(k))
        return failure();
      s.kernel = *k;
      for (Value v : fusion.getOperands())
        s.ins.push_back(root(v));
      for (Value v : fusion.getResults())
        s.outs.push_back(v);
      for (auto [o, i] : ties)
        s.tied.push_back({s.outs[o], s.ins[i]});
      steps.push_back(std::move(s));
    }
    for (Value v : ret.getOperands())
      if (!v.getDefiningOp() || isa<FusionOp>(v.getDefiningOp()) || alias_.count(v) ||
          isa<BlockArgument>(v))
        continue;
      else if (!foldedOut_.count(v.getDefiningOp()))
        return fail(v.getDefiningOp(), "a returned value has no buffer");
    return assignBuffers(fn, steps, ret);
  }

  LogicalResult assignBuffers(func::FuncOp fn, std::vector<VStep> &steps,
                              func::ReturnOp ret) {
    program::Function out;
    out.name = fn.getSymName().str();
    const int n = int(steps.size());
    const int kEnd = n + 1; // "live until the function returns"

    llvm::DenseMap<Value, int> buffer; // root value -> buffer id
    llvm::DenseMap<Value, int> def, last;
    Block &block = fn.getBody().front();

    // Arguments: parameters and state are persistent; inputs are scratch.
    for (BlockArgument a : block.getArguments()) {
      auto t = cast<RankedTensorType>(a.getType());
      DType d;
      if (!toDType(t.getElementType(), d))
        return fail(fn, "an argument has an unsupported element type");
      if (auto p = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr))
        buffer[a] = persistentBuffer(p.str(), Role::Param, t);
      else if (auto st = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr))
        buffer[a] = persistentBuffer(st.str(), Role::State, t);
      def[a] = -1;
      last[a] = -1;
    }
    for (auto [i, s] : llvm::enumerate(steps)) {
      for (Value v : llvm::concat<Value>(s.ins, s.epiIns))
        last[root(v)] = std::max(last.lookup(root(v)), int(i));
      for (Value v : llvm::concat<Value>(s.outs, s.epiOuts)) {
        def[v] = int(i);
        last[v] = std::max(last.lookup(v), int(i));
      }
    }
    for (Value v : ret.getOperands())
      last[root(v)] = kEnd;

    // Outputs tied to an input live in the input's buffer.
    llvm::DenseSet<Value> tiedOut;
    for (VStep &s : steps)
      for (auto [o, i] : s.tied) {
        buffer[o] = buffer.lookup(root(i));
        tiedOut.insert(o);
      }
    // Results that are new values of a parameter or state tensor go
    // straight into its buffer when written over the old value (tied) or
    // when the old value is dead before the producing step; otherwise a copy
    // at the end.
    std::vector<std::pair<Value, int>> copies;
    llvm::DenseSet<int> claimed;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
      int target = name ? prog_.persistent(name.str()) : -1;
      if (target < 0)
        continue;
      Value r = root(v);
      if (buffer.count(r) && buffer[r] == target)
        continue; // returned unchanged, or written in place
      Value old;
      for (BlockArgument a : block.getArguments())
        if (buffer.count(a) && buffer[a] == target)
          old = a;
      bool inPlace = false;
      if (!buffer.count(r) && def.count(r) && def[r] >= 0 && !claimed.count(target)) {
        int oldLast = old ? last.lookup(old) : -1;
        inPlace = oldLast < def[r];
      }
      if (inPlace) {
        buffer[r] = target;
        claimed.insert(target);
      } else {
        copies.push_back({r, target});
      }
    }

    // Scratch buffers, first fit over live ranges.
    struct Live { int64_t offset, size; int end; };
    std::vector<Live> live;
    int64_t peak = 0;
    auto allocate = [&](Value v, Role role, const std::string &name) -> int {
      Buffer b = makeBuffer(cast<RankedTensorType>(v.getType()), role, name);
      int64_t size = align(std::max<int64_t>(b.bytes, 1));
      std::sort(live.begin(), live.end(),
                [](const Live &x, const Live &y) { return x.offset < y.offset; });
      int64_t at = 0;
      for (const Live &l : live) {
        if (l.offset - at >= size)
          break;
        at = std::max(at, l.offset + l.size);
      }
      live.push_back({at, size, last.lookup(v)});
      peak = std::max(peak, at + size);
      b.offset = at; // relative to the scratch base until run() ends
      prog_.buffers.push_back(b);
      scratchIds_.push_back(int(prog_.buffers.size()) - 1);
      return scratchIds_.back();
    };
    auto release = [&](int before) {
      live.erase(std::remove_if(live.begin(), live.end(),
                                [&](const Live &l) { return l.end < before; }),
                 live.end());
    };

    for (BlockArgument a : block.getArguments()) {
      if (buffer.count(a))
        continue;
      auto name = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kInputAttr);
      buffer[a] = allocate(a, Role::Input, name ? name.str() : "");
    }
    llvm::DenseSet<Value> returned;
    for (Value v : ret.getOperands())
      returned.insert(root(v));
    for (int i = 0; i < n; ++i) {
      release(i);
      for (Value v : llvm::concat<Value>(steps[i].outs, steps[i].epiOuts))
        if (!buffer.count(v))
          buffer[v] = allocate(v, returned.count(v) ? Role::Output : Role::Temp, "");
    }

    for (BlockArgument a : block.getArguments())
      out.args.push_back(buffer[a]);
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      out.results.push_back(buffer[root(v)]);
      Buffer &b = prog_.buffers[buffer[root(v)]];
      auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
      if (b.role == Role::Output && b.name.empty() && name)
        b.name = name.str();
    }
    for (VStep &s : steps) {
      Step st;
      st.kind = s.kind;
      st.kernel = s.kernel;
      st.gemm = s.gemm;
      st.loc = s.loc;
      for (Value v : s.ins)
        st.args.push_back(buffer[root(v)]);
      for (Value v : s.outs)
        if (!(s.kind == Step::Kernel && tiedOut.count(v)))
          st.args.push_back(buffer[v]);
      st.epilogue = s.epilogue;
      for (Value v : s.epiIns)
        st.epilogueArgs.push_back(buffer[root(v)]);
      for (Value v : s.epiOuts)
        if (!tiedOut.count(v))
          st.epilogueArgs.push_back(buffer[v]);
      if (s.lt) {
        st.lt.activation = s.ltAct;
        st.lt.bias = s.ltBias ? buffer[root(s.ltBias)] : -1;
        st.lt.out = buffer[s.ltOut];
        st.lt.aux = !s.ltAux ? -1 : s.ltAux == s.outs.front() ? st.args[2] : buffer[s.ltAux];
      }
      out.steps.push_back(std::move(st));
    }
    for (auto [v, target] : copies) {
      Step st;
      st.kind = Step::Copy;
      st.args = {buffer[v], target};
      st.loc = locString(v.getLoc());
      out.steps.push_back(std::move(st));
    }
    out.scratchBytes = peak;
    prog_.functions.push_back(std::move(out));
    return success();
  }

private:
  ModuleOp module_;
  MLIRContext *ctx_;
  std::string &error_;
  OwningOpRef<ModuleOp> kernels_;
  /// The kernels without CPU pieces (one func per program kernel, in order).
  OwningOpRef<ModuleOp> neutral_;
  program::Program prog_;
  llvm::StringMap<int> kernelByKey_;
  llvm::DenseMap<Value, Value> alias_;
  std::vector<int> scratchIds_; ///< offsets relative to the scratch base
  bool fusion_ = true;
  std::vector<Refusal> refusals_;
  /// Head transposes a GEMM reads (foldedIn) or writes (foldedOut) in place.
  llvm::DenseSet<Operation *> foldedIn_, foldedOut_;
};

struct PolynomialMathPass
    : PassWrapper<PolynomialMathPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(PolynomialMathPass)
  StringRef getArgument() const override { return "kiln-polynomial-math"; }
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateMathPolynomialApproximationPatterns(patterns);
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

/// linalg's elementwise fusion inside each kernel, with producers fused into
/// every consumer (the upstream pass fuses single-use producers only). A
/// value that several ops of a kernel read (a softmax's exponentials, read
/// by the row sum and by the division; layer_norm's normalized input) is
/// then recomputed in each loop nest instead of materialised in a
/// temporary buffer, so fused ops exchange no intermediate arrays; only
/// reduction results (one value per row) stay in memory.
struct KernelFusionPass : PassWrapper<KernelFusionPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(KernelFusionPass)
  StringRef getArgument() const override { return "kiln-kernel-elementwise-fusion"; }
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    RewritePatternSet patterns(ctx);
    linalg::ControlFusionFn always = [](OpOperand *fused) {
      return fused->get().getDefiningOp() != nullptr;
    };
    linalg::populateElementwiseOpsFusionPatterns(patterns, always);
    linalg::populateConstantFoldLinalgOperations(patterns, always);
    linalg::GenericOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    ctx->getLoadedDialect<linalg::LinalgDialect>()->getCanonicalizationPatterns(patterns);
    GreedyRewriteConfig config;
    config.useTopDownTraversal = true;
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns), config)))
      signalPassFailure();
  }
};

/// Lowers the kernel module (kiln on memrefs) to the LLVM dialect.
LogicalResult lowerKernels(ModuleOp kernels, bool printAfterAll, std::string &error) {
  MLIRContext *ctx = kernels.getContext();
  std::string diags;
  ScopedDiagnosticHandler handler(ctx, [&](Diagnostic &d) {
    llvm::raw_string_ostream os(diags);
    os << d << "\n";
    return success();
  });
  PassManager pm(ctx);
  if (printAfterAll) {
    ctx->disableMultithreading(); // IR printing needs it
    pm.enableIRPrinting(/*shouldPrintBeforePass=*/nullptr,
                        /*shouldPrintAfterPass=*/[](Pass *, Operation *) { return true; },
                        /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/true,
                        /*printAfterOnlyOnFailure=*/false, llvm::errs());
  }
  pm.addPass(createKilnLowerToLinalgPass());
  pm.addPass(createCanonicalizerPass());
  // Fuses every elementwise producer into its consumers inside a kernel
  // (splat constants and broadcasts included), so no intermediate array is
  // materialised between fused ops.
  pm.addPass(std::make_unique<KernelFusionPass>());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(bufferization::createEmptyTensorEliminationPass());
  bufferization::OneShotBufferizationOptions opts;
  opts.allowReturnAllocsFromLoops = true;
  // Copies as linalg.copy (later loops), never memref.copy's call into
  // MLIR's C runner library, which the runtime does not link.
  opts.memCpyFn = [](OpBuilder &b, Location loc, Value from, Value to) {
    b.create<linalg::CopyOp>(loc, from, to);
    return success();
  };
  pm.addPass(bufferization::createOneShotBufferizePass(opts));
  bufferization::BufferDeallocationPipelineOptions dealloc;
  bufferization::buildBufferDeallocationPipeline(pm, dealloc);
  pm.addPass(createCanonicalizerPass());
  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(createConvertSCFToCFPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(std::make_unique<PolynomialMathPass>());
  // LLVM intrinsics first (fma, sqrt, ... vectorize); libm only for what
  // has no intrinsic (float64 erf, ...).
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  ConvertFuncToLLVMPassOptions funcOpts;
  funcOpts.useBarePtrCallConv = true;
  pm.addPass(createConvertFuncToLLVMPass(funcOpts));
  pm.addPass(createReconcileUnrealizedCastsPass());
  if (failed(pm.run(kernels))) {
    error = "lowering the kernels to LLVM failed:\n" + diags;
    return failure();
  }
  return success();
}

/// Adds `void <symbol>(ptr %buffers, i64 %piece)` around each
/// `<symbol>_body` (which takes the piece index only when it is split).
void addPackedEntryPoints(llvm::Module &m, const program::Program &p) {
  llvm::LLVMContext &c = m.getContext();
  llvm::Type *ptr = llvm::PointerType::get(c, 0);
  for (const program::Kernel &k : p.kernels) {
    llvm::Function *body = m.getFunction(k.symbol + "_body");
    body->setLinkage(llvm::GlobalValue::InternalLinkage);
    auto *fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c),
                                        {ptr, llvm::Type::getInt64Ty(c)}, false);
    auto *f = llvm::Function::Create(fty, llvm::GlobalValue::ExternalLinkage,
                                     k.symbol, m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(c, "entry", f));
    std::vector<llvm::Value *> args;
    for (int i = 0; i < k.numArgs; ++i) {
      llvm::Value *slot = b.CreateConstInBoundsGEP1_64(ptr, f->getArg(0), i);
      args.push_back(b.CreateLoad(ptr, slot));
    }
    if (k.chunks > 1)
      args.push_back(f->getArg(1));
    b.CreateCall(body, args);
    b.CreateRetVoid();
  }
}

} // namespace

FailureOr<CompiledProgram> compileProgram(ModuleOp module,
                                          const CodegenOptions &options,
                                          std::string &error) {
  MLIRContext *ctx = module.getContext();
  DialectRegistry registry;
  arith::registerBufferizableOpInterfaceExternalModels(registry);
  arith::registerBufferDeallocationOpInterfaceExternalModels(registry);
  cf::registerBufferizableOpInterfaceExternalModels(registry);
  cf::registerBufferDeallocationOpInterfaceExternalModels(registry);
  linalg::registerBufferizableOpInterfaceExternalModels(registry);
  memref::registerAllocationOpInterfaceExternalModels(registry);
  scf::registerBufferizableOpInterfaceExternalModels(registry);
  scf::registerBufferDeallocationOpInterfaceExternalModels(registry);
  tensor::registerBufferizableOpInterfaceExternalModels(registry);
  ctx->appendDialectRegistry(registry);
  ctx->loadDialect<bufferization::BufferizationDialect, memref::MemRefDialect,
                   arith::ArithDialect>();
  Generator gen(module, options.fusion, error);
  if (failed(gen.run()))
    return failure();
  CompiledProgram out;
  out.program = gen.takeProgram();
  out.kernels = gen.takeKernels();
  out.neutralKernels = gen.takeNeutralKernels();
  out.refusals = gen.takeRefusals();
  if (!options.emitLLVM)
    return out;

  OwningOpRef<ModuleOp> lowered = cast<ModuleOp>(out.kernels->getOperation()->clone());
  if (failed(lowerKernels(*lowered, options.printKernelIRAfterAll, error)))
    return failure();
  registerBuiltinDialectTranslation(*ctx);
  registerLLVMDialectTranslation(*ctx);
  llvm::LLVMContext llvmCtx;
  std::unique_ptr<llvm::Module> m = translateModuleToLLVMIR(*lowered, llvmCtx, "kiln_kernels");
  if (!m) {
    error = "translating the kernels to LLVM IR failed";
    return failure();
  }
  addPackedEntryPoints(*m, out.program);
  // Kernels that evaluate transcendental functions (polynomial exp, erf,
  // tanh, log: many FMAs per element) are compute-bound: they may use
  // 512-bit vectors where the CPU has them (LLVM prefers 256 bits on recent
  // Intel cores). Measured on Sapphire Rapids, one thread: GELU 364 -> 278
  // us, softmax -10%. Memory-bound kernels stay at the default (row
  // reductions over 128 features got slower with 512 bits). A preference
  // only: CPUs without AVX-512 ignore it.
  llvm::StringSet<> wide;
  for (const program::Kernel &k : out.program.kernels)
    for (const std::string &op : k.ops)
      if (op == "kiln.exp" || op == "kiln.erf" || op == "kiln.gelu" || op == "kiln.tanh" ||
          op == "kiln.log" || op == "kiln.sigmoid" || op == "kiln.softmax" ||
          op == "kiln.log_softmax" || op == "kiln.cross_entropy" || op == "kiln.sin" ||
          op == "kiln.cos" || op == "kiln.pow") {
        wide.insert(k.symbol);
        break;
      }
  for (llvm::Function &f : *m) {
    llvm::StringRef name = f.getName();
    name.consume_back("_body");
    if (!f.isDeclaration() && wide.contains(name))
      f.addFnAttr("prefer-vector-width", "512");
  }
  if (options.keepLLVMText) {
    llvm::raw_string_ostream os(out.llvmIR);
    m->print(os, nullptr);
  }
  llvm::raw_string_ostream bc(out.bitcode);
  llvm::WriteBitcodeToFile(*m, bc);
  return out;
}

void printPlan(const program::Program &p, llvm::raw_ostream &os) {
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  os << fmt::format("arena: {} bytes ({}): persistent {} bytes (parameters and "
                    "optimizer state), scratch peak {} bytes\n",
                    p.arenaBytes, mib(p.arenaBytes), p.persistentBytes,
                    p.arenaBytes - p.persistentBytes);
  int64_t split = 0;
  for (const program::Kernel &k : p.kernels)
    split += k.chunks > 1;
  os << fmt::format("kernels: {} distinct, {} of them split into row pieces for threads\n",
                    p.kernels.size(), split);
  auto shapeStr = [](const Buffer &b) {
    std::string s = program::dtypeName(b.dtype);
    s += "[";
    for (size_t i = 0; i < b.shape.size(); ++i)
      s += (i ? "x" : "") + std::to_string(b.shape[i]);
    return s + "]";
  };
  for (const program::Function &f : p.functions) {
    int64_t temps = 0, kernels = 0, gemms = 0, copies = 0;
    for (const Step &s : f.steps)
      (s.kind == Step::Kernel ? kernels : s.kind == Step::Gemm ? gemms : copies)++;
    std::set<int> ids;
    for (const Step &s : f.steps)
      for (int id : llvm::concat<const int>(s.args, s.epilogueArgs))
        if (p.buffers[id].role == Role::Temp && ids.insert(id).second)
          temps += p.buffers[id].bytes;
    os << fmt::format("\n@{}: {} steps ({} kernels, {} gemms, {} copies); scratch "
                      "peak {} bytes ({}); {} bytes of temporaries without reuse\n",
                      f.name, f.steps.size(), kernels, gemms, copies,
                      f.scratchBytes, mib(f.scratchBytes), temps);
    for (size_t i = 0; i < f.steps.size(); ++i) {
      const Step &s = f.steps[i];
      std::string what = s.kind == Step::Kernel
                             ? p.kernels[s.kernel].symbol +
                                   (p.kernels[s.kernel].chunks > 1
                                        ? fmt::format(" x{}", p.kernels[s.kernel].chunks)
                                        : "")
                         : s.kind == Step::Gemm ? "gemm"
                         : s.kind == Step::Collective
                             ? program::collectiveOpName(s.collective.op)
                             : "copy";
      std::string args;
      for (int id : s.args) {
        const Buffer &b = p.buffers[id];
        args += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":",
                            shapeStr(b), b.offset);
      }
      os << fmt::format("  {:4} {:<34}{}", i, what, args);
      if (std::string sched = program::scheduleNote(f, i); !sched.empty())
        os << "  " << sched;
      if (!s.loc.empty())
        os << "  ; " << s.loc;
      os << "\n";
      if (s.kind == Step::Gemm && s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        std::string eargs;
        for (int id : s.epilogueArgs) {
          const Buffer &b = p.buffers[id];
          eargs += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":", shapeStr(b),
                               b.offset);
        }
        os << fmt::format("       + epilogue {:<23}{}\n",
                          k.symbol + (k.chunks > 1 ? fmt::format(" x{}", k.chunks) : ""), eargs);
        if (s.lt.valid()) {
          auto at = [&](int id) { return fmt::format("@{}", p.buffers[id].offset); };
          std::string pre = "A B" + (s.lt.bias >= 0 ? " + bias " + at(s.lt.bias) : "");
          if (s.lt.activation != program::LtEpilogue::Activation::None)
            pre = fmt::format("{}({})", program::activationName(s.lt.activation), pre);
          os << fmt::format("         as a library epilogue (cuBLASLt): out = {} {}{}\n", pre,
                            at(s.lt.out),
                            s.lt.aux >= 0 ? ", pre-activation " + at(s.lt.aux) : "");
        }
      }
    }
  }
}

void printFusionReport(const program::Program &p, const std::vector<Refusal> &refusals,
                       llvm::raw_ostream &os) {
  const program::Function *f = p.function("train_step");
  if (!f)
    f = p.functions.empty() ? nullptr : &p.functions.front();
  if (!f)
    return;
  int64_t kernels = 0, gemms = 0, epilogues = 0, copies = 0, flops = 0, bytes = 0, fused = 0;
  std::map<std::string, int64_t> byKind;
  std::string lines;
  auto where = [&](const program::Kernel &k) {
    std::vector<std::string> fileLines; // "file:line", without directories
    for (const std::string &loc : k.locs) {
      llvm::StringRef l(loc);
      size_t c = l.rfind(':');
      l = c == llvm::StringRef::npos ? l : l.take_front(c);
      size_t slash = l.rfind('/');
      std::string fl = (slash == llvm::StringRef::npos ? l : l.drop_front(slash + 1)).str();
      if (!llvm::is_contained(fileLines, fl))
        fileLines.push_back(fl);
    }
    std::string w;
    for (size_t j = 0; j < fileLines.size() && j < 4; ++j)
      w += (j ? ", " : "") + fileLines[j];
    if (fileLines.size() > 4)
      w += ", ...";
    return w;
  };
  auto opsOf = [](const program::Kernel &k) {
    std::string ops;
    for (size_t j = 0; j < k.ops.size(); ++j)
      ops += (j ? " " : "") + llvm::StringRef(k.ops[j]).drop_front(5).str();
    return ops;
  };
  auto moved = [&](const std::vector<int> &ids) {
    int64_t m = 0;
    for (int id : ids)
      m += p.buffers[id].bytes;
    return m;
  };
  for (size_t i = 0; i < f->steps.size(); ++i) {
    const Step &s = f->steps[i];
    int64_t m = moved(s.args);
    if (s.kind == Step::Gemm) {
      ++gemms;
      int64_t fl = 2 * s.gemm.batch * s.gemm.m * s.gemm.n * s.gemm.k;
      std::string shape = fmt::format("[{}x{}x{}]x{}{}{}", s.gemm.m, s.gemm.n, s.gemm.k,
                                      s.gemm.batch, s.gemm.transposeLhs ? " tA" : "",
                                      s.gemm.transposeRhs ? " tB" : "");
      if (s.epilogue >= 0) {
        const program::Kernel &k = p.kernels[s.epilogue];
        ++epilogues;
        fl += k.flops;
        m += moved(s.epilogueArgs);
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm+epilogue", shape + " + " + k.symbol, fl, m, s.loc);
        lines += fmt::format("       epilogue: {}\n", opsOf(k));
      } else {
        lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                             "gemm", shape, fl, m, s.loc);
      }
      flops += fl;
      bytes += m;
      continue;
    }
    bytes += m;
    if (s.kind == Step::Copy) {
      ++copies;
      lines += fmt::format("  {:4} copy                 {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           p.buffers[s.args[1]].name, 0, m,
                           "fused update is not in place");
      continue;
    }
    ++kernels;
    const program::Kernel &k = p.kernels[s.kernel];
    flops += k.flops;
    byKind[k.kind]++;
    fused += k.ops.size() > 1;
    lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i, k.kind,
                         k.symbol, k.flops, m, where(k));
    if (k.ops.size() > 1)
      lines += fmt::format("       ops: {}\n", opsOf(k));
  }
  std::string fl = flops >= 100000000 ? fmt::format("{:.2f} GFLOP", double(flops) / 1e9)
                                      : fmt::format("{:.3f} MFLOP", double(flops) / 1e6);
  std::string by = bytes >= 100000000 ? fmt::format("{:.1f} MB", double(bytes) / 1e6)
                                      : fmt::format("{:.1f} kB", double(bytes) / 1e3);
  os << fmt::format("fusion report for @{}: {} kernels ({} fused from several ops), {} "
                    "GEMMs ({} with a fused epilogue), {} copies; {} and {} of buffer "
                    "traffic per call (estimates)\n",
                    f->name, kernels, fused, gemms, epilogues, copies, fl, by);
  os << "kernels by kind:";
  for (auto &[kind, n] : byKind)
    os << fmt::format(" {} {}", kind, n);
  os << "\n\n" << lines;
  std::map<std::string, int64_t> byRule;
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      byRule[r.rule.substr(0, r.rule.find(':'))]++;
  os << fmt::format("\nfusions refused in @{}: {}\n", f->name,
                    std::accumulate(byRule.begin(), byRule.end(), int64_t(0),
                                    [](int64_t a, auto &kv) { return a + kv.second; }));
  for (auto &[rule, n] : byRule)
    os << fmt::format("  {:<20} {}\n", rule, n);
  os << "\n";
  for (const Refusal &r : refusals)
    if (r.function == f->name)
      os << fmt::format("  refused {} ({}) -> {} ({}): {}\n", r.producer, r.producerLoc,
                        r.consumer, r.consumerLoc, r.rule);
}

} // namespace kiln
