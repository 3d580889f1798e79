//===- Data.h - Training data: token files, .npy arrays, batches -*- C++ -*-===//
//
// The runtime's data pipeline (no MLIR, no LLVM):
//   - prepareCharDataset: a text file -> character vocabulary (vocab.json),
//     train.bin / val.bin of uint16 tokens (nanoGPT's shakespeare_char format)
//   - TokenFile: flat uint16/uint32 token files; random (x, y) windows of a
//     language model, y shifted by one
//   - NpyArray: .npy files (features, labels) for classifiers
//   - Prefetcher: builds the next batches on its own thread
// Every batch is a pure function of (seed, step), so a resumed run draws the
// same batches as an uninterrupted one. Every problem with a file is a Status
// naming the file and what is wrong.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_DATA_H
#define KILN_RUNTIME_CORE_DATA_H

#include "runtime/core/Status.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::data {

struct CharDatasetInfo {
  std::string vocab;      ///< The characters, sorted; token i is vocab[i].
  int64_t trainTokens = 0;
  int64_t valTokens = 0;
};

/// Reads `textPath`, writes `outDir/{train.bin,val.bin,vocab.json}`; the
/// last `valFraction` of the text is the validation split.
Expected<CharDatasetInfo> prepareCharDataset(const std::string &textPath,
                                             const std::string &outDir,
                                             double valFraction = 0.1);

/// Reads vocab.json written by prepareCharDataset.
Expected<std::string> readVocab(const std::string &path);

/// A flat file of tokens, fully loaded (the data sets Kiln targets fit in
/// memory; mmap can replace this without changing the interface).
class TokenFile {
public:
  enum class Width { U16 = 2, U32 = 4 };
  /// Validates size (a multiple of the width, enough tokens for one window)
  /// and, when `vocabSize` > 0, that every token is below it.
  static Expected<TokenFile> open(const std::string &path, Width width,
                                  int64_t context, int64_t vocabSize);
  int64_t size() const { return int64_t(tokens_.size()); }
  uint32_t operator[](int64_t i) const { return tokens_[i]; }
  const std::string &path() const { return path_; }

  /// Fills x and y ([batch, context] each, row-major) with windows starting
  /// at offsets drawn from (seed, step): y[i] = x[i + 1].
  void sampleWindows(uint64_t seed, uint64_t step, int64_t batch,
                     int64_t context, std::vector<int32_t> &x,
                     std::vector<int32_t> &y) const;

private:
  std::string path_;
  std::vector<uint32_t> tokens_;
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

/// Produces batches on a background thread, `depth` ahead of the consumer.
/// The producer is called with consecutive step numbers from `firstStep`.
template <typename Batch> class Prefetcher {
public:
  using Producer = std::function<Batch(uint64_t step)>;
  Prefetcher(Producer producer, uint64_t firstStep, size_t depth = 2)
      : producer_(std::move(producer)), next_(firstStep), depth_(depth) {
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher &) = delete;
  Prefetcher &operator=(const Prefetcher &) = delete;

  /// The next batch, in step order.
  Batch next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    return b;
  }

private:
  void run() {
    while (true) {
      uint64_t step;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_)
          return;
        step = next_++;
      }
      Batch b = producer_(step);
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  }

  Producer producer_;
  uint64_t next_;
  size_t depth_;
  std::deque<Batch> queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace kiln::data

#endif // KILN_RUNTIME_CORE_DATA_H
