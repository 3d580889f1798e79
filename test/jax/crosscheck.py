#!/usr/bin/env python3
"""Independent JAX cross-check of Kiln's reference interpreter and compiled step.

Runs `kilnc MODEL --export-reference DIR`, then rebuilds the same model in
jax.numpy from the math of docs/language.md (not from Kiln's IR), starting
from the parameters Kiln initialised and the batch Kiln drew, and compares

  * the loss and every gradient of @grad          (jax.value_and_grad),
  * the per-step loss, grad_norm and lr of @train_step,
  * every parameter after the train steps          (docs/training.md: the
    global-norm clip, the schedules and sgd/adam/adamw, written here anew),

with gradient accumulation (`grad_accum = K`) done here as docs/training.md
specifies it: K micro-batches per step, loss and gradient averaged, one
optimizer step.

With `--kiln-run KILN_RUN` it also checks the compiled step, the one users
run: `kilnc MODEL -o DIR/model.kpack` with the same seed, batch and
parameters (its initializers must equal the reference's init.*.npy bit for
bit), then `kiln-run train` for the same steps on the same batches (a .npy
directory, the steps' batches one after another, --in-order), and compares
its per-step loss and grad norm (--loss-log) and its final checkpoint's
parameters and optimizer state with JAX's, relative error <=
--compiled-tolerance (1e-4) per tensor (see step 5 of main for why).

Two model families are known, told apart by the parameter names in
manifest.json:

  mlp  a stack of `linear` layers (`*.weight [out, in]`, `*.bias [out]`)
       with relu between them and cross_entropy on the last one
       (examples/mlp.kiln);
  gpt  token + position embedding, blocks `h.<i>` of pre-LN causal
       attention and an MLP with exact gelu, a final layer norm and an
       output layer tied to embedding.weight (examples/shakespeare_char*.kiln).

Everything runs in float32 (JAX's default; x64 stays off). A tensor passes
when max|jax - kiln| / max(max|kiln|, tiny) is at most --tolerance (1e-5).
The final parameters alone may also differ, coordinate by coordinate, by
twice the float32 noise floor of Adam's per-coordinate scaling, measured
here (see step 4 of main); the table says how many coordinates needed it.
`--train NAME=VALUE` runs the check on a copy of the model with a train
setting replaced (crosscheck-optimizers.test uses it to reach every
optimizer and schedule branch in a few steps).
Exit status: 0 on PASS, 1 on any mismatch or error (the message names the
tensor).
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

try:
    import numpy as np
    import jax
    import jax.numpy as jnp
except ImportError as e:  # the suite must fail, not skip, without JAX
    print("crosscheck: FAIL: cannot import JAX/numpy (%s); install it with "
          "scripts/setup.sh or `python3 -m pip install \"jax[cpu]\"`" % e)
    sys.exit(1)

TINY = 1e-30
NOISE_RUNS = 4  # perturbed JAX trajectories that measure the float32 noise floor
NOISE_K = 2.0   # allowed multiple of that noise floor on the final parameters
COMPILED_TOLERANCE = 1e-4  # for the compiled step; see step 5 of main


class CheckError(Exception):
    pass


# --------------------------------------------------------------------------
# A small reader for the .kiln train section and model header.
# Only literals are needed there: numbers, strings, true/false, names,
# calls with keyword/positional arguments and tuples.
# --------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>[(),=;\-\[\]])
""", re.X)


def _tokens(text):
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CheckError("cannot read %r in the train section" % text[pos:pos + 20])
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


