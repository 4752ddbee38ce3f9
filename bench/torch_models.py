#!/usr/bin/python3
"""bench/torch_models.py - Kiln's three models (lr, fm, dlrm) written with PyTorch,
the peer that bench/trainer_vs_torch.py runs kiln-train against.

Run it with Debian's interpreter (/usr/bin/python3, python3-torch):

    /usr/bin/python3 bench/torch_models.py --train day0.tsv --eval eval.tsv \
        --models lr,fm,dlrm --repeat 3 --threads 2

It reads the same Criteo TSV files kiln-train reads, with the same
preprocessing (docs/data-formats.md): an integer field becomes log1p(x) for
x > 0 and 0 when it is empty or <= 0; a categorical field is a key of its
slot (here mapped to a contiguous id with a dict, one id space per slot) and
an empty field is an empty bag. An eval value never seen in training reads as
zeros, as kiln-train's eval lookups of a missing key do. All of that happens
before the timed loop, and the batches (4096 consecutive rows, the order
kiln-train's reader deals them on one rank) are built as tensors up front,
so the timed loop is forward + backward + optimizer step alone.

The models are the ones docs/models.md describes, with kiln-train's defaults:
  lr:   logit = sum_s e_s + w.x + b               (e_s: the slot's weight, dim 1)
  fm:   + 1/2 sum_f [(sum_s v_sf)^2 - sum_s v_sf^2], tables of width 1 + k
        (element 0 the linear weight), k = 16; with --fm-dense-factors (kiln's
        model.fm_dense_factors) u = Vx x joins the sums as one more slot
  dlrm: bottom MLP 13 -> 64 -> 16 (ReLU), dot products of every pair among
        [bot, e_0 .. e_25], top MLP (16 + 351) -> 256 -> 128 -> 1
One nn.EmbeddingBag (mode sum, sparse gradients) holds every slot's table
with per-slot id offsets: one bag per (row, slot). Embeddings start U(-0.01,
0.01); dlrm's layers nn.Linear's own init, U(+-1/sqrt(fan_in)) (lr/fm w and b zero). One
torch.optim.Adagrad (lr 0.05, eps 1e-10, no initial accumulator) steps both
the sparse and the dense parameters; the loss is the batch-mean logistic loss.

Prints one JSON line per (model, run): samples_per_s, train_seconds,
eval_logloss, eval_auc.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

NDENSE, NSLOTS = 13, 26


def read_tsv(path, vocab, grow):
    """Returns labels (n,), dense (n, 13) and per-slot id lists.
    vocab[s] maps a slot's raw value to its id (1-based; 0 = unseen).
    grow: add new values (training) or map them to 0 (eval)."""
    labels, dense, ids = [], [], [[] for _ in range(NSLOTS)]
    with open(path, "r") as f:
        for line in f:
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 1 + NDENSE + NSLOTS:
                continue
            labels.append(float(parts[0]))
            row = []
            for x in parts[1:1 + NDENSE]:
                v = int(x) if x else 0
                row.append(math.log1p(v) if v > 0 else 0.0)
            dense.append(row)
            for s in range(NSLOTS):
                x = parts[1 + NDENSE + s]
                if not x:
                    ids[s].append(-1)  # empty bag
                    continue
                d = vocab[s]
                i = d.get(x)
                if i is None:
                    if grow:
                        i = len(d) + 1
                        d[x] = i
                    else:
                        i = -1  # unseen at eval: reads as zeros
                ids[s].append(i)
    return (np.asarray(labels, np.float32), np.asarray(dense, np.float32),
            np.asarray(ids, np.int64).T.copy())  # (n, S)


def make_batches(labels, dense, ids, base, batch):
    """CSR batches for one EmbeddingBag: bag (row, slot) -> row*S + slot.
    ids (n, S) with -1 for an empty bag; base[s] is slot s's first id."""
    out = []
    n = len(labels)
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        b = ids[lo:hi]                        # (m, S)
        present = b >= 0
        flat = (b + base[None, :])[present]   # row-major: bags in (row, slot) order
        counts = present.reshape(-1).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out.append((torch.from_numpy(labels[lo:hi]), torch.from_numpy(dense[lo:hi]),
                    torch.from_numpy(flat), torch.from_numpy(offsets)))
    return out


