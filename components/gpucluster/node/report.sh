#!/bin/bash
# gpucluster-report STEP: say how a node step (agent, data, scratch) went, so a failure is seen and
# never silently skipped. Its unit runs it twice: ExecStartPost after a good run (SERVICE_RESULT
# unset: publishes 0) and ExecStopPost after every run (systemd sets SERVICE_RESULT, EXIT_CODE and
# EXIT_STATUS, systemd.service(5); publishes 1 unless the result is success). Each report is the
# CloudWatch metric <cluster namespace> / NodeStepFailed by Stack (the gpucluster:stack identity), NodeGroup
# and Step, plus a journal line. It never fails the unit: reporting must not cause a retry.
# `gpucluster-report activity` (its timer, every minute) says whether anything runs on this node: a
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

# EKS stacks only (node.env sets GPUCLUSTER_SCHEDULER=eks): idle by what the GPUs do, not by what pods
# hold. Busy (NodeActive 1) only while a Running pod on this node holds nvidia.com/gpu, read from the
# kubelet's own pod list (GET /pods on its authenticated port, a bearer token from `aws eks get-token`
# as the node's identity: the read-only port is off by default and would show every pod's spec to
# anything that reaches the node; ledger: eks-kubelet-pods), AND the busiest GPU's utilisation, the mean
# of GPUCLUSTER_BUSY_SAMPLES samples, reaches GPUCLUSTER_GPU_BUSY_PERCENT. A pod holding a GPU at 0 %
# is idle; the group's alarm stops it after idle_minutes of that, as for any group. The kubelet not
# answering: nothing published (missing data is never idle). A GPU pod whose utilisation cannot be
# read (MIG, nvidia-smi failing) counts as busy.
# shellcheck disable=SC2016 # python, not shell
GPU_PODS='import json, sys
def gpus(c):
    r = c.get("resources") or {}
    return int((r.get("limits") or {}).get("nvidia.com/gpu") or (r.get("requests") or {}).get("nvidia.com/gpu") or 0)
print(sum(gpus(c) for p in json.load(sys.stdin).get("items") or [] if (p.get("status") or {}).get("phase") == "Running"
          for c in (p.get("spec") or {}).get("containers") or []))'
eks_activity() {
  local token pods held total=0 n=0 i busiest
  token=$(aws eks get-token --cluster-name "$GPUCLUSTER_EKS_CLUSTER" --region "$GPUCLUSTER_REGION" \
    --query status.token --output text) || { log "no EKS token: activity unknown"; return 1; }
  # -k: loopback to this node's own kubelet, whose certificate names the node (ledger: eks-kubelet-pods)
  pods=$(curl -sS -f -k --max-time 10 -H "Authorization: Bearer $token" \
    "${GPUCLUSTER_KUBELET_URL:-https://127.0.0.1:10250}/pods") || { log "the kubelet's pod list did not answer"; return 1; }
  held=$(python3 -c "$GPU_PODS" <<<"$pods") || { log "the kubelet's pod list did not parse"; return 1; }
  if ! [ "$held" -gt 0 ] 2>/dev/null; then value=0; return 0; fi
  for ((i = 0; i < ${GPUCLUSTER_BUSY_SAMPLES:-6}; i++)); do
    if [ "$i" -gt 0 ]; then sleep "${GPUCLUSTER_BUSY_INTERVAL_SECONDS:-5}"; fi
    busiest=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | sort -n | tail -n 1)
    busiest="${busiest//[[:space:]]/}"
    if [[ $busiest =~ ^[0-9]+$ ]]; then total=$((total + busiest)); n=$((n + 1)); fi
  done
  value=1
  if [ "$n" -gt 0 ] && ! awk -v t="$total" -v n="$n" -v p="$GPUCLUSTER_GPU_BUSY_PERCENT" 'BEGIN { exit !(t / n >= p) }'; then
    value=0
    log "$held GPU(s) held by running pods, the busiest GPU at $((total / n)) % (under $GPUCLUSTER_GPU_BUSY_PERCENT %): idle"
  fi
}

if [ "$step" = activity ] && [ "${GPUCLUSTER_SCHEDULER:-none}" = eks ]; then
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