class Call:
    def __init__(self, name, args, kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs

    def __repr__(self):
        return "%s(%s)" % (self.name, ", ".join(
            [repr(a) for a in self.args] +
            ["%s=%r" % kv for kv in self.kwargs.items()]))


class _Reader:
    def __init__(self, toks):
        self.t, self.i = toks, 0

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else (None, None)

    def take(self, value=None):
        tok = self.peek()
        if tok[0] is None or (value is not None and tok[1] != value):
            raise CheckError("expected %r in the train section, got %r" % (value, tok[1]))
        self.i += 1
        return tok

    def value(self):
        kind, text = self.peek()
        if text == "-":
            self.take()
            return -self.value()
        if kind == "num":
            self.take()
            return float(text) if re.search(r"[.eE]", text) else int(text)
        if kind == "str":
            self.take()
            return json.loads(text)
        if text == "(":
            self.take("(")
            items = [self.value()]
            while self.peek()[1] == ",":
                self.take(",")
                if self.peek()[1] == ")":
                    break
                items.append(self.value())
            self.take(")")
            return tuple(items) if len(items) > 1 else items[0]
        if kind == "name":
            self.take()
            if text in ("true", "false"):
                return text == "true"
            if self.peek()[1] != "(":
                return text  # a bare name: `schedule = constant`
            self.take("(")
            args, kwargs = [], {}
            while self.peek()[1] != ")":
                if self.peek()[0] == "name" and self.peek(1)[1] == "=":
                    key = self.take()[1]
                    self.take("=")
                    kwargs[key] = self.value()
                else:
                    args.append(self.value())
                if self.peek()[1] == ",":
                    self.take(",")
            self.take(")")
            return Call(text, args, kwargs)
        raise CheckError("unsupported expression %r in the train section "
                         "(this checker reads literals only)" % text)

    def settings(self, stop=None):
        out = {}
        while self.peek()[0] is not None and self.peek()[1] != stop:
            if self.peek()[1] in (",", ";"):
                self.take()
                continue
            key = self.take()[1]
            self.take("=")
            out[key] = self.value()
        return out


def _strip_comments(text):
    return re.sub(r'#[^\n]*', '', text)


def read_train_section(path):
    text = _strip_comments(open(path).read())
    m = re.search(r"\btrain\s*\{([^}]*)\}", text)
    if not m:
        raise CheckError("%s has no train section" % path)
    return _Reader(_tokens(m.group(1))).settings()


def _kiln_literal(v):
    """A train-section value back in .kiln syntax."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_kiln_literal(x) for x in v) + ")"
    if isinstance(v, Call):
        return "%s(%s)" % (v.name, ", ".join(
            [_kiln_literal(a) for a in v.args] +
            ["%s = %s" % (k, _kiln_literal(x)) for k, x in v.kwargs.items()]))
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z_]\w*", v):
        return v  # a bare name such as `constant`
    return json.dumps(v)


def write_model_with_train(path, overrides, out_path):
    """Copies the model to out_path with train settings NAME=VALUE replaced
    (or added), so that a check can exercise more of the optimizer than the
    example's own settings reach in a few steps."""
    text = _strip_comments(open(path).read())
    m = re.search(r"\btrain\s*\{([^}]*)\}", text)
    settings = _Reader(_tokens(m.group(1))).settings() if m else {}
    for kv in overrides:
        if "=" not in kv:
            raise CheckError("--train wants NAME=VALUE, got %r" % kv)
        k, v = kv.split("=", 1)
        r = _Reader(_tokens(v))
        settings[k.strip()] = r.value()
        if r.peek()[0] is not None:
            raise CheckError("--train %s: cannot read %r" % (kv, v))
    block = "train {\n%s}\n" % "".join(
        "  %s = %s\n" % (k, _kiln_literal(v)) for k, v in settings.items())
    text = text[:m.start()] + block + text[m.end():] if m else text + "\n" + block
    with open(out_path, "w") as f:
        f.write(text)


def read_model_params(path, overrides):
    """The model header's `name = literal` parameters, with --param applied."""
    text = _strip_comments(open(path).read())
    m = re.search(r"\bmodel\s+\w+\s*\(([^)]*)\)", text)
    params = {}
    if m:
        for item in m.group(1).split(","):
            if "=" in item:
                k, v = item.split("=", 1)
                v = v.strip()
                if re.fullmatch(r"-?\d+", v):
                    params[k.strip()] = int(v)
                elif re.fullmatch(r"-?[\d.]+(?:[eE][+-]?\d+)?", v):
                    params[k.strip()] = float(v)
    for kv in overrides:
        k, v = kv.split("=", 1)
        params[k] = int(v) if re.fullmatch(r"-?\d+", v) else float(v)
    return params


# --------------------------------------------------------------------------
# The models, in jax.numpy.
# --------------------------------------------------------------------------

def dense(x, w, b=None):
    """`linear`: x @ w^T (+ b), w laid out [out, in]."""
    y = jnp.einsum("...i,oi->...o", x, w)
    return y if b is None else y + b


def mean_cross_entropy(logits, targets):
    """Mean over every position of -log softmax(logits)[target]."""
    shift = logits - jnp.max(logits, axis=-1, keepdims=True)
    logz = jnp.log(jnp.sum(jnp.exp(shift), axis=-1))
    picked = jnp.take_along_axis(shift, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.mean(logz - picked)


def norm_last(x, w, b=None, eps=1e-5):
    """layer_norm over the last axis: biased variance, eps inside the sqrt."""
    mu = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mu
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred / jnp.sqrt(var + eps) * w
    return y if b is None else y + b


def gelu_erf(x):
    return 0.5 * x * (1.0 + jax.lax.erf(x / math.sqrt(2.0)))


HIDDEN_ACTIVATIONS = {
    "relu": lambda h: jnp.maximum(h, 0.0),
    "softplus": jax.nn.softplus,
    "silu": jax.nn.silu,
}


def make_mlp(names, shapes, activation="relu"):
    act = HIDDEN_ACTIVATIONS[activation]
    layers = []
    for n in names:
        if n.endswith(".weight"):
            if len(shapes[n]) != 2:
                raise CheckError("mlp path: %s is not a [out, in] matrix" % n)
            bias = n[:-len("weight")] + "bias"
            layers.append((n, bias if bias in names else None))
        elif not n.endswith(".bias"):
            raise CheckError("mlp path: unexpected parameter %s" % n)
    for (w, _), (w2, _) in zip(layers, layers[1:]):
        if shapes[w][0] != shapes[w2][1]:
            raise CheckError("mlp path: %s %s does not feed %s %s"
                             % (w, shapes[w], w2, shapes[w2]))
    input_names = None

    def loss_fn(params, inputs):
        x, labels = inputs[input_names[0]], inputs[input_names[1]]
        h = x
        for k, (w, b) in enumerate(layers):
            h = dense(h, params[w], params[b] if b else None)
            if k + 1 < len(layers):
                h = act(h)
        return mean_cross_entropy(h, labels)

    def bind(inputs):
        nonlocal input_names
        input_names = inputs
    return loss_fn, bind


def make_gpt(names, shapes, model_params):
    if "heads" not in model_params:
        raise CheckError("gpt path: the model header gives no `heads`")
    heads = int(model_params["heads"])
    blocks = sorted({int(m.group(1)) for n in names
                     for m in [re.match(r"h\.(\d+)\.", n)] if m})
    if blocks != list(range(len(blocks))):
        raise CheckError("gpt path: blocks %s are not h.0 .. h.N-1" % blocks)
    d = shapes["embedding.weight"][1]
    if d % heads:
        raise CheckError("gpt path: width %d not divisible by heads=%d" % (d, heads))
    hd = d // heads
    known = {"embedding.weight", "position_embedding.weight",
             "layer_norm.weight", "layer_norm.bias"}
    for i in blocks:
        for part in ("layer_norm", "layer_norm_1"):
            known |= {"h.%d.%s.weight" % (i, part), "h.%d.%s.bias" % (i, part)}
        for part in ("attention.qkv", "attention.proj", "mlp.fc", "mlp.proj"):
            known |= {"h.%d.%s.weight" % (i, part), "h.%d.%s.bias" % (i, part)}
    extra = [n for n in names if n not in known]
    if extra:
        raise CheckError("gpt path: unexpected parameters %s" % extra)

    def attention(p, pre, x):
        B, T, _ = x.shape
        qkv = dense(x, p[pre + "qkv.weight"], p.get(pre + "qkv.bias"))  # [B,T,3d]

        def split_heads(k):  # slice k of the output -> [B, H, T, hd]
            part = qkv[:, :, k * d:(k + 1) * d].reshape(B, T, heads, hd)
            return part.transpose(0, 2, 1, 3)
        q, k, v = split_heads(0), split_heads(1), split_heads(2)
        s = jnp.einsum("bhqe,bhke->bhqk", q, k) * jnp.float32(1.0 / math.sqrt(hd))
        allowed = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
        s = jnp.where(allowed, s, -jnp.inf)
        s = s - jnp.max(s, axis=-1, keepdims=True)
        e = jnp.exp(s)
        a = e / jnp.sum(e, axis=-1, keepdims=True)
        y = jnp.einsum("bhqk,bhke->bhqe", a, v)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, d)
        return dense(y, p[pre + "proj.weight"], p.get(pre + "proj.bias"))

    def feed_forward(p, pre, x):
        h = gelu_erf(dense(x, p[pre + "fc.weight"], p.get(pre + "fc.bias")))
        return dense(h, p[pre + "proj.weight"], p.get(pre + "proj.bias"))

    input_names = None

    def loss_fn(params, inputs):
        tokens, targets = inputs[input_names[0]], inputs[input_names[1]]
        p = dict(params)
        T = tokens.shape[1]
        x = p["embedding.weight"][tokens] + p["position_embedding.weight"][:T]
        for i in blocks:
            pre = "h.%d." % i
            x = x + attention(p, pre + "attention.",
                              norm_last(x, p[pre + "layer_norm.weight"],
                                        p.get(pre + "layer_norm.bias")))
            x = x + feed_forward(p, pre + "mlp.",
                                 norm_last(x, p[pre + "layer_norm_1.weight"],
                                           p.get(pre + "layer_norm_1.bias")))
        x = norm_last(x, p["layer_norm.weight"], p.get("layer_norm.bias"))
        logits = dense(x, p["embedding.weight"])  # tied to the token table
        return mean_cross_entropy(logits, targets)

    def bind(inputs):
        nonlocal input_names
        input_names = inputs
    return loss_fn, bind


# --------------------------------------------------------------------------
# Training, as docs/training.md specifies it.
# --------------------------------------------------------------------------

def layer_kind(name):
    """The layer a parameter belongs to, from `<scope>.<layer>.<tensor>`."""
    parts = name.split(".")
    layer = re.sub(r"_\d+$", "", parts[-2]) if len(parts) >= 2 else ""
    return layer


def decays(name, shape):
    """Only weight matrices of `linear` layers decay: never embeddings,
    position embeddings, norms or biases (a tied head shares the embedding)."""
    return len(shape) >= 2 and layer_kind(name) not in (
        "embedding", "position_embedding", "layer_norm")


def schedule_lr(train, s):
    opt = train["optimizer"]
    lr = float(opt.kwargs.get("lr", opt.args[0] if opt.args else None))
    sched = train.get("schedule", "constant")
    if sched == "constant" or (isinstance(sched, Call) and sched.name == "constant"):
        return lr
    if not isinstance(sched, Call):
        raise CheckError("unknown schedule %r" % (sched,))
    if sched.name == "linear_warmup":
        w = sched.kwargs.get("warmup", sched.args[0] if sched.args else None)
        return lr * min(1.0, (s + 1) / w)
    if sched.name == "cosine":
        w = sched.kwargs.get("warmup", 0)
        min_lr = float(sched.kwargs.get("min_lr", 0.0))
        decay = sched.kwargs.get("decay_steps", train["steps"])
        if s < w:
            return lr * (s + 1) / (w + 1)
        if s > decay:
            return min_lr
        ratio = (s - w) / max(1, decay - w)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    raise CheckError("unknown schedule %s" % sched.name)


def optimizer_settings(train):
    opt = train["optimizer"]
    if not isinstance(opt, Call):
        raise CheckError("optimizer %r is not a call" % (opt,))
    kw = dict(opt.kwargs)
    if opt.name == "sgd":
        return opt.name, dict(momentum=float(kw.get("momentum", 0.0)),
                              nesterov=bool(kw.get("nesterov", False)),
                              wd=float(kw.get("weight_decay", 0.0)))
    if opt.name in ("adam", "adamw"):
        b1, b2 = kw.get("betas", (0.9, 0.999))
        return opt.name, dict(b1=float(b1), b2=float(b2),
                              eps=float(kw.get("eps", 1e-8)),
                              wd=float(kw.get("weight_decay",
                                              0.0 if opt.name == "adam" else 0.01)))
    raise CheckError("unknown optimizer %s" % opt.name)


def make_update(kind, hp, names, shapes, clip):
    f32 = jnp.float32
    decay_mask = {n: decays(n, shapes[n]) for n in names}

    def update(params, state, grads, lr, t):
        # Global norm over every gradient, before clipping.
        sq = sum(jnp.sum(grads[n] * grads[n]) for n in names)
        gnorm = jnp.sqrt(sq)
        if clip > 0:
            scale = jnp.minimum(f32(1.0), f32(clip) / (gnorm + f32(1e-6)))
            grads = {n: grads[n] * scale for n in names}
        new_p, new_s = {}, {}
        for n in names:
            p, g = params[n], grads[n]
            wd = f32(hp["wd"] if decay_mask[n] else 0.0)
            if kind == "sgd":
                g = g + wd * p
                mu = f32(hp["momentum"])
                if hp["momentum"] != 0:
                    buf = mu * state[n] + g
                    u = g + mu * buf if hp["nesterov"] else buf
                    new_s[n] = buf
                else:
                    u = g
                new_p[n] = p - lr * u
                continue
            m, v = state[n]
            if kind == "adam":
                g = g + wd * p  # L2 into the gradient, then Adam
            # 1 - beta is a constant: rounded once to float32 from the exact
            # value (f32(1) - f32(0.999) would be 1.3e-5 off 0.001).
            b1, b2 = f32(hp["b1"]), f32(hp["b2"])
            m = b1 * m + f32(1.0 - hp["b1"]) * g
            v = b2 * v + f32(1.0 - hp["b2"]) * g * g
            mhat = m / (f32(1) - b1 ** t)
            vhat = v / (f32(1) - b2 ** t)
            step = mhat / (jnp.sqrt(vhat) + f32(hp["eps"]))
            if kind == "adamw":
                step = step + wd * p  # decoupled
            new_p[n] = p - lr * step
            new_s[n] = (m, v)
        return new_p, new_s, gnorm
    return update


def init_state(kind, hp, params):
    if kind == "sgd":
        return {n: jnp.zeros_like(p) for n, p in params.items()}
    return {n: (jnp.zeros_like(p), jnp.zeros_like(p)) for n, p in params.items()}


# --------------------------------------------------------------------------
# The compiled step's files: the artifact's initial values and kiln-run's
# checkpoint (safetensors, docs/artifact.md and docs/runtime.md).
# --------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32,
                      "I64": np.int64}


