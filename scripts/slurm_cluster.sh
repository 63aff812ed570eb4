#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests and for trying hydra/launcher=slurm:
#
#   scripts/slurm_cluster.sh start    # install slurm-wlm + munge if missing, write the config, start, wait for idle
#   scripts/slurm_cluster.sh status   # the node as sinfo sees it
#   scripts/slurm_cluster.sh env      # the line to export so sbatch/srun/sinfo (and submitit) find the cluster
#   scripts/slurm_cluster.sh stop     # stop the daemons this script started
#
# Everything it writes (slurm.conf, the munge key and socket, spool, state, logs, pid files)
# goes under $DANE_SLURM_DIR (default /tmp/dane-slurm), never /etc or the repository; the
# client commands find the cluster through SLURM_CONF=$DANE_SLURM_DIR/slurm.conf.
# One node (this host's name, nproc CPUs, 90% of its memory), one default partition `debug`,
# no accounting, no cgroup plugins (proctrack/linuxproc, task/none: they work in containers).
# Daemons run as root (SlurmUser=root), so run this as root.  Start and stop are idempotent.
set -euo pipefail

STATE=${DANE_SLURM_DIR:-/tmp/dane-slurm}
CONF="$STATE/slurm.conf"
SOCKET="$STATE/munge/munge.socket"
NODE=$(hostname -s)
WAIT_S=${DANE_SLURM_WAIT_S:-60}
export SLURM_CONF="$CONF"

die() { echo "slurm_cluster: $*" >&2; exit 1; }
say() { echo "slurm_cluster: $*"; }

alive() {  # alive <pid file>: the process it names is running
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sinfo >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "slurm is not installed and installing needs root: apt-get install slurm-wlm munge"
    command -v apt-get >/dev/null || die "slurm is not installed and there is no apt-get here: install slurm-wlm and munge"
    say "installing slurm-wlm and munge with apt-get (log: $STATE/log/apt.log)"
    mkdir -p "$STATE/log"
    # policy-rc.d keeps the packages from starting Debian's own daemons (with /etc's config) here
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurm-wlm munge; } >"$STATE/log/apt.log" 2>&1; then
        die "apt-get install slurm-wlm munge failed (last line: $(tail -1 "$STATE/log/apt.log")); see $STATE/log/apt.log"
    fi
}

plugin_dir() {  # where Debian puts Slurm's plugins
    local dir
    for dir in /usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib/aarch64-linux-gnu/slurm-wlm /usr/lib/slurm-wlm \
               /usr/lib64/slurm /usr/lib/slurm; do
        [ -e "$dir/select_cons_tres.so" ] && { echo "$dir"; return; }
    done
    die "no Slurm plugin folder with select_cons_tres.so found; is slurm-wlm-basic-plugins installed?"
}

write_config() {
    local cpus mem_mib
    cpus=$(nproc)
    mem_mib=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$STATE/munge" "$STATE/log" "$STATE/ctld" "$STATE/spool"
    chmod 755 "$STATE/munge"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$STATE/munge/munge.key"
    fi
    cat >"$CONF" <<EOF
# Written by scripts/slurm_cluster.sh: a single-node test cluster; everything under $STATE.
ClusterName=dane
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
PluginDir=$(plugin_dir)
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# no cgroups: process tracking by /proc, no task binding (both work in a container)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# a task that fails ends its job step, so the other workers do not wait for it in a collective
KillOnBadExit=1
MailProg=/bin/true
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

node_state() {  # the node's state as sinfo prints it (idle, mix, alloc, down*, drain, ...), or nothing
    sinfo -h -N -n "$NODE" -o '%t' 2>/dev/null | head -1
}

start() {
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && alive "$STATE/munge/munged.pid"; then
        say "already running (node $NODE: $(node_state)); export SLURM_CONF=$CONF"
        return
    fi
    [ "$(id -u)" -eq 0 ] || die "the daemons run as root (SlurmUser=root); run this as root"
    install_packages
    if [ -e /etc/slurm/slurm.conf ] && pgrep -x slurmctld >/dev/null && ! alive "$STATE/slurmctld.pid"; then
        die "another slurmctld (not started by this script) is running here; stop it or use that cluster"
    fi
    write_config
    if ! alive "$STATE/munge/munged.pid"; then
        # --force: munged refuses a socket under a world-writable /tmp without it
        munged --force --key-file="$STATE/munge/munge.key" --socket="$SOCKET" \
            --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
            --seed-file="$STATE/munge/munged.seed" \
            || die "munged did not start; see $STATE/log/munged.log"
    fi
    if ! alive "$STATE/slurmctld.pid"; then
        slurmctld -i || die "slurmctld did not start; see $STATE/log/slurmctld.log"
    fi
    if ! alive "$STATE/slurmd.pid"; then
        slurmd || die "slurmd did not start; see $STATE/log/slurmd.log"
    fi
    local waited=0 state=""
    while [ "$waited" -lt "$WAIT_S" ]; do
        state=$(node_state)
        case "$state" in
            idle|mix|alloc) say "node $NODE is $state; export SLURM_CONF=$CONF"; return ;;
            drain*|down*) [ "$waited" -ge 5 ] && scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 1
        waited=$((waited + 1))
    done
    die "node $NODE is not idle after ${WAIT_S}s (sinfo: ${state:-no answer}); see $STATE/log/slurmctld.log and slurmd.log"
}

stop() {
    local name pidfile pid stopped=0
    for name in slurmd slurmctld munge/munged; do
        pidfile="$STATE/$name.pid"
        alive "$pidfile" || continue
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && die "${name#munge/} (pid $pid) did not stop after 10 s"
        rm -f "$pidfile"
        stopped=$((stopped + 1))
    done
    say "stopped $stopped daemon(s)"
}

status() {
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid"; then
        say "running (SLURM_CONF=$CONF)"
        sinfo
    else
        say "not running (start it with: scripts/slurm_cluster.sh start)"
        return 1
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) die "usage: scripts/slurm_cluster.sh start|stop|status|env (got '${1:-}')" ;;
esac
