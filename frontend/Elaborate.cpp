//===- Elaborate.cpp - Semantic checks and IR building for .kiln ----------===//
//
// The elaborator walks the syntax tree like an interpreter: model parameters
// and scalar arithmetic are evaluated, `def` blocks are inlined at each call,
// `repeat` bodies are unrolled, and every tensor expression becomes kiln ops.
// Shapes are checked before any op is built, with messages that name the
// dimensions (`[B=12, ctx=64, 384]`), so the builder never sees invalid IR.
//
// Errors stop elaboration: `fail()` records the diagnostic and throws
// `Abort`, which never leaves this file (elaborate() catches it). No MLIR or
// LLVM frame is ever unwound through: the throw sites are all in this file.
//
//===----------------------------------------------------------------------===//
#include "frontend/Frontend.h"
#include "frontend/Parser.h"

#include "dialects/kiln/KilnOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/StringRef.h"

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

using namespace mlir;

namespace kiln::frontend {
namespace {

struct Abort {};

enum class DType { F64, F32, F16, BF16, I64, I32, I1 };

const char *dtypeName(DType t) {
  switch (t) {
  case DType::F64: return "f64";
  case DType::F32: return "f32";
  case DType::F16: return "f16";
  case DType::BF16: return "bf16";
  case DType::I64: return "i64";
  case DType::I32: return "i32";
  case DType::I1: return "i1";
  }
  return "?";
}

std::optional<DType> parseDType(llvm::StringRef s) {
  if (s == "f64") return DType::F64;
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "i64") return DType::I64;
  if (s == "i32") return DType::I32;
  if (s == "i1" || s == "bool") return DType::I1;
  return std::nullopt;
}

bool isFloat(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::F16 ||
         t == DType::BF16;
}
bool isInt(DType t) { return t == DType::I64 || t == DType::I32; }

/// One dimension: its size and, when it came from a named quantity, the name.
struct Dim {
  int64_t size = 0;
  std::string name;
  bool operator==(const Dim &o) const { return size == o.size; }
};
using Shape = std::vector<Dim>;

std::string str(const Shape &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      out += ", ";
    if (!s[i].name.empty())
      out += s[i].name + "=";
    out += std::to_string(s[i].size);
  }
  return out + "]";
}

std::string fmtDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

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

const char *kindName(const Val &v) {
  switch (v.kind) {
  case Val::Kind::Tensor: return "a tensor";
  case Val::Kind::Int: return "an integer";
  case Val::Kind::Float: return "a number";
  case Val::Kind::Bool: return "a boolean";
  case Val::Kind::Str: return "a string";
  case Val::Kind::List: return "a list";
  case Val::Kind::Func: return "a function";
  case Val::Kind::Init: return "an initialiser";
  case Val::Kind::Type: return "an element type";
  }
  return "a value";
}

std::string describe(const Val &v) {
  if (v.isTensor())
    return std::string(dtypeName(v.dtype)) + " tensor " + str(v.shape);
  return kindName(v);
}

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

