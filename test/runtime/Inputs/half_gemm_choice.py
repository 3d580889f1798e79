"""Checks for test/runtime/half-gemm-choice.test: DIR [--damaged].

Without --damaged: when the first run measured (MKL present, or a CPU with
AVX512-BF16 for Kiln's own bf16 GEMM), it wrote one
cache line per measured shape and printed one debug line per shape, and
the later runs measured nothing; then damages the first cache line.
With --damaged: the run after the damage warned about that line and
measured that one shape again (one debug line).
"""
import os
import sys

d = sys.argv[1]
cache = os.path.join(d, "c", "half-gemm-v2.txt")


def measured(name):
    with open(os.path.join(d, name)) as f:
        return [l for l in f if "widened + sgemm" in l]


if "--damaged" in sys.argv:
    err = open(os.path.join(d, "damaged.err")).read()
    if not os.path.exists(cache):
        sys.exit(0)  # no MKL: nothing to damage
    assert "a damaged half-precision GEMM choice; ignored" in err, err
    assert len(measured("damaged.err")) == 1, err
    print("damaged line skipped and measured again")
    sys.exit(0)

first = measured("first.err")
if not os.path.exists(cache):
    assert not first, "measured without writing the cache"
    print("no library or dot-product bf16 GEMM: nothing measured")
    sys.exit(0)
lines = open(cache).read().splitlines()
assert len(first) == len(lines) >= 4, (first, lines)  # forward and backward shapes
assert all(" bf16 (" in l and ("half-gemms.kiln:" in l) for l in first), first
for later in ("second.err", "one.err"):
    assert not measured(later), later
# Damage the first line: change its measured time, keep its check hash.
parts = lines[0].split(" ")
parts[3] = "999.0"
lines[0] = " ".join(parts)
open(cache, "w").write("\n".join(lines) + "\n")
print(f"{len(lines)} choices remembered")
