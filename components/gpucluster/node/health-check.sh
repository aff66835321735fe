#!/bin/bash
# gpucluster-health-check launch|periodic|check: is this node's GPU hardware fit to work?
#   launch    at boot, while the Auto Scaling launch lifecycle hook holds the node in Pending:Wait:
#             check, report, then CompleteLifecycleAction CONTINUE (healthy) or ABANDON (a fatal
#             finding with on_failure replace), so the group launches a replacement. XIDs count
#             since boot. A node that never answers is abandoned at the hook's timeout. With
#             GPUCLUSTER_READY_GATE (baked groups) a healthy node's CONTINUE is left to
#             gpucluster-ready ($STATE/health-launch.ok), which answers once data and image are ready.
#   periodic  from the timer, once the launch check is done: the same checks but DCGM's, with XIDs
#             of the last GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES only (the driver's counters are
#             cumulative and never reset). A fatal finding with on_failure replace runs the pre-stop hook (bounded),
#             reports, and marks the instance Unhealthy (SetInstanceHealth), so the group replaces it.
#   check     the checks alone, for an operator: findings on stdout, exit 1 when one is fatal.
# On a Slurm stack (GPUCLUSTER_SCHEDULER=slurm: AWS PCS launches the node, no Auto Scaling group and
# no lifecycle hook) a fatal finding with on_failure replace drains the node in Slurm instead:
# `scontrol update NodeName=<node> State=DRAIN Reason="gpucluster: <finding>"` (scontrol(1): DRAIN
# lets the running job finish and starts no new one there), reports, and counts. The node's Slurm
# name is SLURMD_NODENAME when slurmd runs us, else the node whose NodeAddr/NodeHostName is this
# instance's private IP or host name (PCS names Slurm nodes itself, ledger: pcs-node-addresses;
# matching the address does not depend on its naming). A drained node that no job holds is powered
# down by Slurm's power saving, which PCS turns into terminating the instance
# (ledger: pcs-drained-node-terminated).
# Checks: GPUs visible to the driver vs the instance type's count (nvidia-smi), uncorrectable ECC
# errors and pending page retirement / row remapping (nvidia-smi), XID errors in the kernel log
# (journalctl, or dmesg), EFA devices vs the launch template's (fi_info -p efa), and at launch DCGM's
# quick diagnostic (dcgmi diag -r 1) where dcgmi is installed (not on MIG groups: the renderer turns it
# off there), and for a MIG group every GPU in MIG mode with the layout's number of MIG devices
# (nvidia-smi, as gpucluster-mig left them). Reports go to the stack's notification
# topic and are counted in CloudWatch (namespace GPUCLUSTER_METRIC_NAMESPACE, per Auto Scaling group).
# Not `set -e`: every check runs even when one of its commands fails, and each failure is handled.
set -uo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
MODE="${1:-}"
STATE="${GPUCLUSTER_STATE_DIR:-/run/gpucluster}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
UPTIME_FILE="${GPUCLUSTER_UPTIME_FILE:-/proc/uptime}"
RETRY_SLEEP="${GPUCLUSTER_HEALTH_RETRY_SLEEP:-10}"
# The EFA installer puts fi_info here (EC2 user guide, "Get started with EFA": fi_info -p efa).
PATH="$PATH:/opt/amazon/efa/bin"
LAUNCH_DONE="$STATE/health-launch.done"
REPLACING="$STATE/health-replacing"
REPORTED="$STATE/health-reported"

log() { echo "gpucluster-health-check: $*"; logger -t gpucluster-health-check -- "$*" 2>/dev/null || true; }

FINDINGS=()
finding() { FINDINGS+=("$1: $2"); log "finding $1: $2"; }

# ------------------------------------------------------------------------------ checks

