//===- HalfGemmCache.cpp - Which bf16/f16 GEMM, per shape
//------------------===//
#include "runtime/cpu/HalfGemmCache.h"

#include "runtime/core/Log.h"
#include "runtime/cpu/Blas.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace kiln::cpu {

namespace {

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string noSpaces(std::string s) {
  for (char &c : s)
    if (c == ' ' || c == '\t')
      c = '_';
  return s;
}

std::string body(const std::string &machine, const std::string &key,
                 const HalfGemmChoice &c) {
  return fmt::format("{} {} {} {:.1f} {:.1f} {:.1f}", machine, key,
                     halfGemmName(c.method), c.widenSeconds * 1e6,
                     c.librarySeconds * 1e6, c.dotSeconds * 1e6);
}

std::string layout(const program::MatrixLayout &l) {
  return fmt::format("{}.{}.{}", l.ld, l.outer, l.inner);
}

} // namespace

std::string halfGemmKey(const MatmulShape &s) {
  return fmt::format("{}:{}x{}x{}x{}:{}{}:{}{}:{}:{}/{}/{}",
                     s.dtype == program::DType::BF16 ? "bf16" : "f16", s.batch,
                     s.m, s.n, s.k, s.transposeLhs ? 'T' : 'N',
                     s.transposeRhs ? 'T' : 'N', int(s.lhsBatched),
                     int(s.rhsBatched), s.heads, layout(s.lhsLayout),
                     layout(s.rhsLayout), layout(s.outLayout));
}

std::string halfGemmMachine() {
  std::string cpu = "cpu";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos)
        cpu = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  auto b = blas();
  return noSpaces(cpu + "|" + (b ? (*b)->name : std::string("no-blas")));
}

HalfGemmCache::HalfGemmCache(std::string path, std::string machine)
    : path_(std::move(path)), machine_(noSpaces(std::move(machine))) {
  if (path_.empty())
    return;
  std::ifstream in(path_);
  int lineNo = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineNo;
    if (line.empty())
      continue;
    std::istringstream is(line);
    std::string machine, key, method, check;
    double widenUs = -1, libUs = -1, dotUs = -1;
    is >> machine >> key >> method >> widenUs >> libUs >> dotUs >> check;
    size_t cut = line.rfind(' ');
    bool ok = !is.fail() &&
              (method == "widen" || method == "library" || method == "dpbf16") &&
              widenUs >= 0 && libUs >= 0 && dotUs >= 0 && cut != std::string::npos &&
              check == fmt::format("{:016x}", fnv1a(line.substr(0, cut)));
    if (!ok) {
      ++skipped_;
      log::warn("{}:{}: a damaged half-precision GEMM choice; ignored (it is "
                "measured again)",
                path_, lineNo);
      continue;
    }
    if (machine != machine_) {
      others_[machine + " " + key] = line;
      continue;
    }
    mine_[key] = {method == "library"  ? HalfGemm::Library
                  : method == "dpbf16" ? HalfGemm::DotProducts
                                       : HalfGemm::Widen,
                  widenUs * 1e-6, libUs * 1e-6, dotUs * 1e-6};
  }
}

std::optional<HalfGemmChoice>
HalfGemmCache::lookup(const std::string &key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mine_.find(key);
  if (it == mine_.end())
    return std::nullopt;
  return it->second;
}

void HalfGemmCache::remember(const std::string &key, const HalfGemmChoice &c) {
  std::lock_guard<std::mutex> lock(mu_);
  mine_[key] = c;
  if (path_.empty())
    return;
  std::string text;
  for (const auto &[k, line] : others_)
    text += line + "\n";
  for (const auto &[k, choice] : mine_) {
    std::string b = body(machine_, k, choice);
    text += fmt::format("{} {:016x}\n", b, fnv1a(b));
  }
  std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) {
      std::remove(tmp.c_str());
      return; // a cache that cannot be written only costs a measurement
    }
  }
  std::rename(tmp.c_str(), path_.c_str());
}

} // namespace kiln::cpu
