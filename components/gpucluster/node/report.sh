#!/bin/bash
# gpucluster-report STEP: say how a node step (agent, data, scratch) went, so a failure is seen and
# never silently skipped. Its unit runs it twice: ExecStartPost after a good run (SERVICE_RESULT
# unset: publishes 0) and ExecStopPost after every run (systemd sets SERVICE_RESULT, EXIT_CODE and
# EXIT_STATUS, systemd.service(5); publishes 1 unless the result is success). Each report is the
# CloudWatch metric <cluster namespace> / NodeStepFailed by Stack (the gpucluster:stack identity), NodeGroup
# and Step, plus a journal line. It never fails the unit: reporting must not cause a retry.
# `gpucluster-report activity` (its timer, every minute; on an EKS node gpucluster-eks-activity decides) says whether anything runs on this node: a
# gpucluster job unit (gpucluster-job-*.service) or a process on a GPU (nvidia-smi
# --query-compute-apps): NodeActive = 1 or 0 by Stack and NodeGroup, which the group's idle alarm
# reads (Maximum over its nodes). A job unit counts even before it touches a GPU. When it cannot
# tell (nvidia-smi fails, no job unit) it publishes nothing: missing data is never idle. A failed publish fails that run. It lives here, not in a
# script of its own, because user data is 16 KiB gzipped and this shares the publishing code.
# `gpucluster-report first-job UNIT` (gpucluster-job start, after the job's unit started): once in
# the node's life, when UNIT's process started, in seconds since boot (systemd's
# ExecMainStartTimestampMonotonic): TimeToFirstJobSeconds by Stack and NodeGroup. Noted in
# GPUCLUSTER_FIRST_JOB_FILE once published, so later jobs (and a warm pool's restarts) publish nothing.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
step="${1:?usage: gpucluster-report STEP|activity|first-job UNIT}"
result="${SERVICE_RESULT:-}"

log() { echo "gpucluster-report: $*"; logger -t gpucluster-report -- "$*" || true; }
# publish METRIC VALUE [,MORE=DIMENSIONS] [UNIT]: by Stack and NodeGroup, in the cluster's namespace
publish() {
  aws cloudwatch put-metric-data --cli-connect-timeout 5 --cli-read-timeout 10 \
    --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" --metric-name "$1" \
    --unit "${4:-Count}" --value "$2" --dimensions "Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP${3:-}"
}

if [ "$step" = activity ] && [ "${GPUCLUSTER_SCHEDULER:-none}" = eks ]; then
  # shellcheck source=/dev/null
  . "${GPUCLUSTER_EKS_ACTIVITY:-/usr/local/sbin/gpucluster-eks-activity}"
  eks_activity || exit 0
  publish NodeActive "$value"
  exit
fi

if [ "$step" = first-job ]; then
  unit="${2:?usage: gpucluster-report first-job UNIT}"
  once="${GPUCLUSTER_FIRST_JOB_FILE:-/var/lib/gpucluster/first-job}"
  [ ! -e "$once" ] || exit 0
  started=$(systemctl show -p ExecMainStartTimestampMonotonic --value "$unit")
  if ! [[ "$started" =~ ^[0-9]+$ ]] || [ "$started" -eq 0 ]; then
    log "first job $unit: no start time from systemd; nothing published"
    exit 0
  fi
  log "first job on this node: $unit started $((started / 1000000))s after boot"
  if publish TimeToFirstJobSeconds "$((started / 1000000))" "" Seconds; then
    mkdir -p "$(dirname "$once")" && echo "$((started / 1000000)) $unit" >"$once"
  else
    log "could not publish TimeToFirstJobSeconds (the next job tries again)"
  fi
  exit 0
fi

if [ "$step" = activity ]; then
  value=1
  if [ -z "$(systemctl list-units --state=active --no-legend --plain 'gpucluster-job-*')" ]; then
    apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader) || exit 0
    case "$apps" in *[0-9]*) ;; *) value=0 ;; esac
  fi
  publish NodeActive "$value"
  # Slurm stacks only: these lines act where node.env sets GPUCLUSTER_SCHEDULER=slurm
  # A Slurm stack's idle fallback (PCS's idle scale-down does the rest): while a process holds a
  # GPU, the busiest GPU's utilisation, GpuUtilizationMax by Stack and NodeGroup; the group's alarm
  # stops it when even the busiest stays low. Nothing while no process holds one: missing data.
  active=$?
  if [ "${GPUCLUSTER_SCHEDULER:-none}" = slurm ] && [ "$value" = 1 ]; then
    busiest=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | sort -n | tail -n 1)
    busiest="${busiest//[[:space:]]/}"
    if [[ $busiest =~ ^[0-9]+$ ]]; then
      aws cloudwatch put-metric-data --cli-connect-timeout 5 --cli-read-timeout 10 \
        --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" \
        --metric-name GpuUtilizationMax --unit Percent --value "$busiest" \
        --dimensions "Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP" || active=1
    fi
  fi
  (exit "$active")
  exit
fi

case "$result" in
  "") value=0; log "step $step succeeded" ;;
  success) exit 0 ;;  # the unit stopping normally (shutdown): nothing new to say
  *) value=1; log "step $step FAILED ($result, ${EXIT_CODE:-?} ${EXIT_STATUS:-?}): see journalctl -u gpucluster-$step" ;;
esac
if ! publish NodeStepFailed "$value" ",Step=$step"; then
  log "could not publish NodeStepFailed=$value for step $step"
fi
exit 0
