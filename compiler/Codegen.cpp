//===- Codegen.cpp - Kernel groups, the buffer plan and CPU code ----------===//
#include "compiler/Codegen.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
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
#include "llvm/IR/Module.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;

namespace kiln {

std::string locString(Location loc) {
  std::string out;
  loc->walk([&](Location l) {
    if (auto f = dyn_cast<FileLineColLoc>(l)) {
      out = fmt::format("{}:{}:{}", f.getFilename().str(), f.getLine(), f.getColumn());
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return out;
}

namespace {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

bool toDType(Type t, DType &out) {
  if (t.isF32()) out = DType::F32;
  else if (t.isF64()) out = DType::F64;
  else if (t.isF16()) out = DType::F16;
  else if (t.isBF16()) out = DType::BF16;
  else if (t.isInteger(32)) out = DType::I32;
  else if (t.isInteger(64)) out = DType::I64;
  else if (t.isInteger(1)) out = DType::I1;
  else return false;
  return true;
}

/// Values that kernels recompute instead of reading from memory: constants
/// and reshapes/broadcasts of them (cheap, and they would otherwise need
/// buffers of their own).
bool isCloneable(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (isa<ConstantOp>(def))
    return true;
  if (isa<ReshapeOp, BroadcastInDimOp>(def))
    return isCloneable(def->getOperand(0));
  return false;
}

/// Ops whose every output element depends only on the same element of each
/// full-shape operand: an output may then overwrite such an operand.
bool isElementwise(Operation *op) {
  return op->hasTrait<OpTrait::Elementwise>() ||
         isa<AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp, CompareOp,
             SelectOp, CastOp>(op);
}

/// The splat value of a cloneable value (a splat constant, possibly
/// reshaped or broadcast), or null.
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

/// Whether a kernel for `op` can be split into independent pieces along
/// dimension 0 of its results (every result has the same dim 0 size n),
/// each piece reading rows of some operands (`sliced[i]`) and all of the
/// others. Ops whose values depend on the linear element index (iota,
/// random, dropout) or that mix rows (reductions over dim 0, concat, ...)
/// are not split.
bool rowSplittable(Operation *op, SmallVectorImpl<bool> &sliced) {
  if (op->getNumResults() == 0 || isa<DropoutOp, RandomOp, IotaOp>(op))
    return false;
  auto first = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!first || first.getRank() == 0)
    return false;
  int64_t n = first.getDimSize(0);
  for (Value r : op->getResults()) {
    auto t = cast<RankedTensorType>(r.getType());
    if (t.getRank() == 0 || t.getDimSize(0) != n)
      return false;
  }
  auto rows = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return t.getRank() >= 1 && t.getDimSize(0) == n;
  };
  auto intAttr = [&](StringRef name) {
    auto a = op->getAttrOfType<IntegerAttr>(name);
    return a ? a.getInt() : int64_t(-1);
  };
  sliced.assign(op->getNumOperands(), false);
  if (isElementwise(op)) {
    for (auto [i, v] : llvm::enumerate(op->getOperands())) {
      if (!rows(v))
        return false;
      sliced[i] = true;
    }
    return true;
  }
  if (isa<SoftmaxOp, LogSoftmaxOp>(op)) {
    sliced[0] = true;
    return intAttr("axis") != 0;
  }
  if (isa<LayerNormOp>(op)) { // over the last axis; scale and bias whole
    sliced[0] = true;
    return first.getRank() >= 2;
  }
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op)) {
    auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes");
    sliced[0] = true;
    return axes && !llvm::is_contained(axes.asArrayRef(), 0);
  }
  if (auto t = dyn_cast<TransposeOp>(op)) {
    sliced[0] = true;
    return t.getPermutation()[0] == 0;
  }
  if (auto bc = dyn_cast<BroadcastInDimOp>(op)) {
    ArrayRef<int64_t> dims = bc.getDims();
    auto in = cast<RankedTensorType>(bc.getOperand().getType());
    auto k = llvm::find(dims, 0);
    if (k == dims.end())
      return true; // result rows repeat the whole operand
    int64_t d = k - dims.begin();
    if (in.getDimSize(d) == 1)
      return true;
    sliced[0] = true;
    return d == 0 && in.getDimSize(0) == n;
  }
  if (auto g = dyn_cast<GatherOp>(op)) { // rows of the indices, whole table
    sliced[1] = true;
    return g.getAxis() == 0 && rows(g.getIndices());
  }
  return false;
}

/// Pieces to split a kernel into: the largest divisor c of n with c <= 64
/// and at least 4096 result elements per piece (1: do not split).
int64_t chooseChunks(Operation *op) {
  auto t = cast<RankedTensorType>(op->getResult(0).getType());
  int64_t n = t.getDimSize(0), elems = t.getNumElements();
  for (int64_t c = std::min<int64_t>(n, 64); c > 1; --c)
    if (n % c == 0 && elems / c >= 4096)
      return c;
  return 1;
}

/// Ops that join a loop-fusion group: elementwise ops and broadcasts (one
/// iteration space, the group's anchor shape).
bool loopFusible(Operation *op) {
  return isElementwise(op) ||
         (isa<BroadcastInDimOp>(op) && !isCloneable(op->getResult(0)));
}

/// Reduction-like ops that may end a group, with its elementwise ops as
/// their prologue (read through their first operand).
bool reductionFusible(Operation *op) {
  return isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, SoftmaxOp, LogSoftmaxOp,
             LayerNormOp, CrossEntropyOp>(op);
}

std::string shapeString(Type t) {
  auto rt = cast<RankedTensorType>(t);
  std::string s = "[";
  for (int64_t i = 0; i < rt.getRank(); ++i)
    s += (i ? "x" : "") + std::to_string(rt.getDimSize(i));
  return s + "]";
}

/// Estimated floating-point operations of one op (for the fusion report):
/// 1 per element for arithmetic, 10 for transcendental functions, a few per
/// input element for reductions and the composite ops.
int64_t estimateFlops(Operation *op) {
  auto elems = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getNumElements();
  };
  int64_t out = elems(op->getResult(0));
  if (isa<ExpOp, LogOp, TanhOp, SigmoidOp, ErfOp, GeluOp, SqrtOp, RsqrtOp, PowOp,
          SinOp, CosOp>(op))
    return 10 * out;
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp>(op))
    return elems(op->getOperand(0));
  if (isa<SoftmaxOp, LogSoftmaxOp>(op))
    return 14 * out;
  if (isa<LayerNormOp>(op))
    return 8 * out;
  if (isa<CrossEntropyOp>(op))
    return 14 * elems(op->getOperand(0));
  if (isElementwise(op))
    return out;
  return 0; // data movement
}

