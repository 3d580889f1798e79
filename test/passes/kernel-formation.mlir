// Kernel formation (passes/KernelFormation.cpp, Pipelines.h): the passes
// code generation runs before it forms steps, each dumpable on its own.
//
// RUN: kiln-opt %s --kiln-split-losses="functions=train_step" | FileCheck %s --check-prefix=SPLIT
// RUN: kiln-opt %s --kiln-split-losses --kiln-mark-forward | FileCheck %s --check-prefix=MARK
// RUN: kiln-opt %s --kiln-kernel-formation | FileCheck %s --check-prefix=FORMED
//
// kilnc --print-ir-after-all dumps every pass of the training pipeline and
// of kernel formation.
// RUN: kilnc %examples/mlp.kiln --emit=plan --print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=DUMP
// DUMP: IR Dump After KilnTrainStepPass (kiln-train-step)
// DUMP: IR Dump After CSE (cse)
// DUMP: IR Dump After KilnSplitLossesPass (kiln-split-losses)
// DUMP: IR Dump After KilnMarkForwardPass (kiln-mark-forward)
// DUMP: IR Dump After KilnFusePass (kiln-fuse)
// DUMP: kiln.fusion "row_reduction"

// A mean loss becomes per-row losses and a mean over them, in the functions
// named (here @train_step only; @forward keeps its op).
// SPLIT-LABEL: func.func @forward
// SPLIT: kiln.cross_entropy %{{.*}}, %{{.*}} reduction = mean
// SPLIT-LABEL: func.func @train_step
// SPLIT: %[[PER:.*]] = kiln.cross_entropy %{{.*}}, %{{.*}} reduction = none : tensor<4x3xf32>, tensor<4xi32> -> tensor<4xf32>
// SPLIT-NEXT: kiln.reduce_mean %[[PER]] axes = [0] : tensor<4xf32> -> tensor<f32>

// The first forward pass of @train_step is marked: the loss and what it
// reads, not the ops after it.
// MARK-LABEL: func.func @train_step
// MARK: kiln.exp {{.*}} {kiln.plan.forward}
// MARK: kiln.cross_entropy {{.*}} {kiln.plan.forward}
// MARK: kiln.reduce_mean {{.*}} {kiln.plan.forward}
// MARK: kiln.mul
// MARK-NOT: kiln.plan.forward
// MARK: return

// Then kiln-fuse: the marks ride into the kernels.
// FORMED-LABEL: func.func @train_step
// FORMED: kiln.fusion
// FORMED: kiln.cross_entropy {{.*}} {kiln.plan.forward}

func.func @forward(%z: tensor<4x3xf32> {kiln.input = "z"}, %t: tensor<4xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}) {
  %l = kiln.cross_entropy %z, %t reduction = mean : tensor<4x3xf32>, tensor<4xi32> -> tensor<f32>
  return %l : tensor<f32>
}

func.func @train_step(%z: tensor<4x3xf32> {kiln.input = "z"}, %t: tensor<4xi32> {kiln.input = "t"}) -> (tensor<f32> {kiln.output = "loss"}, tensor<f32> {kiln.output = "scaled"}) {
  %e = kiln.exp %z : tensor<4x3xf32>
  %l = kiln.cross_entropy %e, %t reduction = mean : tensor<4x3xf32>, tensor<4xi32> -> tensor<f32>
  %two = kiln.constant dense<2.0> : tensor<f32>
  %s = kiln.mul %l, %two : tensor<f32>
  return %l, %s : tensor<f32>, tensor<f32>
}
