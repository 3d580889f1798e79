#!/usr/bin/env python3
"""Starts TensorBoard on a `kiln-run train --tensorboard DIR` directory and
asks its Profile tab (tensorboard-plugin-profile, xprof) for Kiln's trace
over HTTP, as the browser does.

  check_tb_profile.py DIR --hosts N --steps A:B [--trace FILE] [--collectives]
                      [--timeout SECONDS]

- /data/plugins_listing names the profile plugin;
- /data/plugin/profile/runs lists exactly one run, named as kiln-run names
  it (YYYY_MM_DD_HH_MM_SS);
- /data/plugin/profile/run_tools?run=RUN offers the trace viewer (VIEWER:
  "trace_viewer@", the streaming one, where listed, else "trace_viewer");
- /data/plugin/profile/hosts?run=RUN&tag=VIEWER lists rank0..rankN-1;
- /data/plugin/profile/data?run=RUN&tag=VIEWER&host=H&resolution=0 (every
  host; resolution 0: no events merged for the screen) is the trace
  viewer's JSON: its slices hold a "step K" slice for each step
  K of the window, on the "trainer" line, generated kernels named by their
  model line ("mlp.kiln:12 ..."), GEMMs ("gemm MxNxK ..."), waits for data,
  and with --collectives the all-reduces on a communication line;
- with --trace FILE (the Chrome trace of the same run), each host's slices
  are those of the trace's process for that rank: the same names on lines
  of the same names, with the same start and duration to the nanosecond.

TensorBoard runs on 127.0.0.1 at a free port, in its own process group,
and is killed at the end whatever happens; every request and the wait for
TensorBoard to load the run have a deadline (--timeout, default 120 s in
all). Prints one "host ..." line per host and "ok: ..." and exits 0, or
says what is wrong and exits 1.
"""
import argparse
import collections
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Failed(Exception):
    pass


class Board:
    """A TensorBoard process and its HTTP API, under one deadline."""

    def __init__(self, logdir, deadline):
        self.deadline = deadline
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
             "--host", "127.0.0.1", "--port", str(self.port), "--load_fast", "false"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def left(self):
        return self.deadline - time.monotonic()

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-3000:]

    def get(self, path, **query):
        if self.proc.poll() is not None:
            raise Failed("tensorboard exited (code %s):\n%s"
                         % (self.proc.returncode, self.output()))
        if self.left() <= 0:
            raise Failed("deadline passed before GET %s" % path)
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=max(1.0, min(60.0, self.left()))) as r:
            body = r.read()
            # The plugin gzips its answers, as a browser accepts them.
            if r.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return body

    def get_json(self, path, **query):
        return json.loads(self.get(path, **query))

    def poll(self, what, fn):
        """fn() until it returns something true, before the deadline."""
        last = None
        while self.left() > 0:
            try:
                got = fn()
                if got:
                    return got
            except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
                last = e
            except Failed:
                raise
            time.sleep(0.5)
        raise Failed("timed out waiting for %s (last error: %s)\ntensorboard's output:\n%s"
                     % (what, last, self.output()))

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self.log.close()


def slices_of(events):
    """The slices ("X", "i") of a trace viewer / Chrome trace JSON, with
    their process's and thread's names: [(pid, line, name, ts_ns, dur_ns)]."""
    pname, tname = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e.get("args", {}).get("name", "")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e.get("args", {}).get("name", "")
    out = []
    for e in events:
        # A zero-length slice comes back as an instant event ("i").
        if e.get("ph") not in ("X", "i"):
            continue
        # The trace viewer's line "trainer — rank 0 · cpu (2 threads)" is
        # the Chrome trace's thread "trainer" of process "rank 0 · ...".
        line = tname.get((e["pid"], e.get("tid")), "?").split(" \u2014 ", 1)[0]
        out.append((e["pid"], line, e["name"], round(float(e.get("ts", 0)) * 1000),
                    round(float(e.get("dur", 0)) * 1000)))
    return out, pname