/// A float32 [0, 2, 1, 3] transpose of a rank-4 tensor: the head split or
/// merge of attention, which a GEMM can read or write in place.
bool isHeadTranspose(Operation *op) {
  auto t = dyn_cast_or_null<TransposeOp>(op);
  if (!t)
    return false;
  auto type = cast<RankedTensorType>(t.getType());
  ArrayRef<int64_t> perm = t.getPermutation();
  return type.getRank() == 4 && type.getElementType().isF32() &&
         perm == ArrayRef<int64_t>{0, 2, 1, 3};
}

/// A float32 matmul of rank-4 operands with two batch dimensions on both.
bool isHeadMatmul(Operation *op) {
  auto mm = dyn_cast_or_null<MatmulOp>(op);
  return mm && cast<RankedTensorType>(mm.getType()).getElementType().isF32() &&
         cast<RankedTensorType>(mm.getLhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getRhs().getType()).getRank() == 4 &&
         cast<RankedTensorType>(mm.getType()).getRank() == 4;
}

/// One step before buffers are assigned: operands and results are values.
struct VStep {
  Step::Kind kind;
  int kernel = -1;
  SmallVector<Value> ins, outs;
  program::GemmParams gemm;
  std::string loc;
};

class Generator {
public:
  Generator(ModuleOp module, bool fusion, std::string &error)
      : module_(module), ctx_(module.getContext()), error_(error), fusion_(fusion) {
    kernels_ = ModuleOp::create(UnknownLoc::get(ctx_));
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
    return success();
  }

  program::Program takeProgram() { return std::move(prog_); }
  std::vector<Refusal> takeRefusals() { return std::move(refusals_); }
  OwningOpRef<ModuleOp> takeKernels() { return std::move(kernels_); }

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

  /// Clones `v` (cloneable) and what it depends on into the kernel body.
  Value cloneInto(OpBuilder &b, Value v, IRMapping &map) {
    if (Value m = map.lookupOrNull(v))
      return m;
    Operation *def = v.getDefiningOp();
    for (Value operand : def->getOperands())
      cloneInto(b, operand, map);
    Operation *c = b.clone(*def, map);
    return c->getResult(cast<OpResult>(v).getResultNumber());
  }

