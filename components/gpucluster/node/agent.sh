#!/bin/bash
# gpucluster-agent: the CloudWatch agent with gpucluster's config, running. It publishes the GPU
# utilisation the idle stop alarms on: a node without it is never seen idle, so it is never
# stopped when idle. Installed first when the AMI lacks it (gpucluster-install: pinned, signature
# checked, waits for the dpkg lock). Anything short of a running agent exits 1: its unit
# (gpucluster-agent.service) tries again a bounded number of times, and gpucluster-report
# publishes NodeStepFailed for Step=agent after every failed run.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
CWA_CTL="${GPUCLUSTER_CWA_CTL:-/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl}"
CONFIG="${GPUCLUSTER_CWA_CONFIG:-/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json}"
INSTALL="${GPUCLUSTER_INSTALL:-/usr/local/sbin/gpucluster-install}"

log() { echo "gpucluster-agent: $*"; logger -t gpucluster-agent -- "$*" || true; }

if [ ! -x "$CWA_CTL" ]; then
  log "the AMI has no CloudWatch agent: installing it"
  "$INSTALL" cloudwatch-agent
fi
"$CWA_CTL" -a fetch-config -m ec2 -s -c "file:$CONFIG"
# `-a status` prints JSON such as {"status": "running", "configstatus": "configured", ...} (CloudWatch
# user guide, "Verify that the CloudWatch agent is running").
status=$("$CWA_CTL" -m ec2 -a status)
if ! grep -Eq '"status": *"running"' <<<"$status"; then
  log "the CloudWatch agent is not running after fetch-config: $status"
  exit 1
fi
log "CloudWatch agent running: GPU utilisation is published for the idle stop"
