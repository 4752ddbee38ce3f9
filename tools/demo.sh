#!/usr/bin/env bash
# tools/demo.sh - the README's first command: Kiln's main job end to end on
# the embedded defaults (a SQLite file under .kiln/demo, local mpirun,
# kiln-serve endpoints on loopback, generated data).
#
# Today it builds Kiln, validates and submits the example jobs and lists
# them; the trainer, daemon and serving steps join as they land (issues 3-6).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/deps.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "${KILN_JOBS:-2}" --target kiln

export KILN_HOME="${KILN_HOME:-$PWD/.kiln/demo}"
mkdir -p "$KILN_HOME"
kiln=build/tools/kiln
echo "== KILN_HOME=$KILN_HOME"

echo "== validate every example spec"
for spec in examples/*.yaml; do
  "$kiln" submit --dry-run "$spec" | head -1
done

echo "== submit the hourly incremental job and a one-off training"
"$kiln" submit examples/ctr-hourly.yaml
"$kiln" submit examples/oneoff.yaml

echo "== jobs"
"$kiln" jobs
echo "== runs"
"$kiln" runs
echo "== next fire times of ctr-hourly"
"$kiln" schedule next "15 * * * *" --count 3
