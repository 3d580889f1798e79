"""Summarises an artifact's CUDA plan (kernels.cuda.plan): the architectures
compiled ahead of time and, per architecture, the functions, the largest
register count and the bytes spilled (test/codegen/cuda.test)."""
import json
import struct
import sys

data = open(sys.argv[1], "rb").read()
count = struct.unpack_from("<I", data, 12)[0]
table = struct.unpack_from("<Q", data, 24)[0]
plan = None
for i in range(count):
    entry = table + 64 * i
    name = data[entry + 4:entry + 44].rstrip(b"\0").decode()
    offset, size = struct.unpack_from("<QQ", data, entry + 44)
    if name == "kernels.cuda.plan":
        plan = json.loads(data[offset:offset + size])
print("archs", " ".join(plan["archs"]))
for arch, rows in plan["resources"].items():
    spills = sum(r["spill_stores"] + r["spill_loads"] for r in rows)
    print(f"{arch}: {len(rows)} functions, registers max {max(r['registers'] for r in rows)}, "
          f"spills {spills}")