check_gpu_count() {
  local expected="" pair out count
  for pair in ${GPUCLUSTER_HEALTH_EXPECTED_GPUS:-}; do
    if [ "${pair%%=*}" = "$INSTANCE_TYPE" ]; then expected="${pair#*=}"; fi
  done
  if [ -z "$expected" ]; then
    log "no GPU count known for $INSTANCE_TYPE; count not checked"
    return
  fi
  if ! command -v nvidia-smi >/dev/null; then
    finding gpu_count "nvidia-smi not found: no NVIDIA driver"
    return
  fi
  if ! out=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1); then
    finding gpu_count "nvidia-smi failed: $(head -n 1 <<<"$out")"
    return
  fi
  count=$(grep -c '^[[:space:]]*[0-9]' <<<"$out")
  if [ "$count" -lt "$expected" ]; then
    finding gpu_count "$count of $expected GPUs visible to the driver ($INSTANCE_TYPE)"
  fi
}

check_memory_errors() {
  local out index ecc retired remap_pending remap_failed
  command -v nvidia-smi >/dev/null || return 0
  # Volatile counters start at zero when the driver loads; Ampere and later remap rows where older
  # GPUs retire pages, and report "[N/A]" for the other (nvidia-smi --help-query-gpu).
  if ! out=$(nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure \
      --format=csv,noheader,nounits 2>&1); then
    log "ECC state not readable: $(head -n 1 <<<"$out")"
    return
  fi
  while IFS=',' read -r index ecc retired remap_pending remap_failed; do
    index="${index//[[:space:]]/}" ecc="${ecc//[[:space:]]/}" retired="${retired//[[:space:]]/}"
    remap_pending="${remap_pending//[[:space:]]/}" remap_failed="${remap_failed//[[:space:]]/}"
    if [[ $ecc =~ ^[0-9]+$ ]] && [ "$ecc" -gt 0 ]; then
      finding ecc "GPU $index: $ecc uncorrectable ECC errors since the driver loaded"
    fi
    if [ "$retired" = "Yes" ]; then finding page_retirement "GPU $index: page retirement pending (needs a GPU reset)"; fi
    if [ "$remap_pending" = "Yes" ]; then finding page_retirement "GPU $index: row remapping pending (needs a GPU reset)"; fi
    if [ "$remap_failed" = "Yes" ]; then finding page_retirement "GPU $index: row remapping failed"; fi
  done <<<"$out"
}

kernel_xid_lines() {  # kernel_xid_lines SINCE_EPOCH: "EPOCH <message>" per NVRM Xid line of this boot
  local since=$1 out uptime boot
  # short-unix: "<epoch>.<usec> <host> kernel: <message>" (journalctl(1), --output); "@" takes
  # seconds since the epoch (systemd.time(7)).
  if command -v journalctl >/dev/null \
      && out=$(journalctl -k -b --no-pager -o short-unix --since "@$since" 2>/dev/null); then
    awk '/NVRM: Xid/ { split($1, t, "."); print t[1], $0 }' <<<"$out"
    return
  fi
  # No journal: dmesg stamps seconds since boot, "[ 1234.567890] NVRM: Xid ...".
  read -r uptime _ <"$UPTIME_FILE"
  boot=$(( $(date +%s) - ${uptime%.*} ))
  dmesg 2>/dev/null | awk -v boot="$boot" '/NVRM: Xid/ {
    s = $0; sub(/^\[ */, "", s); split(s, t, /[.\]]/); print boot + t[1], $0 }'
}

check_xid() {  # check_xid SINCE_EPOCH WHAT: XIDs in the kernel log since then (not the ignored ones)
  local since=$1 what=$2 stamp line code device
  local -A seen=()
  while read -r stamp line; do
    [[ $stamp =~ ^[0-9]+$ ]] && [ "$stamp" -ge "$since" ] || continue
    # "NVRM: Xid (PCI:0000:10:1c): 79, pid=..., GPU has fallen off the bus."
    [[ $line =~ Xid\ \(([^\)]*)\):\ ([0-9]+) ]] || continue
    device=${BASH_REMATCH[1]} code=${BASH_REMATCH[2]}
    if [[ " ${GPUCLUSTER_HEALTH_IGNORED_XIDS:-} " == *" $code "* ]]; then continue; fi
    seen["Xid $code on $device"]=$(( ${seen["Xid $code on $device"]:-0} + 1 ))
  done < <(kernel_xid_lines "$since")
  for key in "${!seen[@]}"; do
    finding xid "$key, ${seen[$key]} time(s) $what"
  done
}

