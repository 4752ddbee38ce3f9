#!/usr/bin/python3
"""bench/freshness.py - how fresh serving stays, measured from outside.

Two measurements with the real programs (kilnd, kiln-train under mpirun,
two kiln-serve endpoints on loopback), each with its bound measured in the
same run:

1. Batch freshness: a cron job (`@every 3s`, data.incremental,
   export.on_success: incremental, DLRM on 2 ranks) and partitions of
   --rows rows landing one after another. For each partition: the time from
   its file landing (rename into place) to its delta being live on B,
   split into the wait for the cron fire, launch + training + eval, and the
   export + push. Bound: the same kiln-train run alone (mpirun, the same
   spec and partition, no kilnd, no push), timed the same way.

2. Online export-to-live: an online job (export.every 1s) pushing to A and B
   while partitions keep landing. For each export: from the moment the
   trainer publishes it (export.last appears or changes) to the moment both
   endpoints serve it. Peer: the same delta (the last export on the one
   before) pushed by hand with `kiln push` to a third endpoint C (auto:
   false, so kilnd leaves it alone), timed from the command's start to its
   exit; the ratio says what finding the export and queueing its pushes add.

3. Click to live (issue 28): one kiln-serve B with --impressions-dir,
   --join-dir and --feedback-window (--window, 5 s), and a cron job
   (`@every 3s`, data.incremental, ready: marker) that trains on the
   partitions kiln-serve joins and pushes to B. Each cycle sends
   --click-rows predicts with request keys to B (features of a datagen day,
   500 rows a request) and posts the clicks (the rows whose datagen label is
   1) as feedback. For each cycle: from the feedback POST answered to B
   serving a checkpoint trained on that partition, split into the window
   (until the joined partition appears), the wait for the cron fire,
   launch + train + eval, and the export + push. Goal: under the window
   + 10 s.

Medians of --runs measurements; the observer polls every 10 ms. Run:

    /usr/bin/python3 bench/freshness.py --build build --runs 5 --rows 100000
    /usr/bin/python3 bench/freshness.py --build build --runs 3 --what click
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


# Zipf-skewed ids, as real traffic (a few ids in a large share of rows).
SKEW = ["--zipf", "1.15", "--vocab", "200000", "--empty", "0.04"]


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True,
                          **kw)


class Bench:
    def __init__(self, build, home, rows):
        self.build, self.home, self.rows = build, home, rows
        self.kiln = os.path.join(build, "tools", "kiln")
        self.procs = []
        self.env = dict(os.environ, KILN_HOME=home, KILN_SERVE_TOKEN="bench-token",
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1")

    def start(self, args, log):
        p = subprocess.Popen([str(a) for a in args], stdout=open(log, "a"),
                             stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(p)
        return p

    def serve(self, label, extra=()):
        d = os.path.join(self.home, "serve-" + label)
        port_file = d + ".port"
        self.start([os.path.join(self.build, "serving", "kiln-serve"), "--listen", "127.0.0.1:0",
                    "--state-dir", d, "--token-env", "KILN_SERVE_TOKEN", "--port-file",
                    port_file, "--max-body", str(64 << 20), *extra], d + ".log")
        for _ in range(500):
            if os.path.exists(port_file) and open(port_file).read().strip():
                return int(open(port_file).read())
            time.sleep(0.01)
        sys.exit(f"kiln-serve {label} did not start")

    def kilnd(self):
        self.start([os.path.join(self.build, "scheduler", "kilnd"), "--listen", "",
                    "--stats-every", "0", "--poll", "200ms"],
                   os.path.join(self.home, "kilnd.log"))

    def kiln_json(self, *args):
        out = subprocess.run([self.kiln, "--json", *args], capture_output=True, text=True,
                             env=self.env).stdout
        return json.loads(out) if out.strip() else None

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def holds(port, label):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/ctr/versions/{label}",
                                    timeout=2) as r:
            return json.load(r).get("checkpoint", "")
    except Exception:
        return ""


SPEC = """name: {name}
{schedule}resources: {{ranks: 2, timeout: 10m}}
data:
  train: "{data}/day=*/part-*.tsv"
  eval: "{data}/eval.tsv"
  incremental: true
model:
  type: dlrm
  embedding: {{dim: 16, capacity: 4000000}}
  bottom_mlp: [64, 16]
  top_mlp: [128, 64, 1]
