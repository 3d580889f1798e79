//===- Summary.cpp - What a compiled model contains -----------------------===//
#include "compiler/Summary.h"
#include "compiler/Codegen.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <algorithm>

using namespace mlir;

namespace kiln {
namespace {

/// "file.kiln:LINE" of the first file location inside `loc` (through the
/// call sites, fused and named locations a def or a pass built), or "".
std::string modelLine(Location loc) {
  std::string where;
  loc->walk([&](Location l) {
    auto f = dyn_cast<FileLineColLoc>(l);
    if (!f)
      return WalkResult::advance();
    where = llvm::sys::path::filename(f.getFilename().getValue()).str() + ":" +
            std::to_string(f.getLine());
    return WalkResult::interrupt();
  });
  return where;
}

std::string typeStr(Type t) {
  auto rt = dyn_cast<RankedTensorType>(t);
  if (!rt)
    return "?";
  std::string s;
  llvm::raw_string_ostream os(s);
  os << rt.getElementType() << "[";
  llvm::interleaveComma(rt.getShape(), os);
  os << "]";
  return s;
}

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

std::string initStr(DictionaryAttr d) {
  if (!d)
    return "";
  auto kind = d.getAs<StringAttr>("kind");
  if (!kind)
    return "";
  std::string s = kind.getValue().str();
  auto f = [&](StringRef k) {
    auto a = d.getAs<FloatAttr>(k);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", a ? a.getValueAsDouble() : 0.0);
    return std::string(buf);
  };
  if (s == "normal")
    s += "(" + f("mean") + ", " + f("std") + ")";
  else if (s == "uniform")
    s += "(" + f("low") + ", " + f("high") + ")";
  return s;
}

std::string attrStr(Attribute a) {
  if (auto s = dyn_cast<StringAttr>(a))
    return s.getValue().str();
  if (auto i = dyn_cast<IntegerAttr>(a)) {
    if (i.getType().isInteger(1))
      return i.getValue().isZero() ? "false" : "true";
    return std::to_string(i.getInt());
  }
  if (auto f = dyn_cast<FloatAttr>(a)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", f.getValueAsDouble());
    return buf;
  }
  if (auto b = dyn_cast<BoolAttr>(a))
    return b.getValue() ? "true" : "false";
  if (auto d = dyn_cast<DictionaryAttr>(a)) {
    std::string name, rest;
    for (NamedAttribute n : d) {
      if (n.getName() == "name")
        name = attrStr(n.getValue());
      else
        rest += (rest.empty() ? "" : ", ") + n.getName().str() + "=" +
                attrStr(n.getValue());
    }
    return name + "(" + rest + ")";
  }
  return "?";
}

} // namespace

ModelSummary summarize(ModuleOp module) {
  ModelSummary s;
  if (auto m = module->getAttrOfType<StringAttr>(KilnDialect::kModelAttr))
    s.model = m.getValue().str();
  if (auto src = module->getAttrOfType<StringAttr>(KilnDialect::kSourceAttr))
    s.source = src.getValue().str();
  if (auto t = module->getAttrOfType<DictionaryAttr>(KilnDialect::kTrainAttr)) {
    for (NamedAttribute n : t)
      s.train += (s.train.empty() ? "" : ", ") + n.getName().str() + " " +
                 attrStr(n.getValue());
  }
  auto fn = module.lookupSymbol<func::FuncOp>("forward");
  if (!fn)
    return s;
  if (TrainSettings t(module); t.deterministicDevices()) {
    auto c = t.dictionary().getAs<IntegerAttr>("deterministic_chunks");
    auto k = t.dictionary().getAs<IntegerAttr>("grad_accum");
    int64_t rows = 0;
    for (unsigned i = 0; i < fn.getNumArguments() && !rows; ++i) {
      auto in = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr);
      auto type = dyn_cast<RankedTensorType>(fn.getArgument(i).getType());
      if (in && in.getValue() != "dropout_seed" && type && type.getRank() > 0)
        rows = type.getDimSize(0);
    }
    if (c && k)
      s.deterministic =
          llvm::formatv("devices, {0} chunks of {1} rows per global batch of "
                        "{2}, {3} per device",
                        c.getInt(), rows, c.getInt() * rows, k.getInt())
              .str();
  }
  fn.walk([&](Operation *op) {
    if (op == fn.getOperation())
      return;
    ++s.numOps;
    ++s.opCounts[op->getName().getStringRef().str()];
  });
  for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
    ModelSummary::Tensor t;
    Type type = fn.getArgument(i).getType();
    t.type = typeStr(type);
    if (auto rt = dyn_cast<RankedTensorType>(type))
      t.count = rt.getNumElements();
    if (auto p = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr)) {
      t.name = p.getValue().str();
      if (auto l = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kLayerAttr))
        t.layer = l.getValue().str();
      t.init = initStr(fn.getArgAttrOfType<DictionaryAttr>(i, KilnDialect::kInitAttr));
      s.paramCount += t.count;
      if (t.layer != "position_embedding")
        s.paramCountNoPosition += t.count;
      s.params.push_back(t);
    } else if (auto in = fn.getArgAttrOfType<StringAttr>(i, KilnDialect::kInputAttr)) {
      t.name = in.getValue().str();
      s.inputs.push_back(t);
    }
  }
  for (unsigned i = 0; i < fn.getNumResults(); ++i) {
    ModelSummary::Tensor t;
    t.type = typeStr(fn.getResultTypes()[i]);
    if (auto o = fn.getResultAttrOfType<StringAttr>(i, KilnDialect::kOutputAttr))
      t.name = o.getValue().str();
    s.outputs.push_back(t);
  }
  return s;
}

