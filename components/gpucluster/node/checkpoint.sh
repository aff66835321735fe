#!/bin/bash
# gpucluster-checkpoint [SECONDS]: ask the job on this node to save a checkpoint, and wait for it.
# The hook for autostop.pre_stop_command and spot.interruption_command. The contract (README,
# "Run a job"), which `gpucluster run` exports to every job: between steps the job checks for
# $GPUCLUSTER_CHECKPOINT_REQUEST; when it exists, it saves a checkpoint, then touches
# $GPUCLUSTER_CHECKPOINT_DONE. This hook creates the request and waits at most SECONDS (default
# 90; keep it under the hook's own timeout) for the done file: exit 0 when the job confirmed,
# 1 when it did not in time. With no process on a GPU there is nothing to save: exit 0 at once.
set -euo pipefail
WAIT="${1:-90}"
REQUEST="${GPUCLUSTER_CHECKPOINT_REQUEST:-/run/gpucluster/checkpoint-request}"
DONE="${GPUCLUSTER_CHECKPOINT_DONE:-/run/gpucluster/checkpoint-done}"
POLL_SECONDS="${GPUCLUSTER_POLL_SECONDS:-1}"

log() { echo "gpucluster-checkpoint: $*"; logger -t gpucluster-checkpoint -- "$*" || true; }

case "$WAIT" in '' | *[!0-9]*) log "SECONDS must be a whole number, got '$WAIT'"; exit 2 ;; esac
if [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null || true)" ]; then
  log "no process on a GPU: nothing to checkpoint"
  exit 0
fi
mkdir -p "$(dirname "$REQUEST")" "$(dirname "$DONE")"
rm -f "$DONE"
echo "${GPUCLUSTER_STOP_REASON:-requested} $(date -Is)" > "$REQUEST"
log "checkpoint requested (${GPUCLUSTER_STOP_REASON:-no reason given}); waiting up to ${WAIT}s"
waited=0
while [ "$waited" -lt "$WAIT" ]; do
  if [ -e "$DONE" ]; then
    rm -f "$REQUEST"
    log "checkpoint saved after ${waited}s"
    exit 0
  fi
  sleep "$POLL_SECONDS"
  waited=$((waited + POLL_SECONDS))
done
log "no checkpoint confirmed within ${WAIT}s"
exit 1
