#!/usr/bin/env bash
# tools/tier_bench.sh - the scale curves of tables larger than memory (issue
# 25): bench/tier_bench for 1e6, 1e7 and 1e8 keys of dim 16 (adagrad) at
# 100%, 25% and 10% of the table in RAM, Zipf 1.15, each in its own process.
# Sizes whose table (or tier file) does not fit the free RAM or disk are
# skipped with a line saying so (TIER_BENCH_SIZES="1000000 10000000" picks
# sizes). Each size with rows on disk runs with the tier's reads through
# io_uring (model.embedding.spill_io: auto, what kiln-train and kiln-serve
# use), through pread, from a mapping of its file (spill_io: mmap), and
# through io_uring with prefetch (as kiln-train calls it: it acts only while
# the tier's reads are slow), and each tiered line is
# followed by its ratio to the all-in-RAM lines of its size (the faster of
# two runs: samples/s, and CPU time per step, which other load on the
# machine disturbs less); the 10% lines say whether the goal (>= 0.5x) is
# met (TIER_BENCH_IO="uring:0 mmap:0" picks the ways, IO:PREFETCH). Then,
# where a memory cgroup can be made (root, cgroup v1 or v2), the
# 10% lines again with the process and its page cache held to half the
# tier file plus the process's own memory, so the file is truly cold, as
# for a table larger than the machine's free RAM ("cold file" lines;
# TIER_BENCH_COLD=0 skips them). Then the admission curve (see below).
# Usage: tools/tier_bench.sh [build] [dir]
set -euo pipefail
build="${1:-build}"
dir="${2:-/var/tmp}"
bench="$build/bench/tier_bench"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-unset}"
# tier_bench's update runs on an OpenMP team, as kiln-train's does; kiln-train
# sets this spin for its ranks (docs/models.md), so the bench runs under it too:
# under libgomp's default the team's idle thread spins for milliseconds on the
# core the tier's writer thread needs.
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-30000}"
echo "sparse half of a step (bench/tier_bench; the key drawing is not timed):"
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
    for how in ${TIER_BENCH_IO-uring:0 pread:0 mmap:0 uring:1}; do
      set -- ${how/:/ }
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

# The whole step: kiln-train (lr, fm and dlrm: dim 1, 16 + 1 and 16,
# adagrad; 1 rank x 2 threads, batch 4096, kiln-bin) on `kiln datagen` data
# of 1e6 rows whose ids are Zipf 1.15 over 40,000 ids a slot (about 970,000
# keys in the 26 tables at the end), each table's capacity 45,000 rows,
# with all rows in RAM and with memory: 10% (4,500 rows a table: 12% of the
# rows the tables end with). TIER_BENCH_PAIRS (3) pairs of runs, all in RAM
# then 10%; the lines give the medians of train_seconds and of the pairs'
# ratios.
# Under each 10% line: bench/tier_floor's cost of one record's read and
# write here, and the bound those costs put on the ratio (docs/benchmarks.md,
# "the kernel's floor under the tier").
# TIER_BENCH_TRAIN=0 skips it.
if [ "${TIER_BENCH_TRAIN:-1}" != 0 ]; then
  tw="$dir/tier_bench_train.$$"
  mkdir -p "$tw"
  "$build/tools/kiln" datagen --rows 1000000 --out "$tw/day0.tsv" --zipf 1.15 --vocab 40000 \
    --empty 0.04 >/dev/null
  "$build/tools/kiln" convert "$tw/day0.tsv" --out "$tw/day0.bin" >/dev/null
  rm -f "$tw/day0.tsv"
  echo "kiln-train, 1e6 rows, 26 tables of capacity 45000, Zipf 1.15 over 40000 ids a slot:"
  pairs=${TIER_BENCH_PAIRS:-3}
  for model in lr fm dlrm; do
    # pairs of runs, all in RAM then memory: 10%, one after the other: the
    # machine's speed drifts by 10-20 % from minute to minute, so each
    # pair's ratio is taken and the median of those is the figure (and
    # each configuration's median samples/s)
    ram_all="" tier_all="" ratios=""
    for pair in $(seq "$pairs"); do
      for mem in 100% 10%; do
        cat > "$tw/spec.yaml" <<SPEC
name: tier-train
data: {train: day0.bin, format: kiln-bin}
model:
  type: $model
  embedding: {capacity: 45000, memory: "$mem", spill_dir: "$tw/spill"}
