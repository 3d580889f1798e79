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
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

#include <fmt/format.h>

#include <algorithm>
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
  Generator(ModuleOp module, std::string &error)
      : module_(module), ctx_(module.getContext()), error_(error) {
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

  /// Creates (or reuses) the kernel for `op`; fills the step's ins/outs.
  LogicalResult makeKernel(Operation *op, VStep &step) {
    for (Value operand : op->getOperands())
      if (!isCloneable(operand) && !llvm::is_contained(step.ins, operand))
        step.ins.push_back(operand); // its own type; the buffer is its root's
    for (Value r : op->getResults())
      step.outs.push_back(r);

    // Row pieces: every operand position of an input agrees on slicing,
    // and every sliced cloneable operand is a splat (rebuilt per piece).
    SmallVector<bool> sliced;
    int64_t chunks = rowSplittable(op, sliced) ? chooseChunks(op) : 1;
    llvm::DenseMap<Value, bool> inputSliced;
    for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
      if (chunks == 1)
        break;
      if (isCloneable(operand)) {
        if (sliced[i] && !splatValue(operand))
          chunks = 1;
        continue;
      }
      auto [it, fresh] = inputSliced.try_emplace(operand, sliced[i]);
      if (!fresh && it->second != sliced[i])
        chunks = 1;
    }
    int64_t rows = chunks > 1 ? cast<RankedTensorType>(op->getResult(0).getType()).getDimSize(0) / chunks : 0;
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
    for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
      if (!isCloneable(operand))
        continue;
      if (chunks > 1 && sliced[i])
        map.map(operand, b.create<ConstantOp>(
                             loc, DenseElementsAttr::get(piece(operand.getType()),
                                                         splatValue(operand))));
      else
        cloneInto(b, operand, map);
    }
    Operation *clone = b.clone(*op, map);
    if (chunks > 1)
      for (Value r : clone->getResults())
        r.setType(piece(r.getType()));
    for (auto [i, r] : llvm::enumerate(clone->getResults())) {
      auto m = b.create<bufferization::MaterializeInDestinationOp>(
          loc, TypeRange{}, r, view(body->getArgument(step.ins.size() + i), chunks > 1));
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
      std::string name = fmt::format("k{}_{}{}", index, opName, line);
      fn.setSymName(name + "_body");
      program::Kernel k;
      k.symbol = name;
      k.op = op->getName().getStringRef().str();
      k.numArgs = int(step.ins.size() + step.outs.size());
      k.chunks = int(chunks);
      k.inPlaceSafe = isElementwise(op); // piece by piece too: same rows
      prog_.kernels.push_back(k);
      kernelByKey_[key] = index;
      step.kernel = index;
    }
    auto &locs = prog_.kernels[step.kernel].locs;
    if (!where.empty() && !llvm::is_contained(locs, where))
      locs.push_back(where);
    return success();
  }

  Value root(Value v) {
    auto it = alias_.find(v);
    return it == alias_.end() ? v : it->second;
  }

  LogicalResult compileFunction(func::FuncOp fn) {
    alias_.clear();
    std::vector<VStep> steps;
    Block &block = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());

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
      if (failed(makeKernel(v.getDefiningOp(), s)))
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
      s.kind = Step::Kernel;
      if (failed(makeKernel(&op, s)))
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
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createConvertMathToLLVMPass());
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
  Generator gen(module, error);
  if (failed(gen.run()))
    return failure();
  CompiledProgram out;
  out.program = gen.takeProgram();
  out.kernels = gen.takeKernels();
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

} // namespace kiln
