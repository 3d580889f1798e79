//===- Elaborator.h - The elaborator's shared state (private) ---*- C++ -*-===//
//
// The elaborator walks the syntax tree like an interpreter: model parameters
// and scalar arithmetic are evaluated, `def` blocks are inlined at each call,
// `repeat` bodies are unrolled, and every tensor expression becomes kiln ops.
// Shapes are checked before any op is built, with messages that name the
// dimensions (`[B=12, ctx=64, 384]`), so the builder never sees invalid IR.
//
// Errors stop elaboration: `fail()` records the diagnostic and throws
// `Abort`, which never leaves the elaborator (elaborate() catches it). No
// MLIR or LLVM frame is ever unwound through: the throw sites are all in
// frontend/elaborate/.
//
// The class is one; its members are defined by concern:
//   Values.cpp    values, scalars, shapes with dimension names, arguments
//   Eval.cpp      expressions, calls and statements
//   Builtins.cpp  tensor builtins (elementwise, reductions, matmul, ...)
//   Layers.cpp    the layer library (linear, embedding, attention, mlp, ...)
//   Train.cpp     the train section (optimizer, schedule, settings)
//   frontend/Elaborate.cpp  the driver: elaborate() and buildModule()
//
// Only frontend/ includes this header.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_FRONTEND_ELABORATE_ELABORATOR_H
#define KILN_FRONTEND_ELABORATE_ELABORATOR_H

#include "frontend/Frontend.h"

