#!/usr/bin/env bash
# tools/demo.sh - the README's first command: Kiln's main job end to end on
# the embedded defaults, set up the way a user runs it, in a fresh temporary
# KILN_HOME:
#
#   kilnd (SQLite file, local mpirun, status page on 127.0.0.1:8480)
#   one kiln-serve on loopback holding two labels of model ctr: A, the
#   champion, and B, the challenger; it logs what it serves with a request
#   key (--impressions-dir), takes the clicks (POST .../feedback) and, once
#   a row's 5 s feedback window has passed, writes the rows with their
#   clicks as training partitions (--join-dir) into the job's data directory
#   one cron job (@every 3s) training a DLRM on 2 MPI ranks on each new
#   partition there (data.incremental, ready: marker), pushing the rows that
#   changed to B by itself (export.on_success: incremental); A is listed
#   with auto: false
#
#   day 0 lands -> kilnd trains -> the model reaches B -> promoted to A
#   day 1 lands -> kilnd trains on it from the day-0 checkpoint -> the delta
#                  reaches B with no command typed
#   the loop    -> users (datagen's click model) are served by A and B with
#                  request keys and click; the joined partitions land;
#                  kilnd retrains B on them; a second round of traffic
#                  meets the retrained B
#
# It prints how fresh B is (from the day-1 file landing to its delta live on
# B, with the parts), the held-out day-1 eval logloss of A and B (B should be
# better), the loop's rounds (rows served, clicks, partitions joined, how
# long from the clicks to a B trained on them), the online A/B figures of
# both labels (kiln endpoints, and kilnd's /metrics), the lineage of B and
# the status page URL, and ends with one JSON line (A_eval_logloss,
# B_eval_logloss, B_better, freshness_s, A_online_logloss, B_online_logloss,
# online_rows, online_diff_ci95, click_to_live_s, status_url, kiln_home).
#
# KILN_DEMO_ROWS (default 200000 per day) sets the data size,
# KILN_DEMO_LOOP_ROWS (default 20000) the rows served per round. On a terminal,
# kilnd and the endpoints keep running after the script so that the status
# page can be read (it prints how to stop them); KILN_DEMO_KEEP=0 or 1 says
# otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

tools/deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "${KILN_JOBS:-2}" --target kiln kilnd kiln-train kiln-serve >/dev/null

rows="${KILN_DEMO_ROWS:-200000}"
export KILN_HOME="$(mktemp -d /tmp/kiln-demo-XXXXXX)"
export KILN_SERVE_TOKEN="demo-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
kiln="$root/build/tools/kiln"
listen="${KILN_DEMO_LISTEN:-127.0.0.1:8480}"
say() { printf '\n== %s\n' "$*" >&2; }
now() { date +%s.%N; }
py() { /usr/bin/python3 "$@"; }

keep="${KILN_DEMO_KEEP:-}"
if [ -z "$keep" ]; then
  if [ -t 1 ]; then keep=1; else keep=0; fi
fi
pids=()
cleanup() {
  if [ "$keep" != "1" ]; then
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
  fi
}
trap cleanup EXIT

say "KILN_HOME=$KILN_HOME"
# One endpoint on a free port that it reports in a file, holding labels A
# and B; what it serves with a request key comes back as training
# partitions in the job's data directory (data/ctr/part=*/).
mkdir -p "$KILN_HOME/job/data"
"$root/build/serving/kiln-serve" --listen 127.0.0.1:0 --state-dir "$KILN_HOME/serve" \
    --token-env KILN_SERVE_TOKEN --port-file "$KILN_HOME/serve.port" \
    --max-body $((64 << 20)) --impressions-dir "$KILN_HOME/serve/impressions" \
    --join-dir "$KILN_HOME/job/data" --feedback-window 5s \
    > "$KILN_HOME/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$KILN_HOME/serve.port" ] && break; sleep 0.1; done
port=$(cat "$KILN_HOME/serve.port")
say "kiln-serve on 127.0.0.1:$port: labels A (champion) and B (challenger), impressions logged, feedback window 5 s"

# kilnd, with the push token in its environment, reading the endpoints'
# traffic every 2 s for its endpoints page.
"$root/build/scheduler/kilnd" --listen "$listen" --log "$KILN_HOME/kilnd.log" \
    --stats-every 2s &
pids+=($!)
say "kilnd started (log $KILN_HOME/kilnd.log)"

