//===- Program.h - The compiled program: buffers, schedule, kernels -*- C++ -*-===//
//
// What kilnc hands the runtime besides kernel code (plan version 2): the
// device mesh the program runs over (data, tensor and pipeline axes), each
// device's buffer plan (every buffer of its arena: offset, size, dtype,
// shape, role), each entry point (@train_step, @eval_step, @predict) as an
// ordered list of steps, and the kernel table (each kernel's ops and the
// model-file locations it serves). A step is one of
//   - kernel:     call a generated kernel with buffer pointers (inputs, then
//                 outputs) in the order of its signature, once per piece;
//   - gemm:       a library matrix product (kiln.matmul semantics, Gemm.h);
//   - copy:       copy one buffer into another (a parameter update that
//                 could not be done in place);
//   - collective: all_reduce, reduce_scatter, all_gather, broadcast, send or
//                 recv between the devices of a group (data parallelism,
//                 ZeRO, tensor-parallel layers, pipeline transfers).
// Each step names the queue (stream) it runs on and the earlier steps it
// waits for (dependencies); on one queue they are implied by the order.
// A device's arena is one allocation: the persistent region
// [0, persistentBytes) holds parameters and optimizer state across calls;
// each entry point's scratch buffers live above it and are reused by
// liveness (docs/artifact.md, docs/codegen.md). Serialised as JSON in the
// artifact's "plan" section; parse() checks every index and range before use.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_PROGRAM_H
#define KILN_RUNTIME_CORE_PROGRAM_H

#include "runtime/core/Attention.h"
#include "runtime/core/ElementType.h"
#include "runtime/core/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::program {

/// Element types buffers can hold: the one enum the compiler and runtime
/// share (runtime/core/ElementType.h: dtypeName, dtypeBytes, parseDType).
using DType = ElementType;
using kiln::dtypeBytes;
using kiln::dtypeName;
using kiln::parseDType;

enum class Role { Param, State, Input, Output, Temp };
const char *roleName(Role r);

struct Buffer {
  std::string name; ///< parameter/state/input/output name, or "" for temps
  Role role = Role::Temp;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t offset = 0; ///< bytes from the arena start, 64-byte aligned
  int64_t bytes = 0;
  /// ZeRO: the mesh axis the tensor is sharded over ("" = not sharded). The
  /// buffer then holds block d (d = the device's coordinate on the axis) of
  /// the row-major flattening of the logical tensor, zero-padded to a
  /// multiple of N: ceil(numel / N) elements (docs/parallel.md).
  std::string shardAxis;
  /// The unsharded tensor's shape, when shardAxis is set.
  std::vector<int64_t> logicalShape;
  /// Tensor parallelism: the logical dimension split over shardAxis, or -1
  /// for ZeRO's flattening above. With D = shardDim (size S), K =
  /// shardOuter and N the axis size, dimension D is viewed as [K, S/K] and
  /// device c holds block c of N of each of the K parts, concatenated in k
  /// order: the buffer's shape is the logical one with S replaced by S/N,
  /// and S is a multiple of K * N (no padding). K = 1 is a plain block
  /// split of D; K = 3 splits a fused [3C, C] q/k/v weight by heads.
  int64_t shardDim = -1;
  int64_t shardOuter = 1;
  /// ZeRO inside tensor parallelism (set only with shardDim >= 0): the
  /// device's per-dimension block above, flattened row-major, is itself
  /// split over this axis as ZeRO splits a whole tensor (block d of Z,
  /// zero-padded): the buffer is 1-d, ceil(numel(tp block) / Z) elements.
  std::string zeroAxis;
  /// Pipeline parallelism: the stage (coordinate on mesh axis "pp") whose
  /// devices hold the buffer, or -1: every device. Buffers of different
  /// stages may share arena bytes; a device never touches another stage's.
  int stage = -1;
  int64_t numElements() const;
};

/// Where matrix b of a GEMM operand starts and how far apart its stored
/// rows are, when the operand is read or written in place in a head-split
/// layout (a [0, 2, 1, 3] transpose folded into the call): matrix b starts
/// at (b / heads) * outer + (b % heads) * inner, rows ld elements apart.
struct MatrixLayout {
  int64_t outer = 0, inner = 0, ld = 0;
};

