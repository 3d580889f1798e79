#!/usr/bin/env bash
# The whole test suite: set up, build, run lit + GoogleTest (one target,
# check-kiln), then the frontend robustness test again and the libFuzzer
# targets, under ASan/UBSan (clang).
# KILN_SKIP_SANITIZERS=1 skips the sanitizer build (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
BUILD_DIR=${KILN_BUILD_DIR:-build}
cmake --build "$BUILD_DIR" --target check-kiln

if [ "${KILN_SKIP_SANITIZERS:-0}" != 1 ]; then
  # One sanitizer build with clang (libFuzzer needs it): the frontend
  # robustness test and the libFuzzer targets (test/fuzz) under ASan/UBSan.
  ASAN_DIR=${KILN_ASAN_BUILD_DIR:-build-asan}
  if [ -f "$ASAN_DIR/CMakeCache.txt" ] && ! grep -q '^KILN_FUZZ:BOOL=ON' "$ASAN_DIR/CMakeCache.txt"; then
    rm -rf "$ASAN_DIR" # an older gcc-configured sanitizer build
  fi
  if [ ! -f "$ASAN_DIR/build.ninja" ]; then
    CC=clang-19 CXX=clang++-19 cmake -G Ninja -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKILN_SANITIZE=address,undefined -DKILN_ENABLE_CUDA=OFF -DKILN_FUZZ=ON
  fi
  cmake --build "$ASAN_DIR" --target kiln-frontend-fuzz kiln-fuzzers
  echo "== frontend robustness under ASan/UBSan =="
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ASAN_OPTIONS=detect_leaks=1 \
    "$ASAN_DIR"/bin/kiln-frontend-fuzz --gtest_brief=1
  # A short, bounded libFuzzer pass of each loader (docs/testing.md: the
  # long campaign).
  echo "== libFuzzer: model files, artifacts, checkpoints, token and .npy files =="
  test/fuzz/run.sh "$ASAN_DIR"/bin "$BUILD_DIR"/bin "$ASAN_DIR"/fuzz \
    "${KILN_FUZZ_RUNS:-3000}" "${KILN_FUZZ_SECONDS:-45}"
fi
