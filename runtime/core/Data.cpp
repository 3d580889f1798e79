//===- Data.cpp - Training data: token files, .npy arrays, batches --------===//
#include "runtime/core/Data.h"

#include "runtime/core/Random.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln::data {
namespace {

/// The first 6 bytes of every .npy file.
constexpr char kNpyMagic[] = "\x93NUMPY";

Expected<std::string> readWhole(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(fmt::format("cannot open '{}': {}", path,
                                     std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof())
    return Status::error(fmt::format("cannot read '{}'", path));
  return ss.str();
}

Status writeWhole(const std::string &path, const std::string &bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return Status::error(fmt::format("cannot write '{}': {}", tmp,
                                       std::strerror(errno)));
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out)
      return Status::error(fmt::format("cannot write '{}' (disk full?)", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::error(fmt::format("cannot rename '{}' to '{}': {}", tmp,
                                     path, std::strerror(errno)));
  return Status::ok();
}

/// One character of the vocabulary as a JSON string's contents: quotes,
/// backslashes and control characters escaped, the rest as its UTF-8.
std::string jsonEscape(const std::string &ch) {
  if (ch.size() == 1) {
    switch (ch[0]) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
    }
    unsigned char u = static_cast<unsigned char>(ch[0]);
    if (u < 0x20 || u == 0x7f)
      return fmt::format("\\u{:04x}", u);
  }
  return ch;
}

/// The length of the UTF-8 character at `s[k]` (1 to 4), or 0 when the
/// bytes there are not one (a stray continuation byte, a truncated or
/// overlong sequence, a surrogate, past U+10FFFF).
size_t utf8Length(const std::string &s, size_t k) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(k);
  size_t len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3
               : c >= 0xF0 && c < 0xF5 ? 4 : 0;
  if (len == 0 || k + len > s.size())
    return 0;
  for (size_t i = 1; i < len; ++i)
    if ((b(k + i) & 0xC0) != 0x80)
      return 0;
  if ((c == 0xE0 && b(k + 1) < 0xA0) || (c == 0xED && b(k + 1) >= 0xA0) ||
      (c == 0xF0 && b(k + 1) < 0x90) || (c == 0xF4 && b(k + 1) >= 0x90))
    return 0; // overlong, a surrogate, or past U+10FFFF
  return len;
}

} // namespace

Expected<CharDatasetInfo> prepareCharDataset(const std::string &textPath,
                                             const std::string &outDir,
                                             double valFraction) {
  Expected<std::string> text = readWhole(textPath);
  if (!text)
    return text.status();
  if (text->size() < 2)
    return Status::error(fmt::format(
        "'{}' has {} bytes; a character data set needs text", textPath,
        text->size()));
  if (!(valFraction > 0 && valFraction < 1))
    return Status::error("the validation fraction must be in (0, 1)");
  // Characters are Unicode code points, read as UTF-8 (as nanoGPT's
  // prepare.py reads its text); sorted by code point, which for UTF-8 is
  // the byte order of the encodings.
  std::vector<std::string> chars;
  std::vector<std::pair<int64_t, int64_t>> spans; // each character's bytes
  for (size_t k = 0; k < text->size();) {
    size_t len = utf8Length(*text, k);
    if (len == 0)
      return Status::error(fmt::format(
          "'{}' is not UTF-8 text: byte 0x{:02x} at offset {} does not start a UTF-8 "
          "character; convert the file (e.g. iconv -f latin1 -t utf-8)",
          textPath, static_cast<unsigned char>((*text)[k]), k));
    spans.push_back({int64_t(k), int64_t(len)});
    k += len;
  }
  for (const auto &[at, len] : spans)
    chars.push_back(text->substr(size_t(at), size_t(len)));
  std::sort(chars.begin(), chars.end());
  chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  if (chars.size() > 65536)
    return Status::error(fmt::format(
        "'{}' has {} distinct characters; token files hold at most 65536 (uint16)", textPath,
        chars.size()));
  CharDatasetInfo info;
  info.vocab = chars;
  std::map<std::string, int> lookup;
  for (size_t k = 0; k < chars.size(); ++k)
    lookup[chars[k]] = int(k);
  int64_t n = int64_t(spans.size());
  int64_t split = int64_t(double(n) * (1.0 - valFraction));
  auto encode = [&](int64_t begin, int64_t end) {
    std::string out;
    out.reserve(size_t(end - begin) * 2);
    for (int64_t k = begin; k < end; ++k) {
      auto [at, len] = spans[size_t(k)];
      uint16_t t = uint16_t(lookup[text->substr(size_t(at), size_t(len))]);
      out.push_back(char(t & 0xff));
      out.push_back(char(t >> 8));
    }
    return out;
  };
  std::error_code ec;
  std::filesystem::create_directories(outDir, ec);
  if (ec)
    return Status::error(fmt::format("cannot create '{}': {}", outDir, ec.message()));
  std::string vocab = "{\"vocab\": [";
  for (size_t k = 0; k < info.vocab.size(); ++k)
    vocab += (k ? ", \"" : "\"") + jsonEscape(info.vocab[k]) + "\"";
  vocab += "]}\n";
  if (Status s = writeWhole(outDir + "/train.bin", encode(0, split)); !s)
    return s;
  if (Status s = writeWhole(outDir + "/val.bin", encode(split, n)); !s)
    return s;
  if (Status s = writeWhole(outDir + "/vocab.json", vocab); !s)
    return s;
  info.trainTokens = split;
  info.valTokens = n - split;
  return info;
}

