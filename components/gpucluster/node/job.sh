#!/bin/bash
# gpucluster-job: detached jobs of `gpucluster run --detach`, as systemd units that outlive any SSM
# command timeout and any laptop. One unit per job and node, gpucluster-job-<name>.service, its exit
# status kept after it ends (RemainAfterExit). Its output goes to /var/log/gpucluster/jobs/<name>.log,
# which the CloudWatch agent ships to the stack's run log group (`gpucluster logs --follow` reads it
# there), between a start line and an end line the unit itself writes (ExecStopPost):
#   gpucluster-job: <name> started (restart <n>) <time>
#   gpucluster-job: <name> ended: result <systemd result>, exit status <status> <time>
#   gpucluster-job start NAME WORKDIR COMMAND  start COMMAND under bash in WORKDIR, with the rank
#                                              environment `run` exported (MASTER_ADDR, NNODES,
#                                              NODE_RANK, ..., GPUCLUSTER_*, FI_*, NCCL_*)
#   gpucluster-job status                      one line per job: NAME STATE EXIT-STATUS STARTED (UTC)
#   gpucluster-job logs NAME [LINES]           the job's last LINES lines of output (default 200)
#   gpucluster-job cancel NAME                 stop the job (SIGTERM, then SIGKILL after 90 s)
#   gpucluster-job finish NAME                 (the unit's ExecStopPost) write the end line
# `start` waits (at most GPUCLUSTER_READY_TIMEOUT_SECONDS) for the node's own boot steps, so a job
# re-launched on a node that is still booting starts once its data and image are there. With
# GPUCLUSTER_JOB_REPLACE=1 (`--restart-on-replace`) a running job of that name is stopped first.
# After the unit started, `gpucluster-report first-job` publishes, once a node, when its first job's
# process started (TimeToFirstJobSeconds: `gpucluster nodes` and `status` show it per group).
# With GPUCLUSTER_START_ID (the job-restart Lambda's: one per re-launch), a start whose id this node
# already started is not started again: SendCommand has no idempotency token, and a retried send
# (its answer lost, the Lambda killed before it recorded the send) must not restart the rank. The
# check and the start hold a lock, so two sends at once start it once.
# With GPUCLUSTER_CHECKPOINT_URI set, the `latest` pointer under it names the newest checkpoint:
# the job gets it as GPUCLUSTER_CHECKPOINT_LATEST (README, "Run a job": the checkpoint contract).
set -euo pipefail
PREFIX=gpucluster-job-
ENV_PATTERN='^(MASTER_ADDR|MASTER_PORT|NNODES|NODE_RANK|NPROC_PER_NODE|WORLD_SIZE|GPUCLUSTER_[A-Z_]+|FI_[A-Z_]+|NCCL_[A-Z_]+)$'
# This tool's own settings, and what it computes itself: never handed on from the caller.
OWN_VARS='^GPUCLUSTER_(JOB_LOGS|JOB_TOOL|REPORT_TOOL|JOB_REPLACE|READY_TIMEOUT_SECONDS|POLL_SECONDS|CHECKPOINT_LATEST|RESTART_COUNT|START_ID)$'
LOGS="${GPUCLUSTER_JOB_LOGS:-/var/log/gpucluster/jobs}"
TOOL="${GPUCLUSTER_JOB_TOOL:-/usr/local/sbin/gpucluster-job}"
REPORT="${GPUCLUSTER_REPORT_TOOL:-/usr/local/sbin/gpucluster-report}"
READY_TIMEOUT="${GPUCLUSTER_READY_TIMEOUT_SECONDS:-3600}"
POLL="${GPUCLUSTER_POLL_SECONDS:-10}"
# The node's boot steps a job needs finished (gpucluster.node.userdata): datasets, image and setup.
BOOT_UNITS=(gpucluster-data.service gpucluster-setup.service)

die() { echo "gpucluster-job: $*" >&2; exit 2; }

valid_name() {
  [[ "$1" =~ ^[a-z0-9][a-z0-9-]{0,39}$ ]] || die "job names are 1-40 characters of a-z, 0-9 and '-', got '$1'"
}

# Wait while a boot step is still running (a node just launched by a replacement).
wait_for_boot() {
  local unit waited=0
  for unit in "${BOOT_UNITS[@]}"; do
    while [ "$(systemctl show -p ActiveState --value "$unit")" = activating ]; do
      [ "$waited" -lt "$READY_TIMEOUT" ] || { echo "gpucluster-job: $unit still running after ${waited}s; starting anyway"; return 0; }
      [ "$waited" -gt 0 ] || echo "gpucluster-job: waiting for $unit to finish"
      sleep "$POLL"
      waited=$((waited + POLL))
    done
  done
}

