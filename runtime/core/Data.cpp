//===- Data.cpp - Training data: token files, .npy arrays, batches --------===//
#include "runtime/core/Data.h"

#include "runtime/core/Random.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace kiln::data {
namespace {

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

std::string jsonEscape(char c) {
  switch (c) {
  case '"': return "\\\"";
  case '\\': return "\\\\";
  case '\n': return "\\n";
  case '\r': return "\\r";
  case '\t': return "\\t";
  default: break;
  }
  unsigned char u = static_cast<unsigned char>(c);
  if (u < 0x20 || u >= 0x7f)
    return fmt::format("\\u{:04x}", u);
  return std::string(1, c);
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
  std::set<unsigned char> chars(text->begin(), text->end());
  CharDatasetInfo info;
  for (unsigned char c : chars)
    info.vocab.push_back(char(c));
  int lookup[256];
  for (int k = 0; k < 256; ++k)
    lookup[k] = -1;
  for (size_t k = 0; k < info.vocab.size(); ++k)
    lookup[static_cast<unsigned char>(info.vocab[k])] = int(k);
  int64_t n = int64_t(text->size());
  int64_t split = int64_t(double(n) * (1.0 - valFraction));
  auto encode = [&](int64_t begin, int64_t end) {
    std::string out;
    out.reserve(size_t(end - begin) * 2);
    for (int64_t k = begin; k < end; ++k) {
      uint16_t t = uint16_t(lookup[static_cast<unsigned char>((*text)[k])]);
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

Expected<std::string> readVocab(const std::string &path) {
  Expected<std::string> text = readWhole(path);
  if (!text)
    return text.status();
  // {"vocab": ["a", "b", ...]} with the escapes prepareCharDataset writes.
  size_t pos = text->find('[');
  if (pos == std::string::npos)
    return Status::error(fmt::format("'{}' is not a Kiln vocabulary (no list)", path));
  std::string vocab;
  const std::string &s = *text;
  for (size_t k = pos + 1; k < s.size(); ++k) {
    if (s[k] == ']')
      return vocab;
    if (s[k] != '"')
      continue;
    ++k;
    if (k >= s.size())
      break;
    char c = s[k];
    if (c == '\\' && k + 1 < s.size()) {
      char e = s[++k];
      if (e == 'n') c = '\n';
      else if (e == 'r') c = '\r';
      else if (e == 't') c = '\t';
      else if (e == 'u' && k + 4 < s.size()) {
        c = char(std::stoi(s.substr(k + 1, 4), nullptr, 16));
        k += 4;
      } else c = e;
    }
    vocab.push_back(c);
    ++k; // closing quote
    if (k >= s.size() || s[k] != '"')
      return Status::error(fmt::format("'{}': malformed entry near byte {}", path, k));
  }
  return Status::error(fmt::format("'{}' is truncated (no closing ']')", path));
}

Expected<TokenFile> TokenFile::open(const std::string &path, Width width,
                                    int64_t context, int64_t vocabSize) {
  Expected<std::string> bytes = readWhole(path);
  if (!bytes)
    return bytes.status();
  size_t w = size_t(width);
  if (bytes->size() % w != 0)
    return Status::error(fmt::format(
        "'{}' has {} bytes, not a multiple of {} (is it a uint{} token file?)",
        path, bytes->size(), w, w * 8));
  TokenFile f;
  f.path_ = path;
  size_t n = bytes->size() / w;
  if (int64_t(n) < context + 1)
    return Status::error(fmt::format(
        "'{}' holds {} tokens but one training window needs {} (context + 1)",
        path, n, context + 1));
  f.tokens_.resize(n);
  const unsigned char *p = reinterpret_cast<const unsigned char *>(bytes->data());
  for (size_t k = 0; k < n; ++k) {
    uint32_t t = w == 2 ? uint32_t(p[2 * k]) | uint32_t(p[2 * k + 1]) << 8
                        : uint32_t(p[4 * k]) | uint32_t(p[4 * k + 1]) << 8 |
                              uint32_t(p[4 * k + 2]) << 16 | uint32_t(p[4 * k + 3]) << 24;
    if (vocabSize > 0 && int64_t(t) >= vocabSize)
      return Status::error(fmt::format(
          "'{}': token {} at position {} is outside the model's vocabulary of "
          "{} (was the file made for another vocabulary or as uint{}?)",
          path, t, k, vocabSize, w == 2 ? 32 : 16));
    f.tokens_[k] = t;
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
      x[size_t(b * context + t)] = int32_t(tokens_[start + t]);
      y[size_t(b * context + t)] = int32_t(tokens_[start + t + 1]);
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
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0)
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
