#!/usr/bin/env python3
"""Checks an --export-reference directory of Inputs/nll.kiln with
cross_entropy(softmax(z), labels, from_logits = false) against Keras'
formula in numpy (float32):

  keras_probs_loss.py DIR [--reduction mean|sum]

p = softmax(x @ W^T + b), clipped to [1e-7, 1 - 1e-7] (Keras' epsilon),
loss = -log(p[label]) averaged (or summed). Prints PASS or FAIL with the
relative error; exits 1 on a failure.
"""
import argparse
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--reduction", default="mean")
    a = ap.parse_args()
    ld = lambda n: np.load(os.path.join(a.dir, n))
    x = ld("input.x.npy").astype(np.float32)
    labels = ld("input.labels.npy").astype(np.int64)
    w = ld("init.linear.weight.npy").astype(np.float32)
    b = ld("init.linear.bias.npy").astype(np.float32)
    z = x @ w.T + b
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    eps = np.float32(1e-7)
    p = np.clip(p, eps, np.float32(1) - eps)
    per = -np.log(p[np.arange(len(labels)), labels])
    want = per.mean() if a.reduction == "mean" else per.sum()
    got = float(ld("loss.npy"))
    err = abs(got - want) / max(abs(want), 1e-30)
    # The clip must act for the check to say anything about it: the model's
    # normal(20) weights give probabilities below 1e-7 (and above 1 - 1e-7).
    clipped = int((per > 16.1).sum())
    print(f"{clipped} of {len(labels)} rows clipped at 1e-7")
    if clipped == 0:
        print("FAIL: no row reached the clip")
        return 1
    print(f"loss {got:.7g} keras {want:.7g} relative error {err:.2e}")
    if err > 1e-5:
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
