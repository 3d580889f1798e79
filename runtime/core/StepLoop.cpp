//===- StepLoop.cpp - One loop over a function's steps --------------------===//
#include "runtime/core/StepLoop.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln {

Status StepHooks::runCollective(const program::Step &s) {
  return Status::error(fmt::format(
      "this backend has no communicator: the plan's {} step{} exchanges data between "
      "devices; run it on a backend with a communicator",
      program::collectiveOpName(s.collective.op), s.loc.empty() ? "" : " at " + s.loc));
}

void StepProfile::addCollective(const program::Step &s, double seconds) {
  Acc &a = collectives_[program::collectiveOpName(s.collective.op)];
  a.seconds += seconds;
  a.calls++;
}

std::vector<Backend::Timing> StepProfile::timings(const program::Program &p) const {
  std::vector<Backend::Timing> out;
  for (size_t k = 0; k < p.kernels.size() && k < kernels_.size(); ++k)
    if (kernels_[k].calls)
      out.push_back({p.kernels[k].symbol, p.kernels[k].op,
                     p.kernels[k].locs.empty() ? "" : p.kernels[k].locs[0],
                     kernels_[k].seconds, kernels_[k].calls});
  gemms_.appendTo(out);
  if (copy_.calls)
    out.push_back({"copy", "copy", "", copy_.seconds, copy_.calls});
  for (const auto &[op, a] : collectives_)
    out.push_back({op, "collective", "", a.seconds, a.calls});
  return out;
}

Status checkSingleDevice(const program::Program &p) {
  if (p.numDevices() != 1)
    return Status::error(fmt::format("the program runs over a mesh of {} devices; this "
                                     "backend runs one", p.numDevices()));
  for (const program::Function &f : p.functions)
    for (size_t i = 0; i < f.steps.size(); ++i)
      if (f.steps[i].kind == program::Step::Collective)
        return Status::error(fmt::format(
            "@{} step {} is a collective ({}); this backend has no communicator, so it "
            "runs programs without collectives only",
            f.name, i, program::collectiveOpName(f.steps[i].collective.op)));
  return Status::ok();
}

Status runSteps(const program::Program &p, const program::Function &f, size_t begin,
                size_t end, StepHooks &hooks, StepProfile *profile) {
  end = std::min(end, f.steps.size());
  bool library = hooks.libraryEpilogues();
  for (size_t si = begin; si < end; ++si) {
    const program::Step &s = f.steps[si];
    bool libraryEpilogue = s.kind == program::Step::Gemm && s.lt.valid() && library;
    if (profile)
      if (Status r = hooks.beginTimed(); !r)
        return r;
    Status r = Status::ok();
    switch (s.kind) {
    case program::Step::Kernel:
      r = hooks.runKernel(s.kernel, s.args);
      break;
    case program::Step::Gemm:
      r = hooks.runGemm(s, libraryEpilogue);
      break;
    case program::Step::Copy:
      r = hooks.runCopy(s);
      break;
    case program::Step::Collective:
      r = hooks.runCollective(s);
      break;
    }
    if (!r)
      return r;
    if (profile) {
      auto dt = hooks.endTimed();
      if (!dt)
        return dt.status();
      switch (s.kind) {
      case program::Step::Kernel: profile->addKernel(s.kernel, *dt); break;
      case program::Step::Gemm: profile->addGemm(s, *dt, hooks.gemmName()); break;
      case program::Step::Copy: profile->addCopy(*dt); break;
      case program::Step::Collective: profile->addCollective(s, *dt); break;
      }
    }
    // A GEMM's epilogue kernel, unless the library call did its work.
    if (s.kind == program::Step::Gemm && s.epilogue >= 0 && !libraryEpilogue) {
      if (profile)
        if (Status x = hooks.beginTimed(); !x)
          return x;
      if (Status x = hooks.runKernel(s.epilogue, s.epilogueArgs); !x)
        return x;
      if (profile) {
        auto dt = hooks.endTimed();
        if (!dt)
          return dt.status();
        profile->addKernel(s.epilogue, *dt);
      }
    }
  }
  return Status::ok();
}

} // namespace kiln
