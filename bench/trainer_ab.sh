#!/usr/bin/env bash
# bench/trainer_ab.sh - two builds of kiln-train on the same data, runs
# interleaved (A, B, A, B, ...), for a code move that should not change the
# trainer's speed (issue 29: old vs new). Each run is 1 rank, `kiln datagen`
# rows (seed 11) as kiln-bin, model defaults, batch 4096, the reader thread,
# under `nice -n -15`. It prints samples/s and, from /usr/bin/time, CPU
# seconds (user + sys) per million samples: on a machine loaded by others the
# wall clock swings by 2-5x between runs of one binary, while the CPU time of
# a 1-thread run moves by a few percent. With more than one thread the CPU
# time counts OpenMP's spinning while a thread waits for a descheduled
# sibling, and swings too. The CPU time includes the process start-up (MPI,
# reading the data): use EPOCHS to make it a small share.
#   bench/trainer_ab.sh A_BUILD B_BUILD [MODELS] [REPEAT]
#   (defaults: lr,dlrm 5; THREADS=1 ROWS=300000 EPOCHS=1 in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
a="$1"
b="$2"
models="${3:-lr,dlrm}"
repeat="${4:-5}"
threads="${THREADS:-1}"
rows="${ROWS:-300000}"
epochs="${EPOCHS:-1}"
out="bench/out/trainer_ab"
mkdir -p "$out"
if [ ! -s "$out/data.kb" ] || [ "$(cat "$out/rows" 2>/dev/null)" != "$rows" ]; then
  "$b/tools/kiln" datagen --rows "$rows" --out "$out/data.tsv" --seed 11 >/dev/null
  "$b/tools/kiln" convert "$out/data.tsv" --out "$out/data.kb" >/dev/null
  echo "$rows" > "$out/rows"
fi
# Open MPI refuses root unless told (CI containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== $a vs $b: $threads thread(s), $rows rows x $epochs epoch(s), $repeat runs each, interleaved"
for model in ${models//,/ }; do
  cat > "$out/$model.yaml" <<YAML
name: trainer-ab-$model
resources: {threads: $threads}
data: {format: kiln-bin, train: "data.kb", reader: thread}
model: {type: $model}
train: {batch_size: 4096, seed: 1, init_from: none, epochs: $epochs}
checkpoint: {dir: ckpt-$model, keep: 1}
YAML
  : > "$out/$model.runs"
  for ((i = 0; i < repeat; i++)); do
    for side in A B; do
      build="$a"
      [ "$side" = B ] && build="$b"
      rm -rf "$out/ckpt-$model" "$out/run-$model"
      load=$(cut -d' ' -f1 /proc/loadavg)
      /usr/bin/time -f "%U %S" -o "$out/time" nice -n -15 mpirun -np 1 --bind-to none \
        "$build/trainer/kiln-train" --spec "$out/$model.yaml" --run-dir "$out/run-$model" \
        --quiet 2>/dev/null > "$out/result.json"
      python3 - "$side" "$load" "$out/result.json" "$out/time" "$((rows * epochs))" \
        >> "$out/$model.runs" <<'PY'
import json, sys
side, load, res, tm, samples = sys.argv[1:6]
r = json.load(open(res))
u, s = (float(x) for x in open(tm).read().split())
samples = int(samples)
print(side, load, r["samples_per_s"], (u + s) / samples * 1e6)
PY
    done
  done
  python3 - "$model" "$out/$model.runs" <<'PY'
import statistics, sys
model, path = sys.argv[1:3]
rows = [l.split() for l in open(path)]
for side in "AB":
    rs = [r for r in rows if r[0] == side]
    sps = [float(r[2]) for r in rs]
    cpu = [float(r[3]) for r in rs]
    print(f"{model:5s} {side}: samples/s median {statistics.median(sps):10.0f} "
          f"({min(sps):.0f}-{max(sps):.0f}); CPU s per 1M samples median "
          f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}); "
          f"load {min(r[1] for r in rs)}-{max(r[1] for r in rs)}")
PY
done
