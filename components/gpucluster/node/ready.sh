#!/bin/bash
# gpucluster-ready: in service means ready. The launch lifecycle hook holds a new node in
# Pending:Wait; gpucluster-health-check answers it only for a fatal finding (ABANDON) and otherwise
# leaves $STATE/health-launch.ok for this script, which completes it with CONTINUE only once the node
# can run work: what the baked image must carry is there (checked at once: it cannot appear later),
# the datasets are mounted and the container image is present. Past GPUCLUSTER_READY_GATE_SECONDS
# (inside the hook's own timeout) it abandons the node with the reason (journal, the stack's topic,
# metric LaunchAbandons), so the group launches another instead of counting a node that cannot work.
# When ready it logs each boot step's start and end (systemd's own timestamps) and publishes them as
# BootStepSeconds by Stack, NodeGroup and Step, and the time from boot to ready as TimeToReadySeconds.
# It also publishes when each milestone of the boot was reached, in seconds since boot, as
# BootStepAtSeconds by Stack, NodeGroup and Step (MILESTONES: the bootstrap writes the first two in
# $STATE/boot-steps, the NVIDIA services' time is systemd's, this script notes the rest as it sees them).
# "Image present" is not enough: a volume restored from a snapshot fetches each block from S3 on its
# first read (EBS user guide, "Initialize Amazon EBS volumes"), so the image's layers are read once
# through (`docker save` to /dev/null) before the node is ready: a first container then starts in
# seconds instead of reading ~10 GB at initialisation speed.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
STATE="${GPUCLUSTER_STATE_DIR:-/run/gpucluster}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
UPTIME_FILE="${GPUCLUSTER_UPTIME_FILE:-/proc/uptime}"
MOUNTS="${GPUCLUSTER_DATA_MOUNTS:-/etc/gpucluster/data-mounts.tsv}"
CWA_CTL="${GPUCLUSTER_CWA_CTL:-/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl}"
TIMEOUT="${GPUCLUSTER_READY_GATE_SECONDS:-840}"
POLL="${GPUCLUSTER_READY_POLL_SECONDS:-5}"
STEPS=(scratch mig agent data setup health-launch)
MILESTONES=(userdata bundle nvidia health mounts image ready)
NVIDIA_UNITS=(nvidia-persistenced.service nvidia-fabricmanager.service)

log() { echo "gpucluster-ready: $*"; logger -t gpucluster-ready -- "$*" 2>/dev/null || true; }

imds() {
  local token
  token=$(curl -fsS -m 5 -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300") &&
    curl -fsS -m 5 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

uptime_seconds() { cut -d' ' -f1 "$UPTIME_FILE" | cut -d. -f1; }

# mark STEP [SECONDS]: when a boot milestone was reached (seconds since boot), the first time only.
mark() {
  grep -q "^$1 " "$STATE/boot-steps" 2>/dev/null || echo "$1 ${2:-$(uptime_seconds)}" >>"$STATE/boot-steps"
}

# The NVIDIA services up: the later of those systemd started (nvidia-fabricmanager on NVSwitch systems).
mark_nvidia() {
  local unit at latest=0
  for unit in "${NVIDIA_UNITS[@]}"; do
    at=$(systemctl show -p ActiveEnterTimestampMonotonic --value "$unit" 2>/dev/null)
    if [[ "$at" =~ ^[0-9]+$ ]] && [ "$at" -gt "$latest" ]; then latest=$at; fi
  done
  if [ "$latest" -gt 0 ]; then mark nvidia $((latest / 1000000)); fi
}

# The container image's layers read once through, so that their blocks are fetched from S3 now and
# not by the first job; fails (and is tried again on the next poll) while they cannot be read.
read_layers() {
  [ ! -e "$STATE/image-read" ] || return 0
  local started=$SECONDS
  if docker save "$GPUCLUSTER_READY_IMAGE" >/dev/null 2>"$STATE/image-read.err"; then
    echo "$((SECONDS - started))" >"$STATE/image-read"
    log "read the layers of $GPUCLUSTER_READY_IMAGE in $((SECONDS - started))s"
    mark image
    return 0
  fi
  log "could not read the layers of $GPUCLUSTER_READY_IMAGE: $(tail -n 1 "$STATE/image-read.err")"
  return 1
}

# What a baked image must carry: missing now means missing for good (nothing installs it later).
baked_missing() {
  local missing=() access
  [ -x "$CWA_CTL" ] || missing+=("CloudWatch agent")
  command -v dcgmi >/dev/null 2>&1 || missing+=("DCGM (dcgmi)")
  if [ -s "$MOUNTS" ]; then
    while IFS=$'\t' read -r access _; do
      case "$access" in
        fsx) modinfo lustre >/dev/null 2>&1 || missing+=("Lustre client for kernel $(uname -r)") ;;
        mount) command -v mount-s3 >/dev/null 2>&1 || missing+=("Mountpoint for S3") ;;
      esac
    done <"$MOUNTS"
  fi
  if [ -n "${GPUCLUSTER_READY_IMAGE:-}" ] && ! docker image inspect "$GPUCLUSTER_READY_IMAGE" >/dev/null 2>&1; then
    missing+=("container image $GPUCLUSTER_READY_IMAGE")
  fi
  local IFS=,
  echo "${missing[*]}"
}

