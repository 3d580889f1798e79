//===- Passes.td - Kiln passes -------------------------------*- tablegen -*-===//
#ifndef KILN_PASSES_TD
#define KILN_PASSES_TD

include "mlir/Pass/PassBase.td"

def KilnAutodiffPass : Pass<"kiln-autodiff", "mlir::ModuleOp"> {
  let summary = "Differentiate @forward: add @grad returning the loss and every parameter gradient";
  let description = [{
    Reverse-mode automatic differentiation. `@forward` (from the frontend)
    takes parameters (`kiln.param`) and inputs (`kiln.input`) and returns the
    loss first. This pass adds

    ```mlir
    func.func @grad(params..., inputs...) -> (loss, dloss/dparam...)
    ```

    by cloning the forward ops and sweeping them once in reverse, calling
    each op's GradientOpInterface rule and summing contributions, so shared
    subexpressions are differentiated once. Only values on a path from a
    parameter to the loss get gradients, and gradients nobody uses are erased.
    Integer operands (indices, targets) and ops without a rule that sit off
    that path (iota, compare, constants) are not differentiated; an op on the
    path without a rule is an error.

    Before:
    ```mlir
    func.func @forward(%w: tensor<4xf32> {kiln.param = "w"}, %x: tensor<4xf32> {kiln.input = "x"})
        -> (tensor<f32> {kiln.output = "loss"}) {
      %0 = kiln.mul %w, %x : tensor<4xf32>
      %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
      return %1 : tensor<f32>
    }
    ```
    After (added):
    ```mlir
    func.func @grad(%w: tensor<4xf32>, %x: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
      %0 = kiln.mul %w, %x : tensor<4xf32>
      %1 = kiln.reduce_sum %0 axes = [0] : tensor<4xf32> -> tensor<f32>
      %2 = kiln.constant dense<1.0> : tensor<f32>
      %3 = kiln.broadcast_in_dim %2, dims = [] : tensor<f32> -> tensor<4xf32>
      %4 = kiln.mul %3, %x : tensor<4xf32>
      return %1, %4 : tensor<f32>, tensor<4xf32>
    }
    ```
  }];
  let statistics = [
    Statistic<"numGradientOps", "gradient-ops", "Ops added by the reverse sweep">,
  ];
}

