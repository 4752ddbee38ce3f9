#!/usr/bin/env bash
# bench/parquet_bench.sh - Parquet against TSV and kiln-bin on the same rows
# (issue 24): `kiln datagen` writes ROWS rows of Criteo TSV, `kiln convert`
# the kiln-bin file, DuckDB (tests/parquet/write.mjs) the Parquet files
# (snappy and zstd, page v1 and v2). Then:
#   1. parquet_bench: the reader's rows/s for each file (decoding only);
#   2. kiln-train samples/s, 1 rank x 2 threads, lr / fm / dlrm, on kiln-bin
#      and on snappy Parquet (the issue's goal: Parquet >= 90% of kiln-bin),
#      REPEAT runs each, interleaved, median.
#   bench/parquet_bench.sh [BUILD_DIR] [ROWS] [REPEAT]   (defaults: build 1000000 3)
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
names=(duck-snappy-v1 duck-zstd-v1 duck-snappy-v2 duck-zstd-v2)
if [ ! -s "$out/duck-zstd-v2.parquet" ]; then
  node tests/parquet/write.mjs "$out/data.tsv" "$out" "${names[@]}" >/dev/null
fi
echo "== reader: rows/s, 1 rank, batch 4096 (median of 5)"
"$build/bench/parquet_bench" --repeat 5 "$out/data.tsv" "$out/data.kb" \
  $(for n in "${names[@]}"; do echo "$out/$n.parquet"; done)

# Open MPI refuses root unless told (CI containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== kiln-train samples/s, 1 rank x 2 threads (median of $repeat, interleaved)"
for model in lr fm dlrm; do
  for fmt in kiln-bin parquet; do
    train="data.kb"; [ "$fmt" = parquet ] && train="duck-snappy-v1.parquet"
    # The model's defaults, as bench/trainer_vs_torch.py runs them.
    cat > "$out/$model-$fmt.yaml" <<YAML
name: pqbench-$model-$fmt
resources: {threads: 2}
data: {format: $fmt, train: "$train"}
model: {type: $model}
train: {batch_size: 4096, seed: 1, init_from: none}
checkpoint: {dir: ckpt-$model-$fmt, keep: 1}
YAML
  done
  declare -A sps=()
  for ((i = 0; i < repeat; i++)); do
    for fmt in kiln-bin parquet; do
      rm -rf "$out/ckpt-$model-$fmt" "$out/run-$model-$fmt"
      v=$(mpirun -np 1 --bind-to none "$build/trainer/kiln-train" --spec \
          "$out/$model-$fmt.yaml" --run-dir "$out/run-$model-$fmt" --quiet 2>/dev/null | python3 -c \
          'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')
      sps[$fmt]="${sps[$fmt]:-} $v"
    done
  done
  python3 - "$model" "${sps[kiln-bin]}" "${sps[parquet]}" <<'PY'
import statistics, sys
m, b, p = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mb, mp = statistics.median(b), statistics.median(p)
print(f"{m:5s} kiln-bin {mb:12.0f}  parquet(snappy) {mp:12.0f}  ratio {mp / mb:.3f}  "
      f"(runs: {' '.join(f'{x:.0f}' for x in b)} / {' '.join(f'{x:.0f}' for x in p)})")
PY
done