check_efa() {
  local expected="${GPUCLUSTER_HEALTH_EXPECTED_EFA:-0}" out count
  [ "$expected" -gt 0 ] || return 0
  if ! command -v fi_info >/dev/null; then
    finding efa "fi_info not found: the EFA software is not installed"
    return
  fi
  # One RDM endpoint per EFA device, each in its own domain (e.g. rdmap16s27-rdm).
  if ! out=$(fi_info -p efa -t FI_EP_RDM 2>&1); then
    finding efa "libfabric finds no EFA device: $(head -n 1 <<<"$out")"
    return
  fi
  count=$(awk '$1 == "domain:" { print $2 }' <<<"$out" | sort -u | grep -c .)
  if [ "$count" -lt "$expected" ]; then
    finding efa "$count of $expected EFA devices visible to libfabric"
  fi
}

check_mig() {  # MIG groups: every GPU in MIG mode, with the MIG devices of its layout (gpucluster-mig's)
  local entry plan="" per out off short
  [ -n "${GPUCLUSTER_MIG_LAYOUTS:-}" ] && command -v nvidia-smi >/dev/null || return 0
  # "<type or *>=<profile>:<start>,...", as gpucluster-mig reads it: one MIG device per entry, per GPU.
  for entry in $GPUCLUSTER_MIG_LAYOUTS; do
    case "${entry%%=*}" in "*" | "$INSTANCE_TYPE") plan="${entry#*=}" ;; esac
  done
  [ -n "$plan" ] || { finding mig "no MIG layout for $INSTANCE_TYPE"; return; }
  per=$(( $(tr -cd , <<<"$plan" | wc -c) + 1 ))
  out=$(nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader 2>&1) \
    || { finding mig "MIG mode not readable: ${out%%$'\n'*}"; return; }
  off=$(awk -F', *' '$2 != "Enabled" { print $1 }' <<<"$out" | paste -sd, -)
  if [ -n "$off" ]; then finding mig "GPU $off: MIG mode not enabled"; fi
  out=$(nvidia-smi -L 2>&1) || { finding mig "nvidia-smi -L failed: ${out%%$'\n'*}"; return; }
  # "GPU <n>: ..." lines, each followed by its "  MIG <profile> Device <i>: (UUID: MIG-...)" lines.
  short=$(awk -v per="$per" '/^GPU [0-9]+:/ { g = $2 + 0; n[g] = 0; o[++k] = g } /UUID: MIG-/ { n[g]++ }
    END { for (i = 1; i <= k; i++) if (n[o[i]] != per) printf ", GPU %d: %d of %d", o[i], n[o[i]], per }' <<<"$out")
  if [ -n "$short" ]; then finding mig "MIG devices:${short#,} ($plan)"; fi
}

check_dcgm() {
  local out rc failed
  [ "${GPUCLUSTER_HEALTH_DCGM_DIAG:-false}" = "true" ] || return 0
  if ! command -v dcgmi >/dev/null; then
    log "dcgmi not installed; DCGM diagnostic skipped"
    return
  fi
  # Level 1 is the quick, non-invasive run (DCGM user guide, "Run levels"): deployment checks only.
  out=$(timeout 300 dcgmi diag -r 1 2>&1)
  rc=$?
  failed=$(awk -F'|' '$3 ~ /^[[:space:]]*Fail/ { gsub(/^[[:space:]]+|[[:space:]]+$/, "", $2); print $2 }' \
    <<<"$out" | paste -sd, -)
  if [ -n "$failed" ]; then
    finding dcgm "dcgmi diag -r 1 failed: ${failed//,/, }"
  elif [ "$rc" -ne 0 ]; then
    log "DCGM diagnostic did not run (exit $rc): $(head -n 1 <<<"$out")"
  fi
}

run_checks() {  # run_checks SINCE_EPOCH XID_WHAT [dcgm]
  check_gpu_count
  check_memory_errors
  check_xid "$1" "$2"
  check_efa
  check_mig
  # DCGM only before work: its deployment checks count processes on the GPUs, so on a node that
  # is running a job they would fail the node for doing its job.
  if [ "${3:-}" = "dcgm" ]; then check_dcgm; fi
}

