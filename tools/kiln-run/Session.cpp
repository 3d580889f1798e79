//===- Session.cpp - train / eval / sample / check on any backend ---------===//
//
// The driver side of a run: loads and verifies the artifact, prepares its
// kernels on the chosen backend (CPU JIT, disk-cached; CUDA or its
// emulator), binds data files to the entry points'
// inputs, and runs @train_step / @eval_step / @predict. Checkpoints hold
// every parameter and optimizer-state tensor plus the next step; since the
// program derives data windows and dropout seeds from (seed, step), resuming
// from a checkpoint repeats an uninterrupted run bit for bit (same thread
// count).
//
//===----------------------------------------------------------------------===//
#include "tools/kiln-run/Session.h"

#include "runtime/core/Half.h"

#include "runtime/core/Checkpoint.h"
#include "runtime/core/Data.h"
#include "runtime/core/Package.h"
#include "runtime/core/Random.h"
#include "runtime/core/Backend.h"
#include "tools/kiln-run/Backends.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <memory>
#include <numeric>
#include <optional>
#include <sys/stat.h>
#include <thread>

namespace kiln::run {

namespace {

using program::Buffer;
using program::DType;
using program::Role;

int fail(const Status &s) {
  fmt::print(stderr, "kiln-run: error: {}\n", s.message());
  return s.exitCode() ? s.exitCode() : 1;
}
int usage(const std::string &m) {
  fmt::print(stderr, "kiln-run: error: {} (see kiln-run --help)\n", m);
  return 1;
}

bool exists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
bool isDir(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
std::string dirOf(const std::string &p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

/// Command-line flags shared by the three commands.
struct Flags {
  std::string artifact;
  int64_t steps = -1, logInterval = 10, evalInterval = -1, evalSteps = -1;
  int64_t checkpointEvery = -1, tokens = 200, topK = 0;
  int threads = 0;
  std::string device = "cpu"; ///< cpu, cuda, cuda:N, cuda-emu
  std::string data, valData, checkpoint, resume, cacheDir, vocab, lossLog;
  std::string prompt = "\n";
  double temperature = 0.8;
  double tolerance = 1e-4;   ///< kiln-run check
  std::string against = "cpu"; ///< kiln-run check: the reference device
  uint64_t seed = 0;
  bool seedSet = false, profile = false, noCache = false, quiet = false;
  bool inOrder = false; ///< .npy training data in file order, no shuffling
};

Status parseFlags(const std::vector<std::string> &args, Flags &f) {
  auto intArg = [](const std::string &name, const std::string &v, int64_t lo,
                   int64_t &out) -> Status {
    char *end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || x < lo)
      return Status::error(fmt::format("{} needs an integer >= {}, got '{}'", name, lo, v));
    out = x;
    return Status::ok();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&](std::string &out) -> Status {
      if (i + 1 >= args.size())
        return Status::error(a + " needs a value");
      out = args[++i];
      return Status::ok();
    };
    std::string v;
    Status s = Status::ok();
    int64_t n = 0;
    if (a == "--steps") { if ((s = value(v))) s = intArg(a, v, 1, f.steps); }
    else if (a == "--log-interval") { if ((s = value(v))) s = intArg(a, v, 1, f.logInterval); }
    else if (a == "--eval-interval") { if ((s = value(v))) s = intArg(a, v, 0, f.evalInterval); }
    else if (a == "--eval-steps") { if ((s = value(v))) s = intArg(a, v, 1, f.evalSteps); }
    else if (a == "--checkpoint-every") { if ((s = value(v))) s = intArg(a, v, 0, f.checkpointEvery); }
    else if (a == "--tokens") { if ((s = value(v))) s = intArg(a, v, 1, f.tokens); }
    else if (a == "--top-k") { if ((s = value(v))) s = intArg(a, v, 0, f.topK); }
    else if (a == "--threads") { if ((s = value(v))) { s = intArg(a, v, 1, n); f.threads = int(n); } }
    else if (a == "--seed") { if ((s = value(v))) { s = intArg(a, v, 0, n); f.seed = uint64_t(n); f.seedSet = true; } }
    else if (a == "--tolerance" || a == "--against") {
      if ((s = value(v))) {
        if (a == "--against")
          f.against = v;
        else {
          char *end = nullptr;
          f.tolerance = std::strtod(v.c_str(), &end);
          if (*end || !(f.tolerance > 0))
            s = Status::error("--tolerance needs a number > 0");
        }
      }
    }
    else if (a == "--temperature") {
      if ((s = value(v))) {
        char *end = nullptr;
        f.temperature = std::strtod(v.c_str(), &end);
        if (*end || !(f.temperature >= 0) || !std::isfinite(f.temperature))
          s = Status::error("--temperature needs a number >= 0");
      }
    }
    else if (a == "--device") s = value(f.device);
    else if (a == "--data") s = value(f.data);
    else if (a == "--val-data") s = value(f.valData);
    else if (a == "--checkpoint") s = value(f.checkpoint);
    else if (a == "--resume") s = value(f.resume);
    else if (a == "--cache-dir") s = value(f.cacheDir);
    else if (a == "--vocab") s = value(f.vocab);
    else if (a == "--prompt") s = value(f.prompt);
    else if (a == "--loss-log") s = value(f.lossLog);
    else if (a == "--profile") f.profile = true;
    else if (a == "--in-order") f.inOrder = true;
    else if (a == "--no-cache") f.noCache = true;
    else if (a == "--quiet") f.quiet = true;
    else if (a.rfind("--", 0) == 0) s = Status::error("unknown option '" + a + "'");
    else if (f.artifact.empty()) f.artifact = a;
    else s = Status::error("unexpected argument '" + a + "'");
    if (!s)
      return s;
  }
  if (f.artifact.empty())
    return Status::error("no artifact given (MODEL.kpack, from kilnc MODEL.kiln -o MODEL.kpack)");
  if (f.threads == 0)
    f.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return Status::ok();
}

/// A loaded artifact with its backend and persistent values in place.
struct Model {
  Package pkg;
  std::unique_ptr<Backend> exec;

  /// Reads and verifies the artifact; no code is generated yet, so data
  /// files can be checked before the (possibly long) kernel compile.
  static Expected<std::unique_ptr<Model>> open(const Flags &f) {
    auto pkg = Package::open(f.artifact);
    if (!pkg)
      return pkg.status();
    auto m = std::make_unique<Model>();
    m->pkg = std::move(*pkg);
    return m;
  }

  /// Compiles or loads the kernels for the device and sets up the arena
  /// with the initial parameters and state.
  Status compile(const Flags &f) {
    BackendOptions o;
    o.device = f.device;
    o.artifact = f.artifact;
    o.threads = f.threads;
    o.cacheDir = f.cacheDir;
    o.noCache = f.noCache;
    o.quiet = f.quiet;
    auto created = makeBackend(pkg, o);
    if (!created)
      return created.status();
    exec = std::move(*created);
    exec->setProfiling(f.profile);
    return setPersistent(pkg.initial);
  }

