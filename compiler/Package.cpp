//===- Package.cpp - Writing a .kpack artifact ----------------------------===//
#include "compiler/Package.h"

#include "compiler/IndexRanges.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "reference/Interpreter.h"
#include "runtime/core/Checkpoint.h"
#include "runtime/core/Half.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/SHA256.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>

using namespace mlir;
using json = nlohmann::ordered_json;

namespace kiln {

namespace {

json toJson(Attribute a) {
  if (auto b = dyn_cast<BoolAttr>(a))
    return b.getValue();
  if (auto i = dyn_cast<IntegerAttr>(a))
    return i.getInt();
  if (auto f = dyn_cast<FloatAttr>(a))
    return f.getValueAsDouble();
  if (auto s = dyn_cast<StringAttr>(a))
    return s.str();
  if (auto arr = dyn_cast<ArrayAttr>(a)) {
    json j = json::array();
    for (Attribute e : arr)
      j.push_back(toJson(e));
    return j;
  }
  if (auto d = dyn_cast<DictionaryAttr>(a)) {
    json j = json::object();
    for (NamedAttribute n : d)
      j[n.getName().str()] = toJson(n.getValue());
    return j;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  a.print(os);
  return s;
}

std::string hex(ArrayRef<uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes)
    s += fmt::format("{:02x}", b);
  return s;
}

json tensorSig(const program::Buffer &b) {
  json j = {{"name", b.name}, {"dtype", program::dtypeName(b.dtype)}, {"shape", b.shape}};
  if (!b.shardAxis.empty()) { // ZeRO: this device's block of the logical tensor
    j["shard_axis"] = b.shardAxis;
    j["logical_shape"] = b.logicalShape;
    if (b.shardDim >= 0) { // tensor-parallel: dimension shard_dim split
      j["shard_dim"] = b.shardDim;
      j["shard_outer"] = b.shardOuter;
      if (!b.zeroAxis.empty()) // ZeRO blocks the tp block over shard_zero
        j["shard_zero"] = b.zeroAxis;
    }
  }
  return j;
}

/// An interpreter tensor as safetensors bytes of the buffer's dtype. A
/// sharded buffer's initial value is its logical (unsharded) tensor, as in
/// checkpoints: the trainer cuts each device's block.
bool toBytes(const interp::Tensor &t, const program::Buffer &b, ckpt::Tensor &out) {
  out.name = b.name;
  out.shape = b.shardAxis.empty() ? b.shape : b.logicalShape;
  int64_t n = t.numel(), want = 1;
  for (int64_t d : out.shape)
    want *= d;
  if (n != want)
    return false;
  switch (b.dtype) {
  case program::DType::F32: {
    out.dtype = "F32";
    out.bytes.resize(size_t(n) * 4);
    for (int64_t k = 0; k < n; ++k) {
      float v = float(t.f[k]);
      std::memcpy(&out.bytes[size_t(k) * 4], &v, 4);
    }
    return true;
  }
  case program::DType::F64: {
    out.dtype = "F64";
    out.bytes.resize(size_t(n) * 8);
    std::memcpy(out.bytes.data(), t.f.data(), size_t(n) * 8);
    return true;
  }
  case program::DType::I64: {
    out.dtype = "I64";
    out.bytes.resize(size_t(n) * 8);
    std::memcpy(out.bytes.data(), t.i.data(), size_t(n) * 8);
    return true;
  }
  case program::DType::BF16:
  case program::DType::F16: {
    // Mixed precision's low copies of parameters (the values are already
    // rounded by @init's cast, so this conversion is exact).
    out.dtype = b.dtype == program::DType::BF16 ? "BF16" : "F16";
    out.bytes.resize(size_t(n) * 2);
    for (int64_t k = 0; k < n; ++k) {
      uint16_t h = floatToHalf(b.dtype, float(t.f[k]));
      std::memcpy(&out.bytes[size_t(k) * 2], &h, 2);
    }
    return true;
  }
  case program::DType::I32: {
    out.dtype = "I32";
    out.bytes.resize(size_t(n) * 4);
    for (int64_t k = 0; k < n; ++k) {
      int32_t v = int32_t(t.i[k]);
      std::memcpy(&out.bytes[size_t(k) * 4], &v, 4);
    }
    return true;
  }
  default:
    return false;
  }
}

} // namespace

Expected<std::vector<artifact::Section>>
buildPackage(ModuleOp module, const CompiledProgram &compiled, const PackageInputs &in) {
  const program::Program &p = compiled.program;
  std::vector<artifact::Section> sections;

  // Initial values: @init(seed) on the reference interpreter, in the order
  // of its results, matched to persistent buffers by name.
  auto init = module.lookupSymbol<func::FuncOp>("init");
  if (!init)
    return Status::internal("the module has no @init");
  interp::Tensor seed = interp::Tensor::zeros(interp::Elem::I64, {});
  seed.i[0] = int64_t(in.seed);
  std::vector<interp::Tensor> values;
  std::string error;
  if (!interp::run(init, {seed}, values, error))
    return Status::internal("running @init: " + error);
  ckpt::Checkpoint initial;
  std::vector<std::string> zeroInitializers;
  for (unsigned r = 0; r < init.getNumResults(); ++r) {
    auto name = init.getResultAttrOfType<StringAttr>(r, KilnDialect::kOutputAttr);
    int id = name ? p.persistent(name.str()) : -1;
    if (id < 0)
      continue; // state the compiled functions never read
    ckpt::Tensor t;
    if (!toBytes(values[r], p.buffers[id], t))
      return Status::internal("initial value of '" + name.str() +
                              "' does not match its buffer");
    if (in.omitZeroInitializers &&
        std::all_of(t.bytes.begin(), t.bytes.end(), [](char c) { return c == 0; })) {
      zeroInitializers.push_back(t.name);
      continue;
    }
    initial.tensors.push_back(std::move(t));
  }
  initial.metadata["seed"] = std::to_string(in.seed);
  Expected<std::string> initBytes = ckpt::serialize(initial);
  if (!initBytes)
    return initBytes.status();

  // Manifest: what a user of the artifact needs without reading the plan.
  json m;
  m["format"] = "kiln-package";
  m["compiler"] = "kilnc (Kiln) 0.1.0";
  m["target"] = in.target;
  if (auto name = module->getAttrOfType<StringAttr>(KilnDialect::kModelAttr))
    m["model"] = name.str();
  m["source"] = {{"path", in.sourcePath},
                 {"sha256", hex(llvm::SHA256::hash(llvm::arrayRefFromStringRef(in.sourceText)))}};
  // The path as given is relative to where kilnc ran; the absolute one lets
  // a tool run elsewhere (check-trace.py) find the file.
  if (!in.sourcePath.empty() && llvm::sys::fs::exists(in.sourcePath)) {
    llvm::SmallString<256> abs;
    if (!llvm::sys::fs::real_path(in.sourcePath, abs))
      m["source"]["abs_path"] = std::string(abs.str());
  }
  m["init_seed"] = in.seed;
  if (auto dims = module->getAttrOfType<DictionaryAttr>(KilnDialect::kDimsAttr))
    m["dims"] = toJson(dims);
  if (auto train = module->getAttrOfType<DictionaryAttr>(KilnDialect::kTrainAttr))
    m["train"] = toJson(train);
  json params = json::array(), state = json::array();
  for (const program::Buffer &b : p.buffers) {
    if (b.role == program::Role::Param)
      params.push_back(tensorSig(b));
    if (b.role == program::Role::State)
      state.push_back(tensorSig(b));
  }
  m["params"] = params;
  m["state"] = state;
  if (in.omitZeroInitializers)
    m["zero_initializers"] = zeroInitializers;
  // Integer inputs that index carry their valid range (docs/artifact.md);
  // the runtime checks data files against it on load.
  std::map<std::string, IndexRange> ranges = inputIndexRanges(module);
  json fns = json::object();
  for (const program::Function &f : p.functions) {
    json args = json::array(), results = json::array();
    for (int id : f.args) {
      const program::Buffer &b = p.buffers[id];
      json sig = tensorSig(b);
      auto r = ranges.find(b.name);
      if (b.role == program::Role::Input && r != ranges.end()) {
        sig["range"] = {r->second.lo, r->second.hi};
        sig["range_from"] = r->second.from;
      }
      args.push_back(sig);
    }
    for (int id : f.results)
      results.push_back(tensorSig(p.buffers[id]));
    fns[f.name] = {{"args", args}, {"results", results}};
  }
  m["functions"] = fns;
  m["kernels"] = {{"cpu", {{"format", "llvm-bitcode"}, {"section", "kernels.cpu"},
                           {"llvm", LLVM_VERSION_STRING},
                           {"sha256", hex(llvm::SHA256::hash(llvm::arrayRefFromStringRef(compiled.bitcode)))}}}};
  if (!in.cudaManifest.empty())
    m["kernels"]["cuda"] = json::parse(in.cudaManifest);

  // Provenance: each kernel's model-file locations, and the model source.
  json prov;
  prov["source_path"] = in.sourcePath;
  json ks = json::object();
  for (const program::Kernel &k : p.kernels)
    ks[k.symbol] = {{"op", k.op}, {"locs", k.locs}};
  prov["kernels"] = ks;
  prov["source"] = in.sourceText;

  using artifact::SectionKind;
  sections.push_back({SectionKind::Manifest, "manifest", m.dump(1)});
  sections.push_back({SectionKind::Initializers, "initializers", *initBytes});
  sections.push_back({SectionKind::Plan, "plan", p.toJson()});
  sections.push_back({SectionKind::Kernels, "kernels.cpu", compiled.bitcode});
  sections.push_back({SectionKind::Provenance, "provenance", prov.dump(1)});
  for (const artifact::Section &x : in.extraSections)
    sections.push_back(x);
  return sections;
}

} // namespace kiln
