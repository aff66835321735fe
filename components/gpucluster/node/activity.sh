#!/bin/bash
# gpucluster-activity: once a minute (its timer), say whether anything runs on this node: a process
# on a GPU (nvidia-smi --query-compute-apps) or a gpucluster job unit (gpucluster-job-*.service, see
# gpucluster-job). Published as the metric <cluster namespace> / NodeActive = 1 or 0 by Stack and
# NodeGroup: the group's idle alarm fires when the Maximum over its nodes stays 0 for idle_minutes.
# When it cannot tell (nvidia-smi fails and no job unit runs) it publishes nothing: missing data is
# never idle. It never stops anything itself.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"

log() { echo "gpucluster-activity: $*"; logger -t gpucluster-activity -- "$*" || true; }

jobs=$(systemctl list-units --type=service --state=active --no-legend --plain 'gpucluster-job-*' 2>/dev/null \
  | awk 'NF {print $1}')
value=""
if [ -n "$jobs" ]; then
  value=1
  why="job units: $(echo "$jobs" | tr '\n' ' ')"
elif apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null); then
  apps=$(echo "$apps" | grep -v '^[[:space:]]*$' || true)
  if [ -n "$apps" ]; then
    value=1
    why="GPU processes: $(echo "$apps" | wc -l)"
  else
    value=0
    why="no GPU process, no job unit"
  fi
else
  log "nvidia-smi failed and no job unit runs: not publishing (unknown is not idle)"
  exit 0
fi
if ! aws cloudwatch put-metric-data --cli-connect-timeout 5 --cli-read-timeout 10 \
    --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" --metric-name NodeActive \
    --unit Count --value "$value" \
    --dimensions "Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP"; then
  log "could not publish NodeActive=$value ($why)"
  exit 1
fi
exit 0