Expected<std::vector<std::string>> readVocab(const std::string &path) {
  Expected<std::string> text = readWhole(path);
  if (!text)
    return text.status();
  // {"vocab": ["a", "b", ...]}: one character (UTF-8) per entry.
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("vocab") || !j["vocab"].is_array())
    return Status::error(fmt::format(
        "'{}' is not a Kiln vocabulary (a JSON object with a \"vocab\" list)", path));
  std::vector<std::string> vocab;
  for (const auto &e : j["vocab"]) {
    if (!e.is_string())
      return Status::error(
          fmt::format("'{}': entry {} of the vocabulary is not a string", path, vocab.size()));
    std::string ch = e.get<std::string>();
    if (ch.empty() || utf8Length(ch, 0) != ch.size())
      return Status::error(fmt::format(
          "'{}': entry {} of the vocabulary is not one character", path, vocab.size()));
    vocab.push_back(std::move(ch));
  }
  return vocab;
}

size_t utf8CharLength(const std::string &s, size_t k) { return utf8Length(s, k); }

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token files are little-endian and read in place (TokenFile)");

Expected<TokenFile> TokenFile::open(const std::string &path, Width width,
                                    int64_t context, int64_t vocabSize) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    return Status::error(fmt::format("cannot read '{}': {}", path,
                                     S_ISDIR(st.st_mode) ? "it is a directory"
                                                         : std::strerror(err)));
  }
  size_t bytes = size_t(st.st_size);
  size_t w = size_t(width);
  // A NumPy array given where a token file belongs (its magic "\x93NUMPY").
  char magic[6] = {};
  if (bytes >= 6 && ::pread(fd, magic, 6, 0) == 6 && std::memcmp(magic, kNpyMagic, 6) == 0) {
    ::close(fd);
    return Status::error(fmt::format(
        "'{}' is a NumPy .npy file, not a token file: token data is raw uint16 tokens (uint32 "
        "when named *.u32; kiln-run prepare writes them); .npy data is a directory of arrays "
        "named after the model's inputs: give that directory",
        path));
  }
  if (bytes % w != 0) {
    ::close(fd);
    return Status::error(fmt::format(
        "'{}' has {} bytes, not a multiple of {} (is it a uint{} token file?)",
        path, bytes, w, w * 8));
  }
  size_t n = bytes / w;
  if (int64_t(n) < context + 1) {
    ::close(fd);
    return Status::error(fmt::format(
        "'{}' holds {} tokens but one window of the model needs {} (context + 1)",
        path, n, context + 1));
  }
  void *p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd); // the mapping keeps the file
  if (p == MAP_FAILED)
    return Status::error(fmt::format("cannot map '{}' ({} bytes): {}", path, bytes,
                                     std::strerror(err)));
  TokenFile f;
  f.path_ = path;
  f.map_ = std::shared_ptr<const void>(p, [bytes](const void *q) {
    ::munmap(const_cast<void *>(q), bytes);
  });
  f.data_ = static_cast<const unsigned char *>(p);
  f.size_ = int64_t(n);
  f.width_ = width;
  if (vocabSize > 0) {
    // One pass over the mapping (the largest token), a second only to say
    // where the first bad one is.
    ::madvise(p, bytes, MADV_SEQUENTIAL);
    uint32_t largest = 0;
    if (width == Width::U16) {
      const uint16_t *t = static_cast<const uint16_t *>(p);
      uint16_t m = 0;
      for (size_t k = 0; k < n; ++k)
        m = std::max(m, t[k]);
      largest = m;
    } else {
      const uint32_t *t = static_cast<const uint32_t *>(p);
      for (size_t k = 0; k < n; ++k)
        largest = std::max(largest, t[k]);
    }
    if (int64_t(largest) >= vocabSize)
      for (size_t k = 0; k < n; ++k)
        if (int64_t(f[int64_t(k)]) >= vocabSize)
          return Status::error(fmt::format(
              "'{}': token {} at position {} is outside the model's vocabulary of "
              "{} (was the file made for another vocabulary or as uint{}?)",
              path, f[int64_t(k)], k, vocabSize, w == 2 ? 32 : 16));
    ::madvise(p, bytes, MADV_RANDOM);
  }
  return f;
}