  /// Creates (or reuses) the kernel for a group of ops (in schedule order;
  /// one op without fusion); fills the step's ins and outs: values read
  /// from outside the group, and member results used outside it.
  LogicalResult makeKernel(ArrayRef<Operation *> ops, VStep &step) {
    llvm::SmallPtrSet<Operation *, 8> members(ops.begin(), ops.end());
    auto inside = [&](Value v) {
      Operation *d = v.getDefiningOp();
      return d && members.count(d);
    };
    for (Operation *op : ops)
      for (Value operand : op->getOperands())
        if (!inside(operand) && !isCloneable(operand) &&
            !llvm::is_contained(step.ins, operand))
          step.ins.push_back(operand); // its own type; the buffer is its root's
    for (Operation *op : ops)
      for (Value r : op->getResults())
        if (ops.size() == 1 || llvm::any_of(r.getUsers(), [&](Operation *u) {
              return !members.count(u);
            }))
          step.outs.push_back(r);

    // Row pieces: every member splits along dim 0 with the same row count;
    // values passed between members are pieces; every use of an input
    // agrees on slicing; every sliced cloneable operand is a splat.
    llvm::DenseMap<Operation *, SmallVector<bool>> sliced;
    int64_t chunks = 1, n = -1;
    Operation *anchor = ops.front();
    bool split = true;
    for (Operation *op : ops) {
      SmallVector<bool> sl;
      if (!rowSplittable(op, sl)) {
        split = false;
        break;
      }
      int64_t rows0 = cast<RankedTensorType>(op->getResult(0).getType()).getDimSize(0);
      if (n >= 0 && rows0 != n)
        split = false;
      n = rows0;
      if (cast<RankedTensorType>(op->getResult(0).getType()).getNumElements() >
          cast<RankedTensorType>(anchor->getResult(0).getType()).getNumElements())
        anchor = op;
      sliced[op] = sl;
    }
    llvm::DenseMap<Value, bool> inputSliced;
    for (Operation *op : ops) {
      if (!split)
        break;
      for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
        bool sl = sliced[op][i];
        if (inside(operand)) {
          split &= sl;
        } else if (isCloneable(operand)) {
          split &= !sl || bool(splatValue(operand));
        } else {
          auto [it, fresh] = inputSliced.try_emplace(operand, sl);
          split &= fresh || it->second == sl;
        }
      }
    }
    if (split)
      chunks = chooseChunks(anchor);
    int64_t rows = chunks > 1 ? n / chunks : 0;
    auto piece = [&](Type t) { // the type of one piece of a sliced value
      auto rt = cast<RankedTensorType>(t);
      SmallVector<int64_t> shape(rt.getShape());
      shape[0] = rows;
      return RankedTensorType::get(shape, rt.getElementType());
    };