def read_safetensors(blob, what):
    """The tensors and metadata of a safetensors file held in `blob`."""
    if len(blob) < 8:
        raise CheckError("%s: %d bytes, too short for safetensors" % (what, len(blob)))
    n = int.from_bytes(blob[:8], "little")
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise CheckError("%s: unreadable safetensors header (%s)" % (what, e))
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in SAFETENSORS_DTYPES:
            raise CheckError("%s: tensor %s has dtype %s, which this check does not read"
                             % (what, name, e["dtype"]))
        begin, end = e["data_offsets"]
        tensors[name] = np.frombuffer(blob[8 + n + begin:8 + n + end],
                                      SAFETENSORS_DTYPES[e["dtype"]]).reshape(e["shape"])
    return tensors, header.get("__metadata__", {})


def read_kpack_initializers(path):
    """The `initializers` section (kind 2) of a .kpack: the values the
    compiled step starts from (docs/artifact.md: header, then a table of
    64-byte entries: kind u32, name[40], offset u64, size u64, crc u32)."""
    blob = open(path, "rb").read()
    if blob[:8] != b"KILNPACK":
        raise CheckError("%s is not a .kpack (magic %r)" % (path, blob[:8]))
    count = int.from_bytes(blob[12:16], "little")
    table = int.from_bytes(blob[24:32], "little")
    for i in range(count):
        entry = blob[table + 64 * i:table + 64 * (i + 1)]
        if int.from_bytes(entry[0:4], "little") == 2:
            at = int.from_bytes(entry[44:52], "little")
            size = int.from_bytes(entry[52:60], "little")
            return read_safetensors(blob[at:at + size], path + " (initializers)")[0]
    raise CheckError("%s has no initializers section" % path)


