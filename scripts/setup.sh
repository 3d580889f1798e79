#!/usr/bin/env bash
# Installs every Debian and Python package Kiln's build and tests need, then
# configures build/ (CMake + Ninja + ccache). Idempotent: a second run checks
# and does nothing. Works as root or with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  cmake ninja-build ccache g++ git python3 python3-pip
  llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
  libfmt-dev libgtest-dev libopenblas-dev nlohmann-json3-dev
  clang-19 libclang-rt-19-dev
  libopenmpi-dev openmpi-bin
)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages (lit itself ships with llvm-19-tools), as
# "distribution:pip-spec"; each is installed only if it is not already.
# jax: test/jax/crosscheck.py (the JAX cross-check of the train step).
# mkl: Intel oneMKL's libmkl_rt, which kiln-run loads at run time for the
# CPU backend's GEMMs (runtime/cpu/Blas.h; OpenBLAS when it is missing).
PYTHON=${PYTHON:-python3}
PY_PACKAGES=(numpy:numpy "jax:jax[cpu]" mkl:mkl)
PY_PACKAGES+=(tensorboard:tensorboard) # TensorBoard's reader: test/tools/tensorboard*.test, tools/tb-plot.py
PY_PACKAGES+=(perfetto:perfetto) # test/runtime/check-trace.py: Perfetto's trace processor (with KILN_TRACE_PROCESSOR)
# TensorBoard's Profile tab (it brings xprof, which reads the XSpace files of
# kiln-run train --tensorboard DIR --trace-steps A:B): test/tools/tensorboard-profile*.test.
# 2.24 is the version those files were checked against.
PY_PACKAGES+=("tensorboard-plugin-profile:tensorboard-plugin-profile==2.24.*")
for entry in "${PY_PACKAGES[@]}"; do
  dist=${entry%%:*} spec=${entry#*:}
  "$PYTHON" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null ||
    "$PYTHON" -m pip install -q "$spec"
done

# ccache hits across clones and build folders: hash paths relative to the
# repository (see CCACHE_BASEDIR in ccache(1)).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

BUILD_DIR=${KILN_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
fi
