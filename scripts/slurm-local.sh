#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try the SLURM path (workflow/profiles/slurm) without a
# cluster: munged, slurmctld and slurmd on localhost, partitions `cpu` and `gpu`, no accounting
# database. The node is declared larger than the machine (16 CPUs, 128 GB, one GPU) so the production
# profile's requests fit unchanged, two 8-CPU jobs at a time; nothing runs on a GPU.
#
#   scripts/slurm-local.sh up        # installs slurm-wlm and munge if missing (root, apt), starts the daemons
#   export SLURM_CONF=/tmp/specens-slurm/slurm.conf   # the line `up` prints: sbatch, squeue, sinfo use it
#   scripts/slurm-local.sh status    # the daemons and the node's state
#   scripts/slurm-local.sh down      # stops what `up` started, nothing else
#   scripts/slurm-local.sh install   # only the packages
#
# Everything lives in SPECENS_SLURM_DIR (default /tmp/specens-slurm): configuration, state, logs,
# the munge key and socket; /run/slurm/conf links to it while the cluster is up (commands inside jobs
# find the configuration there). Ports: SPECENS_SLURMCTLD_PORT (6817) and SPECENS_SLURMD_PORT (6818).
# Exit status: 0 done, 1 failed (the line names the log), 2 usage, 3 cannot run here (not root,
# no packages and no apt, ports taken, another SLURM configuration in /etc/slurm or /run/slurm/conf).
set -euo pipefail

DIR=${SPECENS_SLURM_DIR:-/tmp/specens-slurm}
CTLD_PORT=${SPECENS_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SPECENS_SLURMD_PORT:-6818}
NODE=localnode
PACKAGES=(slurm-wlm munge)
COMMANDS=(munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol)
MARK="$DIR/.slurm-local"
CONF="$DIR/slurm.conf"
DAEMONS=(munged slurmctld slurmd)
IDLE_TIMEOUT=20
# where commands inside a job find the configuration: the executor's job step runs `srun` without
# SLURM_CONF, and SLURM then reads /etc/slurm/slurm.conf, else the path a configless slurmd links here
RUN_CONF=/run/slurm/conf
SYSTEM_CONF=/etc/slurm/slurm.conf

say() { echo "slurm-local: $*"; }
fail() { say "$*" >&2; exit 1; }
cannot() { say "cannot run here: $*" >&2; exit 3; }

pidfile() {
    case $1 in
        munged) echo "$DIR/munge/munged.pid" ;;
        *) echo "$DIR/$1.pid" ;;
    esac
}

