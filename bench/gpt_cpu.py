#!/usr/bin/env python3
"""nanoGPT's CPU config (examples/shakespeare_char_cpu.kiln) in PyTorch
(eager) and JAX (jit) on the CPU, timed the same way as kiln-run.

  gpt_cpu.py --framework torch|jax --data data/shakespeare_char/train.bin
             [--steps 200] [--threads 2] [--loss-log FILE]

Same model and training as the Kiln example: 4 layers, 4 heads, width 128,
context 64, batch 12, vocabulary 65, no biases, tied embedding, GELU (erf),
pre-LayerNorm without bias, AdamW (lr 1e-3, betas (0.9, 0.99), weight decay
0.1 on 2-D weights except embeddings), global-norm clipping at 1.0, cosine
schedule with 100 warm-up steps to 1e-4 over 2000 steps. Batches are random
windows of the token file (numpy RNG: the data differ from Kiln's windows,
the distribution does not). Prints one JSON line: median and spread of
ms/step over the timed steps (the first 10 are warm-up and not timed) and
the losses.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

V, T, D, H, L, B = 65, 64, 128, 4, 4, 12
LR, MIN_LR, WARMUP, TOTAL, WD, B1, B2, CLIP = 1e-3, 1e-4, 100, 2000, 0.1, 0.9, 0.99, 1.0


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = (step - WARMUP) / (TOTAL - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (LR - MIN_LR)


def batches(path, steps, seed=1337):
    data = np.memmap(path, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ix = rng.integers(0, len(data) - T - 1, size=B)
        x = np.stack([data[i:i + T] for i in ix]).astype(np.int64)
        y = np.stack([data[i + 1:i + 1 + T] for i in ix]).astype(np.int64)
        yield x, y


def run_torch(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D, bias=False)
            self.qkv = nn.Linear(D, 3 * D, bias=False)
            self.proj = nn.Linear(D, D, bias=False)
            self.ln2 = nn.LayerNorm(D, bias=False)
            self.fc = nn.Linear(D, 4 * D, bias=False)
            self.out = nn.Linear(4 * D, D, bias=False)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
            q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, D)
            self.wpe = nn.Embedding(T, D)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln = nn.LayerNorm(D, bias=False)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if n.endswith(("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0, std)

        def forward(self, x, y):
            h = self.wte(x) + self.wpe(torch.arange(T))
            for b in self.blocks:
                h = b(h)
            logits = self.ln(h) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, V), y.view(-1))

    model = GPT()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    nodecay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": nodecay, "weight_decay": 0.0}], lr=LR, betas=(B1, B2))
    times, losses = [], []
    for step, (x, y) in enumerate(batches(args.data, args.steps)):
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return times, losses


def run_jax(args):
    os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={args.threads}")
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(1337)
    keys = iter(jax.random.split(key, 64))

    def normal(shape, std):
        return jax.random.normal(next(keys), shape) * std

    proj = 0.02 / math.sqrt(2 * L)
    params = {"wte": normal((V, D), 0.02), "wpe": normal((T, D), 0.02), "ln": jnp.ones(D), "blocks": [
        {"ln1": jnp.ones(D), "qkv": normal((3 * D, D), 0.02), "proj": normal((D, D), proj),
         "ln2": jnp.ones(D), "fc": normal((4 * D, D), 0.02), "out": normal((D, 4 * D), proj)}
        for _ in range(L)]}

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * g

    mask = jnp.tril(jnp.ones((T, T), bool))

    def loss_fn(p, x, y):
        h = p["wte"][x] + p["wpe"]
        for b in p["blocks"]:
            q, k, v = jnp.split(ln(h, b["ln1"]) @ b["qkv"].T, 3, axis=-1)
            q, k, v = (t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for t in (q, k, v))
            att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(D // H), -jnp.inf)
            y_ = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            h = h + y_ @ b["proj"].T
            h = h + jax.nn.gelu(ln(h, b["ln2"]) @ b["fc"].T, approximate=False) @ b["out"].T
        logits = ln(h, p["ln"]) @ p["wte"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(logp, y[..., None], -1).mean()

    def decays(path):
        return path[-1].key in ("qkv", "proj", "fc", "out") if hasattr(path[-1], "key") else False

    decay_mask = jax.tree_util.tree_map_with_path(lambda path, _: decays(path), params)

    @jax.jit
    def step_fn(p, m, v, x, y, step, lr):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        norm = jnp.sqrt(sum(jnp.sum(t * t) for t in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, CLIP / (norm + 1e-6))
        g = jax.tree_util.tree_map(lambda t: t * scale, g)
        m = jax.tree_util.tree_map(lambda a, b: B1 * a + (1 - B1) * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: B2 * a + (1 - B2) * b * b, v, g)
        t = step + 1.0
        def upd(w, mm, vv, dec):
            u = (mm / (1 - B1 ** t)) / (jnp.sqrt(vv / (1 - B2 ** t)) + 1e-8)
            return w - lr * (u + (WD * w if dec else 0.0))
        p = jax.tree_util.tree_map(upd, p, m, v, decay_mask)
        return p, m, v, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    times, losses = [], []
    for step, (x, y) in enumerate(batches(args.data, args.steps)):
        t0 = time.perf_counter()
        params, m, v, loss = step_fn(params, m, v, x, y, float(step), lr_at(step))
        losses.append(float(loss))  # blocks until the step is done
        times.append(time.perf_counter() - t0)
    return times, losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["torch", "jax"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    times, losses = (run_torch if a.framework == "torch" else run_jax)(a)
    timed = [t * 1e3 for t in times[10:]]
    q = statistics.quantiles(timed, n=10)
    print(json.dumps({"framework": a.framework, "median_ms": statistics.median(timed),
                      "p10_ms": q[0], "p90_ms": q[-1], "steps": len(losses),
                      "first_loss": losses[0], "last10_loss": sum(losses[-10:]) / 10}))


if __name__ == "__main__":
    sys.exit(main())