train: {batch_size: 4096, seed: 1, init_from: none}
resources: {threads: 2}
SPEC
        rm -rf "$tw/run"
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
          mpirun -np 1 --bind-to none "$build/trainer/kiln-train" --spec "$tw/spec.yaml" \
          --run-dir "$tw/run" --quiet > "$tw/result.json" 2> "$tw/log"
        s=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["train_seconds"])' \
          "$tw/result.json")
        if [ "$mem" = 100% ]; then ram_all="$ram_all $s"; else tier_all="$tier_all $s"; fi
      done
    done
    # the median seconds of each and of the pairs' ratios; the 10% line's
    # table figures are its last run's (the same every run of these inputs)
    set -- $(python3 -c 'import statistics, sys
ram = [float(x) for x in sys.argv[1].split()]; tier = [float(x) for x in sys.argv[2].split()]
print(statistics.median(ram), statistics.median(tier),
      statistics.median(a / b for a, b in zip(ram, tier)),
      ",".join("%.2f" % (a / b) for a, b in zip(ram, tier)))' "$ram_all" "$tier_all")
    ram_s=$1 best=$2 ratio=$3 each=$4
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); t = r["tables"]; m, ram_s, tier_s, ratio, each = sys.argv[2:]
print("  %s memory 100%%: %.0f samples/s" % (m, 1e6 / float(ram_s)))
print("  %s memory 10%%: %.0f samples/s, RAM hit rate %.3f, %.0f / %.0f MB read / written, "
      "%d rows in RAM, %d on disk; vs all in RAM %.2fx, the median of %s (goal >= 0.5x %s)" % (
      m, 1e6 / float(tier_s), t["ram_hit_rate"], t["disk_read_bytes"] / 1e6,
      t["disk_written_bytes"] / 1e6, t["rows_ram"], t["rows_disk"], float(ratio), each,
      "met" if float(ratio) >= 0.5 else "NOT met"))' "$tw/result.json" "$model" "$ram_s" "$best" \
      "$ratio" "$each"
    # The kernel's floor under that tiered run: its transfers (result.json's
    # disk_reads, disk_writes; the same every run of these inputs) at what
    # bench/tier_floor measures one of the reads' average size costs here,
    # with a file of about the tier's size (200 bytes a row on disk); the
    # bound is the all-in-RAM time plus that CPU spread over the threads:
    # what no work in Kiln's own code could beat while the tier moves rows
    # this way, and the same with the bytes written as appends.
    set -- $(python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); t = r["tables"]
rec = min(4096, max(8, round(t["disk_read_bytes"] / max(1, t["disk_reads"]) / 8) * 8))
print(rec, max(1, int(t["rows_disk"] * 200 / 2**20)), t["disk_reads"], t["disk_writes"],
      t["disk_written_bytes"] // rec, r["steps"])' "$tw/result.json")
    floor=$("$build/bench/tier_floor" --rec "$1" --file-mb "$2" --dir "$dir")
    python3 -c 'import re, sys
f = sys.argv[1]; reads, writes, recs, steps, ram_s, tier_s, thr = sys.argv[2:]
v = dict(re.findall(r"(pread|uring|pwrite|append) ([0-9.]+)", f))
rd = float(v.get("uring", v["pread"])); steps = int(steps)
cpu = (int(reads) * rd + int(writes) * float(v["pwrite"])) / 1e9
app = (int(reads) * rd + int(recs) * float(v["append"])) / 1e9
r, t = float(ram_s), float(tier_s)
print("    %s\n    its %.0f reads and %.0f writes a step cost the kernel %.1f ms of CPU a step at best: "
      "bound %.2fx of all in RAM with %s threads (measured %.2fx); with the writes as appends "
      "%.1f ms, bound %.2fx" % (f, int(reads) / steps, int(writes) / steps, cpu / steps * 1e3,
      r / (r + cpu / int(thr)), thr, r / t, app / steps * 1e3, r / (r + app / int(thr))))' \
      "$floor" "$3" "$4" "$5" "$6" "$ram_s" "$best" 2
  done
  rm -rf "$tw"
fi

# Cold file: tier_bench in a memory cgroup of LIMIT bytes (anonymous memory
# and page cache together); says why not where none can be made.
cold_run() { # cold_run LIMIT ARGS...
  local cg="" limit=$1; shift
  if [ -w /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/kiln-tier-bench.$$
    mkdir "$cg" && echo "$limit" > "$cg/memory.limit_in_bytes" || cg=""
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    cg=/sys/fs/cgroup/kiln-tier-bench.$$
    mkdir "$cg" && echo "$limit" > "$cg/memory.max" || cg=""
  fi
  if [ -z "$cg" ]; then
    echo "cold file: skipped, no memory cgroup can be made here (needs root and cgroup v1's or v2's memory controller)"
    return 0
  fi
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"
  rmdir "$cg" 2>/dev/null || true
}
if [ "${TIER_BENCH_COLD:-1}" != 0 ]; then
  for keys in ${TIER_BENCH_SIZES-1000000 10000000 100000000}; do
    [ "$keys" -ge 100000000 ] && continue  # hours at disk speed
    need=$((keys * 180))
    disk=$(($(df -P -B1 "$dir" | awk 'NR==2 {print $4}')))
    [ "$need" -gt "$disk" ] && continue
    # half the tier file (about 200 bytes a key at dim 16, adagrad) and the
    # process's own memory at 10% (about 40 bytes a key and 32 MiB)
    limit=$((keys * 100 + keys * 40 + (32 << 20)))
    echo "cold file: keys $keys at 10%, memory cgroup of $((limit >> 20)) MiB, 40 steps"
    for how in "uring 0" "uring 1" "pread 0" "mmap 0"; do
      set -- $how
      cold_run "$limit" "$bench" --keys "$keys" --memory 0.1 --zipf 1.15 --steps 40 --dir "$dir" \
        --io "$1" --prefetch "$2"
    done
  done
fi
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
