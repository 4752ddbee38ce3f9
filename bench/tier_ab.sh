#!/usr/bin/env bash
# bench/tier_ab.sh - two builds of bench/tier_bench (old and new code of the
# disk tier, issue 25) at 1e6 keys of dim 16, Zipf 1.15, interleaved in
# rounds: all in RAM (B), A's and B's tiered lines at 10% memory for each
# reads kind given, all in RAM (A). Each line's samples/s is divided by the
# mean of its round's two all-in-RAM lines, so the ratio compares runs a few
# seconds apart. Under other load, prefix it with `chrt -f 1` (FIFO: the
# other work waits while a run runs), which steadied these runs where
# `nice` did not.
#   bench/tier_ab.sh A_BUILD B_BUILD [ROUNDS] [IO...]   (defaults: 3, pread mmap)
#   e.g. chrt -f 1 bench/tier_ab.sh /tmp/old/build build 3 pread uring mmap
set -euo pipefail
a="$1/bench/tier_bench"
b="$2/bench/tier_bench"
rounds="${3:-3}"
shift $(($# < 3 ? $# : 3))
kinds="${*:-pread mmap}"
args=(--keys 1000000 --zipf 1.15 --steps 100 --dir "${TIER_AB_DIR:-/var/tmp}" --prefetch 0)
# "IO RATE CPU" of a line (IO as the bench reports it: a build older than
# --io mmap runs its AUTO for it and says which)
rate() { sed -E 's/.*, io ([a-z_-]+), .*: ([0-9]+) samples\/s, CPU ([0-9.]+) ms\/step.*/\1 \2 \3/'; }
for r in $(seq "$rounds"); do
  echo "round $r, load $(cut -d' ' -f1 /proc/loadavg)"
  read -r _ rb cb < <("$b" "${args[@]}" --memory 1 | rate)
  lines=()
  for io in $kinds; do
    for side in A B; do
      bin=$a
      [ "$side" = B ] && bin=$b
      lines+=("$side $("$bin" "${args[@]}" --memory 0.1 --io "$io" | rate)")
    done
  done
  read -r _ ra ca < <("$a" "${args[@]}" --memory 1 | rate)
  printf '  all in RAM  A %s samples/s, %s ms CPU; B %s, %s ms\n' "$ra" "$ca" "$rb" "$cb"
  for l in "${lines[@]}"; do
    set -- $l
    awk -v s="$1" -v io="$2" -v r="$3" -v c="$4" -v ra="$ra" -v rb="$rb" -v ca="$ca" -v cb="$cb" \
      'BEGIN { printf "  %s %-8s %7d samples/s  %.2fx all in RAM  CPU %.1f ms/step (%.2fx)\n",
               s, io, r, 2 * r / (ra + rb), c, (ca + cb) / 2 / c }'
  done
done
