#!/bin/bash
# gpucluster-interruption-hook [REASON]: run the stack's spot.interruption_command once per boot,
# bounded by spot.interruption_timeout_seconds. Both the node's spot watcher and the
# cluster's EventBridge -> SSM path call this, so a marker under /run keeps it to one run.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
STATE="${GPUCLUSTER_STATE_DIR:-/run/gpucluster}"
MARKER="$STATE/interruption-hook.done"

log() { echo "gpucluster-interruption-hook: $*"; logger -t gpucluster-interruption-hook -- "$*" || true; }

mkdir -p "$STATE"
exec 9>"$STATE/interruption-hook.lock"
flock 9
if [ -e "$MARKER" ]; then
  log "already ran on this boot; ignoring (${1:-no reason given})"
  exit 0
fi
touch "$MARKER"
if [ -z "${GPUCLUSTER_INTERRUPTION_COMMAND:-}" ]; then
  log "no spot.interruption_command configured (${1:-no reason given})"
  exit 0
fi
log "running the interruption hook for: ${1:-no reason given} (timeout ${GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS}s)"
timeout --kill-after=5 "$GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS" bash -c "$GPUCLUSTER_INTERRUPTION_COMMAND"
rc=$?
log "interruption hook exited with $rc"
exit "$rc"