#include "dialects/kiln/ElementTypes.h"
#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/StringRef.h"

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::frontend::elab {

using namespace mlir;

struct Abort {};

/// Element types: the one enum the compiler and runtime share
/// (runtime/core/ElementType.h).
using DType = ElementType;

/// The element type a .kiln file names: f64, f32, f16, bf16, i64, i32, i1,
/// or bool (i1).
inline std::optional<DType> parseTypeName(llvm::StringRef s) {
  if (s == "bool")
    return DType::I1;
  return parseElementType(std::string_view(s.data(), s.size()));
}

/// One dimension: its size and, when it came from a named quantity, the name.
struct Dim {
  int64_t size = 0;
  std::string name;
  bool operator==(const Dim &o) const { return size == o.size; }
};
using Shape = std::vector<Dim>;

/// `[B=12, ctx=64, 384]`.
std::string str(const Shape &s);
/// A number as `%g` prints it.
std::string fmtDouble(double v);

/// A value during elaboration.
struct Val {
  enum class Kind { Tensor, Int, Float, Bool, Str, List, Func, Init, Type };
  Kind kind = Kind::Int;
  SourceLoc loc;
  // Tensor
  mlir::Value value;
  Shape shape;
  DType dtype = DType::F32;
  // Scalars
  int64_t i = 0;
  double f = 0;
  bool b = false;
  /// Str: the text. Func: the function name. Init: the kind. Int: the name it
  /// was bound to (so dims built from it carry the name).
  std::string s;
  std::vector<Val> items; ///< List and tuple elements.
  double p0 = 0, p1 = 0;  ///< Init parameters (mean/std or low/high).

  bool isTensor() const { return kind == Kind::Tensor; }
  bool isNumber() const { return kind == Kind::Int || kind == Kind::Float; }
  double num() const { return kind == Kind::Int ? double(i) : f; }
};

/// "a tensor", "an integer", ...
const char *kindName(const Val &v);
/// `f32 tensor [B=12, 64]`, or the kind of a non-tensor.
std::string describe(const Val &v);

struct Env {
  std::unordered_map<std::string, Val> vars;
  Env *parent = nullptr;
  const Val *lookup(const std::string &name) const {
    for (const Env *e = this; e; e = e->parent) {
      auto it = e->vars.find(name);
      if (it != e->vars.end())
        return &it->second;
    }
    return nullptr;
  }
};

/// Positional/keyword arguments of one call, bound to a parameter list.
struct Args {
  std::string callee;
  SourceLoc callLoc;
  std::vector<std::string> names;
  std::vector<std::optional<Val>> vals;
  bool has(size_t i) const { return vals[i].has_value(); }
};

/// Tags every op built inside a repeat iteration with `kiln.block`, and
/// every op built under a user's fp32 override (`precision = fp32` on a
/// call, `fp32_layers` in the train section) with `kiln.precision.fp32`
/// (its value names the override), which kiln-mixed-precision keeps in fp32.
struct BlockTagger : OpBuilder::Listener {
  std::string tag;
  std::string fp32;
  /// The pipeline stage of the enclosing `stage N { ... }` block, or -1.
  int64_t stage = -1;
  void notifyOperationInserted(Operation *op,
                               OpBuilder::InsertPoint) override {
    if (stage >= 0)
      op->setAttr("kiln.stage", IntegerAttr::get(IntegerType::get(op->getContext(), 64),
                                                 stage));
    if (!tag.empty())
      op->setAttr(KilnDialect::kBlockAttr,
                  StringAttr::get(op->getContext(), tag));
    if (!fp32.empty())
      op->setAttr("kiln.precision.fp32", StringAttr::get(op->getContext(), fp32));
  }
};

class Elaborator {
public:
  Elaborator(MLIRContext &ctx, const SourceFile &file, const FileAST &ast,
             const FrontendOptions &opts, DiagEngine &diags)
      : ctx_(ctx), file_(file), ast_(ast), opts_(opts), diags_(diags),
        b_(&ctx) {
    for (const DefDecl &d : ast.defs)
      defs_[d.name] = &d;
    b_.setListener(&tagger_);
  }

  OwningOpRef<ModuleOp> run();
  /// Warns about each layer call whose parameters never reach a result of
  /// @forward (loss, logits): they would be trained to no effect.
  void warnUnusedLayers();

private:
  MLIRContext &ctx_;
  const SourceFile &file_;
  const FileAST &ast_;
  const FrontendOptions &opts_;
  DiagEngine &diags_;
  OpBuilder b_;
  BlockTagger tagger_;
  /// The highest stage a `stage N { ... }` block named, or -1 (and where).
  int64_t maxStage_ = -1;
  SourceLoc maxStageLoc_;
  /// Where the train section sets `devices` (errors about the device count
  /// point there rather than at the model).
  std::optional<SourceLoc> devicesLoc_;
  OwningOpRef<ModuleOp> module_;
  func::FuncOp func_;
  mlir::Block *entry_ = nullptr;

  std::unordered_map<std::string, const DefDecl *> defs_;
  Env paramEnv_; ///< Model parameters; visible in the model and in defs.
  std::vector<std::string> prefix_;
  std::unordered_map<std::string, int> nameCounts_;
  struct Layer {
    std::string kind;
    Val weight;
    SourceLoc loc;
  };
  std::unordered_map<std::string, Layer> layers_;
  /// The layer call that creates parameters now (set by layerName()), and
  /// for each parameter, in argument order, the call that created it: the
  /// unused-layer warning groups parameters by it.
  struct LayerCall {
    std::string kind, name;
    SourceLoc loc;
  };
  LayerCall currentLayer_;
  std::vector<LayerCall> paramOwners_;
  std::vector<NamedAttrList> paramAttrs_, inputAttrs_;
  std::vector<std::string> inputNames_;
  unsigned numParams_ = 0;
  std::vector<Location> callStack_;
  int callDepth_ = 0;
  int64_t opCount_ = 0;
  int64_t steps_ = 0;
  std::set<std::string> paramNames_;
  std::set<std::string> usedDims_;
  int64_t dropoutSalt_ = 0;
  std::optional<Val> dropoutSeed_;
  // Batch binding.
  std::optional<int64_t> trainBatch_;
  std::string batchDimName_;
  bool leadingDim_ = false;
  NamedAttrList dimBindings_;
  NamedAttrList trainAttrs_;
  /// Where the train section and each of its settings were written: a
  /// NameLoc per setting ("train" for the section), fused into the
  /// module's location.
  SmallVector<Location> trainLocs_;
  // Mixed-precision overrides (docs/language.md "Keeping parts in fp32").
  /// The `precision = fp32` argument of the call being dispatched: bindArgs
  /// and callDef skip it.
  const Expr *precisionArg_ = nullptr;
  /// The train section's fp32_layers patterns, where each was written, and
  /// whether it matched a layer, repeat iteration or def call.
  struct Fp32Pattern {
    std::string glob;
    SourceLoc loc;
    bool used = false;
  };
  std::vector<Fp32Pattern> fp32Layers_;
  /// Every layer and scope name seen (for "did you mean").
  std::vector<std::string> scopeNames_;
  /// Whether `name` (a layer, repeat iteration or def scope) is under an
  /// fp32_layers pattern; if so, ops built from now on are tagged until the
  /// caller restores tagger_.fp32.
  void matchFp32Layers(const std::string &name);
  /// Errors for fp32_layers patterns that matched nothing.
  void checkFp32Layers();

  //===--------------------------------------------------------------------===//
  // Errors and locations (Values.cpp)
  //===--------------------------------------------------------------------===//

  [[noreturn]] void fail(SourceLoc loc, std::string message) {
    diags_.error(loc, std::move(message));
    throw Abort{};
  }

  Location loc(SourceLoc l);
  void countOp(SourceLoc l);

  template <typename OpT, typename... Args>
  mlir::Value create(SourceLoc l, Args &&...args) {
    countOp(l);
    return b_.create<OpT>(loc(l), std::forward<Args>(args)...).getResult();
  }

  //===--------------------------------------------------------------------===//
  // Types and tensors (Values.cpp)
  //===--------------------------------------------------------------------===//

  RankedTensorType tensorType(const Shape &s, DType t, SourceLoc l);
  Val tensor(mlir::Value v, Shape s, DType t, SourceLoc l);
  static Val scalarInt(int64_t v, SourceLoc l, std::string name = {});
  static Val scalarFloat(double v, SourceLoc l);
  Val splat(const Shape &s, DType t, double v, SourceLoc l);
  /// numpy broadcasting of two shapes (right-aligned).
  Shape broadcastShapes(const Shape &a, const Shape &c, SourceLoc l,
                        const std::string &what);
  Val broadcastTo(const Val &t, const Shape &target, SourceLoc l);
  /// A number used as a constant of type t must be representable in t.
  void checkFits(double v, DType t, SourceLoc l);
  Val toTensorLike(const Val &scalar, const Val &like, SourceLoc l);
  Val expectTensor(const Val &v, const std::string &what);
  /// Layers keep f32 parameters, so their inputs must be f32 too.
  void expectF32(const Val &v, const std::string &layer);
  Val expectFloatTensor(const Val &v, const std::string &what);

  //===--------------------------------------------------------------------===//
  // Parameters and inputs (Layers.cpp, Eval.cpp)
  //===--------------------------------------------------------------------===//

  std::string joinPrefix() const;
  /// The unique name of a new layer: `<scope>.<kind>[_n]` or the user's name.
  std::string layerName(const std::string &kind, const Args &args,
                        int nameIdx);
  DictionaryAttr initAttr(const Val &init);
  static Val makeInit(const std::string &kind, double p0, double p1,
                      SourceLoc l);
  Val newParam(const std::string &name, const std::string &layerKind,
               const Shape &shape, const Val &init, SourceLoc l);
  Val newInput(const std::string &name, const Shape &shape, DType t,
               SourceLoc l);

  //===--------------------------------------------------------------------===//
  // Evaluation (Eval.cpp, Values.cpp, Train.cpp, Elaborate.cpp)
  //===--------------------------------------------------------------------===//

  Val eval(const Expr &e, Env &env);
  Val evalBinary(const Expr &e, Env &env);
  Val arith(const std::string &op, const Val &a, const Val &c, SourceLoc l);
  Val scalarArith(const std::string &op, const Val &a, const Val &c,
                  SourceLoc l);
  Val call(const Expr &e, Env &env);
  Val callDef(const DefDecl &def, const Expr &e, Env &env);
  /// Inlines `def` applied to x alone (its other parameters take their
  /// defaults), as mlp() does for a user activation.
  Val callDefOn(const DefDecl &def, const Val &x, SourceLoc l);
  /// Runs a def's body in `local` (its bound parameters) and returns its
  /// value; layers inside are named <scope>.<def>[_n].<layer>.
  Val inlineDef(const DefDecl &def, Env &local, SourceLoc l);
  Args bindArgs(const Expr &e, Env &env,
                std::initializer_list<const char *> params, size_t required);
  void execBlock(const Block &block, Env &env, bool inDef, bool topLevel,
                 std::optional<Val> &ret);
  void assign(const std::string &name, SourceLoc nameLoc, Val v, Env &env,
              bool inDef);
  void declareInput(const Stmt &s, Env &env);
  int64_t dimSize(const Expr &e, Env &env, std::string &name);
  void evalModelParams(const ModelDecl &m);
  void evalTrain();
  std::string suggest(const std::string &name, const Env *env);

  // Argument accessors (Values.cpp).
  const Val &arg(const Args &a, size_t i) { return *a.vals[i]; }
  Val tensorArg(const Args &a, size_t i);
  int64_t intArg(const Args &a, size_t i, std::optional<int64_t> def = {});
  double floatArg(const Args &a, size_t i, double def);
  bool boolArg(const Args &a, size_t i, bool def);
  Val initArg(const Args &a, size_t i, Val def);
  int64_t axisArg(const Args &a, size_t i, int64_t rank, int64_t def);
  int64_t normAxis(int64_t ax, int64_t rank, SourceLoc l);
  std::vector<int64_t> intListArg(const Args &a, size_t i);

  // Builtins. Registration order is the table's insertion order, which
  // suggest() sees: tensor builtins first, then initialisers and layers.
  using Builtin = std::function<Val(const Expr &, Env &)>;
  std::unordered_map<std::string, Builtin> builtins_;
  void registerBuiltins();
  void registerTensorBuiltins(); ///< Builtins.cpp
  void registerLayerBuiltins();  ///< Layers.cpp

  // Tensor building blocks (Builtins.cpp).
  Val unaryTensorFn(const std::string &fn, const Val &x, SourceLoc l);
  Val matmul(const Val &a, const Val &c, bool ta, bool tb, SourceLoc l);
  Val reshape(const Val &x, const Shape &s, SourceLoc l);
  Val transpose(const Val &x, const std::vector<int64_t> &perm, SourceLoc l);
  Val sliceAxis(const Val &x, int64_t axis, int64_t start, int64_t end,
                int64_t step, SourceLoc l);
  /// `x[i, a:b:c, ...]` (an Index expression).
  Val index(const Expr &e, Env &env);
  Val dropout(const Val &x, double p, SourceLoc l);
  Val reduce(const std::string &fn, const Val &x,
             const std::vector<int64_t> &axes, bool keepdims, SourceLoc l);
  Val activation(const Val &fn, const Val &x, SourceLoc l);

  // Layers (Layers.cpp).
  /// Megatron tensor parallelism (docs/parallel.md): how a linear layer's
  /// weight splits over the tp axis when the model is compiled with tp > 1.
  /// Column: the output features (weight dim 0, and the bias); Row: the
  /// input features (weight dim 1); ColumnQkv: a fused q/k/v projection's
  /// output features, each of the three parts split alike (by heads).
  enum class TpSplit { None, Column, Row, ColumnQkv };
  mlir::Attribute tpHint(int64_t dim, int64_t outer);
  Val linear(const Val &x, int64_t out, bool bias, const Val *tied,
             const Val &init, const std::string &name, SourceLoc l,
             TpSplit tp = TpSplit::None);
  Val layerNorm(const Val &x, double eps, bool bias, const std::string &name,
                SourceLoc l);
  Val attention(const Args &a, SourceLoc l);
  Val mlp(const Args &a, SourceLoc l);
};

} // namespace kiln::frontend::elab

#endif // KILN_FRONTEND_ELABORATE_ELABORATOR_H