cat > "$KILN_HOME/job/ctr.yaml" <<EOF
# The demo job: a DLRM on Criteo-format partitions: the days that land, and
# the rows kiln-serve served joined with their clicks. Every 3 s kilnd looks
# for partitions no earlier run consumed (data.incremental), trains on them
# from the latest checkpoint and pushes the rows that changed to B
# (export.on_success). A is the champion: only a promote changes it.
name: ctr
schedule: "@every 3s"
resources: {ranks: 2, timeout: 10m}
retries: {count: 2, backoff: 5s}
data:
  train: "data/ctr/*/part-*.tsv"   # day=N/ landed, part=ID/ joined by kiln-serve
  eval: "data/eval.tsv"
  incremental: true
  ready: marker   # a partition is complete when its _SUCCESS is there
model:
  type: dlrm
  embedding: {dim: 16, capacity: 2000000}
  bottom_mlp: [64, 16]
  top_mlp: [128, 64, 1]
train:
  batch_size: 2048
  init_from: latest
checkpoint: {dir: ckpt, full_every: 4, keep: 5}
export: {on_success: incremental}
push:
  token_env: KILN_SERVE_TOKEN
  endpoints:
    - {url: "http://127.0.0.1:$port", model: ctr, label: A, auto: false}
    - {url: "http://127.0.0.1:$port", model: ctr, label: B}
EOF

# What label $1 holds now, "" when nothing.
holds() {
  curl -sS "http://127.0.0.1:$port/v1/models/ctr/versions/$1" 2>/dev/null | py -c \
    'import json,sys
try: print(json.load(sys.stdin).get("checkpoint", ""))
except Exception: print("")'
}
# Waits until B holds something other than $1; prints it.
wait_b_moves() {
  local was="$1" got=""
  for _ in $(seq 6000); do
    got=$(holds B)
    if [ -n "$got" ] && [ "$got" != "$was" ]; then echo "$got"; return 0; fi
    sleep 0.05
  done
  echo "kiln demo: B did not receive a new model in 5 minutes; see $KILN_HOME/kilnd.log" >&2
  "$kiln" runs --job ctr >&2 || true
  return 1
}
# Lands a file the way data should land: written elsewhere, renamed into
# place, then its directory's _SUCCESS marker.
land() {
  mkdir -p "$(dirname "$2")"; cp "$1" "$2.landing"; mv "$2.landing" "$2"
  : > "$(dirname "$2")/_SUCCESS"
}

# Skewed like real traffic: a few ids in a large share of rows (Zipf 1.15),
# 200k ids per slot, 4% of fields empty.
skew=(--zipf 1.15 --vocab 200000 --empty 0.04)
say "generate day 0 and day 1 ($rows rows each, Zipf-skewed ids; the last tenth of day 1 is held out)"
"$kiln" datagen --rows "$rows" --day 0 --seed 7 "${skew[@]}" --out "$KILN_HOME/day0.tsv" >/dev/null
"$kiln" datagen --rows $((rows + rows / 10)) --day 1 --seed 7 "${skew[@]}" \
  --out "$KILN_HOME/day1-all.tsv" >/dev/null
head -n "$rows" "$KILN_HOME/day1-all.tsv" > "$KILN_HOME/day1.tsv"
tail -n $((rows / 10)) "$KILN_HOME/day1-all.tsv" > "$KILN_HOME/job/data/eval.tsv"

say "submit the cron job (the only command the loop needs)"
"$kiln" submit "$KILN_HOME/job/ctr.yaml"

say "day 0 lands; kilnd trains on it and pushes the model to B by itself"
land "$KILN_HOME/day0.tsv" "$KILN_HOME/job/data/ctr/day=0/part-0.tsv"
day0=$(wait_b_moves "")
echo "B holds $day0"
# Kiln records the push once B answered it; promote reads those records.
for _ in $(seq 200); do
  recorded=$("$kiln" --json lineage "http://127.0.0.1:$port" 2>/dev/null | py -c     'import json,sys; print(" ".join(e["holds"] or "" for e in json.load(sys.stdin)["endpoints"]))'     2>/dev/null || true)
  case " $recorded " in *" $day0 "*) break ;; esac
  sleep 0.05
done
say "promote B to A: the day-0 model becomes the champion"
"$kiln" promote --model ctr --from B --to A

