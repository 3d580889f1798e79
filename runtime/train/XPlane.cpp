//===- XPlane.cpp - A run's spans for TensorBoard's Profile tab -----------===//
#include "runtime/train/XPlane.h"

#include "runtime/train/TensorBoard.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <unistd.h>

namespace kiln::train {

namespace {

using tfrecord::putFixed64;
using tfrecord::putVarint;

/// A protobuf message under construction (proto3: zeros and empty strings
/// are left out, as a protobuf library writes them).
struct Message {
  std::string bytes;

  void key(uint32_t field, uint32_t wire) { putVarint(bytes, (uint64_t(field) << 3) | wire); }
  Message &integer(uint32_t field, int64_t v) {
    if (v != 0) {
      key(field, 0);
      putVarint(bytes, uint64_t(v)); // negative: ten bytes, as int64 is encoded
    }
    return *this;
  }
  Message &real(uint32_t field, double v) {
    if (v != 0) {
      uint64_t bits;
      std::memcpy(&bits, &v, 8);
      key(field, 1);
      putFixed64(bytes, bits);
    }
    return *this;
  }
  Message &string(uint32_t field, std::string_view s) {
    if (!s.empty())
      return message(field, s);
    return *this;
  }
  /// A length-delimited field, written even when empty (a repeated
  /// message's element).
  Message &message(uint32_t field, std::string_view m) {
    key(field, 2);
    putVarint(bytes, m.size());
    bytes.append(m.data(), m.size());
    return *this;
  }
};

/// xplane.proto's field numbers.
namespace xspace {
enum : uint32_t { Planes = 1, Hostnames = 4 };
}
namespace xplane {
enum : uint32_t { Id = 1, Name = 2, Lines = 3, EventMetadata = 4, StatMetadata = 5 };
}
namespace xline {
enum : uint32_t { Id = 1, Name = 2, TimestampNs = 3, Events = 4, DisplayName = 11 };
}
namespace xevent {
enum : uint32_t { MetadataId = 1, OffsetPs = 2, DurationPs = 3, Stats = 4 };
}
namespace xstat {
enum : uint32_t { MetadataId = 1, Double = 2, Int64 = 4, String = 5 };
}
/// XEventMetadata and XStatMetadata.
namespace xmeta {
enum : uint32_t { Id = 1, Name = 2 };
}

/// Interns names to metadata ids (from 1: the plugin's own writer keeps 0
/// for "none").
struct Names {
  std::map<std::string, int64_t> ids;
  int64_t of(const std::string &name) {
    auto [it, added] = ids.try_emplace(name, int64_t(ids.size()) + 1);
    return it->second;
  }
};

std::string statOf(const TraceArg &a, Names &statNames) {
  Message m;
  m.integer(xstat::MetadataId, statNames.of(a.key));
  switch (a.kind) {
  case TraceArg::Number:
    // Whole numbers (steps, bytes, FLOPs) as integers, the rest as doubles.
    if (std::isfinite(a.value) && a.value == std::floor(a.value) && std::fabs(a.value) < 9e18) {
      // A zero is still written: without a value field the stat has none.
      m.key(xstat::Int64, 0);
      putVarint(m.bytes, uint64_t(int64_t(a.value)));
    } else {
      m.key(xstat::Double, 1);
      double v = std::isfinite(a.value) ? a.value : 0.0;
      uint64_t bits;
      std::memcpy(&bits, &v, 8);
      putFixed64(m.bytes, bits);
    }
    break;
  case TraceArg::Bool:
    m.key(xstat::Int64, 0);
    putVarint(m.bytes, a.value != 0 ? 1 : 0);
    break;
  case TraceArg::String:
    m.message(xstat::String, a.text);
    break;
  case TraceArg::Strings: {
    std::string joined;
    for (size_t i = 0; i < a.list.size(); ++i)
      joined += (i ? ", " : "") + a.list[i];
    m.message(xstat::String, joined);
    break;
  }
  }
  return m.bytes;
}

/// The metadata map's entries: map<int64, X*Metadata> = 4 or 5.
void putMetadata(Message &plane, uint32_t field, const Names &names) {
  for (auto &[name, id] : names.ids) {
    Message meta;
    meta.integer(xmeta::Id, id).string(xmeta::Name, name);
    Message entry;
    entry.integer(1, id).message(2, meta.bytes);
    plane.message(field, entry.bytes);
  }
}

} // namespace

std::string renderXSpace(const TraceSource &src, const std::string &hostname) {
  if (!src.tracer)
    return "";
  std::vector<TraceSlice> slices = traceSlices(src);
  // The lines start at the trace's origin (0), the events are picoseconds
  // from there, as the Chrome trace's microseconds are: the plugin keeps
  // times in int64 picoseconds, which the wall clock's nanoseconds since
  // 1970 would overflow.
  Names events, stats;
  std::map<int, Message> lines; // track -> its serialized events
  lines[kTrainerTrack];
  lines[kComputeTrack];
  for (const TraceSlice &s : slices) {
    Message e;
    e.integer(xevent::MetadataId, events.of(s.name));
    e.integer(xevent::OffsetPs, s.begin * 1000);
    e.integer(xevent::DurationPs, (s.end - s.begin) * 1000);
    for (const TraceArg &a : s.args)
      e.message(xevent::Stats, statOf(a, stats));
    lines[s.track].message(xline::Events, e.bytes);
  }
  Message plane;
  plane.integer(xplane::Id, 0).string(xplane::Name, kHostPlaneName);
  for (auto &[track, eventBytes] : lines) {
    Message line;
    line.integer(xline::Id, track)
        .string(xline::Name, traceTrackName(track))
        // The viewer shows a line's display name, cut to its first ~25
        // characters: the track first, then whose it is.
        .string(xline::DisplayName, fmt::format("{} \u2014 {}", traceTrackName(track), src.process))
        .integer(xline::TimestampNs, 0);
    line.bytes += eventBytes.bytes;
    plane.message(xplane::Lines, line.bytes);
  }
  putMetadata(plane, xplane::EventMetadata, events);
  putMetadata(plane, xplane::StatMetadata, stats);
  Message space;
  space.message(xspace::Planes, plane.bytes).string(xspace::Hostnames, hostname);
  return space.bytes;
}

std::string machineName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
    return "localhost";
  return host;
}

