//===- KilnDialect.cpp - The kiln graph dialect ---------------------------===//
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"

#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace mlir;
using namespace kiln;

#include "dialects/kiln/KilnDialect.cpp.inc"

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/kiln/KilnOps.cpp.inc"
      >();
}

Operation *KilnDialect::materializeConstant(OpBuilder &builder,
                                            Attribute value, Type type,
                                            Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return builder.create<ConstantOp>(loc, elements);
}

namespace {
LogicalResult verifyNonEmptyString(Operation *op, NamedAttribute attr) {
  auto s = dyn_cast<StringAttr>(attr.getValue());
  if (!s || s.getValue().empty())
    return op->emitError() << "'" << attr.getName().getValue()
                           << "' must be a non-empty string";
  return success();
}

/// kiln.init = {kind = "normal", mean = 0.0, std = 0.02}
///           | {kind = "uniform", low = -0.1, high = 0.1}
///           | {kind = "zeros"} | {kind = "ones"}
LogicalResult verifyInit(Operation *op, Attribute value) {
  auto dict = dyn_cast<DictionaryAttr>(value);
  if (!dict)
    return op->emitError() << "'kiln.init' must be a dictionary like "
                              "{kind = \"normal\", std = 0.02 : f64}";
  auto kind = dict.getAs<StringAttr>("kind");
  if (!kind)
    return op->emitError() << "'kiln.init' needs a string 'kind'";
  llvm::SmallVector<llvm::StringRef> fields;
  llvm::StringRef k = kind.getValue();
  if (k == "normal")
    fields = {"mean", "std"};
  else if (k == "uniform")
    fields = {"low", "high"};
  else if (k != "zeros" && k != "ones")
    return op->emitError() << "'kiln.init' kind '" << k
                           << "' is unknown (expected normal, uniform, "
                              "zeros or ones)";
  for (NamedAttribute entry : dict) {
    llvm::StringRef name = entry.getName().getValue();
    if (name == "kind")
      continue;
    if (!llvm::is_contained(fields, name))
      return op->emitError() << "'kiln.init' of kind '" << k
                             << "' has unexpected field '" << name << "'";
    if (!isa<FloatAttr>(entry.getValue()))
      return op->emitError() << "'kiln.init' field '" << name
                             << "' must be a float";
  }
  for (llvm::StringRef f : fields)
    if (!dict.get(f))
      return op->emitError() << "'kiln.init' of kind '" << k
                             << "' needs field '" << f << "'";
  return success();
}
/// kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 2>}
LogicalResult verifyMesh(Operation *op, Attribute value) {
  auto dict = dyn_cast<DictionaryAttr>(value);
  auto names = dict ? dict.getAs<ArrayAttr>("axes") : ArrayAttr();
  auto shape = dict ? dict.getAs<DenseI64ArrayAttr>("shape") : DenseI64ArrayAttr();
  if (!names || !shape || dict.size() != 2)
    return op->emitError() << "'kiln.mesh' must be {axes = [\"dp\", ...], shape = "
                              "array<i64: 4, ...>}";
  if (names.size() != size_t(shape.size()) || names.empty())
    return op->emitError() << "'kiln.mesh' needs one size per axis and at least one axis";
  llvm::StringSet<> seen;
  for (auto [n, size] : llvm::zip(names, shape.asArrayRef())) {
    auto s = dyn_cast<StringAttr>(n);
    if (!s || s.getValue().empty())
      return op->emitError() << "'kiln.mesh' axis names must be non-empty strings";
    if (!seen.insert(s.getValue()).second)
      return op->emitError() << "'kiln.mesh' names axis '" << s.getValue() << "' twice";
    if (size < 1)
      return op->emitError() << "'kiln.mesh' axis '" << s.getValue() << "' has size " << size
                             << " (must be >= 1)";
  }
  return success();
}

/// kiln.shard = {axis = "dp", shape = array<i64: ...>} (ZeRO: a block of
/// the flattening), or with `dim = D` and optionally `outer = K` (tensor
/// parallelism: a block split of dimension D, each of its K outer parts
/// split alike) (docs/parallel.md). The plan checks them against the mesh.
LogicalResult verifyShard(Operation *op, Attribute value) {
  auto dict = dyn_cast<DictionaryAttr>(value);
  auto bad = [&] {
    return op->emitError() << "'kiln.shard' must be {axis = \"dp\", shape = array<i64: ...>} "
                              "or {axis = \"tp\", dim = D, outer = K, shape = array<i64: ...>} "
                              "(outer optional), the latter with zero = \"dp\" when ZeRO "
                              "also blocks the device's part over dp";
  };
  if (!dict || !dict.getAs<StringAttr>("axis") || !dict.getAs<DenseI64ArrayAttr>("shape"))
    return bad();
  size_t extra = size_t(bool(dict.get("dim"))) + size_t(bool(dict.get("outer"))) +
                 size_t(bool(dict.get("zero")));
  if (dict.size() != 2 + extra)
    return bad();
  if (!extra)
    return success();
  // ZeRO inside a tensor-parallel split: the device's per-dimension block,
  // flattened and blocked again over another axis.
  if (auto zero = dict.get("zero")) {
    auto z = dyn_cast<StringAttr>(zero);
    if (!z || !dict.get("dim") || z.getValue() == dict.getAs<StringAttr>("axis").getValue())
      return op->emitError() << "'kiln.shard' zero names the axis ZeRO blocks a tensor-parallel "
                                "block over: a string other than axis, with dim set";
  }
  auto dim = dict.getAs<IntegerAttr>("dim");
  auto outer = dict.getAs<IntegerAttr>("outer");
  if (!dim || (dict.get("outer") && !outer))
    return op->emitError() << "a tensor-parallel 'kiln.shard' must be {axis = \"tp\", shape = "
                              "array<i64: ...>, dim = D : i64, outer = K : i64} (outer "
                              "optional)";
  int64_t rank = int64_t(dict.getAs<DenseI64ArrayAttr>("shape").size());
  if (dim.getInt() < 0 || dim.getInt() >= rank || (outer && outer.getInt() < 1))
    return op->emitError() << "'kiln.shard' dim must index the logical shape and outer be >= 1";
  return success();
}

/// kiln.tp = {dim = D, outer = K} on a parameter: tensor parallelism splits
/// its dimension D (each of K outer parts alike) over the tp axis.
LogicalResult verifyTpHint(Operation *op, Attribute value) {
  auto dict = dyn_cast<DictionaryAttr>(value);
  if (!dict || dict.size() != 2 || !dict.getAs<IntegerAttr>("dim") ||
      !dict.getAs<IntegerAttr>("outer") || dict.getAs<IntegerAttr>("dim").getInt() < 0 ||
      dict.getAs<IntegerAttr>("outer").getInt() < 1)
    return op->emitError() << "'kiln.tp' must be {dim = D, outer = K} with D >= 0, K >= 1";
  return success();
}

/// kiln.stage: a pipeline stage, a coordinate of the module's "pp" axis.
LogicalResult verifyStage(Operation *op, Attribute a) {
  auto i = dyn_cast<IntegerAttr>(a);
  if (!i || i.getInt() < 0)
    return op->emitError() << "'kiln.stage' must be a non-negative integer (a pipeline stage)";
  auto module = isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  if (module) {
    // Interleaved 1F1B numbers model chunks until kiln-pipeline maps them
    // to devices: pp x V of them.
    int64_t pp = getMesh(module).axisSize("pp"), chunks = pp * virtualStages(module);
    if (pp >= 1 && i.getInt() >= chunks)
      return op->emitError() << "'kiln.stage' = " << i.getInt() << " is not a stage of the mesh's "
                             << pp << " pipeline stages"
                             << (chunks > pp ? " (" + std::to_string(chunks) + " model chunks)"
                                             : std::string());
  }
  return success();
}
} // namespace

