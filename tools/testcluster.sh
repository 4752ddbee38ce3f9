#!/usr/bin/env bash
# tools/testcluster.sh - a small Slurm + ssh cluster on this one machine, for
# Kiln's `cluster` tests (docs/cluster.md, "The test cluster").
#
#   tools/testcluster.sh up [--nodes N] [--package FILE.deb]
#   tools/testcluster.sh down
#   tools/testcluster.sh status
#   tools/testcluster.sh exec CMD...          run CMD on the head host
#   tools/testcluster.sh on NODE CMD...       run CMD on a node (kn1, kn2, ...)
#   tools/testcluster.sh crash NODE           the node dies: slurmd killed, the
#                                             rest of its processes frozen
#   tools/testcluster.sh reboot NODE          kill what runs on it, start its
#                                             sshd and slurmd again
#   tools/testcluster.sh run [up options] -- CMD...
#                                             up, CMD on the head, down (always);
#                                             exits with CMD's status
#
# Hosts are network namespaces with addresses of their own on a private
# bridge (default 10.213.0.0/24) that lives inside the head's namespace, so
# the machine's own network namespace, interfaces, routes and firewall are
# never touched. Each host also has its own hostname (a UTS namespace) and
# mount namespace; a node's /tmp, /dev/shm and /run are its own (as on a real
# node), and the cluster directory is mounted back at the same path on every
# host: it stands in for the cluster's shared filesystem (data, checkpoints,
# Kiln's home). With --package, every host sees the .deb's files under /usr
# (an overlay in its mount namespace): the nodes run what the package installs,
# and nothing is installed on this machine; `up` first checks with apt-get
# (simulated) that the package's dependencies are all installed here.
#
# The head (hostname kiln-head, 10.213.0.1) runs munged and slurmctld; node
# kn<i> (10.213.0.1<i>) runs slurmd and sshd. Slurm, munge and sshd are the
# Debian packages, each pointed at files in the cluster directory by its own
# options (slurm.conf via -f / SLURM_CONF, munged --key-file/--socket, sshd -f),
# never at /etc. Commands run on the head with SLURM_CONF and the ssh settings
# for mpirun --hostfile in their environment (see `env` in the cluster dir).
#
# Environment: KILN_CLUSTER_NAME (default kiln: namespaces kiln-head,
# kiln-kn1, ...; directory /tmp/kiln-cluster), KILN_CLUSTER_NET (default
# 10.213.0), KILN_CLUSTER_KEEP=1 keeps the directory after `down`.
set -euo pipefail

name="${KILN_CLUSTER_NAME:-kiln}"
net="${KILN_CLUSTER_NET:-10.213.0}"
dir="/tmp/${name}-cluster"
here="$(cd "$(dirname "$0")" && pwd)"

die() { echo "testcluster: $*" >&2; exit 1; }
say() { echo "testcluster: $*" >&2; }

# ---- helpers ----------------------------------------------------------------------
nodes_of() { cat "$dir/nodes" 2>/dev/null || true; }
holder() { cat "$dir/run/holder-$1.pid" 2>/dev/null || true; }

# Runs a command inside host $1's namespaces (network, hostname, mounts).
in_host() {
  local h="$1"; shift
  local pid; pid="$(holder "$h")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || die "host $h is not up (tools/testcluster.sh status)"
  nsenter -t "$pid" -n -u -m -- "$@"
}

need() {
  local missing=()
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing what ${missing[*]} come from (tools/deps.sh)"
    "$here/deps.sh"
  fi
}

# ---- down -------------------------------------------------------------------------
down() {
  local ns left
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-(head|kn[0-9]+)$" || true); do
    # Every process of the host: daemons, job steps, ranks, ssh sessions.
    for sig in TERM KILL; do
      left="$(ip netns pids "$ns" 2>/dev/null || true)"
      [ -z "$left" ] && break
      kill -s "$sig" $left 2>/dev/null || true
      for _ in $(seq 30); do
        [ -z "$(ip netns pids "$ns" 2>/dev/null || true)" ] && break
        sleep 0.1
      done
    done
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -d "$dir" ] && [ "${KILN_CLUSTER_KEEP:-0}" != "1" ]; then
    rm -rf "$dir"
  fi
}

