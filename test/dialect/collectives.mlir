// RUN: kiln-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// RUN: kiln-opt %s --split-input-file --verify-diagnostics | kiln-opt --split-input-file --verify-diagnostics | FileCheck %s

// The collectives (kiln.all_reduce, kiln.reduce_scatter, kiln.all_gather),
// the kiln.mesh module attribute and kiln.overlap: round trips (the second
// RUN line re-parses the printed form), then one case per verifier error.

// CHECK: module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 4>}}
// CHECK-LABEL: func.func @round_trip
// CHECK: kiln.all_reduce %{{.*}} axis = "dp" reduction = sum : tensor<8x6xf32>
// CHECK: kiln.all_reduce %{{.*}} axis = "tp" reduction = mean {kiln.overlap} : tensor<8x6xf32>
// CHECK: kiln.all_reduce %{{.*}} axis = "dp" reduction = max : tensor<8x6xf32>
// CHECK: kiln.all_reduce %{{.*}} axis = "dp" reduction = min : tensor<8x6xi32>
// CHECK: kiln.reduce_scatter %{{.*}} axis = "tp" reduction = sum dim = 0 : tensor<8x6xf32> -> tensor<2x6xf32>
// CHECK: kiln.reduce_scatter %{{.*}} axis = "dp" reduction = mean dim = 1 : tensor<8x6xf32> -> tensor<8x3xf32>
// CHECK: kiln.all_gather %{{.*}} axis = "tp" dim = 0 : tensor<8x6xf32> -> tensor<32x6xf32>
// CHECK: kiln.all_gather %{{.*}} axis = "dp" dim = 1 : tensor<8x6xi64> -> tensor<8x12xi64>
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 2, 4>}} {
func.func @round_trip(%x: tensor<8x6xf32>, %i: tensor<8x6xi32>, %j: tensor<8x6xi64>) {
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum : tensor<8x6xf32>
  %1 = kiln.all_reduce %x axis = "tp" reduction = mean {kiln.overlap} : tensor<8x6xf32>
  %2 = kiln.all_reduce %x axis = "dp" reduction = max : tensor<8x6xf32>
  %3 = kiln.all_reduce %i axis = "dp" reduction = min : tensor<8x6xi32>
  %4 = kiln.reduce_scatter %x axis = "tp" reduction = sum dim = 0 : tensor<8x6xf32> -> tensor<2x6xf32>
  %5 = kiln.reduce_scatter %x axis = "dp" reduction = mean dim = 1 : tensor<8x6xf32> -> tensor<8x3xf32>
  %6 = kiln.all_gather %x axis = "tp" dim = 0 : tensor<8x6xf32> -> tensor<32x6xf32>
  %7 = kiln.all_gather %j axis = "dp" dim = 1 : tensor<8x6xi64> -> tensor<8x12xi64>
  return
}
}

// -----