def KilnMixedPrecisionPass : Pass<"kiln-mixed-precision", "mlir::ModuleOp"> {
  let summary = "Apply precision = bf16|fp16 to @forward from the per-op policy table";
  let description = [{
    Runs first in the training pipeline, on `@forward`, when the module's
    `kiln.train` has `precision = "bf16"` or `"fp16"` (or the `precision`
    option overrides it); with fp32 or no precision it does nothing at all.
    Each op is typed by its class in the policy table
    (dialects/kiln/Precision.cpp, one entry per op; docs/training.md
    renders it): `low` (operands cast to the low type), `fp32` (operands
    cast to f32), `fp32-stats` (low in and out, statistics in fp32 inside
    the kernel), `follow` (data movement) or `promote` (the widest input).
    An op with no entry is an error. Parameters stay f32 in the signature;
    a low op reads one cast of each, made at the entry with rule
    `master-weight-copy`. Results are returned in their declared types (the
    loss and logits in f32). A user's kiln.cast (no `kiln.precision.rule`)
    and ops the user typed in a non-f32 type are left as written; ops with
    `kiln.precision.fp32` (the frontend's override) stay f32. Every inserted
    cast and every op kept in fp32 carries `kiln.precision.rule`; the module
    gets `kiln.precision` and `kiln.precision.mode` (passes/Precision.h).

    Before:
    ```mlir
    func.func @forward(%w: tensor<4x4xf32> {kiln.param = "w"}, %x: tensor<2x4xf32> {kiln.input = "x"})
        -> (tensor<f32> {kiln.output = "loss"}) {
      %0 = kiln.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
      %1 = kiln.reduce_sum %0 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
      return %1 : tensor<f32>
    }
    ```
    After (bf16):
    ```mlir
    func.func @forward(%w: tensor<4x4xf32> {kiln.param = "w"}, %x: tensor<2x4xf32> {kiln.input = "x"})
        -> (tensor<f32> {kiln.output = "loss"}) {
      %wb = kiln.cast %w {kiln.precision.rule = "master-weight-copy"} : tensor<4x4xf32> -> tensor<4x4xbf16>
      %xb = kiln.cast %x {kiln.precision.rule = "gemm-low"} : tensor<2x4xf32> -> tensor<2x4xbf16>
      %0 = kiln.matmul %xb, %wb : tensor<2x4xbf16>, tensor<4x4xbf16> -> tensor<2x4xbf16>
      %0f = kiln.cast %0 {kiln.precision.rule = "reduction-fp32"} : tensor<2x4xbf16> -> tensor<2x4xf32>
      %1 = kiln.reduce_sum %0f axes = [0, 1] {kiln.precision.rule = "reduction-fp32"} : tensor<2x4xf32> -> tensor<f32>
      return %1 : tensor<f32>
    }
    ```
  }];
  let options = [
    Option<"precision", "precision", "std::string", /*default=*/"\"\"",
           "fp32, bf16 or fp16 (default: kiln.train's precision, else fp32)">,
    Option<"mode", "mode", "std::string", /*default=*/"\"\"",
           "kiln (default) or autocast (PyTorch autocast's rounding points; default: kiln.train's precision_mode)">,
  ];
  let statistics = [
    Statistic<"numCasts", "casts", "Casts inserted">,
  ];
}

def KilnTrainStepPass : Pass<"kiln-train-step", "mlir::ModuleOp"> {
  let summary = "Build @init, @grad, @train_step, @eval_step and @predict from @forward and kiln.train";
  let description = [{
    Turns the forward model into a pure training program, reading the
    module's `kiln.train` dictionary (optimizer, schedule, grad_clip,
    grad_accum, seed):

    ```mlir
    func.func @init(%seed: tensor<i64>) -> (params..., optimizer_state...)
    func.func @grad(params..., inputs...) -> (loss, grads...)
    func.func @train_step(params..., optimizer_state..., inputs..., %step: tensor<i64>)
        -> (params'..., optimizer_state'..., loss, grad_norm, lr)
    func.func @eval_step(params..., inputs...) -> loss            // dropout off
    func.func @predict(params..., inputs...) -> logits            // last position
    ```

    The train step computes the learning rate from `step` (constant, linear
    warmup, or nanoGPT's cosine schedule), the gradients (averaged over
    `grad_accum` micro-batches taken from a batch `grad_accum` times larger),
    the global gradient norm, optional clipping, and the optimizer update
    (SGD with momentum/Nesterov, Adam, AdamW with decoupled weight decay).
    Weight decay applies to linear-layer weights only; biases, norm weights
    and embeddings form the no-decay group. Dropout seeds are derived from
    `kiln.train.seed`, the step and the micro-batch, so a step replays
    exactly. See docs/training.md for every formula.
  }];
  let options = [
    Option<"emitGrad", "emit-grad", "bool", /*default=*/"true",
           "Also keep @grad (used by --gradcheck and the JAX cross-check)">,
    Option<"gradOnly", "grad-only", "bool", /*default=*/"false",
           "Build only @init and @grad (for float64 gradient checks)">,
  ];
  let statistics = [
    Statistic<"numTrainStepOps", "train-step-ops", "Ops in @train_step">,
  ];
}

