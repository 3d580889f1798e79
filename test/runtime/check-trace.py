#!/usr/bin/env python3
"""Checks a `kiln-run train --trace` file (docs/profiling.md "Trace").

Usage: check-trace.py TRACE [--steps A:B] [--model FILE] [--processes N]
                            [--collectives] [--allow-generated]

Validates the file against the Chrome trace event format's JSON object form
(the fields each "ph" needs, their types, dur >= 0, pid and tid integers,
process_name / thread_name metadata for every pid and tid used), then what
Kiln promises about it:
  - slices on one track nest properly (Perfetto requires it);
  - each process has exactly one "step" slice per step of the window (--steps,
    default otherData.steps) and no slice belongs to a step outside it;
  - every train_step plan-step slice lies inside its step's slice;
  - every kernel slice is named "FILE:LINE op", and every line it lists
    (args.lines) exists in the model file (--allow-generated: except the
    compiler's own constants, "(compiler) constant" with no ops) and is not
    blank. The model file: --model FILE, else the first with the recorded
    sha256 (otherData.model_file_sha256) of otherData.model_file (its
    absolute path), a file of its name beside the trace, beside the
    artifact (otherData.artifact), and the source the artifact embeds;
  - GEMM slices carry a shape and GFLOP/s; collective slices carry bytes > 0
    and GB/s; with --collectives every process has a communication track
    holding collective slices.
Prints a summary (slices per kind and per track) and exits 1 with every
problem found listed, 0 when there is none.

When the environment variable KILN_TRACE_PROCESSOR names Perfetto's
trace_processor_shell, the file is also loaded by Perfetto's own trace
processor (the `perfetto` package from PyPI) and its slice count per name
must equal this checker's. Without it that part is skipped (said so): the
package downloads the binary on first use, which a machine without internet
access cannot.
"""
import argparse
import collections
import hashlib
import json
import math
import os
import re
import struct
import sys

METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index",
            "process_labels"}
# Time comparisons in nanoseconds: the file has microseconds with 3 decimals.
NS_TOLERANCE = 1


def ns(x):
    return int(round(x * 1000))


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x):
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def embedded_source(artifact):
    """The model source a .kpack carries (its provenance section's "source",
    docs/artifact.md), None, or the OSError reading it. Layout as runtime/core/Artifact.h: a 64-byte
    header, 64-byte entries (kind u32, name[40], offset u64, size u64, crc)."""
    try:
        with open(artifact, "rb") as f:
            b = f.read()
    except OSError as e:
        return e
    if b[:8] != b"KILNPACK" or len(b) < 32:
        return None
    count = struct.unpack_from("<I", b, 12)[0]
    table = struct.unpack_from("<Q", b, 24)[0]
    for i in range(count):
        e = table + 64 * i
        if e + 64 > len(b):
            return None
        name = b[e + 4:e + 44].rstrip(b"\0").decode(errors="replace")
        off, size = struct.unpack_from("<QQ", b, e + 44)
        if name == "provenance":
            try:
                source = json.loads(b[off:off + size]).get("source")
            except ValueError:
                return None
            return source.encode() if isinstance(source, str) else None
    return None


