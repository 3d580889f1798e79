#!/usr/bin/env python3
"""Makes a multi-device artifact by hand from a one-device one, for the
trainer's tests before (and independently of) the data-parallel compiler.

  make_dp_artifact.py IN.kpack N OUT.kpack

The plan gets a mesh of N devices on axis "dp" (every device's buffer plan
device 0's) and, at the end of @train_step, an in-place all_reduce (mean)
over dp of every parameter and of the loss: each device trains on its own
data shard and the parameters are averaged after every step (parameter
averaging, not gradient averaging: the numbers are not those of one device
on the N-times batch, but every runtime path of a data-parallel run is
taken: in-process and MPI communicators, collective steps, data shards,
the handshake, checkpoints, faults).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpack_manifest as k  # noqa: E402


def main():
    src, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    version, sections = k.read(src)
    sec = next(s for s in sections if s[1] == "plan")
    plan = json.loads(sec[2])
    plan["mesh"] = {"axes": [{"name": "dp", "size": n}]}
    dev0 = plan["devices"][0]
    plan["devices"] = [dict(dev0, device=d) for d in range(n)]
    bufs = dev0["buffers"]
    f = next(f for f in plan["functions"] if f["name"] == "train_step")
    ids = [i for i, b in enumerate(bufs) if b["role"] == "param"]
    ids += [i for i in f["results"] if bufs[i]["name"] == "loss"]
    for i in ids:
        f["steps"].append({"kind": "collective", "args": [i, i], "loc": "", "queue": 0,
                           "deps": [], "collective": {
                               "op": "all_reduce", "axis": "dp", "dtype": bufs[i]["dtype"],
                               "reduction": "mean", "bytes": bufs[i]["bytes"], "peer": -1,
                               "send_offset": 0, "recv_offset": 0}})
    sec[2] = json.dumps(plan).encode()
    k.write(out, version, sections)


if __name__ == "__main__":
    main()
