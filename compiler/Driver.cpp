//===- Driver.cpp - From a kiln module to a compiled program --------------===//
#include "compiler/Driver.h"

#include "compiler/Package.h"
#include "compiler/Training.h"
#include "compiler/cuda/Assemble.h"
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/Precision.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <algorithm>

namespace kiln {
namespace {

Status userError(std::string message) { return Status::error(std::move(message)); }

/// The layout overrides written into `t` (the kiln.train entries), each
/// checked on its own.
Status applyLayout(mlir::ModuleOp module, const LayoutOptions &o, mlir::NamedAttrList &t) {
  mlir::Builder b(module.getContext());
  if (o.devices) {
    if (*o.devices < 1 || *o.devices > 65536)
      return userError("--devices must be an integer from 1 to 65536");
    t.set("devices", b.getI64IntegerAttr(*o.devices));
  }
  if (o.tp) {
    if (*o.tp < 1 || *o.tp > 65536)
      return userError("--tp must be an integer from 1 to 65536");
    t.set("tp", b.getI64IntegerAttr(*o.tp));
    if (!t.get("devices"))
      t.set("devices", b.getI64IntegerAttr(*o.tp));
  }
  if (o.pp) {
    int64_t pp = *o.pp;
    if (pp < 1 || pp > 64)
      return userError("--pp must be an integer from 1 to 64");
    auto placed = module->getAttrOfType<mlir::IntegerAttr>("kiln.stages_placed");
    // The train section's interleaved schedule: the blocks name pp x V
    // model chunks. (--pipeline 1f1b or gpipe over an interleaved train
    // section: one stage per block.)
    int64_t V = o.pipeline && *o.pipeline != "interleaved" ? 1 : virtualStages(module);
    if (placed && pp > 1 && pp * V < placed.getInt())
      return userError("--pp " + std::to_string(pp) + " is fewer than the " +
                       std::to_string(placed.getInt()) +
                       (V > 1 ? " model chunks (" + std::to_string(V) + " per device)"
                              : std::string(" stages")) +
                       " the model's `stage N { ... }` blocks name (--pp 1 "
                       "compiles the model for one stage, ignoring them)");
    if (placed && pp == 1) {
      // One stage: the model's placement is set aside (to compare a placed
      // model with one device, or to run it on fewer devices).
      module->removeAttr("kiln.stages_placed");
      module->walk([](mlir::Operation *op) { op->removeAttr(kStageAttr); });
    }
    t.set("pp", b.getI64IntegerAttr(pp));
    if (!o.devices)
      t.set("devices", b.getI64IntegerAttr(pp * std::max<int64_t>(1, o.tp.value_or(0))));
  }
  if (o.microBatches) {
    if (*o.microBatches < 1 || *o.microBatches > 4096)
      return userError("--micro-batches must be an integer from 1 to 4096");
    t.set("micro_batches", b.getI64IntegerAttr(*o.microBatches));
    t.set("grad_accum", b.getI64IntegerAttr(*o.microBatches));
  }
  if (o.pipeline) {
    const std::string &sched = *o.pipeline;
    if (sched != "1f1b" && sched != "gpipe" && sched != "interleaved")
      return userError("--pipeline=" + sched + ": use 1f1b, gpipe or interleaved");
    t.set("pipeline", b.getStringAttr(sched));
    auto placed = module->getAttrOfType<mlir::IntegerAttr>("kiln.stages_placed");
    if (sched != "interleaved" && virtualStages(module) > 1 && placed && !o.pp) {
      // The train section's interleaved schedule numbered model chunks;
      // another schedule runs each named chunk as a stage of its own (as
      // the same stage blocks under pipeline = "1f1b" would).
      auto get = [&](llvm::StringRef k) {
        auto a = t.get(k);
        return a ? mlir::cast<mlir::IntegerAttr>(a).getInt() : int64_t(1);
      };
      int64_t oldPp = std::max<int64_t>(1, get("pp"));
      int64_t stages = placed.getInt();
      t.set("pp", b.getI64IntegerAttr(stages));
      if (!o.devices)
        t.set("devices",
              b.getI64IntegerAttr(std::max<int64_t>(1, get("devices")) / oldPp * stages));
    }
    if (sched != "interleaved")
      t.erase("virtual_stages");
  }
  if (o.virtualStages) {
    if (*o.virtualStages < 1 || *o.virtualStages > 64)
      return userError("--virtual-stages must be an integer from 1 to 64");
    auto sched = t.get("pipeline");
    if (!sched || mlir::cast<mlir::StringAttr>(sched).getValue() != "interleaved")
      return userError("--virtual-stages is the interleaved schedule's model chunks per "
                       "device; add --pipeline interleaved");
    t.set("virtual_stages", b.getI64IntegerAttr(*o.virtualStages));
  }
  if (o.zero) {
    if (*o.zero < 0 || *o.zero > 2)
      return userError("--zero must be 0, 1 or 2");
    t.set("zero", b.getI64IntegerAttr(*o.zero));
  }
  if (o.bucketMb) {
    if (!(*o.bucketMb > 0))
      return userError("--bucket-mb must be > 0");
    t.set("bucket_mb", b.getF64FloatAttr(*o.bucketMb));
  }
  if (o.firstBucketMb) {
    if (!(*o.firstBucketMb > 0))
      return userError("--first-bucket-mb must be > 0");
    t.set("first_bucket_mb", b.getF64FloatAttr(*o.firstBucketMb));
  }
  if (o.gradReduce) {
    if (*o.gradReduce != "fp32" && *o.gradReduce != "bf16")
      return userError("--grad-reduce must be fp32 or bf16, got '" + *o.gradReduce + "'");
    t.set("grad_reduce", b.getStringAttr(*o.gradReduce));
  }
  if (o.deterministic) {
    if (*o.deterministic != "none" && *o.deterministic != "devices")
      return userError("--deterministic must be none or devices, got '" + *o.deterministic +
                       "'");
    t.set("deterministic", b.getStringAttr(*o.deterministic));
  }
  if (o.separateScalarReductions)
    t.set("scalar_reduce", b.getStringAttr("separate"));
  if (o.deterministicChunks) {
    int64_t c = *o.deterministicChunks;
    if (c < 1 || c > 4096 || (c & (c - 1)) != 0)
      return userError("--deterministic-chunks must be a power of two from 1 to 4096");
    t.set("deterministic_chunks", b.getI64IntegerAttr(c));
  }
  return Status::ok();
}

/// The layout rules over the devices, pp, tp and zero entries of `t`.
Status checkLayout(const mlir::NamedAttrList &t) {
  auto get = [&](llvm::StringRef k) {
    auto a = t.get(k);
    return a ? mlir::cast<mlir::IntegerAttr>(a).getInt() : int64_t(0);
  };
  int64_t n = std::max<int64_t>(1, get("devices"));
  int64_t tp = std::max<int64_t>(1, get("tp"));
  int64_t pp = std::max<int64_t>(1, get("pp"));
  if (!train_rules::tpDividesDevices(n, tp))
    return userError("--tp " + std::to_string(tp) + " must divide the device count " +
                     std::to_string(n) + " (--devices counts all devices: dp = devices / tp)");
  if (!train_rules::ppTpDivideDevices(n, pp, tp))
    return userError("--devices " + std::to_string(n) + " is not a multiple of pp x tp = " +
                     std::to_string(pp) + " x " + std::to_string(tp) +
                     " (--devices counts all devices: dp = devices / (pp x tp))");
  if (!train_rules::zeroHasReplicas(get("zero"), n, pp, tp))
    return userError("--zero " + std::to_string(get("zero")) +
                     " shards optimizer state over data-parallel devices; it needs "
                     "--devices N (or devices = N in the train section) with N > 1" +
                     std::string(tp * pp > 1 ? " data-parallel replicas (N / (pp x tp) > 1)"
                                             : ""));
  return Status::ok();
}

/// The precision overrides written into `t`.
Status applyPrecision(mlir::ModuleOp module, const CompileOptions &o, mlir::NamedAttrList &t) {
  mlir::MLIRContext *context = module.getContext();
  mlir::Builder b(context);
  if (o.precision) {
    const std::string &p = *o.precision;
    if (!train_rules::isPrecision(p))
      return userError("--precision=" + p + ": use fp32, tf32, bf16 or fp16");
    t.set("precision", b.getStringAttr(p));
    // The model's loss scale may be too large for fp16 (docs/training.md
    // "The largest initial scale"); the frontend checked it against the
    // train section's precision only.
    if (auto ls = t.getDictionary(context).getAs<mlir::DictionaryAttr>("loss_scale"))
      if (auto init = ls.getAs<mlir::FloatAttr>("init")) {
        std::string why = lossScaleInitError(p, init.getValueAsDouble());
        if (!why.empty()) {
          auto line = ls.getAs<mlir::IntegerAttr>("line");
          auto col = ls.getAs<mlir::IntegerAttr>("col");
          std::string where = o.modelPath;
          if (line && col)
            where += ":" + std::to_string(line.getInt()) + ":" + std::to_string(col.getInt());
          return userError(where + ": the train section's loss_scale with --precision fp16: " +
                           why);
        }
      }
  }
  if (o.precisionMode) {
    if (!train_rules::isPrecisionMode(*o.precisionMode))
      return userError("--precision-mode=" + *o.precisionMode + ": use kiln or autocast");
    t.set("precision_mode", b.getStringAttr(*o.precisionMode));
  }
  return Status::ok();
}

/// One diagnostic and its notes as DiagnosticText renders them.
std::string renderDiagnostic(mlir::Diagnostic &d, const frontend::SourceFile &source) {
  mlir::FileLineColLoc at;
  d.getLocation()->walk([&](mlir::Location l) {
    if (auto f = mlir::dyn_cast<mlir::FileLineColLoc>(l)) {
      at = f;
      return mlir::WalkResult::interrupt();
    }
    return mlir::WalkResult::advance();
  });
  std::string message;
  llvm::raw_string_ostream os(message);
  os << d;
  bool note = d.getSeverity() == mlir::DiagnosticSeverity::Note;
  bool warning = d.getSeverity() == mlir::DiagnosticSeverity::Warning;
  std::string out;
  if (at && at.getFilename().getValue() == source.name() && at.getLine() > 0) {
    frontend::DiagEngine one(source);
    frontend::SourceLoc loc{at.getLine(), std::max(1u, at.getColumn()), 1};
    if (note)
      one.note(loc, message);
    else if (warning)
      one.warning(loc, message);
    else
      one.error(loc, message);
    out = one.render();
  } else {
    std::string where = at ? (at.getFilename().getValue() + ":" + llvm::Twine(at.getLine()) +
                              ":" + llvm::Twine(at.getColumn()))
                                 .str()
                           : std::string("kilnc");
    out = where + (note ? ": note: " : warning ? ": warning: " : ": error: ") + message + "\n";
  }
  for (mlir::Diagnostic &n : d.getNotes())
    out += renderDiagnostic(n, source);
  return out;
}

/// A value of the train section's layout (1 where it names none).
int64_t trainLayout(mlir::ModuleOp module, llvm::StringRef key) {
  return TrainSettings(module).integer(key, 1);
}

mlir::NamedAttrList trainEntries(mlir::ModuleOp module) {
  auto train = module->getAttrOfType<mlir::DictionaryAttr>(KilnDialect::kTrainAttr);
  return mlir::NamedAttrList(train ? train.getValue()
                                   : llvm::ArrayRef<mlir::NamedAttribute>{});
}

} // namespace

DiagnosticText::DiagnosticText(mlir::MLIRContext &context, const frontend::SourceFile &source)
    : mlir::ScopedDiagnosticHandler(&context, [this, &source](mlir::Diagnostic &d) {
        text += renderDiagnostic(d, source);
        return mlir::success();
      }) {
  context.printOpOnDiagnostic(false);
}

LoadResult load(mlir::MLIRContext &context, const frontend::SourceFile &source,
                const frontend::FrontendOptions &options) {
  LoadResult r;
  if (llvm::StringRef(source.name()).ends_with(".mlir")) {
    llvm::SourceMgr sourceMgr;
    sourceMgr.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(source.text(), source.name()),
                                 llvm::SMLoc());
    llvm::raw_string_ostream os(r.diagnostics);
    mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context, os);
    r.module = mlir::parseSourceFile<mlir::ModuleOp>(sourceMgr, &context);
    if (!r.module || !(r.module->lookupSymbol("forward") || r.module->lookupSymbol("train_step"))) {
      r.module = nullptr;
      r.status = userError("'" + source.name() +
                           "' is not a kiln module with func.func @forward or @train_step");
    }
    return r;
  }
  frontend::DiagEngine diags(source);
  r.module = frontend::buildModule(context, source, options, diags);
  if (!diags.diagnostics().empty())
    r.diagnostics = diags.render();
  if (!r.module)
    r.status = diags.hasErrors() ? userError("")
                                 : Status::internal("no module and no diagnostic for '" +
                                                    source.name() + "'");
  return r;
}