FATAL=()
decide() {
  local f
  FATAL=()
  for f in "${FINDINGS[@]}"; do
    if [[ " ${GPUCLUSTER_HEALTH_FATAL:-} " == *" ${f%%:*} "* ]]; then FATAL+=("$f"); fi
  done
}

# -------------------------------------------------------------------------- AWS calls

imds() {  # imds PATH: an IMDSv2 metadata value
  local token
  token=$(curl -sf -X PUT --max-time 2 -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$IMDS/latest/api/token") \
    || return 1
  curl -sf --max-time 2 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

# retry SECONDS COMMAND...: AWS calls are retried (throttling; a role policy created with the group
# takes a while to reach IAM) until they work or time runs out; a ValidationError is final.
retry() {
  local deadline out
  deadline=$(( $(date +%s) + $1 ))
  shift
  while true; do
    if out=$("$@" 2>&1); then
      printf '%s\n' "$out"
      return 0
    fi
    if [[ $out == *ValidationError* ]] || [ "$(date +%s)" -ge "$deadline" ]; then
      log "failed: ${*:1:3}: $out"
      return 1
    fi
    sleep "$RETRY_SLEEP"
  done
}

# Slurm stacks only: these lines act where node.env sets GPUCLUSTER_SCHEDULER=slurm
SLURM=false
if [ "${GPUCLUSTER_SCHEDULER:-none}" = slurm ]; then SLURM=true; fi

identify() {
  local line
  if ! INSTANCE_ID=$(imds instance-id) || ! INSTANCE_TYPE=$(imds instance-type); then
    log "instance metadata (IMDSv2) not readable"
    exit 1
  fi
  if [ "$SLURM" = true ]; then
    # PCS launched it: no Auto Scaling group, no launch hook holding it.
    ASG="" LIFECYCLE_STATE=InService
    return
  fi
  if [ "$MODE" = "periodic" ] && [ -s "$STATE/asg" ]; then
    ASG=$(cat "$STATE/asg") LIFECYCLE_STATE=InService
    return
  fi
  # The group's name cannot be in the user data (the group is created after its launch template):
  # ask Auto Scaling which group holds this instance, and in which lifecycle state.
  line=$(retry "$LAUNCH_BUDGET" aws autoscaling describe-auto-scaling-instances \
    --region "$GPUCLUSTER_REGION" --instance-ids "$INSTANCE_ID" \
    --query 'AutoScalingInstances[0].[AutoScalingGroupName,LifecycleState]' --output text) || exit 1
  read -r ASG LIFECYCLE_STATE <<<"$line"
  if [ -z "${ASG:-}" ] || [ "$ASG" = "None" ]; then
    log "$INSTANCE_ID is in no Auto Scaling group"
    exit 1
  fi
  echo "$ASG" >"$STATE/asg"
}

report() {  # report SUBJECT WHAT: the findings to the stack's topic (instance, group, findings)
  local message f
  message="gpucluster stack $GPUCLUSTER_STACK, node group $GPUCLUSTER_NODE_GROUP (Auto Scaling group $ASG)"
  if [ "$SLURM" = true ]; then
    message="gpucluster stack $GPUCLUSTER_STACK, node group $GPUCLUSTER_NODE_GROUP (Slurm node ${NODE:-?})"
  fi
  message+=$'\n'"instance $INSTANCE_ID ($INSTANCE_TYPE): $2"$'\n'"findings:"
  for f in "${FINDINGS[@]}"; do message+=$'\n'"- $f"; done
  log "$2"
  if [ -z "${GPUCLUSTER_NOTIFY_TOPIC_ARN:-}" ]; then
    log "no notification topic configured; report only in this log"
    return
  fi
  # SNS subjects: at most 100 printable ASCII characters, one line (SNS API reference, Publish).
  retry 60 aws sns publish --region "$GPUCLUSTER_REGION" --topic-arn "$GPUCLUSTER_NOTIFY_TOPIC_ARN" \
    --subject "${1:0:100}" --message "$message" >/dev/null || true
}

count() {  # count METRIC: +1 on the group's series
  if [ "$SLURM" = true ]; then
    # A Slurm stack has no Auto Scaling group: the series is the stack's node group.
    retry 60 aws cloudwatch put-metric-data --region "$GPUCLUSTER_REGION" \
      --namespace "$GPUCLUSTER_METRIC_NAMESPACE" --metric-name "$1" \
      --dimensions "Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP" --value 1 --unit Count \
      >/dev/null || true
    return
  fi
  retry 60 aws cloudwatch put-metric-data --region "$GPUCLUSTER_REGION" \
    --namespace "$GPUCLUSTER_METRIC_NAMESPACE" --metric-name "$1" \
    --dimensions "AutoScalingGroupName=$ASG" --value 1 --unit Count >/dev/null || true
}


slurm_node() {  # this instance's Slurm node name (see the header)
  local ip host
  if [ -n "${SLURMD_NODENAME:-}" ]; then echo "$SLURMD_NODENAME"; return; fi
  ip=$(imds local-ipv4) || ip=""
  host=$(hostname -s 2>/dev/null || hostname)
  scontrol --oneliner show node 2>/dev/null | awk -v ip="$ip" -v host="$host" '{
    n = ""; a = ""; h = ""
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^NodeName=/) n = substr($i, 10)
      if ($i ~ /^NodeAddr=/) a = substr($i, 10)
      if ($i ~ /^NodeHostName=/) h = substr($i, 14)
    }
    if ((ip != "" && a == ip) || h == host || n == host) { print n; exit } }'
}