# ---- up ---------------------------------------------------------------------------
write_configs() {
  local n="$1" i nodelist=""
  mkdir -p "$dir"/{etc,run,log,state,spool,shared,munge/key,munge/sock}
  chmod 755 "$dir"
  for i in $(seq "$n"); do nodelist="${nodelist:+$nodelist,}kn$i"; done
  seq "$n" | sed 's/^/kn/' > "$dir/nodes"
  for i in $(seq "$n"); do mkdir -p "$dir/spool/kn$i"; done

  # munge: one key for the cluster (as every real node shares one).
  dd if=/dev/urandom of="$dir/munge/key/munge.key" bs=1024 count=1 status=none
  chmod 700 "$dir/munge/key"; chmod 400 "$dir/munge/key/munge.key"
  chmod 755 "$dir/munge/sock"

  cat > "$dir/etc/slurm.conf" <<EOF
# The Kiln test cluster (tools/testcluster.sh): no accounting database; jobs
# are followed with squeue/scontrol while slurmctld remembers them (MinJobAge).
ClusterName=${name}test
SlurmctldHost=kiln-head($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/sock/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# No cgroups: the nodes share this machine's kernel; a process tree is a job.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
# A node whose slurmd stops answering is DOWN after 10 s (its jobs end
# NODE_FAIL); it returns to service when its slurmd registers again.
SlurmdTimeout=10
ReturnToService=2
SlurmctldTimeout=10
MessageTimeout=10
KillWait=2
InactiveLimit=0
MinJobAge=300
# Jobs in the partition "urgent" preempt (cancel) jobs in "kiln".
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmdParameters=config_overrides
MailProg=/bin/true
EOF
  for i in $(seq "$n"); do
    echo "NodeName=kn$i NodeAddr=$net.1$i NodeHostname=kn$i CPUs=2 State=UNKNOWN" >> "$dir/etc/slurm.conf"
  done
  cat >> "$dir/etc/slurm.conf" <<EOF
PartitionName=kiln Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=$nodelist MaxTime=INFINITE State=UP PriorityTier=2
EOF
  # Slurm 22.05 always loads a cgroup plugin; v1 with no automount touches
  # nothing when proctrack and task plugins do not use it.
  printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' > "$dir/etc/cgroup.conf"

  # ssh for mpirun --hostfile: one host key for the nodes, one client key.
  ssh-keygen -q -t ed25519 -N '' -C kiln-testcluster-host -f "$dir/etc/ssh_host_key"
  ssh-keygen -q -t ed25519 -N '' -C kiln-testcluster-client -f "$dir/etc/id_ed25519"
  cp "$dir/etc/id_ed25519.pub" "$dir/etc/authorized_keys"
  echo "$net.* $(cut -d' ' -f1,2 "$dir/etc/ssh_host_key.pub")" > "$dir/etc/known_hosts"
  cat > "$dir/etc/sshd_config" <<EOF
HostKey $dir/etc/ssh_host_key
AuthorizedKeysFile $dir/etc/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 64
EOF
  cat > "$dir/etc/ssh_config" <<EOF
Host *
  IdentityFile $dir/etc/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $dir/etc/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
  LogLevel ERROR
EOF
  : > "$dir/etc/hostfile"
  for i in $(seq "$n"); do echo "$net.1$i slots=2" >> "$dir/etc/hostfile"; done

  cat > "$dir/env" <<EOF
export SLURM_CONF=$dir/etc/slurm.conf
export KILN_CLUSTER_DIR=$dir
export KILN_CLUSTER_SHARED=$dir/shared
export KILN_CLUSTER_HOSTFILE=$dir/etc/hostfile
export KILN_CLUSTER_NODES="$(nodes_of | tr '\n' ' ' | sed 's/ $//')"
export KILN_CLUSTER_SUBNET=$net.0/24
export OMPI_MCA_plm_rsh_agent="ssh -F $dir/etc/ssh_config"
EOF
  if [ -n "$package" ]; then
    echo "export KILN_CLUSTER_PREFIX=/usr" >> "$dir/env"
  fi
}

# The package's dependencies must all be installed (the nodes share this
# machine's root filesystem): apt-get, simulating, must have nothing else to add.
check_package() {
  local out extra
  if ! out="$(apt-get -s -q --no-install-recommends install "$(realpath "$1")" 2>&1)"; then
    echo "$out" >&2
    die "apt-get cannot install $1 here (see above)"
  fi
  extra="$(awk '$1 == "Inst" && $2 != "kiln" {print $2}' <<<"$out" | tr '\n' ' ')"
  [ -z "$extra" ] || die "$1 needs packages this machine lacks: $extra(tools/deps.sh)"
}

# Every process of a host but its holder.
host_pids() {
  local ns="$name-$1" keep; keep="$(holder "$1")"
  ip netns pids "$ns" 2>/dev/null | grep -vx "$keep" || true
}

start_node_daemons() { # $1 index
  in_host "kn$1" /usr/sbin/sshd -f "$dir/etc/sshd_config" -o "ListenAddress=$net.1$1" \
    -o "PidFile=$dir/run/sshd-kn$1.pid" -E "$dir/log/sshd-kn$1.log"
  in_host "kn$1" slurmd -f "$dir/etc/slurm.conf" -N "kn$1"
}

# The script a host's namespaces are set up by; it ends as the host's holder
# process (a sleep) that later commands enter with nsenter.
write_hostinit() {
  cat > "$dir/etc/hostinit.sh" <<'EOF'
#!/bin/sh
# $1: hostname, $2: head|node, $3: cluster dir, $4: package root ("" for none)
set -e
hostname "$1"
mount --make-rprivate /
if [ "$2" = node ]; then
  # A node's own /tmp, /dev/shm and /run; the cluster dir (the "shared
  # filesystem") is mounted back at its path from a descriptor opened first.
  exec 3<"$3"
  mount -t tmpfs -o mode=1777,size=2g "kiln-$1-tmp" /tmp
  mount -t tmpfs -o mode=1777,size=2g "kiln-$1-shm" /dev/shm
  mount -t tmpfs -o mode=755,size=64m "kiln-$1-run" /run
  mkdir -p "$3" /run/sshd
  mount --no-canonicalize --bind /proc/self/fd/3 "$3"
  exec 3<&-
fi
if [ -n "$4" ]; then
  mount -t overlay "kiln-$1-usr" -o "lowerdir=$4/usr:/usr" /usr
fi
echo $$ > "$3/run/holder-$1.pid"
exec sleep 2147483647
EOF
  chmod 755 "$dir/etc/hostinit.sh"
}

start_host() { # $1 namespace, $2 hostname, $3 role
  # In a subshell: the holder is not this script's job (no "Killed" at down).
  (setsid ip netns exec "$1" unshare --uts --mount --propagation private --fork -- \
    "$dir/etc/hostinit.sh" "$2" "$3" "$dir" "$pkgroot" \
    > "$dir/log/host-$2.log" 2>&1 < /dev/null &)
  for _ in $(seq 100); do
    [ -s "$dir/run/holder-$2.pid" ] && kill -0 "$(holder "$2")" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$dir/log/host-$2.log" >&2
  die "host $2 did not start"
}

wait_idle() {
  local n="$1" out=""
  for _ in $(seq 300); do
    out="$(in_host kiln-head env SLURM_CONF="$dir/etc/slurm.conf" sinfo -h -N -p kiln -o '%N %t' 2>/dev/null || true)"
    [ "$(grep -c ' idle$' <<<"$out")" -eq "$n" ] && return 0
    sleep 0.1
  done
  echo "$out" >&2
  tail -n 20 "$dir"/log/slurm*.log >&2 || true
  die "the nodes did not become idle in 30 s"
}

up() {
  local n=2 package=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) n="$2"; shift 2 ;;
      --package) package="$2"; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, mounts)"
  [ "$n" -ge 1 ] && [ "$n" -le 8 ] || die "--nodes takes 1 to 8"
  need slurmctld slurmd sinfo munged sshd ssh ssh-keygen nsenter unshare ip
  if [ -n "$package" ]; then
    [ -f "$package" ] || die "no package $package"
    check_package "$package"
  fi
  down # whatever a killed earlier run left behind
  local t0=$EPOCHREALTIME
  write_configs "$n"
  write_hostinit
  pkgroot=""
  if [ -n "$package" ]; then
    pkgroot="$dir/pkgroot"
    dpkg-deb -x "$package" "$pkgroot"
    echo "$package" > "$dir/package"
  fi

  # The network: a bridge inside the head's namespace, a veth pair per node.
  trap 'say "up failed; tearing down"; down' EXIT
  ip netns add "$name-head"
  ip -n "$name-head" link set lo up
  ip -n "$name-head" link add br0 type bridge
  ip -n "$name-head" addr add "$net.1/24" dev br0
  ip -n "$name-head" link set br0 up
  for i in $(seq "$n"); do
    ip netns add "$name-kn$i"
    ip -n "$name-kn$i" link set lo up
    ip -n "$name-head" link add "v$i" type veth peer name eth0 netns "$name-kn$i"
    ip -n "$name-head" link set "v$i" master br0 up
    ip -n "$name-kn$i" addr add "$net.1$i/24" dev eth0
    ip -n "$name-kn$i" link set eth0 up
  done

  start_host "$name-head" kiln-head head
  for i in $(seq "$n"); do start_host "$name-kn$i" "kn$i" node; done

  in_host kiln-head munged --force --socket="$dir/munge/sock/munge.socket" \
    --key-file="$dir/munge/key/munge.key" --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" --origin="$net.1"
  in_host kiln-head slurmctld -f "$dir/etc/slurm.conf" -i
  for i in $(seq "$n"); do start_node_daemons "$i"; done
  wait_idle "$n"
  trap - EXIT
  say "up: $n node(s) in $(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $t0}") s; $dir"
}