LogicalResult KilnDialect::verifyRegionArgAttribute(Operation *op,
                                                    unsigned regionIndex,
                                                    unsigned argIndex,
                                                    NamedAttribute attr) {
  llvm::StringRef name = attr.getName().getValue();
  if (name == kParamAttr || name == kInputAttr || name == kLayerAttr ||
      name == kStateAttr)
    return verifyNonEmptyString(op, attr);
  if (name == kInitAttr)
    return verifyInit(op, attr.getValue());
  if (name == kShardAttr)
    return verifyShard(op, attr.getValue());
  if (name == "kiln.tp")
    return verifyTpHint(op, attr.getValue());
  if (name == kStageAttr)
    return verifyStage(op, attr.getValue());
  return op->emitError() << "unknown kiln argument attribute '" << name
                         << "' (expected kiln.param, kiln.layer, kiln.init, "
                            "kiln.input, kiln.state, kiln.shard, kiln.tp or kiln.stage)";
}

LogicalResult KilnDialect::verifyRegionResultAttribute(Operation *op,
                                                       unsigned regionIndex,
                                                       unsigned resultIndex,
                                                       NamedAttribute attr) {
  if (attr.getName().getValue() == kOutputAttr)
    return verifyNonEmptyString(op, attr);
  if (attr.getName().getValue() == kShardAttr)
    return verifyShard(op, attr.getValue());
  return op->emitError() << "unknown kiln result attribute '"
                         << attr.getName().getValue()
                         << "' (expected kiln.output or kiln.shard)";
}