def KilnDataParallelPass : Pass<"kiln-data-parallel", "mlir::ModuleOp"> {
  let summary = "The per-device @train_step of data parallelism: bucketed gradient all-reduces, ZeRO-1/2";
  let description = [{
    Runs after kiln-train-step on a module whose `kiln.mesh` has a `dp` axis
    of size N > 1 (a module without one is left unchanged). kiln-train-step
    has already built the per-device step: the model's batch B per device
    (the global batch is N * B), a `kiln.input = "replica"` argument (the
    device's coordinate on dp) mixed into dropout seeds, and tags on each
    accumulated local gradient (`kiln.dp.grad`), the local loss
    (`kiln.dp.loss`) and the gradient norm (`kiln.dp.grad_norm`). This pass

    - packs the gradients into flat buckets in the order backward produces
      them (the first bucket `first-bucket-mb` MiB, the others `bucket-mb`
      MiB, as PyTorch DDP; a bucket closes when the next gradient would pass
      its size) and all-reduces each (`mean`: the communicator sums in
      member order and divides by N) right after its last gradient, marked
      `kiln.overlap` (the communication queue);
    - all-reduces the loss (`mean`: the mean of per-device means is the
      global mean, all devices having equal batches);
    - computes the global gradient norm from each device's block of every
      reduced gradient and an all_reduce(sum) of the partial sums of squares,
      the same way with and without ZeRO, so clipping is bitwise equal;
    - with `zero` = 1 or 2: shards the optimizer state over dp (arguments
      with `kiln.shard = {axis = "dp", shape = array<i64: logical shape>}`,
      each holding block d of the zero-padded flattened tensor), updates the
      local block of every parameter and all-gathers the blocks. ZeRO-1
      all-reduces the buckets and keeps its block; ZeRO-2 reduce-scatters
      them;
    - with `grad_reduce = "bf16"` (kiln.train, or the `grad-reduce` option):
      casts each f32 bucket to bf16 before its collective and back to f32
      after, halving the bytes on the wire (the communicators accumulate
      bf16 in f32 and round once).

    Before (dp = 2; from kiln-train-step):
    ```mlir
    %gb = kiln.mul %sb, %one {kiln.dp.grad = "b"} : tensor<3xf32>
    ...
    %gw = kiln.mul %sw, %one4 {kiln.dp.grad = "w"} : tensor<3x4xf32>
    ```
    After (one bucket, right after w's gradient):
    ```mlir
    %f = kiln.reshape %gw : tensor<3x4xf32> -> tensor<12xf32>
    %c = kiln.concat %gb, %f dim = 0 : tensor<3xf32>, tensor<12xf32> -> tensor<15xf32>
    %r = kiln.all_reduce %c axis = "dp" reduction = mean {kiln.bucket = 0 : i64, kiln.overlap} : tensor<15xf32>
    %rb = kiln.slice %r start = [0] limit = [3] stride = [1] : tensor<15xf32> -> tensor<3xf32>
    ...
    ```
  }];
  let options = [
    Option<"zero", "zero", "int", /*default=*/"-1",
           "ZeRO stage 0, 1 or 2 (default: kiln.train's zero, else 0)">,
    Option<"bucketMb", "bucket-mb", "double", /*default=*/"-1",
           "Bucket size in MiB after the first (default: kiln.train's bucket_mb, else 25)">,
    Option<"firstBucketMb", "first-bucket-mb", "double", /*default=*/"-1",
           "First bucket's size in MiB (default: kiln.train's first_bucket_mb, else 1)">,
    Option<"gradReduce", "grad-reduce", "std::string", /*default=*/"\"\"",
           "Element type of the gradient buckets on the wire: fp32 or bf16 (cast "
           "before each all_reduce/reduce_scatter and back after; default: "
           "kiln.train's grad_reduce, else fp32)">,
    Option<"annotateSharding", "annotate-sharding", "bool", /*default=*/"false",
           "Attach the propagated kiln.sharding to every op of @train_step (for tests)">,
  ];
  let statistics = [
    Statistic<"numBuckets", "buckets", "Gradient buckets">,
    Statistic<"numCollectives", "collectives", "Collectives per step">,
    Statistic<"bytesReduced", "gradient-bytes", "Gradient bytes reduced per step">,
  ];
}

def KilnTensorParallelPass : Pass<"kiln-tensor-parallel", "mlir::ModuleOp"> {
  let summary = "Megatron tensor parallelism: split hinted parameters over tp, propagate, all-reduce partial sums";
  let description = [{
    Runs after kiln-train-step (and before kiln-data-parallel) on a module
    whose `kiln.mesh` has a `tp` axis of size T > 1; a module without one is
    left unchanged. Parameters carrying `kiln.tp = {dim = D, outer = K}` on
    @forward (linear layers with parallel = "column" | "row", mlp(),
    attention()) and their optimizer state are split over tp on dimension D
    (arguments and results get `kiln.shard = {axis = "tp", dim = D, outer =
    K, shape = logical}`); the shardings propagate through @train_step,
    @grad, @eval_step and @predict with the rule table of
    dialects/kiln/Sharding.cpp, a partial sum an op cannot take is made whole
    with `kiln.all_reduce ... axis = "tp" reduction = sum` (one after each
    row-parallel matmul, forward and backward), and every value gets its
    per-device type. docs/parallel.md, "Tensor parallelism".

    Before (tp = 2): `%h = kiln.matmul %x, %w1 transpose_rhs : ... -> tensor<8x16xf32>`
    with `%w1: tensor<16x4xf32>` hinted {dim = 0, outer = 1}.
    After: `%w1: tensor<8x4xf32> {kiln.shard = {...}}`, `%h : tensor<8x8xf32>`.
  }];
  let statistics = [
    Statistic<"numCollectives", "collectives", "tp collectives per training step">,
  ];
}

def KilnPipelineStagesPass : Pass<"kiln-pipeline-stages", "mlir::ModuleOp"> {
  let summary = "Give every op of @forward a pipeline stage (by hand or by the cost model)";
  let description = [{
    Runs before kiln-train-step on a module whose `kiln.mesh` has a `pp`
    axis of size P > 1 (a no-op otherwise). Ops placed by `stage N { ... }`
    blocks keep their `kiln.stage`, and every stage must hold some; without
    such blocks @forward is cut into P contiguous ranges, at layer
    boundaries (where the `kiln.block` tag changes) when there are enough,
    minimising the largest stage's cost (CostOpInterface FLOPs plus 4 x the
    bytes each op reads and writes).
    docs/parallel.md, "Pipeline parallelism".
  }];
}

def KilnPipelinePass : Pass<"kiln-pipeline", "mlir::ModuleOp"> {
  let summary = "Pipeline parallelism: stage every op, insert transfers, order the micro-batch schedule";
  let description = [{
    Runs after kiln-data-parallel on a module whose `kiln.mesh` has a `pp`
    axis of size P > 1 (a no-op otherwise). In @train_step, @eval_step and
    @predict every op gets the stage that runs it (`kiln.stage`; none: every
    device): clones of @forward's ops and their gradients keep theirs, other
    ops go where their largest operand lives and broadcasts where their
    users are. Parameters and their optimizer state belong to the stage of
    their first use (arguments carry `kiln.stage`). A value used on another
    stage crosses with `kiln.transfer`; results that are not parameter or
    state updates are broadcast to every device with
    `kiln.collective_broadcast`. @train_step's ops are then reordered into
    the schedule of the train section's `pipeline` (1f1b, the default, or
    gpipe) over its micro-batches (grad_accum). docs/parallel.md, "Pipeline
    parallelism".
  }];
  let statistics = [
    Statistic<"numTransfers", "transfers", "Stage-to-stage transfers and broadcasts per step">,
  ];
}

