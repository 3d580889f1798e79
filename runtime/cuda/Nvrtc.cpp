//===- Nvrtc.cpp - CUDA C++ to PTX and CUBIN through NVRTC ----------------===//
#include "runtime/cuda/Nvrtc.h"

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kiln::cuda {

namespace {

Status nvrtcStatus(nvrtcResult code, const char *call, const char *file,
                   int line, const std::string &detail = {}) {
  if (code == NVRTC_SUCCESS)
    return Status::ok();
  std::string message =
      fmt::format("{} failed at {}:{}: {}", call, sourcePath(file), line,
                  nvrtcGetErrorString(code));
  if (!detail.empty())
    message += "\n" + detail;
  return Status::internal(message);
}

/// NVRTC_CHECK of the house style: the call, file:line and NVRTC's own
/// error string.
#define KILN_NVRTC_TRY(call)                                                   \
  do {                                                                         \
    if (::kiln::Status kiln_s_ =                                               \
            nvrtcStatus((call), #call, __FILE__, __LINE__);                    \
        !kiln_s_)                                                              \
      return kiln_s_;                                                          \
  } while (0)

/// Destroys the program however compile() returns.
struct Program {
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle)
      nvrtcDestroyProgram(&handle);
  }
};

bool startsWith(const std::string &s, const char *prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t\r\n.");
  if (b == std::string::npos)
    return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

/// "1024 bytes smem" -> 1024 for suffix "bytes smem".
bool numberWith(const std::string &field, const char *suffix, int64_t &out) {
  std::string f = trim(field);
  size_t n = std::strlen(suffix);
  if (f.size() <= n || f.compare(f.size() - n, n, suffix) != 0)
    return false;
  std::string number = trim(f.substr(0, f.size() - n));
  if (number.empty() || !std::all_of(number.begin(), number.end(), ::isdigit))
    return false;
  out = std::stoll(number);
  return true;
}

/// "Used 40 registers" / "used 1 barriers" -> 40 / 1.
bool usedCount(const std::string &field, const char *what, int64_t &out) {
  std::string f = trim(field);
  if (f.size() < 5 ||
      (f.compare(0, 5, "Used ") != 0 && f.compare(0, 5, "used ") != 0))
    return false;
  return numberWith(f.substr(5), what, out);
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    out.push_back(item);
  return out;
}

/// Parses a value of the form "sm_90", "sm_90a", "compute_80".
bool parseArch(const std::string &arch, bool &real, int &number) {
  std::string digits;
  if (startsWith(arch, "sm_")) {
    real = true;
    digits = arch.substr(3);
  } else if (startsWith(arch, "compute_")) {
    real = false;
    digits = arch.substr(8);
  } else {
    return false;
  }
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f'))
    digits.pop_back();
  if (digits.empty() || digits.size() > 4 ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return false;
  number = std::stoi(digits);
  return true;
}

std::string joinArchs(const std::vector<int> &archs) {
  std::string s;
  for (int a : archs)
    s += (s.empty() ? "" : ", ") + fmt::format("sm_{}", a);
  return s;
}

/// Writes the failing source (and its log) where the user can find them.
/// Returns the path, or an explanation of why it could not be written.
std::string writeFailure(const std::string &source, const std::string &log,
                         const std::string &dir, bool &written) {
  std::string folder = dir;
  if (folder.empty()) {
    const char *tmp = std::getenv("TMPDIR");
    folder = tmp && *tmp ? tmp : "/tmp";
  }
  std::string path = folder + "/kiln-nvrtc-" + hashHex(source) + ".cu";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << source;
  out.close();
  written = bool(out);
  if (!written)
    return fmt::format("{} (could not write it: {})", path,
                       std::strerror(errno));
  std::ofstream(path + ".log", std::ios::binary | std::ios::trunc) << log;
  return path;
}

} // namespace

std::string hashHex(const std::string &bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

std::string nvrtcVersion() {
  int major = 0, minor = 0;
  if (::nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
    return "unknown";
  return fmt::format("{}.{}", major, minor);
}

std::vector<int> supportedArchs() {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0)
    return {};
  std::vector<int> archs(size_t(n), 0);
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS)
    return {};
  return archs;
}

std::string targetFor(int major, int minor) {
  int cc = major * 10 + minor;
  std::vector<int> archs = supportedArchs();
  if (std::find(archs.begin(), archs.end(), cc) != archs.end())
    return fmt::format("sm_{}", cc);
  int best = -1;
  for (int a : archs)
    if (a <= cc)
      best = std::max(best, a);
  return best < 0 ? "" : fmt::format("compute_{}", best);
}

const std::string &cudaIncludeDir() {
  static const std::string dir = [] {
    std::vector<std::string> candidates;
    auto env = [&](const char *name, const char *suffix) {
      if (const char *v = std::getenv(name); v && *v)
        candidates.push_back(std::string(v) + suffix);
    };
    env("KILN_CUDA_INCLUDE", "");
    env("CUDA_PATH", "/include");
    env("CUDA_HOME", "/include");
#ifdef KILN_CUDA_TOOLKIT_INCLUDE
    candidates.push_back(KILN_CUDA_TOOLKIT_INCLUDE);
#endif
    candidates.push_back("/usr/local/cuda/include");
    for (const std::string &c : candidates)
      if (::access((c + "/cuda_fp16.h").c_str(), R_OK) == 0 &&
          ::access((c + "/cuda_bf16.h").c_str(), R_OK) == 0)
        return c;
    return std::string();
  }();
  return dir;
}

const KernelResources *
CompiledModule::resourcesFor(const std::string &symbol) const {
  for (const KernelResources &r : resources)
    if (r.name == symbol)
      return &r;
  return nullptr;
}

std::vector<KernelResources> resourcesFromCubin(const std::string &cubin) {
  // ELF64 little-endian: section headers at e_shoff (0x28), e_shentsize,
  // e_shnum, e_shstrndx at 0x3a; each header: name, type, flags, addr,
  // offset (+0x18), size (+0x20), link (+0x28), ...
  const auto *d = reinterpret_cast<const unsigned char *>(cubin.data());
  size_t n = cubin.size();
  auto u16 = [&](size_t at) { return at + 2 <= n ? uint32_t(d[at] | d[at + 1] << 8) : 0u; };
  auto u32 = [&](size_t at) { return at + 4 <= n ? u16(at) | u16(at + 2) << 16 : 0u; };
  auto u64 = [&](size_t at) { return at + 8 <= n ? uint64_t(u32(at)) | uint64_t(u32(at + 4)) << 32 : 0; };
  std::vector<KernelResources> out;
  if (n < 64 || std::memcmp(d, "\x7f" "ELF", 4) != 0 || d[4] != 2 || d[5] != 1)
    return out;
  uint64_t shoff = u64(0x28);
  uint32_t shentsize = u16(0x3a), shnum = u16(0x3c), shstrndx = u16(0x3e);
  if (shentsize < 64 || shstrndx >= shnum || shoff + uint64_t(shnum) * shentsize > n)
    return out;
  struct Section {
    uint32_t name, type, link;
    uint64_t offset, size;
  };
  std::vector<Section> sections;
  for (uint32_t i = 0; i < shnum; ++i) {
    size_t h = size_t(shoff + uint64_t(i) * shentsize);
    Section s{u32(h), u32(h + 4), u32(h + 0x28), u64(h + 0x18), u64(h + 0x20)};
    if (s.type != 8 /*NOBITS*/ && (s.offset > n || s.size > n - s.offset))
      return out;
    sections.push_back(s);
  }
  auto str = [&](const Section &table, uint32_t at) -> std::string {
    if (at >= table.size)
      return {};
    const char *p = reinterpret_cast<const char *>(d + table.offset + at);
    return std::string(p, strnlen(p, size_t(table.size - at)));
  };
  const Section *info = nullptr, *symtab = nullptr;
  for (const Section &s : sections) {
    std::string name = str(sections[shstrndx], s.name);
    if (name == ".nv.info")
      info = &s;
    else if (s.type == 2 /*SYMTAB*/)
      symtab = &s;
  }
  if (!info || !symtab || symtab->link >= shnum)
    return out;
  const Section &strtab = sections[symtab->link];
  auto symbolName = [&](uint32_t index) -> std::string {
    if (uint64_t(index + 1) * 24 > symtab->size)
      return {};
    return str(strtab, u32(size_t(symtab->offset) + size_t(index) * 24));
  };
  auto entry = [&](const std::string &name) -> KernelResources & {
    for (KernelResources &r : out)
      if (r.name == name)
        return r;
    out.push_back(KernelResources{});
    out.back().name = name;
    out.back().fromCubin = true;
    return out.back();
  };
  // Records: u8 format, u8 attribute, then (format 4) u16 size and the
  // payload, or (formats 1-3) two bytes inline.
  size_t at = size_t(info->offset), end = size_t(info->offset + info->size);
  while (at + 4 <= end) {
    unsigned format = d[at], attribute = d[at + 1];
    size_t payload = format == 4 ? u16(at + 2) : 0;
    if (at + 4 + payload > end)
      break;
    if (format == 4 && payload == 8 && (attribute == 0x2f || attribute == 0x11)) {
      std::string name = symbolName(u32(at + 4));
      if (!name.empty()) {
        KernelResources &r = entry(name);
        if (attribute == 0x2f)
          r.registers = int(u32(at + 8));
        else
          r.stackBytes = u32(at + 8);
      }
    }
    at += 4 + payload;
  }
  // Only kernels with a register count (device functions have none listed).
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const KernelResources &r) { return r.registers <= 0; }),
            out.end());
  return out;
}

