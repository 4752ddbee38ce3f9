#!/usr/bin/env bash
# tools/fuzz.sh - builds the libFuzzer harnesses (clang, ASan+UBSan) in
# build-fuzz/ and runs each for SECONDS (default 60) from its seed corpus in
# tests/fuzz/corpus/. A crash, leak or timeout fails the run and leaves the
# reproducer in build-fuzz/artifacts/. CI runs it with 60 s per harness.
#
#   tools/fuzz.sh [SECONDS] [HARNESS...]     e.g. tools/fuzz.sh 600 spec
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true

tools/deps.sh
build=build-fuzz
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DKILN_FUZZ=ON -DKILN_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
harnesses=("$@")
if [ "${#harnesses[@]}" -eq 0 ]; then
  harnesses=($(sed -n 's/^ *kiln_fuzzer(\([a-z_]*\).*/\1/p' tests/fuzz/CMakeLists.txt))
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
cmake --build "$build" -j "${KILN_JOBS:-2}" --target "${targets[@]}"

mkdir -p "$build/artifacts"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for h in "${harnesses[@]}"; do
  corpus="$build/corpus/$h"
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$h"/* "$corpus"/ 2>/dev/null || true
  # Inputs may grow to 8 KiB, or to the largest seed: libFuzzer cuts every
  # input to -max_len, and a cut seed (a manifest is 30-40 KB) is only ever
  # refused by the parser's first check, which then is all that is fuzzed.
  max_len=$(find "$corpus" tests/fuzz/corpus/"$h" -type f -printf '%s\n' 2>/dev/null |
            sort -n | tail -n 1)
  [ "${max_len:-0}" -gt 8192 ] || max_len=8192
  echo "== fuzz_$h for ${secs}s (inputs up to $max_len bytes)"
  # The harnesses that need files make /tmp/kiln-fuzz-NAME-XXXXXX and leave
  # it (libFuzzer ends the process): this run's go after it.
  before=$(ls -d /tmp/kiln-fuzz-"$h"-* 2>/dev/null || true)
  set +e
  "$build/tests/fuzz/fuzz_$h" "$corpus" -max_total_time="$secs" -timeout=10 \
      -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$h-" > "$build/fuzz_$h.log" 2>&1
  status=$?
  set -e
  for d in /tmp/kiln-fuzz-"$h"-*; do
    if [ -d "$d" ] && ! printf '%s\n' "$before" | grep -qxF "$d"; then
      rm -rf "$d"
    fi
  done
  grep -E "^(Done|stat::)|ERROR|SUMMARY" "$build/fuzz_$h.log" | tail -n 8
  if [ "$status" -ne 0 ]; then
    # CI keeps only what is printed: the crash's own lines (the stack, the
    # harness's reason) and the reproducer, base64, to replay with
    # `base64 -d > r && build-fuzz/tests/fuzz/fuzz_$h r`.
    echo "== the last lines of $build/fuzz_$h.log"
    grep -v -E '^#[0-9]+ +(NEW|REDUCE|pulse|INITED)' "$build/fuzz_$h.log" | tail -n 60
    repro=$(ls -t "$build/artifacts/$h-"* 2>/dev/null | head -n 1 || true)
    if [ -n "$repro" ]; then
      echo "== reproducer $repro ($(stat -c %s "$repro") bytes), base64:"
      head -c 16384 "$repro" | base64
    fi
    echo "kiln: fuzz_$h failed (exit $status); reproducer in $build/artifacts/" >&2
    exit 1
  fi
done
echo "fuzz: ${#harnesses[@]} harnesses ran ${secs}s each with no crash"
