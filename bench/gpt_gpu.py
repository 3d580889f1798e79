#!/usr/bin/env python3
"""The GPU benchmark's peers: nanoGPT's shakespeare_char config
(examples/shakespeare_char.kiln) trained in PyTorch eager, PyTorch
torch.compile and JAX jit on one CUDA GPU, timed the same way as kiln-run.

  gpt_gpu.py --framework torch|torch-compile|jax
             --data data/shakespeare_char/train.bin --steps N
             [--device cuda|cpu] [--precision fp32|tf32|bf16] [--batch 64]
             [--compile-mode default|max-autotune-no-cudagraphs] [--flash]
             [--peak-tflops X] [--warmup N] [--small] [--threads N]
             [--adamw fused|foreach] [--jax-prng threefry2x32|rbg|unsafe_rbg]
             [--loss-log FILE]

Prints ONE JSON line (fields below). --device cpu with --small and a few
--steps is a dry run that takes seconds.

Model and training (the same as the Kiln example): vocabulary 65, context
256, width 384, 6 heads, 6 layers, dropout 0.2, batch 64; no biases; tied
output embedding; GELU (erf); pre-LayerNorm without bias (eps 1e-5); GPT-2
initialisation N(0, 0.02) with the residual projections (attention proj,
MLP out) at 0.02/sqrt(2*layers); AdamW lr 1e-3, betas (0.9, 0.99), eps 1e-8,
weight decay 0.1 on the linear layers' weight matrices only (qkv, proj, fc,
out: as Kiln's no-decay rule; embeddings, position embeddings and LayerNorm
weights are not decayed); global-norm clipping at 1.0; nanoGPT's cosine
schedule (100 warm-up steps, lr*(s+1)/101, then cosine to 1e-4 at step
5000). Dropout 0.2 where nanoGPT and Kiln put it: on the embedding sum, on
the attention probabilities, after the attention projection and after the
MLP projection.

Attention is the plain math form in all three frameworks, as Kiln computes
it: scores = q @ k^T / sqrt(64), causal mask (-inf above the diagonal),
softmax, dropout, @ v. PyTorch's F.scaled_dot_product_attention (flash /
memory-efficient kernels) is used only with --flash, an extra row labelled
"+sdpa". Note that torch.compile's Inductor may itself rewrite the math
pattern into SDPA (its fuse_attention pass); the JSON reports how many
times it did (inductor_fuse_attention) so the row can be read honestly.

Precision: fp32 = true fp32 matmuls (torch: allow_tf32 False for cuBLAS and
cuDNN, float32 matmul precision 'highest'; JAX: jax_default_matmul_precision
'highest'). tf32 = TF32 tensor-core matmuls in both (torch 'high' + allow_tf32;
JAX 'tensorfloat32'). bf16 = torch autocast to bfloat16 (fp32 master
weights, fp32 optimizer) and in JAX bf16 matmul inputs and outputs with fp32
parameters, fp32 residual stream, LayerNorm, softmax and cross-entropy in
fp32 (what autocast does).

Timing (as kiln-run, which reads the loss every step): a step is timed from
the moment its batch is ready on the host (random windows of the np.memmap
token file, numpy RNG seeded 1337; for torch already in pinned memory) to
its completion: the host-to-device copy, forward, backward, clipping,
optimizer update, a device synchronisation (torch.cuda.synchronize / JAX
block_until_ready on the loss) and reading the loss as a Python float. The
first --warmup steps (default 10; 20 for torch-compile) are not timed: step
0 contains torch.compile's or jax.jit's compilation, reported separately as
compile_s (the wall time of step 0, compile plus one step).

FLOPs per step are nanoGPT's estimate_mfu count:
  flops_per_step = (6*N + 12*L*D*T) * T * B
with N = the parameter count excluding the position embedding (the token
embedding counts once: it is also the tied output layer, so 6*N includes
the logits matmul; LayerNorm weights are included), L layers, D = heads *
head_dim width, T context, B batch. The 12*L*D*T term is the two attention
matmuls (q k^T and p v) over the full T x T square, forward and backward,
with no credit taken for the causal half; softmax, LayerNorm, GELU, dropout,
the embedding gather and the optimizer are not counted. For the full model
N = 10,646,784 and flops_per_step = 1.1626e12.
mfu = flops_per_step / (median step seconds) / (peak_tflops * 1e12).
peak_tflops is --peak-tflops, else on --device cuda the NVIDIA H200 SXM
datasheet numbers (dense, without sparsity): fp32 67, tf32 494, bf16 989.
On the CPU there is no default (mfu is null).

JSON fields: framework, label, device, precision, attention, compile_mode,
median_ms, p10_ms, p90_ms, max_ms (over the timed steps), steps,
timed_steps, warmup_steps, compile_s, tokens_per_s (batch*ctx/median),
first_loss, last10_loss (mean of the last 10 steps' losses), flops_per_step,
mfu, peak_tflops, peak_source, device_name, batch, ctx, params,
inductor_fuse_attention, versions.

Seeds are fixed (torch.manual_seed(1337), jax PRNGKey(1337), data RNG 1337):
the windows and dropout masks differ from Kiln's, their distribution does
not, so loss curves are comparable.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

FULL = dict(V=65, T=256, D=384, H=6, L=6, B=64)
# --small: a dry-run model (the CPU config's width/heads, 2 layers) so a CPU
# run of a few steps takes seconds.
SMALL = dict(V=65, T=64, D=128, H=4, L=2, B=8)
DROPOUT = 0.2
LR, MIN_LR, WARMUP, TOTAL, WD, B1, B2, EPS, CLIP = 1e-3, 1e-4, 100, 5000, 0.1, 0.9, 0.99, 1e-8, 1.0
SEED = 1337
# NVIDIA H200 SXM datasheet, dense (the datasheet's tensor-core numbers are
# quoted with sparsity: halved here).
H200_PEAK_TFLOPS = {"fp32": 67.0, "tf32": 494.0, "bf16": 989.0}


def lr_at(step):
    """nanoGPT's get_lr, as Kiln's cosine(warmup = 100, min_lr = 1e-4)."""
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    if step > TOTAL:
        return MIN_LR
    ratio = (step - WARMUP) / max(1, TOTAL - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def batches(path, steps, B, T, dtype, seed=SEED):
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data) < T + 2:
        raise SystemExit(f"gpt_gpu.py: {path} holds {len(data)} tokens, fewer than ctx + 2")
    rng = np.random.default_rng(seed)
    span = np.arange(T + 1)
    for _ in range(steps):
        ix = rng.integers(0, len(data) - T - 1, size=B)
        w = np.asarray(data[ix[:, None] + span], dtype=dtype)  # [B, T+1]
        yield np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def param_count(c):
    """nanoGPT's get_num_params(non_embedding=True): all but the position embedding."""
    V, D, L = c["V"], c["D"], c["L"]
    per_layer = 3 * D * D + D * D + 4 * D * D + 4 * D * D + 2 * D  # qkv, proj, fc, out, 2 LN
    return V * D + L * per_layer + D


