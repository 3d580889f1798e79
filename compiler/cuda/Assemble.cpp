//===- Assemble.cpp - The CUDA side of an artifact ------------------------===//
#include "compiler/cuda/Assemble.h"

#include "runtime/core/GpuPlan.h"
#include "runtime/cuda/emu/Prelude.h"
#ifdef KILN_HAVE_NVRTC
#include "runtime/cuda/Nvrtc.h"
#endif

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace kiln {

Expected<CudaArtifact> assembleCuda(const CudaProgram &program, size_t numKernels,
                                    const CudaAssembleOptions &options,
                                    const std::function<void(const std::string &)> &note) {
  using artifact::SectionKind;
  std::string source =
      (options.maxRegisters > 0
           ? fmt::format("#define KILN_MAX_REGISTERS {}\n", options.maxRegisters)
           : "") +
      std::string(cuda::preludeText()) + "\n" + program.source;
  gpu::Plan plan;
  plan.kernels = program.kernels;
  CudaArtifact out;
  std::vector<artifact::Section> binaries;
#ifdef KILN_HAVE_NVRTC
  plan.nvrtcVersion = cuda::nvrtcVersion();
  for (const std::string &arch : options.archs) {
    cuda::CompileOptions o;
    o.arch = arch;
    auto mod = cuda::compile(source, "kernels.cuda.cu", o);
    if (!mod)
      return Status::internal(mod.status().message());
    plan.archs.push_back(arch);
    std::vector<gpu::Resources> &res = plan.resources[arch];
    int maxRegs = 0;
    std::vector<std::string> spilling;
    int unreported = 0; // registers from the CUBIN: ptxas said nothing
    for (const cuda::KernelResources &r : mod->resources) {
      unreported += r.fromCubin;
      gpu::Resources x;
      x.function = r.name;
      x.registers = r.registers;
      x.spillStores = r.spillStores;
      x.spillLoads = r.spillLoads;
      x.stackBytes = r.stackBytes;
      x.sharedBytes = r.sharedBytes;
      res.push_back(x);
      maxRegs = std::max(maxRegs, r.registers);
      if (r.spills())
        spilling.push_back(fmt::format("{} ({} bytes stored, {} loaded)", r.name,
                                       r.spillStores, r.spillLoads));
    }
    note(fmt::format("CUDA {}: {} functions for {} kernels compiled by NVRTC {} in {:.1f} s; "
                     "at most {} registers per thread; {}",
                     arch, mod->resources.size(), numKernels, plan.nvrtcVersion, mod->seconds,
                     maxRegs,
                     !spilling.empty() ? "SPILLS (see below)"
                     : unreported
                         ? fmt::format("no spills reported ({} without a ptxas report: "
                                       "registers read from the CUBIN)",
                                       unreported)
                         : "no spills"));
    for (const std::string &sp : spilling)
      note(fmt::format("warning: CUDA {}: {} spills registers to local memory", arch, sp));
    binaries.push_back({SectionKind::Kernels, "kernels.cuda." + arch + ".ptx", mod->ptx});
    if (!mod->cubin.empty())
      binaries.push_back({SectionKind::Kernels, "kernels.cuda." + arch + ".cubin", mod->cubin});
  }
#else
  (void)numKernels;
  note("built without the CUDA toolkit: the artifact holds the CUDA source only; kiln-run "
       "compiles it with NVRTC when it loads");
#endif
  nlohmann::ordered_json manifest;
  manifest["format"] = "cuda-c++";
  manifest["source"] = "kernels.cuda.source";
  manifest["plan"] = "kernels.cuda.plan";
  manifest["archs"] = plan.archs;
  manifest["nvrtc"] = plan.nvrtcVersion;
  out.manifest = manifest.dump();
  out.sections.push_back({SectionKind::Kernels, "kernels.cuda.source", source});
  out.sections.push_back({SectionKind::Kernels, "kernels.cuda.plan", plan.toJson()});
  for (artifact::Section &s : binaries)
    out.sections.push_back(std::move(s));
  return out;
}

} // namespace kiln
