// RUN: kiln-opt %s --split-input-file --verify-diagnostics
//
// The dialect verifies every rule of the train configuration
// (dialects/kiln/TrainSettings.h: train_rules, verifyTrainSettings) on any
// module, whoever wrote kiln.train: the frontend, kilnc's layout flags or
// the planner. The frontend and kilnc ask the same rules first, to say it
// at the setting's line or in the flags' words.

// expected-error @+1 {{kiln.train: tp = 2 must divide devices = 3}}
module attributes {kiln.train = {devices = 3 : i64, tp = 2 : i64}} {}

// -----

// expected-error @+1 {{kiln.train: devices = 6 is not a multiple of pp x tp = 4 x 1}}
module attributes {kiln.train = {devices = 6 : i64, pp = 4 : i64}} {}

// -----

// expected-error @+1 {{kiln.train: zero = 1 shards optimizer state over data-parallel replicas, and devices / (pp x tp) = 1}}
module attributes {kiln.train = {devices = 2 : i64, tp = 2 : i64, zero = 1 : i64}} {}

// -----

// expected-error @+1 {{kiln.train: virtual_stages needs pipeline = "interleaved"}}
module attributes {kiln.train = {devices = 2 : i64, pp = 2 : i64, virtual_stages = 2 : i64}} {}

// -----

// expected-error @+1 {{kiln.train: pipeline 'zigzag' is not 1f1b, gpipe or interleaved}}
module attributes {kiln.train = {pipeline = "zigzag"}} {}

// -----

// A consistent layout verifies: 8 devices as pp 2 x dp 2 x tp 2 with ZeRO.
module attributes {kiln.train = {devices = 8 : i64, pp = 2 : i64, tp = 2 : i64, zero = 1 : i64,
                                 pipeline = "interleaved", virtual_stages = 2 : i64,
                                 precision = "bf16", precision_mode = "autocast"}} {}
