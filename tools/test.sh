#!/usr/bin/env bash
# tools/test.sh - the README's test command: install dependencies, build
# Kiln (warnings are errors; the CUDA backend too when nvcc is present) and
# run the whole test suite with CTest.
#
#   tools/test.sh                    plain build in build/
#   KILN_SANITIZE=1 tools/test.sh    ASan+UBSan build in build-san/ (CPU only;
#                                    without the `cluster` label: the cluster
#                                    tests run the .deb's programs, which a
#                                    sanitizer build does not package)
#   extra arguments go to ctest, e.g. tools/test.sh -L unit
#
# The `cluster` tests (tests/test_cluster.c) bring up the test cluster of
# tools/testcluster.sh themselves (root: network namespaces) and tear it down.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/deps.sh

jobs="${KILN_JOBS:-2}"
label_args=()
if [ "${KILN_SANITIZE:-0}" = "1" ]; then
  label_args=(-LE cluster)
  build="${KILN_BUILD_DIR:-build-san}"
  flags=(-DKILN_ASAN=ON -DKILN_UBSAN=ON -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug)
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Open MPI's own allocations are not ours to fix.
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
else
  build="${KILN_BUILD_DIR:-build}"
  flags=(-DKILN_CUDA="${KILN_CUDA:-AUTO}")
fi

cmake -S . -B "$build" -G Ninja -DKILN_WERROR=ON "${flags[@]}"
cmake --build "$build" -j "$jobs"
if grep -q "KILN_HAVE_CUDA:INTERNAL=ON" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "kiln: CUDA backend compiled with nvcc (GPU tests report themselves skipped without a device)"
fi
cd "$build"
ctest --output-on-failure -j "$jobs" "${label_args[@]}" "$@"
