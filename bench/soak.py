#!/usr/bin/python3
"""bench/soak.py - load held for a long time, and measured (issue 27, item 9).

The real programs on loopback, in a fresh KILN_HOME under /tmp: kilnd (web
front and stats thread on), two kiln-serve endpoints A and B, and one cron
job (`@every 1s`, data.incremental with `settle: 0s`, an lr model on 1 rank,
export.on_success: incremental) pushing every run's delta to both. While it
runs:

- a lander renames a new small partition into place about every second (and,
  with --data-keep, deletes the partitions older than that: data rotated
  away, as a production feed's retention does);
- a predictor thread sends predicts at a steady rate (--rate a second, A and
  B in turn, one keep-alive connection each) and times every answer;
- every --every seconds a sample: VmRSS, VmHWM, open fds and threads of
  kilnd and both kiln-serve (/proc), the size of kiln.db and kiln.db-wal,
  the runs so far, the predict latency p50/p99 of the window.

With --keep-runs DURATION kilnd runs its retention (compaction of old runs,
then removal of what nothing needs). Retention deletes runs and pushes, so
every few seconds the soak reads the runs, the inputs of succeeded runs and
the pushes into its own record; the checks below read that record.

It stops after --runs succeeded runs (or at --deadline, or on SIGINT), lets
the last partitions and pushes settle, then checks from the database and
from kiln-serve:

- runs: how many, by state; every landed partition is an input of exactly
  one succeeded run (none lost, none trained twice);
- pushes: every succeeded run has exactly one push to each endpoint; a push
  ends succeeded or superseded (a newer push to the endpoint carried the
  model), never failed, pending or held; no checkpoint reached an endpoint
  twice; each kiln-serve's `pushes_applied` equals the pushes recorded as
  succeeded to it, `pushes_rejected` is 0, and both hold the last run's
  checkpoint.

The table compares the first fifth of the samples after warm-up (--warmup
runs) with the last fifth; each criterion's tolerance is printed beside its
verdict. With retention the database must stay flat (its highest size in the
last fifth at most 10 % + 64 KiB over the first fifth's); without, grow by
no more per run than at first. Run:

    nice -n 10 /usr/bin/python3 bench/soak.py --build build --runs 1000 \
        --keep-runs 60s --data-keep 120 --warmup 200
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TOKEN = "soak-token"
PORTS = {"kilnd": 0, "A": 1, "B": 2}   # offsets from --port

# Tolerances of the verdicts (last sample against the first after warm-up).
RSS_TOL = (1.10, 4 << 20)    # RSS and peak RSS: at most 10 % + 4 MiB more
FD_TOL = 2                   # open fds: at most 2 more
DB_TOL = 1.5                 # database growth per run: at most 1.5x the first window's
DB_FLAT = (1.10, 64 << 10)   # with retention: at most 10 % + 64 KiB over the first fifth
WAL_MAX = 16 << 20           # the WAL never past 16 MiB (it is checkpointed)
P99_TOL = (1.5, 0.010)       # predict p99: at most 1.5x + 10 ms

SPEC = """name: soak
schedule: "@every 1s"
resources: {{ranks: 1, threads: 1, timeout: 2m}}
model: {{type: lr, embedding: {{dim: 4, capacity: 200000}}}}
data: {{train: "{data}/p-*.tsv", eval: "{home}/eval.tsv", incremental: true, settle: 0s}}
train: {{batch_size: 128, log_every: 100, init_from: latest}}
checkpoint: {{dir: ckpt-soak, keep: 5}}
export: {{on_success: incremental}}
push:
  token_env: KILN_SERVE_TOKEN
  endpoints:
    - {{url: "http://127.0.0.1:{a}", model: ctr, label: A}}
    - {{url: "http://127.0.0.1:{b}", model: ctr, label: B}}
