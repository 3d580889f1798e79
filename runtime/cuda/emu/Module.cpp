//===- Module.cpp - Generated CUDA C++ compiled for the emulator ----------===//
#include "runtime/cuda/emu/Module.h"

#include "runtime/cuda/emu/Prelude.h"

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <mutex>
#include <spawn.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace kiln::cuda::emu {

struct Module::Impl {
  std::string name;
  std::string sourcePath;
  std::string libraryPath;
  std::string tempDir; ///< removed with the module (useCache = false)
  void *handle = nullptr;
  bool cacheHit = false;
  double compileSeconds = 0;

  ~Impl() {
    if (handle)
      dlclose(handle);
    if (!tempDir.empty()) {
      unlink(sourcePath.c_str());
      unlink(libraryPath.c_str());
      rmdir(tempDir.c_str());
    }
  }
};

namespace {

/// A suffix unique to this process and call, for temporary file names (other
/// processes and threads may compile the same module at the same time).
std::string uniqueSuffix() {
  static std::atomic<unsigned> counter{0};
  return fmt::format("{}.{}", getpid(), counter++);
}

std::vector<std::string> splitWords(const std::string &s) {
  std::vector<std::string> words;
  std::istringstream in(s);
  for (std::string w; in >> w;)
    words.push_back(w);
  return words;
}

std::vector<std::string> compilerCommand(const CompileOptions &options) {
  std::string c = options.compiler;
  if (c.empty())
    if (const char *env = std::getenv("CXX"); env && *env)
      c = env;
  if (c.empty())
    c = "c++";
  return splitWords(c);
}

std::string joined(const std::vector<std::string> &words) {
  std::string s;
  for (const std::string &w : words)
    s += (s.empty() ? "" : " ") + w;
  return s;
}

/// Runs argv with stdout and stderr into `logPath`; returns the exit status.
Expected<int> runProcess(const std::vector<std::string> &argv,
                         const std::string &logPath) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, logPath.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char *> args;
  for (const std::string &a : argv)
    args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return Status::error(fmt::format(
        "CUDA emulator: cannot run the host compiler '{}': {} (set $CXX or "
        "CompileOptions::compiler)",
        argv[0], std::strerror(rc)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return Status::error(fmt::format("CUDA emulator: waiting for '{}': {}",
                                       argv[0], std::strerror(errno)));
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string readFile(const std::string &path, bool *ok = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (ok)
    *ok = bool(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Writes through a temporary name and a rename, so that concurrent test
/// processes never see half a file.
Status writeFileAtomically(const std::string &path, const std::string &text) {
  std::string tmp = fmt::format("{}.tmp.{}", path, uniqueSuffix());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out)
      return Status::error(fmt::format("CUDA emulator: cannot write {}: {}",
                                       tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::error(
        fmt::format("CUDA emulator: cannot rename {} to {}: {}", tmp, path,
                    std::strerror(errno)));
  return Status::ok();
}

bool makeDirs(const std::string &path) {
  if (path.empty())
    return false;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/')
      continue;
    std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      return false;
  }
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         access(path.c_str(), W_OK) == 0;
}

std::string makeTempDir() {
  const char *tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-emu-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back(0);
  return mkdtemp(buf.data()) ? std::string(buf.data()) : std::string();
}

/// 128 bits from two FNV-1a variants: plenty for a cache key (a hit is
/// compared with the stored source anyway).
std::string hashKey(const std::string &text) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : text) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ c) * 0x100000001b3ull;
    b ^= b >> 29;
  }
  return fmt::format("{:016x}{:016x}", a, b);
}

/// `compiler --version`, once per compiler command and process.
Expected<std::string> compilerIdentity(const std::vector<std::string> &cmd,
                                       const std::string &scratchDir) {
  static std::mutex mu;
  static std::map<std::string, std::string> known;
  std::string key = joined(cmd);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end())
      return it->second;
  }
  std::vector<std::string> argv = cmd;
  argv.push_back("--version");
  std::string log =
      fmt::format("{}/version.{}.log", scratchDir, uniqueSuffix());
  Expected<int> rc = runProcess(argv, log);
  std::string text = readFile(log);
  unlink(log.c_str());
  if (!rc)
    return rc.status();
  if (*rc != 0)
    return Status::error(fmt::format(
        "CUDA emulator: '{} --version' failed (exit {}): {}", key, *rc, text));
  std::lock_guard<std::mutex> lock(mu);
  known[key] = text;
  return text;
}

std::string safeName(const std::string &name) {
  std::string s;
  for (char c : name)
    s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')
             ? c
             : '_';
  return s.empty() ? "module" : s.substr(0, 64);
}

} // namespace

