//===- Layers.cpp - The layer library -------------------------------------===//
//
// Layers with parameters: param, linear, embedding, position_embedding,
// layer_norm, attention and mlp; the initialisers (normal, uniform, zeros,
// ones); and how parameters and layers are named.
//
//===----------------------------------------------------------------------===//
#include "frontend/elaborate/Elaborator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::frontend::elab {

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

std::string Elaborator::joinPrefix() const {
  std::string out;
  for (const std::string &p : prefix_)
    out += (out.empty() ? "" : ".") + p;
  return out;
}

std::string Elaborator::layerName(const std::string &kind, const Args &args,
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
  currentLayer_ = LayerCall{kind, full, args.callLoc};
  matchFp32Layers(full);
  return full;
}

namespace {
/// Glob match: `*` stands for any characters (dots included).
bool globMatch(llvm::StringRef glob, llvm::StringRef s) {
  if (glob.empty())
    return s.empty();
  if (glob.front() == '*') {
    for (size_t i = 0; i <= s.size(); ++i)
      if (globMatch(glob.drop_front(), s.drop_front(i)))
        return true;
    return false;
  }
  return !s.empty() && glob.front() == s.front() &&
         globMatch(glob.drop_front(), s.drop_front());
}
} // namespace

void Elaborator::matchFp32Layers(const std::string &name) {
  if (fp32Layers_.empty())
    return;
  scopeNames_.push_back(name);
  for (Fp32Pattern &p : fp32Layers_) {
    if (!globMatch(p.glob, name))
      continue;
    p.used = true;
    if (tagger_.fp32.empty())
      tagger_.fp32 = name;
  }
}

void Elaborator::checkFp32Layers() {
  for (const Fp32Pattern &p : fp32Layers_) {
    if (p.used)
      continue;
    std::string best;
    unsigned bestDist = std::max<unsigned>(3, p.glob.size() / 3);
    for (const std::string &n : scopeNames_) {
      unsigned d = llvm::StringRef(p.glob).edit_distance(n, true, bestDist);
      if (d < bestDist)
        bestDist = d, best = n;
    }
    std::string known;
    for (size_t i = 0; i < scopeNames_.size() && i < 8; ++i)
      known += (i ? ", " : "") + scopeNames_[i];
    if (scopeNames_.size() > 8)
      known += ", ...";
    fail(p.loc, "fp32_layers: '" + p.glob + "' matches no layer, repeat iteration or def call" +
                    (best.empty() ? "" : "; did you mean '" + best + "'?") +
                    (known.empty() ? "" : " (names: " + known + ")"));
  }
}

DictionaryAttr Elaborator::initAttr(const Val &init) {
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

Val Elaborator::makeInit(const std::string &kind, double p0, double p1,
                         SourceLoc l) {
  Val v;
  v.kind = Val::Kind::Init;
  v.s = kind;
  v.p0 = p0;
  v.p1 = p1;
  v.loc = l;
  return v;
}

Val Elaborator::newParam(const std::string &name, const std::string &layerKind,
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
  paramOwners_.push_back(currentLayer_);
  return tensor(arg, shape, DType::F32, l);
}

//===----------------------------------------------------------------------===//
// Layers
//===----------------------------------------------------------------------===//

namespace {
/// kiln.tp = {dim = D, outer = K} (kiln-tensor-parallel reads it).
mlir::Attribute tpHintAttr(mlir::Builder &b, int64_t dim, int64_t outer) {
  return b.getDictionaryAttr({b.getNamedAttr("dim", b.getI64IntegerAttr(dim)),
                              b.getNamedAttr("outer", b.getI64IntegerAttr(outer))});
}
} // namespace

mlir::Attribute Elaborator::tpHint(int64_t dim, int64_t outer) {
  return tpHintAttr(b_, dim, outer);
}

Val Elaborator::linear(const Val &x, int64_t out, bool bias, const Val *tied,
                       const Val &init, const std::string &name, SourceLoc l,
                       TpSplit tp) {
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
    if (tp != TpSplit::None)
      paramAttrs_.back().set("kiln.tp", tpHint(tp == TpSplit::Row ? 1 : 0,
                                                tp == TpSplit::ColumnQkv ? 3 : 1));
  }
  Val y = matmul(x, w, false, true, l);
  y.shape.back().name = tied ? tied->shape[0].name : "";
  if (bias) {
    Val bv = newParam(name + ".bias", "linear", {Dim{out, ""}},
                      makeInit("zeros", 0, 0, l), l);
    if (!tied && (tp == TpSplit::Column || tp == TpSplit::ColumnQkv))
      paramAttrs_.back().set("kiln.tp", tpHint(0, tp == TpSplit::ColumnQkv ? 3 : 1));
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
                   (name) + ".qkv", l, TpSplit::ColumnQkv);
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
  y = linear(y, width.size, bias, nullptr, projInit, name + ".proj", l,
             TpSplit::Row);
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
  Val h = linear(x, hidden, bias, nullptr, init, name + ".fc", l,
                 TpSplit::Column);
  LayerCall self = currentLayer_;
  h = activation(act, h, l); // a def activation may hold layers of its own
  currentLayer_ = self;
  Val y = linear(h, width, bias, nullptr, projInit, name + ".proj", l,
                 TpSplit::Row);
  y.shape.back() = x.shape.back();
  return dropout(y, p, l);
}

