#!/bin/bash
# gpucluster-spot-watcher: poll IMDSv2 for the spot interruption notice (two minutes ahead) and,
# when the stack asks for it, the earlier rebalance recommendation, and hand each to the
# interruption hook. (EC2 user guide, "Spot Instance interruption notices" and "EC2 instance
# rebalance recommendations": both paths answer 404 until AWS sets them.) A rebalance
# recommendation starts the hook in the background and the watch goes on: the interruption
# notice that may follow is still seen, logged and handed to the hook, whose once-per-boot
# guard turns that second call into a report of the first run. The watch ends after the notice.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
POLL_SECONDS="${GPUCLUSTER_SPOT_POLL_SECONDS:-5}"
HOOK="${GPUCLUSTER_INTERRUPTION_HOOK:-/usr/local/sbin/gpucluster-interruption-hook}"

log() { echo "gpucluster-spot-watcher: $*"; }  # stdout goes to the unit's journal

token() {
  curl -sf -X PUT --max-time 2 -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$IMDS/latest/api/token"
}

metadata() {  # metadata TOKEN PATH: the body on HTTP 200, failure otherwise
  curl -sf --max-time 2 -H "X-aws-ec2-metadata-token: $1" "$IMDS/latest/meta-data/$2"
}

rebalance_pid=""
log "watching spot/instance-action every ${POLL_SECONDS}s (rebalance recommendations: $GPUCLUSTER_HANDLE_REBALANCE)"
while true; do
  if tok=$(token); then
    if notice=$(metadata "$tok" spot/instance-action); then
      log "spot interruption notice: $notice"
      action=$(sed -n 's/.*"action"[[:space:]]*:[[:space:]]*"\([a-z]*\)".*/\1/p' <<<"$notice")
      rc=0
      GPUCLUSTER_EVENT=spot-interruption-warning GPUCLUSTER_INSTANCE_ACTION="$action" \
        "$HOOK" "spot interruption notice: $notice" || rc=$?
      log "interruption hook for the notice exited with $rc"
      if [ -n "$rebalance_pid" ]; then
        wait "$rebalance_pid" || true
      fi
      exit 0
    fi
    if [ -z "$rebalance_pid" ] && [ "$GPUCLUSTER_HANDLE_REBALANCE" = "true" ] \
        && notice=$(metadata "$tok" events/recommendations/rebalance); then
      log "rebalance recommendation: $notice; running the hook, still watching for the interruption notice"
      GPUCLUSTER_EVENT=rebalance-recommendation GPUCLUSTER_INSTANCE_ACTION="" \
        "$HOOK" "rebalance recommendation: $notice" &
      rebalance_pid=$!
    fi
  fi
  sleep "$POLL_SECONDS"
done