std::string defaultEmulatorCacheDir() {
  if (const char *d = std::getenv("KILN_CACHE_DIR"); d && *d)
    return std::string(d) + "/emu";
  if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/kiln/emu";
  if (const char *h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/kiln/emu";
  return "";
}

Module::Module(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Module::Module(Module &&) noexcept = default;
Module &Module::operator=(Module &&) noexcept = default;
Module::~Module() = default;

const std::string &Module::name() const { return impl_->name; }
const std::string &Module::sourcePath() const { return impl_->sourcePath; }
const std::string &Module::libraryPath() const { return impl_->libraryPath; }
bool Module::cacheHit() const { return impl_->cacheHit; }
double Module::compileSeconds() const { return impl_->compileSeconds; }

Expected<Module> Module::compile(const std::string &source,
                                 const std::string &name,
                                 const CompileOptions &options) {
  auto impl = std::make_unique<Impl>();
  impl->name = name;

  std::string full;
  if (options.pastePrelude) {
    full = std::string(preludeText());
    full += "\n";
  }
  full += fmt::format("#line 1 \"{}.cu\"\n", name);
  full += source;
  if (full.back() != '\n')
    full += '\n';

  std::string dir = options.useCache
                        ? (options.cacheDir.empty() ? defaultEmulatorCacheDir()
                                                    : options.cacheDir)
                        : std::string();
  if (!makeDirs(dir)) {
    dir = makeTempDir();
    if (dir.empty())
      return Status::error(fmt::format(
          "CUDA emulator: no writable directory for module '{}' (cache dir "
          "'{}', $TMPDIR): {}",
          name, options.cacheDir, std::strerror(errno)));
    impl->tempDir = dir;
  }

  const std::vector<std::string> cmd = compilerCommand(options);
  if (cmd.empty())
    return Status::error("CUDA emulator: empty host compiler command");
  Expected<std::string> identity = compilerIdentity(cmd, dir);
  if (!identity)
    return identity.status();

  // -fstack-clash-protection: a frame larger than a fiber's stack probes its
  // pages, so it faults on the guard page (a reported overflow) instead of
  // landing in a neighbour's stack.
  std::vector<std::string> flags = {
      "-std=c++17", options.optimization,   "-fPIC",
      "-shared",    "-fno-strict-aliasing", "-fstack-clash-protection"};
  flags.insert(flags.end(), options.flags.begin(), options.flags.end());

  const std::string key = hashKey(full + '\0' + *identity + '\0' + joined(cmd) +
                                  '\0' + joined(flags));
  const std::string stem = fmt::format("{}/{}-{}", dir, safeName(name), key);
  impl->sourcePath = stem + ".cpp";
  impl->libraryPath = stem + ".so";

  // A cached object whose stored source matches.
  if (options.useCache && impl->tempDir.empty() &&
      access(impl->libraryPath.c_str(), R_OK) == 0) {
    bool ok = false;
    if (readFile(impl->sourcePath, &ok) == full && ok) {
      impl->handle = dlopen(impl->libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (impl->handle) {
        impl->cacheHit = true;
        return Module(std::move(impl));
      }
    }
  }

  if (Status s = writeFileAtomically(impl->sourcePath, full); !s)
    return s;
  const std::string suffix = uniqueSuffix();
  const std::string tmpLib =
      fmt::format("{}.tmp.{}.so", impl->libraryPath, suffix);
  const std::string logPath =
      fmt::format("{}.tmp.{}.log", impl->libraryPath, suffix);
  std::vector<std::string> argv = cmd;
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"-x", "c++", impl->sourcePath, "-o", tmpLib});

  const auto start = std::chrono::steady_clock::now();
  Expected<int> rc = runProcess(argv, logPath);
  impl->compileSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::string log = readFile(logPath);
  unlink(logPath.c_str());
  if (!rc)
    return rc.status();
  if (*rc != 0) {
    unlink(tmpLib.c_str());
    if (log.size() > 16000)
      log = log.substr(0, 16000) + "\n[... compiler output truncated]";
    return Status::error(fmt::format(
        "CUDA emulator: compiling module '{}' for host emulation failed ({} "
        "exited with {}).\nsource: {}\ncommand: {}\n{}",
        name, cmd[0], *rc, impl->sourcePath, joined(argv), log));
  }
  if (std::rename(tmpLib.c_str(), impl->libraryPath.c_str()) != 0)
    return Status::error(
        fmt::format("CUDA emulator: cannot rename {} to {}: {}", tmpLib,
                    impl->libraryPath, std::strerror(errno)));
  impl->handle = dlopen(impl->libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!impl->handle)
    return Status::error(
        fmt::format("CUDA emulator: cannot load module '{}' ({}): {}", name,
                    impl->libraryPath, dlerror()));
  return Module(std::move(impl));
}

Expected<Shim> Module::shim(const std::string &kernel) const {
  std::string symbol = kernel + "__emu";
  dlerror();
  void *p = dlsym(impl_->handle, symbol.c_str());
  if (!p)
    return Status::error(fmt::format(
        "CUDA emulator: module '{}' has no kernel '{}' (no symbol '{}'; does "
        "the source follow the kernel with KILN_EMU_SHIM({});?)",
        impl_->name, kernel, symbol, kernel));
  return reinterpret_cast<Shim>(p);
}

Status Module::launch(const std::string &kernel, Dim3 grid, Dim3 block,
                      size_t dynamicSharedBytes, void **params,
                      LaunchOptions options, LaunchStats *stats) const {
  Expected<Shim> entry = shim(kernel);
  if (!entry)
    return entry.status();
  options.kernel = kernel;
  return emu::launch(*entry, grid, block, dynamicSharedBytes, params, options,
                     stats);
}

} // namespace kiln::cuda::emu
