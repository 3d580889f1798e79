//===- Program.cpp - Program JSON and its validation ----------------------===//
#include "runtime/core/Program.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::program {

using json = nlohmann::ordered_json;

namespace {
constexpr const char *kRoles[] = {"param", "state", "input", "output", "temp"};
constexpr const char *kKinds[] = {"kernel", "gemm", "copy", "collective", "attention"};
constexpr const char *kCollectiveOps[] = {"all_reduce", "reduce_scatter", "all_gather",
                                          "broadcast", "send", "recv"};
constexpr const char *kReductions[] = {"none", "sum", "mean", "max", "min"};
} // namespace

const char *collectiveOpName(Collective::Op op) { return kCollectiveOps[int(op)]; }
const char *reductionName(Collective::Reduction r) { return kReductions[int(r)]; }

int Mesh::numDevices() const {
  int64_t n = 1;
  for (const MeshAxis &a : axes)
    n *= a.size;
  return int(n);
}

int Mesh::axis(const std::string &name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name)
      return int(i);
  return -1;
}

int Collective::groupSize(const Mesh &mesh) const {
  if (!axis.empty()) {
    int a = mesh.axis(axis);
    return a < 0 ? 0 : int(mesh.axes[size_t(a)].size);
  }
  return int(group.size());
}

const char *roleName(Role r) { return kRoles[int(r)]; }

int64_t Buffer::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int Program::numStages() const {
  int a = mesh.axis("pp");
  return a < 0 ? 1 : int(mesh.axes[size_t(a)].size);
}

int Program::stageOf(int d) const {
  int a = mesh.axis("pp");
  if (a < 0)
    return 0;
  int64_t stride = 1;
  for (size_t i = size_t(a) + 1; i < mesh.axes.size(); ++i)
    stride *= mesh.axes[i].size;
  return int((d / stride) % mesh.axes[size_t(a)].size);
}

const Function *Program::function(const std::string &name) const {
  for (const Function &f : functions)
    if (f.name == name)
      return &f;
  return nullptr;
}

int Program::persistent(const std::string &name) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if ((buffers[i].role == Role::Param || buffers[i].role == Role::State) &&
        buffers[i].name == name)
      return int(i);
  return -1;
}

const char *activationName(LtEpilogue::Activation a) {
  switch (a) {
  case LtEpilogue::Activation::None: return "none";
  case LtEpilogue::Activation::Relu: return "relu";
  case LtEpilogue::Activation::GeluTanh: return "gelu_tanh";
  }
  return "none";
}

std::string gemmLabel(const GemmParams &g) {
  return fmt::format("gemm {}{}x{}x{} {}{}{}", g.batch > 1 ? fmt::format("{}x", g.batch) : "",
                     g.m, g.n, g.k, g.transposeLhs ? 'T' : 'N', g.transposeRhs ? 'T' : 'N',
                     g.dtype == DType::F32 ? (g.tf32 ? " tf32" : "")
                                           : std::string(" ") + dtypeName(g.dtype));
}