say "day 1 lands; no command is typed until it is live on B"
# Watches from outside, as a user would: when kilnd queues a run for the new
# partition, when that run ends, and when B serves its delta.
land_and_watch() {
  py - "$kiln" "$port" "$day0" "$KILN_HOME/day1.tsv" "$KILN_HOME/job/data/ctr/day=1/part-0.tsv" <<'PY'
import json, os, shutil, subprocess, sys, time, urllib.request
kiln, port, was, src, dst = sys.argv[1:]
def newest():
    out = subprocess.run([kiln, "--json", "runs", "--job", "ctr", "--limit", "3"],
                         capture_output=True, text=True).stdout
    runs = [r for r in json.loads(out or "[]") if r["state"] != "skipped"]
    return runs[0] if runs else None
def holds():
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/ctr/versions/B") as r:
            return json.load(r).get("checkpoint", "")
    except Exception:
        return ""
before = newest()["id"]
os.makedirs(os.path.dirname(dst), exist_ok=True)
shutil.copy(src, dst + ".landing")
os.rename(dst + ".landing", dst)
t_land = time.time()
open(os.path.join(os.path.dirname(dst), "_SUCCESS"), "w").close()  # complete now
t_queued = t_ended = None
while time.time() - t_land < 300:
    r = newest()
    now = time.time()
    if r and r["id"] > before and t_queued is None:
        t_queued = now
    if r and r["id"] > before and r["state"] == "succeeded" and t_ended is None:
        t_ended = now
    h = holds()
    if h and h != was:
        t_live = time.time()
        t_queued = t_queued or t_live
        t_ended = t_ended or t_live
        print(f"{t_live - t_land:.2f} {t_queued - t_land:.2f} {t_ended - t_queued:.2f} "
              f"{t_live - t_ended:.2f} {h}")
        sys.exit(0)
    time.sleep(0.02)
sys.exit("kiln demo: the day-1 delta did not reach B in 5 minutes")
PY
}
read -r freshness t_cron t_train t_push day1 < <(land_and_watch)
echo "B holds $day1, live ${freshness} s after the partition landed:"
echo "  until the cron fire queued the run: ${t_cron} s (schedule: @every 3s)"
echo "  launch, training on 2 ranks, eval:  ${t_train} s"
echo "  export and delta push to B:         ${t_push} s (observed every 20 ms)"

say "eval logloss of A and B on held-out day-1 data"
# Each endpoint predicts the held-out rows with its own label.
logloss() {
  curl -sS --fail --data-binary @"$KILN_HOME/job/data/eval.tsv" \
    "http://127.0.0.1:$1/v1/models/ctr/predict?label=$2" > "$KILN_HOME/pred-$2.json"
  py - "$KILN_HOME/job/data/eval.tsv" "$KILN_HOME/pred-$2.json" <<'PY'
import json, math, sys
labels = [float(l.split("\t", 1)[0]) for l in open(sys.argv[1]) if l.strip()]
probs = json.load(open(sys.argv[2]))["probabilities"]
assert len(probs) == len(labels), (len(probs), len(labels))
eps = 1e-7
ll = -sum(y * math.log(min(max(p, eps), 1 - eps)) + (1 - y) * math.log(1 - min(max(p, eps), 1 - eps))
          for y, p in zip(labels, probs)) / len(labels)
print(f"{ll:.6f}")
PY
}
llA=$(logloss "$port" A)
llB=$(logloss "$port" B)
echo "A (champion: day 0):              eval logloss $llA"
echo "B (challenger: day 0 + day 1):    eval logloss $llB"

say "the loop: A and B serve users with request keys, the clicks come back, kilnd retrains B on them"
# Users drawn from datagen's click model (days 2 and 3): each round sends
# its rows as predicts of 500 rows with a request key, every other one to A
# and to B, then posts the clicks (the rows whose label is 1; a row without
# feedback joins as a negative). kiln-serve joins each row once its 5 s
# window has passed; the job takes the joined partitions like any other.
loop_rows="${KILN_DEMO_LOOP_ROWS:-20000}"
for d in 2 3; do
  "$kiln" datagen --rows "$loop_rows" --day "$d" --seed 7 "${skew[@]}" \
    --out "$KILN_HOME/users-day$d.tsv" >/dev/null
done
loop_out=$(py - "$kiln" "$port" "$KILN_SERVE_TOKEN" "$KILN_HOME/users-day2.tsv" \
  "$KILN_HOME/users-day3.tsv" <<'PY'
import json, subprocess, sys, time, urllib.request
kiln, port, token, *days = sys.argv[1:]
base = f"http://127.0.0.1:{port}/v1/models/ctr"
def post(path, doc, auth=False):
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, json.dumps(doc).encode(), h)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.load(r)
def joined():
    return get("/online")["joined_rows"]
def holds():
    return get("/versions/B").get("checkpoint", "")
def runs():
    out = subprocess.run([kiln, "--json", "runs", "--job", "ctr", "--limit", "5"],
                         capture_output=True, text=True).stdout
    return [r for r in json.loads(out or "[]") if r["state"] != "skipped"]
