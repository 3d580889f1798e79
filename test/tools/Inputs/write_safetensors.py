#!/usr/bin/env python3
"""Writes a small safetensors file the way other tools do (no Kiln CRC)."""
import json
import struct
import sys

import numpy as np

w = np.arange(6, dtype=np.float32).reshape(2, 3)
b = np.array([0.5], dtype=np.float64)
data = w.tobytes() + b.tobytes()
header = {
    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "F64", "shape": [1], "data_offsets": [24, 32]},
    "__metadata__": {"step": "7"},
}
h = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
