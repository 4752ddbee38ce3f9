#!/bin/sh
# tests/package_deps.sh DEB SOURCE_DIR - the .deb installs what it needs
# (issue 26): every library a program of the package loads (its NEEDED
# entries, readelf -d) must come from a package its Depends names, directly
# or through what a named package depends on or provides (libopenblas0 ->
# libopenblas0-pthread); a library no Debian package owns (NVIDIA's runfile
# CUDA) must be covered by a Depends entry named after it (libcudart.so.13 ->
# cuda-cudart-13-0; a Recommends entry where no apt source has it). And the kilnd unit's KILN_HOME is what docs/cluster.md
# and the settings example say. Exit 0 ok, 1 with every problem on stderr.
set -eu
deb=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp/root"
depends=$(dpkg-deb -f "$deb" Depends)
recommends=$(dpkg-deb -f "$deb" Recommends)
echo "Depends: $depends"
echo "Recommends: $recommends"
# Libraries no Debian package owns (NVIDIA's runfile CUDA) are named in
# Depends or, where no apt source has them, in Recommends.
echo "$depends,$recommends" | tr ',|' '\n\n' | sed 's/(.*)//; s/^ *//; s/ *$//; /^$/d' >"$tmp/named"
# The package names of Depends, alternatives included, one per line.
echo "$depends" | tr ',|' '\n\n' | sed 's/(.*)//; s/^ *//; s/ *$//; /^$/d' >"$tmp/names"
# And what those depend on or provide (one level: enough for the virtual and
# meta packages the shlibs files name).
while read -r name; do
    dpkg-query -W -f '${Depends},${Pre-Depends},${Provides}\n' "$name" 2>/dev/null |
        tr ',|' '\n\n' | sed 's/(.*)//; s/:any//; s/^ *//; s/ *$//; /^$/d'
done <"$tmp/names" >"$tmp/reach"
cat "$tmp/names" >>"$tmp/reach"

fail=0
problem() {
    echo "package_deps: $*" >&2
    fail=1
}

# The package owning file (the path as ldd gives it, its real path, or the
# other half of a merged /usr), or nothing.
owner() {
    for p in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
        o=$(dpkg -S "$p" 2>/dev/null | sed -n '1s/[:,].*//p') || true
        if [ -n "$o" ]; then
            echo "$o"
            return
        fi
    done
}

for bin in "$tmp"/root/usr/bin/*; do
    prog=$(basename "$bin")
    ldd "$bin" >"$tmp/ldd" 2>&1 || true
    for lib in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(awk -v l="$lib" '$1 == l && $2 == "=>" { print $3; exit }
                                 substr($1, length($1) - length(l)) == "/" l { print $1; exit }' "$tmp/ldd")
        if [ -z "$path" ] || [ ! -e "$path" ]; then
            problem "$prog needs $lib, which is not found on this machine"
            continue
        fi
        pkg=$(owner "$path")
        if [ -n "$pkg" ]; then
            grep -qx "$pkg" "$tmp/reach" ||
                problem "$prog needs $lib ($path, package $pkg), which Depends does not bring"
        else
            # libcudart.so.13 -> cudart; libcublasLt.so.13 -> cublas
            stem=$(echo "$lib" | sed 's/^lib//; s/\.so.*//; s/Lt$//' | tr 'A-Z' 'a-z')
            grep -q "$stem" "$tmp/named" ||
                problem "$prog needs $lib ($path, in no Debian package), and no Depends or Recommends entry names $stem"
        fi
    done
done

# The kilnd unit's KILN_HOME: the settings example says how to change it, and
# docs/cluster.md names it where it says that runs need KILN_HOME shared.
home=$(sed -n 's/^Environment=KILN_HOME=//p' "$tmp"/root/usr/lib/systemd/system/kilnd.service)
[ -n "$home" ] || problem "kilnd.service sets no KILN_HOME"
grep -q "^#KILN_HOME=" "$tmp"/root/usr/share/doc/kiln/examples/kiln.default ||
    problem "kiln.default does not show how to set KILN_HOME (on the shared filesystem for slurm and hostfile runs)"
# One paragraph of docs/cluster.md says both: the unit's home, and how to put
# it on the shared filesystem.
awk -v home="\`$home\`" 'BEGIN { RS = "" } index($0, home) && index($0, "KILN_HOME=") &&
    index($0, "/etc/default/kilnd") && index($0, "shared filesystem") { found = 1 }
    END { exit !found }' "$src/docs/cluster.md" ||
    problem "no paragraph of docs/cluster.md says that the unit's KILN_HOME is $home and how to put it on the shared filesystem (KILN_HOME= in /etc/default/kilnd)"
exit $fail