# --------------------------------------------------------------------------
# Comparison.
# --------------------------------------------------------------------------

class Table:
    def __init__(self, tol):
        self.tol, self.rows, self.worst = tol, [], {}

    def add(self, group, name, ours, ref, slack=None):
        """max|ours - ref| / max(max|ref|, tiny) must be <= tol; with `slack`
        (per coordinate, absolute) each coordinate may be off by
        tol * max|ref| + slack_i instead."""
        ours = np.asarray(ours, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if ours.shape != ref.shape:
            raise CheckError("%s: JAX shape %s but Kiln shape %s"
                             % (name, ours.shape, ref.shape))
        scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, TINY)
        noisy = 0
        if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(ours)):
            diff, rel, ok = float("inf"), float("inf"), False
        else:
            err = np.abs(ours - ref)
            diff = float(np.max(err)) if ours.size else 0.0
            rel = diff / scale
            if slack is None:
                ok = rel <= self.tol
            else:
                over = err > self.tol * scale
                noisy = int(np.sum(over))
                allowed = self.tol * scale + slack
                ok = bool(np.all(err <= allowed))
                if noisy:
                    noisy = (noisy, float(np.max(err / allowed)))
        self.rows.append((name, ref.shape, diff, rel, ok, noisy if slack is not None else None))
        if group not in self.worst or rel > self.worst[group][0]:
            self.worst[group] = (rel, name)
        return ok

    def show(self):
        w = max(len(r[0]) for r in self.rows)
        print("%-*s  %-12s %12s %12s  %s" % (w, "tensor", "shape", "max abs diff",
                                           "rel error", "note"))
        for name, shape, diff, rel, ok, noisy in self.rows:
            note = "" if ok else "FAIL"
            if noisy:
                note += (" " if note else "") + (
                    "%d coordinate(s) above tolerance; error/allowed %.2f (noise floor)"
                    % noisy)
            print("%-*s  %-12s %12.3e %12.3e  %s" % (
                w, name, "x".join(map(str, shape)) or "scalar", diff, rel, note))

    def failures(self):
        return [r for r in self.rows if not r[4]]