  const program::Program &prog() const { return pkg.program; }

  Status setPersistent(const ckpt::Checkpoint &c) {
    for (size_t id = 0; id < prog().buffers.size(); ++id) {
      const Buffer &b = prog().buffers[id];
      if (b.role != Role::Param && b.role != Role::State)
        continue;
      const ckpt::Tensor *t = c.find(b.name);
      if (Status s = exec->write(int(id), t->bytes.data(), t->bytes.size()); !s)
        return s;
    }
    return Status::ok();
  }
  Expected<ckpt::Checkpoint> getPersistent() {
    ckpt::Checkpoint c;
    for (size_t id = 0; id < prog().buffers.size(); ++id) {
      const Buffer &b = prog().buffers[id];
      if (b.role != Role::Param && b.role != Role::State)
        continue;
      ckpt::Tensor t;
      t.name = b.name;
      t.dtype = safetensorsDType(b.dtype);
      t.shape = b.shape;
      t.bytes.resize(size_t(b.bytes));
      if (Status s = exec->read(int(id), t.bytes.data(), size_t(b.bytes)); !s)
        return s;
      c.tensors.push_back(std::move(t));
    }
    return c;
  }

  /// Data inputs of `fn` (its Input buffers other than "step").
  std::vector<int> dataInputs(const std::string &fn) const {
    std::vector<int> out;
    for (int id : prog().function(fn)->args)
      if (prog().buffers[id].role == Role::Input && prog().buffers[id].name != "step")
        out.push_back(id);
    return out;
  }
  int stepInput(const std::string &fn) const {
    for (int id : prog().function(fn)->args)
      if (prog().buffers[id].role == Role::Input && prog().buffers[id].name == "step")
        return id;
    return -1;
  }
  int result(const std::string &fn, const std::string &name) const {
    for (int id : prog().function(fn)->results)
      if (prog().buffers[id].name == name)
        return id;
    return -1;
  }
  /// Vocabulary size, from @predict's logits (last dimension), or 0.
  int64_t vocabSize() const {
    const program::Function *p = prog().function("predict");
    if (!p || p->results.empty())
      return 0;
    return prog().buffers[p->results[0]].shape.back();
  }
  /// A float32 scalar result (NaN when it cannot be read).
  float scalar(int id) {
    auto v = exec->scalar(id);
    return v ? *v : NAN;
  }
};

/// Writes `values` (int64) into an integer buffer of its dtype.
Status storeInts(Backend &e, int id, const int64_t *values, int64_t n) {
  const Buffer &b = e.program().buffers[id];
  if (b.dtype == DType::I64)
    return e.write(id, values, size_t(n) * 8);
  std::vector<int32_t> narrow(values, values + n);
  return e.write(id, narrow.data(), size_t(n) * 4);
}

/// One batch: the bytes of each data input, ready to copy into its buffer.
struct Batch {
  std::vector<std::string> bytes;
};

class DataSource {
public:
  virtual ~DataSource() = default;
  virtual Batch batch(uint64_t index) const = 0;
  virtual std::string describe() const = 0;
  /// Batches in one pass over the data (0: unbounded, sampled windows).
  virtual int64_t epochBatches() const { return 0; }
};

/// Random (x, y) windows of a token file: x is the first data input, y the
/// second (y[i] = x[i + 1]); windows depend only on (seed, index).
class TokenSource : public DataSource {
public:
  static Expected<std::unique_ptr<DataSource>> open(const std::string &path,
                                                    const Model &m,
                                                    const std::vector<int> &inputs,
                                                    uint64_t seed) {
    const auto &bufs = m.prog().buffers;
    if (inputs.size() != 2)
      return Status::error(fmt::format(
          "{} is a token file, but the model takes {} data inputs; token files feed "
          "language models with two integer inputs (tokens, targets) of shape [batch, "
          "context]", path, inputs.size()));
    for (int id : inputs)
      if ((bufs[id].dtype != DType::I32 && bufs[id].dtype != DType::I64) ||
          bufs[id].shape.size() != 2 || bufs[id].shape != bufs[inputs[0]].shape)
        return Status::error(fmt::format(
            "{} is a token file, but input '{}' is not an integer [batch, context] tensor",
            path, bufs[id].name));
    auto src = std::make_unique<TokenSource>();
    src->batch_ = bufs[inputs[0]].shape[0];
    src->context_ = bufs[inputs[0]].shape[1];
    src->seed_ = seed;
    src->wide_[0] = bufs[inputs[0]].dtype == DType::I64;
    src->wide_[1] = bufs[inputs[1]].dtype == DType::I64;
    auto file = data::TokenFile::open(path, data::TokenFile::Width::U16, src->context_,
                                      m.vocabSize());
    if (!file)
      return file.status();
    src->file_ = std::make_unique<data::TokenFile>(std::move(*file));
    return std::unique_ptr<DataSource>(std::move(src));
  }
  Batch batch(uint64_t index) const override {
    std::vector<int32_t> x, y;
    file_->sampleWindows(seed_, index, batch_, context_, x, y);
    Batch b;
    for (int k = 0; k < 2; ++k) {
      const std::vector<int32_t> &v = k == 0 ? x : y;
      if (wide_[k]) {
        std::vector<int64_t> w(v.begin(), v.end());
        b.bytes.emplace_back(reinterpret_cast<const char *>(w.data()), w.size() * 8);
      } else {
        b.bytes.emplace_back(reinterpret_cast<const char *>(v.data()), v.size() * 4);
      }
    }
    return b;
  }
  std::string describe() const override {
    return fmt::format("{} ({} tokens; random windows of {})", file_->path(),
                       file_->size(), context_);
  }

private:
  std::unique_ptr<data::TokenFile> file_;
  int64_t batch_ = 0, context_ = 0;
  uint64_t seed_ = 0;
  bool wide_[2] = {false, false};
};

/// .npy arrays, one per data input (DIR/<input name>.npy), the same number
/// of rows each; batch i of a shuffled source takes rows of a permutation
/// drawn per epoch from (seed, epoch); an ordered source (evaluation) reads
/// rows in file order.
class NpySource : public DataSource {
public:
  static Expected<std::unique_ptr<DataSource>> open(const std::string &dir,
                                                    const Model &m,
                                                    const std::vector<int> &inputs,
                                                    uint64_t seed, bool shuffle) {
    auto src = std::make_unique<NpySource>();
    src->seed_ = seed;
    src->shuffle_ = shuffle;
    for (int id : inputs) {
      const Buffer &b = m.prog().buffers[id];
      std::string path = dir + "/" + b.name + ".npy";
      if (!exists(path))
        return Status::error(fmt::format(
            "{}: no file for input '{}'; a data directory holds one .npy array per "
            "input, named after it", path, b.name));
      auto a = data::readNpy(path);
      if (!a)
        return a.status();
      std::vector<int64_t> row(b.shape.begin() + 1, b.shape.end());
      std::vector<int64_t> got(a->shape.begin() + (a->shape.empty() ? 0 : 1), a->shape.end());
      if (a->shape.empty() || got != row)
        return Status::error(fmt::format(
            "{}: shape [{}] does not fit input '{}' of shape [{}]: expected [N, {}]",
            path, fmt::join(a->shape, ", "), b.name, fmt::join(b.shape, ", "),
            fmt::join(row, ", ")));
      bool wantFloat = b.dtype == DType::F32 || b.dtype == DType::F64;
      if (a->isFloat() != wantFloat)
        return Status::error(fmt::format(
            "{}: dtype {} does not fit input '{}' ({}): expected {} data", path,
            a->descr, b.name, program::dtypeName(b.dtype), wantFloat ? "floating-point" : "integer"));
      if (!src->arrays_.empty() && a->shape[0] != src->rows_)
        return Status::error(fmt::format("{}: {} rows, but the other inputs have {}",
                                         path, a->shape[0], src->rows_));
      src->rows_ = a->shape[0];
      src->batch_ = b.shape[0];
      src->dtypes_.push_back(b.dtype);
      src->rowElems_.push_back(b.numElements() / b.shape[0]);
      src->paths_.push_back(path);
      src->arrays_.push_back(std::move(*a));
    }
    if (src->rows_ < src->batch_)
      return Status::error(fmt::format("{}: {} rows, fewer than one batch of {}", dir,
                                       src->rows_, src->batch_));
    return std::unique_ptr<DataSource>(std::move(src));
  }
  Batch batch(uint64_t index) const override {
    Batch out;
    out.bytes.resize(arrays_.size());
    for (int64_t r = 0; r < batch_; ++r) {
      int64_t row = rowAt(index * uint64_t(batch_) + uint64_t(r));
      for (size_t k = 0; k < arrays_.size(); ++k) {
        const data::NpyArray &a = arrays_[k];
        int64_t n = rowElems_[k];
        for (int64_t e = 0; e < n; ++e) {
          int64_t at = row * n + e;
          switch (dtypes_[k]) {
          case DType::F32: { float v = float(a.f[at]); out.bytes[k].append((char *)&v, 4); break; }
          case DType::F64: { double v = a.f[at]; out.bytes[k].append((char *)&v, 8); break; }
          case DType::I64: { int64_t v = a.i[at]; out.bytes[k].append((char *)&v, 8); break; }
          default: { int32_t v = int32_t(a.i[at]); out.bytes[k].append((char *)&v, 4); break; }
          }
        }
      }
    }
    return out;
  }
  std::string describe() const override {
    return fmt::format("{} ({} rows{})", fmt::join(paths_, ", "), rows_,
                       shuffle_ ? ", shuffled per epoch" : "");
  }
  int64_t epochBatches() const override { return rows_ / batch_; }

private:
  int64_t rowAt(uint64_t position) const {
    uint64_t epoch = position / uint64_t(rows_), at = position % uint64_t(rows_);
    if (!shuffle_)
      return int64_t(at);
    std::lock_guard<std::mutex> lock(mu_);
    if (permEpoch_ != int64_t(epoch)) {
      perm_.resize(size_t(rows_));
      std::iota(perm_.begin(), perm_.end(), 0);
      for (int64_t i = rows_ - 1; i > 0; --i) {
        uint64_t r = random::bits(seed_, 0x5eedda7aULL + epoch, uint64_t(i));
        std::swap(perm_[size_t(i)], perm_[size_t(r % uint64_t(i + 1))]);
      }
      permEpoch_ = int64_t(epoch);
    }
    return perm_[size_t(at)];
  }
  std::vector<data::NpyArray> arrays_;
  std::vector<DType> dtypes_;
  std::vector<int64_t> rowElems_;
  std::vector<std::string> paths_;
  int64_t rows_ = 0, batch_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
  mutable std::mutex mu_;
  mutable std::vector<int64_t> perm_;
  mutable int64_t permEpoch_ = -1;
};

/// Finds a data path: as given, else next to the model file.
std::string resolvePath(const std::string &p, const Package &pkg) {
  if (p.empty() || exists(p) || p[0] == '/')
    return p;
  std::string alt = dirOf(pkg.sourcePath) + "/" + p;
  return exists(alt) ? alt : p;
}

Expected<std::unique_ptr<DataSource>> openData(const std::string &path, const Model &m,
                                               const std::string &fn, uint64_t seed,
                                               bool shuffle, const char *what) {
  if (path.empty())
    return Status::error(fmt::format(
        "no {} data: name it in the model's train section ({} = \"...\") or pass "
        "--{} PATH (a token file, or a directory of .npy arrays named after the inputs)",
        what, std::string(what) == "training" ? "data" : "val_data",
        std::string(what) == "training" ? "data" : "val-data"));
  if (!exists(path))
    return Status::error(fmt::format(
        "{} data '{}' does not exist{}", what, path,
        path.find(".bin") != std::string::npos
            ? "; for the shakespeare_char examples run: kiln-run prepare "
              "examples/data/tinyshakespeare.txt data/shakespeare_char"
            : ""));
  std::vector<int> inputs = m.dataInputs(fn);
  if (isDir(path))
    return NpySource::open(path, m, inputs, seed, shuffle);
  return TokenSource::open(path, m, inputs, seed);
}

Status copyBatch(Backend &e, const std::vector<int> &inputs, const Batch &b) {
  for (size_t k = 0; k < inputs.size(); ++k)
    if (Status s = e.write(inputs[k], b.bytes[k].data(), b.bytes[k].size()); !s)
      return s;
  return Status::ok();
}

struct EvalResult {
  double loss = 0;
  double accuracy = -1; ///< classifiers only
  int64_t batches = 0;
};

/// Mean @eval_step loss over `batches` batches of `src` (and accuracy when
/// @predict gives [batch, classes] logits and an input holds [batch] labels).
EvalResult evaluate(Model &m, const DataSource &src, int64_t batches) {
  EvalResult r;
  std::vector<int> inputs = m.dataInputs("eval_step");
  int lossId = m.prog().function("eval_step")->results[0];
  const program::Function *pred = m.prog().function("predict");
  int logitsId = pred && !pred->results.empty() ? pred->results[0] : -1;
  int labelsIn = -1;
  std::vector<int> predInputs = m.dataInputs("predict");
  bool classify = logitsId >= 0 && m.prog().buffers[logitsId].shape.size() == 2;
  if (classify)
    for (size_t k = 0; k < inputs.size(); ++k)
      if (m.prog().buffers[inputs[k]].shape.size() == 1 &&
          m.prog().buffers[inputs[k]].dtype != DType::F32)
        labelsIn = int(k);
  int64_t correct = 0, total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = src.batch(uint64_t(i));
    (void)copyBatch(*m.exec, inputs, b);
    (void)m.exec->run("eval_step");
    r.loss += m.scalar(lossId);
    if (classify && labelsIn >= 0) {
      // @predict's inputs are @eval_step's minus the unused ones, by name.
      for (int id : predInputs)
        for (size_t k = 0; k < inputs.size(); ++k)
          if (m.prog().buffers[inputs[k]].name == m.prog().buffers[id].name)
            (void)m.exec->write(id, b.bytes[k].data(), b.bytes[k].size());
      (void)m.exec->run("predict");
      const Buffer &lb = m.prog().buffers[logitsId];
      int64_t rows = lb.shape[0], classes = lb.shape[1];
      auto all = m.exec->readAll<float>(logitsId);
      if (!all)
        break;
      const float *logits = all->data();
      for (int64_t row = 0; row < rows; ++row) {
        int64_t best = std::max_element(logits + row * classes, logits + (row + 1) * classes) -
                       (logits + row * classes);
        int64_t label = m.prog().buffers[inputs[labelsIn]].dtype == DType::I64
                            ? reinterpret_cast<const int64_t *>(b.bytes[labelsIn].data())[row]
                            : reinterpret_cast<const int32_t *>(b.bytes[labelsIn].data())[row];
        correct += best == label;
        ++total;
      }
    }
  }
  r.batches = batches;
  r.loss /= double(std::max<int64_t>(batches, 1));
  if (total)
    r.accuracy = double(correct) / double(total);
  return r;
}

std::atomic<bool> gInterrupted{false};
extern "C" void onSigint(int) {
  gInterrupted = true;
  std::signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the process at once
}

std::string duration(double s) {
  if (s < 60)
    return fmt::format("{:.0f}s", s);
  if (s < 3600)
    return fmt::format("{}m{:02}s", int(s) / 60, int(s) % 60);
  return fmt::format("{}h{:02}m", int(s) / 3600, (int(s) % 3600) / 60);
}

std::string defaultCheckpoint(const std::string &artifact) {
  std::string base = artifact;
  if (base.size() > 6 && base.compare(base.size() - 6, 6, ".kpack") == 0)
    base.resize(base.size() - 6);
  return base + ".ckpt.safetensors";
}

Status saveCheckpoint(Model &m, const std::string &path, int64_t nextStep,
                      uint64_t seed) {
  auto got = m.getPersistent();
  if (!got)
    return got.status();
  ckpt::Checkpoint c = std::move(*got);
  c.metadata["kiln.format"] = "kiln-checkpoint-1";
  c.metadata["step"] = std::to_string(nextStep);
  c.metadata["data_seed"] = std::to_string(seed);
  c.metadata["model"] = m.pkg.model;
  c.metadata["source_sha256"] = m.pkg.sourceHash;
  return ckpt::write(path, c);
}

/// Reads a checkpoint and checks it against the model (before any code is
/// generated); Model::setPersistent applies it once the arena exists.
Expected<ckpt::Checkpoint> readCheckpoint(const Model &m, const std::string &path,
                                          bool quiet) {
  auto c = ckpt::read(path);
  if (!c)
    return c.status();
  if (Status s = checkPersistent(m.prog(), *c, path); !s)
    return s;
  auto hash = c->metadata.find("source_sha256");
  if (!quiet && hash != c->metadata.end() && hash->second != m.pkg.sourceHash)
    fmt::print(stderr, "kiln-run: warning: {} was written by a different version of "
                       "the model file; the shapes match, continuing\n", path);
  return c;
}

/// The step a checkpoint continues from (0 when it does not say).
int64_t checkpointStep(const ckpt::Checkpoint &c) {
  auto s = c.metadata.find("step");
  return s == c.metadata.end() ? 0 : std::strtoll(s->second.c_str(), nullptr, 10);
}

/// Parses the flags and opens the artifact; returns 0, or the exit code.
int begin(const std::vector<std::string> &args, Flags &f, std::unique_ptr<Model> &m) {
  if (Status s = parseFlags(args, f); !s)
    return usage(s.message());
  auto opened = Model::open(f);
  if (!opened)
    return fail(opened.status());
  m = std::move(*opened);
  return 0;
}

} // namespace

int trainCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  Model &m = *model;
  if (!m.prog().function("train_step"))
    return fail(Status::error(f.artifact + " has no @train_step"));
  const TrainConfig &tc = m.pkg.train;
  uint64_t seed = f.seedSet ? f.seed : uint64_t(tc.seed);
  int64_t steps = f.steps > 0 ? f.steps : std::max<int64_t>(tc.steps, 1);
  int64_t evalInterval = f.evalInterval >= 0 ? f.evalInterval : tc.evalInterval;
  int64_t evalSteps = f.evalSteps > 0 ? f.evalSteps : (tc.evalSteps > 0 ? tc.evalSteps : 20);
  std::string ckptPath = f.checkpoint.empty() ? defaultCheckpoint(f.artifact) : f.checkpoint;
  int64_t ckptEvery = f.checkpointEvery >= 0 ? f.checkpointEvery : evalInterval;

  std::string trainPath = resolvePath(f.data.empty() ? tc.data : f.data, m.pkg);
  auto train = openData(trainPath, m, "train_step", seed, /*shuffle=*/!f.inOrder, "training");
  if (!train)
    return fail(train.status());
  std::unique_ptr<DataSource> val;
  std::string valPath = resolvePath(f.valData.empty() ? tc.valData : f.valData, m.pkg);
  if (!valPath.empty() && evalInterval > 0) {
    auto v = openData(valPath, m, "eval_step", seed ^ 0xe7a15eedULL, /*shuffle=*/false,
                      "validation");
    if (!v)
      return fail(v.status());
    val = std::move(*v);
  }
  std::optional<ckpt::Checkpoint> resume;
  if (!f.resume.empty()) {
    auto c = readCheckpoint(m, f.resume, f.quiet);
    if (!c)
      return fail(c.status());
    resume = std::move(*c);
  }
  if (Status s = m.compile(f); !s)
    return fail(s);

  int64_t start = 0;
  if (resume) {
    if (Status s = m.setPersistent(*resume); !s)
      return fail(s);
    start = checkpointStep(*resume);
    if (!f.quiet)
      fmt::print("kiln-run: resumed from {} at step {}\n", f.resume, start);
  }

  std::vector<int> inputs = m.dataInputs("train_step");
  int stepIn = m.stepInput("train_step");
  int lossId = m.result("train_step", "loss"), normId = m.result("train_step", "grad_norm"),
      lrId = m.result("train_step", "lr");
  if (lossId < 0 || stepIn < 0)
    return fail(Status::error(f.artifact + ": @train_step lacks its step input or loss output"));
  int64_t items = 1;
  for (int64_t d : m.prog().buffers[inputs[0]].shape)
    items *= d;
  bool tokens = m.prog().buffers[inputs[0]].shape.size() == 2 && !isDir(trainPath);
  if (!tokens)
    items = m.prog().buffers[inputs[0]].shape[0];

  if (!f.quiet) {
    fmt::print("kiln-run: training {} from {} for steps {}..{} on {}\n", m.pkg.model,
               f.artifact, start, steps, m.exec->describe());
    fmt::print("  data: {}\n", (*train)->describe());
    if (val)
      fmt::print("  validation: {}, {} batches every {} steps\n", val->describe(),
                 evalSteps, evalInterval);
    fmt::print("  checkpoint: {} every {} steps and at the end\n", ckptPath, ckptEvery);
  }
  std::FILE *lossLog = nullptr;
  if (!f.lossLog.empty() && !(lossLog = std::fopen(f.lossLog.c_str(), start ? "a" : "w")))
    return fail(Status::error("cannot write the loss log " + f.lossLog));

  gInterrupted = false;
  std::signal(SIGINT, onSigint);
  data::Prefetcher<Batch> prefetch(
      [&](uint64_t step) { return (*train)->batch(step); }, uint64_t(start), 3);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now(), tLog = t0;
  int64_t sinceLog = 0;
  double lossSum = 0, lastVal = NAN;
  float loss = 0, norm = 0, lr = 0;
  int64_t step = start;
  int rc = 0;
  // The next batch is written while the step runs (a GPU queues the step
  // and copies the batch meanwhile); when an evaluation follows the step it
  // is written after it (entry points share scratch memory).
  bool batchReady = false;
  auto writeNext = [&]() -> Status {
    Batch b = prefetch.next();
    batchReady = true;
    return copyBatch(*m.exec, inputs, b);
  };
  for (; step < steps; ++step) {
    if (!batchReady)
      if (Status s = writeNext(); !s)
        return fail(s);
    batchReady = false;
    int64_t s64 = step;
    if (Status s = storeInts(*m.exec, stepIn, &s64, 1); !s)
      return fail(s);
    if (Status s = m.exec->run("train_step"); !s)
      return fail(s);
    bool evalAfter = val && evalInterval > 0 && ((step + 1) % evalInterval == 0 || step + 1 == steps);
    bool early = m.exec->stagesInputs() && step + 1 < steps && !evalAfter;
    if (early)
      if (Status s = writeNext(); !s)
        return fail(s);
    loss = m.scalar(lossId);
    norm = normId >= 0 ? m.scalar(normId) : 0.f;
    lr = lrId >= 0 ? m.scalar(lrId) : 0.f;
    if (lossLog)
      std::fprintf(lossLog, "%lld %.9g %.9g\n", (long long)step, double(loss), double(norm));
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      fmt::print(stderr,
                 "kiln-run: error: step {}: the loss is {} (grad norm {}); training "
                 "stopped and {} was not overwritten.\n  Lower the learning rate, set "
                 "grad_clip in the train section, or resume from the last checkpoint "
                 "with --resume.\n", step, loss, norm, ckptPath);
      rc = 1;
      break;
    }
    lossSum += loss;
    ++sinceLog;
    bool last = step + 1 == steps;
    if (!f.quiet && (sinceLog == f.logInterval || last || step == start)) {
      auto now = clock::now();
      double dt = std::chrono::duration<double>(now - tLog).count() / double(sinceLog);
      double eta = dt * double(steps - step - 1);
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.1f} ms/step "
                 "| {:.1f}k {}/s | ETA {}\n",
                 step + 1, steps, lossSum / double(sinceLog), lr, norm, dt * 1e3,
                 double(items) / dt / 1e3, tokens ? "tok" : "samples", duration(eta));
      std::fflush(stdout);
      tLog = now;
      sinceLog = 0;
      lossSum = 0;
    }
    if (val && evalInterval > 0 && ((step + 1) % evalInterval == 0 || last)) {
      EvalResult e = evaluate(m, *val, evalSteps);
      lastVal = e.loss;
      if (!f.quiet) {
        fmt::print("step {:>5}: val loss {:.4f}{} ({} batches)\n", step + 1, e.loss,
                   e.accuracy >= 0 ? fmt::format(", accuracy {:.2f}%", 100 * e.accuracy) : "",
                   e.batches);
        std::fflush(stdout);
      }
    }
    if (gInterrupted) {
      ++step;
      break;
    }
    if (ckptEvery > 0 && (step + 1) % ckptEvery == 0 && !last) {
      if (Status s = saveCheckpoint(m, ckptPath, step + 1, seed); !s)
        return fail(s);
    }
  }
  if (lossLog)
    std::fclose(lossLog);
  std::signal(SIGINT, SIG_DFL);
  if (rc)
    return rc;
  if (Status s = saveCheckpoint(m, ckptPath, step, seed); !s)
    return fail(s);
  double total = std::chrono::duration<double>(clock::now() - t0).count();
  if (gInterrupted) {
    fmt::print("kiln-run: interrupted at step {}; saved {}; continue with: kiln-run "
               "train {} --resume {}\n", step, ckptPath, f.artifact, ckptPath);
    return 130;
  }
  if (!f.quiet) {
    int64_t ran = step - start;
    fmt::print("done: {} steps in {} ({:.1f} ms/step, {:.1f}k {}/s); final loss {:.4f}{}; "
               "checkpoint {}\n",
               ran, duration(total), ran ? total / double(ran) * 1e3 : 0.0,
               ran ? double(items) * double(ran) / total / 1e3 : 0.0,
               tokens ? "tok" : "samples", loss,
               std::isnan(lastVal) ? "" : fmt::format(", val loss {:.4f}", lastVal), ckptPath);
  }
  if (f.profile) {
    auto t = m.exec->timings();
    std::sort(t.begin(), t.end(), [](auto &a, auto &b) { return a.seconds > b.seconds; });
    double sum = 0;
    for (auto &x : t)
      sum += x.seconds;
    fmt::print("profile (all entry points, {:.2f} s in steps):\n", sum);
    for (size_t i = 0; i < std::min<size_t>(t.size(), 40); ++i)
      fmt::print("  {:5.1f}% {:9.3f} s {:8} calls  {:<36} {}{}\n", 100 * t[i].seconds / sum,
                 t[i].seconds, t[i].calls, t[i].name, t[i].loc,
                 t[i].flops > 0 ? fmt::format("  {:.0f} GFLOP/s", t[i].flops / t[i].seconds / 1e9)
                                : "");
    std::map<std::string, std::pair<double, int64_t>> byOp;
    for (auto &x : t) {
      byOp[x.op].first += x.seconds;
      byOp[x.op].second += x.calls;
    }
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> ops(byOp.begin(), byOp.end());
    std::sort(ops.begin(), ops.end(),
              [](auto &a, auto &b) { return a.second.first > b.second.first; });
    fmt::print("by op:\n");
    for (auto &[op, v] : ops)
      fmt::print("  {:5.1f}% {:9.3f} s {:8} calls  {}\n", 100 * v.first / sum, v.first,
                 v.second, op);
  }
  return 0;
}


