//===- Eval.cpp - Expressions, calls and statements -----------------------===//
//
// The tree walk: names, literals, operators and lists; calls of builtins
// and of `def` blocks (inlined, with their own scope); input declarations
// with free and batch dimensions; assignments, `repeat` and `return`.
//
//===----------------------------------------------------------------------===//
#include "frontend/elaborate/Elaborator.h"

#include <algorithm>
#include <limits>

namespace kiln::frontend::elab {

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
    if (std::optional<DType> t = parseTypeName(e.text)) {
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
  case Expr::Kind::Index:
    return index(e, env);
  case Expr::Kind::Slice:
  case Expr::Kind::Ellipsis:
    fail(e.loc, "a slice or '...' is only allowed inside an index, as in "
                "x[:, 1:3]");
  }
  fail(e.loc, "unsupported expression");
}

Val Elaborator::evalBinary(const Expr &e, Env &env) {
  Val a = eval(*e.args[0], env);
  Val c = eval(*e.args[1], env);
  return arith(e.text, a, c, e.loc);
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
    if (precisionArg_ && e.args[k].get() == precisionArg_)
      continue; // `precision = fp32`, taken by call()
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
    const Expr &x = *e.args[k];
    const Val *bound = x.kind == Expr::Kind::Name ? env.lookup(x.text) : nullptr;
    if (e.text == "linear" && a.names[idx] == "tied" && x.kind == Expr::Kind::Name &&
        ((layers_.count(x.text) && (!bound || bound->isTensor())) ||
         (!bound && !builtins_.count(x.text) && !defs_.count(x.text)))) {
      // `tied = NAME` names a layer, as `name = "NAME"` gave it (a variable
      // of the same name holding a tensor, which cannot be tied to, does
      // not hide it; one holding a string, a def's parameter, is used as
      // it is); linear() says when no layer has that name.
      Val v;
      v.kind = Val::Kind::Str;
      v.s = x.text;
      v.loc = x.loc;
      a.vals[idx] = v;
      continue;
    }
    a.vals[idx] = eval(x, env);
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
  // `precision = fp32` on any call (a def keeps its own parameter of that
  // name): the ops the call builds, its arguments' included, stay fp32
  // under mixed precision. The fp32_layers tag set by a layer's name
  // (layerName) lasts until the call returns, too.
  const Expr *outerArg = precisionArg_;
  std::string outerFp32 = tagger_.fp32;
  const Expr *mine = nullptr;
  bool defHasIt = def != defs_.end() &&
                  llvm::any_of(def->second->params,
                               [](const Param &p) { return p.name == "precision"; });
  for (size_t k = 0; k < e.args.size() && !defHasIt; ++k) {
    if (e.argNames[k] != "precision")
      continue;
    const Expr &v = *e.args[k];
    if ((v.kind != Expr::Kind::Name && v.kind != Expr::Kind::String) || v.text != "fp32")
      fail(v.loc, "precision = ... on a call must be fp32 (keeps the call's ops "
                  "in fp32 under mixed precision; the train section's precision "
                  "chooses bf16 or fp16)");
    mine = &v;
    if (tagger_.fp32.empty())
      tagger_.fp32 = e.text + " at line " + std::to_string(e.loc.line);
  }
  precisionArg_ = mine;
  auto restore = [&] {
    precisionArg_ = outerArg;
    tagger_.fp32 = outerFp32;
  };
  Val out;
  if (def != defs_.end()) {
    out = callDef(*def->second, e, env);
    restore();
    return out;
  }
  auto it = builtins_.find(e.text);
  if (it == builtins_.end()) {
    SourceLoc l = e.loc;
    l.length = e.text.size();
    if (env.lookup(e.text))
      fail(l, "'" + e.text + "' is a variable, not a function");
    fail(l, "unknown function '" + e.text + "'" + suggest(e.text, &env));
  }
  out = it->second(e, env);
  restore();
  return out;
}

