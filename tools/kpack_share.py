#!/usr/bin/env python3
"""Carries a second artifact of the same model in a few MiB: the initial
values it shares with a first artifact are left out and put back from it on
the other machine (tools/gpu-check.sh: the bf16 GPU config next to the fp32
one, which would not fit the device tool's 64 MiB twice).

  kpack_share.py strip BASE.kpack FULL.kpack OUT.kpack-shared
  kpack_share.py restore BASE.kpack IN.kpack-shared OUT.kpack
  kpack_share.py drop-ptx FILE.kpack

strip: OUT is FULL with every initializers tensor whose name, dtype, shape
and bytes equal BASE's left out, and every bf16/f16 tensor that is BASE's
f32 tensor of the same shape rounded to nearest even (the mixed-precision
step's low copies, "lowp:<param>": recomputed by restore, with numpy); the
section is renamed
"initializers.shared" (so kiln-run refuses OUT itself: no initializers)
and records FULL's SHA-256. Prints how many tensors and bytes it shares.
restore: rebuilds FULL from BASE and OUT and checks the SHA-256: exit 1,
naming both files, when BASE is not the artifact OUT was stripped against.

drop-ptx: rewrites FILE without each kernels.cuda.<arch>.ptx section whose
<arch> also has a CUBIN (kernels.cuda.<arch>.cubin). A GPU of that arch loads
the CUBIN; any other compiles the artifact's CUDA source with NVRTC
(runtime/cuda/CudaDevice.cpp loadKernels), so only the driver's PTX
fallback for a GPU without NVRTC is lost. Prints what it dropped.

The container is test/runtime/Inputs/kpack_manifest.py's (runtime/core/
Artifact.h); the initializers section is safetensors (8-byte header length,
JSON header with data_offsets, data). strip checks that restore gives FULL
back byte for byte before it writes OUT.
"""
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "runtime", "Inputs"))
import kpack_manifest as k  # noqa: E402

SHARED = "initializers.shared"


def rounded(f32_bytes, dtype):
    """f32 bytes -> the same values rounded to nearest even in bf16 or f16."""
    import numpy as np
    x = np.frombuffer(f32_bytes, dtype="<f4")
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    u = x.view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def source_of(name, dtype, shape, base_t):
    """The BASE f32 tensor a low-precision tensor may be a rounded copy of."""
    if dtype not in ("BF16", "F16") or ":" not in name:
        return None
    src = name.split(":", 1)[1]
    bt = base_t.get(src)
    return src if bt and bt[0] == "F32" and bt[1] == shape else None


def tensors(st):
    """safetensors bytes -> (prefix bytes, {name: (dtype, shape, begin, end)}, data start)."""
    n = struct.unpack_from("<Q", st, 0)[0]
    header = json.loads(st[8:8 + n])
    out = {name: (t["dtype"], tuple(t["shape"]), *t["data_offsets"])
           for name, t in header.items() if name != "__metadata__"}
    return st[:8 + n], out, 8 + n


def section(sections, name, path):
    for s in sections:
        if s[1] == name:
            return s
    raise SystemExit(f"kpack_share.py: {path} has no '{name}' section")


def rebuild(base_st, shared_blob):
    """The full initializers section from BASE's and the stripped one."""
    meta_len = struct.unpack_from("<Q", shared_blob, 0)[0]
    meta = json.loads(shared_blob[8:8 + meta_len])
    rest = shared_blob[8 + meta_len:]
    prefix = rest[:meta["prefix_len"]]
    own = rest[meta["prefix_len"]:]
    _, full_t, start = tensors(prefix + b"\0" * 0)
    _, base_t, base_start = tensors(base_st)
    size = max((e for _, _, _, e in full_t.values()), default=0)
    data = bytearray(size)
    pos = 0
    shared, derived = set(meta["shared"]), meta.get("derived", {})
    for name, (dtype, shape, b, e) in sorted(full_t.items(), key=lambda kv: kv[1][2]):
        if name in shared:
            bd, bs, bb, be = base_t[name]
            data[b:e] = base_st[base_start + bb:base_start + be]
        elif name in derived:
            bd, bs, bb, be = base_t[derived[name]]
            data[b:e] = rounded(base_st[base_start + bb:base_start + be], dtype)
        else:
            data[b:e] = own[pos:pos + (e - b)]
            pos += e - b
    return prefix + bytes(data) + own[pos:], meta


