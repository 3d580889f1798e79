//===- Machine.cpp - The machine file kiln-run devices --calibrate writes -===//
#include "runtime/core/Machine.h"

#include <fmt/format.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>

namespace kiln::planner {

namespace {

constexpr const char *kMagic = "kiln-machine 1";

/// `"text"` with quotes and backslashes escaped.
std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}

std::string trim(const std::string &s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

} // namespace

std::string machineFileText(const Machine &m) {
  std::string out;
  out += kMagic;
  out += "\n# The machine as kiln-run measured it (kiln-run devices --calibrate), for\n"
         "# kilnc --parallel=auto --machine FILE. Rates are totals for the machine.\n";
  out += fmt::format("devices = {}\n", m.devices);
  out += fmt::format("cores = {}\n", m.cores);
  out += fmt::format("gflops = {:.6g}\n", m.machineFlops / 1e9);
  out += fmt::format("gbps = {:.6g}\n", m.machineBandwidth / 1e9);
  out += fmt::format("latency-us = {:.6g}\n", m.commLatency * 1e6);
  out += fmt::format("busbw-gbps = {:.6g}\n", m.commBusBandwidth / 1e9);
  out += "calibration = " + quoted(m.calibration) + "\n";
  out += "comm-calibration = " + quoted(m.commCalibration) + "\n";
  return out;
}

bool parseMachineFile(const std::string &text, const std::string &path, Machine &m,
                      std::string &error) {
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  auto fail = [&](const std::string &why) {
    error = fmt::format("{}:{}: {}", path, lineNo, why);
    return false;
  };
  if (!std::getline(in, line) || trim(line) != kMagic) {
    lineNo = 1;
    return fail(std::string("not a machine file (its first line must be '") + kMagic +
                "'); write one with kiln-run devices --calibrate --devices N -o FILE");
  }
  lineNo = 1;
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> texts;
  while (std::getline(in, line)) {
    ++lineNo;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#')
      continue;
    size_t eq = t.find('=');
    if (eq == std::string::npos)
      return fail("expected KEY = VALUE, got '" + t + "'");
    std::string key = trim(t.substr(0, eq)), value = trim(t.substr(eq + 1));
    if (key == "calibration" || key == "comm-calibration") {
      if (value.size() < 2 || value.front() != '"' || value.back() != '"')
        return fail(key + " must be a quoted string");
      std::string s;
      for (size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size())
          ++i;
        s += value[i];
      }
      texts[key] = s;
      continue;
    }
    static const char *known[] = {"devices", "cores", "gflops", "gbps", "latency-us",
                                  "busbw-gbps"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known))
      return fail("unknown key '" + key +
                  "' (devices, cores, gflops, gbps, latency-us, busbw-gbps, calibration, "
                  "comm-calibration)");
    char *end = nullptr;
    errno = 0;
    double d = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || errno || !std::isfinite(d) || d < 0 ||
        (d == 0 && key != "latency-us"))
      return fail("'" + key + "' must be a positive number, got '" + value + "'");
    if (numbers.count(key))
      return fail("'" + key + "' is given twice");
    numbers[key] = d;
  }
  for (const char *k : {"devices", "cores", "gflops", "gbps", "latency-us", "busbw-gbps"})
    if (!numbers.count(k)) {
      error = fmt::format("{}: '{}' is missing; write the file again with kiln-run devices "
                          "--calibrate",
                          path, k);
      return false;
    }
  m.measured = true;
  m.devices = int(numbers["devices"]);
  setMachineTotals(m, int(numbers["cores"]), numbers["gflops"], numbers["gbps"],
                   numbers["latency-us"], numbers["busbw-gbps"]);
  m.calibration = texts["calibration"] + " (from " + path + ")";
  m.commCalibration = texts["comm-calibration"] + " (from " + path + ")";
  return true;
}

} // namespace kiln::planner