void TokenFile::sampleWindows(uint64_t seed, uint64_t step, int64_t batch,
                              int64_t context, std::vector<int32_t> &x,
                              std::vector<int32_t> &y) const {
  x.resize(size_t(batch * context));
  y.resize(size_t(batch * context));
  uint64_t windows = uint64_t(size() - context); // valid start offsets
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t start = random::bits(seed, 0x6b696c6e /* "kiln" */,
                                  step * uint64_t(batch) + uint64_t(b)) % windows;
    for (int64_t t = 0; t < context; ++t) {
      x[size_t(b * context + t)] = int32_t((*this)[int64_t(start) + t]);
      y[size_t(b * context + t)] = int32_t((*this)[int64_t(start) + t + 1]);
    }
  }
}

TokenFile::Width tokenWidthOf(const std::string &path) {
  auto ends = [&](const char *suffix) {
    size_t n = std::strlen(suffix);
    return path.size() >= n && path.compare(path.size() - n, n, suffix) == 0;
  };
  return ends(".u32") || ends(".u32.bin") ? TokenFile::Width::U32 : TokenFile::Width::U16;
}

Expected<std::vector<std::string>> expandTokenPaths(const std::string &spec) {
  std::vector<std::string> out;
  std::stringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    if (entry.empty())
      continue;
    std::error_code ec;
    if (entry.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      int rc = ::glob(entry.c_str(), 0, nullptr, &g);
      if (rc == GLOB_NOMATCH) {
        ::globfree(&g);
        return Status::error(fmt::format(
            "'{}' matches no file; name token files as a comma-separated list, a glob "
            "or a directory of *.bin shards", entry));
      }
      if (rc != 0) {
        ::globfree(&g);
        return Status::error(fmt::format("cannot expand '{}' (glob error {})", entry, rc));
      }
      for (size_t k = 0; k < g.gl_pathc; ++k)
        if (!std::filesystem::is_directory(g.gl_pathv[k], ec))
          out.push_back(g.gl_pathv[k]);
      ::globfree(&g);
    } else if (std::filesystem::is_directory(entry, ec)) {
      std::vector<std::string> found;
      for (const auto &e : std::filesystem::directory_iterator(entry, ec)) {
        std::string name = e.path().filename().string();
        auto ends = [&](const char *x) {
          size_t n = std::strlen(x);
          return name.size() >= n && name.compare(name.size() - n, n, x) == 0;
        };
        if (e.is_regular_file(ec) && (ends(".bin") || ends(".u32")))
          found.push_back(e.path().string());
      }
      if (found.empty())
        return Status::error(fmt::format(
            "directory '{}' holds no token shards (*.bin or *.u32 files)", entry));
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      if (!std::filesystem::exists(entry, ec))
        return Status::error(fmt::format("token file '{}' does not exist{}", entry,
                                         spec.find(',') != std::string::npos
                                             ? fmt::format(" (an entry of '{}')", spec)
                                             : ""));
      out.push_back(entry);
    }
  }
  if (out.empty())
    return Status::error(fmt::format("'{}' names no token file", spec));
  return out;
}