struct GemmParams {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  /// Element type of both operands and the result: f32, f16 or bf16
  /// (products accumulate in float32; the result is rounded to the type).
  DType dtype = DType::F32;
  bool transposeLhs = false, transposeRhs = false;
  bool lhsBatched = false, rhsBatched = false;
  /// 0: dense batches (matrix b at b * rows * cols); otherwise the batch is
  /// (batch / heads) x heads and the layouts below place each matrix.
  int64_t heads = 0;
  MatrixLayout lhsLayout, rhsLayout, outLayout;
  /// f32 operands may be rounded to TF32 (10-bit mantissa) for tensor cores,
  /// products still accumulated in float32 (`precision = tf32`, as
  /// PyTorch's allow_tf32). Backends without TF32 (the CPU) compute in fp32.
  bool tf32 = false;
};

/// "gemm 48x64x64x32 NT": batch (when > 1), m, n, k and the transposes
/// (N/T for lhs and rhs), the name a profile gives a GEMM's shape.
std::string gemmLabel(const GemmParams &g);
/// Floating-point operations of one call (2 per multiply-add).
inline double gemmFlops(const GemmParams &g) {
  return 2.0 * double(g.batch) * double(g.m) * double(g.n) * double(g.k);
}

/// The epilogue of a GEMM step in the form GEMM libraries apply themselves
/// (cuBLASLt's epilogues): out = act(op(A) op(B) + bias), and, when `aux`
/// is set, aux = op(A) op(B) + bias (the pre-activation). The compiler sets
/// it where the step's epilogue kernel computes exactly that; a backend may
/// then skip the kernel (the GEMM's own output buffer is not written unless
/// it is `aux`). Only for dense (non-strided) float32 GEMMs.
struct LtEpilogue {
  enum class Activation { None, Relu, GeluTanh };
  int bias = -1;  ///< [n] buffer, or -1
  Activation activation = Activation::None;
  int out = -1;   ///< the result; -1: no library epilogue for this step
  int aux = -1;   ///< the pre-activation's buffer, or -1
  bool valid() const { return out >= 0; }
};
const char *activationName(LtEpilogue::Activation a); ///< "none", "relu", "gelu_tanh"

/// The version of the plan format this runtime reads and kilnc writes; it
/// goes with artifact::kFormatVersion (docs/artifact.md).
constexpr int kPlanVersion = 2;

/// A named axis of the device mesh ("data", "model", "pipe", ...).
struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

/// The devices a program runs over, numbered 0 .. numDevices() - 1 in
/// row-major order over the axes. No axes: one device.
struct Mesh {
  std::vector<MeshAxis> axes;
  int numDevices() const;
  /// Index of axis `name`, or -1.
  int axis(const std::string &name) const;
};

/// A collective step's communication (docs/artifact.md "Plan v2").
/// Buffers are the step's args: all_reduce, reduce_scatter, all_gather and
/// broadcast read args[0] and write args[1] (the same id when in place);
/// send reads args[0]; recv writes args[0].
struct Collective {
  enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast, Send, Recv };
  enum class Reduction { None, Sum, Mean, Max, Min };
  Op op = Op::AllReduce;
  /// The devices taking part, in rank order; or, when `axis` is set (and
  /// `group` empty), the devices that differ from this one only along that
  /// mesh axis.
  std::vector<int> group;
  std::string axis;
  DType dtype = DType::F32;
  /// all_reduce, reduce_scatter: how values combine; None for the others.
  Reduction reduction = Reduction::None;
  /// Bytes each device contributes (a multiple of the element size): the
  /// whole payload of all_reduce, broadcast, send and recv; the full input
  /// of reduce_scatter (each device receives bytes / group size); one
  /// device's part of all_gather (each receives bytes * group size).
  int64_t bytes = 0;
  /// A rank in the group (an index into it, or a position along `axis`):
  /// send, recv: the other side; broadcast: the root; otherwise -1.
  int peer = -1;
  /// Byte offsets into the send (args[0]) and receive buffer (args[1], or
  /// args[0] for recv), multiples of the element size.
  int64_t sendOffset = 0, recvOffset = 0;
  /// Number of devices in the group (the axis's size when `axis` is set).
  int groupSize(const Mesh &mesh) const;
};
const char *collectiveOpName(Collective::Op op); ///< "all_reduce", ...
const char *reductionName(Collective::Reduction r); ///< "none", "sum", ...