def flops_per_step(c, B):
    N = param_count(c)
    return (6 * N + 12 * c["L"] * c["D"] * c["T"]) * c["T"] * B


# ----------------------------------------------------------------------------
# PyTorch (eager and torch.compile)

def run_torch(a, c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpt_gpu.py: --device cuda but torch sees no CUDA device")
    if a.threads:
        torch.set_num_threads(a.threads)
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.manual_seed(SEED)
    dev = torch.device(a.device)
    V, T, D, H, L = c["V"], c["T"], c["D"], c["H"], c["L"]
    B, hd, P = a.batch, c["D"] // c["H"], DROPOUT

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D, bias=False)
            self.qkv = nn.Linear(D, 3 * D, bias=False)
            self.proj = nn.Linear(D, D, bias=False)
            self.ln2 = nn.LayerNorm(D, bias=False)
            self.fc = nn.Linear(D, 4 * D, bias=False)
            self.out = nn.Linear(4 * D, D, bias=False)
            self.register_buffer("future", torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                                 persistent=False)

        def attend(self, x):
            q, k, v = self.qkv(x).split(D, dim=2)
            q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
            if a.flash:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=P, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                att = att.masked_fill(self.future, float("-inf"))
                att = F.dropout(F.softmax(att, dim=-1), P, training=True)
                y = att @ v
            return self.proj(y.transpose(1, 2).reshape(B, T, D))

        def forward(self, x):
            x = x + F.dropout(self.attend(self.ln1(x)), P, training=True)
            h = self.out(F.gelu(self.fc(self.ln2(x))))
            return x + F.dropout(h, P, training=True)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, D)
            self.wpe = nn.Embedding(T, D)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln = nn.LayerNorm(D, bias=False)
            self.register_buffer("pos", torch.arange(T), persistent=False)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if n.endswith(("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, x, y):
            h = F.dropout(self.wte(x) + self.wpe(self.pos), P, training=True)
            for b in self.blocks:
                h = b(h)
            logits = F.linear(self.ln(h), self.wte.weight)
            return F.cross_entropy(logits.view(-1, V).float(), y.view(-1))

    model = GPT().to(dev)
    model.train()
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("wpe"))
    assert n_params == param_count(c), (n_params, param_count(c))

    def decays(n, p):
        return p.dim() == 2 and n.endswith(("qkv.weight", "proj.weight", "fc.weight", "out.weight"))

    groups = [{"params": [p for n, p in model.named_parameters() if decays(n, p)], "weight_decay": WD},
              {"params": [p for n, p in model.named_parameters() if not decays(n, p)], "weight_decay": 0.0}]
    opt_kw = {"fused": True} if cuda and a.adamw == "fused" else {"foreach": True} if cuda else {}
    opt = torch.optim.AdamW(groups, lr=LR, betas=(B1, B2), eps=EPS, **opt_kw)

    fwd = model
    if a.framework == "torch-compile":
        fwd = torch.compile(model, mode=None if a.compile_mode == "default" else a.compile_mode)
    if a.precision == "bf16":
        autocast = lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    else:
        import contextlib
        autocast = contextlib.nullcontext

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times, losses = [], []
    for step, (xn, yn) in enumerate(batches(a.data, a.steps, B, T, np.int64)):
        xh, yh = torch.from_numpy(xn), torch.from_numpy(yn)
        if cuda:
            xh, yh = xh.pin_memory(), yh.pin_memory()
        sync()
        t0 = time.perf_counter()
        x, y = xh.to(dev, non_blocking=True), yh.to(dev, non_blocking=True)
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast():
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)

    extra = {"versions": {"torch": torch.__version__, "cuda": torch.version.cuda}}
    if a.framework == "torch-compile":
        from torch._dynamo.utils import counters
        extra["inductor_fuse_attention"] = int(counters["inductor"]["fuse_attention"])
    if cuda:
        extra["device_name"] = torch.cuda.get_device_name(0)
    return times, losses, n_params, extra