def KilnLowerToLinalgPass : Pass<"kiln-lower-to-linalg", "mlir::ModuleOp"> {
  let summary = "Lower kiln ops to linalg, tensor, arith and math on tensors";
  let description = [{
    The first step of the CPU code path. Elementwise ops become
    `linalg.generic` with identity maps and an arith/math body; broadcasts a
    generic whose input map drops or pins dimensions; reductions a generic
    with reduction iterators into a `linalg.fill`ed init (the mean then
    scales, keepdims expands); matmul a generic over (batch..., m, n, k) whose
    maps encode both transposes and one-sided batches; transpose
    `linalg.transpose`; reshape a collapse to one dimension and an expand.

    Before:
    ```mlir
    %0 = kiln.add %a, %b : tensor<4xf32>
    ```
    After:
    ```mlir
    %e = tensor.empty() : tensor<4xf32>
    %0 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
        ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
      ^bb0(%x: f32, %y: f32, %out: f32):
        %s = arith.addf %x, %y : f32
        linalg.yield %s : f32
    } -> tensor<4xf32>
    ```
    slice, pad, concat and gather become tensor slices and a gathering
    generic; scatter_add an scf.for; random and dropout the counter-based
    hash per element; softmax, log_softmax, layer_norm and cross_entropy are
    decomposed into kiln primitives lowered in the same run. A kiln op left
    over is an error (or stays, with `allow-partial`).
  }];
  let dependentDialects = ["mlir::linalg::LinalgDialect", "mlir::tensor::TensorDialect",
                           "mlir::arith::ArithDialect", "mlir::math::MathDialect",
                           "mlir::scf::SCFDialect"];
  let options = [
    Option<"allowPartial", "allow-partial", "bool", /*default=*/"false",
           "Leave ops without a lowering in place instead of failing">,
  ];
}