Status configure(mlir::ModuleOp module, const CompileOptions &options) {
  mlir::MLIRContext *context = module.getContext();
  // Data-parallel settings (docs/parallel.md).
  if (options.layout.any()) {
    mlir::NamedAttrList t = trainEntries(module);
    if (Status s = applyLayout(module, options.layout, t); !s)
      return s;
    if (Status s = checkLayout(t); !s)
      return s;
    auto get = [&](llvm::StringRef k) {
      auto a = t.get(k);
      return std::max<int64_t>(1, a ? mlir::cast<mlir::IntegerAttr>(a).getInt() : 0);
    };
    module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(context));
    setMesh(module, meshFor(get("devices"), get("tp"), get("pp")));
  }
  // Mixed precision: kiln-mixed-precision reads it.
  if (options.precision || options.precisionMode) {
    mlir::NamedAttrList t = trainEntries(module);
    if (Status s = applyPrecision(module, options, t); !s)
      return s;
    module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(context));
  }
  // Fused attention: kiln-raise-attention reads it.
  if (options.attention) {
    if (!train_rules::isAttentionMode(*options.attention))
      return userError("--attention=" + *options.attention + ": use auto, fused or unfused");
    mlir::NamedAttrList t = trainEntries(module);
    t.set("attention", mlir::StringAttr::get(context, *options.attention));
    module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(context));
  }
  if (mlir::failed(mlir::verify(module)))
    return Status::internal("the frontend built invalid IR for '" + options.modelPath +
                            "'; please report this with the model file.");
  return Status::ok();
}