/// Tags every op built inside a repeat iteration with `kiln.block`.
struct BlockTagger : OpBuilder::Listener {
  std::string tag;
  void notifyOperationInserted(Operation *op,
                               OpBuilder::InsertPoint) override {
    if (!tag.empty())
      op->setAttr(KilnDialect::kBlockAttr,
                  StringAttr::get(op->getContext(), tag));
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

private:
  MLIRContext &ctx_;
  const SourceFile &file_;
  const FileAST &ast_;
  const FrontendOptions &opts_;
  DiagEngine &diags_;
  OpBuilder b_;
  BlockTagger tagger_;
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

  //===--------------------------------------------------------------------===//
  // Errors and locations
  //===--------------------------------------------------------------------===//

  [[noreturn]] void fail(SourceLoc loc, std::string message) {
    diags_.error(loc, std::move(message));
    throw Abort{};
  }

  Location loc(SourceLoc l) {
    Location result = FileLineColLoc::get(&ctx_, file_.name(), l.line, l.col);
    for (auto it = callStack_.rbegin(); it != callStack_.rend(); ++it)
      result = CallSiteLoc::get(result, *it);
    return result;
  }

  void countOp(SourceLoc l) {
    if (++opCount_ > kMaxOps)
      fail(l, "the model grows past " + std::to_string(kMaxOps) +
                  " ops; reduce repeat counts or model size");
  }

  template <typename OpT, typename... Args>
  mlir::Value create(SourceLoc l, Args &&...args) {
    countOp(l);
    return b_.create<OpT>(loc(l), std::forward<Args>(args)...).getResult();
  }

  //===--------------------------------------------------------------------===//
  // Types and tensors
  //===--------------------------------------------------------------------===//

  Type elemType(DType t) {
    switch (t) {
    case DType::F64: return b_.getF64Type();
    case DType::F32: return b_.getF32Type();
    case DType::F16: return b_.getF16Type();
    case DType::BF16: return b_.getBF16Type();
    case DType::I64: return b_.getI64Type();
    case DType::I32: return b_.getI32Type();
    case DType::I1: return b_.getI1Type();
    }
    return b_.getF32Type();
  }

  RankedTensorType tensorType(const Shape &s, DType t, SourceLoc l) {
    SmallVector<int64_t> dims;
    int64_t count = 1;
    for (const Dim &d : s) {
      if (d.size < 1 || d.size > kMaxDimSize)
        fail(l, "dimension " + (d.name.empty() ? "" : "'" + d.name + "' ") +
                    "of size " + std::to_string(d.size) +
                    " is out of range (expected 1 to " +
                    std::to_string(kMaxDimSize) + ")");
      if (count > kMaxTensorElements / d.size)
        fail(l, "tensor " + str(s) + " has more than " +
                    std::to_string(kMaxTensorElements) + " elements");
      count *= d.size;
      dims.push_back(d.size);
    }
    return RankedTensorType::get(dims, elemType(t));
  }

  Val tensor(mlir::Value v, Shape s, DType t, SourceLoc l) {
    Val r;
    r.kind = Val::Kind::Tensor;
    r.value = v;
    r.shape = std::move(s);
    r.dtype = t;
    r.loc = l;
    return r;
  }

  static Val scalarInt(int64_t v, SourceLoc l, std::string name = {}) {
    Val r;
    r.kind = Val::Kind::Int;
    r.i = v;
    r.loc = l;
    r.s = std::move(name);
    return r;
  }
  static Val scalarFloat(double v, SourceLoc l) {
    Val r;
    r.kind = Val::Kind::Float;
    r.f = v;
    r.loc = l;
    return r;
  }

  Val splat(const Shape &s, DType t, double v, SourceLoc l) {
    checkFits(v, t, l);
    RankedTensorType type = tensorType(s, t, l);
    Attribute a;
    if (isFloat(t))
      a = FloatAttr::get(type.getElementType(), v);
    else
      a = IntegerAttr::get(type.getElementType(), static_cast<int64_t>(v));
    return tensor(create<ConstantOp>(l, DenseElementsAttr::get(type, a)), s, t,
                  l);
  }

  /// numpy broadcasting of two shapes (right-aligned).
  Shape broadcastShapes(const Shape &a, const Shape &c, SourceLoc l,
                        const std::string &what) {
    size_t rank = std::max(a.size(), c.size());
    Shape out(rank);
    for (size_t i = 0; i < rank; ++i) {
      const Dim *x = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
      const Dim *y = i < rank - c.size() ? nullptr : &c[i - (rank - c.size())];
      if (x && y && x->size != y->size && x->size != 1 && y->size != 1)
        fail(l, "cannot " + what + " tensors of shapes " + str(a) + " and " +
                    str(c) + ": dim " + std::to_string(int64_t(i) - int64_t(rank)) +
                    " is " + std::to_string(x->size) + " vs " +
                    std::to_string(y->size) + " (sizes must match or be 1)");
      if (x && y)
        out[i] = x->size == 1 ? *y : *x;
      else
        out[i] = x ? *x : *y;
    }
    return out;
  }

  Val broadcastTo(const Val &t, const Shape &target, SourceLoc l) {
    if (t.shape.size() == target.size() &&
        std::equal(t.shape.begin(), t.shape.end(), target.begin()))
      return t;
    size_t offset = target.size() - t.shape.size();
    SmallVector<int64_t> dims;
    for (size_t i = 0; i < t.shape.size(); ++i)
      dims.push_back(int64_t(offset + i));
    RankedTensorType type = tensorType(target, t.dtype, l);
    return tensor(create<BroadcastInDimOp>(l, type, t.value, dims), target,
                  t.dtype, l);
  }

  /// A number used as a constant of type t must be representable in t.
  void checkFits(double v, DType t, SourceLoc l) {
    if (std::isinf(v) || std::isnan(v))
      return; // explicit infinities (e.g. masks) are intended
    double limit = t == DType::F64 ? 1.79e308
                   : t == DType::F16 ? 65504.0
                   : t == DType::I32 ? 2147483647.0
                   : t == DType::I64 ? 9.2e18 : 3.4028234e38;
    bool isIntType = t == DType::I32 || t == DType::I64;
    if (std::fabs(v) > limit || (t == DType::I32 && v < -2147483648.0))
      fail(l, "the number " + fmtDouble(v) + " does not fit in " +
                  dtypeName(t) + (isIntType ? "" : " (it would become infinity)"));
  }

  Val toTensorLike(const Val &scalar, const Val &like, SourceLoc l) {
    if (scalar.kind == Val::Kind::Bool)
      fail(scalar.loc, "a boolean cannot be used in tensor arithmetic");
    if (!scalar.isNumber())
      fail(scalar.loc, std::string("expected a tensor or a number, got ") +
                           kindName(scalar));
    if (!isFloat(like.dtype) && scalar.kind == Val::Kind::Float)
      fail(scalar.loc, "cannot combine the number " + fmtDouble(scalar.f) +
                           " with an integer tensor; cast the tensor first");
    if (!isFloat(like.dtype)) { // exact: no trip through double
      if (like.dtype == DType::I32 &&
          (scalar.i < INT32_MIN || scalar.i > INT32_MAX))
        fail(l, "the number " + std::to_string(scalar.i) + " does not fit in i32");
      RankedTensorType type = tensorType(like.shape, like.dtype, l);
      return tensor(create<ConstantOp>(
                        l, DenseElementsAttr::get(
                               type, IntegerAttr::get(type.getElementType(), scalar.i))),
                    like.shape, like.dtype, l);
    }
    return splat(like.shape, like.dtype, scalar.num(), l);
  }

  Val expectTensor(const Val &v, const std::string &what) {
    if (!v.isTensor())
      fail(v.loc, what + " must be a tensor, got " + describe(v));
    return v;
  }

  /// Layers keep f32 parameters, so their inputs must be f32 too.
  void expectF32(const Val &v, const std::string &layer) {
    expectTensor(v, "the input of " + layer);
    if (v.dtype != DType::F32)
      fail(v.loc, layer + " computes in f32 (its parameters are f32) but its "
                  "input is " + describe(v) + "; use cast(x, f32)");
  }

  Val expectFloatTensor(const Val &v, const std::string &what) {
    expectTensor(v, what);
    if (!isFloat(v.dtype))
      fail(v.loc, what + " must be a floating-point tensor, got " +
                      describe(v) + "; use cast(x, f32)");
    return v;
  }

  //===--------------------------------------------------------------------===//
  // Parameters and inputs
  //===--------------------------------------------------------------------===//

  std::string joinPrefix() const {
    std::string out;
    for (const std::string &p : prefix_)
      out += (out.empty() ? "" : ".") + p;
    return out;
  }

  /// The unique name of a new layer: `<scope>.<kind>[_n]` or the user's name.
  std::string layerName(const std::string &kind, const Args &args,
                        int nameIdx) {
    std::string base = joinPrefix();
    std::string full;
    if (nameIdx >= 0 && args.has(nameIdx)) {
      const Val &n = *args.vals[nameIdx];
      if (n.kind != Val::Kind::Str || n.s.empty())
        fail(n.loc, "name must be a non-empty string");
      full = base.empty() ? n.s : base + "." + n.s;
      if (layers_.count(full))
        fail(n.loc, "a layer named '" + full + "' already exists");
    } else {
      int &count = nameCounts_[base + "|" + kind];
      do {
        full = (base.empty() ? "" : base + ".") + kind +
               (count ? "_" + std::to_string(count) : "");
        ++count;
      } while (layers_.count(full));
    }
    return full;
  }

  DictionaryAttr initAttr(const Val &init) {
    NamedAttrList a;
    a.append("kind", b_.getStringAttr(init.s));
    if (init.s == "normal") {
      a.append("mean", b_.getF64FloatAttr(init.p0));
      a.append("std", b_.getF64FloatAttr(init.p1));
    } else if (init.s == "uniform") {
      a.append("low", b_.getF64FloatAttr(init.p0));
      a.append("high", b_.getF64FloatAttr(init.p1));
    }
    return a.getDictionary(&ctx_);
  }

  static Val makeInit(const std::string &kind, double p0, double p1,
                      SourceLoc l) {
    Val v;
    v.kind = Val::Kind::Init;
    v.s = kind;
    v.p0 = p0;
    v.p1 = p1;
    v.loc = l;
    return v;
  }

  Val newParam(const std::string &name, const std::string &layerKind,
               const Shape &shape, const Val &init, SourceLoc l) {
    countOp(l);
    if (!paramNames_.insert(name).second)
      fail(l, "a parameter named '" + name + "' already exists; give this "
              "layer another name = \"...\"");
    RankedTensorType type = tensorType(shape, DType::F32, l);
    BlockArgument arg = entry_->insertArgument(numParams_++, type, loc(l));
    NamedAttrList attrs;
    attrs.append(KilnDialect::kParamAttr, b_.getStringAttr(name));
    attrs.append(KilnDialect::kLayerAttr, b_.getStringAttr(layerKind));
    attrs.append(KilnDialect::kInitAttr, initAttr(init));
    paramAttrs_.push_back(attrs);
    return tensor(arg, shape, DType::F32, l);
  }

  Val newInput(const std::string &name, const Shape &shape, DType t,
               SourceLoc l) {
    for (const std::string &n : inputNames_)
      if (n == name)
        fail(l, "input '" + name + "' is declared twice");
    RankedTensorType type = tensorType(shape, t, l);
    BlockArgument arg = entry_->addArgument(type, loc(l));
    NamedAttrList attrs;
    attrs.append(KilnDialect::kInputAttr, b_.getStringAttr(name));
    inputAttrs_.push_back(attrs);
    inputNames_.push_back(name);
    return tensor(arg, shape, t, l);
  }

  //===--------------------------------------------------------------------===//
  // Evaluation
  //===--------------------------------------------------------------------===//

  Val eval(const Expr &e, Env &env);
  Val evalBinary(const Expr &e, Env &env);
  Val arith(const std::string &op, const Val &a, const Val &c, SourceLoc l);
  Val scalarArith(const std::string &op, const Val &a, const Val &c,
                  SourceLoc l);
  Val call(const Expr &e, Env &env);
  Val callDef(const DefDecl &def, const Expr &e, Env &env);
  Args bindArgs(const Expr &e, Env &env,
                std::initializer_list<const char *> params, size_t required);
  void execBlock(const Block &block, Env &env, bool inDef, bool topLevel,
                 std::optional<Val> &ret);
  void declareInput(const Stmt &s, Env &env);
  int64_t dimSize(const Expr &e, Env &env, std::string &name);
  void evalModelParams(const ModelDecl &m);
  void evalTrain();
  std::string suggest(const std::string &name, const Env *env);

  // Argument accessors.
  const Val &arg(const Args &a, size_t i) { return *a.vals[i]; }
  Val tensorArg(const Args &a, size_t i) {
    return expectTensor(arg(a, i), "argument '" + a.names[i] + "' of " +
                                       a.callee + "()");
  }
  int64_t intArg(const Args &a, size_t i, std::optional<int64_t> def = {}) {
    if (!a.has(i)) {
      if (!def)
        fail(a.callLoc, a.callee + "() needs argument '" + a.names[i] + "'");
      return *def;
    }
    const Val &v = arg(a, i);
    if (v.kind == Val::Kind::Int)
      return v.i;
    fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                    "() must be an integer, got " + describe(v) +
                    (v.kind == Val::Kind::Float ? " (use // for integer division)"
                                                : ""));
  }
  double floatArg(const Args &a, size_t i, double def) {
    if (!a.has(i))
      return def;
    const Val &v = arg(a, i);
    if (!v.isNumber())
      fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                      "() must be a number, got " + describe(v));
    return v.num();
  }
  bool boolArg(const Args &a, size_t i, bool def) {
    if (!a.has(i))
      return def;
    const Val &v = arg(a, i);
    if (v.kind != Val::Kind::Bool)
      fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                      "() must be true or false, got " + describe(v));
    return v.b;
  }
  Val initArg(const Args &a, size_t i, Val def) {
    if (!a.has(i))
      return def;
    const Val &v = arg(a, i);
    if (v.kind == Val::Kind::Init)
      return v;
    if (v.kind == Val::Kind::Func && (v.s == "zeros" || v.s == "ones"))
      return makeInit(v.s, 0, 0, v.loc);
    fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                    "() must be an initialiser (normal(std), uniform(low, "
                    "high), zeros or ones), got " + describe(v));
  }
  int64_t axisArg(const Args &a, size_t i, int64_t rank, int64_t def) {
    int64_t ax = a.has(i) ? intArg(a, i) : def;
    return normAxis(ax, rank, a.has(i) ? arg(a, i).loc : a.callLoc);
  }
  int64_t normAxis(int64_t ax, int64_t rank, SourceLoc l) {
    if (ax < -rank || ax >= rank)
      fail(l, "axis " + std::to_string(ax) + " is out of range for a tensor "
                  "of rank " + std::to_string(rank) + " (expected " +
                  std::to_string(-rank) + " to " + std::to_string(rank - 1) +
                  ")");
    return ax < 0 ? ax + rank : ax;
  }
  std::vector<int64_t> intListArg(const Args &a, size_t i) {
    const Val &v = arg(a, i);
    std::vector<int64_t> out;
    if (v.kind == Val::Kind::Int)
      return {v.i};
    if (v.kind != Val::Kind::List)
      fail(v.loc, "argument '" + a.names[i] + "' of " + a.callee +
                      "() must be a list of integers, got " + describe(v));
    for (const Val &x : v.items) {
      if (x.kind != Val::Kind::Int)
        fail(x.loc, "expected an integer in this list, got " + describe(x));
      out.push_back(x.i);
    }
    return out;
  }

  // Builtins.
  using Builtin = std::function<Val(const Expr &, Env &)>;
  std::unordered_map<std::string, Builtin> builtins_;
  void registerBuiltins();

  Val unaryTensorFn(const std::string &fn, const Val &x, SourceLoc l);
  Val linear(const Val &x, int64_t out, bool bias, const Val *tied,
             const Val &init, const std::string &name, SourceLoc l);
  Val layerNorm(const Val &x, double eps, bool bias, const std::string &name,
                SourceLoc l);
  Val matmul(const Val &a, const Val &c, bool ta, bool tb, SourceLoc l);
  Val reshape(const Val &x, const Shape &s, SourceLoc l);
  Val transpose(const Val &x, const std::vector<int64_t> &perm, SourceLoc l);
  Val sliceAxis(const Val &x, int64_t axis, int64_t start, int64_t end,
                int64_t step, SourceLoc l);
  Val dropout(const Val &x, double p, SourceLoc l);
  Val reduce(const std::string &fn, const Val &x,
             const std::vector<int64_t> &axes, bool keepdims, SourceLoc l);
  Val activation(const Val &fn, const Val &x, SourceLoc l);
  Val attention(const Args &a, SourceLoc l);
  Val mlp(const Args &a, SourceLoc l);
};

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