Expected<TokenShards> TokenShards::open(const std::vector<std::string> &paths,
                                        int64_t context, int64_t vocabSize) {
  if (paths.empty())
    return Status::internal("TokenShards::open: no files");
  TokenShards s;
  TokenFile::Width width = tokenWidthOf(paths[0]);
  for (const std::string &p : paths) {
    if (tokenWidthOf(p) != width)
      return Status::error(fmt::format(
          "token shards of mixed widths: '{}' holds uint{} tokens but '{}' uint{} (by its "
          "name: *.u32 and *.u32.bin are uint32, others uint16); write every shard with one "
          "width", paths[0], 8 * int(width), p, 8 * int(tokenWidthOf(p))));
    auto f = TokenFile::open(p, width, context, vocabSize);
    if (!f)
      return f.status();
    s.firstWindow_.push_back(s.windows_);
    s.windows_ += uint64_t(f->size() - context);
    s.files_.push_back(std::move(*f));
  }
  return s;
}

int64_t TokenShards::tokens() const {
  int64_t n = 0;
  for (const TokenFile &f : files_)
    n += f.size();
  return n;
}

void TokenShards::sampleWindows(uint64_t seed, uint64_t step, int64_t batch,
                                int64_t context, std::vector<int32_t> &x,
                                std::vector<int32_t> &y) const {
  x.resize(size_t(batch * context));
  y.resize(size_t(batch * context));
  for (int64_t b = 0; b < batch; ++b) {
    // The draw of TokenFile::sampleWindows, over all shards' windows.
    uint64_t w = random::bits(seed, 0x6b696c6e /* "kiln" */,
                              step * uint64_t(batch) + uint64_t(b)) % windows_;
    size_t k = size_t(std::upper_bound(firstWindow_.begin(), firstWindow_.end(), w) -
                      firstWindow_.begin()) - 1;
    const TokenFile &f = files_[k];
    int64_t start = int64_t(w - firstWindow_[k]);
    for (int64_t t = 0; t < context; ++t) {
      x[size_t(b * context + t)] = int32_t(f[start + t]);
      y[size_t(b * context + t)] = int32_t(f[start + t + 1]);
    }
  }
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Expected<NpyArray> readNpy(const std::string &path) {
  Expected<std::string> bytes = readWhole(path);
  if (!bytes)
    return bytes.status();
  const std::string &b = *bytes;
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format("'{}' is not a valid .npy file: {}", path, why));
  };
  if (b.size() < 10 || b.compare(0, 6, kNpyMagic) != 0)
    return bad("missing the \\x93NUMPY magic");
  int major = static_cast<unsigned char>(b[6]);
  size_t headerLen, offset;
  if (major == 1) {
    headerLen = size_t(static_cast<unsigned char>(b[8])) |
                size_t(static_cast<unsigned char>(b[9])) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12)
      return bad("truncated header");
    headerLen = 0;
    for (int k = 0; k < 4; ++k)
      headerLen |= size_t(static_cast<unsigned char>(b[8 + k])) << (8 * k);
    offset = 12;
  } else {
    return bad(fmt::format("unsupported version {}", major));
  }
  if (offset + headerLen > b.size())
    return bad("truncated header");
  std::string header = b.substr(offset, headerLen);
  NpyArray a;
  a.path = path;
  auto field = [&](const std::string &key) -> std::string {
    size_t k = header.find("'" + key + "'");
    if (k == std::string::npos)
      return "";
    k = header.find(':', k);
    return k == std::string::npos ? "" : header.substr(k + 1);
  };
  std::string d = field("descr");
  size_t q1 = d.find('\''), q2 = q1 == std::string::npos ? q1 : d.find('\'', q1 + 1);
  if (q2 == std::string::npos)
    return bad("no 'descr' in the header");
  a.descr = d.substr(q1 + 1, q2 - q1 - 1);
  if (field("fortran_order").find("True") == 0 ||
      field("fortran_order").find(" True") == 0)
    return bad("Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
  std::string sh = field("shape");
  size_t p1 = sh.find('('), p2 = sh.find(')');
  if (p1 == std::string::npos || p2 == std::string::npos)
    return bad("no 'shape' in the header");
  std::stringstream dims(sh.substr(p1 + 1, p2 - p1 - 1));
  std::string dim;
  while (std::getline(dims, dim, ',')) {
    dim.erase(std::remove(dim.begin(), dim.end(), ' '), dim.end());
    if (dim.empty())
      continue;
    char *end = nullptr;
    long long v = std::strtoll(dim.c_str(), &end, 10);
    if (*end || v < 0)
      return bad("bad dimension '" + dim + "'");
    a.shape.push_back(v);
  }
  uint64_t count = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && count > (uint64_t(1) << 48) / uint64_t(d))
      return bad("the shape has more than 2^48 elements");
    count *= uint64_t(d);
  }
  static const char *supported[] = {"<f4", "<f8", "<i4", "<i8", "|u1", "<u2", "<u1"};
  if (std::find(std::begin(supported), std::end(supported), a.descr) == std::end(supported))
    return bad("dtype '" + a.descr + "' is not supported (use float32, float64, "
               "int32, int64, uint8 or uint16, little-endian)");
  size_t width = size_t(a.descr[2] - '0');
  size_t need = size_t(a.numel()) * width;
  size_t data = offset + headerLen;
  if (b.size() - data != need)
    return bad(fmt::format("the header promises {} bytes of data but the file "
                           "has {}", need, b.size() - data));
  const char *p = b.data() + data;
  int64_t n = a.numel();
  if (a.descr[1] == 'f') {
    a.f.resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      if (width == 4) { float v; std::memcpy(&v, p + 4 * k, 4); a.f[k] = v; }
      else { double v; std::memcpy(&v, p + 8 * k, 8); a.f[k] = v; }
    }
  } else {
    a.i.resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      if (width == 1) a.i[k] = static_cast<unsigned char>(p[k]);
      else if (width == 2) { uint16_t v; std::memcpy(&v, p + 2 * k, 2); a.i[k] = v; }
      else if (width == 4) { int32_t v; std::memcpy(&v, p + 4 * k, 4); a.i[k] = v; }
      else { int64_t v; std::memcpy(&v, p + 8 * k, 8); a.i[k] = v; }
    }
  }
  return a;
}

Status writeNpy(const std::string &path, const NpyArray &a) {
  std::string shape = "(";
  for (int64_t d : a.shape)
    shape += std::to_string(d) + ",";
  if (a.shape.size() > 1)
    shape.pop_back();
  shape += ")";
  std::string header = "{'descr': '" + a.descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(char(header.size() & 0xff));
  out.push_back(char(header.size() >> 8));
  out += header;
  size_t width = size_t(a.descr[2] - '0');
  for (int64_t k = 0; k < a.numel(); ++k) {
    char buf[8];
    if (a.descr[1] == 'f') {
      if (width == 4) { float v = float(a.f[k]); std::memcpy(buf, &v, 4); }
      else { double v = a.f[k]; std::memcpy(buf, &v, 8); }
    } else {
      int64_t v = a.i[k];
      std::memcpy(buf, &v, width); // little-endian truncation
    }
    out.append(buf, width);
  }
  return writeWhole(path, out);
}

} // namespace kiln::data
