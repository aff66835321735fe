#!/bin/bash
# gpucluster-interruption-hook [REASON]: run the stack's spot.interruption_command once per boot,
# bounded by spot.interruption_timeout_seconds. Both the node's spot watcher and the
# cluster's EventBridge -> SSM path call this wrapper (never the command itself), so a marker
# under /run keeps it to one run per boot. A later caller waits for a run in progress and
# exits with that run's status, so SSM reports the real outcome of the one checkpoint.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
STATE="${GPUCLUSTER_STATE_DIR:-/run/gpucluster}"
MARKER="$STATE/interruption-hook.done"
REASON="${1:-no reason given}"

log() { echo "gpucluster-interruption-hook: $*"; logger -t gpucluster-interruption-hook -- "$*" || true; }

mkdir -p "$STATE"
exec 9>"$STATE/interruption-hook.lock"
flock 9
if [ -e "$MARKER" ]; then
  previous=$(cat "$MARKER")
  case "$previous" in
    '' | *[!0-9]*)
      log "already started on this boot and did not finish; not running again ($REASON)"
      exit 1 ;;
    *)
      log "already ran on this boot (exit $previous); ignoring ($REASON)"
      exit "$previous" ;;
  esac
fi
echo started > "$MARKER"
if [ -z "${GPUCLUSTER_INTERRUPTION_COMMAND:-}" ]; then
  log "no spot.interruption_command configured ($REASON)"
  echo 0 > "$MARKER"
  exit 0
fi
log "running the interruption hook for: $REASON (timeout ${GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS}s)"
# 9>&-: a process the command leaves behind must not hold the lock after the run.
timeout --kill-after=5 "$GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS" \
  bash -c "$GPUCLUSTER_INTERRUPTION_COMMAND" 9>&-
rc=$?
echo "$rc" > "$MARKER"
log "interruption hook exited with $rc"
exit "$rc"