struct Step {
  enum Kind { Kernel, Gemm, Copy, Collective, Attention } kind = Kernel;
  int kernel = -1;       ///< index into Program::kernels (Kernel)
  std::vector<int> args; ///< buffer ids: inputs, then outputs
  GemmParams gemm;       ///< Gemm: args = {lhs, rhs, out}
  /// Gemm: a kernel run on the GEMM's result right after it (its epilogue,
  /// fused by kiln-fuse), or -1; `epilogueArgs` are its buffers (inputs,
  /// the GEMM's output among them, then outputs).
  int epilogue = -1;
  std::vector<int> epilogueArgs;
  /// Gemm: the epilogue kernel's work as a library epilogue, when it is one.
  LtEpilogue lt;
  /// Collective: what is exchanged (args as Collective says).
  program::Collective collective;
  /// Attention: the fused attention call (args as Attention.h says).
  AttentionParams attention;
  std::string loc;       ///< model-file location, "file:line:col"
  /// The queue (stream) the step runs on, 0 .. Program::queues - 1. A
  /// single-queue backend runs every step in order on one queue.
  int queue = 0;
  /// Indices of earlier steps of the same function that must finish before
  /// this one starts (RAW/WAR/WAW on arena memory, computeDependencies()).
  /// Within one queue they hold by order; across queues they are events.
  /// A dependency on a step the device does not run (another stage's) is
  /// met at once.
  std::vector<int> deps;
  /// Pipeline parallelism: only devices of this stage (coordinate on mesh
  /// axis "pp") run the step; -1: every device.
  int stage = -1;
};

struct Function {
  std::string name;
  std::vector<int> args, results; ///< buffer ids, in signature order
  std::vector<Step> steps;
  int64_t scratchBytes = 0; ///< peak of this function's scratch region
};

struct Kernel {
  std::string symbol; ///< entry point: void symbol(void **args, int64_t piece)
  std::string op;     ///< main (last) op, e.g. "kiln.softmax"
  std::vector<std::string> ops; ///< every op it computes, in order
  /// The kernel form: elementwise, row_reduction, column_reduction or single
  /// (docs/codegen.md "Kernel forms").
  std::string kind;
  int64_t flops = 0; ///< estimated floating-point operations per call
  int numArgs = 0;
  /// Independent pieces (row blocks of dim 0) the kernel is split into; the
  /// runtime runs pieces 0..chunks-1 in any order, on any threads.
  int chunks = 1;
  bool inPlaceSafe = false;      ///< an output may alias a same-shape input
  /// Positions of the arguments it writes: its outputs, and the inputs its
  /// tied outputs are written over (in-place updates).
  std::vector<int> writes;
  int numInputs = 0; ///< arguments [0, numInputs) are read; the rest are outputs
  /// The narrowest float type its ops compute in (bf16, f16, f32; f64 for
  /// none of those): the precision two backends can be held to.
  DType lowestFloat = DType::F64;
  std::vector<std::string> locs; ///< every model-file location it serves
};

/// One device's buffer plan: its arena and the buffers laid out in it.
struct BufferPlan {
  std::vector<Buffer> buffers;
  int64_t persistentBytes = 0;
  int64_t arenaBytes = 0;
};

/// Device 0's buffer plan is the Program itself (program.buffers,
/// program.arenaBytes: what single-device code uses); the plans of devices
/// 1.. are in `otherDevices` (empty while meshes have one device). Every
/// device runs the same functions, so their plans agree in buffer ids,
/// names, roles, dtypes, shapes and stages; offsets and arena sizes may
/// differ. With pipeline stages a device runs only the steps of its stage
/// (and the stage -1 ones) and its arena covers only its stage's buffers
/// (and the stage -1 ones): docs/parallel.md "Pipeline parallelism",
/// docs/runtime.md "Pipeline stages".
struct Program : BufferPlan {
  Mesh mesh;
  std::vector<BufferPlan> otherDevices;
  std::vector<Function> functions;
  std::vector<Kernel> kernels;
  /// Queues (streams) steps may name; 1: everything in order on one.
  int queues = 1;
  /// deterministic = "devices" (docs/parallel.md "The same bits on any
  /// device count"): the runtime adds sums over devices in the
  /// communicator's fixed tree order (SumOrder::Tree) and takes GEMM
  /// methods that do not depend on timing. In the plan as
  /// "deterministic": "devices"; absent otherwise.
  bool deterministic = false;