def run(cmd, what):
    print("crosscheck: " + " ".join(cmd))
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise CheckError("%s failed (exit %d):\n%s" % (what, done.returncode, done.stdout))
    return done.stdout


def run_compiled(args, model, seed, names, input_names, init, step_batches):
    """kilnc -o, then kiln-run train on the steps' batches in order.
    Returns (per-step [(loss, grad_norm)], checkpoint tensors)."""
    kpack = os.path.join(args.workdir, "model.kpack")
    cmd = [args.kilnc, model, "-o", kpack, "--seed", str(seed)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    for kv in args.param:
        cmd += ["--param", kv]
    run(cmd, "kilnc -o")

    # The compiled step starts from the artifact's initializers (@init on the
    # interpreter with the same seed): they must be the reference's init, bit
    # for bit, and the optimizer state zeros, or nothing below could match.
    initial = read_kpack_initializers(kpack)
    for n in names:
        if n not in initial:
            raise CheckError("%s holds no initial value for parameter %s" % (kpack, n))
        if initial[n].dtype != np.float32 or initial[n].shape != init[n].shape or \
                not np.array_equal(initial[n], init[n]):
            raise CheckError(
                "%s: the initial value of %s (%s %s) differs from the reference's "
                "init.%s.npy (%s %s): kilnc -o and --export-reference did not run "
                "@init alike with --seed %d" % (kpack, n, initial[n].dtype,
                                                list(initial[n].shape), n, init[n].dtype,
                                                list(init[n].shape), seed))
    for n, t in initial.items():
        if n not in names and np.any(t != 0):
            raise CheckError("%s: optimizer state %s does not start at zero" % (kpack, n))

    # kiln-run's .npy directory: one array per input; with --in-order batch i
    # is rows [i*R, (i+1)*R) (R = the train step's rows, K*B with grad_accum
    # K), so the steps' batches are written one after another, in order.
    data = os.path.join(args.workdir, "data")
    os.makedirs(data, exist_ok=True)
    for n in input_names:
        np.save(os.path.join(data, n + ".npy"),
                np.concatenate([b[n] for b in step_batches]))
    log = os.path.join(args.workdir, "compiled.loss.log")
    ckpt = os.path.join(args.workdir, "compiled.safetensors")
    for f in (log, ckpt):
        if os.path.exists(f):
            os.remove(f)
    run([args.kiln_run, "train", kpack, "--data", data, "--in-order",
         "--steps", str(len(step_batches)), "--loss-log", log, "--checkpoint", ckpt,
         "--eval-interval", "0", "--threads", "1"], "kiln-run train")
    stats = []
    for row, line in enumerate(open(log)):
        fields = line.split()
        if len(fields) != 3 or fields[0] != str(row):
            raise CheckError("%s line %d: expected `%d LOSS GRAD_NORM`, got %r"
                             % (log, row + 1, row, line.strip()))
        stats.append((float(fields[1]), float(fields[2])))
    if len(stats) != len(step_batches):
        raise CheckError("%s: %d steps logged, expected %d"
                         % (log, len(stats), len(step_batches)))
    tensors, meta = read_safetensors(open(ckpt, "rb").read(), ckpt)
    for n in names:
        if n not in tensors:
            raise CheckError("%s holds no parameter %s" % (ckpt, n))
    if meta.get("step") != str(len(step_batches)):
        raise CheckError("%s: metadata step %r, expected %d (the next step)"
                         % (ckpt, meta.get("step"), len(step_batches)))
    return stats, tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kilnc", required=True)
    ap.add_argument("--kiln-run", help="also compile the model (kilnc -o) and "
                    "compare `kiln-run train` on the same batches with JAX")
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--mlp-activation", choices=sorted(HIDDEN_ACTIVATIONS), default="relu",
                    help="the MLP path's hidden activation (the model's own must match)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--train", action="append", default=[], metavar="NAME=VALUE",
                    help="override a train setting (the check runs on a copy of "
                         "the model), e.g. --train 'schedule=cosine(warmup = 1)'")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--compiled-tolerance", type=float, default=COMPILED_TOLERANCE)
    args = ap.parse_args()
    started = time.time()

    if jax.config.read("jax_enable_x64"):
        raise CheckError("JAX_ENABLE_X64 is on; this check is float32")
    jax.config.update("jax_default_matmul_precision", "highest")

    # 1. Kiln's reference run. Stale outputs of an earlier run go first.
    os.makedirs(args.workdir, exist_ok=True)
    for f in os.listdir(args.workdir):
        if f.endswith(".npy") or f == "manifest.json":
            os.remove(os.path.join(args.workdir, f))
    model = args.model
    if args.train:
        model = os.path.join(args.workdir, "model.kiln")
        write_model_with_train(args.model, args.train, model)
    # kilnc's default seed for --export-reference (the artifact's default is
    # the train section's: the compiled run passes this one explicitly).
    seed = args.seed if args.seed is not None else 1
    cmd = [args.kilnc, model, "--export-reference", args.workdir,
           "--reference-steps", str(args.steps), "--seed", str(seed)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    for kv in args.param:
        cmd += ["--param", kv]
    run(cmd, "kilnc --export-reference")
    kiln_done = time.time()

    manifest = json.load(open(os.path.join(args.workdir, "manifest.json")))
    names, input_names = manifest["params"], manifest["inputs"]
    load = lambda kind, n: np.load(os.path.join(args.workdir, "%s.%s.npy" % (kind, n)))
    init = {n: load("init", n) for n in names}
    inputs = {n: load("input", n) for n in input_names}
    shapes = {n: init[n].shape for n in names}
    for n in names:
        if init[n].dtype != np.float32:
            raise CheckError("init.%s.npy is %s, expected float32" % (n, init[n].dtype))
    if "dropout_seed" in input_names:
        raise CheckError("the model uses dropout; this check needs a deterministic model")

    train = read_train_section(model)
    accum = int(train.get("grad_accum", 1))
    kind, hp = optimizer_settings(train)
    clip = float(train.get("grad_clip", 0.0))
    model_params = read_model_params(args.model, args.param)

    # The train step's batch: K = grad_accum micro-batches of @grad's B rows,
    # the first of which is @grad's batch (docs/training.md).
    step_input = {n: load("step_input", n) for n in input_names}
    rows = inputs[input_names[0]].shape[0]
    for n in input_names:
        if step_input[n].shape != (accum * rows,) + inputs[n].shape[1:] or \
                not np.array_equal(step_input[n][:rows], inputs[n]):
            raise CheckError("step_input.%s.npy %s is not grad_accum = %d micro-batches "
                             "starting with input.%s.npy %s"
                             % (n, list(step_input[n].shape), accum, n,
                                list(inputs[n].shape)))

    if "embedding.weight" in names and any(n.startswith("h.") for n in names):
        family = "gpt"
        loss_fn, bind = make_gpt(names, shapes, model_params)
        if len(input_names) != 2:
            raise CheckError("gpt path: expected inputs (tokens, targets), got %s" % input_names)
    elif all(n.endswith(".linear.weight") or n.endswith(".linear.bias") or
             n in ("linear.weight", "linear.bias") for n in names):
        family = "mlp"
        loss_fn, bind = make_mlp(names, shapes, args.mlp_activation)
        if len(input_names) != 2:
            raise CheckError("mlp path: expected inputs (x, labels), got %s" % input_names)
    else:
        raise CheckError("no JAX model for parameters %s" % names)
    bind(input_names)
    print("crosscheck: %s model, %d parameter tensors, inputs %s; train %s, "
          "schedule %s, grad_clip %g, grad_accum %d, %d steps"
          % (family, len(names), ", ".join("%s%s" % (n, list(inputs[n].shape))
                                           for n in input_names),
             train["optimizer"], train.get("schedule", "constant"), clip, accum,
             args.steps))

    value_and_grad = jax.jit(jax.value_and_grad(loss_fn))
    params = {n: jnp.asarray(init[n]) for n in names}
    for n in names:
        assert params[n].dtype == jnp.float32

    table = Table(args.tolerance)

    # 2. Loss and gradients at the initial parameters.
    loss, grads = value_and_grad(params, {n: jnp.asarray(v) for n, v in inputs.items()})
    kiln_loss = np.load(os.path.join(args.workdir, "loss.npy"))
    table.add("loss", "loss", loss, kiln_loss)
    # Kiln against itself: with grad_accum = 1, step 0 of @train_step starts
    # from the same parameters and (docs/training.md) the same batch as @grad.
    consistent = True
    if accum == 1:
        consistent = table.add("kiln", "kiln.step0.loss-vs-loss.npy",
                               manifest["steps"][0]["loss"] if manifest["steps"] else kiln_loss,
                               kiln_loss)
    for n in names:
        table.add("grad", "grad." + n, grads[n], load("grad", n))

    # 3. The train steps, on the same batch each step (as --export-reference).
    # Gradient accumulation as docs/training.md specifies it: micro-batch k
    # is rows [k B, (k+1) B) of the step's batch; the step's loss and
    # gradient are the means over the K micro-batches, and the optimizer
    # (clipping included) runs once per step on that mean.
    update = jax.jit(make_update(kind, hp, names, shapes, clip))
    steps = manifest["steps"]
    if len(steps) != args.steps:
        raise CheckError("manifest has %d steps, expected %d" % (len(steps), args.steps))
    lrs = [np.float32(schedule_lr(train, s)) for s in range(args.steps)]
    step_batches = [step_input] * args.steps
    micro = {}  # id(batch) -> its micro-batches as JAX arrays

    def micro_batches(batch):
        if id(batch) not in micro:
            micro[id(batch)] = [{n: jnp.asarray(batch[n][k * rows:(k + 1) * rows])
                                 for n in input_names} for k in range(accum)]
        return micro[id(batch)]

    def step_value_and_grad(p, batch):
        loss_sum, grad_sum = None, None
        for mb in micro_batches(batch):
            l, g = value_and_grad(p, mb)
            if loss_sum is None:
                loss_sum, grad_sum = l, g
            else:
                loss_sum = loss_sum + l
                grad_sum = {n: grad_sum[n] + g[n] for n in names}
        inv = jnp.float32(1.0 / accum)
        return loss_sum * inv, {n: grad_sum[n] * inv for n in names}

    def train_jax(noise=None, key=None):
        """The train steps from the initial parameters; with `noise`, each
        step's gradient first gets N(0, noise[n]^2) added per coordinate.
        Returns the parameters, the optimizer state and per-step
        (loss, grad_norm)."""
        p, st, stats = params, init_state(kind, hp, params), []
        for s in range(args.steps):
            loss, g = step_value_and_grad(p, step_batches[s])
            if noise is not None:
                for n in names:
                    key, sub = jax.random.split(key)
                    g[n] = g[n] + jnp.float32(noise[n]) * jax.random.normal(
                        sub, g[n].shape, jnp.float32)
            p, st, gnorm = update(p, st, g, lrs[s], np.float32(s + 1))
            stats.append((loss, gnorm))
        return p, st, stats

    final, final_state, stats = train_jax()
    for s in range(args.steps):
        table.add("step loss", "step%d.loss" % s, stats[s][0], steps[s]["loss"])
        table.add("step grad_norm", "step%d.grad_norm" % s, stats[s][1], steps[s]["grad_norm"])
        table.add("step lr", "step%d.lr" % s, lrs[s], steps[s]["lr"])

    # 4. The parameters after the steps. Adam divides each coordinate by its
    # own gradient scale, so a coordinate whose gradient is near zero (a
    # cancelling sum, |g| ~ eps) turns the float32 rounding of its gradient,
    # which is absolute (~1e-7 of the tensor's largest gradient), into an
    # error of the size of the update itself. No float32 implementation,
    # this one included, is closer than that to the exact answer. So the
    # final parameters are judged against
    #   allowed_i = tolerance * max|kiln| + NOISE_K * spread_i
    # where spread_i is how far coordinate i moves when every gradient, at
    # every step, is perturbed by noise of the size by which JAX and Kiln
    # disagree on that tensor's gradient at step 0 (measured above). This
    # still checks the optimizer formulas to the tolerance: a wrong formula
    # moves the well-conditioned coordinates (spread ~ 0) by O(lr), and the
    # per-step loss and grad_norm above, which follow from those parameters,
    # are held to the plain tolerance.
    noise = {n: float(np.max(np.abs(np.asarray(grads[n], np.float64) -
                                    load("grad", n).astype(np.float64))))
             for n in names}
    spread = {n: np.zeros(shapes[n]) for n in names}
    key = jax.random.PRNGKey(0)
    for r in range(NOISE_RUNS):
        key, sub = jax.random.split(key)
        pr, _, _ = train_jax(noise, sub)
        for n in names:
            spread[n] = np.maximum(spread[n], np.abs(np.asarray(pr[n], np.float64) -
                                                     np.asarray(final[n], np.float64)))
    for n in names:
        table.add("final", "final." + n, final[n], load("final", n),
                  slack=NOISE_K * spread[n])

    table.show()
    print("tolerance: relative error max|jax - kiln| / max|kiln| <= %.0e per tensor"
          % args.tolerance)
    for group in ("loss", "grad", "step loss", "step grad_norm", "step lr", "final", "kiln"):
        if group in table.worst:
            rel, name = table.worst[group]
            print("worst %-15s %.3e  (%s)" % (group, rel, name))
    noisy = [(r[0], r[5]) for r in table.rows if r[5]]
    if noisy:
        print("final parameters: %d coordinate(s) in %s differ by more than the "
              "tolerance but by at most %g x the float32 noise floor of Adam's "
              "per-coordinate scaling (see the comment in main)"
              % (sum(k[0] for _, k in noisy), ", ".join(n for n, _ in noisy), NOISE_K))
    bad = table.failures()
    if not consistent:
        print("crosscheck: FAIL: Kiln's @train_step at step 0 reports loss %.9g but "
              "@grad reported %.9g for the same parameters: the exported train steps "
              "did not run on the exported batch (input.*.npy), so the per-step and "
              "final values cannot match any model evaluated on that batch"
              % (manifest["steps"][0]["loss"], float(kiln_loss)))
    for name, _, diff, rel, _, _ in bad:
        print("crosscheck: FAIL: %s: relative error %.3e > tolerance %.0e "
              "(max abs diff %.3e)" % (name, rel, args.tolerance, diff))
    if not bad:
        strict = max(v for g, v in table.worst.items() if g not in ("final", "kiln"))
        print("crosscheck: reference: PASS: %d comparisons; worst relative error %.3e "
              "(%s) for the loss, gradients and per-step loss/grad_norm/lr, %.3e (%s) "
              "for the final parameters; tolerance %.0e"
              % (len(table.rows), strict[0], strict[1], table.worst["final"][0],
                 table.worst["final"][1], args.tolerance))

    # 5. The compiled step (what `kiln-run train` runs): the same initial
    # parameters and the same batches, step by step; its per-step loss and
    # grad norm (--loss-log) and its checkpoint's parameters and optimizer
    # state against JAX's.
    # Tolerance: the compiled step is float32 with float32 accumulation
    # (BLAS and the kernels' own loops, in their order), the interpreter
    # accumulates in float64, so the bound is looser than step 2-4's 1e-5:
    # 1e-4 relative per tensor (--compiled-tolerance). Measured on the
    # configurations of crosscheck*.test (MLP and 2-layer GPT, grad_accum 1
    # and 2, sgd/adam/adamw, up to 6 steps at lr 3e-3): per-step loss
    # <= 3e-7, grad norm <= 1.5e-6, optimizer state <= 3e-5 (m after 6 steps
    # of adamw at lr 3e-3), final parameters <= 1e-5 apart from Adam's
    # near-zero-gradient coordinates (up to 1.7e-4 in a tensor), which get
    # the same noise-floor slack as in step 4 (NOISE_K * spread; measured
    # error/allowed <= 0.12 for those coordinates). A real error is far
    # above the bound: averaging the micro-batch gradients wrongly (sum for
    # mean) gives relative error 1.0 in the grad norm, and batches fed out
    # of order (kiln-run without --in-order) 6e-3 in the first loss.
    compiled_bad = []
    if args.kiln_run:
        cstats, ckpt = run_compiled(args, model, seed, names, input_names, init,
                                    step_batches)
        ctable = Table(args.compiled_tolerance)
        for s in range(args.steps):
            ctable.add("step loss", "compiled.step%d.loss" % s, stats[s][0], cstats[s][0])
            ctable.add("step grad_norm", "compiled.step%d.grad_norm" % s, stats[s][1],
                       cstats[s][1])
        for n in names:
            ctable.add("final", "compiled.final." + n, final[n], ckpt[n],
                       slack=NOISE_K * spread[n])
        for n in names:
            if kind == "sgd":
                pairs = [("momentum:" + n, final_state[n])] if hp["momentum"] != 0 else []
            else:
                pairs = [("m:" + n, final_state[n][0]), ("v:" + n, final_state[n][1])]
            for sname, ours in pairs:
                if sname not in ckpt:
                    raise CheckError("the compiled run's checkpoint holds no %s" % sname)
                ctable.add("state", "compiled.state." + sname, ours, ckpt[sname])
        ctable.show()
        print("tolerance (compiled): relative error max|jax - kiln-run| / max|kiln-run| "
              "<= %.0e per tensor" % args.compiled_tolerance)
        for group in ("step loss", "step grad_norm", "final", "state"):
            if group in ctable.worst:
                rel, name = ctable.worst[group]
                print("worst compiled %-15s %.3e  (%s)" % (group, rel, name))
        noisy = [(r[0], r[5]) for r in ctable.rows if r[5]]
        if noisy:
            print("compiled final parameters: %d coordinate(s) in %s differ by more "
                  "than the tolerance but by at most %g x the float32 noise floor of "
                  "Adam's per-coordinate scaling (see step 4 of main)"
                  % (sum(k[0] for _, k in noisy), ", ".join(n for n, _ in noisy), NOISE_K))
        compiled_bad = ctable.failures()
        for name, _, diff, rel, _, _ in compiled_bad:
            print("crosscheck: FAIL: %s: relative error %.3e > tolerance %.0e "
                  "(max abs diff %.3e)" % (name, rel, args.compiled_tolerance, diff))
        if not compiled_bad:
            worst = max(ctable.worst.values())
            print("crosscheck: compiled: PASS: %d comparisons; worst relative error "
                  "%.3e (%s); tolerance %.0e"
                  % (len(ctable.rows), worst[0], worst[1], args.compiled_tolerance))

    elapsed = time.time() - started
    if bad or compiled_bad or not consistent:
        return 1
    print("crosscheck: PASS: %s, grad_accum %d%s (kilnc %.1fs, total %.1fs)"
          % (family, accum, ", reference and compiled step" if args.kiln_run
             else ", reference", kiln_done - started, elapsed))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckError as e:
        print("crosscheck: FAIL: %s" % e)
        sys.exit(1)
