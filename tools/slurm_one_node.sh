#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm launcher's tests
# (tests/kvstore/test_slurm.py): Debian's slurmctld, slurmd and munge, installed with apt
# where missing, configured for this host alone and started as root.
#
#   tools/slurm_one_node.sh start     # install what is missing, write the config, start
#   tools/slurm_one_node.sh status    # exit 0 when the cluster answers
#   tools/slurm_one_node.sh stop
#
# The node declares SLOTS CPUs (default 16, more than a small machine has) so that a job's
# scheduler, servers and workers, each a task, fit on it together; processes are tracked
# without cgroups (proctrack/linuxproc), which containers often lack.
set -euo pipefail

SLOTS="${SLOTS:-16}"
CONF_DIR=/etc/slurm
HOST="$(hostname -s)"

install_missing() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
            && command -v munged >/dev/null && command -v srun >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurmctld slurmd slurm-client munge
}

write_config() {
    mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    cat > "$CONF_DIR/slurm.conf" <<CONF
ClusterName=mixrt
SlurmctldHost=$HOST
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
KillWait=5
NodeName=$HOST CPUs=$SLOTS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
    fi
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge
    pgrep -x munged >/dev/null || runuser -u munge -- munged
}

answers() {
    sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}

start() {
    install_missing
    write_config
    start_munge
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 1 60); do
        if answers; then
            echo "slurm: one node ($HOST, $SLOTS slots) up"
            return
        fi
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "slurm: the node did not come up; see /var/log/slurm/" >&2
    exit 1
}

stop() {
    pkill -x slurmd || true
    pkill -x slurmctld || true
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) answers ;;
    *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