/// Pipeline parallelism: the schedule, its bubble, and per stage what it
/// holds and runs; then every transfer of @train_step (docs/parallel.md).
void printPipeline(ModuleOp module, func::FuncOp step, const MeshShape &mesh,
                   llvm::raw_ostream &os) {
  int64_t P = mesh.axisSize("pp");
  TrainSettings train(module);
  int64_t M = train.gradAccum();
  std::string sched = train.pipeline();
  bool placed = bool(module->getAttr("kiln.stages_placed"));
  // Interleaved 1F1B: V chunks per device; @forward's kiln.stage numbers
  // the chunks (chunk c on device c mod P).
  const int64_t V = sched == "interleaved" ? virtualStages(module) : 1;
  const int64_t C = P * V;
  os << llvm::formatv("  pipeline (pp = {0}, {1} micro-batch{2}, {3} schedule{4}, stages {5}):\n",
                      P, M, M == 1 ? "" : "es", sched,
                      V > 1 ? llvm::formatv(" over {0} chunks, {1} per device", C, V).str()
                            : std::string(),
                      placed ? "placed by hand (stage blocks)" : "cut by the cost model (FLOPs and bytes)");
  os << llvm::formatv("    bubble (p - 1) / ({0}M + p - 1) = {1} / {2} = {3:F1}% of each device's "
                      "step idle\n",
                      V > 1 ? "V " : "", P - 1, V * M + P - 1,
                      100.0 * double(P - 1) / double(V * M + P - 1));
  std::vector<int64_t> flops(size_t(C), 0), ops(size_t(C), 0), params(size_t(P), 0),
      bytes(size_t(C), 0);
  std::vector<std::string> first(static_cast<size_t>(C)), last(static_cast<size_t>(C));
  if (auto fwd = module.lookupSymbol<func::FuncOp>("forward"))
    for (Operation &op : fwd.getBody().front().without_terminator()) {
      int64_t st = stageOf(&op);
      if (st < 0 || st >= C)
        continue;
      ++ops[size_t(st)];
      if (auto c = dyn_cast<CostOpInterface>(&op); c && op.getNumResults())
        flops[size_t(st)] += c.estimateFlops();
      auto addBytes = [&](Value v) {
        if (auto t = dyn_cast<RankedTensorType>(v.getType()))
          bytes[size_t(st)] +=
              t.getNumElements() * std::max<int64_t>(1, t.getElementTypeBitWidth() / 8);
      };
      llvm::for_each(op.getOperands(), addBytes);
      llvm::for_each(op.getResults(), addBytes);
      if (auto tag = op.getAttrOfType<StringAttr>(KilnDialect::kBlockAttr)) {
        if (first[size_t(st)].empty())
          first[size_t(st)] = tag.str();
        last[size_t(st)] = tag.str();
      }
    }
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (auto name = step.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
      if (auto st = step.getArgAttrOfType<IntegerAttr>(i, kStageAttr))
        if (st.getInt() < P) {
          size_t k = size_t(st.getInt());
          params[k] += cast<RankedTensorType>(step.getArgument(i).getType()).getNumElements();
          // Stages without repeat blocks: named by their parameters' layers,
          // the first and the last in argument order, each by its top-level
          // name (a def's scope, `block_1`, or a layer, `linear_2`).
          std::string layer = name.getValue().split('.').first.str();
          if (V == 1 && (first[k].empty() || first[k].find('.') == std::string::npos)) {
            if (first[k].empty())
              first[k] = layer;
            last[k] = layer;
          }
        }
  // Micro-batches whose activations a device holds at most: forwards run
  // minus backwards done, over its order (a chunk's forward is 1/V of one).
  auto inFlight = [&](int64_t d, llvm::StringRef schedule, int64_t v) {
    int64_t live = 0, peak = 0;
    for (const PipelineUnit &u : pipelineOrder(d, P, v, M, schedule)) {
      live += u.phase == 0 ? 1 : -1;
      peak = std::max(peak, live);
    }
    return double(peak) / double(v);
  };
  os << "    stage  forward ops  forward FLOPs  bytes moved    parameters  micro-batches in "
     << (V > 1 ? "flight (interleaved | 1f1b | gpipe)  chunks: layers"
               : "flight (1f1b | gpipe)  layers")
     << "\n";
  for (int64_t st = 0; st < P; ++st) {
    auto layersOf = [&](int64_t c) {
      // A chunk outside every repeat block (the embeddings or the head of
      // a model with fewer blocks than chunks): its op count says so.
      return first[size_t(c)].empty()
                 ? (V > 1 ? llvm::formatv("{0} ({1} ops)", placed ? "stage block" : "no repeat block",
                                          ops[size_t(c)])
                                .str()
                          : std::string("-"))
             : first[size_t(c)] == last[size_t(c)]
                 ? first[size_t(c)]
                 : first[size_t(c)] + " .. " + last[size_t(c)];
    };
    int64_t o = 0, fl = 0, by = 0;
    std::string layers;
    for (int64_t c = st; c < C; c += P) {
      o += ops[size_t(c)];
      fl += flops[size_t(c)];
      by += bytes[size_t(c)];
      layers += (layers.empty() ? "" : "; ") +
                (V > 1 ? std::to_string(c) + ": " : std::string()) + layersOf(c);
    }
    if (V == 1) {
      os << llvm::formatv("    {0,-6} {1,11}  {2,13}  {3,11}  {4,12}  {5,10} | {6,-16}  {7}\n",
                          st, o, grouped(fl), grouped(by), grouped(params[size_t(st)]),
                          std::min(P - st, M), M, layers);
      continue;
    }
    std::string flight = llvm::formatv("{0:F1} | {1} | {2}", inFlight(st, "interleaved", V),
                                       int64_t(inFlight(st, "1f1b", 1)), M)
                             .str();
    os << llvm::formatv("    {0,-6} {1,11}  {2,13}  {3,11}  {4,12}  {5,24}             {6}\n",
                        st, o, grouped(fl), grouped(by), grouped(params[size_t(st)]), flight,
                        layers);
  }
  // The order each device runs (F/B chunk.micro-batch), when it is short
  // enough to read.
  if (V > 1 && 2 * M * V <= 64)
    for (int64_t d = 0; d < P; ++d) {
      std::string line;
      for (const PipelineUnit &u : pipelineOrder(d, P, V, M, sched))
        line += llvm::formatv(" {0}{1}.{2}", u.phase ? "B" : "F", u.chunk, u.mb).str();
      os << "    device " << d << " runs (F|B chunk.micro-batch):" << line << "\n";
    }
  // Transfers: grouped by place, type and direction.
  std::map<std::string, int> transfers;
  int total = 0;
  step.walk([&](Operation *op) {
    std::string dir;
    if (auto t = dyn_cast<TransferOp>(op))
      dir = llvm::formatv("stage {0} -> {1}", t.getFrom(), t.getTo()).str();
    else if (auto b = dyn_cast<CollectiveBroadcastOp>(op))
      dir = llvm::formatv("stage {0} -> all (broadcast)", b.getRoot()).str();
    else
      return;
    std::string where = modelLine(op->getLoc());
    ++transfers[llvm::formatv("    {0,-28} {1,-16} {2}", where.empty() ? "-" : where,
                              typeStr(op->getResult(0).getType()), dir)
                    .str()];
    ++total;
  });
  os << "    " << total << " transfers per training step, inserted by kiln-pipeline:\n";
  for (auto &[line, n] : transfers)
    os << line << (n > 1 ? llvm::formatv("  x{0}", n).str() : "") << "\n";
}

void addProgram(ModelSummary &s, ModuleOp module) {
  for (auto fn : module.getOps<func::FuncOp>()) {
    int64_t n = 0;
    fn.walk([&](Operation *op) { n += op != fn.getOperation(); });
    s.program.push_back({fn.getSymName().str(), n});
  }
  // On a mesh of several devices: the ZeRO paper's memory per device, from
  // @train_step's parameters and optimizer state ("slot:param"), logical
  // shapes (kiln.shard's) where the state is sharded.
  MeshShape mesh = getMesh(module);
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (mesh.devices() <= 1 || !step)
    return;
  ZeroMemory m;
  m.devices = mesh.axisSize("dp") > 0 ? mesh.axisSize("dp") : mesh.devices();
  // Pipeline parallelism: a device holds its stage's parameters only, and
  // N counts the replicas of a stage, so the accounting is per stage.
  int64_t P = std::max<int64_t>(1, mesh.axisSize("pp"));
  if (P > 1 && mesh.axisSize("dp") <= 0)
    m.devices = std::max<int64_t>(
        1, mesh.devices() / (P * std::max<int64_t>(1, mesh.axisSize("tp"))));
  std::vector<ZeroMemory> stages(size_t(P), m);
  std::map<std::string, int64_t> paramStage;
  std::map<std::string, int64_t> paramCount;
  std::vector<std::pair<std::string, int64_t>> states; // name, element bytes
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    auto t = dyn_cast<RankedTensorType>(step.getArgument(i).getType());
    if (!t)
      continue;
    int64_t bytes = std::max<int64_t>(1, t.getElementTypeBitWidth() / 8);
    if (auto p = step.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr)) {
      int64_t n = t.getNumElements();
      // A ZeRO-sharded parameter counts whole, a tensor-parallel one (with
      // a dim) by its local block (zeroMemory() in compiler/plan/Buffers.cpp).
      if (auto shard = step.getArgAttrOfType<DictionaryAttr>(i, "kiln.shard"))
        if (auto shape = shard.getAs<DenseI64ArrayAttr>("shape");
            shape && !shard.contains("dim")) {
          n = 1;
          for (int64_t d : shape.asArrayRef())
            n *= d;
        }
      paramCount[p.str()] = n;
      m.psi += n;
      m.paramBytes += n * bytes;
      m.gradBytes += n * bytes;
      int64_t stage = 0;
      if (auto st = step.getArgAttrOfType<IntegerAttr>(i, kStageAttr))
        stage = std::clamp<int64_t>(st.getInt(), 0, P - 1);
      paramStage[p.str()] = stage;
      ZeroMemory &sm = stages[size_t(stage)];
      sm.psi += n;
      sm.paramBytes += n * bytes;
      sm.gradBytes += n * bytes;
    } else if (auto st = step.getArgAttrOfType<StringAttr>(i, KilnDialect::kStateAttr)) {
      states.push_back({st.str(), bytes});
    }
  }
  for (auto &[name, bytes] : states) {
    size_t colon = name.find(':');
    auto it = colon == std::string::npos ? paramCount.end()
                                         : paramCount.find(name.substr(colon + 1));
    if (it != paramCount.end()) {
      m.optimizerBytes += it->second * bytes;
      stages[size_t(paramStage[it->first])].optimizerBytes += it->second * bytes;
    }
  }
  llvm::raw_string_ostream os(s.memory);
  if (P > 1)
    printStageZeroMemory(stages, os, "  ");
  else
    printZeroMemory(m, os, "  ");
  // Tensor parallelism: every all-reduce kiln-tensor-parallel inserted into
  // @train_step, where and why (its location's "tp: ..." name).
  if (mesh.axisSize("tp") > 1) {
    std::vector<std::string> lines;
    step.walk([&](Operation *op) {
      if (!isa<AllReduceOp, AllGatherOp>(op) ||
          op->getAttrOfType<StringAttr>("axis").getValue() != "tp")
        return;
      Operation *ar = op;
      std::string why = "", where = "";
      Location l = ar->getLoc();
      if (auto n = dyn_cast<NameLoc>(l)) {
        StringRef name = n.getName().getValue();
        if (name.consume_front("tp: "))
          why = name.str();
        l = n.getChildLoc();
      }
      where = modelLine(l);
      lines.push_back(llvm::formatv("    {0,-28} {1,-16} {2}{3}", where,
                                    typeStr(ar->getResult(0).getType()),
                                    isa<AllGatherOp>(ar) ? "(all_gather) " : "", why)
                          .str());
    });
    os << "  tensor parallelism (tp = " << mesh.axisSize("tp") << "): " << lines.size()
       << " collectives over tp per training step, inserted by kiln-tensor-parallel:\n";
    // Embeddings the pass left whole (tp does not divide their rows).
    for (unsigned i = 0; i < step.getNumArguments(); ++i)
      if (auto p = step.getArgAttrOfType<StringAttr>(i, KilnDialect::kParamAttr))
        if (auto fwd = module.lookupSymbol<func::FuncOp>("forward"))
          for (unsigned j = 0; j < fwd.getNumArguments(); ++j)
            if (fwd.getArgAttrOfType<StringAttr>(j, KilnDialect::kParamAttr) == p &&
                fwd.getArgAttrOfType<StringAttr>(j, KilnDialect::kLayerAttr) &&
                fwd.getArgAttrOfType<StringAttr>(j, KilnDialect::kLayerAttr).getValue() ==
                    "embedding" &&
                !step.getArgAttr(i, "kiln.shard"))
              os << "    " << p.getValue() << " stays whole on every device: its "
                 << cast<RankedTensorType>(step.getArgument(i).getType()).getDimSize(0)
                 << " rows are not divisible by tp = " << mesh.axisSize("tp")
                 << " (vocabulary parallelism needs a vocabulary tp divides)\n";
    for (const std::string &line : lines)
      os << line << "\n";
  }
  if (mesh.axisSize("pp") > 1)
    printPipeline(module, step, mesh, os);
}