std::string Program::toJson() const {
  json j;
  j["version"] = kPlanVersion;
  json axes = json::array();
  for (const MeshAxis &a : mesh.axes)
    axes.push_back({{"name", a.name}, {"size", a.size}});
  j["mesh"] = {{"axes", axes}};
  j["queues"] = queues;
  if (deterministic)
    j["deterministic"] = "devices";
  json devices = json::array();
  for (int d = 0; d < numDevices(); ++d) {
    const BufferPlan &bp = plan(d);
    json bs = json::array();
    for (const Buffer &b : bp.buffers) {
      bs.push_back({{"name", b.name}, {"role", roleName(b.role)},
                    {"dtype", dtypeName(b.dtype)}, {"shape", b.shape},
                    {"offset", b.offset}, {"bytes", b.bytes}});
      if (!b.shardAxis.empty()) { // ZeRO-sharded (absent otherwise)
        bs.back()["shard_axis"] = b.shardAxis;
        bs.back()["logical_shape"] = b.logicalShape;
        if (b.shardDim >= 0) { // tensor-parallel (absent for ZeRO)
          bs.back()["shard_dim"] = b.shardDim;
          bs.back()["shard_outer"] = b.shardOuter;
          if (!b.zeroAxis.empty()) // ZeRO within the tp block
            bs.back()["shard_zero"] = b.zeroAxis;
        }
      }
      if (b.stage >= 0) // pipeline stage (absent: every device)
        bs.back()["stage"] = b.stage;
    }
    devices.push_back({{"device", d}, {"persistent_bytes", bp.persistentBytes},
                       {"arena_bytes", bp.arenaBytes}, {"buffers", bs}});
  }
  j["devices"] = devices;
  json ks = json::array();
  for (const Kernel &k : kernels)
    ks.push_back({{"symbol", k.symbol}, {"op", k.op}, {"num_args", k.numArgs},
                  {"chunks", k.chunks}, {"ops", k.ops}, {"kind", k.kind},
                  {"flops", k.flops},
                  {"in_place_safe", k.inPlaceSafe}, {"writes", k.writes}, {"num_inputs", k.numInputs},
                  {"lowest_float", dtypeName(k.lowestFloat)},
                  {"locs", k.locs}});
  j["kernels"] = ks;
  json fs = json::array();
  for (const Function &f : functions) {
    json steps = json::array();
    for (const Step &s : f.steps) {
      json e = {{"kind", kKinds[s.kind]}, {"args", s.args}, {"loc", s.loc},
                {"queue", s.queue}, {"deps", s.deps}};
      if (s.stage >= 0) // pipeline stage (absent: every device)
        e["stage"] = s.stage;
      if (s.kind == Step::Kernel)
        e["kernel"] = s.kernel;
      if (s.kind == Step::Gemm)
        e["gemm"] = {{"batch", s.gemm.batch}, {"m", s.gemm.m}, {"n", s.gemm.n},
                     {"k", s.gemm.k}, {"transpose_lhs", s.gemm.transposeLhs},
                     {"transpose_rhs", s.gemm.transposeRhs},
                     {"lhs_batched", s.gemm.lhsBatched},
                     {"rhs_batched", s.gemm.rhsBatched},
                     {"dtype", dtypeName(s.gemm.dtype)}};
      if (s.kind == Step::Attention)
        attentionToJson(s.attention, e["attention"]);
      if (s.kind == Step::Gemm && s.gemm.tf32) // absent (false) unless set
        e["gemm"]["tf32"] = true;
      if (s.kind == Step::Collective) {
        const Collective &c = s.collective;
        json ce = {{"op", collectiveOpName(c.op)}};
        if (c.axis.empty())
          ce["group"] = c.group;
        else
          ce["axis"] = c.axis;
        ce["dtype"] = dtypeName(c.dtype);
        ce["reduction"] = reductionName(c.reduction);
        ce["bytes"] = c.bytes;
        ce["peer"] = c.peer;
        ce["send_offset"] = c.sendOffset;
        ce["recv_offset"] = c.recvOffset;
        e["collective"] = ce;
      }
      if (s.kind == Step::Gemm && s.epilogue >= 0)
        e["epilogue"] = {{"kernel", s.epilogue}, {"args", s.epilogueArgs}};
      if (s.kind == Step::Gemm && s.lt.valid())
        e["lt_epilogue"] = {{"bias", s.lt.bias},
                            {"activation", activationName(s.lt.activation)},
                            {"out", s.lt.out},
                            {"aux", s.lt.aux}};
      if (s.kind == Step::Gemm && s.gemm.heads > 0) {
        auto layout = [](const MatrixLayout &l) {
          return json{{"outer", l.outer}, {"inner", l.inner}, {"ld", l.ld}};
        };
        e["gemm"]["heads"] = s.gemm.heads;
        e["gemm"]["lhs_layout"] = layout(s.gemm.lhsLayout);
        e["gemm"]["rhs_layout"] = layout(s.gemm.rhsLayout);
        e["gemm"]["out_layout"] = layout(s.gemm.outLayout);
      }
      steps.push_back(e);
    }
    fs.push_back({{"name", f.name}, {"args", f.args}, {"results", f.results},
                  {"scratch_bytes", f.scratchBytes}, {"steps", steps}});
  }
  j["functions"] = fs;
  return j.dump(1);
}

namespace {
struct Reader {
  std::string origin;
  std::string error;
  bool fail(const std::string &why) {
    if (error.empty())
      error = why;
    return false;
  }
  bool i64(const json &j, const char *key, int64_t &out, int64_t lo = 0,
           int64_t hi = int64_t(1) << 50) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
      return fail(fmt::format("'{}' is missing or not an integer", key));
    out = j[key].get<int64_t>();
    if (out < lo || out > hi)
      return fail(fmt::format("'{}' = {} is out of range", key, out));
    return true;
  }
  bool str(const json &j, const char *key, std::string &out) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
      return fail(fmt::format("'{}' is missing or not a string", key));
    out = j[key].get<std::string>();
    return true;
  }
  bool boolean(const json &j, const char *key, bool &out) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_boolean())
      return fail(fmt::format("'{}' is missing or not a boolean", key));
    out = j[key].get<bool>();
    return true;
  }
  bool ints(const json &j, const char *key, std::vector<int> &out, int limit) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_array())
      return fail(fmt::format("'{}' is missing or not an array", key));
    for (const json &e : j[key]) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= limit)
        return fail(fmt::format("'{}' holds a bad index", key));
      out.push_back(int(e.get<int64_t>()));
    }
    return true;
  }
};
} // namespace