# the pid of one of our daemons, if it runs: its pid file names a live process of that program
# reading this directory's configuration (a reused pid is not ours)
our_pid() {
    local file pid
    file=$(pidfile "$1")
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    [[ $(cat /proc/"$pid"/comm 2>/dev/null) == "$1" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/" || return 1
    echo "$pid"
}

running() { local d n=0; for d in "${DAEMONS[@]}"; do our_pid "$d" >/dev/null && n=$((n + 1)); done; echo "$n"; }

missing_commands() { local c; for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null || echo "$c"; done; }

install_packages() {
    [[ -z $(missing_commands) ]] && return 0
    [[ $(id -u) == 0 ]] || cannot "slurm-wlm and munge are not installed, and installing them needs root"
    command -v apt-get >/dev/null || cannot "slurm-wlm and munge are not installed, and there is no apt-get"
    mkdir -p "$DIR"
    say "installing ${PACKAGES[*]} (about a minute; log: $DIR/install.log)"
    export DEBIAN_FRONTEND=noninteractive
    # the packages' own services stay stopped: this script starts its daemons itself
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    local ok=1
    if ! apt-cache show "${PACKAGES[@]}" >/dev/null 2>&1; then
        apt-get update >"$DIR/install.log" 2>&1 || ok=""
    fi
    [[ -n $ok ]] && { apt-get install -y --no-install-recommends "${PACKAGES[@]}" >>"$DIR/install.log" 2>&1 || ok=""; }
    [[ -n $made_policy ]] && rm -f "$policy"
    [[ -n $ok ]] || cannot "installing ${PACKAGES[*]} failed; see $DIR/install.log"
    [[ -z $(missing_commands) ]] || fail "installed ${PACKAGES[*]}, but $(missing_commands | tr '\n' ' ')is still missing"
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# this directory is ours, or new: never clean one that `up` did not make
check_dir() {
    if [[ -e $DIR && ! -e $MARK && -n $(ls -A "$DIR" 2>/dev/null | grep -vx install.log) ]]; then
        cannot "$DIR exists and was not made by this script (set SPECENS_SLURM_DIR to another directory)"
    fi
    return 0
}

claim_dir() {
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/munge" "$DIR/log" "$DIR"/*.pid
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge"
    chmod 0755 "$DIR/munge" # not writable by others (munged checks), its socket reachable by every user
    : >"$MARK"
}

# /run/slurm/conf is free, or a leftover of a cluster of this script that no longer runs
check_conf_link() {
    [[ -e $SYSTEM_CONF ]] && cannot "$SYSTEM_CONF exists: commands inside jobs would read it rather than this cluster's"
    if [[ -L $RUN_CONF ]]; then
        local target
        target=$(readlink "$RUN_CONF")
        [[ $target == "$DIR" ]] && return 0
        DIR=$target our_pid slurmctld >/dev/null && cannot "$RUN_CONF is the running cluster's in $target (scripts/slurm-local.sh down there first)"
    elif [[ -e $RUN_CONF ]]; then
        cannot "$RUN_CONF exists (another SLURM's configuration)"
    fi
    return 0
}

link_conf() {
    [[ -d ${RUN_CONF%/*} ]] || { mkdir -p "${RUN_CONF%/*}" && : >"$DIR/made-run-dir"; }
    ln -sfn "$DIR" "$RUN_CONF"
}

unlink_conf() {
    [[ -L $RUN_CONF && $(readlink "$RUN_CONF") == "$DIR" ]] && rm -f "$RUN_CONF"
    [[ -e $DIR/made-run-dir ]] && rmdir "${RUN_CONF%/*}" 2>/dev/null && rm -f "$DIR/made-run-dir"
    return 0
}

write_config() {
    cat >"$CONF" <<EOF
# written by scripts/slurm-local.sh: a one-node cluster on localhost
ClusterName=specens-local
SlurmctldHost=$(hostname -s)(127.0.0.1)
MailProg=/bin/true
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# no cgroups, no accounting database: squeue answers for finished jobs as long as MinJobAge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MinJobAge=300
ReturnToService=2
# the node as declared below, not as slurmd finds it: the production profile's requests fit
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=16 RealMemory=128000 Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$NODE MaxTime=INFINITE State=UP
EOF
    # one GPU by count (slurmd wants a device file: /dev/null stands in); jobs are scheduled as if it were there
    echo "Name=gpu Count=1 File=/dev/null" >"$DIR/gres.conf"
}

start_daemons() {
    mungekey --create --keyfile="$DIR/munge/munge.key" >"$DIR/log/mungekey.log" 2>&1 ||
        fail "mungekey failed; see $DIR/log/mungekey.log"
    munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$(pidfile munged)" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" ||
        fail "munged did not start; see $DIR/log/munged.log"
    slurmctld -f "$CONF" || fail "slurmctld did not start; see $DIR/log/slurmctld.log"
    slurmd -f "$CONF" -N "$NODE" || fail "slurmd did not start; see $DIR/log/slurmd.log"
}

node_state() { { SLURM_CONF=$CONF sinfo -h -n "$NODE" -o %T 2>/dev/null || true; } | sort -u | tr '\n' ' ' | sed 's/ $//'; }

wait_idle() {
    local deadline=$((SECONDS + IDLE_TIMEOUT)) state="" d
    while ((SECONDS < deadline)); do
        state=$(node_state)
        [[ $state == idle ]] && return 0
        for d in "${DAEMONS[@]}"; do
            our_pid "$d" >/dev/null || fail "$d stopped while starting; see $DIR/log/$d.log"
        done
        sleep 0.2
    done
    fail "node $NODE not idle after ${IDLE_TIMEOUT}s (state: ${state:-none}); see $DIR/log/slurmctld.log"
}

# jobs still on the cluster are cancelled first: their processes outlive slurmd otherwise
cancel_jobs() {
    local jobs i
    our_pid slurmctld >/dev/null || return 0
    jobs=$(SLURM_CONF=$CONF squeue -h -o %A 2>/dev/null) || return 0
    [[ -n $jobs ]] || return 0
    # shellcheck disable=SC2086
    SLURM_CONF=$CONF scancel $jobs 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        [[ -z $(SLURM_CONF=$CONF squeue -h -t RUNNING,COMPLETING,PENDING -o %A 2>/dev/null) ]] && return 0
        sleep 0.1
    done
}

stop_daemons() {
    local d pid n=0 i
    cancel_jobs
    for d in slurmd slurmctld munged; do
        pid=$(our_pid "$d") || continue
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        n=$((n + 1))
    done
    unlink_conf
    echo "$n"
}

cmd_up() {
    local start=$SECONDS
    [[ $(id -u) == 0 ]] || cannot "needs root (slurmd runs jobs as their users; munged and slurmd are system daemons)"
    if [[ $(running) == "${#DAEMONS[@]}" ]]; then
        say "already up; export SLURM_CONF=$CONF"
        return 0
    fi
    [[ $(running) == 0 ]] || stop_daemons >/dev/null # a half-started cluster of ours: start it again
    check_dir
    local port
    for port in "$CTLD_PORT" "$SLURMD_PORT"; do
        port_taken "$port" && cannot "port $port is taken (another SLURM? set SPECENS_SLURMCTLD_PORT and SPECENS_SLURMD_PORT)"
    done
    check_conf_link
    install_packages
    claim_dir
    write_config
    trap 'stop_daemons >/dev/null' EXIT # a failed start leaves nothing running (its logs stay)
    link_conf
    start_daemons
    wait_idle
    trap - EXIT
    say "up in $((SECONDS - start)) s: node $NODE idle, partitions cpu and gpu; export SLURM_CONF=$CONF"
}

cmd_down() {
    local n
    [[ $(running) == 0 || $(id -u) == 0 ]] || cannot "needs root (the daemons run as root)"
    n=$(stop_daemons)
    if ((n == 0)); then say "not running (nothing started from $DIR)"; else say "stopped $n daemon(s) started from $DIR"; fi
}

cmd_status() {
    local d pid up=0
    for d in "${DAEMONS[@]}"; do
        if pid=$(our_pid "$d"); then
            say "$d running (pid $pid)"
            up=$((up + 1))
        else
            say "$d not running"
        fi
    done
    if ((up == ${#DAEMONS[@]})); then
        say "node $NODE: $(node_state); export SLURM_CONF=$CONF"
        return 0
    fi
    return 1
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    install) install_packages && say "slurm-wlm and munge are installed" ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *)
        echo "usage: $0 up|down|status|install|env" >&2
        exit 2
        ;;
esac
