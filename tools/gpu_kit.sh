#!/bin/sh
# tools/gpu_kit.sh - carry a CUDA build of Kiln to a GPU host that has a
# driver and the CUDA toolkit but none of Kiln's Debian dependencies.
#
#   tools/gpu_kit.sh pack BUILD KIT.tar.gz   (on the Debian build machine)
#   tools/gpu_kit.sh unpack KIT.tar.gz       (on the GPU host, as root; prints
#                                             the environment to source)
#
# pack takes the build tree (no objects, no packages), every shared library
# its programs and Open MPI's plugins need except glibc, the C++ runtime and
# CUDA's own (the host's toolkit provides those), and Debian's Open MPI
# (mpirun, its plugins, help files and config). unpack puts the build back at
# its absolute path, the libraries under /opt/kiln-kit/lib and Open MPI at its
# Debian paths (only where those paths are free), and writes
# /opt/kiln-kit/env.sh. docs/gpu.md says how a GPU session used it.
set -eu

skip='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia)\.'

pack() {
    build=$(cd "$1" && pwd); kit=$2
    stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/opt/kiln-kit/lib" "$stage/opt/kiln-kit/bin"
    # the build, as it lies, without what only a rebuild needs
    (cd / && tar cf - --exclude='*.o' --exclude='*.a' --exclude="${build#/}/package" \
        --exclude="${build#/}/_CPack_Packages" "${build#/}") | (cd "$stage" && tar xf -)
    # Debian's Open MPI and PMIx at their own paths
    for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
             /usr/share/openmpi /usr/share/pmix /etc/openmpi; do
        [ -e "$d" ] && (cd / && tar cf - "${d#/}") | (cd "$stage" && tar xf -)
    done
    cp -L /usr/bin/orterun /usr/bin/orted "$stage/opt/kiln-kit/bin/"
    ln -s orterun "$stage/opt/kiln-kit/bin/mpirun"
    ln -s orterun "$stage/opt/kiln-kit/bin/mpiexec"
    # every library those need, resolved here
    find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) | while read -r f; do
        file -b "$f" | grep -q '^ELF' || continue
        ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
    done | sort -u | while read -r lib; do
        base=$(basename "$lib")
        echo "$base" | grep -Eq "$skip" && continue
        [ -e "$stage/opt/kiln-kit/lib/$base" ] || cp -L "$lib" "$stage/opt/kiln-kit/lib/$base"
    done
    # Nsight Systems' report importer on the GPU hosts seen so far lacks
    # elfutils' libraries (QdstrmImporter: libdw.so.1 not found)
    for l in libdw.so.1 libelf.so.1; do
        [ -e "/usr/lib/x86_64-linux-gnu/$l" ] && cp -L "/usr/lib/x86_64-linux-gnu/$l" "$stage/opt/kiln-kit/lib/"
    done
    # no debug info and no headers: the device tool carries 64 MiB in all
    rm -rf "$stage/usr/lib/x86_64-linux-gnu/openmpi/include"
    find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) | while read -r f; do
        file -b "$f" | grep -q '^ELF' && strip --strip-debug "$f"
    done
    tar czf "$kit" -C "$stage" .
    echo "packed $(du -h "$kit" | cut -f1) into $kit"
}

unpack() {
    kit=$1
    stage=$(mktemp -d)
    tar xzf "$kit" -C "$stage"
    mkdir -p /opt
    rm -rf /opt/kiln-kit && mv "$stage/opt/kiln-kit" /opt/kiln-kit
    for d in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 \
             usr/share/openmpi usr/share/pmix etc/openmpi; do
        [ -e "$stage/$d" ] || continue
        if [ -e "/$d" ]; then
            # the host has an Open MPI or PMIx of its own (the first GPU
            # host had Ubuntu's plugins, no mpirun): the kit's goes beside it
            # and env.sh points Open MPI's and PMIx's plugin paths there
            echo "the host has /$d: the kit's is under /opt/kiln-kit/alt"
            mkdir -p "/opt/kiln-kit/alt/$(dirname "$d")" && mv "$stage/$d" "/opt/kiln-kit/alt/$d"
            continue
        fi
        mkdir -p "/$(dirname "$d")" && mv "$stage/$d" "/$d"
    done
    # the build tree: whatever else the kit holds, at its absolute path (a
    # symlink on the way, to where the repository lies on this host, is kept)
    tops=$(cd "$stage" && find . -mindepth 1 -maxdepth 1 ! -name opt ! -name usr ! -name etc)
    (cd "$stage" && tar cf - $tops) | tar xf - -C / --keep-directory-symlink
    [ -e /usr/bin/orted ] || ln -s /opt/kiln-kit/bin/orted /usr/bin/orted
    ompi=/usr/lib/x86_64-linux-gnu/openmpi pmix=/usr/lib/x86_64-linux-gnu/pmix2 mca=
    if [ -d "/opt/kiln-kit/alt$ompi" ]; then
        ompi=/opt/kiln-kit/alt$ompi
        mca="export OMPI_MCA_mca_base_component_path=$ompi/lib/openmpi3"
    fi
    [ -d "/opt/kiln-kit/alt$pmix" ] &&
        mca="$mca${mca:+
}export PMIX_MCA_mca_base_component_path=/opt/kiln-kit/alt$pmix/lib/pmix PMIX_MCA_pcompress_base_silence_warning=1"
    cuda=$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/..
    nccl=$(find / -xdev -name 'libnccl.so.2' -not -path '*/kiln-kit/*' 2>/dev/null | head -1)
    cat > /opt/kiln-kit/env.sh <<ENV
export PATH=/opt/kiln-kit/bin:\$PATH
export LD_LIBRARY_PATH=/opt/kiln-kit/lib:$ompi/lib:$cuda/lib64:$cuda/lib:${nccl:+$(dirname "$nccl"):}\${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
$mca
ENV
    rm -rf "$stage"
    echo "unpacked; nccl: ${nccl:-none found}; source /opt/kiln-kit/env.sh"
}

case "${1:-}" in
pack) [ $# -eq 3 ] || { echo "usage: $0 pack BUILD KIT.tar.gz" >&2; exit 2; }; pack "$2" "$3" ;;
unpack) [ $# -eq 2 ] || { echo "usage: $0 unpack KIT.tar.gz" >&2; exit 2; }; unpack "$2" ;;
*) echo "usage: $0 pack BUILD KIT.tar.gz | unpack KIT.tar.gz" >&2; exit 2 ;;
esac