LogicalResult KilnDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  llvm::StringRef name = attr.getName().getValue();
  if (name == kModelAttr || name == kSourceAttr || name == kBlockAttr)
    return verifyNonEmptyString(op, attr);
  if (name == kTrainAttr || name == kDimsAttr) {
    if (!isa<DictionaryAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' must be a dictionary";
    if (name == kTrainAttr) {
      auto module = dyn_cast<ModuleOp>(op);
      int64_t meshDevices =
          module && module->hasAttr(kMeshAttr) ? getMesh(module).devices() : 0;
      return verifyTrainSettings(cast<DictionaryAttr>(attr.getValue()), meshDevices,
                                 [&] { return op->emitError() << "kiln.train: "; });
    }
    return success();
  }
  if (name == kMeshAttr)
    return verifyMesh(op, attr.getValue());
  if (name == kOverlapAttr) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' must be a unit attribute";
    llvm::StringRef opName = op->getName().getStringRef();
    if (opName != "kiln.all_reduce" && opName != "kiln.reduce_scatter" &&
        opName != "kiln.all_gather")
      return op->emitError() << "'" << name << "' belongs on a collective (kiln.all_reduce, "
                                "kiln.reduce_scatter, kiln.all_gather)";
    return success();
  }
  // Data parallelism (passes/parallel/DataParallel.cpp, docs/parallel.md).
  if (name == "kiln.dp.grad")
    return verifyNonEmptyString(op, attr);
  if (name == "kiln.dp.loss" || name == "kiln.dp.grad_norm") {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' is a unit attribute";
    return success();
  }
  // Kernel formation (passes/KernelFormation.cpp): an op of @train_step's
  // first forward pass.
  if (name == "kiln.plan.forward") {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' is a unit attribute";
    return success();
  }
  // kiln-raise-attention (passes/RaiseAttention.cpp): its remarks, for the
  // fusion report.
  if (name == KilnDialect::kAttentionRemarksAttr) {
    auto list = dyn_cast<ArrayAttr>(attr.getValue());
    if (!list || !isa<ModuleOp>(op) ||
        !llvm::all_of(list, [](Attribute a) { return isa<StringAttr>(a); }))
      return op->emitError() << "'kiln.attention_remarks' must be an array of strings on the "
                                "module";
    return success();
  }
  if (name == "kiln.bucket") {
    if (!isa<IntegerAttr>(attr.getValue()))
      return op->emitError() << "'kiln.bucket' must be an integer";
    return success();
  }
  // Mixed precision (passes/MixedPrecision.cpp, passes/Precision.h): the
  // policy rule on an op, the override tag from the frontend, a rounded
  // constant's value before, and the module's precision and mode.
  if (name == "kiln.precision.rule" || name == "kiln.precision.fp32")
    return verifyNonEmptyString(op, attr);
  // A constant the pass rounded, and its value before (the report's).
  if (name == "kiln.precision.rounded_from") {
    auto d = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!d || !d.getAs<FloatAttr>("value") || !d.getAs<StringAttr>("loc") || !isa<ConstantOp>(op))
      return op->emitError() << "'kiln.precision.rounded_from' must be {value = F64, loc = "
                                "\"file:line:col\"} on a kiln.constant";
    return success();
  }
  if (name == "kiln.precision" || name == "kiln.precision.mode") {
    auto s = dyn_cast<StringAttr>(attr.getValue());
    llvm::StringRef v = s ? s.getValue() : "";
    if (name == "kiln.precision" ? v != "bf16" && v != "fp16" : v != "kiln" && v != "autocast")
      return op->emitError() << "'" << name << "' must be "
                             << (name == "kiln.precision" ? "\"bf16\" or \"fp16\""
                                                         : "\"kiln\" or \"autocast\"");
    return success();
  }
  // Pipeline parallelism (passes/parallel/Pipeline.cpp): an op's stage, the number
  // of stages `stage N { ... }` blocks name, and kiln-train-step's
  // micro-batch tags (kiln-pipeline drops them).
  if (name == kStageAttr)
    return verifyStage(op, attr.getValue());
  if (name == "kiln.stages_placed" || name == "kiln.pp.mb" || name == "kiln.pp.phase") {
    if (!isa<IntegerAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' must be an integer";
    return success();
  }
  if (name == kShardingAttr) {
    auto list = dyn_cast<ArrayAttr>(attr.getValue());
    if (!list || list.size() != op->getNumResults())
      return op->emitError() << "'kiln.sharding' must be an array with one sharding per result";
    for (auto [a, r] : llvm::zip(list, op->getResults())) {
      auto s = shardingFromAttr(a, [&] { return op->emitError(); });
      if (!s)
        return failure();
      auto t = dyn_cast<RankedTensorType>(r.getType());
      auto module = op->getParentOfType<ModuleOp>();
      if (t && module &&
          failed(verifySharding(*s, t, getMesh(module),
                                     /*logical=*/false, [&] { return op->emitError(); })))
        return failure();
    }
    return success();
  }
  return op->emitError() << "unknown kiln attribute '" << name << "'";
}