def strip(base_path, full_path, out_path):
    _, base_secs = k.read(base_path)
    version, secs = k.read(full_path)
    base_st = section(base_secs, "initializers", base_path)[2]
    sec = section(secs, "initializers", full_path)
    st = sec[2]
    prefix, full_t, start = tensors(st)
    _, base_t, base_start = tensors(base_st)
    shared, derived, own, saved = [], {}, bytearray(), 0
    end = 0
    for name, (dtype, shape, b, e) in sorted(full_t.items(), key=lambda kv: kv[1][2]):
        bt = base_t.get(name)
        src = source_of(name, dtype, shape, base_t)
        if bt and bt[:2] == (dtype, shape) and \
                base_st[base_start + bt[2]:base_start + bt[3]] == st[start + b:start + e]:
            shared.append(name)
            saved += e - b
        elif src and rounded(base_st[base_start + base_t[src][2]:base_start + base_t[src][3]],
                             dtype) == st[start + b:start + e]:
            derived[name] = src
            saved += e - b
        else:
            own += st[start + b:start + e]
        end = max(end, e)
    own += st[start + end:]  # anything after the last tensor, verbatim
    digest = hashlib.sha256(open(full_path, "rb").read()).hexdigest()
    meta = json.dumps({"sha256": digest, "shared": shared, "derived": derived, "prefix_len": len(prefix),
                       "base": os.path.basename(base_path)}).encode()
    blob = struct.pack("<Q", len(meta)) + meta + prefix + bytes(own)
    # Round trip before writing: the restored section and file must be FULL's.
    again, _ = rebuild(base_st, blob)
    if again != st:
        raise SystemExit("kpack_share.py: internal error: the initializers do not round-trip")
    sec[1], sec[2] = SHARED, blob
    k.write(out_path, version, secs)
    check = out_path + ".check"
    try:
        restore(base_path, out_path, check, quiet=True)
    finally:
        if os.path.exists(check):
            os.remove(check)
    print(f"kpack_share.py: {out_path}: {len(shared)} of {len(full_t)} initial values shared with "
          f"{base_path}, {len(derived)} rounded from its ({saved / 1048576:.1f} MiB); "
          f"{os.path.getsize(out_path) / 1048576:.1f} MiB instead of {os.path.getsize(full_path) / 1048576:.1f}")


def restore(base_path, in_path, out_path, quiet=False):
    _, base_secs = k.read(base_path)
    version, secs = k.read(in_path)
    sec = section(secs, SHARED, in_path)
    st, meta = rebuild(section(base_secs, "initializers", base_path)[2], sec[2])
    sec[1], sec[2] = "initializers", st
    k.write(out_path, version, secs)
    digest = hashlib.sha256(open(out_path, "rb").read()).hexdigest()
    if digest != meta["sha256"]:
        os.remove(out_path)
        raise SystemExit(f"kpack_share.py: restoring {in_path} from {base_path} did not give the "
                         f"stripped artifact back (SHA-256 differs): {base_path} is not the "
                         f"{meta['base']} it was stripped against; prepare both again")
    if not quiet:
        print(f"kpack_share.py: {out_path}: restored from {in_path} and {base_path}")


def drop_ptx(path):
    version, secs = k.read(path)
    names = {name for _, name, _ in secs}
    keep, dropped = [], 0
    for kind, name, data in secs:
        if name.startswith("kernels.cuda.") and name.endswith(".ptx") and \
                name[:-len(".ptx")] + ".cubin" in names:
            dropped += len(data)
            continue
        keep.append([kind, name, data])
    if len(keep) == len(secs):
        print(f"kpack_share.py: {path}: no PTX beside a CUBIN; unchanged")
        return
    tmp = path + ".tmp"
    k.write(tmp, version, keep)
    os.replace(tmp, path)
    print(f"kpack_share.py: {path}: dropped {len(secs) - len(keep)} PTX section(s) beside their CUBIN "
          f"({dropped / 1048576:.1f} MiB)")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "drop-ptx":
        return drop_ptx(sys.argv[2])
    if len(sys.argv) != 5 or sys.argv[1] not in ("strip", "restore"):
        raise SystemExit(__doc__.split("\n\n")[1])
    (strip if sys.argv[1] == "strip" else restore)(*sys.argv[2:])


if __name__ == "__main__":
    main()