namespace {
/// Reads one device's buffer plan: its arena sizes and buffers. `stage`
/// is the device's pipeline stage, `stages` the mesh's count: only the
/// buffers of its stage (and the stage -1 ones) must lie in its arena.
bool readBufferPlan(Reader &r, const json &plan, BufferPlan &bp, int stage,
                    int stages) {
  if (!r.i64(plan, "persistent_bytes", bp.persistentBytes) ||
      !r.i64(plan, "arena_bytes", bp.arenaBytes))
    return false;
  if (bp.persistentBytes > bp.arenaBytes)
    return r.fail("the persistent region exceeds the arena");
  if (!plan.contains("buffers") || !plan["buffers"].is_array())
    return r.fail("a device's buffers are missing");
  for (const json &e : plan["buffers"]) {
    Buffer b;
    std::string dtype, role;
    if (!r.str(e, "name", b.name) || !r.str(e, "role", role) ||
        !r.str(e, "dtype", dtype) || !r.i64(e, "offset", b.offset) ||
        !r.i64(e, "bytes", b.bytes))
      return false;
    if (!parseDType(dtype, b.dtype))
      return r.fail("unknown dtype '" + dtype + "'");
    int ri = -1;
    for (int k = 0; k < 5; ++k)
      if (role == kRoles[k])
        ri = k;
    if (ri < 0)
      return r.fail("unknown buffer role '" + role + "'");
    b.role = Role(ri);
    if (!e.contains("shape") || !e["shape"].is_array())
      return r.fail("a buffer has no shape");
    int64_t n = 1;
    for (const json &d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40))
        return r.fail("a buffer has a bad shape");
      b.shape.push_back(d.get<int64_t>());
      n *= b.shape.back();
      if (n > (int64_t(1) << 40))
        return r.fail("a buffer is impossibly large");
    }
    if (n * dtypeBytes(b.dtype) != b.bytes)
      return r.fail(fmt::format("buffer '{}' has {} bytes but its shape needs {}",
                             b.name, b.bytes, n * dtypeBytes(b.dtype)));
    if (e.contains("stage")) {
      int64_t st;
      if (!r.i64(e, "stage", st, 0, int64_t(1) << 20))
        return false;
      if (st >= stages)
        return r.fail(fmt::format(
            "buffer '{}' is on pipeline stage {}, but the mesh has {} "
            "stage{} (its \"pp\" axis)",
            b.name, st, stages, stages == 1 ? "" : "s"));
      b.stage = int(st);
    }
    bool mine = b.stage < 0 || b.stage == stage;
    if (b.offset % 64 != 0 || (mine && b.offset + b.bytes > bp.arenaBytes))
      return r.fail(fmt::format("buffer '{}' [{}, {}) lies outside the {}-byte arena",
                             b.name, b.offset, b.offset + b.bytes, bp.arenaBytes));
    if (e.contains("shard_axis")) {
      if (!r.str(e, "shard_axis", b.shardAxis) || b.shardAxis.empty())
        return r.fail("buffer '" + b.name + "' has an empty shard_axis");
      if (!e.contains("logical_shape") || !e["logical_shape"].is_array())
        return r.fail("sharded buffer '" + b.name + "' has no logical_shape");
      for (const json &d : e["logical_shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
            d.get<int64_t>() > (int64_t(1) << 40))
          return r.fail("sharded buffer '" + b.name + "' has a bad logical_shape");
        b.logicalShape.push_back(d.get<int64_t>());
      }
      if (e.contains("shard_dim")) {
        const json &dim = e["shard_dim"];
        int64_t rank = int64_t(b.logicalShape.size());
        if (!dim.is_number_integer() || dim.get<int64_t>() < 0 ||
            dim.get<int64_t>() >= rank)
          return r.fail(fmt::format(
              "sharded buffer '{}' has a shard_dim outside its {}-d "
              "logical_shape",
              b.name, rank));
        b.shardDim = dim.get<int64_t>();
        if (e.contains("shard_outer")) {
          const json &outer = e["shard_outer"];
          if (!outer.is_number_integer() || outer.get<int64_t>() < 1 ||
              outer.get<int64_t>() > (int64_t(1) << 40))
            return r.fail("sharded buffer '" + b.name +
                          "' has a bad shard_outer");
          b.shardOuter = outer.get<int64_t>();
        }
        if (e.contains("shard_zero") &&
            (!r.str(e, "shard_zero", b.zeroAxis) || b.zeroAxis.empty() ||
             b.zeroAxis == b.shardAxis))
          return r.fail("sharded buffer '" + b.name +
                        "' has a shard_zero that is not another mesh axis");
      } else if (e.contains("shard_outer") || e.contains("shard_zero")) {
        return r.fail("sharded buffer '" + b.name +
                      "' has a shard_outer or shard_zero without a shard_dim");
      }
    }
    bool persistent = b.role == Role::Param || b.role == Role::State;
    if (mine && persistent && b.offset + b.bytes > bp.persistentBytes)
      return r.fail("parameter '" + b.name + "' lies outside the persistent region");
    bp.buffers.push_back(std::move(b));
  }
  return true;
}

/// Whether two devices' plans describe the same buffers (ids, names,
/// roles, dtypes, shapes): every device runs the same functions.
bool sameBuffers(const BufferPlan &a, const BufferPlan &b) {
  if (a.buffers.size() != b.buffers.size())
    return false;
  for (size_t i = 0; i < a.buffers.size(); ++i)
    if (a.buffers[i].name != b.buffers[i].name ||
        a.buffers[i].role != b.buffers[i].role ||
        a.buffers[i].dtype != b.buffers[i].dtype ||
        a.buffers[i].shape != b.buffers[i].shape ||
        a.buffers[i].shardAxis != b.buffers[i].shardAxis ||
        a.buffers[i].logicalShape != b.buffers[i].logicalShape ||
        a.buffers[i].shardDim != b.buffers[i].shardDim ||
        a.buffers[i].shardOuter != b.buffers[i].shardOuter ||
        a.buffers[i].zeroAxis != b.buffers[i].zeroAxis ||
        a.buffers[i].stage != b.buffers[i].stage)
      return false;
  return true;
}

