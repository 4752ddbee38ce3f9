#!/usr/bin/python3
"""bench/gpu_train.py - kiln-train samples/s with its tables on the GPU
(resources.device: cuda) against the same run on the CPU, in one run on the
same data. docs/benchmarks.md and docs/gpu.md say how to read it.

    /usr/bin/python3 bench/gpu_train.py [--build build-gpu] [--repeat 3]
        [--rows 200000] [--models lr,fm,dlrm] [--ranks 1]

Needs a build with kiln and kiln-train (CUDA on for the GPU side) and mpirun.
Per model, --repeat runs of each device (seed 42 + r, batch 4096 / ranks per
rank, kiln-bin data, the training loop alone: kiln-train's train_seconds);
prints the median samples/s of each, the ratio cuda / cpu and both median
eval loglosses. Where kiln-train cannot train on a GPU it prints one
"skipped:" line with kiln-train's reason and exits 0.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from trainer_vs_torch import make_data

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(cmd, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    if check and p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p


def train(build, work, model, device, ranks, seed, check=True):
    spec = os.path.join(work, "%s-%s-%d.yaml" % (model, device, seed))
    with open(spec, "w") as f:
        f.write("name: gpu-bench-%s\n" % model)
        f.write("data: {train: day0.bin, eval: eval.bin, format: kiln-bin}\n")
        f.write("model: {type: %s}\n" % model)
        f.write("train: {batch_size: %d, seed: %d, init_from: none}\n" % (4096 // ranks, seed))
        f.write("resources: {device: %s}\n" % device)
    rundir = os.path.join(work, "run")
    shutil.rmtree(rundir, ignore_errors=True)
    p = run(["mpirun", "-np", str(ranks), "--bind-to", "none",
             os.path.join(build, "runtime", "kiln-train"), "--spec", spec, "--run-dir", rundir,
             "--quiet"], check)
    if p.returncode != 0:
        return None, p.stderr
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1]), ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="lr,fm,dlrm")
    ap.add_argument("--ranks", type=int, default=1)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="kiln-gpu-bench-")
    try:
        make_data(build, work, a.rows)
        probe, why = train(build, work, "lr", "cuda", a.ranks, 1, check=False)
        if probe is None:
            line = [l for l in why.splitlines() if "device" in l]
            print("skipped: %s" % (line[0].strip() if line else why.strip()[-300:]))
            return
        print("%-5s %12s %12s %7s %9s %9s" % ("model", "cpu sps", "cuda sps", "ratio", "cpu ll",
                                             "cuda ll"))
        for m in a.models.split(","):
            res = {}
            for dev in ("cpu", "cuda"):
                for r in range(a.repeat):
                    j, _ = train(build, work, m, dev, a.ranks, 42 + r)
                    res.setdefault(dev, []).append((j["samples_per_s"], j["eval_logloss"]))
            med = {d: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
                   for d, v in res.items()}
            print("%-5s %12.0f %12.0f %6.2fx %9.5f %9.5f" % (
                m, med["cpu"][0], med["cuda"][0], med["cuda"][0] / med["cpu"][0], med["cpu"][1],
                med["cuda"][1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