# What the node is still waiting for (empty: ready). A warm pool's instance (Warmed:Pending:Wait) is
# stopped once the hook completes: it needs its installs and image, not its mounts (they do not
# survive the stop; they are waited for when it is started into service, through the same hook).
waiting_for() {
  local waiting=() access name path
  systemctl is-active --quiet gpucluster-agent.service || waiting+=("agent")
  # Mounted datasets (FSx for Lustre, Mountpoint for S3) must be there; a copy to scratch goes on in
  # the background (gpucluster-job waits for gpucluster-data before a job starts).
  if [ -s "$MOUNTS" ] && [ "$LIFECYCLE" != "Warmed:Pending:Wait" ]; then
    local unmounted=0
    while IFS=$'\t' read -r access name _ _ path _; do
      if [ "$access" != "copy_to_scratch" ] && ! mountpoint -q "$path"; then
        waiting+=("dataset $name at $path")
        unmounted=1
      fi
    done <"$MOUNTS"
    if [ "$unmounted" = 0 ]; then mark mounts; fi
  fi
  if [ -n "${GPUCLUSTER_READY_IMAGE:-}" ]; then
    if ! docker image inspect "$GPUCLUSTER_READY_IMAGE" >/dev/null 2>&1; then
      waiting+=("container image $GPUCLUSTER_READY_IMAGE")
    elif ! read_layers >&2; then  # stdout is this function's answer: its log goes to stderr
      waiting+=("the layers of $GPUCLUSTER_READY_IMAGE read")
    fi
  fi
  local IFS=,
  echo "${waiting[*]}"
}

complete() {  # complete CONTINUE|ABANDON: the launch lifecycle action, retried inside the hook's time
  local try
  for try in 1 2 3 4 5; do
    if aws autoscaling complete-lifecycle-action --region "$GPUCLUSTER_REGION" \
        --lifecycle-hook-name "$GPUCLUSTER_HEALTH_LAUNCH_HOOK" --auto-scaling-group-name "$ASG" \
        --instance-id "$INSTANCE_ID" --lifecycle-action-result "$1" >/dev/null; then
      return 0
    fi
    log "complete-lifecycle-action $1 failed (try $try)"
    sleep "$POLL"
  done
  return 1
}

abandon() {  # abandon REASON: report it, count it, ABANDON the launch
  local reason="$1"
  log "ABANDONING the launch of $INSTANCE_ID: $reason"
  if [ -n "${GPUCLUSTER_NOTIFY_TOPIC_ARN:-}" ]; then
    aws sns publish --region "$GPUCLUSTER_REGION" --topic-arn "$GPUCLUSTER_NOTIFY_TOPIC_ARN" \
      --subject "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: new node $INSTANCE_ID not ready" \
      --message "gpucluster stack $GPUCLUSTER_STACK, Auto Scaling group $ASG: $INSTANCE_ID abandoned at launch: $reason" \
      >/dev/null || log "could not publish the abandon report"
  fi
  aws cloudwatch put-metric-data --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" \
    --metric-name LaunchAbandons --dimensions "AutoScalingGroupName=$ASG" --value 1 --unit Count \
    >/dev/null || log "could not count the abandon"
  echo "$reason" >"$STATE/ready.abandoned"
  complete ABANDON || log "could not abandon: the hook's timeout abandons it (default result ABANDON)"
  exit 1
}

