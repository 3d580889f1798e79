//===- Package.cpp - Loading a .kpack -------------------------------------===//
#include "runtime/core/Package.h"

#include "runtime/core/Artifact.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln {

using json = nlohmann::ordered_json;

const char *safetensorsDType(program::DType t) {
  switch (t) {
  case program::DType::F32: return "F32";
  case program::DType::F64: return "F64";
  case program::DType::F16: return "F16";
  case program::DType::BF16: return "BF16";
  case program::DType::I32: return "I32";
  case program::DType::I64: return "I64";
  case program::DType::I1: return "BOOL";
  }
  return "?";
}

Status checkPersistent(const program::Program &p, const ckpt::Checkpoint &c,
                       const std::string &origin) {
  for (const program::Buffer &b : p.buffers) {
    if (b.role != program::Role::Param && b.role != program::Role::State)
      continue;
    const ckpt::Tensor *t = c.find(b.name);
    if (!t)
      return Status::error(fmt::format(
          "{}: has no tensor '{}', which the model needs; was it written for "
          "another model?", origin, b.name));
    // A sharded buffer's tensor (ZeRO or tensor-parallel) is its logical one.
    const std::vector<int64_t> &shape = b.shardAxis.empty() ? b.shape : b.logicalShape;
    if (t->dtype != safetensorsDType(b.dtype) || t->shape != shape)
      return Status::error(fmt::format(
          "{}: tensor '{}' is {} {}, the model needs {} {}; was it written for "
          "another model or configuration?", origin, b.name, t->dtype,
          fmt::join(t->shape, "x"), safetensorsDType(b.dtype), fmt::join(shape, "x")));
  }
  return Status::ok();
}

namespace {
Expected<Package> openPackage(const std::string &path);
} // namespace

Expected<Package> Package::open(const std::string &path) {
  // Every field is checked for its type before use; a JSON type error that
  // still escapes (a hand-made or damaged artifact whose CRCs were
  // recomputed, as the fuzz target does) is an error about the file, never
  // a crash.
  try {
    return openPackage(path);
  } catch (const nlohmann::json::exception &e) {
    return Status::error(fmt::format("{}: a section of the artifact is malformed ({}); "
                                     "recompile the model with kilnc", path, e.what()));
  }
}