std::vector<KernelResources> parseResourceUsage(const std::string &log) {
  // ptxas -v, one block per function:
  //   ptxas info    : Compiling entry function 'k' for 'sm_90'
  //   ptxas info    : Function properties for k
  //   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes
  //   spill loads ptxas info    : Used 40 registers, used 1 barriers, 1024
  //   bytes smem, 360 bytes cmem[0]
  // Non-entry functions have only the "Function properties" block.
  std::vector<KernelResources> out;
  bool inEntry = false; // the last "Function properties" named the open entry
  for (const std::string &raw : split(log, '\n')) {
    std::string line = raw;
    if (!startsWith(line, "ptxas"))
      continue;
    size_t colon = line.find(':');
    std::string body = trim(
        colon == std::string::npos ? line.substr(5) : line.substr(colon + 1));
    const char *entry = "Compiling entry function '";
    const char *props = "Function properties for ";
    if (startsWith(body, entry)) {
      size_t b = std::strlen(entry), e = body.find('\'', b);
      KernelResources r;
      r.name =
          body.substr(b, e == std::string::npos ? std::string::npos : e - b);
      out.push_back(r);
      inEntry = false;
      continue;
    }
    if (startsWith(body, props)) {
      std::string name = trim(body.substr(std::strlen(props)));
      inEntry = !out.empty() && out.back().name == name;
      continue;
    }
    if (out.empty())
      continue;
    KernelResources &r = out.back();
    bool usedLine = startsWith(body, "Used ");
    if (!usedLine && !inEntry)
      continue; // a stack line for a non-entry function
    for (const std::string &field : split(body, ',')) {
      int64_t v = 0;
      if (usedCount(field, "registers", v))
        r.registers = int(v);
      else if (usedCount(field, "barriers", v))
        r.barriers = int(v);
      else if (numberWith(field, "bytes stack frame", v))
        r.stackBytes = v;
      else if (numberWith(field, "bytes spill stores", v))
        r.spillStores = v;
      else if (numberWith(field, "bytes spill loads", v))
        r.spillLoads = v;
      else if (numberWith(field, "bytes smem", v))
        r.sharedBytes = v;
      else if (numberWith(field, "bytes cmem[0]", v))
        r.constantBytes = v;
    }
    if (usedLine)
      inEntry = false;
  }
  return out;
}

