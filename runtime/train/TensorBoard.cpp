//===- TensorBoard.cpp - Scalars in TensorBoard's event files -------------===//
#include "runtime/train/TensorBoard.h"

#include "runtime/train/Trainer.h"

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

namespace kiln::train {

namespace tfrecord {

namespace {
/// The byte-at-a-time table of the reflected Castagnoli polynomial.
std::array<uint32_t, 256> makeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

/// Protobuf wire types.
enum Wire : uint32_t { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };

void putKey(std::string &out, uint32_t field, Wire w) { putVarint(out, (field << 3) | w); }

void putBytes(std::string &out, uint32_t field, std::string_view bytes) {
  putKey(out, field, Bytes);
  putVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

/// Event fields 1 (wall_time) and 2 (step).
std::string eventHead(double wallTime, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wallTime, 8);
  putKey(e, 1, Fixed64);
  putFixed64(e, bits);
  if (step != 0) { // proto3: a zero is left out
    putKey(e, 2, Varint);
    putVarint(e, uint64_t(step));
  }
  return e;
}
} // namespace

uint32_t crc32c(const void *data, size_t n) {
  static const std::array<uint32_t, 256> table = makeTable();
  const auto *p = static_cast<const unsigned char *>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i)
    c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void putVarint(std::string &out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void putFixed32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(char((v >> (8 * i)) & 0xFF));
}

void putFixed64(std::string &out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(char((v >> (8 * i)) & 0xFF));
}

std::string record(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  putFixed64(r, data.size());
  putFixed32(r, masked(crc32c(r.data(), 8)));
  r.append(data.data(), data.size());
  putFixed32(r, masked(crc32c(data.data(), data.size())));
  return r;
}

std::string versionEvent(double wallTime) {
  std::string e = eventHead(wallTime, 0);
  putBytes(e, 3, "brain.Event:2");
  return e;
}

std::string scalarEvent(double wallTime, int64_t step, std::string_view tag, float value) {
  std::string v; // Summary.Value
  putBytes(v, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  putKey(v, 2, Fixed32);
  putFixed32(v, bits);
  std::string summary;
  putBytes(summary, 1, v);
  std::string e = eventHead(wallTime, step);
  putBytes(e, 5, summary);
  return e;
}

} // namespace tfrecord

namespace {
double wallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
} // namespace

Expected<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string &dir) {
  if (dir.empty())
    return Status::error("--tensorboard needs a directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    return Status::error(fmt::format("cannot create the TensorBoard directory '{}': {}; choose "
                                     "another --tensorboard "
                                     "directory",
                                     dir, ec ? ec.message() : "it is not a directory"));
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
    std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = 0;
  std::string base = fmt::format("{}/events.out.tfevents.{}.{}.{}.kiln", dir,
                                 (long long)std::time(nullptr), host, (long long)getpid());
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter);
  w->dir_ = dir;
  // A second writer of this process within the same second gets ".2", ...
  for (int n = 1; w->fd_ < 0; ++n) {
    w->path_ = n == 1 ? base : fmt::format("{}.{}", base, n);
    w->fd_ = ::open(w->path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd_ < 0 && (errno != EEXIST || n == 100))
      return Status::error(fmt::format("cannot create an event file in the TensorBoard "
                                       "directory '{}': {}; choose another "
                                       "--tensorboard directory",
                                       dir, std::strerror(errno)));
  }
  if (Status s = w->append(tfrecord::record(tfrecord::versionEvent(wallNow()))); !s)
    return s;
  return w;
}

TensorBoardWriter::~TensorBoardWriter() { (void)close(); }

Status TensorBoardWriter::append(const std::string &bytes) {
  if (!status_)
    return status_;
  off_t good = lseek(fd_, 0, SEEK_END);
  const char *p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      // No half record: the reader stops at a truncated one.
      if (good >= 0)
        (void)!ftruncate(fd_, good);
      status_ = Status::error(fmt::format("cannot write the TensorBoard event file "
                                          "'{}': {}; its scalars stop at the last "
                                          "complete record (free space in '{}' or "
                                          "choose another --tensorboard directory)",
                                          path_, std::strerror(err), dir_));
      return status_;
    }
    p += n;
    left -= size_t(n);
  }
  return Status::ok();
}

Status TensorBoardWriter::write(int64_t step, const std::vector<Scalar> &values) {
  if (fd_ < 0 && status_)
    return Status::internal("TensorBoardWriter::write after close");
  double now = wallNow();
  std::string bytes;
  for (const Scalar &v : values)
    bytes += tfrecord::record(tfrecord::scalarEvent(now, step, v.tag, v.value));
  // One write per batch: the file holds whole batches (what TensorBoard's
  // reader polls) as soon as this returns.
  return append(bytes);
}

Status TensorBoardWriter::close() {
  if (fd_ >= 0) {
    if (::close(fd_) != 0 && status_)
      status_ = Status::error(fmt::format("cannot close the TensorBoard event file '{}': {}", path_,
                                          std::strerror(errno)));
    fd_ = -1;
  }
  return status_;
}

void attachTensorBoard(TrainOptions &o, std::shared_ptr<TensorBoardWriter> w, Sink out) {
  auto warned = std::make_shared<bool>(false);
  auto report = [w, out, warned](const Status &s) {
    if (!s && !*warned) {
      *warned = true;
      emit(out, Channel::Warning, s.message() + "; training goes on");
    }
  };
  auto prevLog = o.onLog;
  o.onLog = [w, report, prevLog](const LogPoint &p) {
    if (prevLog)
      prevLog(p);
    std::vector<Scalar> v = {
        {"train/loss", float(p.loss)},
        {"train/lr", p.lr},
        {"train/grad_norm", p.gradNorm},
        {p.tokens ? "perf/tokens_per_second" : "perf/samples_per_second", float(p.itemsPerSecond)},
        {"perf/step_time_ms", float(p.msPerStep)},
    };
    if (p.skippedSteps >= 0) { // a program with loss scaling
      v.push_back({"train/loss_scale", p.lossScale});
      v.push_back({"train/skipped_steps", float(p.skippedSteps)});
    }
    report(w->write(p.step, v));
  };
  auto prevEval = o.onEval;
  o.onEval = [w, report, prevEval](const EvalPoint &p) {
    if (prevEval)
      prevEval(p);
    std::vector<Scalar> v = {{"val/loss", float(p.loss)}};
    if (p.accuracy >= 0)
      v.push_back({"val/accuracy", float(p.accuracy)});
    report(w->write(p.step, v));
  };
}

} // namespace kiln::train
