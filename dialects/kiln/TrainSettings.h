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

} // namespace kiln

#endif // KILN_DIALECTS_KILN_TRAINSETTINGS_H