namespace {
Expected<Package> openPackage(const std::string &path) {
  auto a = artifact::Artifact::open(path);
  if (!a)
    return a.status();
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format("{}: {}; recompile the model with kilnc", path, why));
  };
  Package pkg;
  pkg.path = path;
  const artifact::Section *manifest = a->find("manifest");
  const artifact::Section *plan = a->find("plan");
  const artifact::Section *init = a->find("initializers");
  if (!manifest || !plan || !init)
    return bad("the artifact lacks its manifest, plan or initializers section");
  pkg.manifestJson = manifest->bytes;
  json m = json::parse(manifest->bytes, nullptr, false);
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != "kiln-package")
    return bad("the manifest is not a Kiln package manifest");
  pkg.model = m.value("model", "");
  if (m.contains("source") && m["source"].is_object()) {
    pkg.sourcePath = m["source"].value("path", "");
    pkg.sourceHash = m["source"].value("sha256", "");
    pkg.sourceAbsPath = m["source"].value("abs_path", "");
  }
  if (m.contains("train") && m["train"].is_object()) {
    const json &t = m["train"];
    auto geti = [&](const char *k) {
      return t.contains(k) && t[k].is_number_integer() ? t[k].get<int64_t>() : 0;
    };
    pkg.train.batch = geti("batch");
    pkg.train.steps = geti("steps");
    pkg.train.epochs = geti("epochs");
    pkg.train.lastBatch = t.value("last_batch", "");
    pkg.train.evalInterval = geti("eval_interval");
    pkg.train.evalSteps = geti("eval_steps");
    pkg.train.seed = geti("seed");
    pkg.train.logInterval = t.contains("log_interval") ? geti("log_interval") : -1;
    pkg.train.checkpointInterval =
        t.contains("checkpoint_interval") ? geti("checkpoint_interval") : -1;
    pkg.train.data = t.value("data", "");
    pkg.train.valData = t.value("val_data", "");
  }
  // Integer inputs that index carry "range": [lo, hi) in the functions'
  // signatures (no range: nothing to check, as in older artifacts).
  if (m.contains("functions") && m["functions"].is_object())
    for (const json &fn : m["functions"])
      if (fn.is_object() && fn.contains("args") && fn["args"].is_array())
        for (const json &a : fn["args"]) {
          if (!a.is_object() || !a.contains("range"))
            continue;
          const json &r = a["range"];
          std::string name = a.value("name", "");
          if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() ||
              !r[1].is_number_integer() || r[0].get<int64_t>() >= r[1].get<int64_t>())
            return bad(fmt::format("the range of input '{}' is {}, not [lo, hi) with lo < hi",
                                   name, r.dump()));
          InputRange ir{r[0].get<int64_t>(), r[1].get<int64_t>(), a.value("range_from", "")};
          auto [it, fresh] = pkg.inputRanges.try_emplace(name, ir);
          if (!fresh && (it->second.lo != ir.lo || it->second.hi != ir.hi))
            return bad(fmt::format("input '{}' has range [{}, {}) in one function and [{}, {}) "
                                   "in another", name, it->second.lo, it->second.hi, ir.lo,
                                   ir.hi));
        }
  auto prog = program::Program::parse(plan->bytes, path);
  if (!prog)
    return prog.status();
  pkg.program = std::move(*prog);
  auto initial = ckpt::parse(init->bytes, path + " (initializers)");
  if (!initial)
    return initial.status();
  pkg.initial = std::move(*initial);
  // kilnc --omit-zero-initializers: all-zero initial values are listed by
  // name instead of stored; each must be a persistent buffer not stored too.
  if (m.contains("zero_initializers")) {
    const json &zs = m["zero_initializers"];
    if (!zs.is_array())
      return bad("the manifest's zero_initializers is not a list of names");
    for (const json &z : zs) {
      std::string name = z.is_string() ? z.get<std::string>() : "";
      int id = pkg.program.persistent(name);
      if (id < 0)
        return bad(fmt::format("zero_initializers names '{}', which is not a parameter or "
                               "state buffer of the plan", z.is_string() ? name : z.dump()));
      if (pkg.initial.find(name))
        return bad(fmt::format("'{}' is both stored in the initializers and listed in "
                               "zero_initializers", name));
      const program::Buffer &b = pkg.program.buffers[id];
      ckpt::Tensor t;
      t.name = name;
      t.dtype = safetensorsDType(b.dtype);
      t.shape = b.shardAxis.empty() ? b.shape : b.logicalShape; // logical, as stored
      int64_t n = 1;
      for (int64_t d : t.shape)
        n *= d;
      t.bytes.assign(size_t(n * ckpt::dtypeWidth(t.dtype)), '\0');
      pkg.initial.tensors.push_back(std::move(t));
    }
  }
  if (Status s = checkPersistent(pkg.program, pkg.initial, path + " (initializers)"); !s)
    return s;
  if (const artifact::Section *k = a->find("kernels.cpu"))
    pkg.cpuBitcode = k->bytes;
  if (const artifact::Section *src = a->find("kernels.cuda.source")) {
    const artifact::Section *plan = a->find("kernels.cuda.plan");
    if (!plan)
      return Status::error(path + ": the artifact has CUDA source but no kernels.cuda.plan; "
                                  "recompile the model with kilnc --target=cuda");
    auto gp = gpu::Plan::parse(plan->bytes, path, pkg.program.kernels.size());
    if (!gp)
      return gp.status();
    pkg.cudaPlan = std::move(*gp);
    pkg.cudaSource = src->bytes;
    pkg.hasCuda = true;
    for (const std::string &arch : pkg.cudaPlan.archs) {
      if (const artifact::Section *x = a->find("kernels.cuda." + arch + ".ptx"))
        pkg.cudaPtx[arch] = x->bytes;
      if (const artifact::Section *x = a->find("kernels.cuda." + arch + ".cubin"))
        pkg.cudaCubin[arch] = x->bytes;
    }
  }
  // The provenance section is for tools (check-trace.py reads the model
  // source from it); the runtime names kernels from Kernel::locs in the plan.
  return pkg;
}
} // namespace

} // namespace kiln