Expected<std::optional<Chunking>> deterministicChunking(mlir::ModuleOp module) {
  TrainSettings train(module);
  if (!train.deterministicDevices())
    return std::optional<Chunking>();
  auto integer = [&](llvm::StringRef k, int64_t def) { return train.integer(k, def); };
  const char *what = "deterministic = \"devices\"";
  MeshShape mesh = getMesh(module);
  if (mesh.axisSize("tp") > 1 || mesh.axisSize("pp") > 1)
    return userError(std::string(what) +
                     " covers data parallelism only: tensor and pipeline parallelism "
                     "(tp, pp) add partial sums in their own order. Drop tp/pp, or drop "
                     "deterministic");
  if (integer("zero", 0) == 2)
    return userError(std::string(what) +
                     " with zero = 2: each device would hold only its block of the gradient, "
                     "and the gradient norm would be summed over devices in their order. Use "
                     "zero = 1 (the same memory for optimizer state) or zero = 0");
  if (train.string("grad_reduce") == "bf16")
    return userError(std::string(what) +
                     " with grad_reduce = bf16: the tree adds float32 partial sums only; "
                     "use grad_reduce = fp32");
  int64_t n = std::max<int64_t>(1, mesh.axisSize("dp")), k = integer("grad_accum", 1);
  int64_t c = integer("deterministic_chunks", 8);
  auto pow2 = [](int64_t v) { return v >= 1 && (v & (v - 1)) == 0; };
  if (!pow2(n))
    return userError(std::string(what) + " needs a power-of-two count of data-parallel " +
                     "devices (1, 2, 4, 8, ...), not " + std::to_string(n) +
                     ": the devices' sums must be subtrees of one pairwise tree");
  if (!pow2(k))
    return userError(std::string(what) + " needs grad_accum to be a power of two, not " +
                     std::to_string(k));
  if (!pow2(c) || c % (n * k) != 0)
    return userError(
        std::string(what) + ": deterministic_chunks = " + std::to_string(c) +
        " does not divide over " + std::to_string(n) + " device" + (n == 1 ? "" : "s") +
        " x grad_accum " + std::to_string(k) + " = " + std::to_string(n * k) +
        " micro-batches (each compiled micro-step takes one chunk). Set "
        "deterministic_chunks (or --deterministic-chunks) to a power of two that is a "
        "multiple of the largest devices x grad_accum you compare, the same in every run");
  auto fwd = module.lookupSymbol<mlir::func::FuncOp>("forward");
  int64_t batch = 0;
  if (fwd)
    for (unsigned i = 0; i < fwd.getNumArguments() && !batch; ++i) {
      auto in = fwd.getArgAttrOfType<mlir::StringAttr>(i, KilnDialect::kInputAttr);
      auto t = mlir::dyn_cast<mlir::RankedTensorType>(fwd.getArgument(i).getType());
      if (in && in.getValue() != "dropout_seed" && t && t.getRank() > 0)
        batch = t.getDimSize(0);
    }
  if (batch <= 0)
    return userError(std::string(what) + " needs @forward with a batched data input (a "
                                         "leading batch dimension to cut into chunks)");
  int64_t perMicro = c / (n * k); // chunks in one of the model's micro-batches
  if (batch % perMicro != 0) {
    // The most chunks this global batch takes: a power of two dividing it.
    int64_t g = n * k * batch, most = 1;
    while (g % (most * 2) == 0 && most * 2 <= 4096)
      most *= 2;
    return userError(
        std::string(what) + ": the per-device batch " + std::to_string(batch) +
        " cannot be cut into the " + std::to_string(perMicro) + " chunks of each micro-batch (" +
        std::to_string(c) + " chunks over " + std::to_string(n) + " x " + std::to_string(k) +
        " micro-batches); make the global batch " + std::to_string(g) + " a multiple of " +
        std::to_string(c) + ", or set deterministic_chunks to at most " + std::to_string(most) +
        " (the same in every run compared)");
  }
  Chunking out;
  out.chunks = c;
  out.rows = batch / perMicro;
  out.microSteps = c / n;
  out.modelBatch = batch;
  out.gradAccum = k;
  return std::optional<Chunking>(out);
}