drain_self() {  # a Slurm node with a fatal finding: drain it with the finding as the reason (once)
  local reason
  NODE=$(slurm_node)
  if [ -z "$NODE" ]; then
    log "no Slurm node found for $INSTANCE_ID; cannot drain"
    report "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: unhealthy node $INSTANCE_ID not drained" \
      "no Slurm node found for this instance: drain it by hand"
    exit 1
  fi
  reason="gpucluster: ${FATAL[0]}"
  retry 60 scontrol update NodeName="$NODE" State=DRAIN Reason="${reason:0:200}" >/dev/null || exit 1
  date -Is >"$REPLACING"
  report "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: draining unhealthy node $INSTANCE_ID" \
    "drained in Slurm ($NODE): no new job starts there, the running one may finish"
  count HealthReplacements
}

run_hook() {
  local rc
  if [ -z "${GPUCLUSTER_HEALTH_HOOK_COMMAND:-}" ]; then
    log "no pre-stop hook configured"
    return
  fi
  log "running the pre-stop hook before the replacement (timeout ${GPUCLUSTER_HEALTH_HOOK_TIMEOUT_SECONDS}s)"
  GPUCLUSTER_STOP_REASON=health timeout --kill-after=5 "$GPUCLUSTER_HEALTH_HOOK_TIMEOUT_SECONDS" \
    bash -c "$GPUCLUSTER_HEALTH_HOOK_COMMAND"
  rc=$?
  log "pre-stop hook exited with $rc"
}

replace_self() {  # a running node with a fatal finding: checkpoint, report, mark Unhealthy (once)
  if [ "$SLURM" = true ]; then drain_self; return; fi
  date -Is >"$REPLACING"
  run_hook
  report "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: replacing unhealthy node $INSTANCE_ID" \
    "marked Unhealthy: the Auto Scaling group replaces it"
  count HealthReplacements
  retry 300 aws autoscaling set-instance-health --region "$GPUCLUSTER_REGION" --instance-id "$INSTANCE_ID" \
    --health-status Unhealthy --no-should-respect-grace-period >/dev/null || exit 1
}

report_only() {  # findings that replace nothing: reported once until they change
  local signature
  signature=$(printf '%s\n' "${FINDINGS[@]}" | sort)
  if [ -e "$REPORTED" ] && [ "$(cat "$REPORTED")" = "$signature" ]; then
    log "findings unchanged since the last report"
    return
  fi
  printf '%s\n' "$signature" >"$REPORTED"
  local why="not fatal"
  if [ "${#FATAL[@]}" -gt 0 ]; then why="on_failure is notify"; fi
  report "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: GPU health finding on $INSTANCE_ID" \
    "health finding, node kept in service ($why)"
  count HealthFindings
}

# ------------------------------------------------------------------------------- modes

