//===- DataSource.cpp - Token files and .npy directories ------------------===//
#include "runtime/train/DataSource.h"

#include "runtime/core/Data.h"
#include "runtime/core/Random.h"
#include "runtime/train/Model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <numeric>

namespace kiln::train {

namespace {

using program::Buffer;
using program::DType;

/// "row 5" for a row of one element, else "row 5, element [2, 17]" (the
/// element's index within the row, whose shape is `row`).
std::string elementAt(int64_t flat, const std::vector<int64_t> &row) {
  int64_t n = 1;
  for (int64_t d : row)
    n *= d;
  std::string where = fmt::format("row {}", flat / std::max<int64_t>(n, 1));
  if (row.empty())
    return where;
  std::vector<int64_t> idx(row.size());
  int64_t rest = flat % std::max<int64_t>(n, 1);
  for (size_t k = row.size(); k-- > 0;) {
    idx[k] = rest % row[k];
    rest /= row[k];
  }
  return fmt::format("{}, element [{}]", where, fmt::join(idx, ", "));
}

/// Checks every element once, on load: integer inputs that index lie in the
/// range the compiler recorded, float inputs are finite.
Status checkValues(const data::NpyArray &a, const Buffer &b, const Package &pkg) {
  std::vector<int64_t> row(b.shape.begin() + 1, b.shape.end());
  if (a.isFloat()) {
    // As the input will hold it: a float64 value beyond float32's range
    // becomes inf in a float32 input.
    bool narrow = b.dtype == DType::F32;
    for (size_t k = 0; k < a.f.size(); ++k) {
      if (!std::isfinite(a.f[k]))
        return Status::error(fmt::format(
            "{}: {}: {}; input '{}' must be finite.\n  Fix or drop the row (numpy: "
            "x[np.isfinite(x).all(axis=1)]) or replace the values (np.nan_to_num).",
            a.path, elementAt(int64_t(k), row), a.f[k], b.name));
      // At or past the midpoint between FLT_MAX and 2^128 a double rounds to
      // inf as a float (compared here: the conversion itself would be
      // undefined behaviour in ISO C++).
      if (narrow && std::fabs(a.f[k]) >= 0x1.ffffffp127)
        return Status::error(fmt::format(
            "{}: {}: {:g} is beyond float32's range (about 3.4e38) of input '{}' (f32), where "
            "it would be inf.\n  Scale the data, clip it (np.clip(x, -1e38, 1e38)) or drop "
            "the row.",
            a.path, elementAt(int64_t(k), row), a.f[k], b.name));
    }
    return Status::ok();
  }
  auto r = pkg.inputRanges.find(b.name);
  if (r == pkg.inputRanges.end())
    return Status::ok();
  const InputRange &ir = r->second;
  for (size_t k = 0; k < a.i.size(); ++k)
    if (a.i[k] < ir.lo || a.i[k] >= ir.hi)
      return Status::error(fmt::format(
          "{}: {}: value {} is outside [{}, {}), the valid range of input '{}'{}.\n  Fix the "
          "data (every value must be an index in [{}, {})) or compile a model whose range "
          "covers it.", a.path, elementAt(int64_t(k), row), a.i[k], ir.lo, ir.hi, b.name,
          ir.from.empty() ? "" : " (" + ir.from + ")", ir.lo, ir.hi));
  return Status::ok();
}

/// ", replica 1 of 4: rows 8..15 of each global batch of 32" (nothing for
/// one replica).
std::string shardNote(const DataShard &s, int64_t rows) {
  if (s.count <= 1)
    return "";
  return fmt::format("; replica {} of {}: rows {}..{} of each global batch of {}", s.index,
                     s.count, s.index * rows, (s.index + 1) * rows - 1, rows * s.count);
}

/// Random (x, y) windows of token files (one, or shards read as one:
/// data::TokenShards): x is the first data input, y the second
/// (y[i] = x[i + 1]); windows depend only on (seed, index).
class TokenSource : public DataSource {
public:
  static Expected<std::unique_ptr<DataSource>> open(const std::string &path,
                                                    const Model &m,
                                                    const std::vector<int> &inputs,
                                                    uint64_t seed, DataShard shard) {
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
    src->shard_ = shard;
    src->wide_[0] = bufs[inputs[0]].dtype == DType::I64;
    src->wide_[1] = bufs[inputs[1]].dtype == DType::I64;
    // Tokens index the model (embedding rows, cross-entropy classes): the
    // narrowest range the compiler recorded, else the vocabulary.
    int64_t limit = 0;
    for (int id : inputs)
      if (auto r = m.pkg.inputRanges.find(bufs[id].name); r != m.pkg.inputRanges.end())
        limit = limit ? std::min(limit, r->second.hi) : r->second.hi;
    auto paths = data::expandTokenPaths(path);
    if (!paths)
      return paths.status();
    auto shards = data::TokenShards::open(*paths, src->context_, limit ? limit : m.vocabSize());
    if (!shards)
      return shards.status();
    src->shards_ = std::make_unique<data::TokenShards>(std::move(*shards));
    return std::unique_ptr<DataSource>(std::move(src));
  }
  Batch batch(uint64_t index) const override {
    std::vector<int32_t> x, y;
    // Global window (index * count + shard) * batch_ + b: the windows of
    // one device reading count * batch_ rows per step.
    shards_->sampleWindows(seed_, index * uint64_t(shard_.count) + uint64_t(shard_.index),
                         batch_, context_, x, y);
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
    const auto &files = shards_->files();
    if (files.size() == 1)
      return fmt::format("{} ({} tokens; random windows of {}{})", files[0].path(),
                         files[0].size(), context_, shardNote(shard_, batch_));
    std::vector<std::string> names;
    for (const data::TokenFile &f : files)
      names.push_back(f.path());
    return fmt::format("{} ({} shards, {} tokens; random windows of {}, a shard drawn in "
                       "proportion to its size{})",
                       fmt::join(names, ", "), files.size(), shards_->tokens(), context_,
                       shardNote(shard_, batch_));
  }
  bool countsTokens() const override { return true; }

private:
  std::unique_ptr<data::TokenShards> shards_;
  int64_t batch_ = 0, context_ = 0;
  uint64_t seed_ = 0;
  DataShard shard_;
  bool wide_[2] = {false, false};
};

/// .npy arrays, one per data input (DIR/<input name>.npy), the same number
/// of rows each; batch i of a shuffled source takes rows of a permutation
/// drawn per epoch from (seed, epoch); an ordered source (evaluation) reads
/// rows in file order. Where batches cross epochs: LastBatch.
class NpySource : public DataSource {
public:
  static Expected<std::unique_ptr<DataSource>> open(const std::string &dir,
                                                    const Model &m,
                                                    const std::vector<int> &inputs,
                                                    uint64_t seed, bool shuffle,
                                                    DataShard shard, int64_t shuffleBuffer,
                                                    LastBatch last) {
    auto src = std::make_unique<NpySource>();
    src->seed_ = seed;
    src->last_ = last;
    src->shard_ = shard;
    src->shuffle_ = shuffle;
    src->shuffleBuffer_ = shuffle ? shuffleBuffer : 0;
    for (int id : inputs) {
      const Buffer &b = m.prog().buffers[id];
      std::string path = dir + "/" + b.name + ".npy";
      if (!pathExists(path))
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
            "{}: shape [{}] does not fit input '{}' of shape [{}]: expected [N{}{}]",
            path, fmt::join(a->shape, ", "), b.name, fmt::join(b.shape, ", "),
            row.empty() ? "" : ", ", fmt::join(row, ", ")));
      bool wantFloat = b.dtype == DType::F32 || b.dtype == DType::F64;
      if (a->isFloat() != wantFloat)
        return Status::error(fmt::format(
            "{}: dtype {} does not fit input '{}' ({}): expected {} data", path,
            a->descr, b.name, program::dtypeName(b.dtype), wantFloat ? "floating-point" : "integer"));
      if (Status s = checkValues(*a, b, m.pkg); !s)
        return s;
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
    int64_t global = src->batch_ * shard.count;
    if (src->rows_ < global)
      return Status::error(fmt::format("{}: {} rows, fewer than one batch of {}{}", dir,
                                       src->rows_, global,
                                       shard.count > 1 ? fmt::format(" ({} devices x {})",
                                                                     shard.count, src->batch_)
                                                       : ""));
    return std::unique_ptr<DataSource>(std::move(src));
  }
  Batch batch(uint64_t index) const override {
    Batch out;
    out.bytes.resize(arrays_.size());
    std::shared_ptr<const std::vector<int64_t>> perm;
    int64_t permEpoch = -1;
    // This replica's block of the global batch: positions
    // (i * count + shard) * batch_ + r of the row stream (wrap), or of
    // epoch i / E's order with i = i mod E (drop: E whole batches an epoch).
    uint64_t step = index, epoch = 0;
    if (last_ == LastBatch::Drop) {
      uint64_t e = uint64_t(epochBatches());
      epoch = index / e;
      step = index % e;
    }
    uint64_t first = (step * uint64_t(shard_.count) + uint64_t(shard_.index)) * uint64_t(batch_);
    for (int64_t r = 0; r < batch_; ++r) {
      uint64_t p = first + uint64_t(r);
      int64_t row = rowAt(epoch + p / uint64_t(rows_), p % uint64_t(rows_), perm, permEpoch);
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
    return fmt::format("{} ({} rows{}{})", fmt::join(paths_, ", "), rows_,
                       !shuffle_ ? ""
                       : shuffleBuffer_ > 0
                           ? fmt::format(", shuffled per epoch with a buffer of {} rows",
                                         shuffleBuffer_)
                           : ", shuffled per epoch",
                       shardNote(shard_, batch_));
  }
  int64_t epochBatches() const override { return rows_ / global(); }
  int64_t epochSteps(int64_t epochs) const override {
    if (last_ == LastBatch::Drop)
      return clamp(__int128(epochs) * epochBatches());
    return clamp((__int128(epochs) * rows_ + global() - 1) / global());
  }
  int64_t epochsDone(int64_t steps) const override {
    if (last_ == LastBatch::Drop)
      return steps / epochBatches();
    return clamp(__int128(steps) * global() / rows_);
  }
  std::string epochNote() const override {
    int64_t g = global(), left = rows_ % g;
    std::string batch = shard_.count > 1 ? fmt::format("{} ({} replicas x {})", g, shard_.count,
                                                       batch_)
                                         : fmt::format("{}", g);
    if (left == 0)
      return fmt::format("{} steps per epoch at global batch {}", rows_ / g, batch);
    if (last_ == LastBatch::Drop)
      return fmt::format("{} steps per epoch at global batch {}, the last {} row{} of each "
                         "epoch's order not read (last_batch \"drop\")",
                         rows_ / g, batch, left, left == 1 ? "" : "s");
    return fmt::format("{:.6g} steps per epoch at global batch {}: a step may take the last "
                       "rows of one epoch and the first of the next (last_batch \"wrap\")",
                       double(rows_) / double(g), batch);
  }

private:
  int64_t global() const { return batch_ * shard_.count; }
  static int64_t clamp(__int128 v) {
    return v > __int128(INT64_MAX) ? INT64_MAX : int64_t(v);
  }
  /// The row at position `at` of `epoch`'s order; `perm` caches the
  /// epoch's order between calls of one batch.
  int64_t rowAt(uint64_t epoch, uint64_t at, std::shared_ptr<const std::vector<int64_t>> &perm,
                int64_t &permEpoch) const {
    if (!shuffle_)
      return int64_t(at);
    if (permEpoch != int64_t(epoch)) {
      perm = order(epoch);
      permEpoch = int64_t(epoch);
    }
    return (*perm)[size_t(at)];
  }
  /// The rows of `epoch` in the order they are read: a uniform permutation
  /// drawn from (seed, epoch), or with a shuffle buffer of N rows tf.data's
  /// Dataset.shuffle(N) over file order (fill a window with the next N rows,
  /// take one uniformly, refill its place with the next row; at the end,
  /// drain the window likewise). Cached for the last few epochs, which
  /// concurrent data workers may be in.
  std::shared_ptr<const std::vector<int64_t>> order(uint64_t epoch) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &[e, p] : perms_)
      if (e == epoch)
        return p;
    auto perm = std::make_shared<std::vector<int64_t>>(size_t(rows_));
    std::vector<int64_t> &v = *perm;
    if (shuffleBuffer_ <= 0) {
      std::iota(v.begin(), v.end(), 0);
      for (int64_t i = rows_ - 1; i > 0; --i) {
        uint64_t r = random::bits(seed_, 0x5eedda7aULL + epoch, uint64_t(i));
        std::swap(v[size_t(i)], v[size_t(r % uint64_t(i + 1))]);
      }
    } else {
      std::vector<int64_t> window;
      int64_t next = 0;
      for (; next < std::min(shuffleBuffer_, rows_); ++next)
        window.push_back(next);
      for (int64_t out = 0; out < rows_; ++out) {
        uint64_t r = random::bits(seed_, 0x5b0ffe40ULL + epoch, uint64_t(out));
        size_t k = size_t(r % uint64_t(window.size()));
        v[size_t(out)] = window[k];
        if (next < rows_) {
          window[k] = next++;
        } else {
          window[k] = window.back();
          window.pop_back();
        }
      }
    }
    perms_.emplace_back(epoch, perm);
    if (perms_.size() > 4)
      perms_.erase(perms_.begin());
    return perm;
  }
  std::vector<data::NpyArray> arrays_;
  std::vector<DType> dtypes_;
  std::vector<int64_t> rowElems_;
  std::vector<std::string> paths_;
  int64_t rows_ = 0, batch_ = 0;
  uint64_t seed_ = 0;
  DataShard shard_;
  bool shuffle_ = true;
  int64_t shuffleBuffer_ = 0; ///< 0: a uniform permutation per epoch
  LastBatch last_ = LastBatch::Wrap;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<uint64_t, std::shared_ptr<const std::vector<int64_t>>>> perms_;
};

} // namespace