namespace {

/// How far apart two copies of a buffer are: the largest difference
/// relative to the reference's largest magnitude (floats), or the number of
/// differing elements (integers, booleans).
struct Diff {
  double error = 0;
  double absolute = 0;   ///< largest absolute difference (floats)
  int64_t nonFinite = 0; ///< NaN/inf in the checked copy but not in the reference
  bool exact = true;     ///< integer/boolean buffer
};

Diff compareBuffers(const Buffer &b, const std::string &ref, const std::string &got) {
  Diff d;
  int64_t n = b.numElements();
  auto floats = [&](auto tag) {
    using T = decltype(tag);
    const T *r = reinterpret_cast<const T *>(ref.data());
    const T *g = reinterpret_cast<const T *>(got.data());
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(double(r[i])))
        scale = std::max(scale, std::fabs(double(r[i])));
    for (int64_t i = 0; i < n; ++i) {
      double x = double(r[i]), y = double(g[i]);
      if (std::isfinite(x) != std::isfinite(y) || (std::isnan(x) != std::isnan(y))) {
        ++d.nonFinite;
        continue;
      }
      if (std::isfinite(x))
        worst = std::max(worst, std::fabs(x - y));
    }
    d.error = worst / std::max(scale, 1e-30);
    d.absolute = worst;
  };
  if (b.dtype == DType::F32) {
    d.exact = false;
    floats(float());
  } else if (b.dtype == DType::F64) {
    d.exact = false;
    floats(double());
  } else if (b.dtype == DType::F16 || b.dtype == DType::BF16) {
    d.exact = false;
    std::string rf, gf; // widen to float
    auto widen = [&](const std::string &src, std::string &dst) {
      dst.resize(size_t(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        float f = halfToFloat(b.dtype, h);
        std::memcpy(&dst[size_t(i) * 4], &f, 4);
      }
    };
    widen(ref, rf);
    widen(got, gf);
    const float *r = reinterpret_cast<const float *>(rf.data());
    const float *g = reinterpret_cast<const float *>(gf.data());
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(r[i]))
        scale = std::max(scale, double(std::fabs(r[i])));
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(r[i]) && std::isfinite(g[i]))
        worst = std::max(worst, double(std::fabs(r[i] - g[i])));
      else if (std::isfinite(r[i]) != std::isfinite(g[i]))
        ++d.nonFinite;
    d.error = worst / std::max(scale, 1e-30);
    d.absolute = worst;
  } else {
    int64_t width = program::dtypeBytes(b.dtype), differing = 0;
    for (int64_t i = 0; i < n; ++i)
      differing += std::memcmp(ref.data() + i * width, got.data() + i * width, size_t(width)) != 0;
    d.error = double(differing);
  }
  return d;
}

} // namespace

int checkCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  if (f.device == "cpu")
    f.device = "cuda-emu";
  Model &m = *model;
  // Two backends on the same artifact: the reference and the one checked.
  Flags rf = f;
  rf.device = f.against;
  rf.quiet = true;
  Model ref;
  ref.pkg = m.pkg;
  if (Status s = ref.compile(rf); !s)
    return fail(s);
  if (Status s = m.compile(f); !s)
    return fail(s);
  const program::Program &p = m.prog();
  // Fresh random batches each run (tokens below the vocabulary, floats in
  // [-1, 1)); --seed repeats one.
  uint64_t seed = f.seedSet ? f.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  seed &= (uint64_t(1) << 53) - 1; // printable and re-readable as --seed
  // A step that touches float16 or bfloat16 values is judged in their
  // precision: every op rounds to the type, so the backends may differ by a
  // rounding per op of a chain (allowed: 8 units of the last place at the
  // tensor's largest value, 2^-8 * 8 for bfloat16, 2^-11 * 8 for float16).
  const double bf16Tol = std::max(f.tolerance, 8 * std::ldexp(1.0, -8));
  const double f16Tol = std::max(f.tolerance, 8 * std::ldexp(1.0, -11));
  fmt::print("kiln-run check: every step of @train_step, @eval_step and @predict on {} "
             "against {}: the step's inputs copied from the reference (random, --seed {}), its "
             "outputs poisoned (NaN) first; tolerance {:g} of each tensor's largest value ({:g} "
             "for steps with bfloat16 values, {:g} with float16; times sqrt(N/65536) for sums "
             "of N > 65536 terms) or 1e-6 absolute (integers: exact)\n",
             m.exec->describe(), ref.exec->describe(), seed, f.tolerance, bf16Tol, f16Tol);
  int64_t vocab = std::max<int64_t>(m.vocabSize(), 2);
  struct Worst { double error = 0; std::string where; int64_t checked = 0; };
  std::map<std::string, Worst> byForm;
  int failures = 0;
  auto readAll = [&](Backend &b, int id, std::string &out) {
    out.resize(size_t(p.buffers[size_t(id)].bytes));
    return b.read(id, out.data(), out.size());
  };
  for (const char *fn : {"train_step", "eval_step", "predict"}) {
    const program::Function *func = p.function(fn);
    if (!func)
      continue;
    std::map<int, std::string> inputBytes; ///< this entry point's random batch
    for (int id : func->args) {
      const Buffer &b = p.buffers[size_t(id)];
      if (b.role != Role::Input)
        continue;
      std::string bytes(size_t(b.bytes), '\0');
      for (int64_t i = 0; i < b.numElements(); ++i) {
        uint64_t r = random::bits(seed, uint64_t(id) + 0xc4ecULL, uint64_t(i));
        if (b.name == "step") {
          int64_t v = 0;
          std::memcpy(&bytes[0], &v, 8);
          break;
        }
        if (b.dtype == DType::I32) {
          int32_t v = int32_t(r % uint64_t(vocab));
          std::memcpy(&bytes[size_t(i) * 4], &v, 4);
        } else if (b.dtype == DType::I64) {
          int64_t v = int64_t(r % uint64_t(vocab));
          std::memcpy(&bytes[size_t(i) * 8], &v, 8);
        } else if (b.dtype == DType::F32) {
          float v = float(double(r >> 40) / double(1 << 24) * 2 - 1);
          std::memcpy(&bytes[size_t(i) * 4], &v, 4);
        } else if (b.dtype == DType::F64) {
          double v = double(r >> 11) / double(uint64_t(1) << 53) * 2 - 1;
          std::memcpy(&bytes[size_t(i) * 8], &v, 8);
        } else if (b.dtype == DType::BF16 || b.dtype == DType::F16) {
          // Multiples of 2^-7 in [-1, 1): exact in both types.
          uint16_t h = floatToHalf(b.dtype, float(int64_t(r % 256) - 128) / 128.0f);
          std::memcpy(&bytes[size_t(i) * 2], &h, 2);
        }
      }
      if (Status s = ref.exec->write(id, bytes.data(), bytes.size()); !s)
        return fail(s);
      // A backend that stages inputs (CUDA) applies them at its next run:
      // the checked backend gets them from here, not read back.
      inputBytes[id] = std::move(bytes);
    }
    for (size_t si = 0; si < func->steps.size(); ++si) {
      const program::Step &st = func->steps[si];
      std::vector<int> all = st.args, written;
      std::string what, form;
      if (st.kind == program::Step::Kernel) {
        const program::Kernel &k = p.kernels[size_t(st.kernel)];
        for (int w : k.writes)
          written.push_back(st.args[size_t(w)]);
        what = k.symbol;
        form = m.pkg.hasCuda && !m.pkg.cudaPlan.kernels[size_t(st.kernel)].empty()
                   ? m.pkg.cudaPlan.kernels[size_t(st.kernel)][0].form
                   : k.kind;
      } else if (st.kind == program::Step::Gemm && st.lt.valid() &&
                 m.exec->usesLibraryEpilogues()) {
        // The epilogue in the library call: its result (and pre-activation).
        written.push_back(st.lt.out);
        if (st.lt.aux >= 0)
          written.push_back(st.lt.aux);
        all.insert(all.end(), st.epilogueArgs.begin(), st.epilogueArgs.end());
        what = "gemm + library epilogue " + std::string(program::activationName(st.lt.activation)) +
               (st.lt.bias >= 0 ? " with bias" : "");
        form = "gemm+library epilogue";
      } else if (st.kind == program::Step::Gemm) {
        written.push_back(st.args[2]);
        what = "gemm";
        form = "gemm";
        if (st.epilogue >= 0) {
          all.insert(all.end(), st.epilogueArgs.begin(), st.epilogueArgs.end());
          for (int w : p.kernels[size_t(st.epilogue)].writes)
            written.push_back(st.epilogueArgs[size_t(w)]);
          what = "gemm + " + p.kernels[size_t(st.epilogue)].symbol;
          form = "gemm+epilogue";
        }
      } else {
        written.push_back(st.args[1]);
        what = "copy";
        form = "copy";
      }
      // The reference's state before the step, for every buffer it touches;
      // outputs that are not also read start as NaN.
      // Buffers the step reads.
      std::vector<int> reads;
      if (st.kind == program::Step::Kernel) {
        const program::Kernel &k = p.kernels[size_t(st.kernel)];
        reads.assign(st.args.begin(), st.args.begin() + k.numInputs);
      } else if (st.kind == program::Step::Gemm && st.lt.valid() &&
                 m.exec->usesLibraryEpilogues()) {
        reads = {st.args[0], st.args[1]};
        if (st.lt.bias >= 0)
          reads.push_back(st.lt.bias);
      } else if (st.kind == program::Step::Gemm) {
        reads = {st.args[0], st.args[1]};
        if (st.epilogue >= 0) {
          const program::Kernel &k = p.kernels[size_t(st.epilogue)];
          reads.insert(reads.end(), st.epilogueArgs.begin(),
                       st.epilogueArgs.begin() + k.numInputs);
        }
      } else {
        reads = {st.args[0]};
      }
      for (int id : all) {
        std::string bytes;
        if (auto in = inputBytes.find(id); in != inputBytes.end())
          bytes = in->second;
        else if (Status s = readAll(*ref.exec, id, bytes); !s)
          return fail(s);
        bool read = std::count(reads.begin(), reads.end(), id) > 0;
        // The GEMM's own result is read by its epilogue but written first.
        if (st.kind == program::Step::Gemm && id == st.args[2])
          read = false;
        if (!read)
          std::fill(bytes.begin(), bytes.end(), '\xff');
        if (Status s = m.exec->write(id, bytes.data(), bytes.size()); !s)
          return fail(s);
      }
      if (Status s = ref.exec->runSteps(fn, si, si + 1); !s)
        return fail(s);
      if (Status s = m.exec->runSteps(fn, si, si + 1); !s)
        return fail(s);
      for (int id : written) {
        std::string a, b;
        if (Status s = readAll(*ref.exec, id, a); !s)
          return fail(s);
        if (Status s = readAll(*m.exec, id, b); !s)
          return fail(s);
        const Buffer &buf = p.buffers[size_t(id)];
        Diff d = compareBuffers(buf, a, b);
        // Relative to the tensor's largest value, with an absolute floor for
        // values that are rounding noise around zero (a row sum of
        // softmax - onehot is 0 in exact arithmetic, ~1e-8 in float32).
        // Sums over many elements differ by their order (the CPU adds in
        // sequence, a GPU in a tree): about sqrt(N) roundings of 2^-24, so
        // the tolerance grows as sqrt(N / 65536) past 65536 terms per output.
        int64_t largestIn = 1;
        for (int r : reads)
          largestIn = std::max(largestIn, p.buffers[size_t(r)].numElements());
        double terms = double(largestIn) / double(std::max<int64_t>(buf.numElements(), 1));
        // The step's precision: its buffers' types and what its kernels
        // compute in (a kernel may round to bfloat16 inside).
        double base = f.tolerance;
        auto lower = [&](DType t) {
          base = std::max(base, t == DType::BF16 ? bf16Tol : t == DType::F16 ? f16Tol : 0.0);
        };
        for (int id2 : all)
          lower(p.buffers[size_t(id2)].dtype);
        if (st.kind == program::Step::Kernel)
          lower(p.kernels[size_t(st.kernel)].lowestFloat);
        if (st.kind == program::Step::Gemm && st.epilogue >= 0)
          lower(p.kernels[size_t(st.epilogue)].lowestFloat);
        double tol = base * std::max(1.0, std::sqrt(terms / 65536.0));
        bool bad = d.nonFinite > 0 ||
                   (d.exact ? d.error > 0 : d.error > tol && d.absolute > 1e-6);
        Worst &w = byForm[form];
        w.checked++;
        if (d.error > w.error || (bad && w.error <= f.tolerance)) {
          w.error = d.error;
          w.where = fmt::format("@{} step {} {}", fn, si, what);
        }
        if (bad && failures++ < 20)
          fmt::print("  MISMATCH @{} step {} {} ({}): output {} {}[{}]: {} {}{}\n", fn, si, what,
                     form, buf.name.empty() ? "#" + std::to_string(id) : buf.name,
                     program::dtypeName(buf.dtype), fmt::join(buf.shape, "x"),
                     d.exact ? "elements differ:" : "relative error", d.error,
                     d.nonFinite ? fmt::format(", {} NaN/inf where the reference is finite "
                                               "(an output not written?)", d.nonFinite)
                                 : "");
      }
    }
  }
  fmt::print("  {:<28} {:>8} {:>12}  {}\n", "kernel form", "outputs", "worst error", "where");
  for (auto &[form, w] : byForm)
    fmt::print("  {:<28} {:>8} {:>12.3g}  {}\n", form, w.checked, w.error, w.where);
  if (failures) {
    fmt::print("kiln-run check: FAIL: {} outputs outside the tolerance\n", failures);
    return 1;
  }
  fmt::print("kiln-run check: PASS\n");
  return 0;
}

int evalCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  Model &m = *model;
  std::optional<ckpt::Checkpoint> params;
  if (!f.checkpoint.empty()) {
    auto c = readCheckpoint(m, f.checkpoint, f.quiet);
    if (!c)
      return fail(c.status());
    params = std::move(*c);
  }
  const TrainConfig &tc = m.pkg.train;
  uint64_t seed = f.seedSet ? f.seed : uint64_t(tc.seed);
  std::string path = resolvePath(f.valData.empty() ? (f.data.empty() ? tc.valData : f.data)
                                                    : f.valData, m.pkg);
  auto src = openData(path, m, "eval_step", seed ^ 0xe7a15eedULL, false, "validation");
  if (!src)
    return fail(src.status());
  if (Status s = m.compile(f); !s)
    return fail(s);
  if (params)
    if (Status s = m.setPersistent(*params); !s)
      return fail(s);
  int64_t batches = f.evalSteps > 0 ? f.evalSteps
                    : (*src)->epochBatches() > 0 ? (*src)->epochBatches()
                    : (tc.evalSteps > 0 ? tc.evalSteps : 20);
  EvalResult e = evaluate(m, **src, batches);
  fmt::print("{}: loss {:.4f}{} over {} batches of {}\n",
             f.checkpoint.empty() ? f.artifact + " (initial parameters)" : f.checkpoint,
             e.loss, e.accuracy >= 0 ? fmt::format(", accuracy {:.2f}%", 100 * e.accuracy) : "",
             e.batches, (*src)->describe());
  return 0;
}