std::string Elaborator::suggest(const std::string &name, const Env *env) {
  std::string best;
  if (name.size() < 3)
    return "";
  unsigned bestDist = std::max<unsigned>(2, name.size() / 3) + 1;
  auto consider = [&](const std::string &cand) {
    unsigned d = llvm::StringRef(name).edit_distance(cand, true, bestDist);
    if (d < bestDist) {
      bestDist = d;
      best = cand;
    }
  };
  for (const Env *e = env; e; e = e->parent)
    for (const auto &kv : e->vars)
      consider(kv.first);
  for (const auto &kv : builtins_)
    consider(kv.first);
  for (const auto &kv : defs_)
    consider(kv.first);
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

Val Elaborator::eval(const Expr &e, Env &env) {
  switch (e.kind) {
  case Expr::Kind::Int:
    return scalarInt(e.intValue, e.loc);
  case Expr::Kind::Float:
    return scalarFloat(e.floatValue, e.loc);
  case Expr::Kind::Bool: {
    Val v;
    v.kind = Val::Kind::Bool;
    v.b = e.boolValue;
    v.loc = e.loc;
    return v;
  }
  case Expr::Kind::String: {
    Val v;
    v.kind = Val::Kind::Str;
    v.s = e.text;
    v.loc = e.loc;
    return v;
  }
  case Expr::Kind::Name: {
    if (const Val *v = env.lookup(e.text)) {
      Val r = *v;
      if (r.kind == Val::Kind::Int && r.s.empty())
        r.s = e.text;
      if (!r.isTensor())
        r.loc = e.loc;
      return r;
    }
    if (builtins_.count(e.text) || defs_.count(e.text)) {
      Val v;
      v.kind = Val::Kind::Func;
      v.s = e.text;
      v.loc = e.loc;
      return v;
    }
    if (std::optional<DType> t = parseDType(e.text)) {
      Val v;
      v.kind = Val::Kind::Type;
      v.dtype = *t;
      v.loc = e.loc;
      return v;
    }
    SourceLoc l = e.loc;
    l.length = e.text.size();
    fail(l, "unknown name '" + e.text + "'" + suggest(e.text, &env));
  }
  case Expr::Kind::Call:
    return call(e, env);
  case Expr::Kind::Unary: {
    Val x = eval(*e.args[0], env);
    if (x.kind == Val::Kind::Int) {
      if (x.i == std::numeric_limits<int64_t>::min())
        fail(e.loc, "integer overflow in negation");
      return scalarInt(-x.i, e.loc);
    }
    if (x.kind == Val::Kind::Float)
      return scalarFloat(-x.f, e.loc);
    if (x.isTensor()) {
      if (x.dtype == DType::I1)
        fail(e.loc, "cannot negate a boolean tensor");
      return tensor(create<NegOp>(e.loc, x.value), x.shape, x.dtype, e.loc);
    }
    fail(e.loc, std::string("cannot negate ") + kindName(x));
  }
  case Expr::Kind::Binary:
    return evalBinary(e, env);
  case Expr::Kind::List:
  case Expr::Kind::Tuple: {
    Val v;
    v.kind = Val::Kind::List;
    v.loc = e.loc;
    int64_t leaves = 0;
    for (const ExprPtr &x : e.args) {
      v.items.push_back(eval(*x, env));
      leaves += v.items.back().kind == Val::Kind::List ? v.items.back().i : 1;
      if (leaves > kMaxListElements)
        fail(e.loc, "list grows past " + std::to_string(kMaxListElements) +
                        " elements");
    }
    v.i = leaves; // for lists: the number of non-list elements inside
    return v;
  }
  }
  fail(e.loc, "unsupported expression");
}

Val Elaborator::evalBinary(const Expr &e, Env &env) {
  Val a = eval(*e.args[0], env);
  Val c = eval(*e.args[1], env);
  return arith(e.text, a, c, e.loc);
}

Val Elaborator::scalarArith(const std::string &op, const Val &a, const Val &c,
                            SourceLoc l) {
  if (a.kind == Val::Kind::Int && c.kind == Val::Kind::Int) {
    int64_t r = 0;
    bool overflow = false;
    if (op == "+")
      overflow = __builtin_add_overflow(a.i, c.i, &r);
    else if (op == "-")
      overflow = __builtin_sub_overflow(a.i, c.i, &r);
    else if (op == "*")
      overflow = __builtin_mul_overflow(a.i, c.i, &r);
    else if (op == "//") {
      if (c.i == 0)
        fail(l, "integer division by zero");
      if (a.i == std::numeric_limits<int64_t>::min() && c.i == -1)
        fail(l, "integer overflow in division");
      r = a.i / c.i;
      if ((a.i % c.i != 0) && ((a.i < 0) != (c.i < 0)))
        --r; // floor, as Python
    } else if (op == "**" && c.i >= 0) {
      // Exponentiation by squaring: O(log exponent), overflow-checked.
      r = 1;
      int64_t base = a.i, e = c.i;
      while (e > 0 && !overflow) {
        if (e & 1)
          overflow = __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e > 0 && !overflow)
          overflow = __builtin_mul_overflow(base, base, &base);
      }
    } else if (op == "/") {
      if (c.i == 0)
        fail(l, "division by zero");
      return scalarFloat(double(a.i) / double(c.i), l);
    } else if (op == "**") {
      double v = std::pow(double(a.i), double(c.i));
      if (!std::isfinite(v))
        fail(l, "'**' gives a non-finite number");
      return scalarFloat(v, l);
    } else {
      fail(l, "operator '" + op + "' needs tensors");
    }
    if (overflow)
      fail(l, "integer overflow in '" + op + "'");
    return scalarInt(r, l);
  }
  double x = a.num(), y = c.num(), r = 0;
  if (op == "+") r = x + y;
  else if (op == "-") r = x - y;
  else if (op == "*") r = x * y;
  else if (op == "/" || op == "//") {
    if (y == 0)
      fail(l, "division by zero");
    r = op == "/" ? x / y : std::floor(x / y);
  } else if (op == "**") r = std::pow(x, y);
  else
    fail(l, "operator '" + op + "' needs tensors");
  if (!std::isfinite(r))
    fail(l, "'" + op + "' gives a non-finite number");
  return scalarFloat(r, l);
}


Val Elaborator::arith(const std::string &op, const Val &a0, const Val &c0,
                      SourceLoc l) {
  if (a0.isNumber() && c0.isNumber())
    return scalarArith(op, a0, c0, l);
  if (op == "@") {
    expectTensor(a0, "the left operand of '@'");
    expectTensor(c0, "the right operand of '@'");
    return matmul(a0, c0, false, false, l);
  }
  if (!a0.isTensor() && !c0.isTensor())
    fail(l, std::string("operator '") + op + "' cannot combine " +
                kindName(a0) + " and " + kindName(c0));
  Val a = a0.isTensor() ? a0 : toTensorLike(a0, c0, l);
  Val c = c0.isTensor() ? c0 : toTensorLike(c0, a0, l);
  if (a.dtype != c.dtype)
    fail(l, std::string("operator '") + op + "' needs operands of one "
                "element type, got " + describe(a) + " and " + describe(c) +
                "; use cast(x, " + dtypeName(a.dtype) + ")");
  if (a.dtype == DType::I1)
    fail(l, std::string("operator '") + op + "' does not apply to boolean "
                "tensors");
  if ((op == "**") && !isFloat(a.dtype))
    fail(l, "'**' needs floating-point tensors; cast first");
  if (op == "//" && isFloat(a.dtype))
    fail(l, "'//' is integer division; use '/' for floating-point tensors");
  if ((op == "/" || op == "//") && !isFloat(a.dtype))
    fail(l, "division of integer tensors is not supported; cast them to a "
            "float type first");
  Shape s = broadcastShapes(a.shape, c.shape, l,
                            op == "+" ? "add" : op == "-" ? "subtract"
                            : op == "*" ? "multiply" : op == "**" ? "raise"
                                                                  : "divide");
  a = broadcastTo(a, s, l);
  c = broadcastTo(c, s, l);
  mlir::Value r;
  if (op == "+") r = create<AddOp>(l, a.value, c.value);
  else if (op == "-") r = create<SubOp>(l, a.value, c.value);
  else if (op == "*") r = create<MulOp>(l, a.value, c.value);
  else if (op == "/" || op == "//") r = create<DivOp>(l, a.value, c.value);
  else if (op == "**") r = create<PowOp>(l, a.value, c.value);
  else
    fail(l, "unknown operator '" + op + "'");
  return tensor(r, s, a.dtype, l);
}

//===----------------------------------------------------------------------===//
// Calls
//===----------------------------------------------------------------------===//

Args Elaborator::bindArgs(const Expr &e, Env &env,
                          std::initializer_list<const char *> params,
                          size_t required) {
  Args a;
  a.callee = e.text;
  a.callLoc = e.loc;
  a.callLoc.length = e.text.size();
  for (const char *p : params)
    a.names.push_back(p);
  a.vals.resize(a.names.size());
  auto signature = [&] {
    std::string s = e.text + "(";
    for (size_t i = 0; i < a.names.size(); ++i)
      s += (i ? ", " : "") + a.names[i] + (i < required ? "" : "=...");
    return s + ")";
  };
  size_t positional = 0;
  for (size_t k = 0; k < e.args.size(); ++k) {
    size_t idx;
    if (e.argNames[k].empty()) {
      idx = positional++;
      if (idx >= a.names.size())
        fail(e.args[k]->loc, a.names.empty()
                                 ? e.text + "() takes no arguments"
                                 : e.text + "() takes at most " +
                                       std::to_string(a.names.size()) +
                                       " argument(s): " + signature());
    } else {
      auto it = std::find(a.names.begin(), a.names.end(), e.argNames[k]);
      if (it == a.names.end()) {
        SourceLoc nl = e.argNameLocs[k];
        nl.length = e.argNames[k].size();
        fail(nl, e.text + "() has no argument '" + e.argNames[k] +
                     "'; it takes " + signature());
      }
      idx = it - a.names.begin();
      if (a.vals[idx])
        fail(e.argNameLocs[k], "argument '" + e.argNames[k] +
                                   "' of " + e.text + "() is given twice");
    }
    a.vals[idx] = eval(*e.args[k], env);
    if (a.vals[idx]->isTensor())
      a.vals[idx]->loc = e.args[k]->loc; // report problems at the call
  }
  for (size_t i = 0; i < required; ++i)
    if (!a.vals[i])
      fail(a.callLoc, e.text + "() needs argument '" + a.names[i] + "': " +
                          signature());
  return a;
}

Val Elaborator::call(const Expr &e, Env &env) {
  auto def = defs_.find(e.text);
  if (def != defs_.end())
    return callDef(*def->second, e, env);
  auto it = builtins_.find(e.text);
  if (it == builtins_.end()) {
    SourceLoc l = e.loc;
    l.length = e.text.size();
    if (env.lookup(e.text))
      fail(l, "'" + e.text + "' is a variable, not a function");
    fail(l, "unknown function '" + e.text + "'" + suggest(e.text, &env));
  }
  return it->second(e, env);
}

Val Elaborator::callDef(const DefDecl &def, const Expr &e, Env &env) {
  if (callDepth_ >= kMaxCallDepth)
    fail(e.loc, "calls nest deeper than " + std::to_string(kMaxCallDepth) +
                    " (is '" + def.name + "' recursive?)");
  Env local;
  local.parent = &paramEnv_;
  size_t positional = 0;
  std::vector<bool> bound(def.params.size(), false);
  for (size_t k = 0; k < e.args.size(); ++k) {
    size_t idx = 0;
    if (e.argNames[k].empty()) {
      idx = positional++;
      if (idx >= def.params.size())
        fail(e.args[k]->loc, "'" + def.name + "' takes " +
                                 std::to_string(def.params.size()) +
                                 " argument(s), got more");
    } else {
      auto it = std::find_if(def.params.begin(), def.params.end(),
                             [&](const Param &p) { return p.name == e.argNames[k]; });
      if (it == def.params.end())
        fail(e.argNameLocs[k], "'" + def.name + "' has no parameter '" +
                                   e.argNames[k] + "'");
      idx = it - def.params.begin();
      if (bound[idx])
        fail(e.argNameLocs[k], "parameter '" + e.argNames[k] +
                                   "' is given twice");
    }
    bound[idx] = true;
    local.vars[def.params[idx].name] = eval(*e.args[k], env);
  }
  for (size_t i = 0; i < def.params.size(); ++i) {
    if (bound[i])
      continue;
    if (!def.params[i].defaultValue)
      fail(e.loc, "call to '" + def.name + "' needs argument '" +
                      def.params[i].name + "'");
    local.vars[def.params[i].name] = eval(*def.params[i].defaultValue, local);
  }
  // Layers inside the def are named <scope>.<def>[_n].<layer>.
  std::string base = joinPrefix();
  int &count = nameCounts_[base + "|def:" + def.name];
  prefix_.push_back(def.name + (count ? "_" + std::to_string(count) : ""));
  ++count;
  callStack_.push_back(loc(e.loc));
  ++callDepth_;
  std::optional<Val> ret;
  execBlock(def.body, local, /*inDef=*/true, /*topLevel=*/false, ret);
  --callDepth_;
  callStack_.pop_back();
  prefix_.pop_back();
  if (!ret)
    fail(e.loc, "'" + def.name + "' returned no value; end it with "
                    "'return EXPR'");
  ret->loc = e.loc;
  return *ret;
}

