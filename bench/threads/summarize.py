"""Summarises bench/threads/run.sh's step logs (OUT/MODEL.VARIANT.THREADS.RUN.steps:
one "step ms" line per step; steps 1-10 are warm-up).

    python3 bench/threads/summarize.py OUT RUNS "MODELS" "THREADS" "VARIANTS"
"""
import statistics
import sys


def quantile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    out, runs = sys.argv[1], int(sys.argv[2])
    models, threads, variants = sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
    for m in models:
        base = None
        for variant in variants:
            for t in threads:
                every, medians = [], []
                for r in range(1, runs + 1):
                    with open(f"{out}/{m}.{variant}.{t}.{r}.steps") as f:
                        xs = [float(l.split()[1]) for l in f if int(l.split()[0]) > 10]
                    every += xs
                    medians.append(statistics.median(xs))
                med = statistics.median(every)
                base = base or med
                print(f"{m:6s} {variant:6s} {t} thread(s): median {med:6.2f} ms/step"
                      f"  p10-p90 {quantile(every, .1):6.2f}-{quantile(every, .9):6.2f}"
                      f"  run medians {statistics.median(medians):6.2f}"
                      f" ({min(medians):.2f}-{max(medians):.2f})  vs first {med / base:4.2f}x")


if __name__ == "__main__":
    main()
