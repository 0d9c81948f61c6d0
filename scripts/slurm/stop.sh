#!/usr/bin/env bash
# Stops the daemons scripts/slurm/start.sh started (slurmd, slurmctld, munged), by the pids
# their pid files hold; one line per daemon.
#   bash scripts/slurm/stop.sh
set -uo pipefail
SPOOL=/var/spool/slurm-graft
stop() {
    local name=$1 pidfile=$2 pid
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        echo "slurm: stopped $name (pid $pid)"
    else
        echo "slurm: $name was not running"
    fi
}
stop slurmd "$SPOOL/slurmd.pid"
stop slurmctld "$SPOOL/slurmctld.pid"
stop munged /run/munge/munged.pid