    OpBuilder b(ctx_);
    b.setInsertionPointToEnd(kernels_->getBody());
    SmallVector<Type> argTypes;
    auto memrefOf = [](Value v) {
      auto t = cast<RankedTensorType>(v.getType());
      return MemRefType::get(t.getShape(), t.getElementType());
    };
    for (Value v : step.ins)
      argTypes.push_back(memrefOf(v));
    for (Value v : step.outs)
      argTypes.push_back(memrefOf(v));
    if (chunks > 1)
      argTypes.push_back(b.getIndexType()); // which piece
    Location loc = UnknownLoc::get(ctx_);
    auto fn = b.create<func::FuncOp>(loc, "kernel", b.getFunctionType(argTypes, {}));
    Block *body = fn.addEntryBlock();
    b.setInsertionPointToStart(body);
    Value offset;
    if (chunks > 1)
      offset = b.create<arith::MulIOp>(
          loc, body->getArguments().back(),
          b.create<arith::ConstantIndexOp>(loc, rows));
    // A memref argument, or the rows [offset, offset + rows) of it.
    auto view = [&](Value memref, bool slice) -> Value {
      if (!slice)
        return memref;
      auto mt = cast<MemRefType>(memref.getType());
      SmallVector<OpFoldResult> offsets(mt.getRank(), b.getIndexAttr(0));
      SmallVector<OpFoldResult> sizes, strides(mt.getRank(), b.getIndexAttr(1));
      offsets[0] = offset;
      for (int64_t d = 0; d < mt.getRank(); ++d)
        sizes.push_back(b.getIndexAttr(d == 0 ? rows : mt.getDimSize(d)));
      return b.create<memref::SubViewOp>(loc, memref, offsets, sizes, strides);
    };
    IRMapping map;
    for (auto [i, v] : llvm::enumerate(step.ins)) {
      bool slice = chunks > 1 && inputSliced.lookup(v);
      Value t = b.create<bufferization::ToTensorOp>(
          loc, slice ? piece(v.getType()) : cast<RankedTensorType>(v.getType()),
          view(body->getArgument(i), slice), /*restrict=*/true, /*writable=*/false);
      map.map(v, t);
    }
    for (Operation *op : ops) {
      // Cloneable operands per use: a piece-shaped splat where sliced.
      IRMapping local = map;
      for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
        if (!isCloneable(operand))
          continue;
        if (chunks > 1 && sliced[op][i])
          local.map(operand, b.create<ConstantOp>(
                                 loc, DenseElementsAttr::get(piece(operand.getType()),
                                                             splatValue(operand))));
        else
          cloneInto(b, operand, local);
      }
      Operation *clone = b.clone(*op, local);
      for (auto [r, c] : llvm::zip(op->getResults(), clone->getResults())) {
        if (chunks > 1)
          c.setType(piece(c.getType()));
        map.map(r, c);
      }
    }
    for (auto [i, r] : llvm::enumerate(step.outs)) {
      auto m = b.create<bufferization::MaterializeInDestinationOp>(
          loc, TypeRange{}, map.lookup(r),
          view(body->getArgument(step.ins.size() + i), chunks > 1));
      m.setRestrict(true);
      m.setWritable(true);
    }
    b.create<func::ReturnOp>(loc);

    // Strip locations so identical kernels print identically, then dedupe.
    fn->walk([&](Operation *o) { o->setLoc(loc); });
    std::string key;
    {
      llvm::raw_string_ostream os(key);
      OpPrintingFlags flags;
      flags.printGenericOpForm();
      fn->print(os, flags);
    }
    Operation *op = ops.back();
    std::string where = locString(op->getLoc());
    auto it = kernelByKey_.find(key);
    if (it != kernelByKey_.end()) {
      fn->erase();
      step.kernel = it->second;
    } else {
      int index = int(prog_.kernels.size());
      std::string opName = op->getName().stripDialect().str();
      std::string line;
      if (size_t c = where.rfind(':'); c != std::string::npos && c > 0) {
        size_t l = where.rfind(':', c - 1);
        if (l != std::string::npos)
          line = "_L" + where.substr(l + 1, c - l - 1);
      }
      std::string name =
          ops.size() == 1
              ? fmt::format("k{}_{}{}", index, opName, line)
              : fmt::format("k{}_fused{}_{}{}", index, ops.size(), opName, line);
      fn.setSymName(name + "_body");
      program::Kernel k;
      k.symbol = name;
      k.op = op->getName().getStringRef().str();
      k.numArgs = int(step.ins.size() + step.outs.size());
      k.chunks = int(chunks);
      // An output may overwrite a same-shape input only when the kernel is one
      // elementwise op (one loop reading element i before writing it); in a
      // fused kernel a member may be recomputed after an output was written.
      k.inPlaceSafe = ops.size() == 1 && isElementwise(op);
      for (Operation *m : ops) {
        k.ops.push_back(m->getName().getStringRef().str());
        k.flops += estimateFlops(m);
      }
      k.kind = ops.size() > 1 && reductionFusible(ops.back()) ? "reduction+prologue"
               : ops.size() > 1                                ? "loop-fusion"
               : isElementwise(op)                             ? "elementwise"
                                                               : "single-op";
      prog_.kernels.push_back(k);
      kernelByKey_[key] = index;
      step.kernel = index;
    }
    auto &locs = prog_.kernels[step.kernel].locs;
    for (Operation *m : ops) {
      std::string l = locString(m->getLoc());
      if (!l.empty() && !llvm::is_contained(locs, l))
        locs.push_back(l);
    }
    return success();
  }

  Value root(Value v) {
    auto it = alias_.find(v);
    return it == alias_.end() ? v : it->second;
  }

  /// Forms fusion groups over the body in schedule order. A group is open
  /// while more ops may join it; it closes when one of its values is read
  /// by an op outside it (that op runs first, so a later member would
  /// create a cycle) or when a reduction ends it. Every producer->consumer
  /// edge that is not fused is recorded with the rule that refused it.
  void formGroups(func::FuncOp fn, std::vector<SmallVector<Operation *>> &groups,
                  llvm::DenseMap<Operation *, int> &groupOf) {
    std::vector<bool> open;
    std::vector<Type> anchor;
    std::vector<std::string> closedBy;
    Block &block = fn.getBody().front();
    auto refuse = [&](Operation *producer, Operation *consumer, std::string rule) {
      if (!fusion_)
        return;
      if (foldedIn.count(producer) || foldedIn.count(consumer) ||
          foldedOut.count(producer) || foldedOut.count(consumer))
        rule = "transpose-folded: a GEMM reads or writes this head transpose in "
               "place (strided layout), so it is no kernel of its own";
      Refusal r;
      r.function = fn.getSymName().str();
      r.producer = producer->getName().getStringRef().str();
      r.producerLoc = locString(producer->getLoc());
      r.consumer = consumer->getName().getStringRef().str();
      r.consumerLoc = locString(consumer->getLoc());
      r.rule = std::move(rule);
      refusals_.push_back(std::move(r));
    };
    for (Operation &op : block) {
      if (isa<ConstantOp>(op) ||
          (isa<ReshapeOp, BroadcastInDimOp>(op) && isCloneable(op.getResult(0))))
        continue;
      bool member = fusion_ && loopFusible(&op), terminal = fusion_ && reductionFusible(&op);
      int target = -1;
      SmallVector<int> candidates;
      for (auto [j, operand] : llvm::enumerate(op.getOperands())) {
        Operation *def = operand.getDefiningOp();
        if (!def || !groupOf.count(def))
          continue;
        int g = groupOf[def];
        if (target == g)
          continue;
        if (!member && !terminal) {
          refuse(def, &op,
                 isa<MatmulOp>(op) ? "consumer-is-gemm: a library GEMM reads whole buffers"
                 : isa<func::ReturnOp>(op) ? "result: the value leaves the function"
                 : isa<ReshapeOp, OptimizationBarrierOp>(op)
                     ? "alias: a reshape shares the producer's buffer"
                     : "consumer-kind: " + op.getName().getStringRef().str() +
                           " has no fusible kernel form yet (gather, scatter, "
                           "transpose, slice, pad, concat, iota, random, dropout)");
          continue;
        }
        if (!open[g]) {
          refuse(def, &op, closedBy[g]);
          continue;
        }
        auto shapeOf = [](Type t) { return cast<RankedTensorType>(t).getShape(); };
        if (member && shapeOf(op.getResult(0).getType()) != shapeOf(anchor[g])) {
          refuse(def, &op, "shape: iteration spaces differ (" +
                               shapeString(op.getResult(0).getType()) + " vs " +
                               shapeString(anchor[g]) + ")");
          continue;
        }
        if (terminal &&
            (j != 0 || shapeOf(operand.getType()) != shapeOf(anchor[g]) || target >= 0)) {
          refuse(def, &op, "reduction-operand: only a reduction's first operand, of "
                           "the group's shape, takes an elementwise prologue");
          continue;
        }
        candidates.push_back(g);
        target = std::max(target, g);
      }
      // Several open groups of the same shape feed this op: merge them
      // (none of their values is read outside yet, so no cycle forms).
      for (int g : candidates) {
        if (g == target || groups[g].empty())
          continue;
        for (Operation *m : groups[g])
          groupOf[m] = target;
        groups[target].append(groups[g].begin(), groups[g].end());
        groups[g].clear();
        llvm::sort(groups[target], [](Operation *a, Operation *b) {
          return a->isBeforeInBlock(b);
        });
      }
      // Values of other groups read here: those groups are complete.
      for (Value operand : op.getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (def && groupOf.count(def) && groupOf[def] != target && open[groupOf[def]]) {
          open[groupOf[def]] = false;
          closedBy[groupOf[def]] =
              "cycle: a value of the producer's kernel is already read by " +
              op.getName().getStringRef().str() +
              (locString(op.getLoc()).empty() ? "" : " at " + locString(op.getLoc())) +
              ", which runs before this op; fusing would need it earlier";
        }
      }
      if (isa<func::ReturnOp>(op))
        break;
      if (target >= 0) {
        groups[target].push_back(&op);
        groupOf[&op] = target;
        if (terminal) {
          open[target] = false;
          closedBy[target] = "reduction-epilogue: the producer's kernel ends in a "
                             "reduction; ops after a reduction start a new kernel";
        }
        continue;
      }
      groupOf[&op] = int(groups.size());
      groups.push_back({&op});
      open.push_back(member);
      anchor.push_back(op.getNumResults() ? op.getResult(0).getType() : Type());
      closedBy.push_back(
          terminal ? "reduction-epilogue: the producer's kernel ends in a reduction; "
                     "ops after a reduction start a new kernel"
          : isa<MatmulOp>(op)
              ? "producer-is-gemm: a library GEMM writes whole buffers (no epilogue yet)"
              : "producer-kind: " + op.getName().getStringRef().str() +
                    " has no fusible kernel form yet");
    }
  }

  LogicalResult compileFunction(func::FuncOp fn) {
    alias_.clear();
    std::vector<VStep> steps;
    Block &block = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    // Head-split transposes folded into GEMMs (a prologue decision): a
    // transpose read only by such GEMMs is never materialised, the GEMM
    // reads its operand in place; a GEMM whose only reader is such a
    // transpose writes the transposed layout directly.
    foldedIn.clear();
    foldedOut.clear();
    for (Operation &op : block) {
      if (!fusion_ || !isHeadTranspose(&op) || isCloneable(op.getOperand(0)))
        continue;
      if (!op.getResult(0).use_empty() &&
          llvm::all_of(op.getResult(0).getUsers(), [](Operation *u) { return isHeadMatmul(u); }))
        foldedIn.insert(&op);
    }
    for (Operation &op : block) {
      if (!fusion_ || !isHeadMatmul(&op) || !op.getResult(0).hasOneUse())
        continue;
      Operation *user = *op.getResult(0).getUsers().begin();
      if (isHeadTranspose(user) && !foldedIn.count(user))
        foldedOut.insert(user);
    }
    std::vector<SmallVector<Operation *>> groups;
    llvm::DenseMap<Operation *, int> groupOf;
    formGroups(fn, groups, groupOf);


    // A kernel that only materialises a cloneable value (returned
    // constants, GEMM operands that are constants).
    llvm::DenseSet<Value> materialized;
    auto materialize = [&](Value v) -> LogicalResult {
      if (!isCloneable(v) || materialized.count(v))
        return success();
      VStep s;
      s.kind = Step::Kernel;
      s.loc = locString(v.getLoc());
      // A kernel whose body is the cloned chain ending in `v`: use the
      // defining op with its cloneable operands.
      if (failed(makeKernel({v.getDefiningOp()}, s)))
        return failure();
      materialized.insert(v);
      steps.push_back(std::move(s));
      return success();
    };

    for (Operation &op : block.without_terminator()) {
      if (isa<ConstantOp>(op))
        continue;
      if (isa<ReshapeOp, BroadcastInDimOp>(op) && isCloneable(op.getResult(0)))
        continue;
      if (foldedIn.count(&op) || foldedOut.count(&op))
        continue; // done by the GEMM that reads or writes it
      if (isa<ReshapeOp, OptimizationBarrierOp>(op)) {
        if (failed(materialize(op.getOperand(0))))
          return failure();
        alias_[op.getResult(0)] = root(op.getOperand(0));
        continue;
      }
      for (Type t : op.getResultTypes()) {
        DType d;
        auto rt = dyn_cast<RankedTensorType>(t);
        if (!rt || !rt.hasStaticShape() || !toDType(rt.getElementType(), d))
          return fail(&op, "results must be statically shaped tensors of a supported type");
      }
      VStep s;
      s.loc = locString(op.getLoc());
      if (auto mm = dyn_cast<MatmulOp>(op)) {
        auto lt = cast<RankedTensorType>(mm.getLhs().getType());
        auto rt = cast<RankedTensorType>(mm.getRhs().getType());
        auto ot = cast<RankedTensorType>(mm.getType());
        if (ot.getElementType().isF32()) {
          for (Value v : {mm.getLhs(), mm.getRhs()})
            if (failed(materialize(v)))
              return failure();
          s.kind = Step::Gemm;
          s.ins = {root(mm.getLhs()), root(mm.getRhs())};
          s.outs = {mm.getResult()};
          program::GemmParams &g = s.gemm;
          // Folded head transposes: read the transpose's operand, or write
          // the transpose's result, with strided layouts.
          Operation *outT = mm.getResult().hasOneUse()
                                ? *mm.getResult().getUsers().begin() : nullptr;
          bool strided = isHeadMatmul(mm) &&
                         (foldedIn.count(mm.getLhs().getDefiningOp()) ||
                          foldedIn.count(mm.getRhs().getDefiningOp()) ||
                          (outT && foldedOut.count(outT)));
          if (strided) {
            auto layoutOf = [&](Value v, program::MatrixLayout &l) -> Value {
              auto t = cast<RankedTensorType>(v.getType()); // [B, H, R, C]
              int64_t h = t.getDimSize(1), r = t.getDimSize(2), c = t.getDimSize(3);
              if (foldedIn.count(v.getDefiningOp())) { // stored as [B, R, H, C]
                l = {r * h * c, c, h * c};
                return root(v.getDefiningOp()->getOperand(0));
              }
              l = {h * r * c, r * c, c};
              return root(v);
            };
            s.ins = {layoutOf(mm.getLhs(), g.lhsLayout), layoutOf(mm.getRhs(), g.rhsLayout)};
            int64_t h = ot.getDimSize(1), rr = ot.getDimSize(2), cc = ot.getDimSize(3);
            if (outT && foldedOut.count(outT)) { // write [B, M, H, N]
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
          g.k = mm.getTransposeLhs() ? lt.getDimSize(lt.getRank() - 2)
                                     : lt.getDimSize(lt.getRank() - 1);
          g.batch = 1;
          for (int64_t d = 0; d < r - 2; ++d)
            g.batch *= ot.getDimSize(d);
          g.transposeLhs = mm.getTransposeLhs();
          g.transposeRhs = mm.getTransposeRhs();
          g.lhsBatched = lt.getRank() > 2;
          g.rhsBatched = rt.getRank() > 2;
          steps.push_back(std::move(s));
          continue;
        }
      }
      // A fused group becomes one kernel at its last member's position.
      const SmallVector<Operation *> &group = groups[groupOf.lookup(&op)];
      if (group.back() != &op)
        continue;
      s.kind = Step::Kernel;
      if (failed(makeKernel(group, s)))
        return failure();
      steps.push_back(std::move(s));
    }
    for (Value v : ret.getOperands())
      if (failed(materialize(v)))
        return failure();

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
      for (Value v : s.ins)
        last[root(v)] = std::max(last.lookup(root(v)), int(i));
      for (Value v : s.outs) {
        def[v] = int(i);
        last[v] = int(i);
      }
    }
    for (Value v : ret.getOperands())
      last[root(v)] = kEnd;

    // Results that are new values of a parameter or state tensor go
    // straight into its buffer when the producing kernel is elementwise and
    // the old value is dead by then; otherwise a copy at the end.
    std::vector<std::pair<Value, int>> copies;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      auto name = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr);
      int target = name ? prog_.persistent(name.str()) : -1;
      if (target < 0)
        continue;
      Value r = root(v);
      if (buffer.count(r) && buffer[r] == target)
        continue; // returned unchanged
      // The argument currently held in `target`.
      Value old;
      for (BlockArgument a : block.getArguments())
        if (buffer.count(a) && buffer[a] == target)
          old = a;
      bool inPlace = false;
      if (!buffer.count(r) && def.count(r) && def[r] >= 0) {
        const VStep &s = steps[def[r]];
        bool elementwise = s.kind == Step::Kernel &&
                           prog_.kernels[s.kernel].inPlaceSafe &&
                           s.outs.size() == 1;
        int oldLast = old ? last.lookup(old) : -1;
        bool oldDead = oldLast < def[r] ||
                       (oldLast == def[r] && elementwise &&
                        old.getType() == r.getType());
        inPlace = elementwise && oldDead;
      }
      if (inPlace)
        buffer[r] = target;
      else
        copies.push_back({r, target});
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
      for (Value v : steps[i].outs)
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
        st.args.push_back(buffer[v]);
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
  program::Program prog_;
  llvm::StringMap<int> kernelByKey_;
  llvm::DenseMap<Value, Value> alias_;
  std::vector<int> scratchIds_; ///< offsets relative to the scratch base
  bool fusion_ = true;
  std::vector<Refusal> refusals_;
  /// Head transposes a GEMM reads (foldedIn) or writes (foldedOut) in place.
  llvm::DenseSet<Operation *> foldedIn, foldedOut;
};

