"""Random, valid .kiln models over the builtins, each compiled for cpu,cuda
and its steps checked on the CUDA emulator against the CPU.

usage: random_models.py WORKDIR COUNT [--seed S] [--jobs J] [--print N]

Model i of seed S is the same on every run (random.Random(S * 1000003 + i)),
so a failure names a model that reproduces: it is kept as WORKDIR/fail-I.kiln
with kilnc's or kiln-run's output beside it. --print N writes model N to
stdout and exits (to read what the generator makes).

A model starts from x: f32[B, T, D] and applies 4-12 random ops, chosen
among those whose operands exist in the pool of values built so far, with
shapes tracked here so every model is valid: elementwise unary and binary
ops (with numpy broadcasting against keepdims reductions), transposes,
reshapes (merge or split of the last axes), batched matmuls, linear,
layer_norm, softmax and log_softmax on any axis, sum/mean/max with and
without keepdims, concat and slice. The loss is a cross entropy of a linear
head over a flattened value plus 0.01 times the mean of every value
nothing else reads, so every op is on a path to the loss. Values stay in range: exp, log, sqrt, rsqrt
and division take bounded or positive operands.
"""
import argparse, concurrent.futures, os, random, subprocess, sys


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.lines = []
        self.pool = []  # (name, shape) with shape a tuple whose [0] is "B"
        self.n = 0

    def fresh(self, shape, expr):
        self.n += 1
        name = f"v{self.n}"
        self.lines.append(f"  {name} = {expr}")
        self.pool.append((name, shape))
        return name, shape

    def pick(self, pred=lambda s: True):
        c = [p for p in self.pool if pred(p[1])]
        return self.r.choice(c) if c else None

    def numel(self, s):
        n = 1
        for d in s[1:]:
            n *= d
        return n

    def op(self):
        r = self.r
        kind = r.choice(["unary", "unary", "binary", "binary", "bcast", "linear", "linear",
                         "transpose", "reshape", "matmul", "layer_norm", "softmax", "reduce",
                         "concat", "slice"])
        if kind == "unary":
            a, s = self.pick()
            f = r.choice(["relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "abs", "exp_t",
                          "log_p", "sqrt_p", "rsqrt_p", "neg", "square"])
            expr = {"exp_t": f"exp(tanh({a}))", "log_p": f"log(abs({a}) + 1.0)",
                    "sqrt_p": f"sqrt(abs({a}) + 0.5)", "rsqrt_p": f"rsqrt(abs({a}) + 1.0)",
                    "neg": f"-{a}", "square": f"{a} * {a}"}.get(f, f"{f}({a})")
            return self.fresh(s, expr)
        if kind == "binary":
            a, s = self.pick()
            b = self.pick(lambda t: t == s)
            b = b[0] if b else a
            f = r.choice(["+", "-", "*", "div", "maximum", "minimum"])
            if f == "div":
                return self.fresh(s, f"{a} / (abs({b}) + 1.0)")
            if f in ("maximum", "minimum"):
                return self.fresh(s, f"{f}({a}, {b})")
            return self.fresh(s, f"{a} {f} {b}")
        if kind == "bcast":  # a value against a keepdims reduction of another
            a, s = self.pick(lambda t: len(t) >= 2)
            b, _ = self.pick(lambda t: t == s)
            ax = r.randrange(1, len(s))
            red = r.choice(["mean", "max", "sum"])
            f = r.choice(["+", "-", "*"])
            return self.fresh(s, f"{a} {f} {red}({b}, axis = {ax}, keepdims = true)")
        if kind == "linear":
            a, s = self.pick()
            n = r.choice([3, 4, 5, 8, 12])
            bias = r.choice(["", ", bias = false"])
            return self.fresh(s[:-1] + (n,), f"linear({a}, {n}{bias})")
        if kind == "transpose":
            p = self.pick(lambda t: len(t) >= 3)
            if not p:
                return None
            a, s = p
            rest = list(range(1, len(s)))
            r.shuffle(rest)
            if rest == sorted(rest):
                rest = rest[::-1]
            perm = [0] + rest
            return self.fresh(tuple(s[i] for i in perm), f"transpose({a}, {perm})")
        if kind == "reshape":
            a, s = self.pick(lambda t: len(t) >= 2)
            if len(s) >= 3 and r.random() < 0.6:  # merge the last two axes
                t = s[:-2] + (s[-2] * s[-1],)
            else:  # split the last axis
                d = s[-1]
                fs = [f for f in (2, 3, 4) if d % f == 0 and d // f > 1]
                if not fs or len(s) >= 4:
                    t = ("B", self.numel(s))
                else:
                    f = r.choice(fs)
                    t = s[:-1] + (f, d // f)
            dims = ", ".join(["-1"] + [str(d) for d in t[1:]])
            return self.fresh(t, f"reshape({a}, [{dims}])")
        if kind == "matmul":
            p = self.pick(lambda t: len(t) == 3)
            if not p:
                return None
            a, s = p
            if r.random() < 0.5:  # a @ aᵀ: [B, m, m]
                return self.fresh(("B", s[1], s[1]), f"matmul({a}, {a}, transpose_b = true)")
            b = self.pick(lambda t: len(t) == 3 and t[1] == s[2])
            if b:
                return self.fresh(("B", s[1], b[1][2]), f"{a} @ {b[0]}")
            return self.fresh(("B", s[2], s[2]), f"matmul({a}, {a}, transpose_a = true)")
        if kind == "layer_norm":
            a, s = self.pick()
            bias = r.choice(["", ", bias = false"])
            return self.fresh(s, f"layer_norm({a}{bias})")
        if kind == "softmax":
            a, s = self.pick(lambda t: len(t) >= 2)
            ax = r.choice([-1] + list(range(1, len(s))))
            f = r.choice(["softmax", "log_softmax"])
            return self.fresh(s, f"{f}({a}, axis = {ax})")
        if kind == "reduce":
            a, s = self.pick(lambda t: len(t) >= 3)
            ax = r.randrange(1, len(s))
            red = r.choice(["sum", "mean", "max"])
            return self.fresh(s[:ax] + s[ax + 1:], f"{red}({a}, axis = {ax})")
        if kind == "concat":
            a, s = self.pick(lambda t: len(t) >= 2)
            b, _ = self.pick(lambda t: t == s)
            ax = r.randrange(1, len(s))
            t = s[:ax] + (s[ax] * 2,) + s[ax + 1:]
            return self.fresh(t, f"concat([{a}, {b}], axis = {ax})")
        if kind == "slice":
            a, s = self.pick(lambda t: len(t) >= 2 and max(t[1:]) >= 2)
            ax = r.choice([i for i in range(1, len(s)) if s[i] >= 2])
            lo = r.randrange(0, s[ax] - 1)
            hi = r.randrange(lo + 1, s[ax] + 1)
            return self.fresh(s[:ax] + (hi - lo,) + s[ax + 1:], f"slice({a}, {ax}, {lo}, {hi})")
        return None

    def model(self, name):
        r = self.r
        T, D, C = r.choice([2, 3, 4, 6]), r.choice([4, 6, 8, 12]), r.choice([3, 5, 7])
        self.pool.append(("x", ("B", T, D)))
        for _ in range(r.randint(4, 12)):
            self.op()
        h, s = self.pool[-1]
        if len(s) > 2:
            h, s = self.fresh(("B", self.numel(s)), f"reshape({h}, [-1, {self.numel(s)}])")
        # Every value nothing reads joins the loss, so every op is on a path
        # to it (and gets a gradient).
        import re
        read = set()
        for line in self.lines:
            read |= set(re.findall(r"\bv\d+\b", line.split("=", 1)[1]))
        leaves = [n for n, _ in self.pool if n.startswith("v") and n not in read and n != h]
        extra = " + ".join(f"mean({n})" for n in leaves) or "mean(x)"
        body = "\n".join(self.lines)
        opt = r.choice(["adam(lr = 1e-3)", "sgd(lr = 0.1, momentum = 0.9)",
                        "adamw(lr = 1e-3, weight_decay = 0.1)"])
        return (f"# random model {name}\n"
                f"model {name}(T = {T}, D = {D}, C = {C}) {{\n"
                f"  input x: f32[B, T, D]\n  input y: i32[B]\n{body}\n"
                f"  logits = linear({h}, C)\n"
                f"  loss = cross_entropy(logits, y) + 0.01 * ({extra})\n}}\n"
                f"train {{ batch = {r.choice([2, 3, 4])}  steps = 10  optimizer = {opt} }}\n")


def generate(seed, i):
    return Gen(random.Random(seed * 1000003 + i)).model(f"m{i}")


def run_one(work, seed, i):
    text = generate(seed, i)
    path = os.path.join(work, f"m{i}.kiln")
    with open(path, "w") as f:
        f.write(text)
    kpack = os.path.join(work, f"m{i}.kpack")
    steps = [["kilnc", path, "--target=cpu,cuda", "--cuda-arch=sm_90", "-o", kpack],
             ["kiln-run", "check", kpack, "--device", "cuda-emu", "--seed", str(i)]]
    for cmd in steps:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0 or (cmd[0] == "kiln-run" and "kiln-run check: PASS" not in p.stdout):
            fail = os.path.join(work, f"fail-{i}.kiln")
            os.replace(path, fail)
            with open(fail + ".log", "w") as f:
                f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
            return i, f"{' '.join(cmd[:2])} exit {p.returncode}: " + \
                (p.stderr.strip() or p.stdout.strip()).splitlines()[-1][:300]
    for ext in ("kiln", "kpack"):
        os.remove(os.path.join(work, f"m{i}.{ext}"))
    return i, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("count", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--print", type=int, default=None)
    a = ap.parse_args()
    if a.print is not None:
        sys.stdout.write(generate(a.seed, a.print))
        return 0
    os.makedirs(a.work, exist_ok=True)
    failures = []
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for i, why in ex.map(lambda i: run_one(a.work, a.seed, i), range(a.count)):
            if why:
                failures.append((i, why))
    for i, why in failures:
        print(f"model {i} (seed {a.seed}): {why}\n  kept: {a.work}/fail-{i}.kiln")
    print(f"random models: {a.count - len(failures)} of {a.count} compiled for cpu,cuda "
          f"and matched the CPU on cuda-emu (seed {a.seed})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