# Each boot step as systemd saw it: start and end in seconds since boot (monotonic timestamps).
boot_steps() {
  local step start end data="" ready
  ready=$(uptime_seconds)
  for step in "${STEPS[@]}"; do
    start=$(systemctl show -p InactiveExitTimestampMonotonic --value "gpucluster-$step.service" 2>/dev/null)
    end=$(systemctl show -p ActiveEnterTimestampMonotonic --value "gpucluster-$step.service" 2>/dev/null)
    if ! [[ "$start" =~ ^[0-9]+$ && "$end" =~ ^[0-9]+$ ]] || [ "$start" -eq 0 ] || [ "$end" -lt "$start" ]; then
      continue
    fi
    log "boot step $step: start $((start / 1000000))s end $((end / 1000000))s ($(((end - start) / 1000000))s)"
    data+="{\"MetricName\":\"BootStepSeconds\",\"Unit\":\"Seconds\",\"Value\":$(((end - start) / 1000000)),\"Dimensions\":[{\"Name\":\"Stack\",\"Value\":\"$GPUCLUSTER_STACK\"},{\"Name\":\"NodeGroup\",\"Value\":\"$GPUCLUSTER_NODE_GROUP\"},{\"Name\":\"Step\",\"Value\":\"$step\"}]},"
  done
  log "ready ${ready}s after boot"
  mark ready "$ready"
  for step in "${MILESTONES[@]}"; do
    start=$(sed -n "s/^$step \([0-9][0-9]*\)$/\1/p" "$STATE/boot-steps" 2>/dev/null | head -n 1)
    [ -n "$start" ] || continue
    log "boot milestone $step at ${start}s"
    data+="{\"MetricName\":\"BootStepAtSeconds\",\"Unit\":\"Seconds\",\"Value\":$start,\"Dimensions\":[{\"Name\":\"Stack\",\"Value\":\"$GPUCLUSTER_STACK\"},{\"Name\":\"NodeGroup\",\"Value\":\"$GPUCLUSTER_NODE_GROUP\"},{\"Name\":\"Step\",\"Value\":\"$step\"}]},"
  done
  data+="{\"MetricName\":\"TimeToReadySeconds\",\"Unit\":\"Seconds\",\"Value\":$ready,\"Dimensions\":[{\"Name\":\"Stack\",\"Value\":\"$GPUCLUSTER_STACK\"},{\"Name\":\"NodeGroup\",\"Value\":\"$GPUCLUSTER_NODE_GROUP\"}]}"
  aws cloudwatch put-metric-data --region "$GPUCLUSTER_REGION" --namespace "$GPUCLUSTER_METRIC_NAMESPACE" \
    --metric-data "[$data]" >/dev/null || log "could not publish the boot steps"
}

mkdir -p "$STATE"
if ! INSTANCE_ID=$(imds instance-id); then
  log "instance metadata (IMDSv2) not readable"
  exit 1
fi
deadline=$((SECONDS + TIMEOUT))
# The health check answers first: a fatal finding abandons the node there; otherwise it hands over.
until [ -e "$STATE/health-launch.ok" ]; do
  if [ -e "$STATE/health-launch.done" ]; then
    log "the launch check answered the hook itself (abandoned, or not held by one): nothing to complete"
    exit 0
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "the launch health check never answered in ${TIMEOUT}s; the hook's timeout abandons the node"
    exit 1
  fi
  sleep "$POLL"
done
mark health
mark_nvidia
ASG=$(cat "$STATE/asg")
LIFECYCLE=$(cat "$STATE/lifecycle-state" 2>/dev/null || echo Pending:Wait)
if [ "${GPUCLUSTER_BAKED:-false}" = "true" ]; then
  lacking=$(baked_missing)
  if [ -n "$lacking" ]; then abandon "the baked image lacks: $lacking"; fi
fi
while :; do
  pending=$(waiting_for)
  if [ -z "$pending" ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then abandon "not ready after ${TIMEOUT}s: still waiting for $pending"; fi
  log "waiting for: $pending"
  sleep "$POLL"
done
log "ready: health check passed, data mounted, container image present and its layers read; completing the launch hook: CONTINUE"
complete CONTINUE || { log "could not complete the launch lifecycle action"; exit 1; }
date -Is >"$STATE/ready"
boot_steps
exit 0
