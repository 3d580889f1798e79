#!/usr/bin/env python3
"""Writes a broken copy of a trace file, to prove check-trace.py finds the fault.

Usage: break_trace.py IN OUT FAULT, FAULT one of:
  overlap     a kernel slice moved to straddle the end of the slice before it
  line        a kernel slice's first model line moved past the model file's end
  metadata    a track's thread_name metadata dropped
  step        one step slice dropped
"""
import json
import re
import sys

src, dst, fault = sys.argv[1:4]
doc = json.load(open(src))
ev = doc["traceEvents"]
# The first process's compute track, by name.
compute = next((e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and
               e["name"] == "thread_name" and e["args"]["name"] == "compute (queue 0)")
kernels = [i for i, e in enumerate(ev) if e.get("cat") == "kernel" and e["args"].get("lines")]
if fault == "overlap":
    # Two neighbouring slices on one track: the second starts half-way
    # through the first and ends after it.
    track = [e for e in ev if e.get("ph") == "X" and (e["pid"], e["tid"]) == compute
             and e["dur"] > 2]
    track.sort(key=lambda e: e["ts"])
    a, b = track[0], track[1]
    b["ts"] = a["ts"] + a["dur"] / 2
    b["dur"] = a["dur"]
elif fault == "line":
    lines = ev[kernels[0]]["args"]["lines"]
    lines[0] = re.sub(r":\d+(:\d+)?$", ":99999:1", lines[0])
elif fault == "metadata":
    doc["traceEvents"] = [e for e in ev if not (e.get("ph") == "M" and e["name"] == "thread_name"
                                                 and (e["pid"], e["tid"]) == compute)]
elif fault == "step":
    i = next(i for i, e in enumerate(ev) if e.get("cat") == "step")
    del ev[i]
else:
    sys.exit(f"unknown fault {fault}")
json.dump(doc, open(dst, "w"))