/// float32 exp, erf, tanh, log, sin, cos, ... as polynomial and rational
/// approximations in plain arith ops (upstream MLIR's), which the loop
/// vectorizer can vectorize; a libm call per element cannot be.
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

/// Lowers the kernel module (kiln on memrefs) to the LLVM dialect.
LogicalResult lowerKernels(ModuleOp kernels, std::string &error) {
  MLIRContext *ctx = kernels.getContext();
  std::string diags;
  ScopedDiagnosticHandler handler(ctx, [&](Diagnostic &d) {
    llvm::raw_string_ostream os(diags);
    os << d << "\n";
    return success();
  });
  PassManager pm(ctx);
  pm.addPass(createKilnLowerToLinalgPass());
  pm.addPass(createCanonicalizerPass());
  // Folds splat constants and broadcasts into the generic that reads them
  // (inside one kernel), so they are never materialised as arrays.
  pm.addPass(createLinalgElementwiseOpFusionPass());
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
  out.refusals = gen.takeRefusals();
  if (!options.emitLLVM)
    return out;

  OwningOpRef<ModuleOp> lowered = cast<ModuleOp>(out.kernels->getOperation()->clone());
  if (failed(lowerKernels(*lowered, error)))
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
      for (int id : s.args)
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
                                                : "copy";
      std::string args;
      for (int id : s.args) {
        const Buffer &b = p.buffers[id];
        args += fmt::format(" {}{}@{}", b.name.empty() ? "" : b.name + ":",
                            shapeStr(b), b.offset);
      }
      os << fmt::format("  {:4} {:<34}{}", i, what, args);
      if (!s.loc.empty())
        os << "  ; " << s.loc;
      os << "\n";
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
  int64_t kernels = 0, gemms = 0, copies = 0, flops = 0, bytes = 0, fused = 0;
  std::map<std::string, int64_t> byKind;
  std::string lines;
  for (size_t i = 0; i < f->steps.size(); ++i) {
    const Step &s = f->steps[i];
    int64_t moved = 0;
    for (int id : s.args)
      moved += p.buffers[id].bytes;
    bytes += moved;
    if (s.kind == Step::Gemm) {
      ++gemms;
      int64_t fl = 2 * s.gemm.batch * s.gemm.m * s.gemm.n * s.gemm.k;
      flops += fl;
      lines += fmt::format("  {:4} gemm                 {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           fmt::format("[{}x{}x{}]x{}{}{}", s.gemm.m, s.gemm.n, s.gemm.k,
                                       s.gemm.batch, s.gemm.transposeLhs ? " tA" : "",
                                       s.gemm.transposeRhs ? " tB" : ""),
                           fl, moved, s.loc);
      continue;
    }
    if (s.kind == Step::Copy) {
      ++copies;
      lines += fmt::format("  {:4} copy                 {:<40} {:>12} flops {:>10} bytes  ; {}\n", i,
                           p.buffers[s.args[1]].name, 0, moved,
                           "fused update is not in place");
      continue;
    }
    ++kernels;
    const program::Kernel &k = p.kernels[s.kernel];
    flops += k.flops;
    byKind[k.kind]++;
    fused += k.ops.size() > 1;
    std::string ops;
    for (size_t j = 0; j < k.ops.size(); ++j)
      ops += (j ? " " : "") + llvm::StringRef(k.ops[j]).drop_front(5).str();
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
    std::string where;
    for (size_t j = 0; j < fileLines.size() && j < 4; ++j)
      where += (j ? ", " : "") + fileLines[j];
    if (fileLines.size() > 4)
      where += ", ...";
    lines += fmt::format("  {:4} {:<20} {:<40} {:>12} flops {:>10} bytes  ; {}\n", i, k.kind,
                         k.symbol, k.flops, moved, where);
    if (k.ops.size() > 1)
      lines += fmt::format("       ops: {}\n", ops);
  }
  os << fmt::format("fusion report for @{}: {} kernels ({} fused from several ops), {} "
                    "GEMMs, {} copies; {:.2f} GFLOP and {:.1f} MB of buffer traffic per call "
                    "(estimates)\n",
                    f->name, kernels, fused, gemms, copies, double(flops) / 1e9,
                    double(bytes) / 1e6);
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