/// Reads a collective step's "collective" object into `s` and checks it
/// against the mesh and the step's buffers (args already read).
bool readCollective(Reader &r, const json &c, const Program &p, Step &s) {
  Collective &k = s.collective;
  auto an = [](const std::string &op) { return (op[0] == 'a' ? "an " : "a ") + op; };
  std::string op, dtype, reduction;
  if (!r.str(c, "op", op) || !r.str(c, "dtype", dtype) || !r.str(c, "reduction", reduction))
    return false;
  int oi = -1, ri = -1;
  for (int i = 0; i < 6; ++i)
    if (op == kCollectiveOps[i])
      oi = i;
  for (int i = 0; i < 5; ++i)
    if (reduction == kReductions[i])
      ri = i;
  if (oi < 0)
    return r.fail("unknown collective op '" + op + "'");
  if (ri < 0)
    return r.fail("unknown reduction '" + reduction + "'");
  k.op = Collective::Op(oi);
  k.reduction = Collective::Reduction(ri);
  if (!parseDType(dtype, k.dtype))
    return r.fail("a collective has an unknown dtype '" + dtype + "'");
  bool reducing = k.op == Collective::Op::AllReduce || k.op == Collective::Op::ReduceScatter;
  if (reducing != (k.reduction != Collective::Reduction::None))
    return r.fail(fmt::format("{} {} (it has '{}')", an(op),
                              reducing ? "needs a reduction" : "takes no reduction", reduction));
  if (c.contains("axis") == c.contains("group"))
    return r.fail(fmt::format("{} needs either a group of devices or a mesh axis", an(op)));
  if (c.contains("axis")) {
    if (!r.str(c, "axis", k.axis))
      return false;
    if (p.mesh.axis(k.axis) < 0)
      return r.fail(fmt::format("{} names mesh axis '{}', which the mesh does not have", an(op),
                                k.axis));
  } else {
    if (!r.ints(c, "group", k.group, p.numDevices()))
      return r.fail(fmt::format("{} names a device outside the {}-device mesh", an(op),
                                p.numDevices()));
    std::vector<int> sorted = k.group;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return r.fail(fmt::format("{} group is empty or names a device twice", an(op)));
  }
  int64_t g = k.groupSize(p.mesh), elem = dtypeBytes(k.dtype), peer = -1;
  if (!r.i64(c, "bytes", k.bytes, 1) || !r.i64(c, "peer", peer, -1, g - 1) ||
      !r.i64(c, "send_offset", k.sendOffset) || !r.i64(c, "recv_offset", k.recvOffset))
    return false;
  k.peer = int(peer);
  bool peered = k.op == Collective::Op::Send || k.op == Collective::Op::Recv ||
                k.op == Collective::Op::Broadcast;
  if (peered != (k.peer >= 0))
    return r.fail(fmt::format("{} {} (a rank in its group)", an(op),
                              peered ? "needs a peer" : "takes no peer"));
  if (k.bytes % elem || k.sendOffset % elem || k.recvOffset % elem)
    return r.fail(fmt::format("{} of {} moves {} bytes at offsets {} and {}: not whole "
                              "elements", an(op), dtype, k.bytes, k.sendOffset, k.recvOffset));
  if (k.op == Collective::Op::ReduceScatter && k.bytes % (g * elem))
    return r.fail(fmt::format("a reduce_scatter of {} bytes does not split into {} equal parts",
                              k.bytes, g));
  // The bytes each side reads and writes, then the buffers they lie in.
  int64_t sendBytes = k.bytes, recvBytes = k.bytes;
  if (k.op == Collective::Op::ReduceScatter)
    recvBytes = k.bytes / g;
  if (k.op == Collective::Op::AllGather) {
    if (k.bytes > (int64_t(1) << 50) / g)
      return r.fail(fmt::format("an all_gather of {} bytes over {} devices is too large",
                                k.bytes, g));
    recvBytes = k.bytes * g;
  }
  bool oneBuffer = k.op == Collective::Op::Send || k.op == Collective::Op::Recv;
  if (s.args.size() != (oneBuffer ? 1u : 2u))
    return r.fail(fmt::format("{} step needs {} buffer{}", an(op), oneBuffer ? 1 : 2,
                              oneBuffer ? "" : "s"));
  auto inside = [&](int id, int64_t offset, int64_t bytes) {
    const Buffer &b = p.buffers[size_t(id)];
    return b.dtype == k.dtype && offset + bytes <= b.bytes;
  };
  bool sends = k.op != Collective::Op::Recv, receives = k.op != Collective::Op::Send;
  if ((sends && !inside(s.args[0], k.sendOffset, sendBytes)) ||
      (receives && !inside(s.args.back(), k.recvOffset, recvBytes)))
    return r.fail(fmt::format("{} of {} bytes reads or writes outside its {} buffers", an(op),
                              k.bytes, dtype));
  return true;
}

/// "buffer 'w1'", or "buffer 7 (a temporary)" for an unnamed one.
std::string bufferName(const Program &p, int id) {
  const std::string &n = p.buffers[size_t(id)].name;
  return n.empty() ? fmt::format("buffer {} (a temporary)", id)
                   : fmt::format("buffer '{}'", n);
}