//===----------------------------------------------------------------------===//
// Statements
//===----------------------------------------------------------------------===//

int64_t Elaborator::dimSize(const Expr &e, Env &env, std::string &name) {
  if (e.kind == Expr::Kind::Name && !env.lookup(e.text)) {
    // A free dimension: bound by --dim, or the batch (leading dims only).
    name = e.text;
    usedDims_.insert(e.text);
    auto it = opts_.dims.find(e.text);
    if (it != opts_.dims.end())
      return it->second;
    std::string hint = suggest(e.text, &paramEnv_);
    if (!hint.empty()) {
      SourceLoc l = e.loc;
      l.length = e.text.size();
      fail(l, "dimension '" + e.text + "' is not a model parameter" + hint +
                  " (a free dimension needs --dim " + e.text + "=<size>)");
    }
    if ((batchDimName_.empty() && leadingDim_) || batchDimName_ == e.text) {
      batchDimName_ = e.text;
      if (opts_.batch)
        return *opts_.batch;
      if (trainBatch_)
        return *trainBatch_;
    }
    SourceLoc l = e.loc;
    l.length = e.text.size();
    fail(l, "dimension '" + e.text + "' has no size: " +
                (batchDimName_ == e.text
                     ? "set batch in the train section, or pass --batch <size> "
                       "or --dim " + e.text + "=<size>"
                     : "pass --dim " + e.text + "=<size> (only the leading "
                       "dimension of an input can be the batch" +
                       (batchDimName_.empty() ? std::string(")")
                                              : ", and it is '" + batchDimName_ + "')")));
  }
  Val v = eval(e, env);
  if (v.kind != Val::Kind::Int)
    fail(e.loc, "a dimension must be an integer, got " + describe(v) +
                    (v.kind == Val::Kind::Float ? " (use // for integer division)" : ""));
  name = e.kind == Expr::Kind::Name ? e.text : "";
  return v.i;
}

void Elaborator::declareInput(const Stmt &s, Env &env) {
  std::optional<DType> t = parseDType(s.dtype);
  if (!t) {
    SourceLoc l = s.dtypeLoc;
    l.length = s.dtype.size();
    fail(l, "unknown element type '" + s.dtype +
                "'; expected f64, f32, f16, bf16, i64, i32 or i1");
  }
  Shape shape;
  for (const ExprPtr &d : s.dims) {
    Dim dim;
    leadingDim_ = shape.empty();
    dim.size = dimSize(*d, env, dim.name);
    if (dim.size < 1 || dim.size > kMaxDimSize)
      fail(d->loc, "dimension size " + std::to_string(dim.size) +
                       " is out of range (expected 1 to " +
                       std::to_string(kMaxDimSize) + ")");
    if (!dim.name.empty() && !env.lookup(dim.name) &&
        !dimBindings_.get(dim.name))
      dimBindings_.append(dim.name, b_.getI64IntegerAttr(dim.size));
    shape.push_back(dim);
  }
  if (env.vars.count(s.name))
    fail(s.nameLoc, "'" + s.name + "' is already defined");
  if (paramEnv_.vars.count(s.name))
    fail(s.nameLoc, "'" + s.name + "' is a model parameter; name the input "
                    "differently");
  if (s.name == "dropout_seed" || s.name == "step" || s.name == "seed")
    fail(s.nameLoc, "'" + s.name + "' is reserved for the training program; "
                    "name the input differently");
  env.vars[s.name] = newInput(s.name, shape, *t, s.nameLoc);
}

void Elaborator::execBlock(const Block &block, Env &env, bool inDef,
                           bool topLevel, std::optional<Val> &ret) {
  for (const Stmt &s : block) {
    if (ret)
      return;
    if (++steps_ > kMaxSteps)
      fail(s.loc, "the model takes more than " + std::to_string(kMaxSteps) +
                      " statements to evaluate; reduce repeat counts");
    switch (s.kind) {
    case Stmt::Kind::Input:
      if (inDef || !topLevel)
        fail(s.loc, "inputs are declared at the top level of the model, not "
                    "inside a def or repeat");
      declareInput(s, env);
      break;
    case Stmt::Kind::Assign: {
      Val v = eval(*s.value, env);
      if (paramEnv_.vars.count(s.name) && !env.vars.count(s.name) &&
          &env != &paramEnv_ && !inDef) {
        SourceLoc l = s.nameLoc;
        l.length = s.name.size();
        fail(l, "'" + s.name + "' is a model parameter and cannot be "
                    "assigned; pick another name");
      }
      env.vars[s.name] = v;
      break;
    }
    case Stmt::Kind::Repeat: {
      Val n = eval(*s.value, env);
      if (n.kind != Val::Kind::Int || n.i < 0 || n.i > kMaxRepeat)
        fail(s.value->loc, "repeat needs a count from 0 to " +
                               std::to_string(kMaxRepeat) + ", got " +
                               (n.kind == Val::Kind::Int ? std::to_string(n.i)
                                                         : describe(n)));
      std::string scope = s.name.empty() ? "layers" : s.name;
      std::string outerTag = tagger_.tag;
      for (int64_t i = 0; i < n.i && !ret; ++i) {
        if (++steps_ > kMaxSteps)
          fail(s.loc, "the model takes more than " + std::to_string(kMaxSteps) +
                          " statements to evaluate; reduce repeat counts");
        prefix_.push_back(scope + "." + std::to_string(i));
        tagger_.tag = joinPrefix();
        execBlock(s.body, env, inDef, /*topLevel=*/false, ret);
        prefix_.pop_back();
      }
      tagger_.tag = outerTag;
      break;
    }
    case Stmt::Kind::Return:
      if (!inDef)
        fail(s.loc, "'return' is only allowed inside a def; the model's "
                    "results are the variables 'loss' and 'logits'");
      ret = eval(*s.value, env);
      return;
    }
  }
}

//===----------------------------------------------------------------------===//
// Tensor building blocks
//===----------------------------------------------------------------------===//

Val Elaborator::unaryTensorFn(const std::string &fn, const Val &x,
                              SourceLoc l) {
  if (x.isNumber()) {
    double v = x.num(), r = 0;
    if (fn == "sqrt") r = std::sqrt(v);
    else if (fn == "rsqrt") r = 1.0 / std::sqrt(v);
    else if (fn == "exp") r = std::exp(v);
    else if (fn == "log") r = std::log(v);
    else if (fn == "tanh") r = std::tanh(v);
    else if (fn == "abs") {
      if (x.kind == Val::Kind::Int && x.i != std::numeric_limits<int64_t>::min())
        return scalarInt(x.i < 0 ? -x.i : x.i, l);
      r = std::fabs(v);
    } else if (fn == "sigmoid") r = 1.0 / (1.0 + std::exp(-v));
    else if (fn == "relu") r = v > 0 ? v : 0;
    else
      fail(l, fn + "() needs a tensor");
    if (!std::isfinite(r))
      fail(l, fn + "(" + fmtDouble(v) + ") is not a finite number");
    return scalarFloat(r, l);
  }
  bool numeric = fn == "abs" || fn == "relu";
  if (numeric)
    expectTensor(x, "the argument of " + fn + "()");
  else
    expectFloatTensor(x, "the argument of " + fn + "()");
  if (x.dtype == DType::I1)
    fail(x.loc, fn + "() does not apply to boolean tensors");
  mlir::Value r;
  if (fn == "sqrt") r = create<SqrtOp>(l, x.value);
  else if (fn == "rsqrt") r = create<RsqrtOp>(l, x.value);
  else if (fn == "exp") r = create<ExpOp>(l, x.value);
  else if (fn == "log") r = create<LogOp>(l, x.value);
  else if (fn == "tanh") r = create<TanhOp>(l, x.value);
  else if (fn == "abs") r = create<AbsOp>(l, x.value);
  else if (fn == "sigmoid") r = create<SigmoidOp>(l, x.value);
  else if (fn == "relu") r = create<ReluOp>(l, x.value);
  else
    fail(l, "unknown function '" + fn + "'");
  return tensor(r, x.shape, x.dtype, l);
}

Val Elaborator::matmul(const Val &a, const Val &c, bool ta, bool tb,
                       SourceLoc l) {
  if (a.dtype != c.dtype || a.dtype == DType::I1)
    fail(l, "matmul needs two numeric tensors of one element type, got " +
                describe(a) + " and " + describe(c));
  if (a.shape.size() < 2 || c.shape.size() < 2)
    fail(l, "matmul needs tensors of rank >= 2, got " + describe(a) +
                " and " + describe(c));
  size_t ar = a.shape.size(), cr = c.shape.size();
  const Dim &m = ta ? a.shape[ar - 1] : a.shape[ar - 2];
  const Dim &ka = ta ? a.shape[ar - 2] : a.shape[ar - 1];
  const Dim &kc = tb ? c.shape[cr - 1] : c.shape[cr - 2];
  const Dim &n = tb ? c.shape[cr - 2] : c.shape[cr - 1];
  if (ka.size != kc.size)
    fail(l, "matmul of " + str(a.shape) + " and " + str(c.shape) +
                ": the inner dimensions differ (" + std::to_string(ka.size) +
                " vs " + std::to_string(kc.size) + ")");
  Shape batchA(a.shape.begin(), a.shape.end() - 2);
  Shape batchC(c.shape.begin(), c.shape.end() - 2);
  if (!batchA.empty() && !batchC.empty() && batchA != batchC)
    fail(l, "matmul of " + str(a.shape) + " and " + str(c.shape) +
                ": batch dimensions " + str(batchA) + " and " + str(batchC) +
                " differ (they must match, or one side has none)");
  Shape out = batchA.empty() ? batchC : batchA;
  out.push_back(m);
  out.push_back(n);
  RankedTensorType type = tensorType(out, a.dtype, l);
  countOp(l);
  auto op = b_.create<MatmulOp>(loc(l), type, a.value, c.value,
                                ta ? b_.getUnitAttr() : UnitAttr(),
                                tb ? b_.getUnitAttr() : UnitAttr());
  return tensor(op.getResult(), out, a.dtype, l);
}

Val Elaborator::reshape(const Val &x, const Shape &s, SourceLoc l) {
  int64_t a = 1, c = 1;
  for (const Dim &d : x.shape)
    a *= d.size;
  for (const Dim &d : s) {
    if (d.size < 1 || c > kMaxTensorElements / d.size)
      fail(l, "reshape target " + str(s) + " is invalid");
    c *= d.size;
  }
  if (a != c)
    fail(l, "cannot reshape " + str(x.shape) + " (" + std::to_string(a) +
                " elements) to " + str(s) + " (" + std::to_string(c) +
                " elements)");
  if (x.shape == s)
    return tensor(x.value, s, x.dtype, l);
  return tensor(create<ReshapeOp>(l, tensorType(s, x.dtype, l), x.value), s,
                x.dtype, l);
}

