#!/usr/bin/env bash
# tools/deps.sh - installs the Debian 12 packages Kiln builds, tests and runs
# with. Skips apt entirely when everything is already there; otherwise runs
# `apt-get update` then `apt-get install -y` (as root, or through sudo).
# Then installs the npm packages the Parquet tests write their files with
# (tests/parquet/package.json: DuckDB and Arrow's Rust writer, which Debian
# does not ship) into tests/parquet/node_modules, with `npm ci` from the
# lock file, unless they are there already.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config git
  libyaml-dev libsqlite3-dev sqlite3 libcurl4-openssl-dev
  libopenmpi-dev openmpi-bin libcmocka-dev libmicrohttpd-dev libjansson-dev
  libopenblas-dev libxxhash-dev python3 curl
  liburing-dev  # the disk tier of tables larger than memory batches its I/O (kernels/kern_tier.c)
  zlib1g-dev libzstd-dev gzip zstd  # compressed training data (data/data_src.c and its tests)
  libsnappy-dev  # SNAPPY pages of Parquet files (data/data_parquet.c): libsnappy is the field's own codec library
  chromium prometheus  # the web tests: headless browser, promtool (Prometheus parser)
  clang libclang-rt-14-dev
  libdnnl-dev  # oneDNN: the bf16 dense layers (model/model_bf16.c, model.dense_precision: bf16)
  libblis-dev  # bench/gemm_bench's other candidate for the dense layers
  # the cluster tests (tools/testcluster.sh): Slurm, munge, sshd, namespaces;
  # libpmix-dev holds the libpmix.so that Slurm's mpi/pmix plugin loads
  slurmctld slurmd slurm-client munge openssh-server openssh-client libpmix-dev
  iproute2 util-linux dpkg-dev
  nodejs  # tests/parquet/write.mjs runs the npm Parquet writers (tests/test_parquet.c)
)
# npm comes with a nodejs from nodesource; Debian's nodejs needs Debian's npm.
if ! command -v npm >/dev/null 2>&1; then
  packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "kiln: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "kiln: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! (cd "$root/tests/parquet" && npm ls --depth=0 >/dev/null 2>&1); then
  echo "kiln: installing the Parquet test writers (npm ci in tests/parquet)" >&2
  (cd "$root/tests/parquet" && npm ci --no-audit --no-fund)
fi
