#!/usr/bin/env bash
# tools/tier_bench.sh - the scale curves of tables larger than memory (issue
# 25): bench/tier_bench for 1e6, 1e7 and 1e8 keys of dim 16 (adagrad) at
# 100%, 25% and 10% of the table in RAM, Zipf 1.15, each in its own process.
# Sizes whose table (or tier file) does not fit the free RAM or disk are
# skipped with a line saying so (TIER_BENCH_SIZES="1000000 10000000" picks
# sizes). Each size with rows on disk runs with the tier's reads from a
# mapping of its file (what kiln-train and kiln-serve use), through pread,
# through io_uring, and mapped with prefetch (as kiln-train calls it: it
# acts only while the tier's reads are slow), and each tiered line is
# followed by its ratio to the all-in-RAM lines of its size (the faster of
# two runs: samples/s, and CPU time per step, which other load on the
# machine disturbs less); the 10% lines say whether the goal (>= 0.5x) is
# met. Then the admission curve (see below).
# Usage: tools/tier_bench.sh [build] [dir]
set -euo pipefail
build="${1:-build}"
dir="${2:-/var/tmp}"
bench="$build/bench/tier_bench"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
for keys in ${TIER_BENCH_SIZES-1000000 10000000 100000000}; do
  need=$((keys * 180))                      # bytes: a record and its share of pages
  disk=$(($(df -P -B1 "$dir" | awk 'NR==2 {print $4}')))
  ram=$(($(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024))
  ram_rate=""
  ram_cpu=""
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  for mem in 1 0.25 0.1; do
    if [ "$mem" = 1 ] && [ "$need" -gt "$ram" ]; then
      echo "keys $keys memory 100%: skipped, needs ${need} bytes of RAM, ${ram} free"; continue
    fi
    if [ "$need" -gt "$disk" ]; then
      echo "keys $keys memory $mem: skipped, needs ${need} bytes of disk in $dir, ${disk} free"; continue
    fi
    steps=100
    [ "$keys" -ge 100000000 ] && steps=50
    if [ "$mem" = 1 ]; then
      # twice: the tiered lines are held to the faster run (the lower CPU
      # time), so a slow moment of a loaded machine does not flatter them
      for run in 1 2; do
        line=$("$bench" --keys "$keys" --memory "$mem" --zipf 1.15 --steps "$steps" --dir "$dir")
        echo "$line"
        rate=$(sed -E 's/.*: ([0-9]+) samples\/s.*/\1/' <<<"$line")
        cpu=$(sed -E 's/.*CPU ([0-9.]+) ms\/step.*/\1/' <<<"$line")
        if [ -z "$ram_rate" ] || [ "$rate" -gt "$ram_rate" ]; then ram_rate=$rate; fi
        if [ -z "${ram_cpu:-}" ] || awk -v a="$cpu" -v b="$ram_cpu" 'BEGIN { exit !(a < b) }'; then
          ram_cpu=$cpu
        fi
      done
      continue
    fi
    # the tier's reads from the mapping, through pread and through io_uring;
    # then mapped with the next step's keys prefetched
    for how in "mmap 0" "pread 0" "uring 0" "mmap 1"; do
      set -- $how
      line=$("$bench" --keys "$keys" --memory "$mem" --zipf 1.15 --steps "$steps" --dir "$dir" \
        --io "$1" --prefetch "$2")
      echo "$line"
      if [ -n "${ram_rate:-}" ]; then
        rate=$(sed -E 's/.*: ([0-9]+) samples\/s.*/\1/' <<<"$line")
        cpu=$(sed -E 's/.*CPU ([0-9.]+) ms\/step.*/\1/' <<<"$line")
        awk -v r="$rate" -v R="$ram_rate" -v c="$cpu" -v C="$ram_cpu" -v m="$mem" 'BEGIN {
          printf "  vs all in RAM: %.2fx samples/s, %.2fx by CPU time per step%s\n", r / R, C / c,
                 (m == 0.1 ? (r / R >= 0.5 ? " (goal >= 0.5x met)" : " (goal >= 0.5x NOT met)") : "") }'
      fi
    done
  done
done

# Admission (model.embedding.admit.min_count 1, 2, 5): kiln-train (fm, dim
# 16, adagrad, 1 rank) on `kiln datagen` data whose ids are Zipf 1.15 in
# every slot, one epoch of ${adm_rows} rows, eval on ${adm_eval} rows of the
# same days drawn apart (--part 1): the rows the tables end with and the eval
# logloss. Set TIER_BENCH_ADMIT=0 to skip it.
if [ "${TIER_BENCH_ADMIT:-1}" != 0 ]; then
  adm_rows=${TIER_BENCH_ADMIT_ROWS:-400000}
  adm_eval=${TIER_BENCH_ADMIT_EVAL:-50000}
  work="$dir/tier_bench_admit.$$"
  mkdir -p "$work/data"
  trap 'rm -rf "$work"' EXIT
  for day in 0 1; do
    "$build/tools/kiln" datagen --rows $((adm_rows / 2)) --out "$work/data/day=$day.tsv" \
      --seed 11 --day "$day" --zipf 1.15 >/dev/null
  done
  "$build/tools/kiln" datagen --rows "$adm_eval" --out "$work/eval.tsv" --seed 11 --day 1 \
    --zipf 1.15 --part 1 | tail -1
  for mc in 1 2 5; do
    cat > "$work/admit$mc.yaml" <<SPEC
name: admit$mc
data: {train: "data/day=*.tsv", eval: "eval.tsv"}
model:
  type: fm
  embedding: {dim: 16, capacity: 4000000, admit: {min_count: $mc}}
train: {batch_size: 1024, seed: 7, epochs: 1, init_from: none,
        optimizer: {sparse: {type: adagrad, lr: 0.05}}}
checkpoint: {dir: ckpt/admit$mc, keep: 1}
SPEC
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -np 1 "$build/trainer/kiln-train" --spec "$work/admit$mc.yaml" \
      --run-dir "$work/run$mc" --quiet > "$work/result$mc.json" 2> "$work/log$mc"
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("tables", {})
print("admit min_count %s: %d rows in the tables, eval logloss %.5f, %d lookups of keys not admitted yet, %.1f s"
      % (sys.argv[2], r["keys"], r["eval_logloss"], t.get("admit_rejected", 0), r.get("train_seconds", 0)))' \
      "$work/result$mc.json" "$mc"
  done
fi