LoadResult loadConfigured(mlir::MLIRContext &context, const frontend::SourceFile &source,
                          frontend::FrontendOptions frontendOptions,
                          const CompileOptions &options) {
  LoadResult r = load(context, source, frontendOptions);
  if (!r)
    return r;
  if (Status s = configure(*r.module, options); !s) {
    r.status = s;
    r.module = nullptr;
    return r;
  }
  auto chunking = deterministicChunking(*r.module);
  if (!chunking) {
    r.status = chunking.status();
    r.module = nullptr;
    return r;
  }
  if (!*chunking)
    return r;
  Chunking c = **chunking;
  if (c.rows != c.modelBatch) {
    if (llvm::StringRef(source.name()).ends_with(".mlir")) {
      r.status = userError("deterministic = \"devices\" cuts each micro-batch of " +
                           std::to_string(c.modelBatch) + " rows into chunks of " +
                           std::to_string(c.rows) + ", which needs the model file; build " +
                           "this .mlir module at batch " + std::to_string(c.rows) +
                           " with grad_accum " + std::to_string(c.microSteps));
      r.module = nullptr;
      return r;
    }
    // The model again, at one chunk's rows (warnings were shown once).
    frontendOptions.batch = c.rows;
    LoadResult again = load(context, source, frontendOptions);
    if (!again)
      return again;
    again.diagnostics = r.diagnostics;
    r = std::move(again);
    if (Status s = configure(*r.module, options); !s) {
      r.status = s;
      r.module = nullptr;
      return r;
    }
  }
  mlir::Builder b(&context);
  mlir::NamedAttrList t = trainEntries(*r.module);
  t.set("grad_accum", b.getI64IntegerAttr(c.microSteps));
  t.erase("micro_batches"); // the pipeline's name for grad_accum (no pipeline here)
  t.set("deterministic_chunks", b.getI64IntegerAttr(c.chunks));
  (*r.module)->setAttr(KilnDialect::kTrainAttr, t.getDictionary(&context));
  return r;
}

