#!/bin/bash
# gpucluster-spot-watcher: poll IMDSv2 for a spot interruption notice (two minutes ahead) and,
# when the stack asks for it, for the earlier rebalance recommendation; then run the
# interruption hook once and stop. (EC2 user guide, "Spot Instance interruption notices" and
# "EC2 instance rebalance recommendations": both paths answer 404 until AWS sets them.)
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
POLL_SECONDS="${GPUCLUSTER_SPOT_POLL_SECONDS:-5}"
HOOK="${GPUCLUSTER_INTERRUPTION_HOOK:-/usr/local/sbin/gpucluster-interruption-hook}"

token() {
  curl -sf -X PUT --max-time 2 -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$IMDS/latest/api/token"
}

metadata() {  # metadata TOKEN PATH: the body on HTTP 200, failure otherwise
  curl -sf --max-time 2 -H "X-aws-ec2-metadata-token: $1" "$IMDS/latest/meta-data/$2"
}

logger -t gpucluster-spot-watcher -- "watching spot/instance-action every ${POLL_SECONDS}s" || true
while true; do
  if tok=$(token); then
    if notice=$(metadata "$tok" spot/instance-action); then
      exec "$HOOK" "spot interruption notice: $notice"
    fi
    if [ "$GPUCLUSTER_HANDLE_REBALANCE" = "true" ] \
        && notice=$(metadata "$tok" events/recommendations/rebalance); then
      exec "$HOOK" "rebalance recommendation: $notice"
    fi
  fi
  sleep "$POLL_SECONDS"
done