train: {{batch_size: 2048, init_from: latest{mode}}}
checkpoint: {{dir: ckpt-{name}, full_every: 1000, keep: 5}}
export: {{on_success: incremental{every}}}
push:
  token_env: KILN_SERVE_TOKEN
  endpoints:
{endpoints}"""


def land(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(src, dst + ".landing")
    t = time.time()
    os.rename(dst + ".landing", dst)
    return t


def batch(b, parts, port_b, data, runs):
    """Each partition landing to its delta live on B, with its parts."""
    spec = os.path.join(b.home, "batch.yaml")
    open(spec, "w").write(SPEC.format(
        name="fresh", schedule='schedule: "@every 3s"\n', data=data, mode="", every="",
        endpoints=f'    - {{url: "http://127.0.0.1:{port_b}", model: ctr, label: B}}\n'))
    sh(b.kiln, "submit", spec, env=b.env)
    rows = []
    was = ""
    for i in range(runs + 1):
        before = max([r["id"] for r in b.kiln_json("runs", "--job", "fresh") or []], default=0)
        t_land = land(parts[i], os.path.join(data, f"day={i}", "part-0.tsv"))
        t_q = t_e = None
        while time.time() - t_land < 600:
            now = time.time()
            rs = [r for r in b.kiln_json("runs", "--job", "fresh", "--limit", "3") or []
                  if r["id"] > before and r["state"] != "skipped"]
            if rs and t_q is None:
                t_q = now
            if rs and rs[0]["state"] == "succeeded" and t_e is None:
                t_e = now
            h = holds(port_b, "B")
            if h and h != was:
                t_l = time.time()
                t_q, t_e = t_q or t_l, t_e or t_l
                was = h
                break
            time.sleep(0.01)
        else:
            sys.exit(f"partition {i} did not reach B in 10 minutes; see {b.home}/kilnd.log")
        if i > 0:  # the first is the full push of a fresh model: not a delta
            rows.append((t_l - t_land, t_q - t_land, t_e - t_q, t_l - t_e))
            print(f"  partition {i}: live on B {t_l - t_land:.2f} s after landing "
                  f"(cron {t_q - t_land:.2f}, run {t_e - t_q:.2f}, push {t_l - t_e:.2f})",
                  flush=True)
    return rows


def alone(b, part, data):
    """The bound: kiln-train on one partition by itself, no kilnd, no push."""
    spec = os.path.join(b.home, "alone.yaml")
    open(spec, "w").write(SPEC.format(name="alone", schedule="", data=data, mode="", every="",
                                      endpoints="    []\n").replace("  endpoints:\n    []\n",
                                                                     "  endpoints: []\n"))
    times = []
    for i in range(3):
        t0 = time.time()
        sh("mpirun", "-np", 2, "--bind-to", "none", "--oversubscribe",
           os.path.join(b.build, "trainer", "kiln-train"), "--spec", spec, "--run-dir",
           os.path.join(b.home, f"alone-{i}"), "--data", part, "--quiet", env=b.env)
        times.append(time.time() - t0)
    return statistics.median(times)


def online(b, parts, ports, port_c, data, runs):
    """From an export published to both endpoints serving it; and the peer."""
    spec = os.path.join(b.home, "online.yaml")
    eps = "".join(f'    - {{url: "http://127.0.0.1:{p}", model: ctr, label: {lab}}}\n'
                  for lab, p in ports.items())
    eps += f'    - {{url: "http://127.0.0.1:{port_c}", model: ctr, label: C, auto: false}}\n'
    open(spec, "w").write(SPEC.format(name="online", schedule="", data=data,
                                      mode=", mode: online", every=", every: 1s",
                                      endpoints=eps))
    sh(b.kiln, "submit", spec, env=b.env)
    run = None
    for _ in range(3000):
        rs = b.kiln_json("runs", "--job", "online") or []
        if rs and rs[0]["state"] == "running" and rs[0].get("run_dir"):
            run = rs[0]
            break
        time.sleep(0.01)
    if run is None:
        sys.exit("the online run did not start")
    last = os.path.join(run["run_dir"], "export.last")
    lat, seen, k, t_next, uids = [], "", 0, 0.0, []
    t0 = time.time()
    while len(lat) < runs and time.time() - t0 < 600:
        if time.time() >= t_next:  # keep data landing so that exports have news
            land(parts[k % len(parts)], os.path.join(data, f"day={k}", "part-0.tsv"))
            k += 1
            t_next = time.time() + 1.5
        try:
            e = json.load(open(last))
        except Exception:
            time.sleep(0.01)
            continue
        uid = e.get("checkpoint", "")
        if uid and uid != seen:
            t_exp = time.time()
            seen = uid
            while time.time() - t_exp < 60:
                if all(holds(p, lab) == uid for lab, p in ports.items()):
                    break
                # a newer export may supersede this one before it goes out
                try:
                    if json.load(open(last)).get("checkpoint", "") != uid:
                        break
                except Exception:
                    pass
                time.sleep(0.01)
            if all(holds(p, lab) == uid for lab, p in ports.items()):
                lat.append(time.time() - t_exp)
                uids.append(uid)
                print(f"  export {uid}: live on A and B {lat[-1]:.3f} s after it was written",
                      flush=True)
        time.sleep(0.01)
    sh(b.kiln, "cancel", run["id"], env=b.env)
    # The peer: the last export as a delta on the one before, by hand, to C.
    hand = None
    if len(uids) >= 2:
        sh(b.kiln, "push", "--job", "online", "--label", "C", "--checkpoint", uids[-2],
           env=b.env)
        t = time.time()
        sh(b.kiln, "push", "--job", "online", "--label", "C", "--checkpoint", uids[-1],
           env=b.env)
        hand = time.time() - t
        if holds(port_c, "C") != uids[-1]:
            sys.exit("the hand push did not reach C")
    return lat, hand


def post_json(port, path, body, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def metric(port, prefix):
    """The value of kiln-serve's /metrics sample that starts with prefix (-1: none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(prefix):
                return float(line[len(prefix):])
    return -1