int sampleCommand(const std::vector<std::string> &args) {
  Flags f;
  std::unique_ptr<Model> model;
  if (int rc = begin(args, f, model))
    return rc;
  f.quiet = true;
  Model &m = *model;
  const program::Function *pred = m.prog().function("predict");
  if (!pred || pred->results.empty() ||
      m.prog().buffers[pred->results[0]].shape.size() != 3)
    return fail(Status::error(f.artifact + ": sampling needs a language model (logits of "
                                           "shape [batch, context, vocab])"));
  std::optional<ckpt::Checkpoint> params;
  if (!f.checkpoint.empty()) {
    auto c = readCheckpoint(m, f.checkpoint, false);
    if (!c)
      return fail(c.status());
    params = std::move(*c);
  }
  std::string vocabPath = f.vocab;
  if (vocabPath.empty() && !m.pkg.train.data.empty())
    vocabPath = dirOf(resolvePath(m.pkg.train.data, m.pkg)) + "/vocab.json";
  auto vocab = data::readVocab(vocabPath);
  if (!vocab)
    return fail(Status::error(vocab.status().message() +
                              " (the vocabulary kiln-run prepare wrote; pass --vocab FILE)"));
  int logitsId = pred->results[0];
  const Buffer &lb = m.prog().buffers[logitsId];
  int64_t context = lb.shape[1], V = lb.shape[2];
  if (int64_t(vocab->size()) != V)
    return fail(Status::error(fmt::format("{} has {} characters, the model {} classes",
                                          vocabPath, vocab->size(), V)));
  std::vector<int64_t> seq;
  for (char c : f.prompt) {
    size_t k = vocab->find(c);
    if (k == std::string::npos)
      return fail(Status::error(fmt::format(
          "the prompt has a character (code {}) that is not in the vocabulary {}", int(c),
          vocabPath)));
    seq.push_back(int64_t(k));
  }
  if (seq.empty())
    seq.push_back(0);
  std::vector<int> inputs = m.dataInputs("predict");
  if (inputs.size() != 1)
    return fail(Status::error(f.artifact + ": @predict should take one token input"));
  if (Status s = m.compile(f); !s)
    return fail(s);
  if (params)
    if (Status s = m.setPersistent(*params); !s)
      return fail(s);
  uint64_t seed = f.seedSet ? f.seed : 1;
  int64_t rows = m.prog().buffers[inputs[0]].shape[0];
  std::string out = f.prompt;
  std::vector<int64_t> window(size_t(rows * context), 0);
  std::vector<double> p(static_cast<size_t>(V));
  for (int64_t t = 0; t < f.tokens; ++t) {
    int64_t len = std::min<int64_t>(int64_t(seq.size()), context);
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.end() - len, seq.end(), window.begin());
    if (Status s = storeInts(*m.exec, inputs[0], window.data(), int64_t(window.size())); !s)
      return fail(s);
    if (Status s = m.exec->run("predict"); !s)
      return fail(s);
    auto all = m.exec->readAll<float>(logitsId);
    if (!all)
      return fail(all.status());
    // Causal: position len-1 of row 0 sees exactly the window.
    const float *logits = all->data() + (len - 1) * V;
    int64_t next = 0;
    if (f.temperature == 0) {
      next = std::max_element(logits, logits + V) - logits;
    } else {
      std::vector<int64_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      int64_t k = f.topK > 0 ? std::min(f.topK, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
      double mx = logits[order[0]], sum = 0;
      for (int64_t i = 0; i < k; ++i)
        sum += (p[size_t(i)] = std::exp((logits[order[size_t(i)]] - mx) / f.temperature));
      double u = double(random::bits(seed, 0x5a3e1eULL, uint64_t(t)) >> 11) * 0x1.0p-53 * sum;
      next = order[size_t(k - 1)];
      for (int64_t i = 0; i < k; ++i) {
        u -= p[size_t(i)];
        if (u < 0) {
          next = order[size_t(i)];
          break;
        }
      }
    }
    seq.push_back(next);
    out += (*vocab)[size_t(next)];
  }
  fmt::print("{}\n", out);
  return 0;
}

} // namespace kiln::run