# ----------------------------------------------------------------------------
# JAX (jit)

def run_jax(a, c):
    os.environ["JAX_PLATFORMS"] = "cuda" if a.device == "cuda" else "cpu"
    if a.threads and a.device == "cpu":
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true "
                              f"intra_op_parallelism_threads={a.threads}")
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_default_matmul_precision",
                      {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "default"}[a.precision])
    if a.jax_prng:
        jax.config.update("jax_default_prng_impl", a.jax_prng)
    device = jax.devices()[0]
    if a.device == "cuda" and device.platform != "gpu":
        raise SystemExit(f"gpt_gpu.py: --device cuda but JAX runs on {device.platform}")

    V, T, D, H, L = c["V"], c["T"], c["D"], c["H"], c["L"]
    B, hd, P = a.batch, c["D"] // c["H"], DROPOUT
    cd = jnp.bfloat16 if a.precision == "bf16" else jnp.float32

    keys = iter(jax.random.split(jax.random.PRNGKey(SEED), 2 + 4 * L + 1))

    def normal(shape, std):
        return jax.random.normal(next(keys), shape, jnp.float32) * std

    rstd = 0.02 / math.sqrt(2 * L)
    params = {"wte": normal((V, D), 0.02), "wpe": normal((T, D), 0.02), "ln": jnp.ones(D), "blocks": [
        {"ln1": jnp.ones(D), "qkv": normal((3 * D, D), 0.02), "proj": normal((D, D), rstd),
         "ln2": jnp.ones(D), "fc": normal((4 * D, D), 0.02), "out": normal((D, 4 * D), rstd)}
        for _ in range(L)]}
    drop_key = next(keys)
    decay = {"wte": False, "wpe": False, "ln": False, "blocks": [
        {"ln1": False, "qkv": True, "proj": True, "ln2": False, "fc": True, "out": True}
        for _ in range(L)]}
    n_params = sum(int(np.prod(t.shape)) for t in jax.tree_util.tree_leaves(params)) - T * D

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * g

    def mm(x, w):  # x @ w^T with the weight in the compute type
        return jnp.matmul(x.astype(cd), w.astype(cd).T)

    def drop(x, k):
        keep = jax.random.bernoulli(k, 1.0 - P, x.shape)
        return jnp.where(keep, x * (1.0 / (1.0 - P)), jnp.zeros((), x.dtype)).astype(x.dtype)

    allowed = jnp.tril(jnp.ones((T, T), bool))

    def loss_fn(p, x, y, key):
        k = iter(jax.random.split(key, 1 + 3 * L))
        h = drop(p["wte"][x] + p["wpe"], next(k))
        for b in p["blocks"]:
            q, kk, v = jnp.split(mm(ln(h, b["ln1"]), b["qkv"]), 3, axis=-1)
            q, kk, v = (t.reshape(B, T, H, hd).transpose(0, 2, 1, 3) for t in (q, kk, v))
            att = (q @ kk.transpose(0, 1, 3, 2)) * jnp.asarray(1.0 / math.sqrt(hd), cd)
            att = jnp.where(allowed, att, jnp.asarray(-jnp.inf, cd))
            att = drop(jax.nn.softmax(att.astype(jnp.float32), axis=-1), next(k))
            o = (att.astype(cd) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            h = h + drop(mm(o, b["proj"]), next(k)).astype(jnp.float32)
            f = mm(jax.nn.gelu(mm(ln(h, b["ln2"]), b["fc"]), approximate=False), b["out"])
            h = h + drop(f, next(k)).astype(jnp.float32)
        logits = mm(ln(h, p["ln"]), p["wte"]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, y[..., None], axis=-1).mean()

    def step_fn(p, m, v, x, y, step, lr):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, jax.random.fold_in(drop_key, step))
        norm = jnp.sqrt(sum(jnp.sum(t * t) for t in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, CLIP / (norm + 1e-6))
        g = jax.tree_util.tree_map(lambda t: t * scale, g)
        m = jax.tree_util.tree_map(lambda a_, b_: B1 * a_ + (1 - B1) * b_, m, g)
        v = jax.tree_util.tree_map(lambda a_, b_: B2 * a_ + (1 - B2) * b_ * b_, v, g)
        t = step.astype(jnp.float32) + 1.0
        c1, c2 = 1 - B1 ** t, 1 - B2 ** t

        def upd(w, mm_, vv, dec):
            u = (mm_ / c1) / (jnp.sqrt(vv / c2) + EPS)
            return w - lr * (u + WD * w) if dec else w - lr * u

        p = jax.tree_util.tree_map(upd, p, m, v, decay)
        return p, m, v, loss

    # Donating the parameter and optimizer buffers lets XLA update them in
    # place on the GPU (the CPU client ignores donation with a warning).
    step_jit = jax.jit(step_fn, donate_argnums=(0, 1, 2) if a.device == "cuda" else ())
    params = jax.device_put(params, device)
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    jax.block_until_ready((params, m, v))
    times, losses = [], []
    for step, (xn, yn) in enumerate(batches(a.data, a.steps, B, T, np.int32)):
        s, lr = np.int32(step), np.float32(lr_at(step))
        t0 = time.perf_counter()
        x, y = jax.device_put(xn, device), jax.device_put(yn, device)
        params, m, v, loss = step_jit(params, m, v, x, y, s, lr)
        loss.block_until_ready()
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    extra = {"versions": {"jax": jax.__version__}}
    if a.device == "cuda":
        extra["device_name"] = device.device_kind
    return times, losses, n_params, extra


# ----------------------------------------------------------------------------

def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", choices=["torch", "torch-compile", "jax"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, default=None, help="default 64 (8 with --small)")
    ap.add_argument("--compile-mode", choices=["default", "max-autotune-no-cudagraphs"],
                    default="default", help="torch.compile mode (torch-compile only)")
    ap.add_argument("--flash", action="store_true",
                    help="torch only: F.scaled_dot_product_attention instead of math attention "
                         "(an extra row, labelled +sdpa)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak for MFU; default on cuda: H200 SXM datasheet, dense")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed first steps (default 10; 20 for torch-compile)")
    ap.add_argument("--small", action="store_true", help="dry-run model: ctx 64, width 128, 4 heads, 2 layers")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (dry runs)")
    ap.add_argument("--adamw", choices=["fused", "foreach"], default="fused",
                    help="torch on cuda: AdamW implementation (nanoGPT uses fused)")
    ap.add_argument("--jax-prng", choices=["threefry2x32", "rbg", "unsafe_rbg"], default=None,
                    help="JAX PRNG for dropout (default: JAX's, threefry2x32)")
    ap.add_argument("--loss-log", default=None, help="write 'step loss' lines, as kiln-run --loss-log")
    a = ap.parse_args()

    c = dict(SMALL if a.small else FULL)
    a.batch = a.batch or c["B"]
    if a.flash and a.framework == "jax":
        ap.error("--flash is for the torch frameworks")
    warmup = a.warmup if a.warmup is not None else (20 if a.framework == "torch-compile" else 10)
    if a.steps <= warmup:
        ap.error(f"--steps {a.steps} leaves no timed steps after {warmup} warm-up steps "
                 "(lower --warmup for a dry run)")

    times, losses, n_params, extra = (run_jax if a.framework == "jax" else run_torch)(a, c)
    if a.loss_log:
        with open(a.loss_log, "w") as f:
            for i, l in enumerate(losses):
                f.write(f"{i} {l:.9g}\n")

    timed = [t * 1e3 for t in times[warmup:]]
    med = statistics.median(timed)
    q = statistics.quantiles(timed, n=10, method="inclusive") if len(timed) > 1 else [med] * 9
    fl = flops_per_step(c, a.batch)
    if a.peak_tflops is not None:
        peak, source = a.peak_tflops, "--peak-tflops"
    elif a.device == "cuda":
        peak, source = H200_PEAK_TFLOPS[a.precision], "NVIDIA H200 SXM datasheet, dense"
    else:
        peak, source = None, None
    device_name = extra.pop("device_name", None) or cpu_name()
    if a.device == "cuda" and a.peak_tflops is None and "H200" not in device_name:
        print(f"gpt_gpu.py: warning: MFU uses H200 peaks but the device is {device_name}; "
              "pass --peak-tflops", file=sys.stderr)
    label = a.framework
    if a.framework == "torch-compile" and a.compile_mode != "default":
        label += f"[{a.compile_mode}]"
    if a.flash:
        label += "+sdpa"
    row = {
        "framework": a.framework, "label": label, "device": a.device, "precision": a.precision,
        "attention": "sdpa" if a.flash else "math",
        "compile_mode": a.compile_mode if a.framework == "torch-compile" else None,
        "median_ms": med, "p10_ms": q[0], "p90_ms": q[-1], "max_ms": max(timed),
        "steps": len(losses), "timed_steps": len(timed), "warmup_steps": warmup,
        "compile_s": times[0] if a.framework != "torch" else None,
        "tokens_per_s": a.batch * c["T"] / (med / 1e3),
        "first_loss": losses[0], "last10_loss": sum(losses[-10:]) / len(losses[-10:]),
        "flops_per_step": fl,
        "mfu": fl / (med / 1e3) / (peak * 1e12) if peak else None,
        "peak_tflops": peak, "peak_source": source, "device_name": device_name,
        "batch": a.batch, "ctx": c["T"], "params": n_params,
        "model": "small" if a.small else "shakespeare_char",
    }
    row.update(extra)
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
