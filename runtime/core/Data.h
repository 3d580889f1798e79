//===- Data.h - Training data: token files, .npy arrays, batches -*- C++
//-*-===//
//
// The runtime's data pipeline (no MLIR, no LLVM):
//   - prepareCharDataset: a text file -> character vocabulary (vocab.json),
//     train.bin / val.bin of uint16 tokens (nanoGPT's shakespeare_char format)
//   - TokenFile: flat uint16/uint32 token files (memory-mapped); random
//     (x, y) windows of a language model, y shifted by one
//   - NpyArray: .npy files (features, labels) for classifiers
//   - TokenShards: several token files as one source of windows
//   - Prefetcher: builds the next batches on worker threads, in step order
// Every batch is a pure function of (seed, step), so a resumed run draws the
// same batches as an uninterrupted one. Every problem with a file is a Status
// naming the file and what is wrong.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_DATA_H
#define KILN_RUNTIME_CORE_DATA_H

#include "runtime/core/Status.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kiln::data {

struct CharDatasetInfo {
  /// The characters (Unicode code points, each as its UTF-8), sorted;
  /// token i is vocab[i].
  std::vector<std::string> vocab;
  int64_t trainTokens = 0;
  int64_t valTokens = 0;
};

/// Reads `textPath`, writes `outDir/{train.bin,val.bin,vocab.json}`; the
/// last `valFraction` of the text is the validation split.
Expected<CharDatasetInfo> prepareCharDataset(const std::string &textPath,
                                             const std::string &outDir,
                                             double valFraction = 0.1);

/// Reads vocab.json written by prepareCharDataset: one character (UTF-8)
/// per token.
Expected<std::vector<std::string>> readVocab(const std::string &path);
/// The length of the UTF-8 character at s[k] (1 to 4), 0 if not one.
size_t utf8CharLength(const std::string &s, size_t k);