/// Pipeline stages (docs/parallel.md "Pipeline parallelism"): step `index`
/// of `f` touches only buffers its devices hold (a stage-s step: stage s or
/// -1; a stage -1 step: stage -1, but a broadcast's source may be its
/// root's), and waits only for steps its devices run or that no device of
/// its own skips (a stage -1 step may wait for a stage's step: the devices
/// of other stages skip that dependency).
bool checkStages(Reader &r, const Program &p, const Function &f, size_t index,
                 const Step &s) {
  std::string where =
      s.stage >= 0
          ? fmt::format("@{} step {} (stage {})", f.name, index, s.stage)
          : fmt::format("@{} step {} (every stage)", f.name, index);
  const Collective &c = s.collective;
  bool broadcast =
      s.kind == Step::Collective && c.op == Collective::Op::Broadcast;
  bool overPp = s.kind == Step::Collective && c.axis == "pp";
  std::vector<int> reads, writes;
  stepAccesses(p, s, reads, writes);
  auto check = [&](int id, const char *verb) {
    int bs = p.buffers[size_t(id)].stage;
    if (bs < 0 || bs == s.stage)
      return true;
    if (s.stage >= 0)
      return r.fail(
          fmt::format("{} {} {} of stage {}, which its devices do not hold",
                      where, verb, bufferName(p, id), bs));
    return r.fail(fmt::format(
        "{} {} {} of stage {}; a step every stage runs touches only "
        "buffers of stage -1 (every device)",
        where, verb, bufferName(p, id), bs));
  };
  for (int id : reads) {
    if (broadcast && overPp && s.stage < 0 && id == s.args[0] &&
        id != s.args.back()) {
      // The source of a pipeline broadcast: only its root reads it.
      int bs = p.buffers[size_t(id)].stage;
      if (bs >= 0 && bs != c.peer)
        return r.fail(fmt::format(
            "{} broadcasts {} of stage {} from stage {}; the source "
            "must be the root's",
            where, bufferName(p, id), bs, c.peer));
      continue;
    }
    if (!check(id, "reads"))
      return false;
  }
  for (int id : writes)
    if (!check(id, "writes"))
      return false;
  if (overPp && s.stage >= 0 &&
      (c.op == Collective::Op::Send || c.op == Collective::Op::Recv) &&
      c.peer == s.stage)
    return r.fail(fmt::format("{} is a {} over \"pp\" to its own stage", where,
                              collectiveOpName(c.op)));
  for (int d : s.deps) {
    int ds = f.steps[size_t(d)].stage;
    if (s.stage >= 0 && ds >= 0 && ds != s.stage)
      return r.fail(fmt::format(
          "{} depends on step {} of stage {}, which its devices do not "
          "run",
          where, d, ds));
  }
  return true;
}
} // namespace

