//===- Log.h - One logger for all Kiln tools ---------------------*- C++ -*-===//
//
// Levels: error, warn, info, debug. The level comes from --log-level or the
// KILN_LOG environment variable (flag wins). Output goes to stderr so that
// stdout stays clean for IR and tables.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_LOG_H
#define KILN_RUNTIME_CORE_LOG_H

#include <fmt/format.h>
#include <string_view>

namespace kiln::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3 };

/// Current level (initialised from KILN_LOG on first use, default Info).
Level level();
void setLevel(Level level);
/// Parses "error|warn|info|debug"; returns false on an unknown name.
bool parseLevel(std::string_view name, Level &out);
void write(Level level, std::string_view message);

template <typename... Args>
void error(fmt::format_string<Args...> f, Args &&...args) {
  write(Level::Error, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args &&...args) {
  if (level() >= Level::Warn)
    write(Level::Warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args &&...args) {
  if (level() >= Level::Info)
    write(Level::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args &&...args) {
  if (level() >= Level::Debug)
    write(Level::Debug, fmt::format(f, std::forward<Args>(args)...));
}

} // namespace kiln::log

#endif // KILN_RUNTIME_CORE_LOG_H