def KilnRaiseAttentionPass : Pass<"kiln-raise-attention", "mlir::ModuleOp"> {
  let summary = "Raise attention written from primitives into kiln.attention";
  let description = [{
    Finds, in @forward (or every function with `functions`), the chain

    ```
    s = q kᵀ   [* c | / c]   [select(mask, s, -inf) | s + additive mask]
    p = softmax(s) over the keys   [dropout(p)]   o = p v
    ```

    with q `[B, H, T, D]`, k `[B, H, S, D]` and v `[B, H, S, Dv]` (kᵀ as
    `transpose_rhs` or a `[0, 1, 3, 2]` transpose), and replaces it by one
    `kiln.attention` (the `attention` layer's expansion and a user's
    hand-written attention alike). A `rows >= cols` iota mask becomes
    `causal`. The intermediate scores and probabilities must have no other
    use, and a float mask must not depend on an input or a parameter (it
    gets no gradient). The train setting `attention` decides: `fused` raises
    every match, `unfused` none, `auto` (the default) those over at least
    `min-keys` keys. Each softmax over a rank-4 tensor gets a remark: what
    was raised, or why not; they are kept on the module as
    `kiln.attention_remarks` for the fusion report (kilnc --fusion-report).
  }];
  let options = [
    ListOption<"functions", "functions", "std::string",
               "Functions to rewrite (default: forward)">,
    Option<"minKeys", "min-keys", "int64_t", /*default=*/"128",
           "attention = auto (the default): raise only attention over at least this "
           "many keys (below it the unfused GEMMs and softmax kernel are faster on "
           "the CPU); attention = fused raises every one, unfused none">,
  ];
}

