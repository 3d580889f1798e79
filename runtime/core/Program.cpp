//===- Program.cpp - Program JSON and its validation ----------------------===//
#include "runtime/core/Program.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::program {

using json = nlohmann::ordered_json;

namespace {
constexpr const char *kRoles[] = {"param", "state", "input", "output", "temp"};
constexpr const char *kKinds[] = {"kernel", "gemm", "copy"};
} // namespace

const char *roleName(Role r) { return kRoles[int(r)]; }

int64_t Buffer::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

const Function *Program::function(const std::string &name) const {
  for (const Function &f : functions)
    if (f.name == name)
      return &f;
  return nullptr;
}

int Program::persistent(const std::string &name) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if ((buffers[i].role == Role::Param || buffers[i].role == Role::State) &&
        buffers[i].name == name)
      return int(i);
  return -1;
}

const char *activationName(LtEpilogue::Activation a) {
  switch (a) {
  case LtEpilogue::Activation::None: return "none";
  case LtEpilogue::Activation::Relu: return "relu";
  case LtEpilogue::Activation::GeluTanh: return "gelu_tanh";
  }
  return "none";
}

std::string gemmLabel(const GemmParams &g) {
  return fmt::format("gemm {}{}x{}x{} {}{}{}", g.batch > 1 ? fmt::format("{}x", g.batch) : "",
                     g.m, g.n, g.k, g.transposeLhs ? 'T' : 'N', g.transposeRhs ? 'T' : 'N',
                     g.dtype == DType::F32 ? "" : std::string(" ") + dtypeName(g.dtype));
}

std::string Program::toJson() const {
  json j;
  j["persistent_bytes"] = persistentBytes;
  j["arena_bytes"] = arenaBytes;
  json bs = json::array();
  for (const Buffer &b : buffers)
    bs.push_back({{"name", b.name}, {"role", roleName(b.role)},
                  {"dtype", dtypeName(b.dtype)}, {"shape", b.shape},
                  {"offset", b.offset}, {"bytes", b.bytes}});
  j["buffers"] = bs;
  json ks = json::array();
  for (const Kernel &k : kernels)
    ks.push_back({{"symbol", k.symbol}, {"op", k.op}, {"num_args", k.numArgs},
                  {"chunks", k.chunks}, {"ops", k.ops}, {"kind", k.kind},
                  {"flops", k.flops},
                  {"in_place_safe", k.inPlaceSafe}, {"writes", k.writes}, {"num_inputs", k.numInputs},
                  {"lowest_float", dtypeName(k.lowestFloat)},
                  {"locs", k.locs}});
  j["kernels"] = ks;
  json fs = json::array();
  for (const Function &f : functions) {
    json steps = json::array();
    for (const Step &s : f.steps) {
      json e = {{"kind", kKinds[s.kind]}, {"args", s.args}, {"loc", s.loc}};
      if (s.kind == Step::Kernel)
        e["kernel"] = s.kernel;
      if (s.kind == Step::Gemm)
        e["gemm"] = {{"batch", s.gemm.batch}, {"m", s.gemm.m}, {"n", s.gemm.n},
                     {"k", s.gemm.k}, {"transpose_lhs", s.gemm.transposeLhs},
                     {"transpose_rhs", s.gemm.transposeRhs},
                     {"lhs_batched", s.gemm.lhsBatched},
                     {"rhs_batched", s.gemm.rhsBatched},
                     {"dtype", dtypeName(s.gemm.dtype)}};
      if (s.kind == Step::Gemm && s.epilogue >= 0)
        e["epilogue"] = {{"kernel", s.epilogue}, {"args", s.epilogueArgs}};
      if (s.kind == Step::Gemm && s.lt.valid())
        e["lt_epilogue"] = {{"bias", s.lt.bias},
                            {"activation", activationName(s.lt.activation)},
                            {"out", s.lt.out},
                            {"aux", s.lt.aux}};
      if (s.kind == Step::Gemm && s.gemm.heads > 0) {
        auto layout = [](const MatrixLayout &l) {
          return json{{"outer", l.outer}, {"inner", l.inner}, {"ld", l.ld}};
        };
        e["gemm"]["heads"] = s.gemm.heads;
        e["gemm"]["lhs_layout"] = layout(s.gemm.lhsLayout);
        e["gemm"]["rhs_layout"] = layout(s.gemm.rhsLayout);
        e["gemm"]["out_layout"] = layout(s.gemm.outLayout);
      }
      steps.push_back(e);
    }
    fs.push_back({{"name", f.name}, {"args", f.args}, {"results", f.results},
                  {"scratch_bytes", f.scratchBytes}, {"steps", steps}});
  }
  j["functions"] = fs;
  return j.dump(1);
}