Val Elaborator::transpose(const Val &x, const std::vector<int64_t> &perm,
                          SourceLoc l) {
  if (perm.size() != x.shape.size())
    fail(l, "transpose of rank-" + std::to_string(x.shape.size()) +
                " tensor needs a permutation of " +
                std::to_string(x.shape.size()) + " axes");
  std::vector<bool> seen(perm.size(), false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(perm.size()) || seen[p])
      fail(l, "transpose needs a permutation of 0.." +
                  std::to_string(perm.size() - 1));
    seen[p] = true;
    out.push_back(x.shape[p]);
  }
  SmallVector<int64_t> p(perm.begin(), perm.end());
  return tensor(create<TransposeOp>(l, x.value, p), out, x.dtype, l);
}

Val Elaborator::sliceAxis(const Val &x, int64_t axis, int64_t start,
                          int64_t end, int64_t step, SourceLoc l) {
  int64_t size = x.shape[axis].size;
  if (start < 0)
    start += size;
  if (end < 0)
    end += size;
  if (step < 1)
    fail(l, "slice step must be >= 1, got " + std::to_string(step));
  if (start < 0 || start > end || end > size)
    fail(l, "slice [" + std::to_string(start) + ":" + std::to_string(end) +
                ":" + std::to_string(step) + "] is out of range for axis " +
                std::to_string(axis) + " of size " + std::to_string(size));
  if (start == end)
    fail(l, "slice is empty; Kiln tensors have no zero-size dimensions");
  SmallVector<int64_t> starts(x.shape.size(), 0), limits, steps(x.shape.size(), 1);
  for (const Dim &d : x.shape)
    limits.push_back(d.size);
  starts[axis] = start;
  limits[axis] = end;
  steps[axis] = step;
  Shape out = x.shape;
  out[axis] = Dim{(end - start - 1) / step + 1, ""};
  return tensor(create<SliceOp>(l, x.value, starts, limits, steps), out,
                x.dtype, l);
}

Val Elaborator::dropout(const Val &x, double p, SourceLoc l) {
  expectFloatTensor(x, "the argument of dropout()");
  if (!(p >= 0.0 && p < 1.0))
    fail(l, "dropout probability " + fmtDouble(p) + " must be in [0, 1)");
  if (p == 0.0)
    return x;
  if (!dropoutSeed_) {
    OpBuilder::InsertionGuard guard(b_);
    RankedTensorType type = RankedTensorType::get({}, b_.getI64Type());
    BlockArgument arg = entry_->addArgument(type, loc(l));
    NamedAttrList attrs;
    attrs.append(KilnDialect::kInputAttr, b_.getStringAttr("dropout_seed"));
    inputAttrs_.push_back(attrs);
    inputNames_.push_back("dropout_seed");
    dropoutSeed_ = tensor(arg, {}, DType::I64, l);
  }
  countOp(l);
  auto op = b_.create<DropoutOp>(loc(l), x.value, dropoutSeed_->value,
                                 b_.getF64FloatAttr(p),
                                 b_.getI64IntegerAttr(dropoutSalt_++));
  return tensor(op.getResult(), x.shape, x.dtype, l);
}

Val Elaborator::reduce(const std::string &fn, const Val &x,
                       const std::vector<int64_t> &axes0, bool keepdims,
                       SourceLoc l) {
  if (fn == "mean")
    expectFloatTensor(x, "the argument of mean()");
  if (x.dtype == DType::I1)
    fail(l, fn + "() does not apply to boolean tensors");
  int64_t rank = x.shape.size();
  std::vector<int64_t> axes;
  for (int64_t a : axes0)
    axes.push_back(normAxis(a, rank, l));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(l, fn + "() got the same axis twice");
  Shape out;
  for (int64_t d = 0; d < rank; ++d) {
    if (std::find(axes.begin(), axes.end(), d) == axes.end())
      out.push_back(x.shape[d]);
    else if (keepdims)
      out.push_back(Dim{1, ""});
  }
  RankedTensorType type = tensorType(out, x.dtype, l);
  SmallVector<int64_t> ax(axes.begin(), axes.end());
  UnitAttr keep = keepdims ? b_.getUnitAttr() : UnitAttr();
  mlir::Value r;
  DenseI64ArrayAttr axAttr = b_.getDenseI64ArrayAttr(ax);
  if (fn == "sum") r = create<ReduceSumOp>(l, type, x.value, axAttr, keep);
  else if (fn == "mean") r = create<ReduceMeanOp>(l, type, x.value, axAttr, keep);
  else r = create<ReduceMaxOp>(l, type, x.value, axAttr, keep);
  return tensor(r, out, x.dtype, l);
}

Val Elaborator::activation(const Val &fn, const Val &x, SourceLoc l) {
  if (fn.kind != Val::Kind::Func)
    fail(fn.loc, "expected an activation function (relu, gelu, gelu_tanh, "
                 "tanh, sigmoid), got " + describe(fn));
  if (fn.s == "gelu" || fn.s == "gelu_tanh") {
    expectFloatTensor(x, "the argument of gelu()");
    auto approx = fn.s == "gelu" ? GeluApproximation::erf : GeluApproximation::tanh;
    return tensor(create<GeluOp>(l, approx, x.value), x.shape, x.dtype, l);
  }
  if (fn.s == "relu" || fn.s == "tanh" || fn.s == "sigmoid")
    return unaryTensorFn(fn.s, x, l);
  fail(fn.loc, "'" + fn.s + "' is not an activation; use relu, gelu, "
               "gelu_tanh, tanh or sigmoid");
}

//===----------------------------------------------------------------------===//
// Layers
//===----------------------------------------------------------------------===//

Val Elaborator::linear(const Val &x, int64_t out, bool bias, const Val *tied,
                       const Val &init, const std::string &name, SourceLoc l) {
  expectF32(x, "linear()");
  if (x.shape.size() < 2)
    fail(x.loc, "linear() needs an input of rank >= 2 ([..., features]), "
                "got " + describe(x));
  if (out < 1 || out > kMaxDimSize)
    fail(l, "linear() output size " + std::to_string(out) +
                " is out of range");
  const Dim &in = x.shape.back();
  Val w;
  if (tied) {
    w = *tied;
    if (w.shape.size() != 2 || w.shape[0].size != out ||
        w.shape[1].size != in.size)
      fail(l, "tied weight has shape " + str(w.shape) + " but this linear "
              "layer needs [" + std::to_string(out) + ", " +
              std::to_string(in.size) + "] ([out, in])");
  } else {
    w = newParam(name + ".weight", "linear", {Dim{out, ""}, in}, init, l);
  }
  Val y = matmul(x, w, false, true, l);
  y.shape.back().name = tied ? tied->shape[0].name : "";
  if (bias) {
    Val bv = newParam(name + ".bias", "linear", {Dim{out, ""}},
                      makeInit("zeros", 0, 0, l), l);
    y = tensor(create<AddOp>(l, y.value,
                             broadcastTo(bv, y.shape, l).value),
               y.shape, y.dtype, l);
  }
  Layer layer{"linear", w, l};
  layers_[name] = layer;
  return y;
}

Val Elaborator::layerNorm(const Val &x, double eps, bool bias,
                          const std::string &name, SourceLoc l) {
  expectF32(x, "layer_norm()");
  if (x.shape.empty())
    fail(x.loc, "layer_norm() needs a tensor of rank >= 1");
  if (!(eps > 0))
    fail(l, "layer_norm() eps must be positive");
  Shape ps{x.shape.back()};
  Val g = newParam(name + ".weight", "layer_norm", ps,
                   makeInit("ones", 0, 0, l), l);
  mlir::Value bv;
  if (bias)
    bv = newParam(name + ".bias", "layer_norm", ps,
                  makeInit("zeros", 0, 0, l), l)
             .value;
  countOp(l);
  auto op = b_.create<LayerNormOp>(loc(l), x.value, g.value, bv,
                                   b_.getF64FloatAttr(eps));
  layers_[name] = Layer{"layer_norm", g, l};
  return tensor(op.getResult(), x.shape, x.dtype, l);
}

Val Elaborator::attention(const Args &a, SourceLoc l) {
  // attention(x, heads, causal, bias, dropout, init, proj_init, name)
  Val x = tensorArg(a, 0);
  expectF32(x, "attention()");
  int64_t heads = intArg(a, 1);
  bool causal = boolArg(a, 2, true);
  bool bias = boolArg(a, 3, true);
  double p = floatArg(a, 4, 0.0);
  Val init = initArg(a, 5, makeInit("normal", 0, 0.02, l));
  Val projInit = initArg(a, 6, init);
  std::string name = layerName("attention", a, 7);
  if (x.shape.size() != 3)
    fail(x.loc, "attention() needs an input [batch, sequence, width], got " +
                    describe(x));
  Dim batch = x.shape[0], seq = x.shape[1], width = x.shape[2];
  if (heads < 1)
    fail(arg(a, 1).loc, "attention(): heads must be >= 1, got " +
                            std::to_string(heads));
  if (width.size % heads != 0)
    fail(arg(a, 1).loc, "attention(): width " + str({width}) +
                            " is not divisible by heads=" +
                            std::to_string(heads));
  int64_t hd = width.size / heads;
  Dim H{heads, "heads"}, D{hd, ""};
  prefix_.push_back(name.substr(name.rfind('.') + 1));
  std::string inner = joinPrefix();
  prefix_.pop_back();
  // Fused q, k, v projection: [B, T, 3C].
  Val qkv = linear(x, 3 * width.size, bias, nullptr, init,
                   (name) + ".qkv", l);
  auto head = [&](int64_t k) {
    Val part = sliceAxis(qkv, 2, k * width.size, (k + 1) * width.size, 1, l);
    part = reshape(part, {batch, seq, H, D}, l);
    return transpose(part, {0, 2, 1, 3}, l); // [B, H, T, D]
  };
  Val q = head(0), k = head(1), v = head(2);
  Val scores = matmul(q, k, false, true, l); // [B, H, T, T]
  scores = arith("*", scores, scalarFloat(1.0 / std::sqrt(double(hd)), l), l);
  if (causal) {
    Shape tt{seq, seq};
    RankedTensorType it = tensorType(tt, DType::I32, l);
    mlir::Value rows = create<IotaOp>(l, it, b_.getI64IntegerAttr(0));
    mlir::Value cols = create<IotaOp>(l, it, b_.getI64IntegerAttr(1));
    Val mask = tensor(create<CompareOp>(l, CompareDirection::ge, rows, cols),
                      tt, DType::I1, l);
    mask = broadcastTo(mask, scores.shape, l);
    Val neg = splat(scores.shape, scores.dtype,
                    -std::numeric_limits<double>::infinity(), l);
    scores = tensor(create<SelectOp>(l, mask.value, scores.value, neg.value),
                    scores.shape, scores.dtype, l);
  }
  countOp(l);
  Val probs = tensor(b_.create<SoftmaxOp>(loc(l), scores.value,
                                          b_.getI64IntegerAttr(3))
                         .getResult(),
                     scores.shape, scores.dtype, l);
  probs = dropout(probs, p, l);
  Val y = matmul(probs, v, false, false, l); // [B, H, T, D]
  y = transpose(y, {0, 2, 1, 3}, l);
  y = reshape(y, {batch, seq, width}, l);
  y = linear(y, width.size, bias, nullptr, projInit, name + ".proj", l);
  y = dropout(y, p, l);
  (void)inner;
  return y;
}

