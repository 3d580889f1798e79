#!/usr/bin/env python3
"""A classification data set the MLP example can learn: 10 classes, each a
Gaussian blob around its own random centre in 64 dimensions.

  make_classification.py OUTDIR [--train N] [--val N] [--seed S] [--features F]

Writes OUTDIR/train/{x,labels}.npy and OUTDIR/val/{x,labels}.npy (x: f32
[N, F], F = 64 by default; labels: i32 [N]). The blobs overlap a little (noise 1.0 around
centres ~N(0, 0.6^2) per coordinate), so accuracy is high but not trivially 100%.
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=8192)
    ap.add_argument("--val", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    centres = rng.normal(0, 0.6, size=(10, a.features))
    for split, n in (("train", a.train), ("val", a.val)):
        labels = rng.integers(0, 10, size=n).astype(np.int32)
        x = (centres[labels] + rng.normal(0, 1.0, size=(n, a.features))).astype(np.float32)
        os.makedirs(os.path.join(a.out, split), exist_ok=True)
        np.save(os.path.join(a.out, split, "x.npy"), x)
        np.save(os.path.join(a.out, split, "labels.npy"), labels)


if __name__ == "__main__":
    main()