Expected<CompiledModule> compile(const std::string &source,
                                 const std::string &name,
                                 const CompileOptions &options) {
  auto t0 = std::chrono::steady_clock::now();
  bool real = false;
  int number = 0;
  if (!parseArch(options.arch, real, number))
    return Status::internal(fmt::format(
        "{}: unknown CUDA target '{}': use sm_XY (PTX and CUBIN for one GPU) "
        "or compute_XY (PTX for the driver to compile)",
        name, options.arch));
  std::vector<int> archs = supportedArchs();
  if (!archs.empty() &&
      std::find(archs.begin(), archs.end(), number) == archs.end())
    return Status::error(fmt::format(
        "{}: NVRTC {} cannot compile for {} (it supports {}); pick a supported "
        "target (see targetFor) or use an NVRTC that supports this GPU",
        name, nvrtcVersion(), options.arch, joinArchs(archs)));

  std::vector<std::string> opts = {"--std=c++17", "-arch=" + options.arch};
  if (options.defaultDevice)
    opts.push_back("-default-device");
  if (options.fastMath)
    opts.push_back("--use_fast_math");
  if (options.lineInfo)
    opts.push_back("-lineinfo");
  if (options.resourceUsage && real)
    opts.push_back("--ptxas-options=-v");
  for (const std::string &dir : options.includeDirs)
    opts.push_back("-I" + dir);
  const std::string &toolkit = cudaIncludeDir();
  if (!toolkit.empty())
    opts.push_back("-I" + toolkit);
  for (const std::string &o : options.extraOptions)
    opts.push_back(o);
  std::vector<const char *> argv;
  for (const std::string &o : opts)
    argv.push_back(o.c_str());

  Program program;
  KILN_NVRTC_TRY(nvrtcCreateProgram(&program.handle, source.c_str(),
                                    name.c_str(), 0, nullptr, nullptr));
  nvrtcResult compiled =
      nvrtcCompileProgram(program.handle, int(argv.size()), argv.data());
  CompiledModule module;
  module.name = name;
  module.arch = options.arch;
  size_t logSize = 0;
  if (nvrtcGetProgramLogSize(program.handle, &logSize) == NVRTC_SUCCESS &&
      logSize > 1) {
    module.log.resize(logSize);
    if (nvrtcGetProgramLog(program.handle, module.log.data()) != NVRTC_SUCCESS)
      module.log.clear();
    while (!module.log.empty() &&
           (module.log.back() == '\0' || module.log.back() == '\n'))
      module.log.pop_back();
  }

  if (compiled != NVRTC_SUCCESS) {
    std::string options_;
    for (const std::string &o : opts)
      options_ += (options_.empty() ? "" : " ") + o;
    if (compiled != NVRTC_ERROR_COMPILATION)
      return nvrtcStatus(
          compiled, "nvrtcCompileProgram", __FILE__, __LINE__,
          fmt::format("{}: options: {}\n{}", name, options_, module.log));
    bool written = false;
    std::string path =
        writeFailure(source, module.log, options.failureDir, written);
    // nvcc takes the same options except NVRTC's own (-default-device) and
    // the resource report, which only adds noise.
    std::string nvcc;
    for (const std::string &o : opts)
      if (o != "-default-device" && o != "--ptxas-options=-v")
        nvcc += " " + o;
    std::string message = fmt::format(
        "{}: NVRTC {} failed to compile the CUDA kernels for {}:\n{}\n"
        "the source is in {}{}; NVRTC options: {}; reproduce with: nvcc{} -c "
        "-o /dev/null {}",
        name, nvrtcVersion(), options.arch, module.log, path,
        written ? fmt::format(" (NVRTC's log in {}.log)", path) : "", options_,
        nvcc, written ? path : "<source>");
    if (module.log.find("could not open source file \"cuda_") !=
            std::string::npos &&
        toolkit.empty())
      message += "\nNVRTC has no built-in cuda_fp16.h/cuda_bf16.h and no CUDA "
                 "toolkit include folder was found: set KILN_CUDA_INCLUDE to "
                 "the folder that holds cuda_fp16.h";
    return Status::internal(message);
  }

  size_t ptxSize = 0;
  KILN_NVRTC_TRY(nvrtcGetPTXSize(program.handle, &ptxSize));
  module.ptx.resize(ptxSize);
  KILN_NVRTC_TRY(nvrtcGetPTX(program.handle, module.ptx.data()));
  while (!module.ptx.empty() && module.ptx.back() == '\0')
    module.ptx.pop_back();
  if (real) {
    size_t cubinSize = 0;
    KILN_NVRTC_TRY(nvrtcGetCUBINSize(program.handle, &cubinSize));
    if (cubinSize == 0)
      return Status::internal(fmt::format(
          "{}: NVRTC {} produced no CUBIN for {}; report this as a Kiln bug",
          name, nvrtcVersion(), options.arch));
    module.cubin.resize(cubinSize);
    KILN_NVRTC_TRY(nvrtcGetCUBIN(program.handle, module.cubin.data()));
    if (options.resourceUsage) {
      module.resources = parseResourceUsage(module.log);
      for (KernelResources &r : resourcesFromCubin(module.cubin))
        if (!module.resourcesFor(r.name))
          module.resources.push_back(std::move(r));
    }
  }
  module.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return module;
}

} // namespace kiln::cuda