Val Elaborator::mlp(const Args &a, SourceLoc l) {
  // mlp(x, hidden, act, bias, dropout, init, proj_init, name)
  Val x = tensorArg(a, 0);
  expectF32(x, "mlp()");
  int64_t hidden = intArg(a, 1);
  Val act;
  if (a.has(2)) {
    act = arg(a, 2);
  } else {
    act.kind = Val::Kind::Func;
    act.s = "gelu";
    act.loc = l;
  }
  bool bias = boolArg(a, 3, true);
  double p = floatArg(a, 4, 0.0);
  Val init = initArg(a, 5, makeInit("normal", 0, 0.02, l));
  Val projInit = initArg(a, 6, init);
  std::string name = layerName("mlp", a, 7);
  if (x.shape.size() < 2)
    fail(x.loc, "mlp() needs an input of rank >= 2, got " + describe(x));
  int64_t width = x.shape.back().size;
  Val h = linear(x, hidden, bias, nullptr, init, name + ".fc", l);
  h = activation(act, h, l);
  Val y = linear(h, width, bias, nullptr, projInit, name + ".proj", l);
  y.shape.back() = x.shape.back();
  return dropout(y, p, l);
}

//===----------------------------------------------------------------------===//
// The builtin table
//===----------------------------------------------------------------------===//

void Elaborator::registerBuiltins() {
  auto &B = builtins_;
  // Elementwise functions of one tensor (or one number).
  for (const char *fn : {"sqrt", "rsqrt", "exp", "log", "tanh", "abs",
                         "sigmoid", "relu"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x"}, 1);
      return unaryTensorFn(name, arg(a, 0), e.loc);
    };
  }
  for (const char *fn : {"gelu", "gelu_tanh"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x"}, 1);
      Val f;
      f.kind = Val::Kind::Func;
      f.s = name;
      return activation(f, tensorArg(a, 0), e.loc);
    };
  }
  for (const char *fn : {"softmax", "log_softmax"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x", "axis"}, 1);
      Val x = expectFloatTensor(tensorArg(a, 0), "the argument of " + name + "()");
      if (x.shape.empty())
        fail(x.loc, name + "() needs a tensor of rank >= 1");
      int64_t ax = axisArg(a, 1, x.shape.size(), -1);
      IntegerAttr axis = b_.getI64IntegerAttr(ax);
      mlir::Value r = name == "softmax"
                          ? create<SoftmaxOp>(e.loc, x.value, axis)
                          : create<LogSoftmaxOp>(e.loc, x.value, axis);
      return tensor(r, x.shape, x.dtype, e.loc);
    };
  }
  for (const char *fn : {"sum", "mean", "max"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"x", "axis", "keepdims"}, 1);
      Val x = tensorArg(a, 0);
      std::vector<int64_t> axes;
      if (a.has(1))
        axes = intListArg(a, 1);
      else
        for (size_t d = 0; d < x.shape.size(); ++d)
          axes.push_back(d);
      return reduce(name, x, axes, boolArg(a, 2, false), e.loc);
    };
  }
  for (const char *fn : {"maximum", "minimum"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"a", "b"}, 2);
      Val x = arg(a, 0), y = arg(a, 1);
      if (x.isNumber() && y.isNumber()) {
        bool takeX = name == "maximum" ? x.num() >= y.num() : x.num() <= y.num();
        return takeX ? x : y;
      }
      if (!x.isTensor() && !y.isTensor())
        fail(e.loc, name + "() needs numbers or tensors");
      Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
      Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
      if (p.dtype != q.dtype || p.dtype == DType::I1)
        fail(e.loc, name + "() needs numeric tensors of one element type, "
                    "got " + describe(p) + " and " + describe(q));
      Shape s = broadcastShapes(p.shape, q.shape, e.loc, "combine");
      p = broadcastTo(p, s, e.loc);
      q = broadcastTo(q, s, e.loc);
      mlir::Value r = name == "maximum" ? create<MaxOp>(e.loc, p.value, q.value)
                                        : create<MinOp>(e.loc, p.value, q.value);
      return tensor(r, s, p.dtype, e.loc);
    };
  }
  static const std::pair<const char *, CompareDirection> comparisons[] = {
      {"equal", CompareDirection::eq},      {"not_equal", CompareDirection::ne},
      {"less", CompareDirection::lt},       {"less_equal", CompareDirection::le},
      {"greater", CompareDirection::gt},    {"greater_equal", CompareDirection::ge}};
  for (const auto &[fn, dir] : comparisons) {
    std::string name = fn;
    CompareDirection d = dir;
    B[name] = [this, name, d](const Expr &e, Env &env) {
      Args a = bindArgs(e, env, {"a", "b"}, 2);
      Val x = arg(a, 0), y = arg(a, 1);
      if (!x.isTensor() && !y.isTensor())
        fail(e.loc, name + "() compares tensors; got " + describe(x) +
                        " and " + describe(y));
      Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
      Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
      if (p.dtype != q.dtype || p.dtype == DType::I1)
        fail(e.loc, name + "() needs numeric tensors of one element type, "
                    "got " + describe(p) + " and " + describe(q));
      Shape s = broadcastShapes(p.shape, q.shape, e.loc, "compare");
      p = broadcastTo(p, s, e.loc);
      q = broadcastTo(q, s, e.loc);
      return tensor(create<CompareOp>(e.loc, d, p.value, q.value), s,
                    DType::I1, e.loc);
    };
  }
  B["where"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"cond", "a", "b"}, 3);
    Val c = tensorArg(a, 0);
    if (c.dtype != DType::I1)
      fail(c.loc, "where() needs a boolean condition (from less(), equal(), "
                  "...), got " + describe(c));
    Val x = arg(a, 1), y = arg(a, 2);
    if (!x.isTensor() && !y.isTensor())
      fail(e.loc, "where() needs at least one tensor value");
    Val p = x.isTensor() ? x : toTensorLike(x, y, e.loc);
    Val q = y.isTensor() ? y : toTensorLike(y, x, e.loc);
    if (p.dtype != q.dtype)
      fail(e.loc, "where() values differ in element type: " + describe(p) +
                      " and " + describe(q));
    Shape s = broadcastShapes(broadcastShapes(p.shape, q.shape, e.loc, "select"),
                              c.shape, e.loc, "select");
    c = broadcastTo(c, s, e.loc);
    p = broadcastTo(p, s, e.loc);
    q = broadcastTo(q, s, e.loc);
    return tensor(create<SelectOp>(e.loc, c.value, p.value, q.value), s,
                  p.dtype, e.loc);
  };
  B["matmul"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"a", "b", "transpose_a", "transpose_b"}, 2);
    return matmul(tensorArg(a, 0), tensorArg(a, 1), boolArg(a, 2, false),
                  boolArg(a, 3, false), e.loc);
  };
  B["reshape"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "shape"}, 2);
    Val x = tensorArg(a, 0);
    const Val &sv = arg(a, 1);
    if (sv.kind != Val::Kind::List)
      fail(sv.loc, "reshape() needs a shape list such as [B, 64, -1]");
    Shape s;
    int inferred = -1;
    int64_t known = 1, total = 1;
    for (const Dim &d : x.shape)
      total *= d.size;
    for (size_t i = 0; i < sv.items.size(); ++i) {
      const Val &d = sv.items[i];
      if (d.kind != Val::Kind::Int)
        fail(d.loc, "a dimension must be an integer, got " + describe(d));
      if (d.i == -1) {
        if (inferred >= 0)
          fail(d.loc, "only one dimension of a reshape may be -1");
        inferred = i;
        s.push_back(Dim{1, ""});
        continue;
      }
      if (d.i < 1 || d.i > kMaxDimSize)
        fail(d.loc, "dimension " + std::to_string(d.i) + " is out of range");
      if (known > kMaxTensorElements / d.i)
        fail(d.loc, "reshape target is too large");
      known *= d.i;
      s.push_back(Dim{d.i, d.s});
    }
    if (inferred >= 0) {
      if (total % known != 0)
        fail(sv.loc, "cannot infer the -1 dimension: " + std::to_string(total) +
                         " elements do not divide by " + std::to_string(known));
      s[inferred].size = total / known;
    }
    return reshape(x, s, e.loc);
  };
  B["transpose"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "perm"}, 1);
    Val x = tensorArg(a, 0);
    std::vector<int64_t> perm;
    if (a.has(1)) {
      perm = intListArg(a, 1);
    } else {
      if (x.shape.size() < 2)
        fail(e.loc, "transpose() without perm swaps the last two axes and "
                    "needs rank >= 2");
      for (size_t i = 0; i < x.shape.size(); ++i)
        perm.push_back(i);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    }
    return transpose(x, perm, e.loc);
  };
  B["slice"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "axis", "start", "end", "step"}, 4);
    Val x = tensorArg(a, 0);
    if (x.shape.empty())
      fail(x.loc, "slice() needs a tensor of rank >= 1");
    int64_t ax = axisArg(a, 1, x.shape.size(), 0);
    return sliceAxis(x, ax, intArg(a, 2), intArg(a, 3), intArg(a, 4, 1), e.loc);
  };
  B["concat"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"tensors", "axis"}, 1);
    const Val &list = arg(a, 0);
    if (list.kind != Val::Kind::List || list.items.empty())
      fail(list.loc, "concat() needs a non-empty list of tensors");
    std::vector<Val> xs;
    for (const Val &v : list.items)
      xs.push_back(expectTensor(v, "each element of concat()'s list"));
    if (xs[0].shape.empty())
      fail(xs[0].loc, "concat() needs tensors of rank >= 1, got a scalar");
    int64_t ax = axisArg(a, 1, xs[0].shape.size(), 0);
    Shape out = xs[0].shape;
    SmallVector<mlir::Value> vals;
    for (size_t i = 0; i < xs.size(); ++i) {
      const Val &v = xs[i];
      if (v.dtype != xs[0].dtype || v.shape.size() != out.size())
        fail(v.loc, "concat() element " + std::to_string(i) + " is " +
                        describe(v) + " but element 0 is " + describe(xs[0]));
      for (size_t d = 0; d < out.size(); ++d)
        if (int64_t(d) != ax && v.shape[d].size != out[d].size)
          fail(v.loc, "concat() element " + std::to_string(i) + " has shape " +
                          str(v.shape) + " but element 0 has " +
                          str(xs[0].shape) + "; only axis " +
                          std::to_string(ax) + " may differ");
      if (i > 0)
        out[ax] = Dim{out[ax].size + v.shape[ax].size, ""};
      vals.push_back(v.value);
    }
    RankedTensorType type = tensorType(out, xs[0].dtype, e.loc);
    return tensor(create<ConcatOp>(e.loc, type, vals, b_.getI64IntegerAttr(ax)),
                  out, xs[0].dtype, e.loc);
  };
  B["cast"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "dtype"}, 2);
    Val x = tensorArg(a, 0);
    const Val &t = arg(a, 1);
    if (t.kind != Val::Kind::Type)
      fail(t.loc, "cast() needs an element type (f64, f32, f16, bf16, i64, "
                  "i32, i1), got " + describe(t));
    if (t.dtype == x.dtype)
      return x;
    return tensor(create<CastOp>(e.loc, tensorType(x.shape, t.dtype, e.loc),
                                 x.value),
                  x.shape, t.dtype, e.loc);
  };
  B["cross_entropy"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"logits", "targets", "reduction"}, 2);
    Val logits = expectFloatTensor(tensorArg(a, 0), "the logits of cross_entropy()");
    Val targets = tensorArg(a, 1);
    if (!isInt(targets.dtype))
      fail(targets.loc, "cross_entropy() targets must be an integer tensor "
                        "(class indices), got " + describe(targets));
    if (logits.shape.empty())
      fail(logits.loc, "cross_entropy() logits need a class dimension");
    Shape want(logits.shape.begin(), logits.shape.end() - 1);
    if (targets.shape != want)
      fail(targets.loc, "cross_entropy() targets have shape " +
                            str(targets.shape) + " but logits " +
                            str(logits.shape) + " need targets " + str(want));
    LossReduction red = LossReduction::mean;
    if (a.has(2)) {
      const Val &r = arg(a, 2);
      if (r.kind != Val::Kind::Str ||
          (r.s != "mean" && r.s != "sum" && r.s != "none"))
        fail(r.loc, "reduction must be \"mean\", \"sum\" or \"none\"");
      red = r.s == "mean" ? LossReduction::mean
            : r.s == "sum" ? LossReduction::sum : LossReduction::none;
    }
    Shape out = red == LossReduction::none ? want : Shape{};
    countOp(e.loc);
    auto op = b_.create<CrossEntropyOp>(loc(e.loc), logits.value,
                                        targets.value, red);
    return tensor(op.getResult(), out, logits.dtype, e.loc);
  };
  B["dropout"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "p"}, 2);
    return dropout(tensorArg(a, 0), floatArg(a, 1, 0), e.loc);
  };
  // Initialisers.
  B["normal"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"std", "mean"}, 1);
    double sd = floatArg(a, 0, 0.02);
    if (!(sd >= 0) || !std::isfinite(sd))
      fail(arg(a, 0).loc, "normal() std must be a non-negative number");
    return makeInit("normal", floatArg(a, 1, 0.0), sd, e.loc);
  };
  B["uniform"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"low", "high"}, 1);
    double lo = floatArg(a, 0, 0), hi = a.has(1) ? floatArg(a, 1, 0) : -lo;
    if (!a.has(1))
      std::swap(lo, hi), lo = -std::fabs(lo), hi = std::fabs(hi);
    if (!(lo <= hi))
      fail(e.loc, "uniform() needs low <= high");
    return makeInit("uniform", lo, hi, e.loc);
  };
  for (const char *fn : {"zeros", "ones"}) {
    std::string name = fn;
    B[name] = [this, name](const Expr &e, Env &env) {
      bindArgs(e, env, {}, 0);
      return makeInit(name, 0, 0, e.loc);
    };
  }
  // Layers with parameters.
  B["linear"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "out", "bias", "tied", "init", "name"}, 2);
    Val x = tensorArg(a, 0);
    int64_t out = intArg(a, 1);
    std::string name = layerName("linear", a, 5);
    std::optional<Val> tied;
    if (a.has(3)) {
      const Val &t = arg(a, 3);
      std::string target = t.kind == Val::Kind::Str || t.kind == Val::Kind::Func
                               ? t.s : "";
      if (target.empty())
        fail(t.loc, "tied must name a layer, as in tied = embedding or "
                    "tied = \"wte\"");
      auto it = layers_.find(target);
      if (it == layers_.end())
        fail(t.loc, "tied = " + target + ": no layer named '" + target +
                        "' exists yet (layers are named by kind, e.g. "
                        "'embedding', or by name = \"...\")");
      tied = it->second.weight;
    }
    Val init = initArg(a, 4, makeInit("normal", 0, 0.02, e.loc));
    bool bias = boolArg(a, 2, !tied);
    Val y = linear(x, out, bias, tied ? &*tied : nullptr, init, name, e.loc);
    Val outArg = arg(a, 1);
    if (!outArg.s.empty())
      y.shape.back().name = outArg.s;
    return y;
  };
  B["embedding"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"indices", "num", "dim", "init", "name"}, 3);
    Val idx = tensorArg(a, 0);
    if (!isInt(idx.dtype))
      fail(idx.loc, "embedding() indices must be an integer tensor, got " +
                        describe(idx));
    int64_t num = intArg(a, 1), dim = intArg(a, 2);
    std::string name = layerName("embedding", a, 4);
    Val init = initArg(a, 3, makeInit("normal", 0, 0.02, e.loc));
    Val w = newParam(name + ".weight", "embedding",
                     {Dim{num, arg(a, 1).s}, Dim{dim, arg(a, 2).s}}, init,
                     e.loc);
    layers_[name] = Layer{"embedding", w, e.loc};
    Shape out = idx.shape;
    out.push_back(w.shape[1]);
    RankedTensorType type = tensorType(out, DType::F32, e.loc);
    return tensor(create<GatherOp>(e.loc, type, w.value, idx.value,
                                   b_.getI64IntegerAttr(0)),
                  out, DType::F32, e.loc);
  };
  B["position_embedding"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"length", "dim", "init", "name"}, 2);
    int64_t len = intArg(a, 0), dim = intArg(a, 1);
    std::string name = layerName("position_embedding", a, 3);
    Val init = initArg(a, 2, makeInit("normal", 0, 0.02, e.loc));
    Val w = newParam(name + ".weight", "position_embedding",
                     {Dim{len, arg(a, 0).s}, Dim{dim, arg(a, 1).s}}, init,
                     e.loc);
    layers_[name] = Layer{"position_embedding", w, e.loc};
    return w;
  };
  B["layer_norm"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"x", "eps", "bias", "name"}, 1);
    Val x = tensorArg(a, 0);
    std::string name = layerName("layer_norm", a, 3);
    return layerNorm(x, floatArg(a, 1, 1e-5), boolArg(a, 2, true), name, e.loc);
  };
  B["attention"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env,
                      {"x", "heads", "causal", "bias", "dropout", "init",
                       "proj_init", "name"},
                      2);
    return attention(a, e.loc);
  };
  B["mlp"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env,
                      {"x", "hidden", "act", "bias", "dropout", "init",
                       "proj_init", "name"},
                      2);
    return mlp(a, e.loc);
  };
}

