#!/usr/bin/python3
"""bench/precision_bench.py - kiln-train dlrm's speed with
model.dense_precision fp32 against bf16 (issue 23 item 4), on the same data
and machine, runs interleaved so that both see the same load.

    /usr/bin/python3 bench/precision_bench.py [--build build] [--repeat 3]
        [--rows 400000] [--zipf 1.15 --vocab 200000 --empty 0.04]
        [--ranks 1 --threads 2] [--batch 4096]

What it does: kiln datagen makes --rows training rows (Zipf-skewed ids by
default) and rows/10 eval rows, converted to kiln-bin; then --repeat rounds,
each one kiln-train run per precision (fp32 first in even rounds, bf16 first
in odd ones), mpirun -np RANKS --bind-to none, resources.threads THREADS,
train.batch_size BATCH per rank (dlrm's default shape: bottom 13-64-16, top
367-256-128-1, dim 16). Each run's samples/s is kiln-train's own figure
(rows over the training loop's seconds, result.json). Prints one JSON line
per run (with /proc/loadavg's first number before it), then the median of
each precision, the ratio bf16 / fp32, and the median eval logloss of each.
Needs a CPU with AVX512_BF16 or AMX-BF16 (kiln-train refuses bf16 otherwise).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_vs_torch import cleanup, make_data, run  # noqa: E402


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def train(build, work, precision, seed, a):
    spec = os.path.join(work, "%s-%d.yaml" % (precision, seed))
    with open(spec, "w") as f:
        f.write("name: prec-%s\n" % precision)
        f.write("data: {train: day0.bin, eval: eval.bin, format: kiln-bin}\n")
        f.write("model: {type: dlrm, dense_precision: %s}\n" % precision)
        f.write("train: {batch_size: %d, seed: %d, init_from: none}\n" % (a.batch, seed))
        f.write("resources: {threads: %d}\n" % a.threads)
        f.write("checkpoint: {dir: ck-%s-%d}\n" % (precision, seed))
    rundir = os.path.join(work, "run")
    shutil.rmtree(rundir, ignore_errors=True)
    out = run(["mpirun", "-np", str(a.ranks), "--bind-to", "none",
               os.path.join(build, "trainer", "kiln-train"), "--spec", spec, "--run-dir", rundir,
               "--quiet"])
    j = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    if j.get("dense_precision") != precision:
        sys.exit("kiln-train ran %s, not %s" % (j.get("dense_precision"), precision))
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, kind, default in (("--build", str, os.path.join(HERE, "..", "build")),
                                ("--rows", int, 400000), ("--repeat", int, 3),
                                ("--zipf", str, "1.15"), ("--vocab", str, "200000"),
                                ("--empty", str, "0.04"), ("--ranks", int, 1),
                                ("--threads", int, 2), ("--batch", int, 4096)):
        ap.add_argument(name, type=kind, default=default)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="kiln-precision-")
    print(json.dumps({"cpu": cpu_model(), "ranks": a.ranks, "threads": a.threads,
                      "batch": a.batch, "rows": a.rows, "zipf": a.zipf, "vocab": a.vocab}),
          flush=True)
    res = {"fp32": [], "bf16": []}
    try:
        make_data(build, work, a.rows,
                  ["--zipf", a.zipf, "--vocab", a.vocab, "--empty", a.empty])
        for r in range(a.repeat):
            order = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
            for p in order:
                before = load1()
                j = train(build, work, p, 42 + r, a)
                res[p].append(j)
                print(json.dumps({"precision": p, "run": r, "load1_before": before,
                                  "samples_per_s": round(j["samples_per_s"]),
                                  "train_seconds": j["train_seconds"],
                                  "eval_logloss": j["eval_logloss"],
                                  "dense_kernels": j.get("dense_kernels")}), flush=True)
        med = {p: statistics.median(j["samples_per_s"] for j in v) for p, v in res.items()}
        ll = {p: statistics.median(j["eval_logloss"] for j in v) for p, v in res.items()}
        print("\nmedian samples/s: fp32 %.0f, bf16 %.0f, bf16 / fp32 = %.2fx; "
              "median eval logloss: fp32 %.5f, bf16 %.5f (%+.5f); load1 now %.2f"
              % (med["fp32"], med["bf16"], med["bf16"] / med["fp32"], ll["fp32"], ll["bf16"],
                 ll["bf16"] - ll["fp32"], load1()))
    finally:
        cleanup(work, a.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