status() {
  [ -f "$dir/nodes" ] || { echo "down"; return 1; }
  local h ok=0
  for h in kiln-head $(nodes_of); do
    if kill -0 "$(holder "$h")" 2>/dev/null; then echo "$h: up"; else echo "$h: DOWN"; ok=1; fi
  done
  in_host kiln-head env SLURM_CONF="$dir/etc/slurm.conf" sinfo -N -o '%N %t %C %E' || ok=1
  in_host kiln-head env SLURM_CONF="$dir/etc/slurm.conf" squeue || ok=1
  return $ok
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  exec)
    [ $# -gt 0 ] || die "exec: no command"
    # In the caller's directory (the same path on the head), the cluster's env.
    in_host kiln-head sh -c 'cd "$2" 2>/dev/null || cd /; . "$1"; shift 2; exec "$@"' \
      sh "$dir/env" "$PWD" "$@" ;;
  on)
    [ $# -gt 1 ] || die "on: NODE CMD..."
    node="$1"; shift
    in_host "$node" "$@" ;;
  crash)
    node="${1:?crash: which node}"
    [ -n "$(holder "$node")" ] || die "no node $node"
    kill -KILL "$(cat "$dir/run/slurmd-$node.pid")" 2>/dev/null || true
    pids="$(host_pids "$node")"
    [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
    say "$node crashed: slurmd killed, $(wc -w <<<"$pids") process(es) frozen" ;;
  reboot)
    node="${1:?reboot: which node}"
    [ -n "$(holder "$node")" ] || die "no node $node"
    for _ in $(seq 50); do
      pids="$(host_pids "$node")"
      [ -z "$pids" ] && break
      kill -KILL $pids 2>/dev/null || true
      sleep 0.1
    done
    # Its /tmp and /dev/shm (its own tmpfs) start empty, as after a real
    # reboot; the cluster dir in /tmp is the shared filesystem and stays.
    in_host "$node" find /tmp /dev/shm -mindepth 1 -maxdepth 1 ! -path "$dir" \
      -exec rm -rf {} +
    start_node_daemons "${node#kn}"
    wait_idle "$(nodes_of | wc -l)"
    say "$node rebooted" ;;
  run)
    upargs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do upargs+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "run: no command after --"
    if [ "$(id -u)" -ne 0 ]; then # a developer's machine: CI runs as root
      say "needs root (network namespaces, mounts): $* skipped"
      exit 77
    fi
    trap 'exit 143' TERM INT
    up "${upargs[@]}" # tears down itself when it fails
    trap 'down' EXIT
    rc=0
    "$0" exec "$@" || rc=$?
    exit "$rc" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
