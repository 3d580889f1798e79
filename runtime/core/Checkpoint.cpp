//===- Checkpoint.cpp - safetensors checkpoints, written atomically -------===//
#include "runtime/core/Checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kiln::ckpt {

const Tensor *Checkpoint::find(const std::string &name) const {
  for (const Tensor &t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

int dtypeWidth(const std::string &d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

uint32_t crc32(const void *data, size_t size, uint32_t crc) {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  const unsigned char *p = static_cast<const unsigned char *>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i)
    crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {
Status sysError(const std::string &what, const std::string &path) {
  return Status::error(fmt::format("cannot {} '{}': {}", what, path,
                                   std::strerror(errno)));
}

/// Fault injection for tests (docs/testing.md): KILN_FAULT_INJECT set to
/// `checkpoint-kill@N` or `checkpoint-enospc@N` makes a checkpoint write stop
/// after N bytes of its temporary file, by SIGKILL (a crash mid-write) or as
/// if the disk were full. Read once; unset in normal runs.
struct Fault {
  enum Kind { None, Kill, NoSpace } kind = None;
  size_t after = 0;
};
const Fault &fault() {
  static Fault f = [] {
    Fault r;
    const char *v = std::getenv("KILN_FAULT_INJECT");
    if (!v)
      return r;
    std::string spec(v);
    size_t at = spec.find('@');
    std::string what = spec.substr(0, at);
    if (what == "checkpoint-kill")
      r.kind = Fault::Kill;
    else if (what == "checkpoint-enospc")
      r.kind = Fault::NoSpace;
    if (at != std::string::npos)
      r.after = size_t(std::strtoull(spec.c_str() + at + 1, nullptr, 10));
    return r;
  }();
  return f;
}

Status writeAll(int fd, const char *p, size_t n, const std::string &path) {
  size_t written = 0;
  const Fault &f = fault();
  while (n > 0) {
    size_t chunk = n;
    if (f.kind != Fault::None) {
      if (written >= f.after) {
        if (f.kind == Fault::Kill) {
          ::fsync(fd); // what was written is on disk, as after a real crash
          ::raise(SIGKILL);
        }
        errno = ENOSPC;
        return sysError("write", path);
      }
      chunk = std::min(n, f.after - written);
    }
    ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return sysError("write", path);
    }
    p += w;
    n -= size_t(w);
    written += size_t(w);
  }
  return Status::ok();
}

/// What a failed write leaves: the checkpoint at `path` as it was.
Status keptPrevious(const Status &s, const std::string &path) {
  bool previous = ::access(path.c_str(), F_OK) == 0;
  return Status::error(s.message() +
                       (previous ? "; the previous checkpoint '" + path + "' is unchanged"
                                 : "; no checkpoint was written to '" + path + "'") +
                       " (free space or choose another --checkpoint path)",
                       s.kind());
}
} // namespace

namespace {
/// The metadata entry holding the CRC-32 of the whole file, and the one
/// that held the CRC-32 of the data only (checkpoints written before the
/// header was covered; still read).
constexpr const char *kFileCrcKey = "kiln.file_crc32";
constexpr const char *kDataCrcKey = "kiln.crc32";

/// The offset of the file CRC's eight hex digits in `image` (whose header
/// ends at `headerEnd`), or npos. The entry is the header's last of its
/// kind: a key and its opening quote appear unescaped only as a key.
size_t crcDigits(const std::string &image, size_t headerEnd) {
  std::string token = fmt::format("\"{}\":\"", kFileCrcKey);
  if (headerEnd > image.size() || headerEnd < 8 + token.size() + 8)
    return std::string::npos;
  // The token and its eight digits lie inside the header.
  size_t at = image.rfind(token, headerEnd - token.size() - 8);
  if (at == std::string::npos || at < 8)
    return std::string::npos;
  return at + token.size();
}

/// Whether `key` is `name` damaged by one byte: at most two edits apart (a
/// byte changed into a backslash also turns the next two into one escaped
/// character), but not `name` itself.
bool oneByteFrom(const std::string &key, const char *name) {
  std::string n = name;
  if (key == n || key.size() > n.size() + 2 || key.size() + 2 < n.size())
    return false;
  // Levenshtein distance, one row at a time.
  std::vector<size_t> row(n.size() + 1);
  for (size_t j = 0; j <= n.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= key.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= n.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (key[i - 1] != n[j - 1])});
      diag = up;
    }
  }
  return row[n.size()] <= 2;
}

