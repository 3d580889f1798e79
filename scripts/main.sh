#!/usr/bin/env bash
# The main job: set up, build, and compile the example GPT model
# (nanoGPT's shakespeare_char), printing its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build "${KILN_BUILD_DIR:-build}" --target kilnc
"${KILN_BUILD_DIR:-build}"/bin/kilnc examples/shakespeare_char.kiln "$@"
