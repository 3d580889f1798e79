#!/usr/bin/env bash
# The whole test suite: set up, build, run lit + GoogleTest (one target,
# check-kiln), then the frontend robustness test again under ASan/UBSan.
# KILN_SKIP_SANITIZERS=1 skips the sanitizer build (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
BUILD_DIR=${KILN_BUILD_DIR:-build}
cmake --build "$BUILD_DIR" --target check-kiln

if [ "${KILN_SKIP_SANITIZERS:-0}" != 1 ]; then
  ASAN_DIR=${KILN_ASAN_BUILD_DIR:-build-asan}
  if [ ! -f "$ASAN_DIR/build.ninja" ]; then
    cmake -G Ninja -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DKILN_SANITIZE=address,undefined -DKILN_ENABLE_CUDA=OFF
  fi
  cmake --build "$ASAN_DIR" --target kiln-frontend-fuzz
  echo "== frontend robustness under ASan/UBSan =="
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ASAN_OPTIONS=detect_leaks=1 \
    "$ASAN_DIR"/bin/kiln-frontend-fuzz --gtest_brief=1
fi
