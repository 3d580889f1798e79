//===- Buffers.cpp - The buffer plan and ZeRO's memory -------------------===//
//
// assignBuffers: the persistent region, in-place updates and a first-fit
// scratch over live ranges; zeroMemory: what ZeRO saves per device.
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Fusion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;


namespace kiln {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

namespace codegen {

LogicalResult Generator::assignBuffers(func::FuncOp fn, std::vector<VStep> &steps,
                                       func::ReturnOp ret) {
  program::Function out;
  out.name = fn.getSymName().str();
  const int n = int(steps.size());
  const int kEnd = n + 1; // "live until the function returns"

  llvm::DenseMap<Value, int> buffer; // root value -> buffer id
  llvm::DenseMap<Value, int> def, last;
  Block &block = fn.getBody().front();

  // Pipeline stages: the stage holding each value (-1: every device).
  auto stageOfValue = [&](Value v) -> int {
    if (auto a = dyn_cast<BlockArgument>(v)) {
      auto s = fn.getArgAttrOfType<IntegerAttr>(a.getArgNumber(), kStageAttr);
      return s ? int(s.getInt()) : -1;
    }
    Operation *d = v.getDefiningOp();
    if (auto t = dyn_cast<TransferOp>(d))
      return int(t.getTo());
    if (isa<CollectiveBroadcastOp>(d))
      return -1;
    return int(stageOf(d));
  };
  // Arguments: parameters and state are persistent; inputs are scratch.
  for (BlockArgument a : block.getArguments()) {
    auto t = cast<RankedTensorType>(a.getType());
    DType d;
    if (!toDType(t.getElementType(), d))
      return fail(fn, "an argument has an unsupported element type");
    int stage = stageOfValue(a);
    if (auto p = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kParamAttr))
      buffer[a] = persistentBuffer(p.str(), Role::Param, stage, t);
    else if (auto st = fn.getArgAttrOfType<StringAttr>(a.getArgNumber(), KilnDialect::kStateAttr))
      buffer[a] = persistentBuffer(st.str(), Role::State, stage, t);
    // ZeRO: a sharded parameter or state tensor (kiln.shard = {axis,
    // shape}): the buffer holds this device's block of the logical tensor.
    if (auto shard = fn.getArgAttrOfType<DictionaryAttr>(a.getArgNumber(), "kiln.shard");
        shard && buffer.count(a)) {
      auto axis = shard.getAs<StringAttr>("axis");
      auto shape = shard.getAs<DenseI64ArrayAttr>("shape");
      if (!axis || !shape || getMesh(module_).axisSize(axis.getValue()) < 1)
        return fail(fn, "argument " + std::to_string(a.getArgNumber()) +
                            " has a kiln.shard without an axis of the module's mesh and a shape");
      Buffer &b = prog_.buffers[size_t(buffer[a])];
      b.shardAxis = axis.str();
      b.logicalShape.assign(shape.asArrayRef().begin(), shape.asArrayRef().end());
      // Tensor parallelism (kiln.shard's dim and outer): dimension `dim`
      // split over the axis, see program::Buffer::shardDim.
      if (shard.contains("dim") || shard.contains("outer")) {
        std::string what = "argument " + std::to_string(a.getArgNumber()) +
                           " ('" + b.name + "')";
        auto dim = shard.getAs<IntegerAttr>("dim");
        auto outer = shard.getAs<IntegerAttr>("outer");
        int64_t rank = int64_t(b.logicalShape.size());
        if (!dim || dim.getInt() < 0 || dim.getInt() >= rank)
          return fail(
              fn, what +
                      " has a kiln.shard whose dim is not a dimension of its " +
                      std::to_string(rank) + "-d logical shape");
        if (shard.contains("outer") && (!outer || outer.getInt() < 1))
          return fail(
              fn,
              what + " has a kiln.shard whose outer is not a positive integer");
        int64_t n = getMesh(module_).axisSize(axis.getValue());
        int64_t k = outer ? outer.getInt() : 1;
        int64_t size = b.logicalShape[size_t(dim.getInt())];
        if (size % (k * n) != 0)
          return fail(
              fn, fmt::format(
                      "{} splits dimension {} (size {}) as {} part(s) over the "
                      "{} devices of '{}', but {} is not a multiple of {}",
                      what, dim.getInt(), size, k, n, axis.getValue().str(),
                      size, k * n));
        std::vector<int64_t> local = b.logicalShape;
        local[size_t(dim.getInt())] = size / n;
        // ZeRO over another axis as well: the buffer is block d of that
        // tp block, flattened (program::Buffer::zeroAxis).
        if (auto zero = shard.getAs<StringAttr>("zero")) {
          int64_t z = getMesh(module_).axisSize(zero.getValue());
          if (z < 1)
            return fail(fn, what + " has a kiln.shard whose zero is not an axis of the module's mesh");
          int64_t numel = 1;
          for (int64_t d : local)
            numel *= d;
          local = {(numel + z - 1) / z};
          b.zeroAxis = zero.str();
        }
        if (b.shape != local)
          return fail(
              fn, fmt::format(
                      "{} has shape [{}], but its tensor-parallel block of "
                      "logical shape [{}] is [{}]",
                      what, fmt::join(b.shape, "x"),
                      fmt::join(b.logicalShape, "x"), fmt::join(local, "x")));
        b.shardDim = dim.getInt();
        b.shardOuter = k;
      }
    }
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

  // Outputs tied to an input live in the input's buffer: a parameter's or
  // state tensor's now, a temporary's once it has one (below).
  llvm::DenseSet<Value> tiedOut;
  llvm::DenseMap<Value, Value> tiedTemp; // output -> the temporary input
  for (VStep &s : steps)
    for (auto [o, i] : s.tied) {
      if (buffer.count(root(i)))
        buffer[o] = buffer.lookup(root(i));
      else
        tiedTemp[o] = root(i);
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
  // Pipeline stages: a buffer only conflicts with live buffers its own
  // devices hold (its stage's and every device's).
  struct Live { int64_t offset, size; int end; int id; int stage; };
  std::vector<Live> live;
  int64_t peak = 0;
  std::map<int, int64_t> stagePeak;
  auto allocate = [&](Value v, Role role, const std::string &name) -> int {
    Buffer b = makeBuffer(cast<RankedTensorType>(v.getType()), role, name);
    b.stage = stageOfValue(v);
    int64_t size = align(std::max<int64_t>(b.bytes, 1));
    std::sort(live.begin(), live.end(),
              [](const Live &x, const Live &y) { return x.offset < y.offset; });
    int64_t at = 0;
    for (const Live &l : live) {
      if (l.stage != b.stage)
        continue; // pipeline stages: a region per stage (run())
      if (l.offset - at >= size)
        break;
      at = std::max(at, l.offset + l.size);
    }
    b.offset = at; // relative to the scratch base until run() ends
    prog_.buffers.push_back(b);
    scratchIds_.push_back(int(prog_.buffers.size()) - 1);
    live.push_back({at, size, last.lookup(v), scratchIds_.back(), b.stage});
    peak = std::max(peak, at + size);
    stagePeak[b.stage] = std::max(stagePeak[b.stage], at + size);
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
    if (steps[i].kind == Step::Collective && steps[i].coll.op == program::Collective::Op::AllReduce) {
      // In place: an all_reduce whose operand (a scratch temporary) dies
      // here receives into the operand's buffer, which then lives as long
      // as the result.
      Value in = steps[i].ins[0], res = steps[i].outs[0];
      auto it = buffer.find(in);
      Live *l = nullptr;
      if (it != buffer.end() && last.lookup(in) == i && !returned.count(res))
        for (Live &x : live)
          if (x.id == it->second && prog_.buffers[x.id].role == Role::Temp)
            l = &x;
      if (l) {
        buffer[res] = l->id;
        l->end = std::max(l->end, last.lookup(res));
      }
    }
    for (Value v : llvm::concat<Value>(steps[i].outs, steps[i].epiOuts)) {
      auto t = tiedTemp.find(v);
      if (t != tiedTemp.end()) {
        // Written over a temporary that dies here: its buffer, which now
        // lives as long as the output.
        auto in = buffer.find(t->second);
        Live *l = nullptr;
        if (in != buffer.end())
          for (Live &x : live)
            if (x.id == in->second && prog_.buffers[size_t(x.id)].role == Role::Temp)
              l = &x;
        if (!l)
          return fail(v.getDefiningOp(), "an output tied to a temporary that has no live buffer");
        buffer[v] = l->id;
        l->end = std::max(l->end, last.lookup(v));
        continue;
      }
      if (!buffer.count(v))
        buffer[v] = allocate(v, returned.count(v) ? Role::Output : Role::Temp, "");
    }
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
  std::vector<int> queues;
  for (VStep &s : steps) {
    Step st;
    st.kind = s.kind;
    st.kernel = s.kernel;
    st.gemm = s.gemm;
    st.loc = s.loc;
    st.collective = s.coll;
    st.attention = s.attention;
    st.stage = s.stage;
    // Queue 1, the communication queue: gradient buckets (kiln.overlap) and
    // the pipeline's sends and receives, so that a stage computes its next
    // micro-batch while the last one's activations travel. Every device
    // runs each queue in the function's order, one order for all: no cycle.
    bool p2p = s.kind == Step::Collective && (s.coll.op == program::Collective::Op::Send ||
                                              s.coll.op == program::Collective::Op::Recv);
    queues.push_back(s.kind == Step::Collective && (s.overlap || p2p) ? 1 : 0);
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
    st.stage = prog_.buffers[size_t(target)].stage;
    st.loc = locString(v.getLoc());
    out.steps.push_back(std::move(st));
    queues.push_back(0);
  }
  out.scratchBytes = peak;
  for (auto &[s, v] : stagePeak)
    scratchPeak_[s] = std::max(scratchPeak_[s], v);
  // Activations: temporaries holding forward values that a step computing
  // something else (backward) reads.
  if (hasForward_ && otherSteps_.size() == steps.size()) {
    ActivationMemory a;
    std::set<int> ids;
    for (auto [i, s] : llvm::enumerate(steps)) {
      if (!otherSteps_[i])
        continue;
      for (Value v : llvm::concat<Value>(s.ins, s.epiIns)) {
        Value r = root(v);
        auto it = buffer.find(r);
        if (forwardValues_.count(r) && it != buffer.end() &&
            prog_.buffers[size_t(it->second)].role == Role::Temp)
          ids.insert(it->second);
      }
    }
    for (int id : ids) {
      const Buffer &b = prog_.buffers[size_t(id)];
      a.bytes += b.bytes;
      a.buffers++;
      a.bytesByType[program::dtypeName(b.dtype)] += b.bytes;
    }
    activations_[out.name] = std::move(a);
  }
  queues_.push_back(std::move(queues));
  prog_.functions.push_back(std::move(out));
  return success();
}

} // namespace codegen

ZeroMemory zeroMemory(const program::Program &p, int stage) {
  ZeroMemory m;
  // ZeRO shards over "dp"; on a mesh with other axes (tp) only its size
  // divides the state.
  int dp = p.mesh.axis("dp");
  m.devices = dp >= 0 ? std::max<int64_t>(1, p.mesh.axes[size_t(dp)].size)
                      : std::max(1, p.mesh.numDevices());
  int pp = p.mesh.axis("pp"), tp = p.mesh.axis("tp");
  if (dp < 0 && pp >= 0) // the replicas of a stage
    m.devices = std::max<int64_t>(
        1, p.mesh.numDevices() / (std::max<int64_t>(1, p.mesh.axes[size_t(pp)].size) *
                                  (tp >= 0 ? std::max<int64_t>(1, p.mesh.axes[size_t(tp)].size)
                                           : 1)));
  for (const Buffer &b : p.buffers) {
    if (b.role != Role::Param || (stage >= 0 && b.stage >= 0 && b.stage != stage))
      continue;
    int64_t n = b.numElements();
    // A ZeRO-sharded parameter counts whole (each device holds all of it
    // outside the update); a tensor-parallel one by its local block, which
    // is all a device ever holds of it, its gradient and optimizer state.
    if (!b.shardAxis.empty() && b.shardDim < 0)
      n = std::accumulate(b.logicalShape.begin(), b.logicalShape.end(), int64_t(1),
                          std::multiplies<int64_t>());
    m.psi += n;
    m.paramBytes += n * program::dtypeBytes(b.dtype);
    m.gradBytes += n * program::dtypeBytes(b.dtype);
    for (const Buffer &st : p.buffers) {
      llvm::StringRef name(st.name);
      if (st.role == Role::State && name.ends_with(":" + b.name) &&
          name.size() > b.name.size() + 1)
        m.optimizerBytes += n * program::dtypeBytes(st.dtype);
    }
  }
  return m;
}

} // namespace kiln
