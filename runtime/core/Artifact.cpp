//===- Artifact.cpp - The .kpack container --------------------------------===//
#include "runtime/core/Artifact.h"

#include "runtime/core/Checkpoint.h" // crc32

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kiln::artifact {
namespace {

void put32(std::string &s, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k)
    s[at + k] = char((v >> (8 * k)) & 0xff);
}
void put64(std::string &s, size_t at, uint64_t v) {
  for (int k = 0; k < 8; ++k)
    s[at + k] = char((v >> (8 * k)) & 0xff);
}
uint32_t get32(const std::string &s, size_t at) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k)
    v |= uint32_t(static_cast<unsigned char>(s[at + k])) << (8 * k);
  return v;
}
uint64_t get64(const std::string &s, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k)
    v |= uint64_t(static_cast<unsigned char>(s[at + k])) << (8 * k);
  return v;
}
size_t alignUp(size_t v) { return (v + kAlignment - 1) / kAlignment * kAlignment; }

// Header fields.
constexpr size_t kVersionAt = 8, kCountAt = 12, kFileSizeAt = 16,
                 kTableAt = 24, kTableCrcAt = 32, kHeaderCrcAt = 60;
// Entry fields.
constexpr size_t kKindAt = 0, kNameAt = 4, kOffsetAt = 44, kSizeAt = 52,
                 kCrcAt = 60;

} // namespace

const Section *Artifact::find(const std::string &name) const {
  for (const Section &s : sections_)
    if (s.name == name)
      return &s;
  return nullptr;
}

Expected<std::string> serialize(const std::vector<Section> &sections) {
  size_t tableAt = kHeaderSize;
  size_t dataAt = alignUp(tableAt + kEntrySize * sections.size());
  std::string out(dataAt, '\0');
  std::memcpy(out.data(), kMagic, 8);
  put32(out, kVersionAt, kFormatVersion);
  put32(out, kCountAt, uint32_t(sections.size()));
  put64(out, kTableAt, tableAt);
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section &s = sections[i];
    if (s.name.empty() || s.name.size() >= kNameSize)
      return Status::internal("artifact section name '" + s.name +
                              "' must have 1 to 39 bytes");
    for (size_t j = 0; j < i; ++j)
      if (sections[j].name == s.name)
        return Status::internal("artifact section '" + s.name + "' is repeated");
    size_t at = out.size();
    size_t entry = tableAt + i * kEntrySize;
    put32(out, entry + kKindAt, uint32_t(s.kind));
    std::memcpy(out.data() + entry + kNameAt, s.name.data(), s.name.size());
    put64(out, entry + kOffsetAt, at);
    put64(out, entry + kSizeAt, s.bytes.size());
    put32(out, entry + kCrcAt, ckpt::crc32(s.bytes.data(), s.bytes.size()));
    out += s.bytes;
    out.resize(alignUp(out.size()), '\0');
  }
  put64(out, kFileSizeAt, out.size());
  put32(out, kTableCrcAt,
        ckpt::crc32(out.data() + tableAt, kEntrySize * sections.size()));
  put32(out, kHeaderCrcAt, ckpt::crc32(out.data(), kHeaderCrcAt));
  return out;
}

Status write(const std::string &path, const std::vector<Section> &sections) {
  Expected<std::string> image = serialize(sections);
  if (!image)
    return image.status();
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
  const char *p = image->data();
  size_t n = image->size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      Status s = Status::error(fmt::format("cannot write '{}': {}", tmp, std::strerror(errno)));
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    p += w;
    n -= size_t(w);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path,
                                         std::strerror(errno)));
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::ok();
}

