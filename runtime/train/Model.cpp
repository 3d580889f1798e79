//===- Model.cpp - A loaded artifact with its backend ---------------------===//
#include "runtime/train/Model.h"

#include "runtime/core/Half.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <sys/stat.h>

namespace kiln::train {

using program::Buffer;
using program::DType;
using program::Role;

Expected<std::unique_ptr<Model>> Model::open(const std::string &artifact) {
  auto pkg = Package::open(artifact);
  if (!pkg)
    return pkg.status();
  auto m = std::make_unique<Model>();
  m->pkg = std::move(*pkg);
  return m;
}

Status Model::compile(const BackendFactory &make, bool profile) {
  auto created = make(pkg);
  if (!created)
    return created.status();
  return attach(std::move(*created), profile);
}

Status Model::attach(std::unique_ptr<Backend> backend, bool profile) {
  exec = std::move(backend);
  exec->setProfiling(profile);
  return setPersistent(pkg.initial);
}

namespace {
/// Mixed precision's low copy of parameter P is the state "lowp:P": derived
/// data, recomputed from P on load and never saved (docs/training.md).
constexpr const char *kLowPrefix = "lowp:";
bool isLowCopy(const std::string &name) { return name.rfind(kLowPrefix, 0) == 0; }
/// The loss scaler's state: a checkpoint without it (written by a program
/// without loss scaling) resumes with the scaler's initial values.
bool isScalerState(const std::string &name) {
  return name == "loss_scale" || name == "scale_good_steps" || name == "skipped_steps";
}

/// `param` (float32 bytes) rounded to `t` (BF16 or F16) as the update
/// kernel's cast rounds it: to nearest even.
std::string lowCopyOf(const std::string &param, program::DType t) {
  size_t n = param.size() / 4;
  std::string out(n * 2, '\0');
  for (size_t k = 0; k < n; ++k) {
    float f;
    std::memcpy(&f, param.data() + k * 4, 4);
    uint16_t h = floatToHalf(t, f);
    std::memcpy(&out[k * 2], &h, 2);
  }
  return out;
}

const ShardSpec &specOf(std::vector<ShardSpec> &shards, const program::Program &p, size_t id) {
  if (shards.size() != p.buffers.size())
    shards = shardSpecs(p);
  return shards[id];
}
} // namespace

bool Model::hasShardedState() const {
  for (size_t id = 0; id < prog().buffers.size(); ++id) {
    const Buffer &b = prog().buffers[id];
    bool sharded = id < shards.size() ? shards[id].sharded() : shardOf(b).sharded();
    if ((b.role == Role::Param || b.role == Role::State) && sharded)
      return true;
    if ((b.role == Role::Param || b.role == Role::State) && b.stage >= 0 &&
        prog().numStages() > 1)
      return true;
  }
  return false;
}

float Model::stageScalar(int id) {
  const Buffer &b = prog().buffers[size_t(id)];
  std::vector<int> group = axisGroup(prog().mesh, device, "pp");
  if (b.stage < 0 || group.size() < 2 || !comm)
    return holds(id) ? scalar(id) : NAN;
  float v = holds(id) ? scalar(id) : 0.f;
  if (Status s = comm->broadcast(&v, 1, DType::F32, b.stage, group); !s)
    return NAN;
  return v;
}

Status Model::setPersistent(const ckpt::Checkpoint &c) {
  for (size_t id = 0; id < prog().buffers.size(); ++id) {
    const Buffer &b = prog().buffers[id];
    if (b.role != Role::Param && b.role != Role::State)
      continue;
    if (!holds(int(id))) // another pipeline stage's
      continue;
    const ckpt::Tensor *t = c.find(b.name);
    ckpt::Tensor low;
    if (!t && isLowCopy(b.name)) {
      // The logical low copy; a tensor-parallel one is cut below like any
      // tensor-parallel buffer.
      const ckpt::Tensor *w = c.find(b.name.substr(std::strlen(kLowPrefix)));
      const ShardSpec &ls = specOf(shards, prog(), id);
      size_t want =
          ls.perDim() ? size_t(ls.logicalElements()) * 4 : size_t(b.bytes) * 2;
      if (!w || w->dtype != "F32" || w->bytes.size() != want ||
          (b.dtype != DType::BF16 && b.dtype != DType::F16) ||
          (ls.sharded() && !ls.perDim()))
        return Status::internal(fmt::format(
            "{}: cannot derive '{}' from its float32 parameter", pkg.path, b.name));
      low.name = b.name;
      low.bytes = lowCopyOf(w->bytes, b.dtype);
      t = &low;
    }
    if (!t && isScalerState(b.name) && &c != &pkg.initial)
      t = pkg.initial.find(b.name);
    if (!t)
      return Status::internal(fmt::format("{}: no tensor '{}' to load", pkg.path, b.name));
    const ShardSpec &spec = specOf(shards, prog(), id);
    if (!spec.sharded()) {
      if (Status s = exec->write(int(id), t->bytes.data(), t->bytes.size()); !s)
        return s;
      continue;
    }
    // This device's block of the logical tensor.
    int coord = 0;
    std::vector<int> group = axisGroup(prog().mesh, device, spec.axis, &coord);
    if (spec.perDim()) { // tensor-parallel: a block of dimension spec.dim
      int elem = int(program::dtypeBytes(b.dtype));
      auto block =
          cutDimBlock(t->bytes, spec.logicalShape, spec.dim, spec.outer,
                      elem, int(group.size()),
                      coord, fmt::format("{}: '{}'", pkg.path, b.name));
      if (!block)
        return block.status();
      if (!spec.zeroAxis.empty()) { // and ZeRO's block of that
        int z = 0;
        std::vector<int> zg = axisGroup(prog().mesh, device, spec.zeroAxis, &z);
        int64_t numel = int64_t(block->size()) / elem;
        *block = cutBlock(*block, numel, elem, int(zg.size()), z);
        if (int64_t(block->size()) != b.bytes)
          return Status::error(fmt::format(
              "{}: '{}' is split on dimension {} over '{}' and then over '{}' ({} x {} "
              "devices) in blocks of {} bytes, but its buffer holds {}; recompile the model "
              "with kilnc",
              pkg.path, b.name, spec.dim, spec.axis, spec.zeroAxis, group.size(), zg.size(),
              block->size(), b.bytes));
      }
      if (int64_t(block->size()) != b.bytes)
        return Status::error(fmt::format(
            "{}: '{}' is split on dimension {} over '{}' ({} devices) in "
            "blocks of {} bytes, but its buffer holds {}; recompile the "
            "model with kilnc",
            pkg.path, b.name, spec.dim, spec.axis, group.size(), block->size(),
            b.bytes));
      if (Status s = exec->write(int(id), block->data(), block->size()); !s)
        return s;
      continue;
    }
    std::string block = cutBlock(t->bytes, spec.logicalElements(),
                                 int(program::dtypeBytes(b.dtype)), int(group.size()), coord);
    if (int64_t(block.size()) != b.bytes)
      return Status::error(fmt::format(
          "{}: '{}' is sharded over '{}' ({} devices) in blocks of {} bytes, but its buffer "
          "holds {}; recompile the model with kilnc", pkg.path, b.name, spec.axis,
          group.size(), block.size(), b.bytes));
    if (Status s = exec->write(int(id), block.data(), block.size()); !s)
      return s;
  }
  return Status::ok();
}

Status Model::receiveStageTensor(const Buffer &b, const ShardSpec &spec,
                                 ckpt::Tensor &t) {
  std::vector<int> group = axisGroup(prog().mesh, device, "pp");
  if (group.size() < 2)
    return Status::ok();
  if (!comm)
    return Status::internal(
        fmt::format("{}: '{}' lives on pipeline stage {} of {} but this device "
                    "has no communicator",
                    pkg.path, b.name, b.stage, group.size()));
  int64_t elem = program::dtypeBytes(b.dtype);
  int64_t count = spec.sharded() ? spec.logicalElements() : b.numElements();
  t.bytes.resize(size_t(count * elem)); // the root's is that size already
  if (Status s =
          comm->broadcast(t.bytes.data(), count, b.dtype, b.stage, group);
      !s)
    return Status::error(
        fmt::format(
            "sending '{}' from pipeline stage {} for the checkpoint: {}",
            b.name, b.stage, s.message()),
        s.kind());
  return Status::ok();
}

Expected<ckpt::Checkpoint> Model::getPersistent() {
  ckpt::Checkpoint c;
  for (size_t id = 0; id < prog().buffers.size(); ++id) {
    const Buffer &b = prog().buffers[id];
    if (b.role != Role::Param && b.role != Role::State)
      continue;
    const ShardSpec &spec = specOf(shards, prog(), id);
    ckpt::Tensor t;
    t.name = b.name;
    t.dtype = safetensorsDType(b.dtype);
    t.shape = spec.logicalShape;
    if (!holds(int(id))) {
      // Another pipeline stage's: its devices broadcast the whole tensor.
      if (Status s = receiveStageTensor(b, spec, t); !s)
        return s;
      c.tensors.push_back(std::move(t));
      continue;
    }
    t.bytes.resize(size_t(b.bytes));
    if (Status s = exec->read(int(id), t.bytes.data(), size_t(b.bytes)); !s)
      return s;
    if (spec.sharded()) {
      int elem = int(program::dtypeBytes(b.dtype));
      // Every block of `mine` over the devices of `axis`, in coordinate order.
      auto gather = [&](const std::string &axis, const std::string &mine,
                        std::string &all) -> Status {
        std::vector<int> group = axisGroup(prog().mesh, device, axis);
        if (group.size() <= 1) {
          all = mine;
          return Status::ok();
        }
        if (!comm)
          return Status::internal(fmt::format(
              "{}: '{}' is sharded over {} devices but this replica has no communicator",
              pkg.path, b.name, group.size()));
        all.assign(mine.size() * group.size(), '\0');
        if (Status s = comm->allGather(mine.data(), all.data(), int64_t(mine.size()) / elem,
                                       b.dtype, group);
            !s)
          return Status::error("gathering '" + b.name + "' for the checkpoint: " + s.message(),
                               s.kind());
        return Status::ok();
      };
      if (!spec.zeroAxis.empty()) {
        // ZeRO's blocks of this device's tensor-parallel block first.
        std::string blocks;
        if (Status s = gather(spec.zeroAxis, t.bytes, blocks); !s)
          return s;
        int64_t local = spec.logicalElements() /
                        int64_t(axisGroup(prog().mesh, device, spec.axis).size());
        t.bytes = joinBlocks(blocks, local, elem);
      }
      std::vector<int> group = axisGroup(prog().mesh, device, spec.axis);
      std::string all;
      if (Status s = gather(spec.axis, t.bytes, all); !s)
        return s;
      if (spec.perDim()) { // tensor-parallel: the blocks of dimension spec.dim
        auto joined = joinDimBlocks(all, spec.logicalShape, spec.dim,
                                    spec.outer, elem, int(group.size()),
                                    fmt::format("{}: '{}'", pkg.path, b.name));
        if (!joined)
          return joined.status();
        t.bytes = std::move(*joined);
      } else {
        t.bytes = joinBlocks(all, spec.logicalElements(), elem);
      }
    }
    if (b.stage >= 0) // the devices of the other stages receive it
      if (Status s = receiveStageTensor(b, spec, t); !s)
        return s;
    c.tensors.push_back(std::move(t));
  }
  return c;
}

std::vector<int> Model::dataInputs(const std::string &fn) const {
  std::vector<int> out;
  const program::Function *f = prog().function(fn);
  if (!f)
    return out;
  for (int id : f->args)
    if (prog().buffers[id].role == Role::Input && prog().buffers[id].name != "step" &&
        prog().buffers[id].name != "replica" && prog().buffers[id].name != "tp_rank")
      out.push_back(id);
  return out;
}

int Model::inputNamed(const std::string &fn, const std::string &name) const {
  const program::Function *f = prog().function(fn);
  if (!f)
    return -1;
  for (int id : f->args)
    if (prog().buffers[id].role == Role::Input && prog().buffers[id].name == name)
      return id;
  return -1;
}

int Model::stepInput(const std::string &fn) const { return inputNamed(fn, "step"); }

int Model::replicaInput(const std::string &fn) const { return inputNamed(fn, "replica"); }

int Model::tpRankInput(const std::string &fn) const { return inputNamed(fn, "tp_rank"); }

int Model::tpRank() const {
  int coord = 0;
  axisGroup(prog().mesh, device, "tp", &coord);
  return coord;
}

int Model::replica() const {
  int coord = 0;
  axisGroup(prog().mesh, device, "dp", &coord);
  return coord;
}

int Model::result(const std::string &fn, const std::string &name) const {
  const program::Function *f = prog().function(fn);
  if (!f)
    return -1;
  for (int id : f->results)
    if (prog().buffers[id].name == name)
      return id;
  return -1;
}

int64_t Model::vocabSize() const {
  const program::Function *p = prog().function("predict");
  if (!p || p->results.empty())
    return 0;
  return prog().buffers[p->results[0]].shape.back();
}

float Model::scalar(int id) {
  auto v = exec->scalar(id);
  return v ? *v : NAN;
}

Status storeInts(Backend &e, int id, const int64_t *values, int64_t n) {
  const Buffer &b = e.program().buffers[id];
  if (b.dtype == DType::I64)
    return e.write(id, values, size_t(n) * 8);
  std::vector<int32_t> narrow(values, values + n);
  return e.write(id, narrow.data(), size_t(n) * 4);
}

bool pathExists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

bool isDirectory(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string dirOf(const std::string &p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

std::string resolvePath(const std::string &p, const Package &pkg) {
  if (p.empty() || pathExists(p) || p[0] == '/')
    return p;
  std::string alt = dirOf(pkg.sourcePath) + "/" + p;
  return pathExists(alt) ? alt : p;
}

std::string defaultCheckpoint(const std::string &artifact) {
  std::string base = artifact;
  if (base.size() > 6 && base.compare(base.size() - 6, 6, ".kpack") == 0)
    base.resize(base.size() - 6);
  return base + ".ckpt.safetensors";
}

Status saveCheckpoint(Model &m, const std::string &path, int64_t nextStep, uint64_t seed,
                      bool write) {
  if (!write && !m.hasShardedState())
    return Status::ok();
  auto got = m.getPersistent();
  if (!got)
    return got.status();
  ckpt::Checkpoint c = std::move(*got);
  // Low copies are recomputed on load (Model::setPersistent): not stored.
  c.tensors.erase(std::remove_if(c.tensors.begin(), c.tensors.end(),
                                 [](const ckpt::Tensor &t) { return isLowCopy(t.name); }),
                  c.tensors.end());
  c.metadata["kiln.format"] = "kiln-checkpoint-1";
  c.metadata["step"] = std::to_string(nextStep);
  c.metadata["data_seed"] = std::to_string(seed);
  c.metadata["model"] = m.pkg.model;
  c.metadata["source_sha256"] = m.pkg.sourceHash;
  // No device count: the layout is logical, any device count resumes.
  if (!write)
    return Status::ok();
  return ckpt::write(path, c);
}

Expected<ckpt::Checkpoint> readCheckpoint(const Model &m, const std::string &path, bool quiet,
                                          const Sink &out) {
  auto c = ckpt::read(path);
  if (!c)
    return c.status();
  // As checkPersistent(), against the logical shapes (sharded buffers hold
  // a block, the checkpoint the whole tensor).
  for (size_t id = 0; id < m.prog().buffers.size(); ++id) {
    const Buffer &b = m.prog().buffers[id];
    if (b.role != Role::Param && b.role != Role::State)
      continue;
    std::vector<int64_t> shape =
        id < m.shards.size() ? m.shards[id].logicalShape : shardOf(b).logicalShape;
    const ckpt::Tensor *t = c->find(b.name);
    if (!t && (isLowCopy(b.name) || isScalerState(b.name)))
      continue; // derived on load, or the scaler's initial state
    if (!t)
      return Status::error(fmt::format(
          "{}: has no tensor '{}', which the model needs; was it written for "
          "another model?", path, b.name));
    if (t->dtype != safetensorsDType(b.dtype) || t->shape != shape)
      return Status::error(fmt::format(
          "{}: tensor '{}' is {} {}, the model needs {} {}; was it written for "
          "another model or configuration?", path, b.name, t->dtype, fmt::join(t->shape, "x"),
          safetensorsDType(b.dtype), fmt::join(shape, "x")));
  }
  auto hash = c->metadata.find("source_sha256");
  if (!quiet && hash != c->metadata.end() && hash->second != m.pkg.sourceHash)
    emit(out, Channel::Warning,
         fmt::format("{} was written by a different version of the model file; the shapes "
                     "match, continuing", path));
  return c;
}

int64_t checkpointStep(const ckpt::Checkpoint &c) {
  auto s = c.metadata.find("step");
  return s == c.metadata.end() ? 0 : std::strtoll(s->second.c_str(), nullptr, 10);
}

} // namespace kiln::train
