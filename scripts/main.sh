#!/usr/bin/env bash
# The main job: set up and build, then compile and train the CPU-size
# shakespeare_char GPT (nanoGPT's CPU config: 4 layers, 4 heads, width 128,
# context 64, batch 12, 2000 steps) on tinyshakespeare, and print a
# 200-character sample. Extra arguments go to `kiln-run train` (for example
# --steps 200 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
BUILD=${KILN_BUILD_DIR:-build}
cmake --build "$BUILD" --target kilnc kiln-run
BIN=$BUILD/bin
OUT=$BUILD/main
mkdir -p "$OUT"

# 1. Data: characters -> uint16 tokens, 90/10 train/validation split.
if [ ! -f data/shakespeare_char/train.bin ]; then
  "$BIN"/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char
fi
# 2. Compile: model file -> training program -> kernels + plan -> artifact.
"$BIN"/kilnc examples/shakespeare_char_cpu.kiln
"$BIN"/kilnc examples/shakespeare_char_cpu.kiln -o "$OUT"/shakespeare_char_cpu.kpack
# 3. Train on the CPU (data paths come from the model's train section).
"$BIN"/kiln-run train "$OUT"/shakespeare_char_cpu.kpack \
  --checkpoint "$OUT"/shakespeare_char_cpu.ckpt.safetensors "$@"
# 4. Sample from the trained model.
echo "--- sample (200 characters, temperature 0.8, top-k 40) ---"
"$BIN"/kiln-run sample "$OUT"/shakespeare_char_cpu.kpack \
  --checkpoint "$OUT"/shakespeare_char_cpu.ckpt.safetensors \
  --tokens 200 --temperature 0.8 --top-k 40 --seed 1