def runs_of(b, job):
    return b.kiln_json("runs", "--job", job, "--limit", "3") or []


def click(b, parts, data, window, nrows, runs):
    """From clicks posted to kiln-serve to B serving a model trained on them."""
    joined = os.path.join(b.home, "joined")
    port = b.serve("L", ["--impressions-dir", os.path.join(b.home, "impressions"), "--join-dir",
                         joined, "--feedback-window", f"{window}s"])
    glob = os.path.join(joined, "ctr", "part=*", "part-*.tsv")
    spec = os.path.join(b.home, "loop.yaml")
    open(spec, "w").write(SPEC.format(
        name="loop", schedule='schedule: "@every 3s"\n', data=data, mode="", every="",
        endpoints=f'    - {{url: "http://127.0.0.1:{port}", model: ctr, label: B}}\n').replace(
        f'train: "{data}/day=*/part-*.tsv"', f'train: "{glob}"\n  ready: marker'))
    # A first model: a datagen day landed as a partition, trained and pushed to B.
    seed = os.path.join(joined, "ctr", "part=0000000000000")
    os.makedirs(seed + ".tmp")
    shutil.copy(parts[0], os.path.join(seed + ".tmp", "part-0.tsv"))
    open(os.path.join(seed + ".tmp", "_SUCCESS"), "w").close()
    os.rename(seed + ".tmp", seed)
    sh(b.kiln, "submit", spec, env=b.env)
    for _ in range(60000):
        if holds(port, "B"):
            break
        time.sleep(0.01)
    else:
        sys.exit(f"the first model did not reach B; see {b.home}/kilnd.log")
    rows = []
    for i in range(1, runs + 1):
        lines = [l.rstrip("\n").split("\t", 1) for l in open(parts[i])][:nrows]
        clicks = []
        for q in range(0, len(lines), 500):
            key = f"c{i}-{q}"
            post_json(port, "/v1/models/ctr/predict?label=B",
                      {"request_key": key, "rows": [f for _, f in lines[q:q + 500]]})
            clicks += [{"request_key": key, "row": r, "label": 1}
                       for r, (y, _) in enumerate(lines[q:q + 500]) if y == "1"]
        joined_before = metric(port, 'kiln_serve_join_rows_total{model="ctr"} ')
        ans = post_json(port, "/v1/models/ctr/feedback", clicks, "bench-token")
        t_click = time.time()
        if ans.get("accepted") != len(clicks):
            sys.exit(f"feedback not all accepted: {ans}")
        # The cycle's rows may span several segments (partitions): the clicks are
        # trained once the last one is joined and a run that started after it
        # ends; they are live when B holds that run's checkpoint.
        t_join = t_q = t_e = None
        run = None
        while time.time() - t_click < 600:
            now = time.time()
            if t_join is None:
                if metric(port, 'kiln_serve_join_rows_total{model="ctr"} ') >= \
                        joined_before + len(lines):
                    t_join = now
                    before = max([r["id"] for r in runs_of(b, "loop")], default=0)
            else:
                rs = [r for r in runs_of(b, "loop") if r["id"] > before and r["state"] != "skipped"]
                if rs and t_q is None:
                    t_q, run = now, rs[-1]["id"]
                r = [x for x in rs if x["id"] == run]
                if r and r[0]["state"] == "succeeded" and t_e is None:
                    t_e = now
                    uid = r[0]["pushes"][0]["checkpoint"] if r[0].get("pushes") else None
                if t_e is not None and (uid is None or holds(port, "B") == uid):
                    t_l = time.time()
                    break
            time.sleep(0.01)
        else:
            sys.exit(f"cycle {i}: the clicks did not reach B in 10 minutes; see {b.home}")
        rows.append((t_l - t_click, t_join - t_click, t_q - t_join, t_e - t_q, t_l - t_e))
        print(f"  cycle {i}: {len(lines)} rows, {len(clicks)} clicks: live on B "
              f"{t_l - t_click:.2f} s after the clicks (window {t_join - t_click:.2f}, "
              f"cron {t_q - t_join:.2f}, run {t_e - t_q:.2f}, push {t_l - t_e:.2f})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--keep", action="store_true", help="keep the temporary home")
    ap.add_argument("--what", default="batch,online,click",
                    help="which measurements (comma-separated: batch, online, click)")
    ap.add_argument("--window", type=int, default=5, help="click: --feedback-window, seconds")
    ap.add_argument("--click-rows", type=int, default=20000, help="click: rows per cycle")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    home = tempfile.mkdtemp(prefix="kiln-fresh-")
    b = Bench(build, home, a.rows)
    try:
        data, odata = os.path.join(home, "data"), os.path.join(home, "odata")
        os.makedirs(data)
        os.makedirs(odata)
        parts = []
        for i in range(a.runs + 1):
            p = os.path.join(home, f"part{i}.tsv")
            sh(b.kiln, "datagen", "--rows", a.rows, "--day", i, "--seed", 7, *SKEW, "--out", p)
            parts.append(p)
        for d in (data, odata):
            sh(b.kiln, "datagen", "--rows", 20000, "--day", a.runs + 1, "--seed", 7, *SKEW, "--out",
               os.path.join(d, "eval.tsv"))
        what = a.what.split(",")
        ports = {"A": b.serve("A"), "B": b.serve("B")}
        port_c = b.serve("C")
        b.kilnd()
        res = {"rows": a.rows}
        if "batch" in what:
            print(f"batch: {a.rows}-row partitions, cron @every 3s, DLRM on 2 ranks -> B",
                  flush=True)
            rows = batch(b, parts, ports["B"], data, a.runs)
            bound = alone(b, parts[1], data)
            med = [statistics.median(c) for c in zip(*rows)]
            print(f"\nbatch freshness, median of {len(rows)}: {med[0]:.2f} s from landing to "
                  f"live on B (goal < 10 s)")
            print(f"  wait for the cron fire {med[1]:.2f} s, launch + train + eval {med[2]:.2f} s, "
                  f"export + push {med[3]:.2f} s")
            print(f"  bound: kiln-train alone on the same partition {bound:.2f} s; "
                  f"freshness / bound = {med[0] / bound:.2f}x")
            res.update({"batch_freshness_s": round(med[0], 3),
                        "batch_parts_s": {"cron": round(med[1], 3), "run": round(med[2], 3),
                                          "push": round(med[3], 3)},
                        "train_alone_s": round(bound, 3), "ratio": round(med[0] / bound, 3)})
        if "online" in what:
            print("\nonline: export every 1 s -> A and B while partitions land", flush=True)
            lat, hand = online(b, parts, ports, port_c, odata, a.runs)
            if lat:
                print(f"\nonline export-to-live, median of {len(lat)}: "
                      f"{statistics.median(lat):.3f} s (goal < 1 s on every endpoint)")
                res["online_export_to_live_s"] = round(statistics.median(lat), 3)
            if lat and hand:
                print(f"  peer: the last export's delta pushed by hand (kiln push, to C) "
                      f"{hand:.3f} s; export-to-live / hand push = "
                      f"{statistics.median(lat) / hand:.2f}x")
                res["online_hand_push_s"] = round(hand, 3)
                res["online_ratio"] = round(statistics.median(lat) / hand, 3)
        if "click" in what:
            print(f"\nclick to live: kiln-serve joins with a {a.window} s window, cron @every 3s "
                  f"trains on the joined partitions -> B", flush=True)
            crow = click(b, parts, data, a.window, a.click_rows, a.runs)
            med = [statistics.median(c) for c in zip(*crow)]
            print(f"\nclick to live on B, median of {len(crow)}: {med[0]:.2f} s (goal < window "
                  f"+ 10 s = {a.window + 10} s)")
            print(f"  window (to the joined partition) {med[1]:.2f} s, cron wait {med[2]:.2f} s, "
                  f"launch + train + eval {med[3]:.2f} s, export + push {med[4]:.2f} s")
            res.update({"click_to_live_s": round(med[0], 3), "window_s": a.window,
                        "click_parts_s": {"window": round(med[1], 3), "cron": round(med[2], 3),
                                          "run": round(med[3], 3), "push": round(med[4], 3)}})
        print(json.dumps(res))
    finally:
        b.stop()
        if not a.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"kept {home}", file=sys.stderr)


if __name__ == "__main__":
    main()