/// The CRC-32 of `image` with the eight bytes at `at` read as '0's.
uint32_t fileCrc(const std::string &image, size_t at) {
  static const char zeros[8] = {'0', '0', '0', '0', '0', '0', '0', '0'};
  uint32_t crc = crc32(image.data(), at);
  crc = crc32(zeros, 8, crc);
  return crc32(image.data() + at + 8, image.size() - at - 8, crc);
}
} // namespace

Expected<std::string> serialize(const Checkpoint &c) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  std::vector<std::string> seen;
  for (const Tensor &t : c.tensors) {
    int w = dtypeWidth(t.dtype);
    if (w == 0)
      return Status::internal("checkpoint tensor '" + t.name +
                              "' has unknown dtype '" + t.dtype + "'");
    int64_t n = 1;
    for (int64_t d : t.shape)
      n *= d;
    if (size_t(n) * size_t(w) != t.bytes.size())
      return Status::internal("checkpoint tensor '" + t.name +
                              "' has the wrong number of bytes");
    if (std::find(seen.begin(), seen.end(), t.name) != seen.end() ||
        t.name == "__metadata__")
      return Status::internal("checkpoint tensor name '" + t.name +
                              "' is repeated or reserved");
    seen.push_back(t.name);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto &[k, v] : c.metadata)
    if (k != kFileCrcKey && k != kDataCrcKey)
      meta[k] = v;
  // The last entry: the whole file's CRC-32, computed with its own eight
  // digits as zeros, then written over them (fileCrc()).
  meta[kFileCrcKey] = std::string(8, '0');
  header["__metadata__"] = meta;
  std::string json = header.dump();
  while (json.size() % 8 != 0)
    json += ' ';
  uint64_t len = json.size();
  char lenBytes[8];
  for (int k = 0; k < 8; ++k)
    lenBytes[k] = char((len >> (8 * k)) & 0xff);
  std::string image = std::string(lenBytes, 8) + json + data;
  size_t at = crcDigits(image, 8 + len);
  if (at == std::string::npos)
    return Status::internal("checkpoint: the CRC entry is missing from the header");
  std::string digits = fmt::format("{:08x}", fileCrc(image, at));
  image.replace(at, 8, digits);
  return image;
}

