//===- GpuPlan.cpp - How a program's kernels launch on a GPU --------------===//
#include "runtime/core/GpuPlan.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

using json = nlohmann::ordered_json;

namespace kiln::gpu {

std::string Plan::toJson() const {
  json j;
  j["format"] = "kiln-cuda-plan";
  j["nvrtc"] = nvrtcVersion;
  j["archs"] = archs;
  json ks = json::array();
  for (const std::vector<Launch> &k : kernels) {
    json ls = json::array();
    for (const Launch &l : k)
      ls.push_back({{"function", l.function}, {"form", l.form},
                    {"grid", {l.grid[0], l.grid[1], l.grid[2]}},
                    {"block", {l.block[0], l.block[1], l.block[2]}},
                    {"shared", l.sharedBytes}});
    ks.push_back(ls);
  }
  j["kernels"] = ks;
  json rs = json::object();
  for (const auto &[arch, list] : resources) {
    json a = json::array();
    for (const Resources &r : list)
      a.push_back({{"function", r.function}, {"registers", r.registers},
                   {"spill_stores", r.spillStores}, {"spill_loads", r.spillLoads},
                   {"stack", r.stackBytes}, {"shared", r.sharedBytes}});
    rs[arch] = a;
  }
  j["resources"] = rs;
  return j.dump(1);
}

Expected<Plan> Plan::parse(const std::string &text, const std::string &origin,
                           size_t numKernels) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "{}: the CUDA plan is invalid: {}; recompile the model with kilnc --target=cuda",
        origin, why));
  };
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "kiln-cuda-plan")
    return bad("it is not a kiln-cuda-plan JSON object");
  Plan p;
  p.nvrtcVersion = j.value("nvrtc", "");
  if (j.contains("archs") && j["archs"].is_array())
    for (const json &a : j["archs"])
      if (a.is_string())
        p.archs.push_back(a.get<std::string>());
  if (!j.contains("kernels") || !j["kernels"].is_array() || j["kernels"].size() != numKernels)
    return bad(fmt::format("it lists {} kernels, the program has {}",
                           j.contains("kernels") && j["kernels"].is_array() ? j["kernels"].size() : 0,
                           numKernels));
  for (const json &k : j["kernels"]) {
    if (!k.is_array() || k.empty())
      return bad("a kernel has no launches");
    std::vector<Launch> ls;
    for (const json &l : k) {
      Launch x;
      if (!l.is_object() || !l.contains("function") || !l["function"].is_string() ||
          !l.contains("grid") || !l.contains("block"))
        return bad("a launch lacks its function, grid or block");
      x.function = l["function"].get<std::string>();
      x.form = l.value("form", "");
      x.sharedBytes = l.value("shared", int64_t(0));
      const int64_t limits[2][3] = {{(int64_t(1) << 31) - 1, 65535, 65535}, {1024, 1024, 64}};
      for (int which = 0; which < 2; ++which) {
        const json &d = l[which == 0 ? "grid" : "block"];
        if (!d.is_array() || d.size() != 3)
          return bad("a launch dimension is not three numbers");
        for (int i = 0; i < 3; ++i) {
          if (!d[i].is_number_integer() || d[i].get<int64_t>() < 1 ||
              d[i].get<int64_t>() > limits[which][i])
            return bad("launch " + x.function + " has a dimension out of CUDA's range");
          (which == 0 ? x.grid : x.block)[i] = d[i].get<int64_t>();
        }
      }
      if (x.block[0] * x.block[1] * x.block[2] > 1024 || x.sharedBytes < 0 ||
          x.sharedBytes > 227 * 1024)
        return bad("launch " + x.function + " asks for too many threads or too much shared memory");
      ls.push_back(x);
    }
    p.kernels.push_back(std::move(ls));
  }
  if (j.contains("resources") && j["resources"].is_object())
    for (auto it = j["resources"].begin(); it != j["resources"].end(); ++it) {
      if (!it.value().is_array())
        continue;
      for (const json &r : it.value()) {
        Resources x;
        x.function = r.value("function", "");
        x.registers = r.value("registers", 0);
        x.spillStores = r.value("spill_stores", int64_t(0));
        x.spillLoads = r.value("spill_loads", int64_t(0));
        x.stackBytes = r.value("stack", int64_t(0));
        x.sharedBytes = r.value("shared", int64_t(0));
        p.resources[it.key()].push_back(x);
      }
    }
  return p;
}

} // namespace kiln::gpu
