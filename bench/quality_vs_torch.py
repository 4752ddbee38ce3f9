#!/usr/bin/python3
"""bench/quality_vs_torch.py - eval logloss and AUC of kiln-train against
PyTorch (bench/torch_models.py) on the same data, batches and settings, for
lr, fm and dlrm x batch sizes x two id skews, with both training-loss curves
as an SVG. docs/benchmarks.md has the results and how to read them.

    /usr/bin/python3 bench/quality_vs_torch.py [--build build] [--seeds 3]
        [--rows 200000] [--eval-rows 50000] [--models lr,fm,dlrm]
        [--batches 256,1024,4096] [--skews uniform:0.2,zipf:1.15]
        [--vocab 200000] [--empty 0.04] [--epochs 1]
        [--svg docs/quality-loss-curves.svg] [--curve-batch 1024] [--bf16]

Needs Debian's python3-torch, python3-numpy and (for the SVG)
python3-matplotlib under /usr/bin/python3, a build with kiln and kiln-train,
and mpirun.

What it does, per skew (kiln datagen --zipf Z --vocab V --empty E):
  1. Training rows (--part 0) and eval rows of the same day and ids (--part
     1), converted to kiln-bin; datagen reports the eval rows' Bayes-optimal
     logloss (the generator knows every row's click probability).
  2. Per model and seed: kiln-train with learning rate 0 over the training
     file writes a checkpoint holding the initial row of every training key
     and the initial dense weights (kiln's seeded init). Both sides start
     from exactly these weights, so the comparison is of the training
     arithmetic alone, not of two random draws (which alone move a 49-step
     fm or dlrm by +-0.01 logloss).
  3. Per batch size: kiln-train, 1 rank x 2 threads, adagrad 0.05 sparse
     and dense (eps 1e-10, no initial accumulator), dim 16, kiln's defaults
     otherwise; PyTorch: the same model in float32 with one
     nn.EmbeddingBag(mode="sum", sparse=True), torch.optim.Adagrad(lr=0.05,
     eps=1e-10) on all parameters, the same batches in the same order, 2
     threads. An eval key never seen in training is an empty bag on the torch
     side and reads as zeros in kiln (docs/models.md): the same thing.
  4. Prints per cell the median over seeds of each side's eval logloss and
     AUC, the difference of the medians, the median and the largest of the
     per-seed (paired) differences, and whether kiln <= torch + 0.002.

With --data teacher the rows come from this script's own click model
(teacher_tsv), not kiln datagen's, so that neither side is measured only on
data Kiln was developed on.

With --defaults own each side starts from its OWN defaults instead of
kiln's weights copied into PyTorch (step 2 is skipped for the weights; its
checkpoint still names the training keys): kiln-train with whatever the spec
leaves unset (dim 16 and adagrad 0.05 are set on both sides), PyTorch with
nn.Linear's own initialisation (U(+-1/sqrt(fan_in)) for weights and biases,
also lr/fm's w.x + b as an nn.Linear(13, 1)) and the usual embedding init of
the DLRM reference and TorchRec, U(+-sqrt(1 / rows of the table)) per slot.
Each seed is a different draw on both sides; the table prints the mean and
the spread (sample standard deviation) over seeds, and the goal is kiln's
mean <= torch's mean + 0.002 with a spread no wider than torch's (+ 0.001,
the resolution of a few seeds).

With --bf16 (dlrm only) kiln-train also trains each cell with
model.dense_precision: bf16 from the same start, and a second table compares
it with kiln's fp32 run: the mean over seeds of each, the mean and the worst
of the paired (same seed) differences, and whether bf16 <= fp32 + 0.002.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_vs_torch import cleanup, run  # noqa: E402  (run: mpirun-ready, exits on failure)

NDENSE, NSLOTS, DIM, LR, EPS = 13, 26, 16, 0.05, 1e-10
GOAL = 0.002


def read_kbin(path):
    """A single-hot kiln-bin file (docs/data-formats.md) as labels (n,),
    dense (n, F) float32 and keys (n, S) int64 with -1 for an empty field."""
    b = open(path, "rb").read()
    nd, ns = struct.unpack_from("<II", b, 16)
    nchunks, = struct.unpack_from("<I", b, 36)
    index, = struct.unpack_from("<Q", b, 40)
    pad8 = lambda x: (x + 7) // 8 * 8
    ys, xs, ks = [], [], []
    for c in range(nchunks):
        off, _, _ = struct.unpack_from("<QQI", b, index + 32 * c)
        n, = struct.unpack_from("<I", b, off)
        nk, = struct.unpack_from("<Q", b, off + 8)
        p = off + 16
        ys.append(np.frombuffer(b, np.uint8, n, p).astype(np.float32))
        p += pad8(n)
        xs.append(np.frombuffer(b, np.float32, n * nd, p).reshape(n, nd))
        p += pad8(4 * n * nd)
        counts = np.frombuffer(b, np.uint16, ns * n, p).reshape(ns, n)
        p += pad8(2 * ns * n)
        if counts.max(initial=0) > 1:
            sys.exit("%s: multi-hot rows; this benchmark reads single-hot data" % path)
        keys = np.frombuffer(b, np.int64, nk, p)
        k = np.full((ns, n), -1, np.int64)
        k[counts == 1] = keys  # slot-major, rows in order: the same order as the mask
        ks.append(k.T)
    return np.concatenate(ys), np.concatenate(xs), np.concatenate(ks)


def teacher_tsv(path, rows, zipf, vocab, empty, part):
    """Criteo-format rows from a click model that is not kiln datagen's (so
    that neither side is tuned to it): per slot Zipf(zipf) ids over vocab
    values (hex strings, as Criteo's), each id a bias N(0, 0.25) and a
    4-dimensional factor N(0, 0.2); logit = -1.1 + sum of the row's biases
    + the factors' pairwise dot products + a saturating function of the
    log1p'd counts (13 of them, lognormal). The teacher's draws come from
    seed 7, the rows from seed 100 + part. Returns the rows' Bayes logloss."""
    t = np.random.default_rng(7)
    S, K = NSLOTS, 4
    bias = t.normal(0, 0.25, (S, vocab))
    fac = t.normal(0, 0.2, (S, vocab, K))
    wd = t.normal(0, 0.5, NDENSE)
    perm = np.stack([t.permutation(vocab) for _ in range(S)])
    g = np.random.default_rng(100 + part)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -zipf
    p /= p.sum()
    ids = np.stack([perm[s][g.choice(vocab, rows, p=p)] for s in range(S)], 1)  # (n, S)
    miss = g.random((rows, S)) < empty
    counts = np.floor(np.exp(g.normal(1.0, 1.2, (rows, NDENSE)))).astype(np.int64)
    x = np.log1p(counts)
    b = np.where(miss, 0.0, bias[np.arange(S)[None, :], ids])
    v = np.where(miss[:, :, None], 0.0, fac[np.arange(S)[None, :], ids])
    vs = v.sum(1)
    logit = (-1.1 + b.sum(1) + 0.5 * ((vs * vs).sum(1) - (v * v).sum((1, 2)))
             + 1.5 * np.tanh(x @ wd / 2))
    prob = 1 / (1 + np.exp(-logit))
    y = (g.random(rows) < prob).astype(np.int64)
    with open(path, "w") as f:
        for i in range(rows):
            cat = ["" if miss[i, s] else "%08x" % (ids[i, s] * 2654435761 % 2**32 + s)
                   for s in range(S)]
            f.write("%d\t%s\t%s\n" % (y[i], "\t".join(str(c) for c in counts[i]),
                                     "\t".join(cat)))
    pc = np.clip(prob, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(pc) + (1 - y) * np.log(1 - pc)).mean())