Expected<Program> Program::parse(const std::string &text, const std::string &origin) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "{}: the buffer plan is invalid: {}; recompile the model with kilnc",
        origin, why));
  };
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return bad("it is not a JSON object");
  Reader r{origin, {}};
  Program p;
  // Plans before version 2 had no "version" (and one top-level arena).
  int64_t version = 1;
  if (j.contains("version") && !r.i64(j, "version", version, 0, int64_t(1) << 30))
    return bad(r.error);
  if (version != kPlanVersion)
    return Status::error(fmt::format(
        "{}: the buffer plan has version {} but this Kiln reads plan version {}; recompile "
        "the model with this kilnc", origin, version, kPlanVersion));
  if (!j.contains("mesh") || !j["mesh"].is_object() || !j["mesh"].contains("axes") ||
      !j["mesh"]["axes"].is_array())
    return bad("the device mesh is missing");
  int64_t devices = 1;
  for (const json &a : j["mesh"]["axes"]) {
    MeshAxis axis;
    if (!r.str(a, "name", axis.name) || !r.i64(a, "size", axis.size, 1, 1 << 20))
      return bad(r.error);
    if (axis.name.empty() || p.mesh.axis(axis.name) >= 0)
      return bad("mesh axes need distinct, non-empty names");
    devices *= axis.size;
    if (devices > (1 << 20))
      return bad("the mesh has too many devices");
    p.mesh.axes.push_back(std::move(axis));
  }
  int64_t queues;
  if (!r.i64(j, "queues", queues, 1, 1024))
    return bad(r.error);
  p.queues = int(queues);
  if (j.contains("deterministic")) {
    std::string d;
    if (!r.str(j, "deterministic", d))
      return bad(r.error);
    if (d != "devices")
      return bad("\"deterministic\" must be \"devices\" (or absent), not '" + d + "'");
    p.deterministic = true;
  }
  if (!j.contains("devices") || !j["devices"].is_array() ||
      !j.contains("kernels") || !j["kernels"].is_array() ||
      !j.contains("functions") || !j["functions"].is_array())
    return bad("devices, kernels or functions are missing");
  if (int64_t(j["devices"].size()) != devices)
    return bad(fmt::format("the mesh has {} device{} but the plan has {} buffer plans", devices,
                           devices == 1 ? "" : "s", j["devices"].size()));
  for (size_t d = 0; d < j["devices"].size(); ++d) {
    const json &e = j["devices"][d];
    int64_t id;
    if (!r.i64(e, "device", id))
      return bad(r.error);
    if (id != int64_t(d))
      return bad(fmt::format("buffer plan {} is for device {} (plans go in device order)", d, id));
    BufferPlan bp;
    if (!readBufferPlan(r, e, bp, p.stageOf(int(d)), p.numStages()))
      return bad(r.error);
    if (d == 0) {
      static_cast<BufferPlan &>(p) = std::move(bp);
    } else {
      if (!sameBuffers(p, bp))
        return bad(fmt::format("device {}'s buffers differ from device 0's (every device runs "
                               "the same functions)", d));
      p.otherDevices.push_back(std::move(bp));
    }
  }
  // A sharded buffer holds ceil(numel / N) elements of its logical tensor,
  // N the size of its mesh axis.
  for (const Buffer &b : p.buffers) {
    if (b.shardAxis.empty())
      continue;
    int a = p.mesh.axis(b.shardAxis);
    if (a < 0)
      return bad(fmt::format("buffer '{}' is sharded over mesh axis '{}', which the mesh does "
                             "not have", b.name, b.shardAxis));
    int64_t n = 1, axis = p.mesh.axes[size_t(a)].size;
    for (int64_t d : b.logicalShape) {
      n *= d;
      if (n > (int64_t(1) << 40))
        return bad("sharded buffer '" + b.name + "' is impossibly large");
    }
    if (b.shardDim >= 0) {
      // Tensor-parallel: dimension shardDim split into N blocks of each of
      // shardOuter parts, no padding.
      int64_t size = b.logicalShape[size_t(b.shardDim)],
              parts = b.shardOuter * axis;
      std::vector<int64_t> local = b.logicalShape;
      local[size_t(b.shardDim)] = size / axis;
      if (size % parts != 0)
        return bad(fmt::format(
            "buffer '{}' splits dimension {} (size {}) of its logical "
            "tensor into {} x {} blocks over '{}', which does not divide it",
            b.name, b.shardDim, size, b.shardOuter, axis, b.shardAxis));
      if (!b.zeroAxis.empty()) { // then ZeRO blocks over zeroAxis
        int z = p.mesh.axis(b.zeroAxis);
        if (z < 0)
          return bad(fmt::format("buffer '{}' is ZeRO-sharded over mesh axis '{}', which the "
                                 "mesh does not have", b.name, b.zeroAxis));
        int64_t zn = p.mesh.axes[size_t(z)].size, numel = n / axis;
        if (b.shape != std::vector<int64_t>{(numel + zn - 1) / zn})
          return bad(fmt::format(
              "buffer '{}' has shape [{}], but a ZeRO block over {} devices of its {}-element "
              "tensor-parallel block has {} elements",
              b.name, fmt::join(b.shape, "x"), zn, numel, (numel + zn - 1) / zn));
        continue;
      }
      if (b.shape != local)
        return bad(fmt::format(
            "tensor-parallel buffer '{}' has shape [{}], but dimension {} of "
            "its logical shape [{}] over {} devices gives [{}]",
            b.name, fmt::join(b.shape, "x"), b.shardDim,
            fmt::join(b.logicalShape, "x"), axis, fmt::join(local, "x")));
      continue;
    }
    if (b.numElements() != (n + axis - 1) / axis)
      return bad(fmt::format("sharded buffer '{}' holds {} elements, but a block of its "
                             "{}-element logical tensor over {} devices has {}",
                             b.name, b.numElements(), n, axis, (n + axis - 1) / axis));
  }
  int numBuffers = int(p.buffers.size());
  for (const json &e : j["kernels"]) {
    Kernel k;
    int64_t n;
    if (!r.str(e, "symbol", k.symbol) || !r.str(e, "op", k.op) ||
        !r.i64(e, "num_args", n, 1, 4096) ||
        !r.boolean(e, "in_place_safe", k.inPlaceSafe))
      return bad(r.error);
    k.numArgs = int(n);
    if (!r.i64(e, "chunks", n, 1, 4096))
      return bad(r.error);
    k.chunks = int(n);
    if (e.contains("kind") && e["kind"].is_string())
      k.kind = e["kind"].get<std::string>();
    if (e.contains("flops") && e["flops"].is_number_integer())
      k.flops = e["flops"].get<int64_t>();
    if (e.contains("ops") && e["ops"].is_array())
      for (const json &o : e["ops"])
        if (o.is_string())
          k.ops.push_back(o.get<std::string>());
    if (e.contains("lowest_float") && e["lowest_float"].is_string())
      parseDType(e["lowest_float"].get<std::string>(), k.lowestFloat);
    if (e.contains("num_inputs") && e["num_inputs"].is_number_integer())
      k.numInputs = int(std::clamp<int64_t>(e["num_inputs"].get<int64_t>(), 0, k.numArgs));
    if (e.contains("writes") && e["writes"].is_array())
      for (const json &w : e["writes"])
        if (w.is_number_integer() && w.get<int64_t>() >= 0 && w.get<int64_t>() < k.numArgs)
          k.writes.push_back(int(w.get<int64_t>()));
    if (e.contains("locs") && e["locs"].is_array())
      for (const json &l : e["locs"])
        if (l.is_string())
          k.locs.push_back(l.get<std::string>());
    p.kernels.push_back(std::move(k));
  }
  for (const json &e : j["functions"]) {
    Function f;
    if (!r.str(e, "name", f.name) || !r.ints(e, "args", f.args, numBuffers) ||
        !r.ints(e, "results", f.results, numBuffers) ||
        !r.i64(e, "scratch_bytes", f.scratchBytes))
      return bad(r.error);
    if (!e.contains("steps") || !e["steps"].is_array())
      return bad("function '" + f.name + "' has no steps");
    for (const json &se : e["steps"]) {
      Step s;
      std::string kind;
      if (!r.str(se, "kind", kind) || !r.ints(se, "args", s.args, numBuffers))
        return bad(r.error);
      if (se.contains("loc") && se["loc"].is_string())
        s.loc = se["loc"].get<std::string>();
      if (se.contains("stage")) {
        int64_t st;
        if (!r.i64(se, "stage", st, -1, int64_t(1) << 20))
          return bad(fmt::format("step {} of @{}: {}", f.steps.size(), f.name,
                                 r.error));
        if (st >= p.numStages())
          return bad(fmt::format(
              "@{} step {} is on pipeline stage {}, but the mesh has {} "
              "stage{} (its \"pp\" axis)",
              f.name, f.steps.size(), st, p.numStages(),
              p.numStages() == 1 ? "" : "s"));
        s.stage = int(st);
      }
      if (kind == "kernel") {
        int64_t k;
        if (!r.i64(se, "kernel", k, 0, int64_t(p.kernels.size()) - 1))
          return bad(r.error);
        s.kernel = int(k);
        if (int(s.args.size()) != p.kernels[k].numArgs)
          return bad(fmt::format("a call of kernel {} passes {} buffers, it takes {}",
                                 p.kernels[k].symbol, s.args.size(),
                                 p.kernels[k].numArgs));
      } else if (kind == "gemm") {
        s.kind = Step::Gemm;
        const json &g = se.contains("gemm") ? se["gemm"] : json();
        GemmParams &gp = s.gemm;
        // Dimensions fit BLAS's int; products are checked below without
        // overflow (a hand-made artifact must not wrap to a small size).
        constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;
        if (!r.i64(g, "batch", gp.batch, 1, kMaxDim) || !r.i64(g, "m", gp.m, 1, kMaxDim) ||
            !r.i64(g, "n", gp.n, 1, kMaxDim) || !r.i64(g, "k", gp.k, 1, kMaxDim) ||
            !r.boolean(g, "transpose_lhs", gp.transposeLhs) ||
            !r.boolean(g, "transpose_rhs", gp.transposeRhs) ||
            !r.boolean(g, "lhs_batched", gp.lhsBatched) ||
            !r.boolean(g, "rhs_batched", gp.rhsBatched))
          return bad(r.error);
        if (s.args.size() != 3)
          return bad("a gemm step needs 3 buffers");
        {
          int64_t t = 0;
          const std::pair<int64_t, int64_t> dims[] = {{gp.m, gp.k}, {gp.k, gp.n}, {gp.m, gp.n}};
          for (auto [x, y] : dims)
            if (__builtin_mul_overflow(x, y, &t) || __builtin_mul_overflow(t, gp.batch, &t) ||
                t > (int64_t(1) << 50))
              return bad("a gemm step's shape is too large");
        }
        if (g.contains("dtype")) { // absent in artifacts before half-precision GEMMs: f32
          std::string dt;
          if (!r.str(g, "dtype", dt) || !parseDType(dt, gp.dtype) ||
              !(gp.dtype == DType::F32 || gp.dtype == DType::F16 || gp.dtype == DType::BF16))
            return bad(r.error.empty() ? "a gemm step's dtype is not f32, f16 or bf16" : r.error);
        }
        if (g.contains("tf32") && !r.boolean(g, "tf32", gp.tf32))
          return bad(r.error);
        if (gp.tf32 && gp.dtype != DType::F32)
          return bad("a gemm step asks for tf32 on " + std::string(dtypeName(gp.dtype)) +
                     " operands (tf32 is a mode of f32 GEMMs)");
        if (se.contains("epilogue")) {
          const json &ep = se["epilogue"];
          int64_t k;
          if (!r.i64(ep, "kernel", k, 0, int64_t(p.kernels.size()) - 1) ||
              !r.ints(ep, "args", s.epilogueArgs, numBuffers))
            return bad(r.error);
          s.epilogue = int(k);
          if (int(s.epilogueArgs.size()) != p.kernels[k].numArgs)
            return bad(fmt::format("a gemm epilogue of kernel {} passes {} buffers, it takes {}",
                                   p.kernels[k].symbol, s.epilogueArgs.size(),
                                   p.kernels[k].numArgs));
        }
        if (se.contains("lt_epilogue")) {
          const json &lt = se["lt_epilogue"];
          int64_t bias, out, aux;
          std::string act;
          if (!r.i64(lt, "bias", bias, -1, numBuffers - 1) ||
              !r.i64(lt, "out", out, 0, numBuffers - 1) ||
              !r.i64(lt, "aux", aux, -1, numBuffers - 1) || !r.str(lt, "activation", act))
            return bad(r.error);
          if (act == "none")
            s.lt.activation = LtEpilogue::Activation::None;
          else if (act == "relu")
            s.lt.activation = LtEpilogue::Activation::Relu;
          else if (act == "gelu_tanh")
            s.lt.activation = LtEpilogue::Activation::GeluTanh;
          else
            return bad("a gemm's library epilogue has an unknown activation '" + act + "'");
          s.lt.bias = int(bias);
          s.lt.out = int(out);
          s.lt.aux = int(aux);
          int64_t mn = gp.batch * gp.m * gp.n;
          auto f32 = [&](int64_t id, int64_t elems) {
            return p.buffers[size_t(id)].dtype == DType::F32 &&
                   p.buffers[size_t(id)].numElements() == elems;
          };
          if (s.epilogue < 0 || g.contains("heads") || gp.dtype != DType::F32 || !f32(out, mn) ||
              (bias >= 0 && !f32(bias, gp.n)) || (aux >= 0 && !f32(aux, mn)) ||
              (aux >= 0 && gp.n % 8 != 0))
            return bad("a gemm's library epilogue does not match its step (it needs an epilogue "
                       "kernel, dense float32 buffers of the GEMM's shape, a bias of n, and n a "
                       "multiple of 8 for the pre-activation)");
        }
        auto fits = [&](int id, int64_t elems) {
          return p.buffers[id].dtype == gp.dtype &&
                 p.buffers[id].numElements() == elems;
        };
        if (g.contains("heads")) {
          // Strided layouts: every matrix of every operand must lie inside
          // its buffer (largest start + last row + row length).
          if (!r.i64(g, "heads", gp.heads, 1, gp.batch) || gp.batch % gp.heads != 0 ||
              !gp.lhsBatched || !gp.rhsBatched)
            return bad(r.error.empty() ? "a strided gemm step has bad heads" : r.error);
          struct Operand { const char *key; MatrixLayout *l; int id; int64_t rows, cols; };
          Operand ops[] = {
              {"lhs_layout", &gp.lhsLayout, s.args[0], gp.transposeLhs ? gp.k : gp.m,
               gp.transposeLhs ? gp.m : gp.k},
              {"rhs_layout", &gp.rhsLayout, s.args[1], gp.transposeRhs ? gp.n : gp.k,
               gp.transposeRhs ? gp.k : gp.n},
              {"out_layout", &gp.outLayout, s.args[2], gp.m, gp.n}};
          for (Operand &o : ops) {
            const json &l = g.contains(o.key) ? g[o.key] : json();
            if (!r.i64(l, "outer", o.l->outer) || !r.i64(l, "inner", o.l->inner) ||
                !r.i64(l, "ld", o.l->ld, o.cols))
              return bad(r.error);
            __int128 last = __int128(gp.batch / gp.heads - 1) * o.l->outer +
                            __int128(gp.heads - 1) * o.l->inner +
                            __int128(o.rows - 1) * o.l->ld + o.cols;
            if (p.buffers[o.id].dtype != gp.dtype || last > p.buffers[o.id].numElements())
              return bad("a strided gemm step reads or writes outside its buffers");
          }
        } else if (!fits(s.args[0], (gp.lhsBatched ? gp.batch : 1) * gp.m * gp.k) ||
                   !fits(s.args[1], (gp.rhsBatched ? gp.batch : 1) * gp.k * gp.n) ||
                   !fits(s.args[2], gp.batch * gp.m * gp.n)) {
          return bad("a gemm step's buffers do not match its shape");
        }
      } else if (kind == "attention") {
        s.kind = Step::Attention;
        if (std::string e = attentionFromJson(se.contains("attention") ? se["attention"] : json(),
                                              s.args, p.buffers, s.attention);
            !e.empty())
          return bad(e);
      } else if (kind == "copy") {
        s.kind = Step::Copy;
        if (s.args.size() != 2 ||
            p.buffers[s.args[0]].bytes != p.buffers[s.args[1]].bytes)
          return bad("a copy step needs 2 buffers of equal size");
      } else if (kind == "collective") {
        s.kind = Step::Collective;
        if (!readCollective(r, se.contains("collective") ? se["collective"] : json(), p, s))
          return bad(r.error);
      } else {
        return bad("unknown step kind '" + kind + "'");
      }
      // Where it runs and what it waits for: a queue in range, and steps
      // that come before it (so the dependencies form no cycle).
      int64_t queue = 0;
      if (!r.i64(se, "queue", queue, 0, p.queues - 1))
        return bad(r.error + fmt::format(" (the plan has {} queue{})", p.queues,
                                         p.queues == 1 ? "" : "s"));
      s.queue = int(queue);
      size_t index = f.steps.size();
      if (!se.contains("deps") || !se["deps"].is_array())
        return bad(fmt::format("step {} of @{} has no dependency list", index, f.name));
      for (const json &d : se["deps"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= int64_t(index))
          return bad(fmt::format("step {} of @{} depends on {}, which is not an earlier step",
                                 index, f.name, d.dump()));
        s.deps.push_back(int(d.get<int64_t>()));
      }
      if (!checkStages(r, p, f, index, s))
        return bad(r.error);
      f.steps.push_back(std::move(s));
    }
    p.functions.push_back(std::move(f));
  }
  return p;
}

double kernelTrafficBytes(const Program &p, int kernel, const std::vector<int> &args) {
  auto bytesOf = [&](int a) {
    return a >= 0 && size_t(a) < p.buffers.size() ? double(p.buffers[size_t(a)].bytes) : 0.0;
  };
  double b = 0;
  for (int a : args)
    b += bytesOf(a);
  if (kernel >= 0 && size_t(kernel) < p.kernels.size()) {
    const Kernel &k = p.kernels[size_t(kernel)];
    for (int w : k.writes)
      if (w >= 0 && w < k.numInputs && size_t(w) < args.size())
        b += bytesOf(args[size_t(w)]);
  }
  return b;
}

} // namespace kiln::program