namespace {
struct Reader {
  std::string origin;
  std::string error;
  bool fail(const std::string &why) {
    if (error.empty())
      error = why;
    return false;
  }
  bool i64(const json &j, const char *key, int64_t &out, int64_t lo = 0,
           int64_t hi = int64_t(1) << 50) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
      return fail(fmt::format("'{}' is missing or not an integer", key));
    out = j[key].get<int64_t>();
    if (out < lo || out > hi)
      return fail(fmt::format("'{}' = {} is out of range", key, out));
    return true;
  }
  bool str(const json &j, const char *key, std::string &out) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
      return fail(fmt::format("'{}' is missing or not a string", key));
    out = j[key].get<std::string>();
    return true;
  }
  bool boolean(const json &j, const char *key, bool &out) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_boolean())
      return fail(fmt::format("'{}' is missing or not a boolean", key));
    out = j[key].get<bool>();
    return true;
  }
  bool ints(const json &j, const char *key, std::vector<int> &out, int limit) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_array())
      return fail(fmt::format("'{}' is missing or not an array", key));
    for (const json &e : j[key]) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= limit)
        return fail(fmt::format("'{}' holds a bad index", key));
      out.push_back(int(e.get<int64_t>()));
    }
    return true;
  }
};
} // namespace

Expected<Program> Program::parse(const std::string &text, const std::string &origin) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "{}: the buffer plan is invalid: {}; recompile the model with kilnc",
        origin, why));
  };
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return bad("it is not a JSON object");
  Reader r{origin, {}};
  Program p;
  if (!r.i64(j, "persistent_bytes", p.persistentBytes) ||
      !r.i64(j, "arena_bytes", p.arenaBytes))
    return bad(r.error);
  if (p.persistentBytes > p.arenaBytes)
    return bad("the persistent region exceeds the arena");
  if (!j.contains("buffers") || !j["buffers"].is_array() ||
      !j.contains("kernels") || !j["kernels"].is_array() ||
      !j.contains("functions") || !j["functions"].is_array())
    return bad("buffers, kernels or functions are missing");
  for (const json &e : j["buffers"]) {
    Buffer b;
    std::string dtype, role;
    if (!r.str(e, "name", b.name) || !r.str(e, "role", role) ||
        !r.str(e, "dtype", dtype) || !r.i64(e, "offset", b.offset) ||
        !r.i64(e, "bytes", b.bytes))
      return bad(r.error);
    if (!parseDType(dtype, b.dtype))
      return bad("unknown dtype '" + dtype + "'");
    int ri = -1;
    for (int k = 0; k < 5; ++k)
      if (role == kRoles[k])
        ri = k;
    if (ri < 0)
      return bad("unknown buffer role '" + role + "'");
    b.role = Role(ri);
    if (!e.contains("shape") || !e["shape"].is_array())
      return bad("a buffer has no shape");
    int64_t n = 1;
    for (const json &d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40))
        return bad("a buffer has a bad shape");
      b.shape.push_back(d.get<int64_t>());
      n *= b.shape.back();
      if (n > (int64_t(1) << 40))
        return bad("a buffer is impossibly large");
    }
    if (n * dtypeBytes(b.dtype) != b.bytes)
      return bad(fmt::format("buffer '{}' has {} bytes but its shape needs {}",
                             b.name, b.bytes, n * dtypeBytes(b.dtype)));
    if (b.offset % 64 != 0 || b.offset + b.bytes > p.arenaBytes)
      return bad(fmt::format("buffer '{}' [{}, {}) lies outside the {}-byte arena",
                             b.name, b.offset, b.offset + b.bytes, p.arenaBytes));
    bool persistent = b.role == Role::Param || b.role == Role::State;
    if (persistent && b.offset + b.bytes > p.persistentBytes)
      return bad("parameter '" + b.name + "' lies outside the persistent region");
    p.buffers.push_back(std::move(b));
  }
  int numBuffers = int(p.buffers.size());
  for (const json &e : j["kernels"]) {
    Kernel k;
    int64_t n;
    if (!r.str(e, "symbol", k.symbol) || !r.str(e, "op", k.op) ||
        !r.i64(e, "num_args", n, 1, 4096) ||
        !r.boolean(e, "in_place_safe", k.inPlaceSafe))
      return bad(r.error);
    k.numArgs = int(n);
    if (!r.i64(e, "chunks", n, 1, 4096))
      return bad(r.error);
    k.chunks = int(n);
    if (e.contains("kind") && e["kind"].is_string())
      k.kind = e["kind"].get<std::string>();
    if (e.contains("flops") && e["flops"].is_number_integer())
      k.flops = e["flops"].get<int64_t>();
    if (e.contains("ops") && e["ops"].is_array())
      for (const json &o : e["ops"])
        if (o.is_string())
          k.ops.push_back(o.get<std::string>());
    if (e.contains("lowest_float") && e["lowest_float"].is_string())
      parseDType(e["lowest_float"].get<std::string>(), k.lowestFloat);
    if (e.contains("num_inputs") && e["num_inputs"].is_number_integer())
      k.numInputs = int(std::clamp<int64_t>(e["num_inputs"].get<int64_t>(), 0, k.numArgs));
    if (e.contains("writes") && e["writes"].is_array())
      for (const json &w : e["writes"])
        if (w.is_number_integer() && w.get<int64_t>() >= 0 && w.get<int64_t>() < k.numArgs)
          k.writes.push_back(int(w.get<int64_t>()));
    if (e.contains("locs") && e["locs"].is_array())
      for (const json &l : e["locs"])
        if (l.is_string())
          k.locs.push_back(l.get<std::string>());
    p.kernels.push_back(std::move(k));
  }
  for (const json &e : j["functions"]) {
    Function f;
    if (!r.str(e, "name", f.name) || !r.ints(e, "args", f.args, numBuffers) ||
        !r.ints(e, "results", f.results, numBuffers) ||
        !r.i64(e, "scratch_bytes", f.scratchBytes))
      return bad(r.error);
    if (!e.contains("steps") || !e["steps"].is_array())
      return bad("function '" + f.name + "' has no steps");
    for (const json &se : e["steps"]) {
      Step s;
      std::string kind;
      if (!r.str(se, "kind", kind) || !r.ints(se, "args", s.args, numBuffers))
        return bad(r.error);
      if (se.contains("loc") && se["loc"].is_string())
        s.loc = se["loc"].get<std::string>();
      if (kind == "kernel") {
        int64_t k;
        if (!r.i64(se, "kernel", k, 0, int64_t(p.kernels.size()) - 1))
          return bad(r.error);
        s.kernel = int(k);
        if (int(s.args.size()) != p.kernels[k].numArgs)
          return bad(fmt::format("a call of kernel {} passes {} buffers, it takes {}",
                                 p.kernels[k].symbol, s.args.size(),
                                 p.kernels[k].numArgs));
      } else if (kind == "gemm") {
        s.kind = Step::Gemm;
        const json &g = se.contains("gemm") ? se["gemm"] : json();
        GemmParams &gp = s.gemm;
        if (!r.i64(g, "batch", gp.batch, 1) || !r.i64(g, "m", gp.m, 1) ||
            !r.i64(g, "n", gp.n, 1) || !r.i64(g, "k", gp.k, 1) ||
            !r.boolean(g, "transpose_lhs", gp.transposeLhs) ||
            !r.boolean(g, "transpose_rhs", gp.transposeRhs) ||
            !r.boolean(g, "lhs_batched", gp.lhsBatched) ||
            !r.boolean(g, "rhs_batched", gp.rhsBatched))
          return bad(r.error);
        if (s.args.size() != 3)
          return bad("a gemm step needs 3 buffers");
        if (g.contains("dtype")) { // absent in artifacts before half-precision GEMMs: f32
          std::string dt;
          if (!r.str(g, "dtype", dt) || !parseDType(dt, gp.dtype) ||
              !(gp.dtype == DType::F32 || gp.dtype == DType::F16 || gp.dtype == DType::BF16))
            return bad(r.error.empty() ? "a gemm step's dtype is not f32, f16 or bf16" : r.error);
        }
        if (se.contains("epilogue")) {
          const json &ep = se["epilogue"];
          int64_t k;
          if (!r.i64(ep, "kernel", k, 0, int64_t(p.kernels.size()) - 1) ||
              !r.ints(ep, "args", s.epilogueArgs, numBuffers))
            return bad(r.error);
          s.epilogue = int(k);
          if (int(s.epilogueArgs.size()) != p.kernels[k].numArgs)
            return bad(fmt::format("a gemm epilogue of kernel {} passes {} buffers, it takes {}",
                                   p.kernels[k].symbol, s.epilogueArgs.size(),
                                   p.kernels[k].numArgs));
        }
        if (se.contains("lt_epilogue")) {
          const json &lt = se["lt_epilogue"];
          int64_t bias, out, aux;
          std::string act;
          if (!r.i64(lt, "bias", bias, -1, numBuffers - 1) ||
              !r.i64(lt, "out", out, 0, numBuffers - 1) ||
              !r.i64(lt, "aux", aux, -1, numBuffers - 1) || !r.str(lt, "activation", act))
            return bad(r.error);
          if (act == "none")
            s.lt.activation = LtEpilogue::Activation::None;
          else if (act == "relu")
            s.lt.activation = LtEpilogue::Activation::Relu;
          else if (act == "gelu_tanh")
            s.lt.activation = LtEpilogue::Activation::GeluTanh;
          else
            return bad("a gemm's library epilogue has an unknown activation '" + act + "'");
          s.lt.bias = int(bias);
          s.lt.out = int(out);
          s.lt.aux = int(aux);
          int64_t mn = gp.batch * gp.m * gp.n;
          auto f32 = [&](int64_t id, int64_t elems) {
            return p.buffers[size_t(id)].dtype == DType::F32 &&
                   p.buffers[size_t(id)].numElements() == elems;
          };
          if (s.epilogue < 0 || g.contains("heads") || gp.dtype != DType::F32 || !f32(out, mn) ||
              (bias >= 0 && !f32(bias, gp.n)) || (aux >= 0 && !f32(aux, mn)) ||
              (aux >= 0 && gp.n % 8 != 0))
            return bad("a gemm's library epilogue does not match its step (it needs an epilogue "
                       "kernel, dense float32 buffers of the GEMM's shape, a bias of n, and n a "
                       "multiple of 8 for the pre-activation)");
        }
        auto fits = [&](int id, int64_t elems) {
          return p.buffers[id].dtype == gp.dtype &&
                 p.buffers[id].numElements() == elems;
        };
        if (g.contains("heads")) {
          // Strided layouts: every matrix of every operand must lie inside
          // its buffer (largest start + last row + row length).
          if (!r.i64(g, "heads", gp.heads, 1, gp.batch) || gp.batch % gp.heads != 0 ||
              !gp.lhsBatched || !gp.rhsBatched)
            return bad(r.error.empty() ? "a strided gemm step has bad heads" : r.error);
          struct Operand { const char *key; MatrixLayout *l; int id; int64_t rows, cols; };
          Operand ops[] = {
              {"lhs_layout", &gp.lhsLayout, s.args[0], gp.transposeLhs ? gp.k : gp.m,
               gp.transposeLhs ? gp.m : gp.k},
              {"rhs_layout", &gp.rhsLayout, s.args[1], gp.transposeRhs ? gp.n : gp.k,
               gp.transposeRhs ? gp.k : gp.n},
              {"out_layout", &gp.outLayout, s.args[2], gp.m, gp.n}};
          for (Operand &o : ops) {
            const json &l = g.contains(o.key) ? g[o.key] : json();
            if (!r.i64(l, "outer", o.l->outer) || !r.i64(l, "inner", o.l->inner) ||
                !r.i64(l, "ld", o.l->ld, o.cols))
              return bad(r.error);
            int64_t last = (gp.batch / gp.heads - 1) * o.l->outer +
                           (gp.heads - 1) * o.l->inner + (o.rows - 1) * o.l->ld + o.cols;
            if (p.buffers[o.id].dtype != gp.dtype || last > p.buffers[o.id].numElements())
              return bad("a strided gemm step reads or writes outside its buffers");
          }
        } else if (!fits(s.args[0], (gp.lhsBatched ? gp.batch : 1) * gp.m * gp.k) ||
                   !fits(s.args[1], (gp.rhsBatched ? gp.batch : 1) * gp.k * gp.n) ||
                   !fits(s.args[2], gp.batch * gp.m * gp.n)) {
          return bad("a gemm step's buffers do not match its shape");
        }
      } else if (kind == "copy") {
        s.kind = Step::Copy;
        if (s.args.size() != 2 ||
            p.buffers[s.args[0]].bytes != p.buffers[s.args[1]].bytes)
          return bad("a copy step needs 2 buffers of equal size");
      } else {
        return bad("unknown step kind '" + kind + "'");
      }
      f.steps.push_back(std::move(s));
    }
    p.functions.push_back(std::move(f));
  }
  return p;
}

} // namespace kiln::program