def check_host(host, data, steps, collectives, chrome, errors):
    events = data.get("traceEvents", data if isinstance(data, list) else [])
    slices, _ = slices_of(events)
    names = collections.Counter(n for _, _, n, _, _ in slices)
    lines = collections.Counter(l for _, l, _, _, _ in slices)
    step_names = sorted(int(n.split()[1]) for n in names if re.fullmatch(r"step \d+", n))
    want = list(range(steps[0], steps[1]))
    if step_names != want:
        errors.append("%s: step slices %s, expected steps %s" % (host, step_names, want))
    on_trainer = sum(1 for _, l, n, _, _ in slices if l == "trainer" and n.startswith("step "))
    if on_trainer != len(want):
        errors.append("%s: %d step slices on the 'trainer' line, expected %d"
                      % (host, on_trainer, len(want)))
    kernels = sum(c for n, c in names.items() if re.match(r"\S+\.kiln:\d+ ", n))
    gemms = sum(c for n, c in names.items() if n.startswith("gemm "))
    waits = names.get("data wait", 0)
    colls = sum(c for n, c in names.items() if n in ("all_reduce", "reduce_scatter", "all_gather"))
    if kernels < len(want) or gemms < len(want):
        errors.append("%s: %d model-line kernels and %d GEMMs for %d steps: expected at least one "
                      "of each per step" % (host, kernels, gemms, len(want)))
    if waits != len(want):
        errors.append("%s: %d 'data wait' slices, expected one per step (%d)"
                      % (host, waits, len(want)))
    if collectives and colls < len(want):
        errors.append("%s: %d collectives for %d steps" % (host, colls, len(want)))
    if not collectives and colls:
        errors.append("%s: %d collectives in a one-device run" % (host, colls))
    if chrome is not None:
        mine = collections.Counter(s[1:] for s in slices)
        theirs = collections.Counter(s[1:] for s in chrome)
        if mine != theirs:
            diff = list((mine - theirs).items())[:5] + [("missing",) + k for k in
                                                        list((theirs - mine).items())[:5]]
            errors.append("%s: slices differ from the Chrome trace's (%d vs %d), e.g. %s"
                          % (host, len(slices), len(chrome), diff))
    print("host %s: %d slices on %d lines (%s); %d steps, %d kernels, %d GEMMs, %d data waits, "
          "%d collectives%s" % (host, len(slices), len(lines), ", ".join(sorted(lines)),
                                len(step_names), kernels, gemms, waits, colls,
                                "; same as the Chrome trace" if chrome is not None else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logdir")
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--steps", required=True, help="A:B, the traced steps A..B-1")
    ap.add_argument("--trace", help="the Chrome trace of the same run (kiln-run --trace FILE)")
    ap.add_argument("--collectives", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    steps = tuple(int(x) for x in a.steps.split(":"))
    chrome_by_rank = None
    if a.trace:
        with open(a.trace) as f:
            slices, pname = slices_of(json.load(f)["traceEvents"])
        chrome_by_rank = collections.defaultdict(list)
        for s in slices:
            chrome_by_rank[int(re.match(r"rank (\d+)", pname[s[0]]).group(1))].append(s)

    board = Board(a.logdir, time.monotonic() + a.timeout)
    errors = []
    try:
        plugins = board.poll("TensorBoard's /data/plugins_listing",
                             lambda: board.get_json("/data/plugins_listing"))
        if "profile" not in plugins:
            raise Failed("TensorBoard has no profile plugin (plugins: %s): pip install "
                         "tensorboard-plugin-profile" % sorted(plugins))
        base = "/data/plugin/profile"
        runs = board.poll("the profile plugin's runs", lambda: board.get_json(base + "/runs"))
        if len(runs) != 1 or not re.fullmatch(r"\d{4}(_\d\d){5}", runs[0]):
            raise Failed("runs: %s, expected one named YYYY_MM_DD_HH_MM_SS" % runs)
        run = runs[0]
        tools = board.get_json(base + "/run_tools", run=run)
        # The Profile tab lists the streaming trace viewer ("trace_viewer@")
        # where it can, the older one ("trace_viewer") otherwise.
        viewer = [t for t in ("trace_viewer@", "trace_viewer") if t in tools]
        if not viewer:
            raise Failed("run %s: tools %s have no trace viewer" % (run, tools))
        viewer = viewer[0]
        hosts = [h["hostname"] for h in board.get_json(base + "/hosts", run=run, tag=viewer)]
        want = ["rank%d" % i for i in range(a.hosts)]
        if sorted(hosts) != want:
            raise Failed("run %s: hosts %s, expected %s" % (run, hosts, want))
        print("run %s: tools include %s; hosts %s" % (run, viewer, ", ".join(sorted(hosts))))
        for i, host in enumerate(want):
            # resolution=0: every event, none merged away for the screen.
            data = board.get_json(base + "/data", run=run, tag=viewer, host=host, resolution=0)
            check_host(host, data, steps, a.collectives,
                       chrome_by_rank[i] if chrome_by_rank is not None else None, errors)
    except Failed as e:
        errors.append(str(e))
    except urllib.error.HTTPError as e:
        errors.append("HTTP %d from %s: %s" % (e.code, e.url, e.read()[:500]))
    finally:
        board.stop()
    if errors:
        for e in errors:
            print("error:", e)
        return 1
    print("ok: %d host(s), steps %d..%d" % (a.hosts, steps[0], steps[1] - 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
