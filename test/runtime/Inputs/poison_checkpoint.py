#!/usr/bin/env python3
"""Writes a copy of a Kiln checkpoint whose float32 tensors are all NaN, as a
diverged run would leave them, with its kiln.file_crc32 updated so it still loads.

  poison_checkpoint.py IN.safetensors OUT.safetensors

safetensors: u64 header length, the JSON header (tensor -> dtype, shape,
data_offsets relative to the data; __metadata__ -> strings), the data.
"""
import json
import struct
import sys
import zlib

import numpy as np


def main():
    src, dst = sys.argv[1], sys.argv[2]
    b = bytearray(open(src, "rb").read())
    n = struct.unpack_from("<Q", b, 0)[0]
    header = json.loads(b[8:8 + n])
    start = 8 + n
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        lo, hi = t["data_offsets"]
        b[start + lo:start + hi] = np.full((hi - lo) // 4, np.nan, np.float32).tobytes()
    # kiln.file_crc32: the CRC-32 of the whole file with its own eight
    # digits read as '0's (runtime/core/Checkpoint.h).
    token = b'"kiln.file_crc32":"'
    at = bytes(b[:start]).rfind(token)
    if at >= 0:
        at += len(token)
        b[at:at + 8] = b"00000000"
        b[at:at + 8] = ("%08x" % zlib.crc32(bytes(b))).encode()
    open(dst, "wb").write(b)


if __name__ == "__main__":
    main()