//===----------------------------------------------------------------------===//
// The device mesh
//===----------------------------------------------------------------------===//

int64_t MeshShape::devices() const {
  int64_t n = 1;
  for (const MeshAxis &a : axes)
    n *= a.size;
  return n;
}

int64_t MeshShape::axisSize(llvm::StringRef name) const {
  for (const MeshAxis &a : axes)
    if (a.name == name)
      return a.size;
  return -1;
}

int64_t kiln::stageOf(Operation *op) {
  auto a = op->getAttrOfType<IntegerAttr>(kStageAttr);
  return a ? a.getInt() : -1;
}

int64_t kiln::virtualStages(ModuleOp module) { return TrainSettings(module).virtualStages(); }

MeshShape kiln::meshFor(int64_t devices, int64_t tp, int64_t pp) {
  MeshShape mesh;
  tp = std::max<int64_t>(tp, 1);
  pp = std::max<int64_t>(pp, 1);
  if (pp > 1) {
    mesh.axes = {MeshAxis{"pp", pp}, MeshAxis{"dp", std::max<int64_t>(devices / (pp * tp), 1)}};
    if (tp > 1)
      mesh.axes.push_back(MeshAxis{"tp", tp});
  } else if (tp > 1)
    mesh.axes = {MeshAxis{"dp", std::max<int64_t>(devices / tp, 1)}, MeshAxis{"tp", tp}};
  else if (devices > 1)
    mesh.axes = {MeshAxis{"dp", devices}};
  return mesh;
}

