//===- Log.cpp - One logger for all Kiln tools ----------------------------===//
#include "runtime/core/Log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kiln::log {
namespace {
std::atomic<int> currentLevel{-1};
std::mutex writeMutex;

Level initialLevel() {
  Level l = Level::Info;
  if (const char *env = std::getenv("KILN_LOG"))
    parseLevel(env, l);
  return l;
}
} // namespace

Level level() {
  int l = currentLevel.load(std::memory_order_relaxed);
  if (l < 0) {
    l = static_cast<int>(initialLevel());
    currentLevel.store(l, std::memory_order_relaxed);
  }
  return static_cast<Level>(l);
}

void setLevel(Level l) { currentLevel.store(static_cast<int>(l)); }

bool parseLevel(std::string_view name, Level &out) {
  if (name == "error") out = Level::Error;
  else if (name == "warn") out = Level::Warn;
  else if (name == "info") out = Level::Info;
  else if (name == "debug") out = Level::Debug;
  else return false;
  return true;
}

void write(Level l, std::string_view message) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  std::lock_guard<std::mutex> lock(writeMutex);
  std::fprintf(stderr, "kiln: %s: %.*s\n", names[static_cast<int>(l)],
               static_cast<int>(message.size()), message.data());
}

} // namespace kiln::log