/// A flat file of little-endian tokens, memory-mapped read-only: opening
/// costs one pass over the mapping for the vocabulary check (no copy); the
/// pages stay in the page cache, shared by every reader.
class TokenFile {
public:
  enum class Width { U16 = 2, U32 = 4 };
  /// Validates size (a multiple of the width, enough tokens for one window)
  /// and, when `vocabSize` > 0, that every token is below it.
  static Expected<TokenFile> open(const std::string &path, Width width,
                                  int64_t context, int64_t vocabSize);
  int64_t size() const { return size_; }
  uint32_t operator[](int64_t i) const {
    if (width_ == Width::U16) {
      uint16_t v;
      std::memcpy(&v, data_ + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }
  const std::string &path() const { return path_; }
  Width width() const { return width_; }

  /// Fills x and y ([batch, context] each, row-major) with windows starting
  /// at offsets drawn from (seed, step): y[i] = x[i + 1].
  void sampleWindows(uint64_t seed, uint64_t step, int64_t batch,
                     int64_t context, std::vector<int32_t> &x,
                     std::vector<int32_t> &y) const;

private:
  std::string path_;
  std::shared_ptr<const void> map_; ///< unmaps when the last copy goes
  const unsigned char *data_ = nullptr;
  int64_t size_ = 0;
  Width width_ = Width::U16;
};

/// The width of a token file by its name: uint32 when it ends in ".u32" or
/// ".u32.bin", else uint16 (nanoGPT's .bin).
TokenFile::Width tokenWidthOf(const std::string &path);

/// The token files a --data value names, in order: comma-separated entries,
/// each a file, a glob ("data/train-*.bin", sorted) or a directory (its
/// *.bin and *.u32 files, sorted). An entry that names nothing is an error.
Expected<std::vector<std::string>> expandTokenPaths(const std::string &spec);

/// Several token files read as one: window w of a step is drawn uniformly
/// over the valid window starts of all shards together (so a shard is
/// chosen in proportion to its size minus the context), then falls inside
/// one shard; windows never cross a shard's end. One shard draws exactly
/// the windows of TokenFile::sampleWindows.
class TokenShards {
public:
  /// Every file holds tokens of the width its name says (tokenWidthOf); all
  /// the same width, each checked as TokenFile::open checks it.
  static Expected<TokenShards> open(const std::vector<std::string> &paths,
                                    int64_t context, int64_t vocabSize);
  const std::vector<TokenFile> &files() const { return files_; }
  int64_t tokens() const;
  void sampleWindows(uint64_t seed, uint64_t step, int64_t batch,
                     int64_t context, std::vector<int32_t> &x,
                     std::vector<int32_t> &y) const;

private:
  std::vector<TokenFile> files_;
  std::vector<uint64_t> firstWindow_; ///< prefix sums of each file's windows
  uint64_t windows_ = 0;
};

/// A .npy array (version 1/2, little-endian, C order) of f32, f64, i32, i64,
/// u8 or u16, converted to double or int64 storage.
struct NpyArray {
  std::string path;
  std::string descr; ///< numpy dtype string, e.g. "<f4"
  std::vector<int64_t> shape;
  std::vector<double> f;   ///< float data
  std::vector<int64_t> i;  ///< integer data
  bool isFloat() const { return !f.empty() || descr[1] == 'f'; }
  int64_t numel() const;
};

Expected<NpyArray> readNpy(const std::string &path);
Status writeNpy(const std::string &path, const NpyArray &array);

/// How a Prefetcher runs: how far ahead, on how many threads, and how long
/// the consumer waits before it gives up.
struct PrefetchOptions {
  /// Batches produced ahead of the consumer (in production or ready), >= 1.
  size_t depth = 3;
  /// Threads producing batches at once, >= 1; the producer must be safe to
  /// call concurrently (DataSource::batch is).
  int workers = 1;
  /// next() returns an error when its batch has not come within this many
  /// seconds (a stuck file system, a producer that never returns).
  double timeoutSeconds = 600;
  /// The destructor waits this long for workers still in the producer,
  /// then leaves them to finish on their own (detached: the producer must
  /// own what it uses, e.g. hold the DataSource by shared_ptr).
  double shutdownSeconds = 10;
  /// next() returns an error as soon as this is set (another replica
  /// failed); may be null.
  const std::atomic<bool> *cancel = nullptr;
  /// Names the data in errors, e.g. "data/train.bin".
  std::string what = "the data";
};

/// Produces batches on `workers` background threads, up to `depth` ahead of
/// the consumer, and hands them out strictly in step order: batch s is
/// producer(s) whichever worker made it, so what the consumer sees does not
/// depend on the worker count or the depth. A producer that throws makes
/// next() return an error naming the batch and the data at that step. No
/// wait is unbounded: the consumer gives up after
/// PrefetchOptions::timeoutSeconds or on cancel, the destructor after
/// shutdownSeconds (workers share the state with the Prefetcher, so one
/// stuck in the producer may outlive it safely).
template <typename Batch> class Prefetcher {
public:
  using Producer = std::function<Batch(uint64_t step)>;
  Prefetcher(Producer producer, uint64_t firstStep, PrefetchOptions o)
      : s_(std::make_shared<State>()) {
    s_->producer = std::move(producer);
    s_->claim = s_->want = firstStep;
    s_->o = std::move(o);
    s_->o.depth = std::max<size_t>(s_->o.depth, 1);
    s_->alive = std::max(s_->o.workers, 1);
    for (int k = 0; k < s_->alive; ++k)
      workers_.emplace_back([s = s_] { work(*s); });
  }
  /// One worker, `depth` ahead.
  Prefetcher(Producer producer, uint64_t firstStep, size_t depth = 2)
      : Prefetcher(std::move(producer), firstStep, PrefetchOptions{depth, 1}) {}
  ~Prefetcher() {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->stop = true;
    s_->cv.notify_all();
    bool done = s_->cv.wait_for(
        lock,
        std::chrono::duration<double>(std::max(s_->o.shutdownSeconds, 0.0)),
        [&] { return s_->alive == 0; });
    lock.unlock();
    for (std::thread &t : workers_)
      done ? t.join() : t.detach();
  }
  Prefetcher(const Prefetcher &) = delete;
  Prefetcher &operator=(const Prefetcher &) = delete;

  /// The next batch, in step order, or why there is none.
  Expected<Batch> next() {
    using clock = std::chrono::steady_clock;
    State &s = *s_;
    auto deadline =
        clock::now() + std::chrono::duration_cast<clock::duration>(
                           std::chrono::duration<double>(s.o.timeoutSeconds));
    std::unique_lock<std::mutex> lock(s.mu);
    while (true) {
      auto it = s.ready.find(s.want);
      if (it != s.ready.end()) {
        Slot slot = std::move(it->second);
        s.ready.erase(it);
        uint64_t step = s.want++;
        lock.unlock();
        s.cv.notify_all();
        if (!slot.batch)
          return Status::error("cannot make batch " + std::to_string(step) +
                               " of " + s.o.what + ": " + slot.error);
        return std::move(*slot.batch);
      }
      if (s.o.cancel && s.o.cancel->load())
        return Status::error("stopped waiting for batch " +
                             std::to_string(s.want) + " of " + s.o.what +
                             ": the run was cancelled");
      if (clock::now() >= deadline)
        return Status::error("batch " + std::to_string(s.want) + " of " +
                             s.o.what + " did not come within " +
                             std::to_string(int64_t(s.o.timeoutSeconds)) +
                             " s: the data workers are stuck or far too slow "
                             "(check the file system, raise --data-workers)");
      s.cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

private:
  struct Slot {
    std::optional<Batch> batch;
    std::string error;
  };
  /// What the workers share with the Prefetcher (and keep alive).
  struct State {
    Producer producer;
    uint64_t claim = 0; ///< the next step a worker takes
    uint64_t want = 0;  ///< the next step the consumer takes
    PrefetchOptions o;
    std::map<uint64_t, Slot> ready;
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    int alive = 0; ///< workers not yet returned
  };
  static void work(State &s) {
    while (true) {
      uint64_t step;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return s.stop || s.claim < s.want + s.o.depth; });
        if (s.stop) {
          --s.alive;
          s.cv.notify_all();
          return;
        }
        step = s.claim++;
      }
      Slot slot;
      try {
        slot.batch.emplace(s.producer(step));
      } catch (const std::exception &e) {
        slot.error = e.what();
      } catch (...) {
        slot.error = "unknown exception in a data worker";
      }
      {
        std::lock_guard<std::mutex> lock(s.mu);
        s.ready.emplace(step, std::move(slot));
      }
      s.cv.notify_all();
    }
  }

  std::shared_ptr<State> s_;
  std::vector<std::thread> workers_;
};

} // namespace kiln::data

#endif // KILN_RUNTIME_CORE_DATA_H