// A mesh axis of size 1: the ops are identities, and valid.
// CHECK-LABEL: func.func @size_one
// CHECK: kiln.all_gather %{{.*}} axis = "dp" dim = 0 : tensor<3xf32> -> tensor<3xf32>
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 1>}} {
func.func @size_one(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = kiln.all_gather %x axis = "dp" dim = 0 : tensor<3xf32> -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
}

// -----

// No kiln.mesh: no axis exists.
func.func @no_mesh(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'kiln.all_reduce' op axis 'dp' is not an axis of the module's mesh (kiln.mesh)}}
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @unknown_axis(%x: tensor<4xf32>) -> tensor<2xf32> {
  // expected-error @below {{'kiln.reduce_scatter' op axis 'tp' is not an axis of the module's mesh (kiln.mesh)}}
  %0 = kiln.reduce_scatter %x axis = "tp" reduction = sum dim = 0 : tensor<4xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @missing_axis(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{expected 'axis'}}
  %0 = kiln.all_reduce %x reduction = sum : tensor<4xf32>
  return %0 : tensor<4xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @bad_reduction(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{expected string or keyword containing one of the following enum values for attribute 'reduction' [sum, mean, max, min]}}
  %0 = kiln.all_reduce %x axis = "dp" reduction = prod : tensor<4xf32>
  return %0 : tensor<4xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @gather_bad_dim(%x: tensor<4xf32>) -> tensor<8xf32> {
  // expected-error @below {{'kiln.all_gather' op dim 1 is out of range for rank 1}}
  %0 = kiln.all_gather %x axis = "dp" dim = 1 : tensor<4xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @scatter_negative_dim(%x: tensor<4xf32>) -> tensor<2xf32> {
  // expected-error @below {{'kiln.reduce_scatter' op dim -1 is out of range for rank 1}}
  %0 = kiln.reduce_scatter %x axis = "dp" reduction = sum dim = -1 : tensor<4xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 4>}} {
func.func @indivisible(%x: tensor<6x2xf32>) -> tensor<1x2xf32> {
  // expected-error @below {{'kiln.reduce_scatter' op dim 0 of size 6 does not split into 4 equal blocks}}
  %0 = kiln.reduce_scatter %x axis = "dp" reduction = sum dim = 0 : tensor<6x2xf32> -> tensor<1x2xf32>
  return %0 : tensor<1x2xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 4>}} {
func.func @scatter_wrong_shape(%x: tensor<8x2xf32>) -> tensor<4x2xf32> {
  // expected-error @below {{'kiln.reduce_scatter' op result has shape [4, 2] but expected [2, 2]}}
  %0 = kiln.reduce_scatter %x axis = "dp" reduction = sum dim = 0 : tensor<8x2xf32> -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 4>}} {
func.func @gather_wrong_shape(%x: tensor<2x3xf32>) -> tensor<2x6xf32> {
  // expected-error @below {{'kiln.all_gather' op result has shape [2, 6] but expected [8, 3]}}
  %0 = kiln.all_gather %x axis = "dp" dim = 0 : tensor<2x3xf32> -> tensor<2x6xf32>
  return %0 : tensor<2x6xf32>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @gather_wrong_type(%x: tensor<2xf32>) -> tensor<4xf16> {
  // expected-error @below {{'kiln.all_gather' op operand and result element types differ}}
  %0 = kiln.all_gather %x axis = "dp" dim = 0 : tensor<2xf32> -> tensor<4xf16>
  return %0 : tensor<4xf16>
}
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @all_reduce_of_bool(%x: tensor<2xi1>) -> tensor<2xi1> {
  // expected-error @below {{'kiln.all_reduce' op operand #0 must be}}
  %0 = kiln.all_reduce %x axis = "dp" reduction = max : tensor<2xi1>
  return %0 : tensor<2xi1>
}
}

// -----

func.func @overlap_off_collective(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @below {{'kiln.overlap' belongs on a collective (kiln.all_reduce, kiln.reduce_scatter, kiln.all_gather)}}
  %0 = kiln.exp %x {kiln.overlap} : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>}} {
func.func @overlap_not_unit(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @below {{'kiln.overlap' must be a unit attribute}}
  %0 = kiln.all_reduce %x axis = "dp" reduction = sum {kiln.overlap = 1 : i64} : tensor<2xf32>
  return %0 : tensor<2xf32>
}
}

// -----

// expected-error @below {{'kiln.mesh' must be {axes = ["dp", ...], shape = array<i64: 4, ...>}}}
module attributes {kiln.mesh = {axes = ["dp"]}} {
}

// -----

// expected-error @below {{'kiln.mesh' must be {axes = ["dp", ...], shape = array<i64: 4, ...>}}}
module attributes {kiln.mesh = ["dp"]} {
}

// -----

// expected-error @below {{'kiln.mesh' needs one size per axis and at least one axis}}
module attributes {kiln.mesh = {axes = ["dp", "tp"], shape = array<i64: 4>}} {
}

// -----

// expected-error @below {{'kiln.mesh' needs one size per axis and at least one axis}}
module attributes {kiln.mesh = {axes = [], shape = array<i64>}} {
}

// -----

// expected-error @below {{'kiln.mesh' axis names must be non-empty strings}}
module attributes {kiln.mesh = {axes = [""], shape = array<i64: 2>}} {
}

// -----

// expected-error @below {{'kiln.mesh' axis names must be non-empty strings}}
module attributes {kiln.mesh = {axes = [3], shape = array<i64: 2>}} {
}

// -----

// expected-error @below {{'kiln.mesh' names axis 'dp' twice}}
module attributes {kiln.mesh = {axes = ["dp", "dp"], shape = array<i64: 2, 2>}} {
}

// -----

// expected-error @below {{'kiln.mesh' axis 'dp' has size 0 (must be >= 1)}}
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 0>}} {
}

// -----

// expected-error @below {{'kiln.mesh' must be {axes = ["dp", ...], shape = array<i64: 4, ...>}}}
module attributes {kiln.mesh = {axes = ["dp"], shape = array<i64: 2>, groups = 1}} {
}