//===----------------------------------------------------------------------===//
// Model parameters, the train section, and the driver
//===----------------------------------------------------------------------===//

void Elaborator::evalModelParams(const ModelDecl &m) {
  for (const Param &p : m.params) {
    Val v;
    auto over = opts_.params.find(p.name);
    if (over != opts_.params.end()) {
      const std::string &text = over->second;
      char *end = nullptr;
      errno = 0;
      long long iv = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0' && errno == 0) {
        v = scalarInt(iv, p.loc);
      } else {
        double dv = std::strtod(text.c_str(), &end);
        if (text == "true" || text == "false") {
          v.kind = Val::Kind::Bool;
          v.b = text == "true";
          v.loc = p.loc;
        } else if (!text.empty() && *end == '\0' && std::isfinite(dv)) {
          v = scalarFloat(dv, p.loc);
        } else {
          fail(p.loc, "--param " + p.name + "=" + text +
                          " is not a number or true/false");
        }
      }
    } else {
      v = eval(*p.defaultValue, paramEnv_);
    }
    if (v.isTensor())
      fail(p.loc, "model parameter '" + p.name + "' must be a constant");
    if (v.kind == Val::Kind::Int)
      v.s = p.name;
    paramEnv_.vars[p.name] = v;
  }
  for (const auto &kv : opts_.params)
    if (!paramEnv_.vars.count(kv.first))
      fail(m.loc, "--param " + kv.first + ": model '" + m.name +
                      "' has no parameter '" + kv.first + "'");
}

