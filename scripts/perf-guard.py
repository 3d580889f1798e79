#!/usr/bin/env python3
"""The performance guard: deterministic per-step counters against a baseline.

Compiles every configuration below with `kilnc --emit=counters` (the plan's
kernels, GEMMs, FLOPs, bytes moved, collectives and peak memory per call of
each entry point; no timing, so the numbers are the same on every machine)
and compares them with the committed baseline, test/perf/baseline.json.

  scripts/perf-guard.py                 compare; exit 1 if a counter got worse
  scripts/perf-guard.py --update        rewrite the baseline with today's counters

Exit codes: 0 every counter as in the baseline or better (an improvement
prints how to lock it in), 1 a counter got worse or a configuration has no
baseline, 2 the guard itself could not run (kilnc failed, a missing or
unreadable baseline). docs/testing.md "Performance guard" says what is counted.
Standard library only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BASELINE = os.path.join("test", "perf", "baseline.json")

# (name, model file relative to the repository root, kilnc flags). The name
# is the baseline's key and the diff's first column. Every example on the CPU
# target (a new example has no baseline: the guard fails until --update),
# then the data-parallel CPU GPT (plain and ZeRO-1), the tensor-parallel one
# (tp = 2, and dp x tp = 2 x 2), the CPU GPT with fused attention, and the
# GPU GPT's CUDA plan in fp32 and bf16
# (its cuBLASLt calls counted as runtime/core/GemmPlan.h splits them).
ACCUM_MLP = ["--param", "features=100", "--param", "hidden=1000", "--batch", "4"]
CONFIGS = [(f"examples/{f}", f"examples/{f}", [])
           for f in sorted(os.listdir(os.path.join(ROOT, "examples"))) if f.endswith(".kiln")]
CONFIGS += [
    ("examples/shakespeare_char_cpu.kiln --devices 2", "examples/shakespeare_char_cpu.kiln",
     ["--devices", "2"]),
    ("examples/shakespeare_char_cpu.kiln --devices 2 --zero 1",
     "examples/shakespeare_char_cpu.kiln", ["--devices", "2", "--zero", "1"]),
    ("examples/shakespeare_char_cpu.kiln --tp 2", "examples/shakespeare_char_cpu.kiln",
     ["--tp", "2"]),
    ("examples/shakespeare_char_cpu.kiln --devices 4 --tp 2",
     "examples/shakespeare_char_cpu.kiln", ["--devices", "4", "--tp", "2"]),
    ("examples/shakespeare_char_cpu.kiln --pp 2 --micro-batches 4",
     "examples/shakespeare_char_cpu.kiln", ["--pp", "2", "--micro-batches", "4"]),
    # Fused attention (attention = auto leaves the CPU GPT's 64 keys unfused;
    # the GPU GPT, 256 keys, is fused on the CPU target): its plan pinned too.
    ("examples/shakespeare_char_cpu.kiln --attention=fused",
     "examples/shakespeare_char_cpu.kiln", ["--attention=fused"]),
    # Gradient accumulation in place: the 100-1000-1000-10 MLP with micro-batches
    # of 4 rows keeps the M = 1 arena plus the activations in flight (with
    # test/codegen/accumulate-memory.test), on one device and per schedule.
    ("examples/mlp.kiln 100-1000-1000 --batch 4", "examples/mlp.kiln", ACCUM_MLP),
    ("examples/mlp.kiln 100-1000-1000 --batch 4 --micro-batches 4", "examples/mlp.kiln",
     ACCUM_MLP + ["--micro-batches", "4"]),
    ("examples/mlp.kiln 100-1000-1000 --batch 4 --pp 2 --micro-batches 4 --pipeline gpipe",
     "examples/mlp.kiln",
     ACCUM_MLP + ["--devices", "2", "--pp", "2", "--micro-batches", "4", "--pipeline", "gpipe"]),
    ("examples/mlp.kiln 100-1000-1000 --batch 4 --pp 2 --micro-batches 4 --pipeline 1f1b",
     "examples/mlp.kiln",
     ACCUM_MLP + ["--devices", "2", "--pp", "2", "--micro-batches", "4", "--pipeline", "1f1b"]),
    ("examples/shakespeare_char.kiln --target=cuda", "examples/shakespeare_char.kiln",
     ["--target=cuda"]),
    ("examples/shakespeare_char.kiln --target=cuda --precision=bf16",
     "examples/shakespeare_char.kiln", ["--target=cuda", "--precision=bf16"]),
]

# Counters where more is worse: the guard fails when one of them grows.
WORSE_IF_MORE = ["steps", "kernels", "gemms", "copies", "flops", "bytes", "collectives",
                 "collective_bytes", "peak_bytes", "cuda_launches", "cuda_gemm_calls",
                 "arena_bytes", "persistent_bytes", "gpu_ms_h100_sxm", "gpu_ms_h200",
                 "gpu_ms_a100_sxm"]
# Counters with no better direction (more fused ops can mean better fusion
# or more work): a change is shown and wants --update, never fails.
NEUTRAL = ["fused_ops", "devices", "queues"]

UPDATE_HINT = "run `scripts/perf-guard.py --update` to lock it in"


class GuardError(Exception):
    """The guard cannot run (exit 2)."""


def find_kilnc(explicit):
    if explicit:
        path = explicit if os.sep in explicit else shutil.which(explicit)
        if not path or not os.access(path, os.X_OK):
            raise GuardError(f"--kilnc {explicit}: not an executable")
        return path
    built = os.path.join(ROOT, "build", "bin", "kilnc")
    if os.access(built, os.X_OK):
        return built
    path = shutil.which("kilnc")
    if not path:
        raise GuardError("no kilnc: build it (ninja -C build kilnc) or pass --kilnc PATH")
    return path


def flatten(counters):
    """{'devices': 1, 'functions': {'train_step': {...}}} -> {(scope, key): value};
    scope is '' for the whole program, else the entry point."""
    flat = {}
    for key, value in counters.items():
        if key == "functions":
            for fn, cs in value.items():
                for k, v in cs.items():
                    flat[(fn, k)] = v
        else:
            flat[("", key)] = value
    return flat


def measure(kilnc, configs, tmp, timeout):
    """Runs kilnc on each configuration; returns {name: counters}."""
    out = {}
    # The default GEMM plan, whatever this shell's KILN_GEMM_PLAN says.
    env = {k: v for k, v in os.environ.items() if k != "KILN_GEMM_PLAN"}
    for name, model, flags in configs:
        dest = os.path.join(tmp, re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")
        cmd = [kilnc, model, "--emit=counters", "-o", dest] + flags
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                               env=env)
        except subprocess.TimeoutExpired:
            raise GuardError(f"{name}: kilnc took longer than {timeout} s ({' '.join(cmd)})")
        if r.returncode != 0:
            raise GuardError(f"{name}: kilnc exited {r.returncode} ({' '.join(cmd)}):\n"
                             f"{r.stderr.strip()}")
        try:
            with open(dest) as f:
                out[name] = json.load(f)
        except (OSError, ValueError) as e:
            raise GuardError(f"{name}: kilnc's counters are not JSON ({dest}): {e}")
    return out


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def percent(old, new):
    if old == 0:
        return "(from 0)" if new else ""
    p = (new - old) / old * 100
    return f"({p:+.1f}%)" if abs(p) >= 0.1 else f"({p:+.2g}%)"


def compare(baseline, current):
    """Rows (config, scope, counter, old, new, verdict) for every difference;
    verdict is 'worse', 'better', 'changed', 'missing' or 'new'."""
    rows = []
    for name, counters in current.items():
        if name not in baseline:
            rows.append((name, "", "(not in the baseline)", "", "", "new"))
            continue
        old, new = flatten(baseline[name]), flatten(counters)
        # kilnc's order (program-wide counters first), then those it no longer prints.
        for key in list(new) + [k for k in old if k not in new]:
            scope, counter = key
            if key not in new:
                rows.append((name, scope, counter, old[key], "-", "missing"))
            elif key not in old:
                rows.append((name, scope, counter, "-", new[key], "new"))
            elif old[key] != new[key]:
                if counter in WORSE_IF_MORE:
                    verdict = "worse" if new[key] > old[key] else "better"
                else:
                    verdict = "changed"
                rows.append((name, scope, counter, old[key], new[key], verdict))
    return rows


def table(rows):
    cells = []
    for name, scope, counter, old, new, verdict in rows:
        change = f"{old} -> {new}" if old != "" else ""
        pct = percent(old, new) if isinstance(old, int) and isinstance(new, int) else ""
        cells.append((name, scope or "-", counter, change, pct, verdict))
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = []
    for c in cells:
        lines.append("  ".join(c[i].ljust(widths[i]) for i in range(5)).rstrip()
                     + "  " + c[5])
    return "\n".join(lines)


def load_baseline(path, update):
    if not os.path.exists(path):
        if update:
            return {}
        raise GuardError(f"{path}: no such baseline; create it with --update")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise GuardError(f"{path}: not a readable baseline ({e}); restore it from git or "
                         f"recreate it with --update")
    if not isinstance(data, dict) or not isinstance(data.get("configurations"), dict):
        raise GuardError(f"{path}: no \"configurations\" object; recreate it with --update")
    return data["configurations"]


def write_baseline(path, configurations):
    data = {
        "about": "Per-call counters of each configuration (kilnc --emit=counters), "
                 "checked by scripts/perf-guard.py; update with "
                 "`scripts/perf-guard.py --update` (docs/testing.md).",
        "configurations": configurations,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main(argv):
    ap = argparse.ArgumentParser(
        description="Compare per-step counters of every example with the committed baseline.")
    ap.add_argument("--update", action="store_true",
                    help="rewrite the baseline with the counters measured now")
    ap.add_argument("--baseline", default=None,
                    help=f"baseline file (default: {DEFAULT_BASELINE} in the repository)")
    ap.add_argument("--kilnc", default=None,
                    help="the compiler (default: build/bin/kilnc, else kilnc on PATH)")
    ap.add_argument("--config", action="append", default=[], metavar="TEXT",
                    help="only the configuration named TEXT, else those whose name "
                         "contains it (repeatable); --update then keeps the others' "
                         "baseline as it is")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds one compile may take (default 300)")
    args = ap.parse_args(argv)

    if args.list:
        for name, model, flags in CONFIGS:
            print(name)
        return 0
    def selected(t):
        exact = [c for c in CONFIGS if c[0] == t]
        return exact or [c for c in CONFIGS if t in c[0]]
    chosen = {c[0] for t in args.config for c in selected(t)}
    configs = [c for c in CONFIGS if not args.config or c[0] in chosen]
    if not configs:
        print(f"perf-guard: error: no configuration matches --config "
              f"{' --config '.join(args.config)}; "
              f"see --list", file=sys.stderr)
        return 2
    baseline_path = args.baseline or os.path.join(ROOT, DEFAULT_BASELINE)
    try:
        kilnc = find_kilnc(args.kilnc)
        baseline = load_baseline(baseline_path, args.update)
        with tempfile.TemporaryDirectory(prefix="kiln-perf-guard-") as tmp:
            current = measure(kilnc, configs, tmp, args.timeout)
    except GuardError as e:
        print(f"perf-guard: error: {e}", file=sys.stderr)
        return 2

    rows = compare(baseline, current)
    counted = sum(len(flatten(c)) for c in current.values())
    if args.update:
        # With --config the other configurations keep their entries; without,
        # the baseline holds exactly today's configurations (a removed example
        # leaves it).
        merged = dict(baseline) if args.config else {}
        merged.update(current)
        order = [c[0] for c in CONFIGS if c[0] in merged]
        order += sorted(k for k in merged if k not in order)
        write_baseline(baseline_path, {k: merged[k] for k in order})
        if rows:
            print(table(rows))
        print(f"perf-guard: wrote {args.baseline or DEFAULT_BASELINE}: "
              f"{plural(len(current), 'configuration')}, "
              f"{counted} counters ({len(rows)} changed)")
        return 0

    if rows:
        print(table(rows))
    worse = [r for r in rows if r[5] in ("worse", "missing", "new")]
    print(f"perf-guard: {plural(len(current), 'configuration')}, {counted} counters: "
          f"{sum(r[5] == 'worse' for r in rows)} worse, "
          f"{sum(r[5] == 'better' for r in rows)} better, "
          f"{sum(r[5] == 'changed' for r in rows)} changed, "
          f"{sum(r[5] in ('missing', 'new') for r in rows)} not comparable")
    if worse:
        print("perf-guard: FAILED: a counter got worse or has no baseline; if the change is "
              "intended, run `scripts/perf-guard.py --update` and commit "
              f"{args.baseline or DEFAULT_BASELINE}")
        return 1
    if any(r[5] == "better" for r in rows):
        print(f"improved: {UPDATE_HINT}")
    elif rows:
        print(f"changed (neither better nor worse): {UPDATE_HINT}")
    else:
        print("perf-guard: every counter as in the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