"""


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def proc_figures(pid):
    """VmRSS, VmHWM (bytes), open fds and threads of pid."""
    f = {}
    with open(f"/proc/{pid}/status") as s:
        for line in s:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                f[k] = int(v.split()[0]) * 1024
            elif k == "Threads":
                f[k] = int(v)
    f["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as s:  # utime + stime, after the command's ")"
        st = s.read().rsplit(")", 1)[1].split()
    f["cpu"] = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    return f


class Soak:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        os.makedirs(a.tmp, exist_ok=True)
        self.home = tempfile.mkdtemp(prefix="soak-", dir=a.tmp)
        self.data = os.path.join(self.home, "data")
        os.makedirs(self.data)
        self.db = os.path.join(self.home, "kiln.db")
        self.kiln = os.path.join(self.build, "tools", "kiln")
        self.env = dict(os.environ, KILN_HOME=self.home, KILN_SERVE_TOKEN=TOKEN,
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1")
        self.procs = {}
        self.stop = threading.Event()
        self.landed = []          # (path, time)
        self.rotated = 0          # partitions deleted by --data-keep
        # What the database said, kept here since retention deletes it.
        self.seen_runs = {}       # run id -> state
        self.seen_inputs = set()  # (run id, path) of succeeded runs
        self.seen_pushes = {}     # push id -> (run id, endpoint id, state, checkpoint id)
        self.lat = []             # (time, label, seconds, ok)
        self.lat_lock = threading.Lock()

    # --- the programs -----------------------------------------------------
    def start(self, name, args):
        log = open(os.path.join(self.home, name + ".log"), "a")
        self.procs[name] = subprocess.Popen([str(x) for x in args], stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env)

    def wait_port(self, port):
        for _ in range(1000):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return
            except Exception:
                time.sleep(0.02)
        sys.exit(f"nothing listens on {port}; see {self.home}/*.log")

    def up(self):
        # Another program on one of the ports would be measured (and pushed to) instead.
        for port in PORTS.values():
            with socket.socket() as c:
                if c.connect_ex(("127.0.0.1", port)) == 0:
                    sys.exit(f"port {port} is in use: pick others with --port")
        for label in ("A", "B"):
            self.start("serve-" + label, [
                os.path.join(self.build, "serving", "kiln-serve"), "--listen",
                f"127.0.0.1:{PORTS[label]}", "--state-dir",
                os.path.join(self.home, "serve-" + label), "--token-env", "KILN_SERVE_TOKEN"])
            self.wait_port(PORTS[label])
        keep = ["--keep-runs", self.a.keep_runs] if self.a.keep_runs else []
        self.start("kilnd", [os.path.join(self.build, "scheduler", "kilnd"), "--listen",
                             f"127.0.0.1:{PORTS['kilnd']}", "--poll", "200ms"] + keep)
        self.wait_port(PORTS["kilnd"])

    def down(self):
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def sql(self, q, *args):
        c = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            return c.execute(q, args).fetchall()
        finally:
            c.close()

    def serve_json(self, label, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[label]}{path}", timeout=5) as r:
            return json.load(r)

    # --- the load -----------------------------------------------------------
    def lander(self, parts):
        k = 0
        t_next = time.time()
        while not self.stop.is_set():
            dst = os.path.join(self.data, f"p-{k:06d}.tsv")
            shutil.copy(parts[k % len(parts)], dst + ".landing")
            os.rename(dst + ".landing", dst)
            self.landed.append((dst, time.time()))
            k += 1
            if self.a.data_keep > 0:  # rotate: the partitions older than --data-keep go
                while self.rotated < len(self.landed) and \
                        self.landed[self.rotated][1] < time.time() - self.a.data_keep:
                    try:
                        os.unlink(self.landed[self.rotated][0])
                    except OSError:
                        pass
                    self.rotated += 1
            t_next += self.a.land_every
            self.stop.wait(max(0.0, t_next - time.time()))

    def predictor(self, body):
        conns = {}
        period = 1.0 / self.a.rate
        t_next = time.time()
        i = 0
        while not self.stop.is_set():
            label = "AB"[i % 2]
            i += 1
            t0 = time.time()
            ok = False
            try:
                c = conns.get(label)
                if c is None:
                    c = conns[label] = http.client.HTTPConnection("127.0.0.1", PORTS[label],
                                                                 timeout=10)
                c.request("POST", f"/v1/models/ctr/predict?label={label}", body,
                          {"Content-Type": "text/tab-separated-values"})
                r = c.getresponse()
                r.read()
                ok = r.status == 200
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    conns.pop(label, None)
            except Exception:
                conns.pop(label, None)
            t1 = time.time()
            with self.lat_lock:
                self.lat.append((t1, label, t1 - t0, ok))
            t_next += period
            self.stop.wait(max(0.0, t_next - time.time()))

    def observe(self):
        """Adds what the database holds now to the soak's own record."""
        for rid, state in self.sql("SELECT id, state FROM runs"):
            self.seen_runs[rid] = state
        self.seen_inputs.update(self.sql(
            "SELECT i.run_id, i.path FROM run_inputs i JOIN runs r ON r.id = i.run_id "
            "WHERE r.state = 'succeeded'"))
        for pid, rid, ep, state, ck in self.sql(
                "SELECT id, run_id, endpoint_id, state, checkpoint_id FROM pushes"):
            self.seen_pushes[pid] = (rid, ep, state, ck)

    # --- the samples ----------------------------------------------------------
    def sample(self, t_prev):
        s = {"t": time.time()}
        for name, p in self.procs.items():
            s[name] = proc_figures(p.pid)
        s["db_file"] = os.path.getsize(self.db)
        # The logical size (WAL included): the file itself grows only at checkpoints.
        page = self.sql("PRAGMA page_size")[0][0]
        s["db"] = self.sql("PRAGMA page_count")[0][0] * page
        s["db_free"] = self.sql("PRAGMA freelist_count")[0][0] * page
        s["rows"] = self.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM "
                             "run_inputs), (SELECT count(*) FROM checkpoints), (SELECT count(*) "
                             "FROM pushes), (SELECT count(*) FROM events)")[0]
        s["others"] = self.others()
        wal = self.db + "-wal"
        s["wal"] = os.path.getsize(wal) if os.path.exists(wal) else 0
        self.observe()
        s["runs"] = sum(1 for x in self.seen_runs.values() if x == "succeeded")
        s["landed"] = len(self.landed)
        with self.lat_lock:
            w = [x for x in self.lat if t_prev < x[0] <= s["t"]]
        good = [x[2] for x in w if x[3]]
        s["predicts"], s["predict_errors"] = len(w), len(w) - len(good)
        s["p50"], s["p99"] = pct(good, 0.50), pct(good, 0.99)
        return s

    def others(self):
        """Processes of this soak besides the three (supervisors, mpirun, trainers) at the
        moment of the sample; one that stays behind after its run would add up."""
        mine = {str(p.pid) for p in self.procs.values()}
        n = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in mine or int(pid) == os.getpid():
                continue
            try:
                if self.home.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    n += 1
            except OSError:
                pass
        return n

    def line(self, s, t0, prev):
        for n in ("kilnd", "serve-A", "serve-B"):  # share of one core since the last sample
            s[n]["cpu_share"] = ((s[n]["cpu"] - prev[n]["cpu"]) / (s["t"] - prev["t"])
                                 if prev else 0.0)
        print(f"  {s['t'] - t0:7.0f}s runs {s['runs']:5d} landed {s['landed']:5d}  " +
              "  ".join(f"{n} rss {s[n]['VmRSS'] / 2**20:.1f}M hwm {s[n]['VmHWM'] / 2**20:.1f}M "
                        f"fd {s[n]['fds']} thr {s[n]['Threads']} cpu {s[n]['cpu_share']:.0%}"
                        for n in ("kilnd", "serve-A", "serve-B")) +
              f"  others {s['others']}  db {s['db'] / 2**20:.2f}M (free {s['db_free'] / 2**20:.2f}M, "
              f"file {s['db_file'] / 2**20:.2f}M) wal {s['wal'] / 2**20:.2f}M rows "
              f"{'/'.join(str(x) for x in s['rows'])}  predict "
              f"{s['predicts']} (err {s['predict_errors']}) p50 {s['p50'] * 1e3:.1f} ms "
              f"p99 {s['p99'] * 1e3:.1f} ms", flush=True)

    # --- the end ------------------------------------------------------------
    def settle(self):
        """Lets the landed partitions be trained and the pushes go out."""
        t_end = time.time() + 300
        while time.time() < t_end:
            busy = self.sql("SELECT count(*) FROM runs WHERE state IN "
                            "('queued', 'launching', 'running')")[0][0]
            busy += self.sql("SELECT count(*) FROM pushes WHERE state IN "
                             "('pending', 'sending')")[0][0]
            self.observe()
            done = {p for _, p in self.seen_inputs}
            if busy == 0 and all(p in done for p, _ in self.landed[self.rotated:]):
                return True
            time.sleep(1)
        return False

    def check(self):
        res = {}
        self.observe()
        res["runs_by_state"] = {}
        for state in self.seen_runs.values():
            res["runs_by_state"][state] = res["runs_by_state"].get(state, 0) + 1
        res["runs_in_db"] = self.sql("SELECT count(*) FROM runs")[0][0]
        res["partitions_rotated"] = self.rotated
        res["skipped_fires"] = self.sql("SELECT skipped_fires FROM jobs WHERE name = 'soak'")[0][0]
        # Partitions: each landed file an input of exactly one succeeded run.
        n = {}
        for _, path in self.seen_inputs:
            n[path] = n.get(path, 0) + 1
        landed = [p for p, _ in self.landed]
        res["partitions_landed"] = len(landed)
        res["partitions_lost"] = sum(1 for p in landed if n.get(p, 0) == 0)
        res["partitions_twice"] = sum(1 for p in landed if n.get(p, 0) > 1)
        res["inputs_not_landed"] = sum(1 for p in n if p not in set(landed))
        # Pushes: per succeeded run and endpoint, exactly one, which went out or
        # was superseded by a newer one.
        eps = dict(self.sql("SELECT label, id FROM endpoints"))
        runs = [r for r, state in self.seen_runs.items() if state == "succeeded"]
        pushes = {}
        for run, ep, state, _ in self.seen_pushes.values():
            pushes.setdefault((run, ep), []).append(state)
        lost = dup = superseded = 0
        for run in runs:
            for label in ("A", "B"):
                st = pushes.get((run, eps.get(label)), [])
                if len(st) != 1:
                    dup += len(st) > 1
                    lost += len(st) == 0
                elif st[0] == "superseded":
                    superseded += 1
                elif st[0] != "succeeded":
                    lost += 1
        res["pushes_lost"], res["pushes_duplicated"] = lost, dup
        res["pushes_superseded"] = superseded
        res["pushes_by_state"] = {}
        held = {}
        for _, ep, state, ck in self.seen_pushes.values():
            res["pushes_by_state"][state] = res["pushes_by_state"].get(state, 0) + 1
            if state == "succeeded":
                held[(ep, ck)] = held.get((ep, ck), 0) + 1
        res["checkpoints_pushed_twice"] = sum(1 for v in held.values() if v > 1)
        last_uid = self.sql("SELECT c.uid FROM checkpoints c JOIN runs r ON r.id = c.run_id "
                            "WHERE r.state = 'succeeded' ORDER BY c.id DESC LIMIT 1")[0][0]
        for label in ("A", "B"):
            st = self.serve_json(label, "/v1/stats")
            v = self.serve_json(label, f"/v1/models/ctr/versions/{label}")
            recorded = sum(1 for _, ep, state, _ in self.seen_pushes.values()
                           if ep == eps[label] and state == "succeeded")
            res[f"serve_{label}"] = {"pushes_applied": st.get("pushes_applied"),
                                     "pushes_rejected": st.get("pushes_rejected"),
                                     "recorded_succeeded": recorded,
                                     "holds_last": v.get("checkpoint") == last_uid}
        return res