//===----------------------------------------------------------------------===//
// The layer builtin table
//===----------------------------------------------------------------------===//

void Elaborator::registerLayerBuiltins() {
  auto &B = builtins_;
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
    Args a = bindArgs(e, env, {"x", "out", "bias", "tied", "init", "name", "parallel"}, 2);
    Val x = tensorArg(a, 0);
    int64_t out = intArg(a, 1);
    std::string name = layerName("linear", a, 5);
    std::optional<Val> tied;
    if (a.has(3)) {
      const Val &t = arg(a, 3);
      std::string target = t.kind == Val::Kind::Str || t.kind == Val::Kind::Func
                               ? t.s : "";
      if (target.empty() && t.isTensor())
        fail(t.loc, "tied must name a layer, not a tensor (a layer's output): give the "
                    "layer's name, as in tied = embedding or tied = \"wte\" (its name = "
                    "\"...\")");
      if (target.empty())
        fail(t.loc, "tied must name a layer, as in tied = embedding or "
                    "tied = \"wte\"");
      auto it = layers_.find(target);
      if (it == layers_.end()) {
        // The layers whose weight a linear layer could share ([out, in]).
        std::vector<std::string> names;
        for (const auto &[n, l] : layers_)
          if (l.weight.shape.size() == 2)
            names.push_back(n);
        std::sort(names.begin(), names.end());
        std::string known;
        for (size_t i = 0; i < names.size() && i < 8; ++i)
          known += (i ? ", " : "") + names[i];
        if (names.size() > 8)
          known += ", ...";
        fail(t.loc, "tied = " + target + ": no layer named '" + target +
                        "' exists yet (layers are named by kind, e.g. "
                        "'embedding', or by name = \"...\")" +
                        (known.empty() ? std::string() : "; the layers so far: " + known));
      }
      tied = it->second.weight;
    }
    Val init = initArg(a, 4, makeInit("normal", 0, 0.02, e.loc));
    bool bias = boolArg(a, 2, !tied);
    TpSplit tp = TpSplit::None;
    if (a.has(6)) {
      const Val &p = arg(a, 6);
      std::string mode = p.kind == Val::Kind::Str ? p.s : "";
      if (mode == "column")
        tp = TpSplit::Column;
      else if (mode == "row")
        tp = TpSplit::Row;
      else if (mode != "none")
        fail(p.loc, "parallel must be \"column\" (split the output features over the "
                    "tp axis), \"row\" (split the input features) or \"none\"");
      if (tied && tp != TpSplit::None)
        fail(p.loc, "a tied linear layer shares its weight with another layer; "
                    "leave out parallel = (or split the layer it is tied to)");
    }
    Val y = linear(x, out, bias, tied ? &*tied : nullptr, init, name, e.loc, tp);
    Val outArg = arg(a, 1);
    if (!outArg.s.empty())
      y.shape.back().name = outArg.s;
    return y;
  };
  B["embedding"] = [this](const Expr &e, Env &env) {
    Args a = bindArgs(e, env, {"indices", "num", "dim", "init", "name"}, 3);
    Val idx = tensorArg(a, 0);
    if (!isInteger(idx.dtype))
      fail(idx.loc, "embedding() indices must be an integer tensor, got " +
                        describe(idx));
    int64_t num = intArg(a, 1), dim = intArg(a, 2);
    std::string name = layerName("embedding", a, 4);
    Val init = initArg(a, 3, makeInit("normal", 0, 0.02, e.loc));
    Val w = newParam(name + ".weight", "embedding",
                     {Dim{num, arg(a, 1).s}, Dim{dim, arg(a, 2).s}}, init,
                     e.loc);
    // Vocabulary-parallel under tensor parallelism (when tp divides num).
    paramAttrs_.back().set("kiln.tp", tpHint(0, 1));
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
  B["param"] = [this](const Expr &e, Env &env) {
    // A free trainable tensor: param(shape, init = normal(0.02), name).
    Args a = bindArgs(e, env, {"shape", "init", "name"}, 1);
    const Val &sv = arg(a, 0);
    std::vector<Val> dims;
    if (sv.kind == Val::Kind::Int)
      dims.push_back(sv);
    else if (sv.kind == Val::Kind::List)
      dims = sv.items;
    else
      fail(sv.loc, "param() needs a shape: a list of integers such as "
                   "[d] or [heads, d], got " + describe(sv));
    Shape shape;
    for (const Val &d : dims) {
      if (d.kind != Val::Kind::Int)
        fail(d.loc, "param() shape: expected an integer, got " + describe(d));
      if (d.i < 1 || d.i > kMaxDimSize)
        fail(d.loc, "param() dimension " + std::to_string(d.i) +
                        " is out of range (expected 1 to " +
                        std::to_string(kMaxDimSize) + ")");
      shape.push_back(Dim{d.i, d.s});
    }
    std::string name = layerName("param", a, 2);
    Val init = initArg(a, 1, makeInit("normal", 0, 0.02, e.loc));
    Val w = newParam(name + ".weight", "param", shape, init, e.loc);
    layers_[name] = Layer{"param", w, e.loc};
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

} // namespace kiln::frontend::elab
