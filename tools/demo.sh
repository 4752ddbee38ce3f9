#!/usr/bin/env bash
# tools/demo.sh - the README's first command: Kiln's main job end to end on
# the embedded defaults, in a fresh temporary KILN_HOME:
#
#   kilnd (SQLite file, local mpirun, status page on 127.0.0.1:8480)
#   two kiln-serve endpoints on loopback holding labels A and B
#   day-0 data -> train -> full push to A and B
#   day-1 data -> incremental training from the day-0 checkpoint -> delta push to B
#   eval logloss of A and B on held-out day-1 data (B should be better),
#   the lineage of B, the status page URL, and one JSON line at the end.
#
# KILN_DEMO_ROWS (default 200000 per day) sets the data size. On a terminal,
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
# Two endpoints, each on a free port that it reports in a file.
for label in A B; do
  "$root/build/serving/kiln-serve" --listen 127.0.0.1:0 --state-dir "$KILN_HOME/serve-$label" \
      --token-env KILN_SERVE_TOKEN --port-file "$KILN_HOME/serve-$label.port" \
      --max-body $((64 << 20)) \
      > "$KILN_HOME/serve-$label.log" 2>&1 &
  pids+=($!)
done
for label in A B; do
  for _ in $(seq 100); do [ -s "$KILN_HOME/serve-$label.port" ] && break; sleep 0.1; done
done
portA=$(cat "$KILN_HOME/serve-A.port"); portB=$(cat "$KILN_HOME/serve-B.port")
say "kiln-serve A on 127.0.0.1:$portA, B on 127.0.0.1:$portB"

"$root/build/scheduler/kilnd" --listen "$listen" --log "$KILN_HOME/kilnd.log" &
pids+=($!)
say "kilnd started (log $KILN_HOME/kilnd.log)"

mkdir -p "$KILN_HOME/job"
cat > "$KILN_HOME/job/ctr.yaml" <<EOF
# The demo job: DLRM on Criteo-format partitions, trained incrementally
# (each run consumes only partitions no earlier run did) from the latest
# checkpoint, with endpoints for labels A and B.
name: ctr
resources: {ranks: 2, timeout: 10m}
retries: {count: 2, backoff: 5s}
data:
  train: "data/day=*/part-*.tsv"
  eval: "data/eval.tsv"
  incremental: true
model:
  type: dlrm
  embedding: {dim: 16, capacity: 2000000}
  bottom_mlp: [64, 16]
  top_mlp: [128, 64, 1]
train:
  batch_size: 2048
  init_from: latest
checkpoint: {dir: ckpt, full_every: 4, keep: 5}
push:
  token_env: KILN_SERVE_TOKEN
  endpoints:
    - {url: "http://127.0.0.1:$portA", model: ctr, label: A}
    - {url: "http://127.0.0.1:$portB", model: ctr, label: B}
EOF

# Waits for the newest run of the job to end; fails unless it succeeded.
wait_run() {
  local state=""
  for _ in $(seq 600); do
    state=$("$kiln" --json runs --job ctr --limit 1 | /usr/bin/python3 -c \
      'import json,sys; r=json.load(sys.stdin); print(r[0]["state"] if r else "none")')
    case "$state" in
      succeeded) return 0 ;;
      failed|canceled|timed_out|skipped)
        "$kiln" runs --job ctr >&2
        "$kiln" logs "$("$kiln" --json runs --job ctr --limit 1 | /usr/bin/python3 -c \
          'import json,sys; print(json.load(sys.stdin)[0]["id"])')" >&2 || true
        echo "kiln demo: the run ended $state" >&2
        return 1 ;;
    esac
    sleep 1
  done
  echo "kiln demo: the run did not end in 10 minutes" >&2
  return 1
}

say "day 0: generate $rows rows, train, push the full model to A and B"
"$kiln" datagen --rows "$rows" --day 0 --seed 7 --out "$KILN_HOME/job/data/day=0/part-0.tsv"
# Day 1 comes from the same hidden model (seed) after a day of drift; its last
# tenth is held out as the evaluation set and never trained on.
"$kiln" datagen --rows $((rows + rows / 10)) --day 1 --seed 7 --out "$KILN_HOME/day1-all.tsv"
tail -n $((rows / 10)) "$KILN_HOME/day1-all.tsv" > "$KILN_HOME/job/data/eval.tsv"
"$kiln" submit "$KILN_HOME/job/ctr.yaml"
wait_run
"$kiln" push --job ctr

say "day 1: new partition arrives; train incrementally from the day-0 checkpoint, push the delta to B"
mkdir -p "$KILN_HOME/job/data/day=1"
head -n "$rows" "$KILN_HOME/day1-all.tsv" > "$KILN_HOME/job/data/day=1/part-0.tsv"
"$kiln" submit "$KILN_HOME/job/ctr.yaml"
wait_run
"$kiln" push --job ctr --label B
"$kiln" runs --job ctr

say "eval logloss of A and B on held-out day-1 data"
# Each endpoint predicts the held-out rows with its own label.
logloss() {
  curl -sS --fail --data-binary @"$KILN_HOME/job/data/eval.tsv" \
    "http://127.0.0.1:$1/v1/models/ctr/predict?label=$2" > "$KILN_HOME/pred-$2.json"
  /usr/bin/python3 - "$KILN_HOME/job/data/eval.tsv" "$KILN_HOME/pred-$2.json" <<'PY'
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
llA=$(logloss "$portA" A)
llB=$(logloss "$portB" B)
echo "A (day 0 model):          eval logloss $llA"
echo "B (day 0 + day 1 delta):  eval logloss $llB"

say "lineage of B"
"$kiln" lineage "http://127.0.0.1:$portB"

status_url="http://$listen/"
say "status page: $status_url"
if [ "$keep" = "1" ]; then
  echo "kilnd and both endpoints keep running; stop them with: kill ${pids[*]}" >&2
fi
printf '{"A_eval_logloss": %s, "B_eval_logloss": %s, "B_better": %s, "status_url": "%s", "kiln_home": "%s"}\n' \
  "$llA" "$llB" "$(/usr/bin/python3 -c "print('true' if $llB < $llA else 'false')")" \
  "$status_url" "$KILN_HOME"
