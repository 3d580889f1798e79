#!/usr/bin/env python3
"""Prints a safetensors checkpoint's metadata, one "key = value" a line, sorted.

  ckpt_metadata.py CKPT
"""
import json
import struct
import sys


def main():
    with open(sys.argv[1], "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    for key, value in sorted(header.get("__metadata__", {}).items()):
        print(f"{key} = {value}")


if __name__ == "__main__":
    main()
