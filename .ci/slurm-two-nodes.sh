#!/usr/bin/env bash
# A two-node SLURM cluster on this one machine, for the multi-node train cells (tests/workflow/test_workflow_multinode.py).
# Idempotent and non-interactive; run as root on Debian bookworm (CI), from anywhere:
#     bash .ci/slurm-two-nodes.sh
# Steps (each skipped when already done):
#   1. .ci/slurm-setup.sh: munged, slurmctld, this host's node (partition "main") and a slurm.conf that also
#      declares partition "two" of nodes harness-n1 and harness-n2 (NodeAddr 127.0.0.2 and 127.0.0.3, a Port
#      each, one CPU each);
#   2. /etc/hosts lines naming those addresses, so that each node's name resolves as on a real cluster;
#   3. for each node, one slurmd in namespaces of its own (`unshare --uts --pid --mount --mount-proc`): it sees
#      its own hostname, its own pid space and its own /proc, and shares the file system (as a cluster's shared
#      file system) and the loopback network; wait (SLURM_WAIT s, default 60) until `sinfo` shows both nodes up.
# Stop a node by the pid file of the `unshare` that holds its namespaces (it ignores SIGTERM):
#     kill -KILL "$(cat /run/slurm-two-nodes/harness-n2.pid)"      # all of the node's processes die with it
# slurm-setup.sh stops both so when it rewrites slurm.conf; this script starts them again.
# Why namespaces: a job step on harness-n2 must not see the processes of harness-n1 (the batch host), or a
# watchdog that watches a pid of the batch host would pass here and fail on a real second node; its own
# hostname and address make torchrun's rendezvous pick one host, as on real nodes. Why not `slurmd -N` twice in
# one namespace: both would share a hostname and a pid space, which is what a second node must not do.
# What this cluster is not: no second kernel, network card, GPU or InfiniBand; docs/scale.md "Two nodes".
set -euo pipefail

log() { echo "[slurm-two-nodes] $*" >&2; }
here="$(cd "$(dirname "$0")" && pwd)"
log_dir="${SLURM_LOG_DIR:-/var/log/slurm}"
wait_s="${SLURM_WAIT:-60}"
run_dir=/run/slurm-two-nodes

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (writes /etc/hosts, starts slurmd in namespaces)"
    exit 1
fi

# 1. the cluster itself
bash "$here/slurm-setup.sh"

# the loopback nodes, as slurm.conf declares them (written by slurm-setup.sh)
mapfile -t nodes < <(sed -n 's/^NodeName=\(harness-n[0-9]*\) .*NodeAddr=\([0-9.]*\) .*/\1 \2/p' /etc/slurm/slurm.conf)
if [ "${#nodes[@]}" -ne 2 ]; then
    log "/etc/slurm/slurm.conf declares ${#nodes[@]} harness-n* nodes, not 2: is .ci/slurm-setup.sh the one that wrote it?"
    exit 1
fi

# 2. names
for spec in "${nodes[@]}"; do
    read -r name addr <<<"$spec"
    known="$(getent hosts "$name" | awk '{print $1}' | head -n1 || true)"
    if [ -z "$known" ]; then
        log "adding '${addr} ${name}' to /etc/hosts"
        echo "${addr} ${name}  # .ci/slurm-two-nodes.sh" >>/etc/hosts
    elif [ "$known" != "$addr" ]; then
        log "${name} resolves to ${known}, but slurm.conf gives it NodeAddr=${addr}: fix /etc/hosts"
        exit 1
    fi
done

# 3. one slurmd per node, each in its own UTS, pid and mount namespace
mkdir -p "$run_dir" "$log_dir"
node_up() {
    local state
    state="$(sinfo -h -n "$1" -o %T 2>/dev/null | head -n1)"
    case "$state" in idle*|mixed*|allocated*|completing*) return 0 ;; *) return 1 ;; esac
}
holds_namespaces() {  # the pid file names a live `unshare` (not a zombie, not a pid since given to another)
    local pid
    pid="$(cat "$1" 2>/dev/null)" || return 1
    [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = unshare ] || return 1
    case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*|"") return 1 ;; *) return 0 ;; esac
}
for spec in "${nodes[@]}"; do
    read -r name _ <<<"$spec"
    pidfile="${run_dir}/${name}.pid"
    if holds_namespaces "$pidfile"; then
        log "${name}: running (namespace pid $(cat "$pidfile"))"
        continue
    fi
    mkdir -p "/var/spool/slurmd/${name}"
    log "starting ${name} (slurmd log: ${log_dir}/slurmd-${name}.log)"
    # pid 1 of the namespace is a bash that reaps orphans (slurmstepd daemonizes) and ends with slurmd;
    # --kill-child: when unshare (the pid in the file) dies, everything in the namespace dies with it.
    setsid unshare --uts --pid --mount --mount-proc --fork --kill-child \
        bash -c 'hostname "$1" || exit 1; /usr/sbin/slurmd -D -N "$1" & wait $!' node "$name" \
        </dev/null >>"${log_dir}/namespace-${name}.log" 2>&1 &
    echo "$!" >"$pidfile"
done

for _ in $(seq 1 "$((wait_s * 2))"); do
    all_up=1
    for spec in "${nodes[@]}"; do
        read -r name _ <<<"$spec"
        node_up "$name" && continue
        all_up=0
        state="$(sinfo -h -n "$name" -o %T 2>/dev/null | head -n1 || true)"
        case "$state" in down|drain*) scontrol update nodename="$name" state=resume 2>/dev/null || true ;; esac
    done
    [ "$all_up" -eq 1 ] && break
    sleep 0.5
done
if [ "$all_up" -ne 1 ]; then
    for spec in "${nodes[@]}"; do
        read -r name _ <<<"$spec"
        node_up "$name" && continue
        log "node ${name} is not up after ${wait_s}s: sinfo says '$(sinfo -h -n "$name" -o '%T %E' 2>&1 | head -n1)'"
        tail -n 20 "${log_dir}/slurmd-${name}.log" "${log_dir}/namespace-${name}.log" >&2 || true
    done
    exit 1
fi
log "two nodes up: $(sinfo -h -p two -o '%P %D %T %N %C') (partition/nodes/state/names/cpus A/I/O/T)"