def make_data(build, work, name, zipf, a):
    kiln = os.path.join(build, "tools", "kiln")
    out = {}
    if a.data == "teacher":
        for part, rows in ((0, a.rows), (1, a.eval_rows)):
            tsv = os.path.join(work, "%s-%d.tsv" % (name, part))
            bay = teacher_tsv(tsv, rows, zipf, a.vocab, a.empty, part)
            run([kiln, "convert", tsv, "--out", tsv[:-4] + ".bin"])
            out[part] = (tsv[:-4] + ".bin", bay)
        return out[0][0], out[1][0], out[1][1]
    for part, rows in ((0, a.rows), (1, a.eval_rows)):
        tsv = os.path.join(work, "%s-%d.tsv" % (name, part))
        j = json.loads(run([kiln, "--json", "datagen", "--rows", str(rows), "--out", tsv,
                            "--zipf", str(zipf), "--vocab", str(a.vocab), "--empty",
                            str(a.empty), "--part", str(part), "--seed", "42"]))
        run([kiln, "convert", tsv, "--out", tsv[:-4] + ".bin"])
        out[part] = (tsv[:-4] + ".bin", j["bayes_logloss"])
    return out[0][0], out[1][0], out[1][1]


def kiln_train(build, work, model, train, evalf, batch, seed, lr, epochs, tag, precision="fp32"):
    d = os.path.join(work, tag)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    spec = os.path.join(d, "spec.yaml")
    with open(spec, "w") as f:
        f.write("name: q-%s\n" % model)
        f.write("data: {train: %s, %sformat: kiln-bin}\n"
                % (train, "eval: %s, " % evalf if evalf else ""))
        f.write("model: {type: %s, dense_precision: %s, embedding: {dim: %d}}\n"
                % (model, precision, DIM))
        f.write("train: {batch_size: %d, seed: %d, epochs: %d, init_from: none, log_every: 1,\n"
                "  optimizer: {sparse: {lr: %g}, dense: {lr: %g}}}\n"
                % (batch, seed, epochs, lr, lr))
        f.write("resources: {threads: 2}\ncheckpoint: {dir: %s/ck}\n" % d)
    out = run(["mpirun", "-np", "1", "--bind-to", "none",
               os.path.join(build, "trainer", "kiln-train"), "--spec", spec, "--run-dir",
               os.path.join(d, "run"), "--quiet"])
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    curve = []
    with open(os.path.join(d, "run", "progress.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                curve.append(j["loss"])
    ck = sorted(glob.glob(os.path.join(d, "ck", "1*")))[-1]
    return res, curve, ck


class Init:
    """kiln's initial weights from an lr-0 checkpoint: every training key's
    row (global ids per slot) and the flat dense vector."""

    def __init__(self, ck):
        self.keys, self.base, rows = [], [], []
        at = 0
        for s in range(NSLOTS):
            ks = [np.load(f) for f in sorted(glob.glob(os.path.join(ck, "slot%d.r*.keys.npy" % s)))]
            vs = [np.load(f) for f in sorted(glob.glob(os.path.join(ck, "slot%d.r*.values.npy" % s)))]
            k, v = np.concatenate(ks), np.concatenate(vs)
            order = np.argsort(k)
            self.keys.append(k[order])
            rows.append(v[order])
            self.base.append(at)
            at += len(k)
        self.rows = np.concatenate(rows)
        self.dense = np.load(os.path.join(ck, "dense.params.npy"))

    def ids(self, keys):
        """keys (n, S) -> global ids (n, S), -1 for empty or unknown."""
        out = np.full(keys.shape, -1, np.int64)
        for s in range(NSLOTS):
            k, tab = keys[:, s], self.keys[s]
            pos = np.searchsorted(tab, k)
            pos[pos >= len(tab)] = 0
            hit = (k >= 0) & (len(tab) > 0) & (tab[pos] == k)
            out[hit, s] = pos[hit] + self.base[s]
        return out


def own_defaults(m, model, init):
    """PyTorch's own initialisation of the model m (see the docstring)."""
    import torch
    import torch.nn as nn
    with torch.no_grad():
        for s in range(NSLOTS):
            n = len(init.keys[s])
            if n:
                b = (1.0 / n) ** 0.5
                m.emb.weight[init.base[s]:init.base[s] + n].uniform_(-b, b)
        if model in ("lr", "fm"):
            lin = nn.Linear(NDENSE, 1)  # its reset_parameters: U(+-1/sqrt(13))
            m.w.copy_(lin.weight.view(-1))
            m.b.copy_(lin.bias.view(()))
        else:
            for lin in [x for x in list(m.bottom) + list(m.top) if isinstance(x, nn.Linear)]:
                lin.reset_parameters()


def torch_train(model, init, train, evalf, batch, epochs, threads, own=False, seed=0):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_models as tm
    torch.set_num_threads(threads)
    (ytr, xtr, ktr), (yev, xev, kev) = train, evalf
    zero = np.zeros(NSLOTS, np.int64)
    trb = tm.make_batches(ytr, xtr, init.ids(ktr), zero, batch)
    evb = tm.make_batches(yev, xev, init.ids(kev), zero, 4096)
    m = tm.Model(model, len(init.rows), DIM, seed)
    P = torch.from_numpy(init.dense.copy())
    if own:
        own_defaults(m, model, init)
    else:
        with torch.no_grad():
            m.emb.weight.copy_(torch.from_numpy(init.rows))
            if model in ("lr", "fm"):
                m.w.copy_(P[:NDENSE])
                m.b.copy_(P[NDENSE])
                assert len(P) == NDENSE + 1
            else:
                off = 0
                for lin in [x for x in list(m.bottom) + list(m.top) if isinstance(x, nn.Linear)]:
                    o, i = lin.weight.shape
                    lin.weight.copy_(P[off:off + o * i].view(o, i))
                    off += o * i
                    lin.bias.copy_(P[off:off + o])
                    off += o
                assert off == len(P)
    opt = torch.optim.Adagrad(m.parameters(), lr=LR, eps=EPS)
    curve = []
    for _ in range(epochs):
        for y, x, flat, off in trb:
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(m(x, flat, off), y)
            loss.backward()
            opt.step()
            curve.append(loss.item())
    with torch.no_grad():
        z = torch.cat([m(x, flat, off) for _, x, flat, off in evb])
        y = torch.cat([b[0] for b in evb])
        p = torch.sigmoid(z).clamp(1e-7, 1 - 1e-7)  # kiln's model_metrics_logloss clamp
        ll = F.binary_cross_entropy(p, y).item()
        auc = tm.auc(torch.sigmoid(z).numpy(), y.numpy())
    return ll, auc, curve


def smooth(c, w):
    if w <= 1 or len(c) < w:
        return c
    k = np.ones(w) / w
    return list(np.convolve(c, k, mode="valid"))


def write_svg(path, curves, batch, bayes):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no SVG: python3-matplotlib is not installed (apt-get install python3-matplotlib)")
        return
    skews = sorted({k[0] for k in curves})
    models = [m for m in ("lr", "fm", "dlrm") if any(k[1] == m for k in curves)]
    fig, axes = plt.subplots(len(skews), len(models), figsize=(4 * len(models), 3 * len(skews)),
                             squeeze=False)
    for i, sk in enumerate(skews):
        for j, m in enumerate(models):
            ax = axes[i][j]
            kc, tc = curves.get((sk, m), ([], []))
            w = max(1, len(kc) // 40)
            ax.plot(range(w, len(kc) + 1), smooth(kc, w), label="kiln-train", lw=1.2)
            ax.plot(range(w, len(tc) + 1), smooth(tc, w), label="PyTorch", lw=1.2, ls="--")
            if sk in bayes:
                ax.axhline(bayes[sk], color="grey", lw=0.8, ls=":", label="Bayes (eval)")
            ax.set_title("%s, %s, batch %d" % (m, sk, batch), fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.set_ylabel("training loss (moving mean of %d)" % w, fontsize=8)
            ax.set_ylim(0.35, 0.8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    print("wrote", path)


def own_table(rows, skews, models, batches, seeds):
    """Each side's own defaults: mean and spread over seeds, and the goal."""
    print("\neach side's own defaults, over %d seeds: mean (spread)" % seeds)
    print("%-8s %-5s %6s %19s %19s %9s %s" % ("skew", "model", "batch", "kiln ll", "torch ll",
                                               "diff", "kiln <= torch + 0.002, spread <= torch's"))
    for sk, _ in skews:
        for m in models:
            for b in batches:
                c = [r for r in rows if r["skew"] == sk and r["model"] == m and r["batch"] == b]
                k = [r["kiln_logloss"] for r in c]
                t = [r["torch_logloss"] for r in c]
                sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
                km, tmn = statistics.mean(k), statistics.mean(t)
                ok = km <= tmn + GOAL and sd(k) <= sd(t) + 0.001
                print("%-8s %-5s %6d %9.5f (%.5f) %9.5f (%.5f) %+9.5f %s"
                      % (sk, m, b, km, sd(k), tmn, sd(t), km - tmn, "met" if ok else "NOT met"))


def bf16_table(rows, skews, models, batches, seeds):
    """kiln bf16 against kiln fp32, paired by seed (same start, same batches)."""
    print("\nkiln model.dense_precision bf16 vs fp32, over %d seeds" % seeds)
    print("%-8s %-5s %6s %9s %9s %9s %9s %8s %8s %s"
          % ("skew", "model", "batch", "fp32 ll", "bf16 ll", "mean diff", "worst", "fp32 auc",
             "bf16 auc", "bf16 <= fp32 + 0.002"))
    for sk, _ in skews:
        for m in models:
            for b in batches:
                c = [r for r in rows if r["skew"] == sk and r["model"] == m and r["batch"] == b]
                d = [r["kiln_bf16_logloss"] - r["kiln_logloss"] for r in c]
                mean = lambda k: statistics.mean(r[k] for r in c)
                print("%-8s %-5s %6d %9.5f %9.5f %+9.5f %+9.5f %8.4f %8.4f %s"
                      % (sk, m, b, mean("kiln_logloss"), mean("kiln_bf16_logloss"),
                         statistics.mean(d), max(d, key=abs), mean("kiln_auc"),
                         mean("kiln_bf16_auc"), "met" if statistics.mean(d) <= GOAL else "NOT met"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--eval-rows", type=int, default=50000)
    ap.add_argument("--vocab", type=int, default=200000)
    ap.add_argument("--empty", type=float, default=0.04)
    ap.add_argument("--skews", default="uniform:0.2,zipf:1.15",
                    help="NAME:EXPONENT pairs for kiln datagen --zipf")
    ap.add_argument("--models", default="lr,fm,dlrm")
    ap.add_argument("--batches", default="256,1024,4096")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--svg", default=os.path.join(HERE, "..", "docs", "quality-loss-curves.svg"))
    ap.add_argument("--curve-batch", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--data", choices=("datagen", "teacher"), default="datagen",
                    help="datagen: kiln datagen's rows; teacher: this script's own click model")
    ap.add_argument("--defaults", choices=("kiln", "own"), default="kiln",
                    help="kiln: both sides start from kiln's weights; own: each its own init")
    ap.add_argument("--bf16", action="store_true",
                    help="also train kiln in model.dense_precision: bf16 and compare (dlrm)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    models = a.models.split(",")
    if a.bf16 and models != ["dlrm"]:
        sys.exit("--bf16 compares dlrm's dense layers: pass --models dlrm (lr and fm have none)")
    batches = [int(b) for b in a.batches.split(",")]
    skews = [(s.split(":")[0], float(s.split(":")[1])) for s in a.skews.split(",")]
    work = tempfile.mkdtemp(prefix="kiln-quality-")
    rows = []
    curves, bayes = {}, {}
    try:
        for sk, z in skews:
            train, evalf, bay = make_data(build, work, sk, z, a)
            bayes[sk] = bay
            tr, ev = read_kbin(train), read_kbin(evalf)
            print(json.dumps({"skew": sk, "zipf": z, "vocab": a.vocab, "rows": len(tr[0]),
                              "eval_rows": len(ev[0]), "eval_bayes_logloss": round(bay, 5)}),
                  flush=True)
            for m in models:
                for seed in range(42, 42 + a.seeds):
                    _, _, ck = kiln_train(build, work, m, train, None, 4096, seed, 0.0, 1,
                                          "init-%s-%s-%d" % (sk, m, seed))
                    init = Init(ck)
                    for b in batches:
                        res, kc, _ = kiln_train(build, work, m, train, evalf, b, seed, LR,
                                                a.epochs, "run-%s-%s-%d-%d" % (sk, m, b, seed))
                        tll, tauc, tc = torch_train(m, init, tr, ev, b, a.epochs, a.threads,
                                                    a.defaults == "own", seed)
                        r = {"skew": sk, "model": m, "batch": b, "seed": seed,
                             "kiln_logloss": round(res["eval_logloss"], 6),
                             "torch_logloss": round(tll, 6),
                             "kiln_auc": round(res["eval_auc"], 6), "torch_auc": round(tauc, 6),
                             "steps": len(kc)}
                        if a.bf16:
                            rb, _, _ = kiln_train(build, work, m, train, evalf, b, seed, LR,
                                                  a.epochs, "bf16-%s-%s-%d-%d" % (sk, m, b, seed),
                                                  "bf16")
                            assert rb.get("dense_precision") == "bf16", rb
                            r["kiln_bf16_logloss"] = round(rb["eval_logloss"], 6)
                            r["kiln_bf16_auc"] = round(rb["eval_auc"], 6)
                            r["kiln_samples_per_s"] = round(res["samples_per_s"])
                            r["kiln_bf16_samples_per_s"] = round(rb["samples_per_s"])
                        rows.append(r)
                        print(json.dumps(r), flush=True)
                        if b == a.curve_batch and seed == 42:
                            curves[(sk, m)] = (kc, tc)
        print()
        print("%-8s %-5s %6s %9s %9s %8s %8s %8s %7s %7s %8s %s"
              % ("skew", "model", "batch", "kiln ll", "torch ll", "diff", "paired", "worst",
                 "k auc", "t auc", "bayes", "kiln <= torch + 0.002"))
        nmet = ncell = 0
        for sk, _ in skews:
            for m in models:
                for b in batches:
                    c = [r for r in rows if r["skew"] == sk and r["model"] == m and r["batch"] == b]
                    med = lambda k: statistics.median(r[k] for r in c)
                    paired = [r["kiln_logloss"] - r["torch_logloss"] for r in c]
                    diff = med("kiln_logloss") - med("torch_logloss")
                    ok = diff <= GOAL
                    nmet += ok
                    ncell += 1
                    print("%-8s %-5s %6d %9.5f %9.5f %+8.5f %+8.5f %+8.5f %7.4f %7.4f %8.5f %s"
                          % (sk, m, b, med("kiln_logloss"), med("torch_logloss"), diff,
                             statistics.median(paired), max(paired, key=abs), med("kiln_auc"),
                             med("torch_auc"), bayes[sk], "met" if ok else "NOT met"))
        print("\n%d of %d cells met (medians over %d seeds)" % (nmet, ncell, a.seeds))
        if a.defaults == "own":
            own_table(rows, skews, models, batches, a.seeds)
        if a.bf16:
            bf16_table(rows, skews, models, batches, a.seeds)
        if a.svg and curves:
            write_svg(a.svg, curves, a.curve_batch, bayes)
    finally:
        cleanup(work, a.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