def KilnSplitLossesPass : Pass<"kiln-split-losses", "mlir::ModuleOp"> {
  let summary = "Split a mean or summed cross_entropy into per-row losses and one reduction";
  let description = [{
    Kernel formation's first step: `cross_entropy(reduction = mean|sum)` is
    a row reduction (one loss per position) followed by a reduction over
    every row, two kernel forms, so it becomes two ops: a
    `cross_entropy(reduction = none)` and a `reduce_mean` or `reduce_sum`
    over all its dimensions (each keeps the op's `kiln.stage`).

    Before:
    ```mlir
    %l = kiln.cross_entropy %z, %t reduction = mean : tensor<8x5xf32>, tensor<8xi32> -> tensor<f32>
    ```
    After:
    ```mlir
    %p = kiln.cross_entropy %z, %t reduction = none : tensor<8x5xf32>, tensor<8xi32> -> tensor<8xf32>
    %l = kiln.reduce_mean %p axes = [0] : tensor<8xf32> -> tensor<f32>
    ```
  }];
  let options = [
    ListOption<"functions", "functions", "std::string",
               "Functions to rewrite (default: all)">,
  ];
}

def KilnMarkForwardPass : Pass<"kiln-mark-forward", "mlir::ModuleOp"> {
  let summary = "Mark the ops of @train_step's first forward pass";
  let description = [{
    Finds the loss of the first micro-batch in @train_step (through the
    data-parallel scalar exchange, the 1/K scale and the chain or tree of
    micro-batch sums) and marks every op it depends on with the unit
    attribute `kiln.plan.forward`. kiln-fuse keeps the mark on the ops it
    moves into kernels; the plan reads it to report the activations the
    forward pass keeps for the backward (kilnc --emit=plan), and removes it.
  }];
}

def KilnFusePass : Pass<"kiln-fuse", "mlir::ModuleOp"> {
  let summary = "Group each function's ops into kiln.fusion kernels";
  let description = [{
    The kernel level of the training program: every op that computes
    something ends up in one `kiln.fusion` op, the unit of code generation,
    whose `kind` is its kernel form (docs/codegen.md "Fusion" and "Kernel
    forms"). Elementwise chains fuse through broadcasts, reshapes,
    transposes, slices, pads and gathers; reductions take the elementwise
    ops before and after them when they share leading row dimensions (a
    whole layer_norm backward is one row kernel); reductions over leading
    dimensions become column reductions, with sibling reductions of the same
    shape in one kernel; elementwise ops on a float32 GEMM's result become
    its epilogue; small row-independent values (the learning-rate schedule,
    causal masks) are recomputed in each kernel that reads them; attention's
    head transposes stay outside, folded into their GEMMs. The body is then
    re-sorted topologically.

    Before:
    ```mlir
    %0 = kiln.add %x, %y : tensor<8x16xf32>
    %1 = kiln.exp %0 : tensor<8x16xf32>
    %2 = kiln.reduce_sum %1 axes = [1] : tensor<8x16xf32> -> tensor<8xf32>
    ```
    After:
    ```mlir
    %0 = kiln.fusion "row_reduction" rows = 1 ins(%x, %y) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8xf32> {
    ^bb0(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>):
      %1 = kiln.add %a, %b : tensor<8x16xf32>
      %2 = kiln.exp %1 : tensor<8x16xf32>
      %3 = kiln.reduce_sum %2 axes = [1] : tensor<8x16xf32> -> tensor<8xf32>
      kiln.yield %3 : tensor<8xf32>
    }
    ```
    With `remarks`, every producer -> consumer edge that was not fused is
    reported as a remark naming the rule that refused it.
  }];
  let options = [
    Option<"disable", "disable", "bool", /*default=*/"false",
           "One op per kernel (kilnc --no-fusion)">,
    Option<"gemmEpilogues", "gemm-epilogues", "bool", /*default=*/"true",
           "Let elementwise ops on a GEMM's result join it as an epilogue">,
    Option<"duplicateCheap", "duplicate-cheap", "bool", /*default=*/"true",
           "Recompute small row-independent values in each kernel that reads them">,
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark for every fusion refused, with its rule">,
    ListOption<"functions", "functions", "std::string",
               "Functions to fuse (default: all)">,
  ];
}

def KilnPolynomialMathPass : Pass<"kiln-polynomial-math", "mlir::ModuleOp"> {
  let summary = "Replace float32 math functions by polynomial approximations";
  let description = [{
    Part of the CPU kernel lowering (passes/Pipelines.cpp), after the loops:
    upstream MLIR's polynomial approximations of `math.tanh`, `math.erf`,
    `math.exp`, `math.log`, `math.sin`, `math.cos`, ... on float32 (scalars
    or vectors) as arith ops, mostly FMAs, which LLVM vectorizes; a libm call
    would not vectorize. Float64 functions are left as they are (lowered to
    LLVM intrinsics or libm later).

    Before:
    ```mlir
    %y = math.tanh %x : f32
    ```
    After (shortened):
    ```mlir
    %c = arith.constant -9.0 : f32
    %x0 = arith.maximumf %x, %c : f32
    %x2 = arith.mulf %x0, %x0 : f32
    %p = math.fma %x2, %a1, %a0 : f32
    ...
    %y = arith.select %small, %x, %r : f32
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect", "mlir::math::MathDialect"];
}

def KilnExpandBF16Pass : Pass<"kiln-expand-bf16", "mlir::ModuleOp"> {
  let summary = "Convert between bf16 and f32 with integer ops, so the loops vectorize";
  let description = [{
    Part of the CPU kernel lowering (passes/Pipelines.cpp), after the loops:
    upstream MLIR's bf16 expansion of `arith.extf` (bf16 to f32: the 16 bits
    shifted into the high half, exact) and `arith.truncf` (f32 to bf16: round
    to nearest even by adding 0x7fff plus the lowest kept bit; a NaN becomes
    the quiet NaN 0x7fc0). LLVM's own `fptrunc`/`fpext` on `bfloat` are
    costed as scalar: the vectorizer then picked 2 lanes for every kernel
    that loads or stores bf16 (the GPT's gelu backward ran 3x slower than in
    f32); the integer form vectorizes like f32 code. Other types, f16
    included, and every other arith op are left as they are, so f32 kernels
    are unchanged.

    Before:
    ```mlir
    %y = arith.truncf %x : f32 to bf16
    ```
    After (shortened):
    ```mlir
    %b = arith.bitcast %x : f32 to i32
    %bias = arith.addi %lowest_kept_bit, %c32767 : i32
    %r = arith.shrui (arith.addi %b, %bias), %c16 : i32
    %n = arith.select %is_nan, %c0x7fc0, (arith.trunci %r : i32 to i16) : i16
    %y = arith.bitcast %n : i16 to bf16
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect"];
}

def KilnKernelElementwiseFusionPass
    : Pass<"kiln-kernel-elementwise-fusion", "mlir::ModuleOp"> {
  let summary = "Fuse every elementwise linalg producer into each of its consumers";
  let description = [{
    Part of the CPU kernel lowering (passes/Pipelines.cpp), after
    kiln-lower-to-linalg: linalg's elementwise fusion inside each kernel, with
    producers fused into every consumer (the upstream pass fuses producers
    with one use only), plus linalg constant folding and the canonicalization
    patterns of linalg.generic and tensor reshapes. A value that several ops
    of a kernel read (a softmax's exponentials, read by the row sum and by the
    division; layer_norm's normalized input) is then recomputed in each loop
    nest instead of materialised in a temporary buffer, so fused ops exchange
    no intermediate arrays; only reduction results (one value per row) stay
    in memory. The truncation that ends an f32 accumulation over bf16/f16
    (`kiln_accumulator`) is also moved through the reshapes after it, so it
    fuses into the reduction's readers (f32 generics are not affected).

    Before:
    ```mlir
    %e = linalg.generic {...} ins(%x : tensor<4xf32>) outs(%t0 : tensor<4xf32>) {
      ^bb0(%a: f32, %o: f32):
        %0 = math.exp %a : f32
        linalg.yield %0 : f32
    } -> tensor<4xf32>
    %s = linalg.generic {...} ins(%e, %y : ...) outs(%t1 : tensor<4xf32>) { ... arith.addf ... }
    %m = linalg.generic {...} ins(%e, %y : ...) outs(%t2 : tensor<4xf32>) { ... arith.mulf ... }
    ```
    After: two generics, each computing `math.exp` itself:
    ```mlir
    %s = linalg.generic {...} ins(%x, %y : ...) outs(%t1 : tensor<4xf32>) {
      ^bb0(%a: f32, %b: f32, %o: f32):
        %0 = math.exp %a : f32
        %1 = arith.addf %0, %b : f32
        linalg.yield %1 : f32
    } -> tensor<4xf32>
    %m = linalg.generic {...} ins(%x, %y : ...) outs(%t2 : tensor<4xf32>) { ... math.exp, arith.mulf ... }
    ```
  }];
  let dependentDialects = ["mlir::linalg::LinalgDialect", "mlir::tensor::TensorDialect",
                           "mlir::arith::ArithDialect"];
}

def KilnWidenLowPrecisionPass
    : Pass<"kiln-widen-low-precision", "mlir::ModuleOp"> {
  let summary = "Compute bf16/f16 in f32 inside each generic; round once where stored";
  let description = [{
    Part of the CPU kernel lowering (passes/Pipelines.cpp), after
    kiln-kernel-elementwise-fusion: bf16 and f16 are storage types. In each
    `linalg.generic` whose body touches a low-precision type, every loaded
    value is widened to f32 once (`arith.extf`, exact), every arith/math op
    is rebuilt on f32, and a value is rounded to nearest even
    (`arith.truncf`) only where the generic yields it to a bf16/f16 output.
    An explicit cast (a `truncf` to a low type) stays a rounding point; a
    `truncf` tagged `kiln_accumulator` (the end of an f32 reduction) does not
    round values used inside the kernel. f32, f64 and integer generics are
    unchanged.

    Before:
    ```mlir
    ^bb0(%a: bf16, %b: bf16, %o: bf16):
      %0 = arith.addf %a, %b : bf16
      %1 = arith.mulf %0, %b : bf16
      linalg.yield %1 : bf16
    ```
    After:
    ```mlir
    ^bb0(%a: bf16, %b: bf16, %o: bf16):
      %a32 = arith.extf %a : bf16 to f32
      %b32 = arith.extf %b : bf16 to f32
      %0 = arith.addf %a32, %b32 : f32
      %1 = arith.mulf %0, %b32 : f32
      %r = arith.truncf %1 : f32 to bf16
      linalg.yield %r : bf16
    ```
  }];
  let dependentDialects = ["mlir::arith::ArithDialect"];
}

#endif // KILN_PASSES_TD
