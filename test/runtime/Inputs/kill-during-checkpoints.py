"""Kills `kiln-run train` with SIGKILL at random moments while it writes a
checkpoint every step, then checks the checkpoint still verifies.

usage: kill-during-checkpoints.py MODEL.kpack DATA WORKDIR ROUNDS
Each round trains (resuming from the last checkpoint) and is killed after a
random 0.3-1.5 s; `kiln-run inspect` must then verify the checkpoint. The
seed is fixed, so a failure reproduces; every wait has a deadline.
"""
import os, random, signal, subprocess, sys, time

kpack, data, work, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.makedirs(work, exist_ok=True)
ckpt = os.path.join(work, "c.safetensors")
rng = random.Random(11)
base = ["kiln-run", "train", kpack, "--data", data, "--eval-interval", "0", "--quiet",
        "--checkpoint-every", "1", "--checkpoint", ckpt]
subprocess.run(base + ["--steps", "2"], check=True, timeout=120)
steps = []
for r in range(rounds):
    p = subprocess.Popen(base + ["--steps", "1000000", "--resume", ckpt],
                         stdout=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.3, 1.5))
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    out = subprocess.run(["kiln-run", "inspect", ckpt], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or "(verified)" not in out.stdout:
        print(f"round {r}: the checkpoint does not verify after SIGKILL:\n{out.stdout}{out.stderr}")
        sys.exit(1)
    step = [l.split("=")[1].strip() for l in out.stdout.splitlines() if l.strip().startswith("step =")]
    steps.append(int(step[0]))
if steps != sorted(steps) or steps[-1] <= 2:
    print(f"checkpoints did not advance across the kills: steps {steps}")
    sys.exit(1)
print(f"{rounds} kills, checkpoint verified after each (steps {steps})")