void Elaborator::evalTrain() {
  auto num = [&](const Val &v, const std::string &key) {
    if (!v.isNumber())
      fail(v.loc, "train setting '" + key + "' must be a number, got " +
                      describe(v));
    return v.num();
  };
  auto posInt = [&](const Val &v, const std::string &key, int64_t min) {
    if (v.kind != Val::Kind::Int || v.i < min)
      fail(v.loc, "train setting '" + key + "' must be an integer >= " +
                      std::to_string(min) + ", got " +
                      (v.kind == Val::Kind::Int ? std::to_string(v.i)
                                                : describe(v)));
    return v.i;
  };
  // Calls such as adamw(lr = 1e-3) are evaluated here, not as builtins.
  struct Call {
    std::string name;
    SourceLoc loc;
    std::vector<std::pair<std::string, const Expr *>> kwargs;
    std::vector<const Expr *> positional;
  };
  auto asCall = [&](const Expr &e, const std::string &key) {
    Call c;
    c.loc = e.loc;
    if (e.kind == Expr::Kind::Name) {
      c.name = e.text;
      return c;
    }
    if (e.kind != Expr::Kind::Call)
      fail(e.loc, "train setting '" + key + "' expects a name or a call "
                  "such as adamw(lr = 1e-3)");
    c.name = e.text;
    for (size_t i = 0; i < e.args.size(); ++i) {
      if (e.argNames[i].empty())
        c.positional.push_back(e.args[i].get());
      else
        c.kwargs.push_back({e.argNames[i], e.args[i].get()});
    }
    return c;
  };
  auto bindCall = [&](const Call &c,
                      const std::vector<std::pair<const char *, double>> &spec,
                      NamedAttrList &out) {
    std::vector<bool> seen(spec.size(), false);
    auto put = [&](size_t i, const Expr &x) {
      Val v = eval(x, paramEnv_);
      std::string n = spec[i].first;
      if (n == "betas") {
        if (v.kind != Val::Kind::List || v.items.size() != 2 ||
            !v.items[0].isNumber() || !v.items[1].isNumber())
          fail(x.loc, "betas must be a pair such as (0.9, 0.99)");
        double b1 = v.items[0].num(), b2 = v.items[1].num();
        if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
          fail(x.loc, "betas must be in [0, 1)");
        out.set("beta1", b_.getF64FloatAttr(b1));
        out.set("beta2", b_.getF64FloatAttr(b2));
      } else if (n == "nesterov") {
        if (v.kind != Val::Kind::Bool)
          fail(x.loc, "nesterov must be true or false");
        out.set(n, b_.getBoolAttr(v.b));
      } else if (n == "warmup" || n == "decay_steps") {
        if (v.kind != Val::Kind::Int || v.i < 0)
          fail(x.loc, "'" + n + "' of " + c.name + "() must be an integer >= 0");
        out.set(n, b_.getI64IntegerAttr(v.i));
      } else {
        if (!v.isNumber())
          fail(x.loc, "'" + n + "' of " + c.name + "() must be a number, got " +
                          describe(v));
        double d = v.num();
        if (!(d >= 0) || !std::isfinite(d))
          fail(x.loc, "'" + n + "' of " + c.name + "() must be a non-negative number");
        out.set(n, b_.getF64FloatAttr(d));
      }
      seen[i] = true;
    };
    if (c.positional.size() > spec.size())
      fail(c.loc, c.name + "() takes at most " + std::to_string(spec.size()) +
                      " arguments");
    for (size_t i = 0; i < c.positional.size(); ++i)
      put(i, *c.positional[i]);
    for (const auto &[k, x] : c.kwargs) {
      size_t i = 0;
      while (i < spec.size() && k != spec[i].first)
        ++i;
      if (i == spec.size()) {
        std::string names;
        for (const auto &s : spec)
          names += (names.empty() ? "" : ", ") + std::string(s.first);
        fail(x->loc, c.name + "() has no setting '" + k + "'; it takes " +
                         names);
      }
      if (seen[i])
        fail(x->loc, "'" + k + "' is given twice");
      put(i, *x);
    }
    for (size_t i = 0; i < spec.size(); ++i) {
      if (seen[i])
        continue;
      std::string n = spec[i].first;
      if (std::isnan(spec[i].second))
        fail(c.loc, c.name + "() needs '" + n + "'");
      if (n == "betas") {
        out.set("beta1", b_.getF64FloatAttr(0.9));
        out.set("beta2", b_.getF64FloatAttr(0.999));
      } else if (n == "nesterov") {
        out.set(n, b_.getBoolAttr(false));
      } else if (n == "warmup" || n == "decay_steps") {
        if (spec[i].second >= 0)
          out.set(n, b_.getI64IntegerAttr(int64_t(spec[i].second)));
      } else {
        out.set(n, b_.getF64FloatAttr(spec[i].second));
      }
    }
  };
  const double req = std::nan("");
  static const char *known =
      "batch, steps, optimizer, schedule, precision, seed, grad_clip, "
      "grad_accum, recompute, eval_interval, eval_steps, log_interval, "
      "checkpoint_interval, data, val_data";
  for (const TrainEntry &t : ast_.train) {
    const std::string &k = t.key;
    if (k == "optimizer") {
      Call c = asCall(*t.value, k);
      NamedAttrList o;
      o.set("name", b_.getStringAttr(c.name));
      if (c.name == "sgd")
        bindCall(c, {{"lr", req}, {"momentum", 0}, {"nesterov", 0},
                     {"weight_decay", 0}}, o);
      else if (c.name == "adam")
        bindCall(c, {{"lr", req}, {"betas", 0}, {"eps", 1e-8},
                     {"weight_decay", 0}}, o);
      else if (c.name == "adamw")
        bindCall(c, {{"lr", req}, {"betas", 0}, {"eps", 1e-8},
                     {"weight_decay", 0.01}}, o);
      else
        fail(t.value->loc, "unknown optimizer '" + c.name +
                               "'; expected sgd, adam or adamw");
      trainAttrs_.set(k, o.getDictionary(&ctx_));
    } else if (k == "schedule") {
      Call c = asCall(*t.value, k);
      NamedAttrList o;
      o.set("name", b_.getStringAttr(c.name));
      if (c.name == "constant")
        bindCall(c, {}, o);
      else if (c.name == "linear_warmup")
        bindCall(c, {{"warmup", req}}, o);
      else if (c.name == "cosine")
        bindCall(c, {{"warmup", 0}, {"min_lr", 0}, {"decay_steps", -1}}, o);
      else
        fail(t.value->loc, "unknown schedule '" + c.name +
                               "'; expected constant, linear_warmup or cosine");
      trainAttrs_.set(k, o.getDictionary(&ctx_));
    } else if (k == "precision") {
      const Expr &e = *t.value;
      std::string p = e.kind == Expr::Kind::Name || e.kind == Expr::Kind::String
                          ? e.text : "";
      if (p != "fp32" && p != "bf16" && p != "fp16")
        fail(e.loc, "precision must be fp32, bf16 or fp16");
      trainAttrs_.set(k, b_.getStringAttr(p));
    } else if (k == "data" || k == "val_data") {
      Val v = eval(*t.value, paramEnv_);
      if (v.kind != Val::Kind::Str || v.s.empty())
        fail(v.loc, "train setting '" + k + "' must be a path string");
      trainAttrs_.set(k, b_.getStringAttr(v.s));
    } else if (k == "recompute") {
      Val v = eval(*t.value, paramEnv_);
      if (v.kind != Val::Kind::Bool)
        fail(v.loc, "recompute must be true or false");
      trainAttrs_.set(k, b_.getBoolAttr(v.b));
    } else if (k == "grad_clip") {
      Val v = eval(*t.value, paramEnv_);
      double d = num(v, k);
      if (!(d >= 0))
        fail(v.loc, "grad_clip must be >= 0 (0 disables clipping)");
      trainAttrs_.set(k, b_.getF64FloatAttr(d));
    } else if (k == "batch" || k == "steps" || k == "seed" ||
               k == "grad_accum" || k == "eval_interval" ||
               k == "eval_steps" || k == "log_interval" ||
               k == "checkpoint_interval") {
      Val v = eval(*t.value, paramEnv_);
      int64_t min = k == "seed" || k == "checkpoint_interval" ? 0 : 1;
      int64_t n = posInt(v, k, min);
      if (k == "batch") {
        if (n > kMaxDimSize)
          fail(v.loc, "batch is too large");
        trainBatch_ = n;
      }
      trainAttrs_.set(k, b_.getI64IntegerAttr(n));
    } else {
      SourceLoc l = t.loc;
      l.length = k.size();
      std::string best;
      unsigned bestDist = 3;
      llvm::SmallVector<llvm::StringRef> names;
      llvm::StringRef(known).split(names, ", ");
      for (llvm::StringRef n : names) {
        unsigned d = llvm::StringRef(k).edit_distance(n, true, bestDist);
        if (d < bestDist)
          bestDist = d, best = n.str();
      }
      fail(l, "unknown train setting '" + k + "'" +
                  (best.empty() ? "" : "; did you mean '" + best + "'?") +
                  " (known: " + known + ")");
    }
  }
}

OwningOpRef<ModuleOp> Elaborator::run() {
  const ModelDecl &m = *ast_.model;
  registerBuiltins();
  Location mloc = loc(m.loc);
  module_ = ModuleOp::create(mloc);
  b_.setInsertionPointToEnd(module_->getBody());
  func_ = b_.create<func::FuncOp>(mloc, "forward", b_.getFunctionType({}, {}));
  entry_ = func_.addEntryBlock();
  b_.setInsertionPointToEnd(entry_);

  for (const DefDecl &d : ast_.defs)
    if (builtins_.count(d.name)) {
      SourceLoc l = d.loc;
      l.length = d.name.size();
      fail(l, "def '" + d.name + "' would hide the builtin '" + d.name +
                  "'; pick another name");
    }
  evalModelParams(m);
  evalTrain();

  Env modelEnv;
  modelEnv.parent = &paramEnv_;
  std::optional<Val> ret;
  execBlock(m.body, modelEnv, /*inDef=*/false, /*topLevel=*/true, ret);

  for (const auto &kv : opts_.dims) {
    if (paramEnv_.vars.count(kv.first))
      fail(m.loc, "--dim " + kv.first + ": '" + kv.first + "' is a model "
                  "parameter; use --param " + kv.first + "=" +
                  std::to_string(kv.second));
    if (!usedDims_.count(kv.first))
      fail(m.loc, "--dim " + kv.first + ": model '" + m.name +
                  "' has no free dimension '" + kv.first + "'");
  }
  auto lossIt = modelEnv.vars.find("loss");
  if (lossIt == modelEnv.vars.end()) {
    SourceLoc l = m.loc;
    l.length = m.name.size();
    fail(l, "model '" + m.name + "' defines no 'loss'; assign the training "
            "objective to a variable named loss (e.g. loss = "
            "cross_entropy(logits, targets))");
  }
  const Val &loss = lossIt->second;
  if (!loss.isTensor() || !loss.shape.empty() || !isFloat(loss.dtype))
    fail(loss.loc, "'loss' must be a floating-point scalar tensor, got " +
                       describe(loss) + "; reduce it with mean() or sum()");
  SmallVector<mlir::Value> results{loss.value};
  SmallVector<StringRef> resultNames{"loss"};
  auto logitsIt = modelEnv.vars.find("logits");
  if (logitsIt != modelEnv.vars.end()) {
    const Val &logits = logitsIt->second;
    if (!logits.isTensor() || !isFloat(logits.dtype))
      fail(logits.loc, "'logits' must be a floating-point tensor, got " +
                           describe(logits));
    results.push_back(logits.value);
    resultNames.push_back("logits");
  }
  b_.create<func::ReturnOp>(mloc, results);

  SmallVector<Type> argTypes(entry_->getArgumentTypes());
  SmallVector<Type> resultTypes;
  for (mlir::Value v : results)
    resultTypes.push_back(v.getType());
  func_.setFunctionType(b_.getFunctionType(argTypes, resultTypes));
  SmallVector<DictionaryAttr> argAttrs;
  for (NamedAttrList &a : paramAttrs_)
    argAttrs.push_back(a.getDictionary(&ctx_));
  for (NamedAttrList &a : inputAttrs_)
    argAttrs.push_back(a.getDictionary(&ctx_));
  func_.setAllArgAttrs(argAttrs);
  for (size_t i = 0; i < resultNames.size(); ++i)
    func_.setResultAttr(i, KilnDialect::kOutputAttr,
                        b_.getStringAttr(resultNames[i]));

  ModuleOp mod = *module_;
  mod->setAttr(KilnDialect::kModelAttr, b_.getStringAttr(m.name));
  mod->setAttr(KilnDialect::kSourceAttr, b_.getStringAttr(file_.name()));
  mod->setAttr(KilnDialect::kDimsAttr, dimBindings_.getDictionary(&ctx_));
  if (ast_.hasTrain)
    mod->setAttr(KilnDialect::kTrainAttr, trainAttrs_.getDictionary(&ctx_));
  return std::move(module_);
}

} // namespace

OwningOpRef<ModuleOp> elaborate(MLIRContext &ctx, const SourceFile &file,
                                const FileAST &ast,
                                const FrontendOptions &options,
                                DiagEngine &diags) {
  ctx.loadDialect<KilnDialect, func::FuncDialect>();
  Elaborator e(ctx, file, ast, options, diags);
  try {
    return e.run();
  } catch (const Abort &) {
    return nullptr;
  }
}

OwningOpRef<ModuleOp> buildModule(MLIRContext &ctx, const SourceFile &file,
                                  const FrontendOptions &options,
                                  DiagEngine &diags) {
  std::optional<FileAST> ast = parse(file, diags);
  if (!ast)
    return nullptr;
  return elaborate(ctx, file, *ast, options, diags);
}

} // namespace kiln::frontend