std::string profileRunName(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04d}_{:02d}_{:02d}_{:02d}_{:02d}_{:02d}", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string profileRunDir(const std::string &logdir, const std::string &run) {
  return fmt::format("{}/plugins/profile/{}", logdir, run);
}

std::string profileHostName(int rank) { return fmt::format("rank{}", rank); }

Status checkProfileDir(const std::string &logdir, const std::string &run) {
  // The run's own directory is made when the profile is written: a run
  // that fails leaves none for the plugin to list.
  std::string parent = fmt::format("{}/plugins/profile", logdir);
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec || !std::filesystem::is_directory(parent) || ::access(parent.c_str(), W_OK) != 0)
    return Status::error(fmt::format(
        "cannot create the TensorBoard profile directory '{}' (for {}): {}; choose another "
        "--tensorboard directory",
        parent, profileRunDir(logdir, run),
        ec ? ec.message() : !std::filesystem::is_directory(parent) ? "it is not a directory"
                                                                   : std::strerror(errno)));
  return Status::ok();
}

Expected<ProfileFiles> writeProfile(const std::string &logdir, const std::string &run,
                                    const std::vector<std::pair<std::string, std::string>> &hosts) {
  std::string parent = fmt::format("{}/plugins/profile", logdir);
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  std::string dir;
  for (int n = 1; !ec && n <= 100; ++n) {
    dir = profileRunDir(logdir, n == 1 ? run : fmt::format("{}_{}", run, n));
    if (std::filesystem::create_directory(dir, ec)) // false: it exists (or ec)
      break;
    if (!ec && n == 100)
      ec = std::make_error_code(std::errc::file_exists);
  }
  if (ec || !std::filesystem::is_directory(dir))
    return Status::error(fmt::format("cannot create the TensorBoard profile directory '{}': {}; "
                                     "choose another --tensorboard directory",
                                     dir, ec ? ec.message() : "it is not a directory"));
  ProfileFiles out;
  out.dir = dir;
  std::vector<std::string> &written = out.files;
  for (auto &[host, space] : hosts) {
    if (space.empty())
      continue;
    std::string path = fmt::format("{}/{}.xplane.pb", dir, host);
    // Written whole under another name, then renamed: the plugin never
    // reads half a file.
    std::string tmp = path + ".tmp";
    std::FILE *f = std::fopen(tmp.c_str(), "wb");
    bool ok = f && std::fwrite(space.data(), 1, space.size(), f) == space.size();
    int err = errno;
    if (f && std::fclose(f) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      if (ok)
        err = errno;
      std::remove(tmp.c_str());
      return Status::error(fmt::format("--tensorboard: writing the profile {} failed ({}); choose "
                                       "another --tensorboard directory",
                                       path, std::strerror(err)));
    }
    written.push_back(path);
  }
  return out;
}

} // namespace kiln::train