MeshShape kiln::getMesh(ModuleOp module) {
  MeshShape mesh;
  auto dict = module->getAttrOfType<DictionaryAttr>(KilnDialect::kMeshAttr);
  if (!dict)
    return mesh;
  auto names = dict.getAs<ArrayAttr>("axes");
  auto shape = dict.getAs<DenseI64ArrayAttr>("shape");
  if (!names || !shape || names.size() != size_t(shape.size()))
    return mesh;
  for (auto [n, size] : llvm::zip(names, shape.asArrayRef()))
    if (auto s = dyn_cast<StringAttr>(n))
      mesh.axes.push_back({s.getValue().str(), size});
  return mesh;
}

void kiln::setMesh(ModuleOp module, const MeshShape &mesh) {
  if (mesh.axes.empty()) {
    module->removeAttr(KilnDialect::kMeshAttr);
    return;
  }
  Builder b(module.getContext());
  SmallVector<Attribute> names;
  SmallVector<int64_t> shape;
  for (const MeshAxis &a : mesh.axes) {
    names.push_back(b.getStringAttr(a.name));
    shape.push_back(a.size);
  }
  module->setAttr(KilnDialect::kMeshAttr,
                  b.getDictionaryAttr({b.getNamedAttr("axes", b.getArrayAttr(names)),
                                       b.getNamedAttr("shape", b.getDenseI64ArrayAttr(shape))}));
}

int64_t kiln::meshAxisSize(Operation *op, llvm::StringRef axis) {
  auto module = isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  if (!module)
    return -1;
  return getMesh(module).axisSize(axis);
}

LogicalResult kiln::verifyTrainSettings(DictionaryAttr dict, int64_t meshDevices,
                                        function_ref<InFlightDiagnostic()> emitError) {
  using namespace train_rules;
  TrainSettings t(dict);
  if (t.has("precision") && !isPrecision(t.precision()))
    return emitError() << "precision '" << t.precision() << "' is not fp32, tf32, bf16 or fp16";
  if (t.has("attention") && !isAttentionMode(t.string("attention")))
    return emitError() << "attention '" << t.string("attention") << "' is not auto, fused or unfused";
  if (t.has("precision_mode") && !isPrecisionMode(t.string("precision_mode")))
    return emitError() << "precision_mode '" << t.string("precision_mode")
                       << "' is not kiln or autocast";
  if (t.has("pipeline") && !isPipeline(t.string("pipeline")))
    return emitError() << "pipeline '" << t.string("pipeline")
                       << "' is not 1f1b, gpipe or interleaved";
  int64_t tp = std::max<int64_t>(1, t.integer("tp", 1));
  int64_t pp = std::max<int64_t>(1, t.integer("pp", 1));
  int64_t devices =
      std::max<int64_t>(1, t.integer("devices", meshDevices > 0 ? meshDevices : tp * pp));
  if (!tpDividesDevices(devices, tp))
    return emitError() << "tp = " << tp << " must divide devices = " << devices;
  if (!ppTpDivideDevices(devices, pp, tp))
    return emitError() << "devices = " << devices << " is not a multiple of pp x tp = " << pp
                       << " x " << tp;
  if (!zeroHasReplicas(t.zero(), devices, pp, tp))
    return emitError() << "zero = " << t.zero()
                       << " shards optimizer state over data-parallel replicas, and devices / "
                          "(pp x tp) = "
                       << devices / (pp * tp);
  if (!virtualStagesFitSchedule(t.has("virtual_stages"), t.string("pipeline")))
    return emitError() << "virtual_stages needs pipeline = \"interleaved\"";
  return success();
}
