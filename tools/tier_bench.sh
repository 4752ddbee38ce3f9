#!/usr/bin/env bash
# tools/tier_bench.sh - the scale curves of tables larger than memory (issue
# 25): bench/tier_bench for 1e6, 1e7 and 1e8 keys of dim 16 (adagrad) at
# 100%, 25% and 10% of the table in RAM, Zipf 1.15, each in its own process.
# Sizes whose table (or tier file) does not fit the free RAM or disk are
# skipped with a line saying so. Usage: tools/tier_bench.sh [build] [dir]
set -euo pipefail
build="${1:-build}"
dir="${2:-/var/tmp}"
bench="$build/bench/tier_bench"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
for keys in 1000000 10000000 100000000; do
  need=$((keys * 180))                      # bytes: a record and its share of pages
  disk=$(($(df -P -B1 "$dir" | awk 'NR==2 {print $4}')))
  ram=$(($(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024))
  for mem in 1 0.25 0.1; do
    if [ "$mem" = 1 ] && [ "$need" -gt "$ram" ]; then
      echo "keys $keys memory 100%: skipped, needs ${need} bytes of RAM, ${ram} free"; continue
    fi
    if [ "$need" -gt "$disk" ]; then
      echo "keys $keys memory $mem: skipped, needs ${need} bytes of disk in $dir, ${disk} free"; continue
    fi
    steps=100
    [ "$keys" -ge 100000000 ] && steps=50
    "$bench" --keys "$keys" --memory "$mem" --zipf 1.15 --steps "$steps" --dir "$dir"
  done
done