Status write(const std::string &path, const Checkpoint &c) {
  Expected<std::string> image = serialize(c);
  if (!image)
    return image.status();
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return sysError("create", tmp);
  Status s = writeAll(fd, image->data(), image->size(), tmp);
  if (s && ::fsync(fd) != 0)
    s = sysError("fsync", tmp);
  if (::close(fd) != 0 && s)
    s = sysError("close", tmp);
  if (!s) {
    ::unlink(tmp.c_str());
    return keptPrevious(s, path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status e = sysError("rename the new checkpoint to", path);
    ::unlink(tmp.c_str());
    return e;
  }
  std::string dir = path.find('/') == std::string::npos
                        ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty())
    dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

namespace {
bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
} // namespace

Status checkWritable(const std::string &path) {
  if (isDirectory(path))
    return Status::error(fmt::format("the checkpoint path '{}' is a directory; give a file name "
                                     "(--checkpoint DIR/model.ckpt)", path));
  // A new file of a unique name in the same folder (write() creates its
  // temporary file there too); nothing else is touched.
  std::string probe = path + ".probe.XXXXXX";
  int fd = ::mkstemp(probe.data());
  if (fd < 0)
    return Status::error(fmt::format("cannot write the checkpoint '{}': creating a file next "
                                     "to it failed: {}; give a --checkpoint in a folder that "
                                     "exists and is writable",
                                     path, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

std::vector<std::string> removeStaleTemporaries(const std::string &path) {
  std::vector<std::string> removed;
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (dir.empty())
    dir = "/";
  std::string prefix =
      (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  // The largest process id (Linux: /proc/sys/kernel/pid_max; at most 2^22).
  long pidMax = 1 << 22;
  if (std::ifstream f("/proc/sys/kernel/pid_max"); f)
    f >> pidMax;
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return removed;
  while (struct dirent *e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0)
      continue;
    // Exactly what write() names its file: a process id as printed (no
    // leading zero), within the kernel's range; anything else (a backup
    // named PATH.tmp.20241204) is not ours.
    std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits[0] == '0' ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    long pid = std::stol(digits);
    if (pid > pidMax)
      continue;
    // A process that still runs may be writing it (another run on the same
    // path): leave it.
    if (pid == long(::getpid()) || ::kill(pid_t(pid), 0) == 0 || errno != ESRCH)
      continue;
    // Only a regular file of ours (not a link, not another user's).
    std::string full = dir == "/" ? "/" + name : dir + "/" + name;
    struct stat st;
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    if (slash == std::string::npos)
      full = name;
    if (::unlink(full.c_str()) == 0)
      removed.push_back(full);
  }
  ::closedir(d);
  std::sort(removed.begin(), removed.end());
  return removed;
}

Expected<Checkpoint> read(const std::string &path) {
  if (isDirectory(path))
    return Status::error(
        fmt::format("cannot open checkpoint '{}': it is a directory; give the checkpoint file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return sysError("open checkpoint", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

Expected<Checkpoint> parse(const std::string &b, const std::string &path) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "checkpoint '{}' is corrupt or not a safetensors file: {}", path, why));
  };
  if (b.size() < 8)
    return bad(fmt::format("only {} bytes", b.size()));
  uint64_t len = 0;
  for (int k = 0; k < 8; ++k)
    len |= uint64_t(static_cast<unsigned char>(b[k])) << (8 * k);
  if (len > b.size() - 8 || len > (uint64_t(100) << 20))
    return bad(fmt::format("header length {} exceeds the file ({} bytes)", len,
                           b.size()));
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(
      b.begin() + 8, b.begin() + 8 + long(len), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return bad("the header is not a JSON object");
  size_t dataStart = 8 + len, dataSize = b.size() - dataStart;
  Checkpoint c;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        return bad("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return bad("metadata '" + m.key() + "' is not a string");
        c.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::ordered_json &e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !e.contains("shape") || !e["shape"].is_array() ||
        !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      return bad("entry '" + it.key() + "' lacks dtype, shape or data_offsets");
    Tensor t;
    t.name = it.key();
    t.dtype = e["dtype"].get<std::string>();
    int w = dtypeWidth(t.dtype);
    if (w == 0)
      return bad("tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'");
    uint64_t n = 1;
    for (const auto &d : e["shape"]) {
      if (!d.is_number_unsigned())
        return bad("tensor '" + t.name + "' has a bad shape");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && n > (uint64_t(1) << 48) / v)
        return bad("tensor '" + t.name + "' is impossibly large");
      n *= v;
      t.shape.push_back(int64_t(v));
    }
    const auto &off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad("tensor '" + t.name + "' has bad data_offsets");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > dataSize)
      return bad(fmt::format("tensor '{}' claims bytes [{}, {}) of a {}-byte data "
                             "section (truncated file?)", t.name, begin, end, dataSize));
    if (end - begin != n * uint64_t(w))
      return bad(fmt::format("tensor '{}' has {} bytes but its shape needs {}",
                             t.name, end - begin, n * uint64_t(w)));
    ranges.push_back({begin, end});
    t.bytes = b.substr(dataStart + begin, end - begin);
    c.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k)
    if (ranges[k].first < ranges[k - 1].second)
      return bad("two tensors overlap in the data section");
  // Kiln's checkpoints carry the CRC-32 of the whole file (header, names,
  // metadata and data); older ones that of the data only. A file with
  // Kiln's metadata but neither (a damaged key) is refused; a safetensors
  // file from elsewhere has none and is read unverified.
  auto fileCrcIt = c.metadata.find(kFileCrcKey);
  auto dataCrcIt = c.metadata.find(kDataCrcKey);
  if (fileCrcIt != c.metadata.end()) {
    size_t at = crcDigits(b, dataStart);
    if (at == std::string::npos || b.compare(at, 8, fileCrcIt->second) != 0)
      return bad("its CRC entry is malformed: the file was damaged after it was written");
    std::string got = fmt::format("{:08x}", fileCrc(b, at));
    if (got != fileCrcIt->second)
      return bad("the file does not match its CRC-32 (" + got + " vs " + fileCrcIt->second +
                 "): it was damaged after it was written");
    c.metadata.erase(fileCrcIt);
    c.verified = Checkpoint::Verified::File;
  } else if (dataCrcIt != c.metadata.end()) {
    std::string got = fmt::format("{:08x}", crc32(b.data() + dataStart, dataSize));
    if (got != dataCrcIt->second)
      return bad("the data does not match its CRC-32 (" + got + " vs " +
                 dataCrcIt->second + "): the file was damaged after it was written");
    c.metadata.erase(dataCrcIt);
    c.verified = Checkpoint::Verified::Data;
  } else {
    // No CRC entry, but one byte away from one: a damaged key.
    for (const auto &[k, v] : c.metadata)
      if (oneByteFrom(k, kFileCrcKey) || oneByteFrom(k, kDataCrcKey))
        return bad(fmt::format("its metadata has '{}', one byte from Kiln's CRC-32 entry "
                               "'{}', and no CRC-32 entry: the file was damaged after it was "
                               "written",
                               k, oneByteFrom(k, kFileCrcKey) ? kFileCrcKey : kDataCrcKey));
  }
  return c;
}

} // namespace kiln::ckpt