void setLayout(mlir::ModuleOp module, int64_t devices, int64_t tp, int zero, int64_t pp,
               int64_t microBatches, int64_t virtualStages) {
  mlir::Builder b(module.getContext());
  mlir::NamedAttrList t = trainEntries(module);
  t.set("devices", b.getI64IntegerAttr(devices));
  t.set("tp", b.getI64IntegerAttr(tp));
  t.set("zero", b.getI64IntegerAttr(zero));
  if (pp > 1) {
    t.set("pp", b.getI64IntegerAttr(pp));
    t.set("micro_batches", b.getI64IntegerAttr(microBatches));
    t.set("grad_accum", b.getI64IntegerAttr(microBatches));
    if (virtualStages > 1) {
      t.set("pipeline", b.getStringAttr("interleaved"));
      t.set("virtual_stages", b.getI64IntegerAttr(virtualStages));
    } else {
      t.erase("pipeline");
      t.erase("virtual_stages");
    }
  } else {
    t.erase("pp");
    t.erase("pipeline");
    t.erase("virtual_stages");
  }
  module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(module.getContext()));
  setMesh(module, meshFor(devices, tp, pp));
}

Status parseTarget(const std::string &target, bool &cuda) {
  cuda = false;
  llvm::SmallVector<llvm::StringRef> ts;
  llvm::StringRef(target).split(ts, ',');
  for (llvm::StringRef t : ts) {
    if (t == "cuda")
      cuda = true;
    else if (t != "cpu")
      return userError("--target=" + target + ": unknown target '" + t.str() +
                       "' (use cpu, cuda or cpu,cuda)");
  }
  return Status::ok();
}