const char *lastBatchName(LastBatch l) { return l == LastBatch::Drop ? "drop" : "wrap"; }

std::optional<LastBatch> parseLastBatch(const std::string &s) {
  if (s == "wrap")
    return LastBatch::Wrap;
  if (s == "drop")
    return LastBatch::Drop;
  return std::nullopt;
}

Expected<std::unique_ptr<DataSource>> openData(const std::string &path, const Model &m,
                                               const std::string &fn, uint64_t seed,
                                               bool shuffle, const char *what,
                                               DataShard shard, int64_t shuffleBuffer,
                                               LastBatch last) {
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count)
    return Status::internal(fmt::format("openData: replica {} of {}", shard.index, shard.count));
  if (path.empty())
    return Status::error(fmt::format(
        "no {} data: name it in the model's train section ({} = \"...\") or pass "
        "--{} PATH (a token file, or a directory of .npy arrays named after the inputs)",
        what, std::string(what) == "training" ? "data" : "val_data",
        std::string(what) == "training" ? "data" : "val-data"));
  std::vector<int> inputs = m.dataInputs(fn);
  // Several token files: a comma-separated list, a glob, or a directory of
  // *.bin / *.u32 shards (and no .npy arrays).
  bool tokenDir = false;
  if (isDirectory(path)) {
    std::error_code ec;
    bool npy = false, bin = false;
    for (const auto &e : std::filesystem::directory_iterator(path, ec)) {
      std::string ext = e.path().extension().string();
      npy |= ext == ".npy";
      bin |= ext == ".bin" || ext == ".u32";
    }
    tokenDir = bin && !npy;
  }
  if (path.find(',') != std::string::npos || path.find_first_of("*?[") != std::string::npos ||
      tokenDir)
    return TokenSource::open(path, m, inputs, seed, shard);
  if (!pathExists(path))
    return Status::error(fmt::format(
        "{} data '{}' does not exist{}", what, path,
        path.find(".bin") != std::string::npos
            ? "; for the shakespeare_char examples run: kiln-run prepare "
              "examples/data/tinyshakespeare.txt data/shakespeare_char"
            : ""));
  if (isDirectory(path))
    return NpySource::open(path, m, inputs, seed, shuffle, shard, shuffleBuffer, last);
  return TokenSource::open(path, m, inputs, seed, shard);
}

Status copyBatch(Backend &e, const std::vector<int> &inputs, const Batch &b) {
  for (size_t k = 0; k < inputs.size(); ++k)
    if (Status s = e.write(inputs[k], b.bytes[k].data(), b.bytes[k].size()); !s)
      return s;
  return Status::ok();
}

} // namespace kiln::train