click_to_live = []
for n, path in enumerate(days, 1):
    rows = [l.rstrip("\n").split("\t", 1) for l in open(path) if l.strip()]
    before = joined()
    clicks, answers = 0, {}
    for q in range(0, len(rows), 500):
        key, label = f"round{n}-{q}", "AB"[q // 500 % 2]
        post(f"/predict?label={label}", {"request_key": key, "rows": [f for _, f in rows[q:q + 500]]})
        # The users click right after they were served.
        mine = [{"request_key": key, "row": r, "label": 1}
                for r, (y, _) in enumerate(rows[q:q + 500]) if y == "1"]
        for k, v in post("/feedback", mine, auth=True).items():
            answers[k] = answers.get(k, 0) + v
        clicks += len(mine)
    t_click = time.time()
    print(f"round {n}: served {len(rows)} rows, half by A and half by B (predicts of 500 rows "
          f"with a request key each, their clicks posted after each); {clicks} clicks: "
          + ", ".join(f"{v} {k}" for k, v in answers.items() if v), file=sys.stderr, flush=True)
    while joined() < before + len(rows):
        if time.time() - t_click > 300:
            sys.exit("kiln demo: the round's rows were not joined in 5 minutes; see serve.log")
        time.sleep(0.05)
    print(f"  joined into training partitions {time.time() - t_click:.1f} s after the clicks "
          f"(the 5 s feedback window, then the join)", file=sys.stderr, flush=True)
    # kilnd's cron finds the partitions, trains on them from the latest
    # checkpoint and pushes the delta to B: the first run that started after
    # the last of them landed has trained on all of them.
    mark = max([r["id"] for r in runs()], default=0)
    while True:
        rs = [r for r in runs() if r["id"] > mark]
        r = rs[-1] if rs else None
        if r and r["state"] == "succeeded":
            ck = r["pushes"][0]["checkpoint"] if r.get("pushes") else None
            if ck and holds() == ck:
                click_to_live.append(time.time() - t_click)
                print(f"  run {r['id']} trained on them; B holds {ck}, live "
                      f"{click_to_live[-1]:.1f} s after the clicks", file=sys.stderr, flush=True)
                break
        elif r and r["state"] in ("failed", "canceled", "timed_out"):
            sys.exit(f"kiln demo: run {r['id']} on the joined rows {r['state']}; see kiln show {r['id']}")
        if time.time() - t_click > 300:
            sys.exit("kiln demo: B was not retrained on the joined rows in 5 minutes")
        time.sleep(0.05)
on = get("/online")
ll = {l["label"]: l for l in on["labels"]}
cmp = next((c for c in on["comparisons"] if c["label"] == "B"), None)
print(json.dumps({"A": ll["A"]["logloss"], "B": ll["B"]["logloss"],
                  "rows": {k: v["impressions"] for k, v in ll.items()},
                  "ci95": cmp["ci95"] if cmp else None,
                  "click_to_live_s": round(sorted(click_to_live)[len(click_to_live) // 2], 2)}))
PY
)

say "online A/B: every row each label served, joined with its clicks (kiln endpoints)"
"$kiln" endpoints
read -r olA olB orows oci oclick < <(py -c '
import json, sys
d = json.loads(sys.argv[1])
print(d["A"], d["B"], json.dumps(d["rows"]).replace(" ", ""), json.dumps(d["ci95"]).replace(" ", ""),
      json.dumps(d["click_to_live_s"]))' "$loop_out")
echo "A online logloss $olA, B online logloss $olB (B - A 95% CI $oci)"
echo "kilnd's /metrics has them too:"
curl -sS "http://$listen/metrics" | grep -E '^kiln_endpoint_online_(impressions|logloss)(_diff)?\{' || true

say "lineage of B"
"$kiln" lineage "http://127.0.0.1:$port"

status_url="http://$listen/"
say "status page: $status_url (endpoints: ${status_url}endpoints)"
if [ "$keep" = "1" ]; then
  echo "kilnd and kiln-serve keep running; land more partitions under" \
       "$KILN_HOME/job/data/ctr/day=N/ (then a _SUCCESS beside them), or serve and click," \
       "and watch B; stop them with: kill ${pids[*]}" >&2
fi
printf '{"A_eval_logloss": %s, "B_eval_logloss": %s, "B_better": %s, "freshness_s": %s, "A_online_logloss": %s, "B_online_logloss": %s, "online_rows": %s, "online_diff_ci95": %s, "click_to_live_s": %s, "status_url": "%s", "kiln_home": "%s"}\n' \
  "$llA" "$llB" "$(py -c "print('true' if $llB < $llA else 'false')")" "$freshness" \
  "$olA" "$olB" "$orows" "$oci" "$oclick" "$status_url" "$KILN_HOME"