uint64_t initSeed(mlir::ModuleOp module, std::optional<uint64_t> seed) {
  if (seed)
    return *seed;
  return uint64_t(TrainSettings(module).integer("seed", 0));
}

Outcome buildTraining(mlir::ModuleOp module, const CompileOptions &options, bool gradOnly) {
  if (mlir::succeeded(buildTrainProgram(module, gradOnly, options.printIRAfterAll)))
    return {};
  return {userError("cannot build the training program for '" + options.modelPath + "'"), true};
}

Outcome precisionReport(mlir::ModuleOp module, const CompileOptions &options,
                        PrecisionReport &report) {
  // The same model in fp32, for the activation memory it would need.
  mlir::OwningOpRef<mlir::ModuleOp> fp32 = module.clone();
  std::string why;
  bool haveFp32 = makeFp32Variant(*fp32, why);
  auto build = [&](mlir::ModuleOp m) {
    return m.lookupSymbol("train_step") ? Outcome{} : buildTraining(m, options);
  };
  if (Outcome o = build(module); !o)
    return o;
  report = collectPrecisionReport(module);
  if (report.precision == "fp32")
    return {};
  std::string err;
  report.activationBytes =
      trainStepActivationBytes(module, options.fusion, &report.activationBytesByType, err);
  if (report.activationBytes < 0 && module.lookupSymbol("train_step"))
    return {userError(err)};
  if (!haveFp32) {
    report.fp32Note = why;
    return {};
  }
  if (Outcome o = build(*fp32); !o)
    return o;
  report.fp32ActivationBytes = trainStepActivationBytes(*fp32, options.fusion, nullptr, err);
  if (report.fp32ActivationBytes < 0)
    report.fp32Note = err;
  return {};
}

