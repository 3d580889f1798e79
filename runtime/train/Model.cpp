//===- Model.cpp - A loaded artifact with its backend ---------------------===//
#include "runtime/train/Model.h"

#include "runtime/core/Half.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <map>
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
        prog().buffers[id].name != "replica" && prog().buffers[id].name != "tp_rank" &&
        prog().buffers[id].name != "stop")
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
  // The layout is logical (any device count loads it); the global batch,
  // the data consumed and the device count let a resume keep the batch
  // (Trainer::create refuses one that would change it).
  if (int64_t g = globalBatchRows(m); g > 0) {
    c.metadata["global_batch"] = std::to_string(g);
    c.metadata["data_samples"] = std::to_string(nextStep * g);
    c.metadata["dp_devices"] = std::to_string(dataParallelDevices(m));
  }
  if (!write)
    return Status::ok();
  return ckpt::write(path, c);
}

namespace {
/// A buffer's logical shape (a sharded buffer holds a block of it).
std::vector<int64_t> logicalShape(const Model &m, size_t id) {
  return id < m.shards.size() ? m.shards[id].logicalShape
                              : shardOf(m.prog().buffers[id]).logicalShape;
}

/// Optimizer state a Kiln checkpoint holds beside the parameters: a slot of
/// the optimizer ("m:P", "v:P", "momentum:P"), a low copy, the scaler's.
bool isOptimizerState(const std::string &name) {
  for (const char *slot : {"m:", "v:", "momentum:", kLowPrefix})
    if (name.rfind(slot, 0) == 0)
      return true;
  return isScalerState(name);
}

/// "'a', 'b', 'c' and 2 more".
std::string someNames(const std::vector<std::string> &names, size_t most = 3) {
  std::string s;
  for (size_t k = 0; k < names.size() && k < most; ++k)
    s += fmt::format("{}'{}'", k == 0 ? "" : ", ", names[k]);
  if (names.size() > most)
    s += fmt::format(" and {} more", names.size() - most);
  return s;
}

/// Names split at the last '.': the layer's prefix ("dense.linear.") and
/// the tensor in it ("weight").
std::pair<std::string, std::string> splitLayer(const std::string &name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::make_pair(std::string(), name)
                                  : std::make_pair(name.substr(0, dot + 1),
                                                   name.substr(dot + 1));
}

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

/// The model's parameter names closest to `name`, at most `most`: those
/// with the same last part ("weight") first, then by edit distance.
std::vector<std::string> closestParams(const Model &m, const std::string &name, size_t most) {
  std::vector<std::pair<size_t, std::string>> all;
  for (const Buffer &b : m.prog().buffers)
    if (b.role == Role::Param)
      all.push_back({editDistance(name, b.name) +
                         (splitLayer(name).second == splitLayer(b.name).second ? 0 : 1000),
                     b.name});
  std::stable_sort(all.begin(), all.end(),
                   [](const auto &x, const auto &y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t k = 0; k < all.size() && k < most; ++k)
    out.push_back(all[k].second);
  return out;
}
} // namespace

namespace {
/// "layer10." after "layer9.": digit runs compare as numbers.
bool naturalLess(const std::string &a, const std::string &b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit((unsigned char)a[i]) && std::isdigit((unsigned char)b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit((unsigned char)a[ie]))
        ++ie;
      while (je < b.size() && std::isdigit((unsigned char)b[je]))
        ++je;
      std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      x.erase(0, std::min(x.find_first_not_of('0'), x.size()));
      y.erase(0, std::min(y.find_first_not_of('0'), y.size()));
      if (x.size() != y.size())
        return x.size() < y.size();
      if (x != y)
        return x < y;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j])
      return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

/// --init-rename rules that would map the file's unmatched tensors onto the
/// parameters without one: both grouped into layers by prefix, the file's
/// in natural order ("0.", "2.", "10."), the model's in parameter order;
/// the i-th of each must hold the same tensor names with the same shapes.
/// Empty when they do not pair up so (or a tensor was renamed already).
std::vector<std::pair<std::string, std::string>> suggestRenames(
    const std::map<std::string, const ckpt::Tensor *> &unmatched,
    const std::vector<std::pair<std::string, std::vector<int64_t>>> &missing) {
  using Layer = std::map<std::string, std::vector<int64_t>>; // tensor -> shape
  std::vector<std::pair<std::string, Layer>> file, model;
  auto add = [](std::vector<std::pair<std::string, Layer>> &layers, const std::string &name,
                const std::vector<int64_t> &shape) {
    auto [prefix, leaf] = splitLayer(name);
    auto it = std::find_if(layers.begin(), layers.end(),
                           [&](const auto &l) { return l.first == prefix; });
    if (it == layers.end())
      it = layers.insert(layers.end(), {prefix, Layer()});
    it->second[leaf] = shape;
  };
  for (const auto &[name, t] : unmatched) {
    if (name != t->name)
      return {};
    add(file, name, t->shape);
  }
  for (const auto &[name, shape] : missing)
    add(model, name, shape);
  std::stable_sort(file.begin(), file.end(),
                   [](const auto &x, const auto &y) { return naturalLess(x.first, y.first); });
  if (file.empty() || file.size() != model.size())
    return {};
  std::vector<std::pair<std::string, std::string>> rules;
  for (size_t k = 0; k < file.size(); ++k) {
    // A prefix-less name ("weight") cannot be renamed by a prefix rule.
    if (file[k].second != model[k].second || file[k].first.empty())
      return {};
    if (file[k].first != model[k].first)
      rules.push_back({file[k].first, model[k].first});
  }
  // Every rule must touch only its own layer's tensors (longest prefix
  // wins, as the option applies them).
  for (const auto &[name, t] : unmatched) {
    const std::pair<std::string, std::string> *best = nullptr;
    for (const auto &r : rules)
      if (name.rfind(r.first, 0) == 0 && (!best || r.first.size() > best->first.size()))
        best = &r;
    if (best && best->first != splitLayer(name).first)
      return {};
  }
  return rules;
}
} // namespace

