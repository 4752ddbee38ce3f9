#!/bin/sh
# tools/gpu_run.sh - the GPU host's half of docs/gpu.md's recipe: unpack the
# kit that tools/gpu_kit.sh packed here, then run the gpu tests, gpu_bench and
# bench/gpu_train.py, each under its own time limit, logs into $OUT (or
# /tmp/kiln-gpu-out). Run from the repository root on the GPU host:
#
#   sh tools/gpu_run.sh [KIT.tar.gz]       (default gpukit/kit.tar.gz)
#
# KILN_GPU_STEPS picks steps (default "bench ctest train"; "profile" runs
# lr and dlrm once each under Nsight Systems, its reports into $OUT/nsys); KILN_GPU_ROWS
# sets gpu_train.py's rows, KILN_GPU_TRAIN_ARGS adds options to it (later
# ones win: "--batch 65536 --threads 0 --repeat 1"). A step that fails or runs out of time does not stop the next: one call
# brings back every log it got to.
set -u
out=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$out"
kit=${1:-gpukit/kit.tar.gz}
steps=${KILN_GPU_STEPS:-bench ctest train}
step() { # step NAME SECONDS COMMAND...: a log per step and its exit status
    name=$1 secs=$2; shift 2
    case " $steps " in *" ${name#gpu_} "*) ;; *) return 0 ;; esac
    start=$(date +%s)
    timeout -k 5 "$secs" "$@" > "$out/$name.log" 2>&1
    echo "$name: exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/steps.log"
}
{ nvidia-smi; nvidia-smi -q -d CLOCK; command -v nvcc && nvcc --version; nproc
  grep -m1 'model name' /proc/cpuinfo; } > "$out/host.log" 2>&1
# the build's absolute paths (/work/main/...) lead here
[ "$(pwd -P)" = /work/main ] || { mkdir -p /work && ln -sfn "$(pwd -P)" /work/main; }
sh tools/gpu_kit.sh unpack "$kit" >> "$out/host.log" 2>&1 || { echo "unpack failed" | tee -a "$out/steps.log"; exit 1; }
. /opt/kiln-kit/env.sh
{ cat /opt/kiln-kit/env.sh; ldd build/trainer/kiln-train
  timeout 30 mpirun -np 2 --bind-to none hostname; } >> "$out/host.log" 2>&1
step gpu_bench 90 build/bench/gpu_bench
step ctest 200 sh -c 'cd build && ctest -L gpu --output-on-failure --timeout 150'
# an nsys that can write its report: one with QdstrmImporter beside it
nsys=
for n in $(command -v nsys) /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys \
         /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys; do
    [ -x "$n" ] || continue
    d=$(dirname "$(readlink -f "$n")")
    ls "$d"/../*/QdstrmImporter >/dev/null 2>&1 && { nsys=$n; break; }
    nsys=${nsys:-$n}
done
echo "nsys: ${nsys:-none}" >> "$out/host.log"
step gpu_profile 150 env NSYS="${nsys:-nsys}" PYTHONUNBUFFERED=1 python3 bench/gpu_train.py --build build \
    --rows ${KILN_GPU_ROWS:-400000} --models lr,dlrm --profile "$out/nsys" ${KILN_GPU_TRAIN_ARGS:-}
step gpu_train 180 env PYTHONUNBUFFERED=1 python3 bench/gpu_train.py --build build \
    --threads 2,0 --rows ${KILN_GPU_ROWS:-400000} --repeat 3 ${KILN_GPU_TRAIN_ARGS:-}
cp build/Testing/Temporary/LastTest.log "$out/" 2>/dev/null
# the reports' tables are in the .txt files; the raw traces only while small
find "$out/nsys" \( -name '*.sqlite' -o -name '*.qdstrm' -o -size +8M \) -delete 2>/dev/null