class Model(nn.Module):
    def __init__(self, kind, nrows, dim, seed, fm_dense_factors=False):
        super().__init__()
        torch.manual_seed(seed)
        self.kind = kind
        self.fm_dense = kind == "fm" and fm_dense_factors
        self.d = {"lr": 1, "fm": dim + 1, "dlrm": dim}[kind]
        self.emb = nn.EmbeddingBag(nrows, self.d, mode="sum", sparse=True)
        nn.init.uniform_(self.emb.weight, -0.01, 0.01)
        if kind in ("lr", "fm"):
            self.w = nn.Parameter(torch.zeros(NDENSE))
            self.b = nn.Parameter(torch.zeros(()))
        if self.fm_dense:
            self.vx = nn.Parameter(torch.empty(dim, NDENSE))
            nn.init.xavier_uniform_(self.vx)
        if kind == "dlrm":
            def mlp(widths, last_relu):
                layers = []
                for i in range(len(widths) - 1):
                    # nn.Linear's own init, which is kiln-train's dlrm default too
                    layers.append(nn.Linear(widths[i], widths[i + 1]))
                    if last_relu or i + 2 < len(widths):
                        layers.append(nn.ReLU())
                return nn.Sequential(*layers)
            self.bottom = mlp([NDENSE, 64, dim], True)
            P = NSLOTS * (NSLOTS + 1) // 2
            self.top = mlp([dim + P, 256, 128, 1], False)
            iu = torch.triu_indices(NSLOTS + 1, NSLOTS + 1, offset=1)
            self.register_buffer("pair_flat", iu[0] * (NSLOTS + 1) + iu[1])

    def forward(self, x, flat, offsets):
        n = x.shape[0]
        e = self.emb(flat, offsets).view(n, NSLOTS, self.d)
        if self.kind == "lr":
            return e.sum(dim=(1, 2)) + x @ self.w + self.b
        if self.kind == "fm":
            lin = e[:, :, 0].sum(1) + x @ self.w + self.b
            v = e[:, :, 1:]                       # (n, S, k)
            s = v.sum(1)
            sq = (v * v).sum((1, 2))
            if self.fm_dense:
                u = x @ self.vx.t()               # (n, k)
                s = s + u
                sq = sq + (u * u).sum(1)
            return lin + 0.5 * ((s * s).sum(1) - sq)
        bot = self.bottom(x)                      # (n, d)
        t = torch.cat([bot.unsqueeze(1), e], 1)   # (n, S+1, d)
        z = torch.bmm(t, t.transpose(1, 2)).view(n, -1)
        r = torch.cat([bot, z[:, self.pair_flat]], 1)
        return self.top(r).view(n)


def auc(p, y):
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], y[order]
    # average ranks for ties
    ranks = np.empty(len(p))
    i = 0
    while i < len(p):
        j = i
        while j + 1 < len(p) and ps[j + 1] == ps[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    npos = ys.sum()
    nneg = len(ys) - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    return float((ranks[ys == 1].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def run_once(kind, nrows, dim, train, evalb, seed, fm_dense_factors=False):
    model = Model(kind, nrows, dim, seed, fm_dense_factors)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05, eps=1e-10)
    t0 = time.perf_counter()
    for y, x, flat, off in train:
        opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(x, flat, off), y)
        loss.backward()
        opt.step()
    secs = time.perf_counter() - t0
    with torch.no_grad():
        z = torch.cat([model(x, flat, off) for _, x, flat, off in evalb])
        y = torch.cat([b[0] for b in evalb])
        ll = F.binary_cross_entropy_with_logits(z, y).item()
        a = auc(torch.sigmoid(z).numpy(), y.numpy())
    return secs, ll, a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--models", default="lr,fm,dlrm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--fm-dense-factors", action="store_true",
                    help="fm: dense features join the interaction (kiln's model.fm_dense_factors)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)

    t0 = time.perf_counter()
    vocab = [dict() for _ in range(NSLOTS)]
    ytr, xtr, itr = read_tsv(a.train, vocab, True)
    yev, xev, iev = read_tsv(a.eval, vocab, False)
    sizes = np.array([len(v) + 1 for v in vocab], np.int64)
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    nrows = int(sizes.sum())
    train = make_batches(ytr, xtr, itr, base, a.batch)
    evalb = make_batches(yev, xev, iev, base, a.batch)
    print(json.dumps({"prep_seconds": round(time.perf_counter() - t0, 2), "rows": len(ytr),
                      "eval_rows": len(yev), "ids": nrows, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}), flush=True)
    for kind in a.models.split(","):
        for r in range(a.repeat):
            secs, ll, au = run_once(kind, nrows, a.dim, train, evalb, a.seed + r,
                                    a.fm_dense_factors)
            print(json.dumps({"side": "torch", "model": kind, "run": r,
                              "train_seconds": round(secs, 4),
                              "samples_per_s": round(len(ytr) / secs, 1),
                              "eval_logloss": round(ll, 6), "eval_auc": round(au, 6)}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