Status prepareGradCheck(mlir::ModuleOp module) {
  // Tensor and pipeline parallelism change the gradients (sharded
  // parameters, stages): those layouts are checked against one device by
  // training instead.
  int64_t tp = trainLayout(module, "tp"), pp = trainLayout(module, "pp");
  if (tp > 1 || pp > 1)
    return userError(
        "--gradcheck checks the model's gradients on one device, not a tensor- or "
        "pipeline-parallel layout (tp = " +
        std::to_string(tp) + ", pp = " + std::to_string(pp) +
        "); add --tp 1 --pp 1 to check the model, and compare the layout's training "
        "with one device's (docs/parallel.md)");
  // The check runs the whole program, gradients too, in float64.
  convertToF64(module.lookupSymbol<mlir::func::FuncOp>("forward"));
  return Status::ok();
}

void prepareReference(mlir::ModuleOp module, const CompileOptions &options) {
  auto layout = [&](llvm::StringRef k) { return std::max<int64_t>(trainLayout(module, k), 1); };
  int64_t dp = layout("devices") / (layout("tp") * layout("pp"));
  std::string setAside = setOneDeviceLayout(module);
  if (setAside.empty() || !options.note)
    return;
  options.note("note: --export-reference writes the one-device reference of the model (" +
               setAside + " set aside" +
               (dp > 1 ? "; it trains one device's batch, and a data-parallel run's global "
                         "batch is the " +
                             std::to_string(dp) +
                             " replicas' batches together: add --batch with the global batch "
                             "to compare with it"
                       : std::string()) +
               ")");
}

CompileResult compile(mlir::ModuleOp module, const CompileOptions &options) {
  CompileResult r;
  // The CUDA back end has no attention kernel yet: its programs keep
  // attention unfused, and asking for it fused is an error.
  if (options.cuda && !module.lookupSymbol("train_step")) {
    mlir::MLIRContext *context = module.getContext();
    mlir::NamedAttrList t = trainEntries(module);
    auto mode = mlir::dyn_cast_or_null<mlir::StringAttr>(t.get("attention"));
    if (mode && mode.getValue() == "fused") {
      r.status = userError("attention = fused: the CUDA back end has no fused attention "
                           "kernel yet; compile for CUDA with --attention=unfused");
      return r;
    }
    t.set("attention", mlir::StringAttr::get(context, "unfused"));
    module->setAttr(KilnDialect::kTrainAttr, t.getDictionary(context));
  }
  if (!module.lookupSymbol("train_step"))
    if (Outcome o = buildTraining(module, options); !o) {
      static_cast<Outcome &>(r) = o;
      return r;
    }
  CodegenOptions co;
  co.emitLLVM = options.output != CompileOutput::Program;
  co.keepLLVMText = options.output == CompileOutput::LLVM;
  co.fusion = options.fusion;
  co.printKernelIRAfterAll = options.printKernelIRAfterAll;
  co.printIRAfterAll = options.printIRAfterAll;
  std::string err;
  auto compiled = compileProgram(module, co, err);
  if (mlir::failed(compiled)) {
    r.status = userError(err);
    return r;
  }
  r.compiled = std::move(*compiled);
  if (options.cuda) {
    auto c = emitCuda(*r.compiled->neutralKernels, r.compiled->program, err, options.cudaEmit);
    if (mlir::failed(c)) {
      r.status = Status::internal("CUDA code generation: " + err);
      return r;
    }
    r.cuda = std::move(*c);
  }
  if (options.output != CompileOutput::Package)
    return r;
  PackageInputs in;
  in.sourcePath = options.modelPath;
  in.sourceText = options.sourceText;
  in.target = options.target;
  in.seed = initSeed(module, options.seed);
  in.omitZeroInitializers = options.omitZeroInitializers;
  if (r.cuda) {
    CudaAssembleOptions ao;
    ao.archs = options.cudaArchs;
    ao.maxRegisters = options.cudaMaxRegisters;
    auto noop = [](const std::string &) {};
    auto assembled = assembleCuda(*r.cuda, r.compiled->program.kernels.size(), ao,
                                  options.note ? options.note : noop);
    if (!assembled) {
      r.status = Status::internal(assembled.status().message());
      return r;
    }
    in.extraSections = std::move(assembled->sections);
    in.cudaManifest = std::move(assembled->manifest);
  }
  auto sections = buildPackage(module, *r.compiled, in);
  if (!sections) {
    r.status = sections.status();
    return r;
  }
  r.package = std::move(*sections);
  return r;
}

} // namespace kiln