launch() {
  identify
  # >>> ready gate (rendered only for gated groups: userdata.without_ready_gate)
  echo "$LIFECYCLE_STATE" >"$STATE/lifecycle-state"
  # A warm pool's instance is held by the same hook (Warmed:Pending:Wait) before it is stopped.
  if [ "$LIFECYCLE_STATE" = Warmed:Pending:Wait ]; then LIFECYCLE_STATE=Pending:Wait; fi
  # <<< ready gate
  run_checks 0 "since boot" dcgm
  decide
  local result=CONTINUE
  if [ "${#FATAL[@]}" -gt 0 ] && [ "$GPUCLUSTER_HEALTH_ON_FAILURE" = "replace" ]; then result=ABANDON; fi
  if [ "$LIFECYCLE_STATE" != "Pending:Wait" ]; then
    # Rebooted, or a group without the hook: judge it as a running node would be judged.
    log "not held by a launch hook (lifecycle state $LIFECYCLE_STATE)"
    if [ "$result" = "ABANDON" ] && [ "$LIFECYCLE_STATE" = "InService" ]; then replace_self
    elif [ "${#FINDINGS[@]}" -gt 0 ]; then report_only; fi
    date -Is >"$LAUNCH_DONE"
    return
  fi
  if [ "$result" = "ABANDON" ]; then
    report "gpucluster $GPUCLUSTER_CLUSTER/$GPUCLUSTER_NODE_GROUP: new node $INSTANCE_ID failed its launch check" \
      "abandoned at launch: the Auto Scaling group launches another node"
    count LaunchAbandons
  elif [ "${#FINDINGS[@]}" -gt 0 ]; then
    report_only
  fi
  # >>> ready gate
  # In service means ready: gpucluster-ready completes the hook once data and image are there.
  if [ "$result" = CONTINUE ] && [ "${GPUCLUSTER_READY_GATE:-}" = true ]; then
    log "healthy: handing the launch lifecycle action to gpucluster-ready"
    date -Is | tee "$STATE/health-launch.ok" >"$LAUNCH_DONE"
    return
  fi
  # <<< ready gate
  log "completing the launch lifecycle action: $result"
  retry "$LAUNCH_BUDGET" aws autoscaling complete-lifecycle-action --region "$GPUCLUSTER_REGION" \
    --lifecycle-hook-name "$GPUCLUSTER_HEALTH_LAUNCH_HOOK" --auto-scaling-group-name "$ASG" \
    --instance-id "$INSTANCE_ID" --lifecycle-action-result "$result" >/dev/null || exit 1
  date -Is >"$LAUNCH_DONE"
}

periodic() {
  if [ ! -e "$LAUNCH_DONE" ]; then
    log "the launch check has not finished; skipping"
    return
  fi
  if [ -e "$REPLACING" ]; then
    log "already marked for replacement at $(cat "$REPLACING"); skipping"
    return
  fi
  identify
  run_checks $(( $(date +%s) - GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES * 60 )) \
    "in the last $GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES min"
  decide
  if [ "${#FINDINGS[@]}" -eq 0 ]; then
    rm -f "$REPORTED"
    log "healthy"
    return
  fi
  if [ "${#FATAL[@]}" -gt 0 ] && [ "$GPUCLUSTER_HEALTH_ON_FAILURE" = "replace" ]; then
    replace_self
  else
    report_only
  fi
}

check() {
  INSTANCE_TYPE=$(imds instance-type) || INSTANCE_TYPE="${GPUCLUSTER_INSTANCE_TYPE:-unknown}"
  run_checks $(( $(date +%s) - GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES * 60 )) \
    "in the last $GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES min" dcgm
  decide
  if [ "${#FINDINGS[@]}" -eq 0 ]; then echo "healthy"; else printf '%s\n' "${FINDINGS[@]}"; fi
  [ "${#FATAL[@]}" -eq 0 ]
}

# Lifecycle calls must finish before the hook's timeout abandons the node anyway.
LAUNCH_BUDGET=$(( ${GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS:-900} - 60 ))
mkdir -p "$STATE"
case "$MODE" in
  launch) launch ;;
  periodic) periodic ;;
  check) check ;;
  *) echo "usage: gpucluster-health-check launch|periodic|check" >&2; exit 2 ;;
esac
