//===- TrainSettings.h - The train section, read one way --------*- C++ -*-===//
//
// The module's `kiln.train` dictionary (the .kiln train section with
// kilnc's flags applied: docs/language.md, docs/parallel.md) read through
// one accessor, so that every pass and compiler step reads a setting the
// same way: a number is a float or an integer, a missing key (or module
// without a train section) is the caller's default, and the settings that
// several places read (grad_accum, zero, precision, pipeline, virtual
// stages, deterministic) have one typed reader each.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_DIALECTS_KILN_TRAINSETTINGS_H
#define KILN_DIALECTS_KILN_TRAINSETTINGS_H

#include "dialects/kiln/KilnDialect.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace kiln {

class TrainSettings {
public:
  explicit TrainSettings(mlir::DictionaryAttr dict) : dict_(dict) {}
  /// `module`'s train section (none: every read gives its default).
  explicit TrainSettings(mlir::ModuleOp module)
      : dict_(module ? module->getAttrOfType<mlir::DictionaryAttr>(KilnDialect::kTrainAttr)
                     : mlir::DictionaryAttr()) {}

  explicit operator bool() const { return bool(dict_); }
  mlir::DictionaryAttr dictionary() const { return dict_; }
  bool has(llvm::StringRef key) const { return dict_ && dict_.get(key); }

  /// An integer setting, or `def`.
  int64_t integer(llvm::StringRef key, int64_t def) const {
    auto a = dict_ ? dict_.getAs<mlir::IntegerAttr>(key) : nullptr;
    return a ? a.getInt() : def;
  }
  /// A number (float or integer), or `def`.
  double number(llvm::StringRef key, double def) const {
    if (!dict_)
      return def;
    if (auto f = dict_.getAs<mlir::FloatAttr>(key))
      return f.getValueAsDouble();
    if (auto i = dict_.getAs<mlir::IntegerAttr>(key))
      return double(i.getInt());
    return def;
  }
  /// A string setting, or `def`.
  std::string string(llvm::StringRef key, llvm::StringRef def = "") const {
    auto a = dict_ ? dict_.getAs<mlir::StringAttr>(key) : nullptr;
    return (a ? a.getValue() : def).str();
  }
  /// A boolean setting, or `def`.
  bool boolean(llvm::StringRef key, bool def) const {
    auto a = dict_ ? dict_.getAs<mlir::BoolAttr>(key) : nullptr;
    return a ? a.getValue() : def;
  }
  /// A nested section (optimizer, schedule, loss_scale), or null.
  mlir::DictionaryAttr section(llvm::StringRef key) const {
    return dict_ ? dict_.getAs<mlir::DictionaryAttr>(key) : nullptr;
  }

  /// Micro-batches per step (grad_accum; at least 1).
  int64_t gradAccum() const { return std::max<int64_t>(1, integer("grad_accum", 1)); }
  /// The ZeRO stage (0 without one).
  int64_t zero() const { return integer("zero", 0); }
  /// "fp32" (or empty: none given), "tf32", "bf16", "fp16".
  std::string precision() const { return string("precision"); }
  /// The pipeline schedule: "1f1b" where none is given, "gpipe", "interleaved".
  std::string pipeline() const { return string("pipeline", "1f1b"); }
  /// Model chunks per device: the interleaved schedule's virtual_stages
  /// (2 when not given), else 1.
  int64_t virtualStages() const {
    if (string("pipeline") != "interleaved")
      return 1;
    return std::max<int64_t>(1, integer("virtual_stages", 2));
  }
  /// deterministic = "devices": bits that do not depend on the device count.
  bool deterministicDevices() const { return string("deterministic") == "devices"; }

private:
  mlir::DictionaryAttr dict_;
};

/// The rules of a train configuration, each written once. The frontend
/// (frontend/elaborate/Train.cpp, Elaborate.cpp: at the setting's line),
/// kilnc's layout flags (compiler/Driver.cpp: in the flags' words) and the
/// dialect's verifier of `kiln.train` (verifyTrainSettings: every rule, on
/// every module, the planner's layouts included) all ask these.
namespace train_rules {
/// precision = fp32 | tf32 | bf16 | fp16.
inline bool isPrecision(llvm::StringRef p) {
  return p == "fp32" || p == "tf32" || p == "bf16" || p == "fp16";
}
/// precision_mode = kiln | autocast.
inline bool isPrecisionMode(llvm::StringRef m) { return m == "kiln" || m == "autocast"; }
/// attention = auto | fused | unfused (kiln-raise-attention; default auto).
inline bool isAttentionMode(llvm::StringRef m) {
  return m == "auto" || m == "fused" || m == "unfused";
}
/// pipeline = 1f1b | gpipe | interleaved.
inline bool isPipeline(llvm::StringRef p) {
  return p == "1f1b" || p == "gpipe" || p == "interleaved";
}
/// tp divides the device count (devices / tp replicas train data-parallel).
inline bool tpDividesDevices(int64_t devices, int64_t tp) { return tp >= 1 && devices % tp == 0; }
/// The devices are pp x tp x dp (pp x tp divides them).
inline bool ppTpDivideDevices(int64_t devices, int64_t pp, int64_t tp) {
  return pp >= 1 && tp >= 1 && devices % (pp * tp) == 0;
}
/// ZeRO shards over data-parallel replicas: with zero > 0 there are several.
inline bool zeroHasReplicas(int64_t zero, int64_t devices, int64_t pp, int64_t tp) {
  return zero <= 0 || devices / (pp * tp) > 1;
}
/// virtual_stages belongs to the interleaved schedule.
inline bool virtualStagesFitSchedule(bool virtualStagesGiven, llvm::StringRef pipeline) {
  return !virtualStagesGiven || pipeline == "interleaved";
}
} // namespace train_rules

/// Every rule of train_rules on a `kiln.train` dictionary (the dialect's
/// verifier calls it); the first broken one is reported through `emitError`
/// in the train section's words. Without a `devices` setting the device
/// count is `meshDevices` (the module's kiln.mesh; 0: none, then pp x tp).
mlir::LogicalResult verifyTrainSettings(mlir::DictionaryAttr train, int64_t meshDevices,
                                        llvm::function_ref<mlir::InFlightDiagnostic()> emitError);

} // namespace kiln

#endif // KILN_DIALECTS_KILN_TRAINSETTINGS_H