Expected<Artifact> Artifact::open(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(fmt::format("cannot open artifact '{}': {}", path,
                                     std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

namespace {
bool endsWith(const std::string &s, const char *suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

/// The message for a file that is not an artifact at all: a model file
/// (the usual slip: `kiln-run train model.kiln`), a checkpoint, or other.
Status notAnArtifact(const std::string &b, const std::string &origin) {
  std::string stem = origin;
  if (size_t dot = stem.rfind('.'); dot != std::string::npos && stem.find('/', dot) == std::string::npos)
    stem.resize(dot);
  bool text = !b.empty() && std::all_of(b.begin(), b.begin() + long(std::min<size_t>(b.size(), 512)),
                                        [](char c) {
                                          return c == '\n' || c == '\t' || c == '\r' ||
                                                 (unsigned char)c >= 0x20;
                                        });
  if (endsWith(origin, ".kiln") || endsWith(origin, ".mlir") ||
      (text && (b.rfind("model ", 0) == 0 || b.find("\nmodel ") != std::string::npos ||
                b.find("func.func") != std::string::npos)))
    return Status::error(fmt::format(
        "'{}' is a model file, not a compiled artifact: compile it first with "
        "`kilnc {} -o {}.kpack`, then give {}.kpack",
        origin, origin, stem, stem));
  if (endsWith(origin, ".safetensors") || b.find("\"kiln.format\"") != std::string::npos)
    return Status::error(fmt::format(
        "'{}' is a checkpoint, not a compiled artifact: give the artifact (kilnc -o "
        "MODEL.kpack) and this file with --checkpoint (eval, sample) or --resume (train)",
        origin));
  return Status::error(fmt::format(
      "'{}' is not a Kiln artifact: it does not start with KILNPACK; give the .kpack file "
      "`kilnc MODEL.kiln -o MODEL.kpack` wrote",
      origin));
}
} // namespace

Expected<Artifact> Artifact::parse(const std::string &b, const std::string &origin) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "'{}' is not a valid Kiln artifact: {}; recompile it with kilnc -o",
        origin, why));
  };
  if (b.size() < kHeaderSize && (b.size() < 8 || std::memcmp(b.data(), kMagic, 8) != 0))
    return notAnArtifact(b, origin);
  if (b.size() < kHeaderSize)
    return bad(fmt::format("it has {} bytes, less than the {}-byte header",
                           b.size(), kHeaderSize));
  if (b.size() < 8 || std::memcmp(b.data(), kMagic, 8) != 0)
    return notAnArtifact(b, origin);
  if (get32(b, kHeaderCrcAt) != ckpt::crc32(b.data(), kHeaderCrcAt))
    return bad("the header is damaged (CRC mismatch)");
  Artifact a;
  a.version_ = get32(b, kVersionAt);
  if (a.version_ > kFormatVersion || a.version_ < kOldestLayout)
    return Status::error(fmt::format(
        "'{}' has artifact format version {} but this Kiln reads version {}; "
        "recompile the model with this kilnc, or run it with the Kiln that wrote it",
        origin, a.version_, kFormatVersion));
  uint64_t fileSize = get64(b, kFileSizeAt);
  if (fileSize != b.size())
    return bad(fmt::format("the header says {} bytes but the file has {} "
                           "(truncated or appended to)", fileSize, b.size()));
  uint64_t count = get32(b, kCountAt), tableAt = get64(b, kTableAt);
  if (tableAt != kHeaderSize || count > (b.size() - kHeaderSize) / kEntrySize)
    return bad("the section table does not fit in the file");
  if (get32(b, kTableCrcAt) != ckpt::crc32(b.data() + tableAt, count * kEntrySize))
    return bad("the section table is damaged (CRC mismatch)");
  size_t dataStart = alignUp(tableAt + count * kEntrySize);
  uint64_t prevEnd = dataStart;
  for (uint64_t i = 0; i < count; ++i) {
    size_t entry = tableAt + i * kEntrySize;
    Section s;
    s.kind = SectionKind(get32(b, entry + kKindAt));
    const char *name = b.data() + entry + kNameAt;
    s.name.assign(name, strnlen(name, kNameSize));
    if (s.name.empty() || s.name.size() == kNameSize)
      return bad(fmt::format("section {} has no valid name", i));
    uint64_t off = get64(b, entry + kOffsetAt), size = get64(b, entry + kSizeAt);
    if (off % kAlignment != 0 || off < prevEnd || off > b.size() ||
        size > b.size() - off)
      return bad(fmt::format("section '{}' lies outside the file or overlaps "
                             "another", s.name));
    s.bytes = b.substr(off, size);
    if (get32(b, entry + kCrcAt) != ckpt::crc32(s.bytes.data(), s.bytes.size()))
      return bad(fmt::format("section '{}' is damaged (CRC mismatch)", s.name));
    if (a.find(s.name))
      return bad(fmt::format("section '{}' appears twice", s.name));
    prevEnd = off + size;
    a.sections_.push_back(std::move(s));
  }
  if (a.version_ != kFormatVersion) {
    // An older artifact in the same container: it verified, so its manifest
    // can name the model file to recompile.
    std::string model = "the model's .kiln file";
    if (const Section *m = a.find("manifest")) {
      auto j = nlohmann::json::parse(m->bytes, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("source") && j["source"].is_object() &&
          j["source"].contains("path") && j["source"]["path"].is_string() &&
          !j["source"]["path"].get<std::string>().empty())
        model = j["source"]["path"].get<std::string>();
    }
    return Status::error(fmt::format(
        "'{}' has artifact format version {} but this Kiln reads version {} (plans "
        "with a device mesh, collectives, queues and dependencies); recompile {} with "
        "this kilnc (kilnc {} -o {})",
        origin, a.version_, kFormatVersion, model, model, origin));
  }
  return a;
}

} // namespace kiln::artifact
