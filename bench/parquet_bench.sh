#!/usr/bin/env bash
# bench/parquet_bench.sh - Parquet against TSV and kiln-bin on the same rows
# (issue 24): `kiln datagen` writes ROWS rows of Criteo TSV, `kiln convert`
# the kiln-bin file, DuckDB (tests/parquet/write.mjs) the Parquet files
# (snappy and zstd, page v1 and v2), each twice: with DuckDB's own row
# groups (122,880 rows: what a `COPY ... TO` writes) and with the tests'
# 2048-row groups (a dictionary and a read per column every 2048 rows).
# Then:
#   1. parquet_bench: the reader's rows/s for each file (decoding only);
#   2. kiln-train samples/s, 1 rank x 2 threads, lr / fm / dlrm, on kiln-bin,
#      TSV and snappy Parquet of both kinds (the goals: TSV >= 80% of
#      kiln-bin, issue 23; Parquet >= 90%, issue 24), REPEAT runs each,
#      interleaved, median.
#   [READER=auto|thread|team] bench/parquet_bench.sh [BUILD_DIR] [ROWS] [REPEAT]
#   (defaults: auto build 1000000 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rows="${2:-1000000}"
repeat="${3:-3}"
out="bench/out/parquet"
mkdir -p "$out"
kiln="$build/tools/kiln"
if [ ! -s "$out/data.tsv" ] || [ "$(wc -l < "$out/data.tsv")" != "$rows" ]; then
  "$kiln" datagen --rows "$rows" --out "$out/data.tsv" --seed 11 >/dev/null
  rm -f "$out"/*.parquet "$out/data.kb"
fi
[ -s "$out/data.kb" ] || "$kiln" convert "$out/data.tsv" --out "$out/data.kb" >/dev/null
names=(duckdefault-snappy-v1 duckdefault-zstd-v1 duckdefault-snappy-v2 duckdefault-zstd-v2
       duck-snappy-v1 duck-zstd-v1 duck-snappy-v2 duck-zstd-v2)
if [ ! -s "$out/duck-zstd-v2.parquet" ] || [ ! -s "$out/duckdefault-zstd-v2.parquet" ]; then
  node tests/parquet/write.mjs "$out/data.tsv" "$out" "${names[@]}" >/dev/null
fi
echo "== reader: rows/s, 1 rank, batch 4096 (median of 5)"
"$build/bench/parquet_bench" --repeat 5 "$out/data.tsv" "$out/data.kb" \
  $(for n in "${names[@]}"; do echo "$out/$n.parquet"; done)

# Open MPI refuses root unless told (CI containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# READER picks data.reader for every run (auto: what kiln-train picks by itself).
reader="${READER:-auto}"
echo "== kiln-train samples/s, 1 rank x 2 threads, data.reader: $reader (median of $repeat, interleaved)"
fmts=(kiln-bin criteo-tsv parquet parquet-2048)
for model in lr fm dlrm; do
  for fmt in "${fmts[@]}"; do
    train="data.kb"
    [ "$fmt" = parquet ] && train="duckdefault-snappy-v1.parquet"
    [ "$fmt" = parquet-2048 ] && train="duck-snappy-v1.parquet"
    [ "$fmt" = criteo-tsv ] && train="data.tsv"
    # The model's defaults, as bench/trainer_vs_torch.py runs them.
    cat > "$out/$model-$fmt.yaml" <<YAML
name: pqbench-$model-$fmt
resources: {threads: 2}
data: {format: ${fmt%-2048}, train: "$train", reader: $reader}
model: {type: $model}
train: {batch_size: 4096, seed: 1, init_from: none}
checkpoint: {dir: ckpt-$model-$fmt, keep: 1}
YAML
  done
  declare -A sps=()
  for ((i = 0; i < repeat; i++)); do
    for fmt in "${fmts[@]}"; do
      rm -rf "$out/ckpt-$model-$fmt" "$out/run-$model-$fmt"
      v=$(mpirun -np 1 --bind-to none "$build/trainer/kiln-train" --spec \
          "$out/$model-$fmt.yaml" --run-dir "$out/run-$model-$fmt" --quiet 2>/dev/null | python3 -c \
          'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')
      sps[$fmt]="${sps[$fmt]:-} $v"
    done
  done
  python3 - "$model" "${sps[kiln-bin]}" "${sps[criteo-tsv]}" "${sps[parquet]}" \
      "${sps[parquet-2048]}" <<'PY'
import statistics, sys
m = sys.argv[1]
b, t, p, q = ([float(x) for x in a.split()] for a in sys.argv[2:6])
mb, mt, mp, mq = (statistics.median(x) for x in (b, t, p, q))
runs = lambda xs: " ".join(f"{x:.0f}" for x in xs)
print(f"{m:5s} kiln-bin {mb:10.0f}  tsv {mt:10.0f} (ratio {mt / mb:.3f}, goal 0.8)  "
      f"parquet(snappy) {mp:10.0f} (ratio {mp / mb:.3f}, goal 0.9)  "
      f"2048-row groups {mq:10.0f} (ratio {mq / mb:.3f})")
print(f"      runs: {runs(b)} / {runs(t)} / {runs(p)} / {runs(q)}")
PY
done
