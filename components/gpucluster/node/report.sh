#!/bin/bash
# gpucluster-report STEP: say how a node step (agent, data, scratch) went, so a failure is seen and
# never silently skipped. Its unit runs it twice: ExecStartPost after a good run (SERVICE_RESULT
# unset: publishes 0) and ExecStopPost after every run (systemd sets SERVICE_RESULT, EXIT_CODE and
# EXIT_STATUS, systemd.service(5); publishes 1 unless the result is success). Each report is the
# CloudWatch metric <cluster namespace> / NodeStepFailed by Stack (the gpucluster:stack identity), NodeGroup
# and Step, plus a journal line. It never fails the unit: reporting must not cause a retry.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
step="${1:?usage: gpucluster-report STEP}"
result="${SERVICE_RESULT:-}"

log() { echo "gpucluster-report: $*"; logger -t gpucluster-report -- "$*" || true; }

case "$result" in
  "") value=0; log "step $step succeeded" ;;
  success) exit 0 ;;  # the unit stopping normally (shutdown): nothing new to say
  *) value=1; log "step $step FAILED ($result, ${EXIT_CODE:-?} ${EXIT_STATUS:-?}): see journalctl -u gpucluster-$step" ;;
esac
if ! aws cloudwatch put-metric-data --cli-connect-timeout 5 --cli-read-timeout 10 \
    --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" --metric-name NodeStepFailed \
    --unit Count --value "$value" \
    --dimensions "Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP,Step=$step"; then
  log "could not publish NodeStepFailed=$value for step $step"
fi
exit 0
