#!/usr/bin/env python3
"""Damages a .kpack many ways and checks that kiln-run rejects every copy
with a clear error (exit 1, a message naming the file), never a crash.

  corrupt.py KILN_RUN ARTIFACT WORKDIR [--count N] [--seed S]

Damage: truncation at random lengths (and at 0, 8, 63, 64 bytes), single and
multiple random byte flips, a zeroed 4 KiB block. Each copy goes through
`kiln-run eval` (load, verify, JIT) with a missing validation file, so a copy
that verified would fail later with a different message; we require the
artifact's own error.
"""
import argparse
import os
import random
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln_run")
    ap.add_argument("artifact")
    ap.add_argument("workdir")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = open(a.artifact, "rb").read()
    rng = random.Random(a.seed)
    cases = [("truncate 0", data[:0]), ("truncate 8", data[:8]), ("truncate 63", data[:63]),
             ("truncate 64", data[:64]), ("truncate -1", data[:-1])]
    for i in range(a.count):
        kind = i % 4
        b = bytearray(data)
        if kind == 0:
            n = rng.randrange(len(data))
            cases.append((f"truncate {n}", bytes(b[:n])))
        elif kind == 1:
            at = rng.randrange(len(data))
            b[at] ^= 1 << rng.randrange(8)
            cases.append((f"flip byte {at}", bytes(b)))
        elif kind == 2:
            for _ in range(8):
                b[rng.randrange(len(b))] = rng.randrange(256)
            cases.append(("8 random bytes", bytes(b)))
        else:
            while True:  # a block that is not already zero (optimizer state is)
                at = rng.randrange(len(data) - 4096)
                if any(data[at:at + 4096]):
                    break
            b[at:at + 4096] = bytes(4096)
            cases.append((f"zero 4 KiB at {at}", bytes(b)))
        if cases[-1][1] == data:  # a "random" change that changed nothing
            cases.pop()
            b[0] ^= 0xff
            cases.append(("flip byte 0", bytes(b)))
    bad = 0
    for i, (what, blob) in enumerate(cases):
        path = os.path.join(a.workdir, f"c{i}.kpack")
        open(path, "wb").write(blob)
        p = subprocess.run([a.kiln_run, "eval", path, "--val-data", "/nonexistent/val.bin",
                            "--no-cache", "--quiet"], capture_output=True, text=True, timeout=120)
        msg = p.stderr.strip().splitlines()[0] if p.stderr.strip() else ""
        ok = p.returncode == 1 and msg.startswith("kiln-run: error: ") and path in msg \
            and "does not exist" not in msg
        if not ok:
            bad += 1
            print(f"FAIL {what}: exit {p.returncode}: {p.stderr.strip()[:300]}")
        os.remove(path)
    print(f"{len(cases) - bad}/{len(cases)} damaged artifacts rejected with a clear error")
    print("PASS" if bad == 0 else "FAIL")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
