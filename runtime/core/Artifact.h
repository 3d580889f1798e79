//===- Artifact.h - The .kpack container --------------------------*- C++ -*-===//
//
// A compiled model travels as one .kpack file: a fixed header, a section
// table and named sections (the manifest, initialisers, the buffer plan, the
// schedule, kernels per target, provenance). This file defines the
// container; what goes in each section is defined by the stage that writes
// it (docs/artifact.md). The runtime owns the format; the compiler includes
// this header to write it, never the reverse.
//
// Layout (little-endian):
//   [0, 64)   header: "KILNPACK", format version, section count, file size,
//             table offset, CRC-32 of the table, CRC-32 of the header
//   table     one 64-byte entry per section: kind, name (40 bytes, NUL
//             padded), offset, size, CRC-32 of the section's bytes
//   data      sections, each 64-byte aligned
// Loading verifies everything before use: magic, version, sizes, offsets
// (inside the file, aligned, not overlapping), names and every CRC, so a
// truncated or damaged file is a clear error, never a crash.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_ARTIFACT_H
#define KILN_RUNTIME_CORE_ARTIFACT_H

#include "runtime/core/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::artifact {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'A', 'C', 'K'};
/// 2: plan v2 (program::kPlanVersion: device mesh, per-device buffer plans,
/// collective steps, queues and dependencies). Version 1 artifacts share the
/// container layout and are verified, then refused with what to recompile.
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kOldestLayout = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kEntrySize = 64;
constexpr size_t kNameSize = 40;
constexpr size_t kAlignment = 64;

/// What a section holds; readers skip kinds they do not know.
enum class SectionKind : uint32_t {
  Manifest = 1,     ///< JSON: model, signature, compiler version, source hash
  Initializers = 2, ///< safetensors of initial values
  Plan = 3,         ///< buffer plan
  Schedule = 4,     ///< kernel launch order
  Kernels = 5,      ///< one per target (e.g. "kernels.cpu")
  Provenance = 6,   ///< kernel -> source lines
  Other = 100,
};

struct Section {
  SectionKind kind = SectionKind::Other;
  std::string name;
  std::string bytes;
};

class Artifact {
public:
  /// Reads and verifies `path`.
  static Expected<Artifact> open(const std::string &path);
  /// Verifies an in-memory image (`origin` names it in messages).
  static Expected<Artifact> parse(const std::string &image,
                                  const std::string &origin);

  const std::vector<Section> &sections() const { return sections_; }
  const Section *find(const std::string &name) const;
  uint32_t version() const { return version_; }

private:
  std::vector<Section> sections_;
  uint32_t version_ = 0;
};

/// Serialises sections (names unique, at most kNameSize - 1 bytes).
Expected<std::string> serialize(const std::vector<Section> &sections);
/// serialize() then an atomic write (temporary file, fsync, rename).
Status write(const std::string &path, const std::vector<Section> &sections);

} // namespace kiln::artifact

#endif // KILN_RUNTIME_CORE_ARTIFACT_H