Val Elaborator::callDef(const DefDecl &def, const Expr &e, Env &env) {
  if (callDepth_ >= kMaxCallDepth)
    fail(e.loc, "calls nest deeper than " + std::to_string(kMaxCallDepth) +
                    " (is '" + def.name + "' recursive?)");
  Env local;
  local.parent = &paramEnv_;
  size_t positional = 0;
  std::vector<bool> bound(def.params.size(), false);
  const Expr *skip = precisionArg_;
  precisionArg_ = nullptr; // the def's body makes calls of its own
  for (size_t k = 0; k < e.args.size(); ++k) {
    if (skip && e.args[k].get() == skip)
      continue; // `precision = fp32`, taken by call()
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
  return inlineDef(def, local, e.loc);
}

Val Elaborator::callDefOn(const DefDecl &def, const Val &x, SourceLoc l) {
  if (callDepth_ >= kMaxCallDepth)
    fail(l, "calls nest deeper than " + std::to_string(kMaxCallDepth) +
                " (is '" + def.name + "' recursive?)");
  Env local;
  local.parent = &paramEnv_;
  local.vars[def.params[0].name] = x;
  for (size_t i = 1; i < def.params.size(); ++i)
    local.vars[def.params[i].name] = eval(*def.params[i].defaultValue, local);
  return inlineDef(def, local, l);
}

Val Elaborator::inlineDef(const DefDecl &def, Env &local, SourceLoc l) {
  // Layers inside the def are named <scope>.<def>[_n].<layer>.
  std::string base = joinPrefix();
  int &count = nameCounts_[base + "|def:" + def.name];
  prefix_.push_back(def.name + (count ? "_" + std::to_string(count) : ""));
  ++count;
  std::string outerFp32 = tagger_.fp32;
  matchFp32Layers(joinPrefix());
  callStack_.push_back(loc(l));
  ++callDepth_;
  std::optional<Val> ret;
  execBlock(def.body, local, /*inDef=*/true, /*topLevel=*/false, ret);
  --callDepth_;
  callStack_.pop_back();
  prefix_.pop_back();
  tagger_.fp32 = outerFp32;
  if (!ret)
    fail(l, "'" + def.name + "' returned no value; end it with "
                "'return EXPR'");
  ret->loc = l;
  return *ret;
}

//===----------------------------------------------------------------------===//
// Statements
//===----------------------------------------------------------------------===//

Val Elaborator::newInput(const std::string &name, const Shape &shape, DType t,
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
  std::optional<DType> t = parseTypeName(s.dtype);
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

void Elaborator::assign(const std::string &name, SourceLoc nameLoc, Val v,
                        Env &env, bool inDef) {
  if (paramEnv_.vars.count(name) && !env.vars.count(name) &&
      &env != &paramEnv_ && !inDef) {
    nameLoc.length = name.size();
    fail(nameLoc, "'" + name + "' is a model parameter and cannot be "
                  "assigned; pick another name");
  }
  env.vars[name] = std::move(v);
}

void Elaborator::execBlock(const Block &block, Env &env, bool inDef,
                           bool topLevel, std::optional<Val> &ret) {
  for (const Stmt &s : block) {
    if (ret)
      return;
    if (++steps_ > opts_.maxSteps)
      fail(s.loc, "the model takes more than " + std::to_string(opts_.maxSteps) +
                      " statements to evaluate; reduce repeat counts");
    switch (s.kind) {
    case Stmt::Kind::Input:
      if (inDef || !topLevel)
        fail(s.loc, "inputs are declared at the top level of the model, not "
                    "inside a def or repeat");
      declareInput(s, env);
      break;
    case Stmt::Kind::Assign:
      assign(s.name, s.nameLoc, eval(*s.value, env), env, inDef);
      break;
    case Stmt::Kind::Unpack: {
      Val v = eval(*s.value, env);
      size_t n = s.names.size();
      std::string names;
      for (size_t k = 0; k < n; ++k)
        names += (k ? ", " : "") + s.names[k];
      if (v.kind != Val::Kind::List)
        fail(s.value->loc, "cannot unpack one value (" + describe(v) +
                               ") into " + std::to_string(n) + " names (" +
                               names + "); only a tuple, as a def returns "
                               "with 'return a, b', can be unpacked");
      if (v.items.size() != n)
        fail(s.value->loc, "cannot unpack " + std::to_string(v.items.size()) +
                               " values into " + std::to_string(n) +
                               " names (" + names + ")");
      for (size_t k = 0; k < n; ++k)
        assign(s.names[k], s.nameLocs[k], v.items[k], env, inDef);
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
        if (++steps_ > opts_.maxSteps)
          fail(s.loc, "the model takes more than " + std::to_string(opts_.maxSteps) +
                          " statements to evaluate; reduce repeat counts");
        prefix_.push_back(scope + "." + std::to_string(i));
        tagger_.tag = joinPrefix();
        std::string outerFp32 = tagger_.fp32;
        matchFp32Layers(tagger_.tag);
        if (!s.index.empty()) {
          // `repeat n as h, i`: i names the iteration (0 .. n-1) in the
          // body, e.g. for `stage i * 2 // n { ... }`.
          if (paramEnv_.vars.count(s.index))
            fail(s.indexLoc, "'" + s.index + "' is a model parameter; name the "
                             "repeat index differently");
          env.vars[s.index] = scalarInt(i, s.indexLoc, s.index);
        }
        execBlock(s.body, env, inDef, /*topLevel=*/false, ret);
        tagger_.fp32 = outerFp32;
        prefix_.pop_back();
      }
      tagger_.tag = outerTag;
      break;
    }
    case Stmt::Kind::Stage: {
      // Layers placed by hand (docs/parallel.md "Pipeline parallelism"):
      // every op the block builds runs on pipeline stage n.
      Val n = eval(*s.value, env);
      if (n.kind != Val::Kind::Int || n.i < 0 || n.i >= kMaxStages)
        fail(s.value->loc, "stage needs a pipeline stage from 0 to " +
                               std::to_string(kMaxStages - 1) + ", got " +
                               (n.kind == Val::Kind::Int ? std::to_string(n.i)
                                                         : describe(n)));
      int64_t outer = tagger_.stage;
      // One stage per op: a stage block inside another would silently
      // move the inner ops off the outer block's stage.
      if (outer >= 0)
        fail(s.loc, "a stage block inside stage " + std::to_string(outer) +
                        "'s block: every op runs on one stage; close the outer block "
                        "first, or put this block beside it");
      if (n.i > maxStage_)
        maxStage_ = n.i, maxStageLoc_ = s.value->loc;
      tagger_.stage = n.i;
      execBlock(s.body, env, inDef, /*topLevel=*/false, ret);
      tagger_.stage = outer;
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

} // namespace kiln::frontend::elab
