#!/usr/bin/env python3
"""Walks the TFRecords of each event file in DIR and checks their framing
with the tensorboard package's own masked CRC-32C:

  tfrecord_walk.py DIR

Prints "<file name>: N whole records, CRCs ok" per file, or what is wrong
(a torn last record, a bad CRC) and exits 1.
"""
import glob
import os
import struct
import sys

from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c


def main():
    bad = False
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "events.out.tfevents.*"))):
        b = open(path, "rb").read()
        at, n, why = 0, 0, None
        while at < len(b) and not why:
            if at + 12 > len(b):
                why = "a torn length at byte %d" % at
                break
            (length,) = struct.unpack("<Q", b[at:at + 8])
            (lcrc,) = struct.unpack("<I", b[at + 8:at + 12])
            if lcrc != masked_crc32c(b[at:at + 8]):
                why = "a bad length CRC at byte %d" % at
            elif at + 12 + length + 4 > len(b):
                why = "a torn record at byte %d" % at
            else:
                data = b[at + 12:at + 12 + length]
                (dcrc,) = struct.unpack("<I", b[at + 12 + length:at + 16 + length])
                if dcrc != masked_crc32c(data):
                    why = "a bad data CRC at byte %d" % at
            at += 16 + length
            n += 1
        name = os.path.basename(path)
        if why:
            print("%s: %s" % (name, why))
            bad = True
        else:
            print("%s: %d whole records, CRCs ok" % (name, n))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
