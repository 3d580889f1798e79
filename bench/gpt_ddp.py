#!/usr/bin/env python3
"""nanoGPT's CPU config data-parallel in PyTorch DDP (gloo), for bench/dp.sh.

  torchrun --nproc_per_node 2 bench/gpt_ddp.py --data data/shakespeare_char/train.bin
           [--steps 100] [--threads 1]

The model and training of bench/gpt_cpu.py (4 layers, 4 heads, width 128,
context 64, AdamW, clipping at 1.0, cosine schedule), with per-rank batch 12
(the global batch is 12 x world size, as kilnc --devices N compiles it),
wrapped in DistributedDataParallel over the gloo backend (the CPU backend;
buckets and overlap at DDP's defaults). Each rank draws its own windows.
Rank 0 prints one JSON line: the median and spread of ms/step over the
timed steps (the first 10 are warm-up), the world size and the losses.
"""
import argparse
import json
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

V, T, D, H, L, B = 65, 64, 128, 4, 4, 12
LR, MIN_LR, WARMUP, TOTAL, WD, B1, B2, CLIP = 1e-3, 1e-4, 100, 2000, 0.1, 0.9, 0.99, 1.0


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = (step - WARMUP) / (TOTAL - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (LR - MIN_LR)


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1337)
    model = nn.parallel.DistributedDataParallel(GPT())
    named = list(model.module.named_parameters())
    decay = [p for n, p in named if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    nodecay = [p for n, p in named if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": nodecay, "weight_decay": 0.0}], lr=LR, betas=(B1, B2))
    data = np.memmap(args.data, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(1337 + rank)
    times, losses = [], []
    for step in range(args.steps):
        ix = rng.integers(0, len(data) - T - 1, size=B)
        x = torch.from_numpy(np.stack([data[i:i + T] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + T] for i in ix]).astype(np.int64))
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets here, overlapped
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    timed = sorted(t * 1e3 for t in times[10:])
    if rank == 0:
        q = statistics.quantiles(timed, n=10)
        print(json.dumps({"framework": "torch-ddp-gloo", "world": world, "threads": args.threads,
                          "precision": args.precision,
                          "ms_median": statistics.median(timed), "ms_p10": q[0], "ms_p90": q[-1],
                          "losses": losses}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