Expected<ckpt::Checkpoint> readCheckpoint(const Model &m, const std::string &path, bool quiet,
                                          const Sink &out, CheckpointUse use) {
  auto c = ckpt::read(path);
  if (!c)
    return c.status();
  auto meta = c->metadata.find("model");
  std::string theirs = meta == c->metadata.end() ? "" : meta->second;
  // Refused: why, then both models and what to do instead.
  auto refuse = [&](const std::string &why) {
    std::string whose = theirs.empty() ? "it names no model"
                                       : fmt::format("it was written by model '{}'", theirs);
    std::string advice =
        use == CheckpointUse::Resume
            ? fmt::format("--resume continues a run of the same model and optimizer; to start "
                          "from its parameters with fresh optimizer state, use --init {} "
                          "instead",
                          path)
            : fmt::format("Use the artifact of the model that wrote it, or train this one "
                          "from its parameters with kiln-run train {} --init {}",
                          m.pkg.path, path);
    return Status::error(fmt::format("{}: {}; {}, and {} is model '{}'. {}", path, why, whose,
                                     m.pkg.path, m.pkg.model, advice));
  };
  if (!theirs.empty() && !m.pkg.model.empty() && theirs != m.pkg.model)
    return refuse("a checkpoint of another model");
  // As checkPersistent(), against the logical shapes (sharded buffers hold
  // a block, the checkpoint the whole tensor).
  std::vector<std::string> missing, known;
  for (size_t id = 0; id < m.prog().buffers.size(); ++id) {
    const Buffer &b = m.prog().buffers[id];
    if (b.role != Role::Param && b.role != Role::State)
      continue;
    known.push_back(b.name);
    std::vector<int64_t> shape = logicalShape(m, id);
    const ckpt::Tensor *t = c->find(b.name);
    if (!t && (isLowCopy(b.name) || isScalerState(b.name)))
      continue; // derived on load, or the scaler's initial state
    if (!t) {
      missing.push_back(b.name);
      continue;
    }
    if (t->dtype != safetensorsDType(b.dtype) || t->shape != shape)
      return refuse(fmt::format("tensor '{}' is {} {}, the model needs {} {}", b.name, t->dtype,
                                fmt::join(t->shape, "x"), safetensorsDType(b.dtype),
                                fmt::join(shape, "x")));
  }
  if (!missing.empty())
    return refuse(fmt::format("has no tensor {}, which the model needs", someNames(missing)));
  // Tensors the model has no place for: another optimizer's state (an Adam
  // model's moments resumed into an SGD build) or another model's.
  std::vector<std::string> extra;
  for (const ckpt::Tensor &t : c->tensors)
    if (!isLowCopy(t.name) && !isScalerState(t.name) &&
        std::find(known.begin(), known.end(), t.name) == known.end())
      extra.push_back(t.name);
  bool allState = std::all_of(extra.begin(), extra.end(), isOptimizerState);
  if (!extra.empty())
    return refuse(fmt::format("holds {} tensor{} the model has no place for ({}){}",
                              extra.size(), extra.size() == 1 ? "" : "s", someNames(extra),
                              allState ? ": the state of another optimizer than this model's"
                                       : ""));
  auto hash = c->metadata.find("source_sha256");
  if (!quiet && hash != c->metadata.end() && hash->second != m.pkg.sourceHash)
    emit(out, Channel::Warning,
         fmt::format("{} was written by a different version of the model file; the tensors "
                     "match, continuing", path));
  return c;
}