  int numDevices() const { return 1 + int(otherDevices.size()); }
  /// Device `d`'s pipeline stage: its coordinate on mesh axis "pp" (0
  /// when the mesh has no "pp" axis).
  int stageOf(int d) const;
  /// Stages in the mesh: the size of axis "pp" (1 without one).
  int numStages() const;
  /// Whether device `d` holds buffer `id` (its stage is -1 or d's).
  bool holds(int d, int id) const {
    int s = buffers[size_t(id)].stage;
    return s < 0 || s == stageOf(d);
  }
  /// Whether device `d` runs step `s` (its stage is -1 or d's).
  bool runs(int d, const Step &s) const {
    return s.stage < 0 || s.stage == stageOf(d);
  }
  /// The buffer plan of device `d` (0 <= d < numDevices()).
  const BufferPlan &plan(int d) const { return d == 0 ? *this : otherDevices[size_t(d - 1)]; }
  const Function *function(const std::string &name) const;
  /// Buffer id of the persistent (param or state) buffer `name`, or -1.
  int persistent(const std::string &name) const;

  std::string toJson() const;
  /// Parses and validates (the plan version, the mesh against the device
  /// plans, ids, ranges inside each arena (a device's own stage's buffers
  /// and the stage -1 ones), stages in range and steps touching only
  /// buffers and depending only on steps their devices have, sizes matching
  /// shapes, kernel arities, collectives, queues in range, dependencies
  /// pointing to earlier steps); `origin` names the source in messages.
  static Expected<Program> parse(const std::string &json,
                                 const std::string &origin);
};

/// The buffers a step reads and writes (a GEMM's epilogue and library
/// epilogue included), as buffer ids of `p`.
void stepAccesses(const Program &p, const Step &s, std::vector<int> &reads,
                  std::vector<int> &writes);
/// The bytes a call of kernel `kernel` with `args` moves: every argument
/// once, plus once more each input it writes over (a tied output, e.g. an
/// in-place optimizer update or a gradient accumulated in place: read, then
/// written). The performance counters and the GPU cost model use it.
double kernelTrafficBytes(const Program &p, int kernel, const std::vector<int> &args);
/// Sets every step of `f` on queue 0 with the dependencies its memory
/// accesses imply: a step waits for the last earlier step that wrote memory
/// it reads or writes (RAW, WAW) and for the steps that read memory it
/// writes since that write (WAR). Buffers alias where their byte ranges in
/// the arena overlap (liveness reuses scratch memory), so the offsets must
/// be final. The kernel table must be complete.
void computeDependencies(const Program &p, Function &f);
/// Sets the dependencies of `f`'s steps exactly (queues unchanged): a
/// step waits for an earlier step exactly when their byte ranges conflict
/// (read-write, write-read, write-write) on some device, minus the steps
/// its other dependencies already wait for. computeDependencies() also
/// orders steps through a third buffer overlapping both (scratch reuse),
/// which one queue never notices; concurrent queues and inter-op threads
/// would lose overlap to it. O(steps^2) buffer comparisons.
void exactDependencies(const Program &p, Function &f);
/// The shape of a function's dependency DAG: what inter-op threads can
/// run at once. Each step's level is one more than its deepest dependency's
/// (steps without dependencies: level 0).
struct ScheduleShape {
  size_t steps = 0;
  size_t depth = 0; ///< levels: the longest dependency chain, in steps
  size_t widest = 0; ///< the most steps on one level
  /// Steps per level (steps / depth): how many run at once on average
  /// with unlimited threads and equally long steps.
  double meanWidth() const { return depth ? double(steps) / double(depth) : 0; }
};
ScheduleShape scheduleShape(const Function &f);
/// Step `i`'s queue and dependencies in brief, for listings: "" when the
/// order of one queue implies them (the step and all it waits for are on
/// queue 0), else "[queue 1, after 3 7]".
std::string scheduleNote(const Function &f, size_t i);

} // namespace kiln::program

#endif // KILN_RUNTIME_CORE_PROGRAM_H