def find_model(given, other, trace):
    """The model file the kernels' lines are checked against: (what it was
    read from, its text, None), or (None, None, why not).

    --model FILE when given; else, the first whose contents have the
    recorded sha256 (otherData.model_file_sha256; any, in older traces
    without it): the recorded absolute path (otherData.model_file), a file
    of its name (otherData.model_file_name) beside the trace, then beside the
    artifact (otherData.artifact), then the source the artifact embeds."""
    if given:
        try:
            with open(given, "rb") as f:
                return given, f.read().decode(errors="replace"), None
        except OSError as e:
            return None, None, f"cannot read the model file --model {given!r}: {e}"
    recorded = other.get("model_file")
    name = other.get("model_file_name") or (os.path.basename(recorded) if recorded else None)
    want = other.get("model_file_sha256") or None
    artifact = other.get("artifact")
    tried = []
    candidates = []
    if isinstance(recorded, str) and recorded:
        candidates.append(("the recorded path", recorded))
    if name:
        candidates.append(("beside the trace",
                           os.path.join(os.path.dirname(os.path.abspath(trace)), name)))
        if isinstance(artifact, str) and artifact:
            candidates.append(("beside the artifact",
                               os.path.join(os.path.dirname(os.path.abspath(artifact)), name)))
    seen = set()
    for how, path in candidates:
        if os.path.abspath(path) in seen:
            continue
        seen.add(os.path.abspath(path))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            tried.append(f"{path} ({how}): not there")
            continue
        if want and sha256(data) != want:
            tried.append(f"{path} ({how}): other contents (sha256 {sha256(data)[:12]}...)")
            continue
        return path, data.decode(errors="replace"), None
    if isinstance(artifact, str) and artifact:
        data = embedded_source(artifact)
        if isinstance(data, bytes) and (not want or sha256(data) == want):
            return f"the source embedded in {artifact}", data.decode(errors="replace"), None
        tried.append(f"{artifact} (the artifact): " + (
            "not there" if isinstance(data, FileNotFoundError) else
            f"cannot read it ({data})" if isinstance(data, OSError) else
            "no embedded source" if data is None else "its embedded source has other contents"))
    return None, None, (
        f"cannot find the model file {name or recorded!r}"
        + (f" (sha256 {want[:12]}...)" if want else "") + ": "
        + ("; ".join(tried) if tried else "the trace names none (otherData.model_file)")
        + "; pass --model FILE")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", help="the window A:B (default: otherData.steps)")
    ap.add_argument("--model", help="the model file (default: found from otherData: model_file, a file "
                         "of its name beside the trace or the artifact, the artifact's "
                         "embedded source)")
    ap.add_argument("--processes", type=int, help="the number of processes (devices) expected")
    ap.add_argument("--collectives", action="store_true",
                    help="every process must have collective slices on a communication track")
    ap.add_argument("--allow-generated", action="store_true",
                    help="accept kernels the compiler made with no model line (named "
                         "'(compiler) OP', no ops; the data-parallel program's constants)")
    a = ap.parse_args()
    problems = []

    def bad(msg):
        if len(problems) < 50:
            problems.append(msg)
        elif len(problems) == 50:
            problems.append("... (more problems not shown)")

    try:
        with open(a.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check-trace: {a.trace}: not a JSON file: {e}")
        return 1
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        print(f"check-trace: {a.trace}: not the JSON object format (no traceEvents list)")
        return 1
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        bad(f"displayTimeUnit is {doc.get('displayTimeUnit')!r}, not 'ms' or 'ns'")
    other = doc.get("otherData", {})
    if not isinstance(other, dict):
        bad("otherData is not an object")
        other = {}

    # The format: fields by phase.
    slices, names, threads = [], {}, {}
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(e, dict):
            bad(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in ("X", "M"):
            bad(f"{where}: ph {ph!r} (Kiln writes complete 'X' and metadata 'M' events)")
            continue
        if not is_int(e.get("pid")) or not is_int(e.get("tid")):
            bad(f"{where}: pid and tid must be integers, got {e.get('pid')!r}, {e.get('tid')!r}")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            bad(f"{where}: no name")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            bad(f"{where}: args is not an object")
            continue
        if ph == "M":
            if e["name"] not in METADATA:
                bad(f"{where}: unknown metadata {e['name']!r}")
            args = e.get("args", {})
            if e["name"] in ("process_name", "thread_name"):
                if not isinstance(args.get("name"), str):
                    bad(f"{where}: {e['name']} without args.name")
                elif e["name"] == "process_name":
                    names[e["pid"]] = args["name"]
                else:
                    threads[(e["pid"], e["tid"])] = args["name"]
            elif e["name"].endswith("sort_index") and not is_int(args.get("sort_index")):
                bad(f"{where}: {e['name']} without an integer args.sort_index")
            continue
        if not is_num(e.get("ts")) or not is_num(e.get("dur")):
            bad(f"{where} ({e['name']}): ts and dur must be finite numbers")
            continue
        if e["dur"] < 0:
            bad(f"{where} ({e['name']}): negative dur {e['dur']}")
            continue
        e.setdefault("args", {})
        slices.append(e)

    for e in slices:
        if e["pid"] not in names:
            bad(f"pid {e['pid']} has no process_name metadata")
            names[e["pid"]] = f"pid {e['pid']}"
        if (e["pid"], e["tid"]) not in threads:
            bad(f"pid {e['pid']} tid {e['tid']} has no thread_name metadata")
            threads[(e["pid"], e["tid"])] = f"tid {e['tid']}"

    # Proper nesting per track.
    tracks = collections.defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append(e)
    for key, evs in tracks.items():
        evs.sort(key=lambda e: (ns(e["ts"]), -ns(e["dur"])))
        stack = []
        for e in evs:
            b, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            while stack and stack[-1][1] <= b:
                stack.pop()
            if stack and end > stack[-1][1]:
                bad(f"{names[key[0]]} / {threads[key]}: '{e['name']}' at {e['ts']} us overlaps "
                    f"'{stack[-1][2]}' partially (ends {end - stack[-1][1]} ns after it)")
            stack.append((b, end, e["name"]))

    # The window.
    window = a.steps or other.get("steps")
    if isinstance(window, str):
        m = re.fullmatch(r"(\d+):(\d+)", window)
        window = [int(m.group(1)), int(m.group(2))] if m else None
    if not (isinstance(window, list) and len(window) == 2):
        bad("no step window (--steps A:B or otherData.steps)")
        window = [0, 0]
    lo, hi = window
    steps = collections.defaultdict(dict)
    for e in slices:
        if e.get("cat") == "step":
            s = e["args"].get("step")
            if s in steps[e["pid"]]:
                bad(f"{names[e['pid']]}: two slices for step {s}")
            steps[e["pid"]][s] = e
        st = e["args"].get("step")
        if not is_int(st) or not lo <= st < hi:
            bad(f"{names[e['pid']]}: '{e['name']}' belongs to step {st!r}, outside the window "
                f"{lo}:{hi}")
    pids = sorted(names)
    if a.processes is not None and len(pids) != a.processes:
        bad(f"{len(pids)} processes, expected {a.processes}")
    for pid in pids:
        got = sorted(steps[pid])
        if got != list(range(lo, hi)):
            bad(f"{names[pid]}: step slices for steps {got}, expected {lo}..{hi - 1} "
                f"({hi - lo} steps)")

    # Plan steps inside their step; names and args by kind.
    model, text, why = find_model(a.model, other, a.trace)
    if text is None:
        bad(why)
        model_lines = None
    else:
        print(f"  model file: {model}")
        model_lines = text.split("\n")
    base = os.path.basename(a.model or other.get("model_file_name") or
                            other.get("model_file") or "")
    checked_lines = set()
    for e in slices:
        cat, args, where = e.get("cat"), e["args"], f"{names[e['pid']]}: '{e['name']}'"
        if cat in ("kernel", "gemm", "copy", "collective", "collective wait") and \
                args.get("function") == "train_step":
            step = steps[e["pid"]].get(args.get("step"))
            if step is None:
                bad(f"{where}: no slice for its step {args.get('step')}")
            elif ns(e["ts"]) + NS_TOLERANCE < ns(step["ts"]) or \
                    ns(e["ts"]) + ns(e["dur"]) > ns(step["ts"]) + ns(step["dur"]) + NS_TOLERANCE:
                bad(f"{where} ({e['ts']} us, {e['dur']} us) is not inside step "
                    f"{args.get('step')}'s slice")
        if cat == "kernel" and a.allow_generated and args.get("generated") is True and \
                e["name"].startswith("(compiler) ") and not args.get("ops"):
            continue  # the compiler's own constant, no model line (--allow-generated)
        if cat == "kernel":
            m = re.match(r"([^ :]+):(\d+) \S", e["name"])
            lines = args.get("lines")
            if not m:
                bad(f"{where}: a kernel slice not named 'FILE:LINE op'")
            if not isinstance(lines, list) or not lines:
                bad(f"{where}: no model lines (args.lines)")
                continue
            if m and not any(l.endswith(f"/{m.group(1)}:{m.group(2)}") or
                             re.search(rf"(^|/){re.escape(m.group(1))}:{m.group(2)}(:|$)", l)
                             for l in lines):
                bad(f"{where}: its name's line is not among its lines {lines}")
            for loc in lines:
                if loc in checked_lines:
                    continue
                checked_lines.add(loc)
                lm = re.fullmatch(r"(.+?):(\d+)(?::\d+)?", loc)
                if not lm:
                    bad(f"{where}: line {loc!r} is not FILE:LINE[:COL]")
                    continue
                if model_lines is None:
                    continue
                if os.path.basename(lm.group(1)) != base:
                    bad(f"{where}: line {loc!r} is not in the model file {base}")
                    continue
                n = int(lm.group(2))
                if not 1 <= n <= len(model_lines) or not model_lines[n - 1].strip():
                    bad(f"{where}: line {loc!r}: {base} has no such non-blank line "
                        f"({len(model_lines)} lines)")
            for key in ("symbol", "ops", "flops", "bytes", "GFLOP/s", "GB/s"):
                if key not in args:
                    bad(f"{where}: no args.{key}")
        elif cat == "gemm":  # library calls: GEMMs and fused attention steps
            if not e["name"].startswith(("gemm ", "attention ", "attention_grad ")) or \
                    not args.get("shape"):
                bad(f"{where}: a GEMM slice not named 'gemm SHAPE' (or 'attention SHAPE', "
                    f"'attention_grad SHAPE') or without args.shape")
            if not is_num(args.get("GFLOP/s")) or args["GFLOP/s"] < 0:
                bad(f"{where}: no GFLOP/s")
        elif cat == "collective":
            if not is_num(args.get("bytes")) or args["bytes"] <= 0:
                bad(f"{where}: a collective slice without bytes > 0")
            if not is_num(args.get("GB/s")):
                bad(f"{where}: a collective slice without GB/s")

    # Summary.
    by_kind = collections.Counter(e.get("cat", "?") for e in slices)
    by_track = collections.Counter((e["pid"], e["tid"]) for e in slices)
    by_name = collections.Counter(e["name"] for e in slices)
    print(f"check-trace: {a.trace}: {len(slices)} slices, {len(pids)} process(es), "
          f"steps {lo}..{hi - 1}")
    print("  by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
    for (pid, tid), n in sorted(by_track.items()):
        print(f"  {names[pid]} / {threads[(pid, tid)]}: {n}")
    if a.collectives:
        for pid in pids:
            comm = [e for e in slices if e["pid"] == pid and e.get("cat") == "collective"
                    and threads[(pid, e["tid"])].startswith("communication")]
            if not comm:
                bad(f"{names[pid]}: no collective slices on a communication track")

    # Perfetto's own trace processor, where its binary is here.
    tp = os.environ.get("KILN_TRACE_PROCESSOR")
    if os.environ.get("CI") == "true":
        # CI installs the package (scripts/setup.sh); only the binary may be missing.
        try:
            import perfetto.trace_processor  # noqa: F401
        except ImportError as e:
            bad(f"CI=true and the perfetto package is missing ({e}); scripts/setup.sh installs it")
    if not tp:
        print("  perfetto trace processor: skipped (set KILN_TRACE_PROCESSOR to a "
              "trace_processor_shell; the perfetto package downloads it on first use, "
              "which needs internet access)")
    else:
        try:
            from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
        except ImportError as e:
            bad(f"KILN_TRACE_PROCESSOR is set but the perfetto package is missing ({e}); "
                "pip install perfetto")
        else:
            with TraceProcessor(trace=a.trace,
                                config=TraceProcessorConfig(bin_path=tp)) as proc:
                rows = proc.query("select name, count(*) as n from slice group by name")
                theirs = {r.name: r.n for r in rows}
            if theirs != dict(by_name):
                diff = sorted(set(theirs) | set(by_name))
                diff = [f"{n!r}: perfetto {theirs.get(n, 0)}, here {by_name.get(n, 0)}"
                        for n in diff if theirs.get(n, 0) != by_name.get(n, 0)]
                bad("Perfetto's trace processor sees other slices: " + "; ".join(diff[:10]))
            else:
                print(f"  perfetto trace processor: {sum(theirs.values())} slices, "
                      f"{len(theirs)} names, the same as here")

    if problems:
        print(f"check-trace: {len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("check-trace: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
