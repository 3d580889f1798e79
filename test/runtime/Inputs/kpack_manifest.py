#!/usr/bin/env python3
"""Reads or rewrites a .kpack's manifest, keeping the container valid (every
section's CRC, the table's and the header's recomputed), so tests can reach
the checks Package::open makes after the container verifies.

  kpack_manifest.py IN.kpack get KEY            print manifest[KEY] as JSON
  kpack_manifest.py IN.kpack set KEY JSON OUT   write OUT with manifest[KEY] = JSON
  kpack_manifest.py IN.kpack sizes              print 'name bytes' per section
  kpack_manifest.py IN.kpack version N OUT      write OUT as format version N

Layout as runtime/core/Artifact.h: a 64-byte header, 64-byte entries (kind
u32, name[40], offset u64, size u64, crc u32), sections 64-byte aligned.
"""
import json
import struct
import sys
import zlib


def read(path):
    b = open(path, "rb").read()
    assert b[:8] == b"KILNPACK", f"{path}: not a .kpack"
    version, count = struct.unpack_from("<II", b, 8)
    table = struct.unpack_from("<Q", b, 24)[0]
    sections = []
    for i in range(count):
        e = table + 64 * i
        kind = struct.unpack_from("<I", b, e)[0]
        name = b[e + 4:e + 44].rstrip(b"\0").decode()
        off, size = struct.unpack_from("<QQ", b, e + 44)
        sections.append([kind, name, b[off:off + size]])
    return version, sections


def write(path, version, sections):
    align = lambda v: (v + 63) // 64 * 64
    out = bytearray(align(64 + 64 * len(sections)))
    out[:8] = b"KILNPACK"
    struct.pack_into("<IIQQ", out, 8, version, len(sections), 0, 64)
    for i, (kind, name, data) in enumerate(sections):
        e = 64 + 64 * i
        struct.pack_into("<I", out, e, kind)
        out[e + 4:e + 4 + len(name)] = name.encode()
        struct.pack_into("<QQI", out, e + 44, len(out), len(data), zlib.crc32(data))
        out += data
        out += b"\0" * (align(len(out)) - len(out))
    struct.pack_into("<Q", out, 16, len(out))
    struct.pack_into("<I", out, 32, zlib.crc32(bytes(out[64:64 + 64 * len(sections)])))
    struct.pack_into("<I", out, 60, zlib.crc32(bytes(out[:60])))
    open(path, "wb").write(out)


def main():
    path, cmd = sys.argv[1], sys.argv[2]
    version, sections = read(path)
    manifest = next(s for s in sections if s[1] == "manifest")
    m = json.loads(manifest[2])
    if cmd == "get":
        print(json.dumps(m.get(sys.argv[3])))
    elif cmd == "set":
        m[sys.argv[3]] = json.loads(sys.argv[4])
        manifest[2] = json.dumps(m, indent=1).encode()
        write(sys.argv[5], version, sections)
    elif cmd == "version":
        write(sys.argv[4], int(sys.argv[3]), sections)
    elif cmd == "sizes":
        for _, name, data in sections:
            print(name, len(data))
    else:
        raise SystemExit(f"kpack_manifest.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
