#!/usr/bin/python3
"""bench/gpu_train.py - kiln-train samples/s with its tables on the GPU
(resources.device: cuda) against the same run on the CPU, in one run on the
same data. docs/benchmarks.md and docs/gpu.md say how to read it.

    /usr/bin/python3 bench/gpu_train.py [--build build-gpu] [--repeat 3]
        [--rows 200000] [--models lr,fm,dlrm] [--ranks 1] [--zipf 1.15]
        [--threads 2,0] [--exchange-peer] [--batch 4096]

Needs a build with kiln and kiln-train (CUDA on for the GPU side) and mpirun.
Per model, --repeat runs of each device (seed 42 + r, batch --batch / ranks per
rank, kiln-bin data, the training loop alone: kiln-train's train_seconds);
prints the median samples/s of each, the ratio cuda / cpu and both median
eval loglosses. --exchange-peer adds the GPU run with the exchange over host
buffers (kiln-train --device-exchange host) as a peer, so that on several
GPUs (--ranks N) the ratio says what the NCCL exchange of device buffers
buys. Where kiln-train cannot train on a GPU it prints one "skipped:" line
with kiln-train's reason and exits 0.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from trainer_vs_torch import bench_args, make_data

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(cmd, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    if check and p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p


def train(build, work, model, device, ranks, seed, threads=0, check=True, extra=(), batch=4096,
          wrap=()):
    spec = os.path.join(work, "%s-%s-%d.yaml" % (model, device, seed))
    with open(spec, "w") as f:
        f.write("name: gpu-bench-%s\n" % model)
        f.write("data: {train: day0.bin, eval: eval.bin, format: kiln-bin}\n")
        f.write("model: {type: %s}\n" % model)
        f.write("train: {batch_size: %d, seed: %d, init_from: none}\n" % (batch // ranks, seed))
        f.write("resources: {device: %s, threads: %d}\n" % (device, threads))
    rundir = os.path.join(work, "run")
    shutil.rmtree(rundir, ignore_errors=True)
    p = run(["mpirun", "-np", str(ranks), "--bind-to", "none"] + list(wrap) +
            [os.path.join(build, "trainer", "kiln-train"), "--spec", spec, "--run-dir", rundir,
             "--quiet"] + list(extra), check)
    if p.returncode != 0:
        return None, p.stderr
    if wrap:
        return p.stdout, p.stderr
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1]), ""


def main():
    ap = bench_args(__doc__)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--zipf", type=float, default=1.15)
    ap.add_argument("--threads", default="2,0")
    ap.add_argument("--exchange-peer", action="store_true")
    ap.add_argument("--batch", type=int, default=4096, help="global batch (split over ranks)")
    ap.add_argument("--profile", metavar="DIR",
                    help="instead of the table: one cuda run per model under Nsight Systems "
                    "(NSYS, default nsys), its --stats report into DIR/MODEL.txt")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    threads = [int(t) for t in a.threads.split(",")]
    skew = (["--zipf", str(a.zipf), "--vocab", "200000", "--empty", "0.04"] if a.zipf > 0 else [])
    work = tempfile.mkdtemp(prefix="kiln-gpu-bench-")
    try:
        make_data(build, work, a.rows, skew)
        probe, why = train(build, work, "lr", "cuda", a.ranks, 1, check=False)
        if probe is None:
            line = [l for l in why.splitlines() if "device" in l]
            print("skipped: %s" % (line[0].strip() if line else why.strip()[-300:]))
            return
        if a.profile:
            os.makedirs(a.profile, exist_ok=True)
            for m in a.models.split(","):
                rep = os.path.join(a.profile, m)
                out, err = train(build, work, m, "cuda", a.ranks, 42, batch=a.batch, check=False,
                                 wrap=(os.environ.get("NSYS", "nsys"), "profile", "--stats=true",
                                       "--trace=cuda,nvtx", "--force-overwrite=true",
                                       "-o", rep))
                with open(rep + ".txt", "w") as f:
                    f.write((out or "") + "\n--- stderr\n" + err)
                print("%s: profile in %s.txt" % (m, rep), flush=True)
            return
        runs = [("cuda", 0, ())] + [("cpu", t, ()) for t in threads]
        names = ["cuda"] + ["cpu%s" % (t if t else "-all") for t in threads]
        if a.exchange_peer:
            runs.append(("cuda", 0, ("--device-exchange", "host")))
            names.append("cuda-hostx")
        print("%d rows, ranks %d, zipf %s, %d cores here; medians of %d" % (
            a.rows, a.ranks, a.zipf, os.cpu_count(), a.repeat))
        print("%-5s %s %s %s" % ("model", " ".join("%11s" % (n + " sps") for n in names),
                                 " ".join("%10s" % ("cuda/" + n) for n in names[1:]),
                                 " ".join("%9s" % (n + " ll") for n in names)))
        for m in a.models.split(","):
            med = []
            for dev, t, extra in runs:
                v = [train(build, work, m, dev, a.ranks, 42 + r, t, extra=extra, batch=a.batch)[0]
                     for r in range(a.repeat)]
                med.append((statistics.median(j["samples_per_s"] for j in v),
                            statistics.median(j["eval_logloss"] for j in v)))
            print("%-5s %s %s %s" % (
                m, " ".join("%11.0f" % x[0] for x in med),
                " ".join("%9.2fx" % (med[0][0] / x[0]) for x in med[1:]),
                " ".join("%9.5f" % x[1] for x in med)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