void print(const ModelSummary &s, llvm::raw_ostream &os) {
  os << "model " << s.model << " (" << s.source << ")\n";
  auto list = [&](const char *label, const std::vector<ModelSummary::Tensor> &ts) {
    os << "  " << llvm::left_justify(label, 12);
    for (size_t i = 0; i < ts.size(); ++i)
      os << (i ? ", " : "") << ts[i].name << " " << ts[i].type;
    os << "\n";
  };
  list("inputs:", s.inputs);
  list("outputs:", s.outputs);
  std::vector<std::pair<int64_t, std::string>> ops;
  for (const auto &kv : s.opCounts)
    ops.push_back({-kv.second, kv.first});
  std::sort(ops.begin(), ops.end());
  os << "  " << llvm::left_justify("ops:", 12) << s.numOps << " in @forward:";
  for (size_t i = 0; i < ops.size(); ++i)
    os << (i % 6 == 0 ? "\n      " : ", ") << ops[i].second << " " << -ops[i].first;
  os << "\n";
  char millions[32];
  std::snprintf(millions, sizeof millions, "%.2fM", s.paramCountNoPosition / 1e6);
  os << "  " << llvm::left_justify("parameters:", 12) << s.params.size() << " tensors, "
     << grouped(s.paramCount) << " values; " << millions
     << " excluding position embeddings (as nanoGPT counts)\n";
  size_t w = 4;
  for (const auto &p : s.params)
    w = std::max(w, p.name.size());
  os << "      " << llvm::left_justify("name", w) << "  "
     << llvm::left_justify("shape", 18) << llvm::right_justify("count", 11)
     << "  init\n";
  for (const auto &p : s.params)
    os << "      " << llvm::left_justify(p.name, w) << "  "
       << llvm::left_justify(p.type, 18)
       << llvm::right_justify(grouped(p.count), 11) << "  " << p.init << "\n";
  if (!s.train.empty())
    os << "  " << llvm::left_justify("train:", 12) << s.train << "\n";
  if (!s.deterministic.empty())
    os << "  " << llvm::left_justify("deterministic:", 12) << " " << s.deterministic << "\n";
  if (!s.program.empty()) {
    os << "  " << llvm::left_justify("program:", 12);
    for (size_t i = 0; i < s.program.size(); ++i)
      os << (i ? ", " : "") << "@" << s.program[i].first << " "
         << s.program[i].second << " ops";
    os << "\n";
  }
  os << s.memory;
}

} // namespace kiln
