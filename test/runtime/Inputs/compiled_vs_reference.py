#!/usr/bin/env python3
"""The compiled CPU train step against the reference interpreter.

  compiled_vs_reference.py KILNC KILN_RUN MODEL WORKDIR [--steps N] [--seed S | --no-seed]
                           [--loss-rtol R] [--param-rtol R] [kilnc options...]

1. kilnc --export-reference: the interpreter (float64 accumulation, float32
   rounding after every op) runs N train steps on one random batch and writes
   the per-step losses and the final parameters.
   --no-seed passes no --seed to either command: both take the train
   section's seed (kilnc's documented default), and must agree.
2. kilnc -o model.kpack with the same seed (same initial parameters), then
   kiln-run train on that batch (one .npy per input, --in-order) for N steps,
   with a loss log and a final checkpoint.
3. Compares every step's loss and every final parameter:
   relative error = max|a - b| / max|b|.
Prints one line per quantity and PASS/FAIL; exits 1 on a failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + end], DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, header.get("__metadata__", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kilnc")
    ap.add_argument("kiln_run")
    ap.add_argument("model")
    ap.add_argument("workdir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--no-seed", action="store_true",
                    help="no --seed for kilnc: the artifact and the reference take the train section's")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--param-rtol", type=float, default=1e-4)
    ap.add_argument("--compare-unfused", action="store_true",
                    help="also run a --no-fusion build and compare it with the fused one")
    args, extra = ap.parse_known_args()
    seed = [] if args.no_seed else ["--seed", str(args.seed)]
    w = args.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    ref = os.path.join(w, "ref")
    subprocess.run([args.kilnc, args.model, "--export-reference", ref, "--reference-steps",
                    str(args.steps)] + seed + extra, check=True,
                   stdout=subprocess.DEVNULL)
    kpack = os.path.join(w, "model.kpack")
    subprocess.run([args.kilnc, args.model, "-o", kpack] + seed + extra,
                   check=True)
    manifest = json.load(open(os.path.join(ref, "manifest.json")))
    data = os.path.join(w, "data")
    os.makedirs(data)
    for name in manifest["inputs"]:
        if name == "dropout_seed":
            continue
        # The train step's own batch (K times @grad's with grad_accum = K).
        shutil.copy(os.path.join(ref, f"step_input.{name}.npy"), os.path.join(data, f"{name}.npy"))
    log = os.path.join(w, "loss.log")
    ckpt = os.path.join(w, "final.safetensors")
    subprocess.run([args.kiln_run, "train", kpack, "--data", data, "--in-order", "--steps",
                    str(args.steps), "--loss-log", log, "--checkpoint", ckpt, "--threads", "1",
                    "--eval-interval", "0", "--quiet"], check=True)
    ok = True
    losses = [float(l.split()[1]) for l in open(log)]
    for i, (got, want) in enumerate(zip(losses, [s["loss"] for s in manifest["steps"]])):
        err = abs(got - want) / max(abs(want), 1e-30)
        good = err <= args.loss_rtol
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} step {i} loss compiled {got:.8g} reference {want:.8g} rel err {err:.2e}")
    if len(losses) != args.steps:
        print(f"FAIL: {len(losses)} losses logged, expected {args.steps}")
        ok = False
    params, meta = read_safetensors(ckpt)
    worst = 0.0
    for name in manifest["params"]:
        want = np.load(os.path.join(ref, f"final.{name}.npy")).astype(np.float64)
        got = params[name].astype(np.float64)
        err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
        worst = max(worst, err)
        if err > args.param_rtol:
            print(f"FAIL param {name}: rel err {err:.2e} > {args.param_rtol}")
            ok = False
    print(f"{'ok  ' if worst <= args.param_rtol else 'FAIL'} final parameters: worst rel err {worst:.2e} over {len(manifest['params'])} tensors")
    if args.compare_unfused:
        unfused = os.path.join(w, "unfused.kpack")
        subprocess.run([args.kilnc, args.model, "-o", unfused, "--no-fusion"] + seed + extra, check=True)
        log2, ckpt2 = os.path.join(w, "unfused.log"), os.path.join(w, "unfused.safetensors")
        subprocess.run([args.kiln_run, "train", unfused, "--data", data, "--in-order", "--steps",
                        str(args.steps), "--loss-log", log2, "--checkpoint", ckpt2, "--threads",
                        "1", "--eval-interval", "0", "--quiet"], check=True)
        l2 = [float(l.split()[1]) for l in open(log2)]
        lerr = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, l2))
        p2, _ = read_safetensors(ckpt2)
        perr = max(np.max(np.abs(params[n].astype(np.float64) - p2[n])) /
                   max(np.max(np.abs(p2[n])), 1e-30) for n in manifest["params"])
        good = lerr <= args.loss_rtol and perr <= args.param_rtol
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} fused vs unfused: loss rel err {lerr:.2e}, parameters rel err {perr:.2e}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