def verdicts(head, tail, lat_head, lat_tail, retention):
    """(criterion, first, last, tolerance, ok) rows: the first fifth of the samples
    after warm-up (head) against the last fifth (tail). A snapshot can catch a
    push in flight (an fd, a thread more), so counts compare each fifth's
    lowest and highest; RSS its highest; the peak its last value."""
    rows = []
    mib = 2 ** 20

    def rng(xs, n, k):
        return min(x[n][k] for x in xs), max(x[n][k] for x in xs)

    def mb(v):
        return f"{v / mib:.1f} MiB"

    for n in ("kilnd", "serve-A", "serve-B"):
        a, b = rng(head, n, "VmRSS")[1], rng(tail, n, "VmRSS")[1]
        rows.append((f"{n} RSS (highest)", mb(a), mb(b), "<= +10 % + 4 MiB",
                     b <= a * RSS_TOL[0] + RSS_TOL[1]))
        a, b = head[0][n]["VmHWM"], tail[-1][n]["VmHWM"]
        rows.append((f"{n} peak RSS (VmHWM)", mb(a), mb(b), "<= +10 % + 4 MiB",
                     b <= a * RSS_TOL[0] + RSS_TOL[1]))
        for k, what in (("fds", "open fds"), ("Threads", "threads")):
            a, b = rng(head, n, k), rng(tail, n, k)
            rows.append((f"{n} {what} (lowest-highest)", f"{a[0]}-{a[1]}", f"{b[0]}-{b[1]}",
                         f"each <= +{FD_TOL}", b[0] <= a[0] + FD_TOL and b[1] <= a[1] + FD_TOL))
    for n in ("kilnd", "serve-A", "serve-B"):
        a = sum(x[n]["cpu_share"] for x in head) / len(head)
        b = sum(x[n]["cpu_share"] for x in tail) / len(tail)
        rows.append((f"{n} CPU (share of a core)", f"{a:.1%}", f"{b:.1%}", "(shown)", True))
    a, b = max(x["others"] for x in head), max(x["others"] for x in tail)
    rows.append(("other processes of the soak (highest)", str(a), str(b), "<= 5 (one run's)",
                 b <= 5))

    def per_run(xs):
        return (xs[-1]["db"] - xs[0]["db"]) / max(1, xs[-1]["runs"] - xs[0]["runs"])

    a, b = per_run(head), per_run(tail)
    if retention:
        rows.append(("kiln.db growth per run", f"{a:.0f} B", f"{b:.0f} B", "(shown)", True))
        a, b = max(x["db"] for x in head), max(x["db"] for x in tail)
        rows.append(("kiln.db (logical, WAL included; highest)", f"{a / mib:.2f} MiB",
                     f"{b / mib:.2f} MiB", "<= +10 % + 64 KiB",
                     b <= a * DB_FLAT[0] + DB_FLAT[1]))
        a, b = max(x["rows"][0] for x in head), max(x["rows"][0] for x in tail)
        rows.append(("runs in the database (highest)", str(a), str(b), "(shown)", True))
    else:
        rows.append(("kiln.db growth per run", f"{a:.0f} B", f"{b:.0f} B", f"<= {DB_TOL}x",
                     b <= a * DB_TOL))
        rows.append(("kiln.db (logical, WAL included)", f"{head[0]['db'] / mib:.2f} MiB",
                     f"{tail[-1]['db'] / mib:.2f} MiB", "grows with the runs kept", True))
    a, b = max(x["wal"] for x in head), max(x["wal"] for x in tail)
    rows.append(("kiln.db-wal (highest)", f"{a / mib:.2f} MiB", f"{b / mib:.2f} MiB",
                 f"<= {WAL_MAX // mib} MiB", b <= WAL_MAX))
    a, b = pct(lat_head, 0.5), pct(lat_tail, 0.5)
    rows.append(("predict p50", f"{a * 1e3:.1f} ms", f"{b * 1e3:.1f} ms", "(shown)", True))
    a, b = pct(lat_head, 0.99), pct(lat_tail, 0.99)
    rows.append(("predict p99", f"{a * 1e3:.1f} ms", f"{b * 1e3:.1f} ms", "<= 1.5x + 10 ms",
                 b <= a * P99_TOL[0] + P99_TOL[1]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=1000, help="succeeded runs to reach")
    ap.add_argument("--rows", type=int, default=200, help="rows per partition")
    ap.add_argument("--rate", type=float, default=20.0, help="predicts a second (A and B)")
    ap.add_argument("--land-every", type=float, default=1.0, help="seconds between partitions")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--warmup", type=int, default=50, help="runs before the first compared sample")
    ap.add_argument("--deadline", type=float, default=0, help="stop after this many seconds")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the KILN_HOME goes")
    ap.add_argument("--port", type=int, default=19400,
                    help="kilnd's page on PORT, kiln-serve A and B on the next two")
    ap.add_argument("--samples", help="write every sample to this file (JSON lines)")
    ap.add_argument("--keep", action="store_true", help="keep the KILN_HOME")
    ap.add_argument("--keep-runs", default="",
                    help="kilnd --keep-runs DURATION (e.g. 60s): retention on; default off")
    ap.add_argument("--data-keep", type=float, default=0,
                    help="delete partitions this many seconds after they land (0: never)")
    a = ap.parse_args()
    for k in PORTS:
        PORTS[k] += a.port
    s = Soak(a)
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(1))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(1))
    ok = False
    try:
        parts = []
        for i in range(16):
            p = os.path.join(s.home, f"part{i}.tsv")
            subprocess.run([s.kiln, "datagen", "--rows", str(a.rows), "--day", str(i), "--seed",
                            "7", "--out", p], check=True, env=s.env, capture_output=True)
            parts.append(p)
        ev = os.path.join(s.home, "eval.tsv")
        subprocess.run([s.kiln, "datagen", "--rows", "500", "--day", "99", "--seed", "7",
                        "--out", ev], check=True, env=s.env, capture_output=True)
        body = "".join(open(ev).readlines()[:16]).encode()
        spec = os.path.join(s.home, "soak.yaml")
        open(spec, "w").write(SPEC.format(data=s.data, home=s.home, a=PORTS["A"], b=PORTS["B"]))
        s.up()
        subprocess.run([s.kiln, "submit", spec], check=True, env=s.env, capture_output=True)
        threads = [threading.Thread(target=s.lander, args=(parts,), daemon=True),
                   threading.Thread(target=s.predictor, args=(body,), daemon=True)]
        for t in threads:
            t.start()
        print(f"soak: KILN_HOME {s.home}; a {a.rows}-row partition every {a.land_every} s, "
              f"{a.rate} predicts/s, until {a.runs} succeeded runs", flush=True)
        t0 = t_prev = time.time()
        samples = []
        while not interrupted:
            t_sample = time.time() + a.every
            while not interrupted and time.time() < t_sample:  # record before retention deletes
                s.stop.wait(min(5.0, max(0.0, t_sample - time.time())))
                s.observe()
            for n, p in s.procs.items():
                if p.poll() is not None:
                    sys.exit(f"{n} exited ({p.returncode}); see {s.home}/{n}.log")
            x = s.sample(t_prev)
            t_prev = x["t"]
            s.line(x, t0, samples[-1] if samples else None)
            samples.append(x)
            if x["runs"] >= a.runs or (a.deadline and x["t"] - t0 >= a.deadline):
                break
        s.stop.set()
        for t in threads:
            t.join(15)
        settled = s.settle()
        res = s.check()
        res["settled"] = settled
        res["seconds"] = round(time.time() - t0)
        after = [x for x in samples if x["runs"] >= a.warmup]
        if len(after) < 2:
            print("too few samples after warm-up to compare", file=sys.stderr)
            print(json.dumps(res))
            return 1
        k = max(2, len(after) // 5)
        head, tail = after[:k], after[-k:]

        def lat(xs):
            # every answer of the fifth's windows (a window ends at its sample)
            t_a = samples[samples.index(xs[0]) - 1]["t"] if samples.index(xs[0]) else t0
            return [x[2] for x in s.lat if x[3] and t_a < x[0] <= xs[-1]["t"]]

        rows = verdicts(head, tail, lat(head), lat(tail), bool(a.keep_runs))
        span = (tail[-1]["db"] - head[0]["db"]) / max(1, tail[-1]["runs"] - head[0]["runs"])
        print(f"\nfirst fifth after warm-up: {len(head)} samples, runs {head[0]['runs']}-"
              f"{head[-1]['runs']} ({head[0]['t'] - t0:.0f}-{head[-1]['t'] - t0:.0f} s); "
              f"last fifth: runs {tail[0]['runs']}-{tail[-1]['runs']} "
              f"({tail[0]['t'] - t0:.0f}-{tail[-1]['t'] - t0:.0f} s)")
        print(f"| criterion | first fifth | last fifth | tolerance | verdict |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {'flat' if r[4] else 'GREW'} |")
        errs = sum(x["predict_errors"] for x in after[1:])
        if a.samples:
            with open(a.samples, "w") as f:
                for x in samples:
                    f.write(json.dumps(x) + "\n")
        res["predict_errors_after_warmup"] = errs
        res["predicts"] = sum(x["predicts"] for x in samples)
        res["db_bytes_per_run"] = round(span)
        exact = (res["partitions_lost"] == 0 and res["partitions_twice"] == 0 and
                 res["pushes_lost"] == 0 and res["pushes_duplicated"] == 0 and
                 res["checkpoints_pushed_twice"] == 0 and
                 all(res[f"serve_{x}"]["pushes_applied"] == res[f"serve_{x}"]["recorded_succeeded"]
                     and res[f"serve_{x}"]["pushes_rejected"] == 0 and res[f"serve_{x}"]["holds_last"]
                     for x in "AB"))
        print(f"| runs and pushes | | {res['runs_by_state'].get('succeeded', 0)} runs | "
              f"0 lost, 0 twice | {'exact' if exact else 'LOST OR TWICE'} |")
        print(json.dumps(res))
        ok = exact and all(r[4] for r in rows) and errs == 0
        return 0 if ok else 1
    finally:
        s.stop.set()
        s.down()
        if a.keep or not ok:
            print(f"kept {s.home}", file=sys.stderr)
        else:
            shutil.rmtree(s.home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
