#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, so that the workflow's SLURM tests submit real sbatch jobs.
# Idempotent and non-interactive; run as root on Debian bookworm (CI), from anywhere:
#     bash .ci/slurm-setup.sh
# Steps (each skipped when already done):
#   1. apt-get install slurm-wlm munge, if slurmctld, slurmd or munged is missing;
#   2. a munge key (Debian's package makes one; we make one if it did not) and munged, unless `munge -n | unmunge`
#      already works;
#   3. /etc/slurm/slurm.conf naming this host (CPUs and memory measured here, MinJobAge=600 so that `squeue` still
#      sees finished jobs when the snakemake slurm plugin polls; no accounting database, no cgroups), written
#      only when its content changes; a changed file restarts the daemons (and stops the two loopback nodes of
#      .ci/slurm-two-nodes.sh, which that script starts again);
#   4. slurmctld and slurmd as root, unless `scontrol ping` answers and this node is up; wait (SLURM_WAIT s,
#      default 60) until `sinfo` shows the node idle/mixed/allocated, and resume it if it came up "down".
# Environment: SLURM_LOG_DIR (default /var/log/slurm), SLURM_WAIT (default 60), SLURM_PARTITION (default "main").
# The same slurm.conf also declares partition "two": nodes harness-n1 and harness-n2, which only
# .ci/slurm-two-nodes.sh starts (each slurmd in namespaces of its own, on 127.0.0.2 and 127.0.0.3); until then
# they are down and the partition idle, which the one-node tests never notice (they use the default partition).
# Why these choices: the README promises `snakemake --profile slurm`, so it is tested for real. One node that is both the
# controller and the compute node is the smallest real cluster; proctrack/linuxproc and task/none need no cgroup
# support (containers and sandboxes often lack it); accounting_storage/none means `sacct` has nothing to say, which
# is why the profile sets `slurm-status-command: squeue` and this file sets MinJobAge=600.
set -euo pipefail

log() { echo "[slurm-setup] $*" >&2; }
log_dir="${SLURM_LOG_DIR:-/var/log/slurm}"
wait_s="${SLURM_WAIT:-60}"
partition="${SLURM_PARTITION:-main}"

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (installs packages, writes /etc/slurm, starts daemons)"
    exit 1
fi

# 1. packages
missing=()
for cmd in slurmctld slurmd munged sbatch; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing slurm-wlm munge (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi

# 2. munge
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munged is running"
else
    log "starting munged"
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.5
    done
    munge -n | unmunge >/dev/null || { log "munged does not answer"; exit 1; }
fi

# 3. slurm.conf for this host
host="$(hostname -s)"
cpus="$(nproc)"
mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
real_mem=$(( mem_mb > 2048 ? mem_mb - 1024 : mem_mb ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$log_dir"
# The loopback nodes of partition "two" (.ci/slurm-two-nodes.sh reads their names, addresses and ports from
# slurm.conf): one CPU each, so that a 2-node job of one task per node fits this machine's cores.
two_node_lines=""
for spec in harness-n1:127.0.0.2:6821 harness-n2:127.0.0.3:6822; do
    IFS=: read -r name addr port <<<"$spec"
    two_node_lines+="NodeName=${name} NodeHostname=${name} NodeAddr=${addr} Port=${port} CPUs=1 RealMemory=4000 State=UNKNOWN"$'\n'
done
conf_new="$(mktemp)"
cat >"$conf_new" <<EOF
# Written by .ci/slurm-setup.sh: a one-node cluster for the workflow's SLURM tests.
ClusterName=harness
SlurmctldHost=${host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
# %n: the node's name, so that the slurmd of this host and those of the loopback nodes keep apart
SlurmdPidFile=/run/slurmd-%n.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldLogFile=${log_dir}/slurmctld.log
SlurmdLogFile=${log_dir}/slurmd-%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# squeue must still list a finished job when the snakemake slurm plugin polls (it checks MinJobAge >= 3 x its
# initial polling interval before trusting squeue).
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=${host} CPUs=${cpus} RealMemory=${real_mem} State=UNKNOWN
PartitionName=${partition} Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
${two_node_lines}PartitionName=two Nodes=harness-n[1-2] Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
changed=0
if ! cmp -s "$conf_new" /etc/slurm/slurm.conf; then
    log "writing /etc/slurm/slurm.conf (node ${host}: ${cpus} CPUs, ${real_mem} MB)"
    install -m 0644 "$conf_new" /etc/slurm/slurm.conf
    changed=1
fi
rm -f "$conf_new"

# 4. daemons
node_ready() {
    local state
    state="$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n1)"
    case "$state" in idle*|mixed*|allocated*|completing*) return 0 ;; *) return 1 ;; esac
}
stop_daemon() {  # by the pid file each daemon wrote, never by name; $2: the signal (default TERM)
    local pidfile="$1"
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        kill -"${2:-TERM}" "$(cat "$pidfile")"
        for _ in $(seq 1 20); do kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$pidfile"
}
if [ "$changed" -eq 1 ]; then
    stop_daemon "/run/slurmd-${host}.pid"
    stop_daemon /run/slurmd.pid  # where an older slurm.conf of this script had it
    # the loopback nodes (.ci/slurm-two-nodes.sh): each file holds the pid of the `unshare` that holds a node's
    # namespaces; it ignores SIGTERM, and its SIGKILL takes everything in them along (unshare --kill-child)
    for pidfile in /run/slurm-two-nodes/*.pid; do
        if [ -e "$pidfile" ]; then stop_daemon "$pidfile" KILL; fi
    done
    stop_daemon /run/slurmctld.pid
fi
if ! { [ -s /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; }; then
    log "starting slurmctld (log: ${log_dir}/slurmctld.log)"
    /usr/sbin/slurmctld -i
fi
if ! { [ -s "/run/slurmd-${host}.pid" ] && kill -0 "$(cat "/run/slurmd-${host}.pid")" 2>/dev/null; }; then
    log "starting slurmd (log: ${log_dir}/slurmd-${host}.log)"
    /usr/sbin/slurmd -N "$host"
fi
for _ in $(seq 1 "$((wait_s * 2))"); do
    node_ready && break
    state="$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n1 || true)"
    case "$state" in down*|drain*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;; esac
    sleep 0.5
done
if ! node_ready; then
    log "node ${host} is not up after ${wait_s}s: sinfo says '$(sinfo -h -n "$host" -o '%T %E' 2>&1 | head -n1)'"
    tail -n 20 "${log_dir}/slurmctld.log" "${log_dir}/slurmd-${host}.log" >&2 || true
    exit 1
fi
log "cluster up: $(sinfo -h -p "$partition" -o '%P %D %T %C' | head -n1) (partition/nodes/state/cpus A/I/O/T)"
