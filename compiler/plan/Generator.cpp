//===- Generator.cpp - Kernel formation to a plan: the whole run ---------===//
//
// Generator::run: every function's steps (Steps.cpp) and buffers
// (Buffers.cpp), then the arena layout over pipeline stages and devices and
// the steps' dependencies and queues; and the small helpers the other parts
// share (buffers, persistent buffers, value roots).
//
//===----------------------------------------------------------------------===//
#include "compiler/Generator.h"

#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "dialects/kiln/Sharding.h"
#include "dialects/kiln/TrainSettings.h"
#include "passes/Fusion.h"
#include "passes/Pipelines.h"

#include "mlir/Pass/PassManager.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace mlir;


namespace kiln {

using program::Buffer;
using program::DType;
using program::Role;
using program::Step;

namespace codegen {


Generator::Generator(ModuleOp module, bool fusion, std::string &error, bool printIRAfterAll)
    : module_(module), ctx_(module.getContext()), error_(error), fusion_(fusion),
      printIRAfterAll_(printIRAfterAll) {
  kernels_ = ModuleOp::create(UnknownLoc::get(ctx_));
  neutral_ = ModuleOp::create(UnknownLoc::get(ctx_));
}

LogicalResult Generator::formKernels() {
  if (fusion_)
    for (const std::string &name : compiledFunctions())
      if (auto fn = module_.lookupSymbol<func::FuncOp>(name))
        findFoldedTransposes(fn.getBody().front(), formed_[name].foldedIn,
                             formed_[name].foldedOut);
  std::string diags;
  ScopedDiagnosticHandler handler(ctx_, [&](Diagnostic &d) {
    llvm::raw_string_ostream os(diags);
    os << d << "\n";
    return success();
  });
  PassManager pm(ctx_);
  if (printIRAfterAll_)
    printAfterEveryPass(pm);
  FusionRefusalsByFunction refusals;
  buildKernelFormationPipeline(pm, fusion_, &refusals);
  if (failed(pm.run(module_))) {
    error_ = "kernel formation (kiln-split-losses, kiln-mark-forward, kiln-fuse) failed:\n" + diags;
    return failure();
  }
  for (auto &[name, r] : refusals)
    formed_[name].refusals = std::move(r);
  return success();
}

LogicalResult Generator::run() {
  if (failed(formKernels()))
    return failure();
  for (const std::string &name : compiledFunctions()) {
    auto fn = module_.lookupSymbol<func::FuncOp>(name);
    if (!fn)
      continue;
    if (failed(compileFunction(fn)))
      return failure();
  }
  MeshShape mesh = getMesh(module_);
  int64_t pp = std::max<int64_t>(1, mesh.axisSize("pp"));
  // The arena: the persistent region (parameters, optimizer state), then
  // the scratch region each function reuses. With pipeline stages every
  // device holds the regions of what all devices hold (-1), then its own
  // stage's persistent and scratch regions, at the same addresses on every
  // stage.
  int64_t shared = persistentEnd_[-1] + scratchPeak_[-1];
  for (int id : scratchIds_) {
    Buffer &b = prog_.buffers[size_t(id)];
    b.offset += b.stage < 0 ? persistentEnd_[-1] : shared + persistentEnd_[b.stage];
  }
  if (pp > 1)
    for (size_t id = 0; id < prog_.buffers.size(); ++id) {
      Buffer &b = prog_.buffers[id];
      if ((b.role == Role::Param || b.role == Role::State) && b.stage >= 0)
        b.offset += shared;
    }
  prog_.arenaBytes = prog_.persistentBytes;
  for (const program::Function &f : prog_.functions)
    prog_.arenaBytes = std::max(prog_.arenaBytes, prog_.persistentBytes + f.scratchBytes);
  // The device mesh: every device runs the same steps on the same layout
  // (data parallelism), so devices 1.. get copies of device 0's plan.
  for (const MeshAxis &a : mesh.axes)
    prog_.mesh.axes.push_back({a.name, a.size});
  prog_.deterministic = TrainSettings(module_).deterministicDevices();
  if (mesh.devices() > 1) {
    program::BufferPlan same{prog_.buffers, prog_.persistentBytes, prog_.arenaBytes};
    prog_.otherDevices.assign(size_t(mesh.devices() - 1), same);
  }
  // Pipeline stages: one layout, but each device's arena ends after its own
  // stage's buffers (and every device's): persistent ones, then scratch
  // from the common scratch base.
  if (pp > 1) {
    int64_t perStage = mesh.devices() / pp;
    for (int d = 0; d < mesh.devices(); ++d) {
      int s = int(d / perStage);
      program::BufferPlan &p = d == 0 ? prog_ : prog_.otherDevices[size_t(d - 1)];
      // The persistent buffers of the device end here (the runtime checks
      // they lie below it; every device's scratch region sits inside).
      p.persistentBytes = shared + persistentEnd_[s];
      p.arenaBytes = shared + persistentEnd_[s] + scratchPeak_[s];
    }
  }
  // Plan v2: each step waits for the steps whose memory it touches (offsets
  // are final now); gradient-bucket collectives (kiln.overlap) and pipeline
  // sends and receives run on queue 1, everything else in order on queue 0.
  for (auto [f, queues] : llvm::zip(prog_.functions, queues_)) {
    program::computeDependencies(prog_, f);
    for (auto [st, q] : llvm::zip(f.steps, queues)) {
      st.queue = q;
      prog_.queues = std::max(prog_.queues, q + 1);
    }
    if (llvm::is_contained(queues, 1))
      exactDependencies(prog_, f);
  }
  return success();
}

/// computeDependencies() tracks memory through every buffer overlapping
/// the one written, so a step can wait for another whose bytes it never
/// touches (two buffers that both overlap a third, dead one). On one queue
/// that costs nothing; a communication queue would lose its overlap, so
/// such a function gets exact dependencies (program::exactDependencies):
/// a step that reuses memory a collective still reads or writes waits for
/// the collective: the scratch first fit cannot hand out a buffer while a
/// collective has it in flight.
void Generator::exactDependencies(const program::Program &p, program::Function &f) {
  program::exactDependencies(p, f);
}

LogicalResult Generator::fail(Operation *op, const std::string &why) {
  error_ = fmt::format("{}: cannot generate code for '{}': {}",
                       locString(op->getLoc()), op->getName().getStringRef().str(), why);
  return failure();
}

/// A buffer record for a value of type `t` (offset still unset).
Buffer Generator::makeBuffer(RankedTensorType t, Role role, const std::string &name) {
  Buffer b;
  b.name = name;
  b.role = role;
  toDType(t.getElementType(), b.dtype);
  b.shape.assign(t.getShape().begin(), t.getShape().end());
  b.bytes = b.numElements() * program::dtypeBytes(b.dtype);
  return b;
}

/// The persistent buffer named `name`, created on first use.
/// Pipeline stages: each stage's buffers have a region of their own, laid
/// out in run(); buffers of two stages share addresses (no device holds
/// both).
int Generator::persistentBuffer(const std::string &name, Role role, int stage,
                                RankedTensorType t) {
  int id = prog_.persistent(name);
  if (id >= 0)
    return id;
  Buffer b = makeBuffer(t, role, name);
  b.stage = stage;
  b.offset = persistentEnd_[stage]; // relative to its stage's region until run() ends
  persistentEnd_[stage] = align(b.offset + b.bytes);
  if (stage < 0)
    prog_.persistentBytes = persistentEnd_[stage];
  prog_.buffers.push_back(b);
  return int(prog_.buffers.size()) - 1;
}

Value Generator::root(Value v) {
  auto it = alias_.find(v);
  return it == alias_.end() ? v : root(it->second);
}

/// A GEMM step for the kiln.matmul `mm` (inside `fusion`, whose operands
/// are `outer`), with attention's head transposes read or written in place.
/// Sets s.lt* when the epilogue members `epi` of `mm` (in `fusion`, with
/// outputs `outs`, values inside the fusion) are what a GEMM library's
/// epilogue computes: [broadcast of a [n] bias + add], then [relu |
/// gelu(tanh)]; outputs the activation's result and, for GELU only, the
/// pre-activation. The GEMM's raw value may be read elsewhere only as that
/// pre-activation (no bias), whose buffer is then the GEMM's own.

} // namespace codegen
} // namespace kiln
