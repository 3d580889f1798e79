#!/usr/bin/env python3
"""Checks that checkpoints hold the same bits: every tensor byte for byte.

  same_bits.py REF GOT... [--metadata-may-differ KEY,KEY]

Each GOT checkpoint (safetensors) must have REF's tensors with the same
names, dtypes, shapes and bytes, and the same metadata except the keys
listed (for runs on other device counts: dp_devices, which records them).
This is `cmp` of the files apart from those metadata values. Prints one
line per file; exits 1 at the first difference, naming the tensor and the
first differing element.
"""
import json
import struct
import sys


def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        tensors[name] = (t["dtype"], t["shape"], body[lo:hi])
    return meta, tensors


def main():
    args = sys.argv[1:]
    may_differ = set()
    if "--metadata-may-differ" in args:
        i = args.index("--metadata-may-differ")
        may_differ = set(args[i + 1].split(","))
        del args[i:i + 2]
    ref_meta, ref = load(args[0])
    for path in args[1:]:
        meta, got = load(path)
        for k in sorted(set(ref_meta) | set(meta)):
            if k not in may_differ and ref_meta.get(k) != meta.get(k):
                print(f"FAIL: {path}: metadata {k} = {meta.get(k)!r}, {args[0]} has {ref_meta.get(k)!r}")
                return 1
        if sorted(got) != sorted(ref):
            print(f"FAIL: {path}: tensors {sorted(set(got) ^ set(ref))} are in one file only")
            return 1
        for name in sorted(ref):
            rd, rs, rb = ref[name]
            gd, gs, gb = got[name]
            if (rd, rs) != (gd, gs):
                print(f"FAIL: {path}: {name} is {gd}{gs}, {args[0]} has {rd}{rs}")
                return 1
            if rb != gb:
                first = next(i for i in range(len(rb)) if rb[i] != gb[i])
                print(f"FAIL: {path}: {name} differs (first at byte {first} of {len(rb)})")
                return 1
        print(f"same bits: {path} ({len(ref)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
