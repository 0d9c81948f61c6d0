#!/usr/bin/env bash
# A single-node SLURM on this machine for the tests (tests/study/test_slurm.py): installs
# slurm-wlm and munge with apt-get where they are missing (needs root), writes
# /etc/slurm/slurm.conf for this host (one node, one default partition, no accounting, no
# cgroups: it runs in containers), starts munged, slurmctld and slurmd as daemons and waits
# until sinfo shows the node idle. Idempotent: a running cluster is left as it is.
# One line per step; scripts/slurm/stop.sh stops the daemons.
#   bash scripts/slurm/start.sh
set -euo pipefail
CONF=/etc/slurm/slurm.conf
SPOOL=/var/spool/slurm-graft
HOST=$(hostname -s)

if command -v sinfo >/dev/null && [ -f "$CONF" ] \
    && sinfo -h -N -n "$HOST" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "slurm: already running ($(sinfo -h -N -n "$HOST" -o %t) on $HOST)"
    exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "slurm: not installed, and installing needs root"; exit 3; }
    start=$SECONDS
    echo "slurm: installing slurm-wlm and munge with apt-get"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurm-wlm munge >/tmp/slurm-install.log 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update >>/tmp/slurm-install.log 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            slurm-wlm munge >>/tmp/slurm-install.log 2>&1 \
            || { echo "slurm: apt-get could not install slurm-wlm and munge (/tmp/slurm-install.log)"; exit 3; }
    fi
    echo "slurm: installed in $((SECONDS - start)) s"
fi

# a bit under the memory free for new processes, in MiB
mem=$(awk '/MemAvailable/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
mkdir -p /etc/slurm "$SPOOL/ctld" "$SPOOL/d" "$SPOOL/log"
cat >"$CONF" <<CONF
# written by graft's scripts/slurm/start.sh: a single-node cluster for the tests
ClusterName=graft
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$SPOOL/slurmctld.pid
SlurmdPidFile=$SPOOL/slurmd.pid
SlurmctldLogFile=$SPOOL/log/slurmctld.log
SlurmdLogFile=$SPOOL/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
NodeName=$HOST CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
echo "slurm: wrote $CONF ($HOST: $(nproc) CPUs, RealMemory=$mem MiB)"

if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; fi
    echo "slurm: created /etc/munge/munge.key"
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true

if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "slurm: munged already running"
else
    if id munge >/dev/null 2>&1; then
        su -s /bin/sh munge -c "munged --force" || munged --force
    else
        munged --force
    fi
    echo "slurm: started munged"
fi

if pgrep -x slurmctld >/dev/null; then
    echo "slurm: slurmctld already running"
else
    slurmctld
    echo "slurm: started slurmctld (log $SPOOL/log/slurmctld.log)"
fi
if pgrep -x slurmd >/dev/null; then
    echo "slurm: slurmd already running"
else
    slurmd
    echo "slurm: started slurmd (log $SPOOL/log/slurmd.log)"
fi

for _ in $(seq 60); do
    state=$(sinfo -h -N -n "$HOST" -o %t 2>/dev/null || true)
    case "$state" in
        idle | mix | alloc) echo "slurm: $HOST is $state (partition debug)"; exit 0 ;;
        down* | drain* | inval*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
echo "slurm: $HOST not idle after 60 s (state: ${state:-none}); see $SPOOL/log/"
exit 1
