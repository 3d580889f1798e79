#!/usr/bin/env python3
"""Ctrl-C during kiln-run train: starts it, waits for its first progress
line after step 1, sends SIGINT (or --signal TERM: what mpirun passes the
ranks on Ctrl-C, and what schedulers send before preempting a job), and
checks that it saved a checkpoint and exited with 130 and a resume hint.

  interrupt.py [--signal INT|TERM] [--twice] CHECKPOINT -- KILN_RUN_COMMAND...

--twice sends the signal twice at once, as `timeout -s INT` does (to the
process, then to its process group): still one stop that saves.
"""
import os
import signal
import subprocess
import sys


def main():
    args = sys.argv[1:sys.argv.index("--")]
    sig = signal.SIGINT
    if args[0] == "--signal":
        sig = getattr(signal, "SIG" + args[1])
        args = args[2:]
    twice = args[0] == "--twice"
    if twice:
        args = args[1:]
    ckpt = args[0]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if line.startswith("step") and "/" in line.split("|")[0] and not line.startswith("step     1/"):
            p.send_signal(sig)
            if twice:
                p.send_signal(sig)
            break
    rest, _ = p.communicate(timeout=120)
    out.append(rest)
    text = "".join(out)
    print(text)
    if p.returncode != 130:
        print(f"FAIL: exit code {p.returncode}, expected 130")
        return 1
    if not os.path.exists(ckpt):
        print(f"FAIL: no checkpoint at {ckpt}")
        return 1
    print("PASS: interrupted, checkpoint saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