# The newest checkpoint, as the job wrote it into the `latest` pointer under the checkpoint URI
# (s3://bucket/prefix/ through the node role's checkpoint grant, or an FSx path); empty when none.
latest_checkpoint() {
  local uri="${GPUCLUSTER_CHECKPOINT_URI:-}" pointer value
  [ -n "$uri" ] || return 0
  pointer="${uri%/}/latest"
  if [[ "$uri" == s3://* ]]; then
    value=$(aws s3 cp --only-show-errors "$pointer" - 2>/dev/null) || return 0
  else
    [ -r "$pointer" ] || return 0
    value=$(cat "$pointer")
  fi
  value="$(echo "$value" | head -n 1 | tr -d '[:space:]')"
  [ -n "$value" ] || return 0
  # A name relative to the prefix (the contract's "step-1200/") becomes a full location.
  if [[ "$value" == s3://* || "$value" == /* ]]; then echo "$value"; else echo "${uri%/}/$value"; fi
}

start() {
  local name="$1" workdir="$2" command="$3" unit="$PREFIX$1.service" var latest marker
  valid_name "$name"
  # The per-rank marker: the last start id this node started for the job (not a .log: not shipped).
  mkdir -p "$LOGS/.starts"
  marker="$LOGS/.starts/$name"
  exec 9>"$marker.lock"
  flock 9
  if [ -n "${GPUCLUSTER_START_ID:-}" ] && [ -r "$marker" ] && [ "$(cat "$marker")" = "$GPUCLUSTER_START_ID" ]; then
    echo "job $name: start $GPUCLUSTER_START_ID already made on this node; not started twice"
    return 0
  fi
  if [ "$(systemctl show -p SubState --value "$unit")" = running ]; then
    [ "${GPUCLUSTER_JOB_REPLACE:-0}" = 1 ] \
      || die "job $name is already running on this node (gpucluster cancel STACK $name first)"
    echo "gpucluster-job: stopping the running $name to start it again on the new node set"
  fi
  wait_for_boot
  # A finished (or replaced) job of the same name is kept for its status: clear it for the new one.
  systemctl stop "$unit" >/dev/null 2>&1 || true
  systemctl reset-failed "$unit" >/dev/null 2>&1 || true
  mkdir -p "$LOGS"
  latest=$(latest_checkpoint)
  echo "gpucluster-job: $name started (restart ${GPUCLUSTER_RESTART_COUNT:-0}) $(date -Is)" >> "$LOGS/$name.log"
  [ -z "$latest" ] || echo "gpucluster-job: $name resumes from $latest" >> "$LOGS/$name.log"
  local args=(--unit="$unit" --description="gpucluster job $name" --property=RemainAfterExit=yes
              --property=WorkingDirectory="$workdir" --property=TimeoutStopSec=90
              --property=StandardOutput=append:"$LOGS/$name.log"
              --property=StandardError=append:"$LOGS/$name.log"
              --property=ExecStopPost="$TOOL finish $name")
  if [ -n "${GPUCLUSTER_JOB_TIMEOUT_SECONDS:-}" ]; then
    args+=(--property=RuntimeMaxSec="$GPUCLUSTER_JOB_TIMEOUT_SECONDS")
  fi
  while IFS= read -r var; do
    [[ "$var" =~ $ENV_PATTERN && ! "$var" =~ $OWN_VARS ]] && args+=(--setenv="$var=${!var}")
  done < <(compgen -e)
  [ -z "$latest" ] || args+=(--setenv=GPUCLUSTER_CHECKPOINT_LATEST="$latest")
  args+=(--setenv=GPUCLUSTER_JOB="$name" --setenv=GPUCLUSTER_RESTART_COUNT="${GPUCLUSTER_RESTART_COUNT:-0}")
  systemd-run "${args[@]}" /bin/bash -c "$command"
  # Recorded once the unit is started: a start that failed is tried again by the retry.
  if [ -n "${GPUCLUSTER_START_ID:-}" ]; then echo "$GPUCLUSTER_START_ID" > "$marker"; fi
  # The node's first job: when its process started (TimeToFirstJobSeconds, once); never fails the job.
  "$REPORT" first-job "$unit" >/dev/null 2>&1 || true
  echo "started job $name as $unit${latest:+, resuming from $latest}"
}

# ExecStopPost: systemd passes how the main process ended in SERVICE_RESULT, EXIT_CODE and
# EXIT_STATUS (systemd.exec(5), "Environment Variables in Spawned Processes").
finish() {
  local name="$1"
  valid_name "$name"
  mkdir -p "$LOGS"
  echo "gpucluster-job: $name ended: result ${SERVICE_RESULT:-unknown}, exit status ${EXIT_STATUS:-unknown} $(date -Is)" \
    >> "$LOGS/$name.log"
}

status() {
  local unit name
  while read -r unit _; do
    [ -n "$unit" ] || continue
    name="${unit#"$PREFIX"}"
    name="${name%.service}"
    # TZ=UTC: systemctl prints timestamps in its own time zone; `logs --follow` reads them as UTC.
    echo "$name $(systemctl show -p SubState --value "$unit") $(systemctl show -p ExecMainStatus --value "$unit") $(TZ=UTC systemctl show -p ExecMainStartTimestamp --value "$unit" | tr ' ' '_')"
  done < <(systemctl list-units --all --plain --no-legend --no-pager "$PREFIX*.service")
}

logs() {
  local name="$1" lines="${2:-200}"
  valid_name "$name"
  [[ "$lines" =~ ^[0-9]+$ ]] || die "LINES must be a whole number, got '$lines'"
  if [ -r "$LOGS/$name.log" ]; then
    tail -n "$lines" "$LOGS/$name.log"
  else  # a job started before its output had a file of its own
    journalctl -u "$PREFIX$name.service" -n "$lines" --no-pager -o cat
  fi
}

case "${1:-}" in
  start)  [ $# -eq 4 ] || die "usage: gpucluster-job start NAME WORKDIR COMMAND"; start "$2" "$3" "$4" ;;
  status) status ;;
  logs)   logs "${2:-}" "${3:-200}" ;;
  cancel) valid_name "${2:-}"; systemctl stop "$PREFIX$2.service"; echo "cancelled job $2" ;;
  finish) finish "${2:-}" ;;
  *)      die "usage: gpucluster-job start|status|logs|cancel|finish ..." ;;
esac