Status initWithResume(const std::string &init, const std::string &resume) {
  if (init.empty() || resume.empty())
    return Status::ok();
  return Status::error(fmt::format(
      "--init {} and --resume {} together: --resume continues a run (parameters, optimizer "
      "state, step), --init starts one from parameters; give one of them",
      init, resume));
}

Expected<std::pair<std::string, std::string>> parseInitRename(const std::string &value) {
  size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::error(fmt::format(
        "--init-rename needs FROM=TO (a prefix of the file's tensor names and what it becomes, "
        "e.g. --init-rename 0.=dense.linear.), got '{}'",
        value));
  return std::make_pair(value.substr(0, eq), value.substr(eq + 1));
}

Expected<ckpt::Checkpoint> readInitWeights(const Model &m, const InitWeights &w, bool quiet,
                                           const Sink &out) {
  auto file = ckpt::read(w.path);
  if (!file)
    return file.status();
  const std::string &path = w.path;
  bool kilnCheckpoint = file->metadata.count("kiln.format") > 0;
  auto ignored = [&](const std::string &name) {
    for (const std::string &g : w.ignore)
      if (g == name || (!g.empty() && g.back() == '*' &&
                        name.compare(0, g.size() - 1, g, 0, g.size() - 1) == 0))
        return true;
    return false;
  };
  auto renamed = [&](const std::string &name) {
    const std::pair<std::string, std::string> *best = nullptr;
    for (const auto &r : w.renames)
      if (name.rfind(r.first, 0) == 0 && (!best || r.first.size() > best->first.size()))
        best = &r;
    return best ? best->second + name.substr(best->first.size()) : name;
  };
  // The file's tensors by the name they match (after --init-rename).
  std::map<std::string, const ckpt::Tensor *> byName;
  std::vector<std::string> problems;
  auto shown = [&](const std::string &fileName, const std::string &name) {
    return fileName == name ? fmt::format("'{}'", name)
                            : fmt::format("'{}' (renamed from '{}')", name, fileName);
  };
  int skippedState = 0, skippedIgnored = 0;
  for (const ckpt::Tensor &t : file->tensors) {
    if (ignored(t.name)) {
      ++skippedIgnored;
      continue;
    }
    if (kilnCheckpoint && isOptimizerState(t.name)) {
      ++skippedState; // --init starts the optimizer afresh
      continue;
    }
    std::string name = renamed(t.name);
    auto [at, fresh] = byName.insert({name, &t});
    if (!fresh)
      problems.push_back(fmt::format(
          "tensors '{}' and '{}' both become '{}'; change the --init-rename rules",
          at->second->name, t.name, name));
  }
  ckpt::Checkpoint c = m.pkg.initial;
  c.metadata.clear(); // step 0, no model: a fresh run
  // Low copies: derived from the loaded parameters by setPersistent.
  c.tensors.erase(std::remove_if(c.tensors.begin(), c.tensors.end(),
                                 [](const ckpt::Tensor &t) { return isLowCopy(t.name); }),
                  c.tensors.end());
  std::map<std::string, int> converted; // dtype -> tensors
  int loaded = 0;
  std::vector<std::string> missing;
  std::vector<std::pair<std::string, std::vector<int64_t>>> missingShapes;
  for (size_t id = 0; id < m.prog().buffers.size(); ++id) {
    const Buffer &b = m.prog().buffers[id];
    if (b.role != Role::Param)
      continue;
    std::vector<int64_t> shape = logicalShape(m, id);
    auto found = byName.find(b.name);
    if (found == byName.end()) {
      missing.push_back(fmt::format("'{}' ({})", b.name, fmt::join(shape, "x")));
      missingShapes.push_back({b.name, shape});
      continue;
    }
    const ckpt::Tensor &t = *found->second;
    std::string what = shown(t.name, b.name);
    byName.erase(found);
    if (t.shape != shape) {
      bool transposed = t.shape.size() == 2 && shape.size() == 2 && t.shape[0] == shape[1] &&
                        t.shape[1] == shape[0];
      problems.push_back(fmt::format(
          "tensor {} is {}, the model's parameter is {}{}", what, fmt::join(t.shape, "x"),
          fmt::join(shape, "x"),
          transposed ? ": it is the transpose (Kiln's linear weights are [out, in], as "
                       "PyTorch's nn.Linear; a [in, out] kernel, e.g. Flax's or Keras', must "
                       "be saved transposed)"
                     : "; was the file written for another configuration of the model?"));
      continue;
    }
    std::string want = safetensorsDType(b.dtype);
    ckpt::Tensor *dst = nullptr;
    for (ckpt::Tensor &d : c.tensors)
      if (d.name == b.name)
        dst = &d;
    if (!dst)
      return Status::internal(fmt::format("{}: no initial value for '{}'", m.pkg.path, b.name));
    dst->shape = shape;
    if (t.dtype == want) {
      dst->bytes = t.bytes;
    } else if (b.dtype == DType::F32 &&
               (t.dtype == "F64" || t.dtype == "F16" || t.dtype == "BF16")) {
      size_t n = t.bytes.size() / size_t(ckpt::dtypeWidth(t.dtype));
      dst->bytes.assign(n * 4, '\0');
      for (size_t k = 0; k < n; ++k) {
        float f;
        if (t.dtype == "F64") {
          double d;
          std::memcpy(&d, t.bytes.data() + k * 8, 8);
          f = float(d);
        } else {
          uint16_t h;
          std::memcpy(&h, t.bytes.data() + k * 2, 2);
          f = halfToFloat(t.dtype == "F16" ? DType::F16 : DType::BF16, h);
        }
        std::memcpy(&dst->bytes[k * 4], &f, 4);
      }
      ++converted[t.dtype];
    } else {
      problems.push_back(fmt::format("tensor {} is {}, the model's parameter is {}{}", what,
                                     t.dtype, want,
                                     b.dtype == DType::F32
                                         ? " (F64, F16 and BF16 are converted; save it as "
                                           "floating point)"
                                         : ""));
      continue;
    }
    ++loaded;
  }
  if (!missing.empty())
    problems.push_back(fmt::format(
        "no tensor for parameter{} {}; name the file's tensors as the model's parameters "
        "(kilnc MODEL.kiln lists them) or map them with --init-rename FROM=TO",
        missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
  // Another framework's names for the same layers (nn.Sequential's "0.",
  // "2.", ...): the rules that map them, when there is exactly one way.
  std::vector<std::pair<std::string, std::string>> rules =
      suggestRenames(byName, missingShapes);
  if (!rules.empty()) {
    std::string flags;
    for (const auto &[from, to] : rules)
      flags += fmt::format(" --init-rename {}={}", from, to);
    problems.push_back(fmt::format(
        "the file's layers match the model's in order and shape under other names: add{}",
        flags));
  }
  // What is left matched no parameter.
  for (const auto &[name, t] : byName) {
    std::vector<std::string> near = closestParams(m, name, 3);
    problems.push_back(fmt::format(
        "tensor {} is not a parameter of the model (closest: {}); map it with --init-rename "
        "FROM=TO, or leave it out with --init-ignore {}",
        shown(t->name, name), someNames(near), t->name));
  }
  if (!problems.empty()) {
    std::string text = fmt::format("--init {} does not fit model '{}' ({}):", path,
                                   m.pkg.model, m.pkg.path);
    for (const std::string &p : problems)
      text += "\n  " + p;
    return Status::error(text);
  }
  if (!quiet) {
    for (const auto &[dtype, n] : converted)
      emit(out, Channel::Note,
           fmt::format("--init {}: converted {} {} tensor{} to float32", path, n, dtype,
                       n == 1 ? "" : "s"));
    std::string skipped;
    if (skippedState)
      skipped += fmt::format("; skipped its {} optimizer-state tensor{}", skippedState,
                             skippedState == 1 ? "" : "s");
    if (skippedIgnored)
      skipped += fmt::format("; ignored {} tensor{} (--init-ignore)", skippedIgnored,
                             skippedIgnored == 1 ? "" : "s");
    emit(out, Channel::Note,
         fmt::format("initialized the {} parameter{} of {} from {}{}; optimizer state fresh",
                     loaded, loaded == 1 ? "" : "s", m.pkg.model, path, skipped));
  }
  return c;
}

int64_t checkpointStep(const ckpt::Checkpoint &c) {
  auto s = c.metadata.find("step");
  return s == c.metadata.end() ? 0 : std::strtoll(s->second.c_str(), nullptr, 10);
}

int64_t dataParallelDevices(const Model &m) {
  int a = m.prog().mesh.axis("dp");
  return a < 0 ? 1 : std::max<int64_t>(1, m.prog().mesh.axes[size_t(a)].size);
}

int64_t globalBatchRows(const Model &m) {
  if (!m.prog().function("train_step"))
    return 0;
  std::vector<int> in = m.dataInputs("train_step");
  if (in.empty())
    return 0;
  const program::Buffer &first = m.prog().buffers[size_t(in[0])];
  int64_t rows = first.shape.empty() ? 1 : first.shape[0];
  return rows * dataParallelDevices(m);
}

CheckpointBatch checkpointBatch(const ckpt::Checkpoint &c) {
  auto get = [&](const char *key) -> int64_t {
    auto s = c.metadata.find(key);
    return s == c.metadata.end() ? 0 : std::strtoll(s->second.c_str(), nullptr, 10);
  };
  return {get("global_batch"), get("dp_devices")};
}

} // namespace kiln::train
