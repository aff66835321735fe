#!/bin/bash
# gpucluster-job: detached jobs of `gpucluster run --detach`, as systemd units that outlive any SSM
# command timeout and any laptop. One unit per job and node, gpucluster-job-<name>.service, its
# output in the journal (`gpucluster logs`), its exit status kept after it ends (RemainAfterExit).
#   gpucluster-job start NAME WORKDIR COMMAND  start COMMAND under bash in WORKDIR, with the rank
#                                              environment `run` exported (MASTER_ADDR, NNODES,
#                                              NODE_RANK, ..., GPUCLUSTER_*, FI_*, NCCL_*)
#   gpucluster-job status                      one line per job: NAME STATE EXIT-STATUS STARTED
#   gpucluster-job logs NAME [LINES]           the job's last LINES lines of output (default 200)
#   gpucluster-job cancel NAME                 stop the job (SIGTERM, then SIGKILL after 90 s)
set -euo pipefail
PREFIX=gpucluster-job-
ENV_PATTERN='^(MASTER_ADDR|MASTER_PORT|NNODES|NODE_RANK|NPROC_PER_NODE|WORLD_SIZE|GPUCLUSTER_[A-Z_]+|FI_[A-Z_]+|NCCL_[A-Z_]+)$'

die() { echo "gpucluster-job: $*" >&2; exit 2; }

valid_name() {
  [[ "$1" =~ ^[a-z0-9][a-z0-9-]{0,39}$ ]] || die "job names are 1-40 characters of a-z, 0-9 and '-', got '$1'"
}

start() {
  local name="$1" workdir="$2" command="$3" unit="$PREFIX$1.service" var
  valid_name "$name"
  if [ "$(systemctl show -p SubState --value "$unit")" = running ]; then
    die "job $name is already running on this node (gpucluster cancel STACK $name first)"
  fi
  # A finished job of the same name is kept for its status: clear it for the new one.
  systemctl stop "$unit" >/dev/null 2>&1 || true
  systemctl reset-failed "$unit" >/dev/null 2>&1 || true
  local args=(--unit="$unit" --description="gpucluster job $name" --property=RemainAfterExit=yes
              --property=WorkingDirectory="$workdir" --property=TimeoutStopSec=90)
  if [ -n "${GPUCLUSTER_JOB_TIMEOUT_SECONDS:-}" ]; then
    args+=(--property=RuntimeMaxSec="$GPUCLUSTER_JOB_TIMEOUT_SECONDS")
  fi
  while IFS= read -r var; do
    [[ "$var" =~ $ENV_PATTERN ]] && args+=(--setenv="$var=${!var}")
  done < <(compgen -e)
  args+=(--setenv=GPUCLUSTER_JOB="$name")
  systemd-run "${args[@]}" /bin/bash -c "$command"
  echo "started job $name as $unit"
}

status() {
  local unit name
  while read -r unit _; do
    [ -n "$unit" ] || continue
    name="${unit#"$PREFIX"}"
    name="${name%.service}"
    echo "$name $(systemctl show -p SubState --value "$unit") $(systemctl show -p ExecMainStatus --value "$unit") $(systemctl show -p ExecMainStartTimestamp --value "$unit" | tr ' ' '_')"
  done < <(systemctl list-units --all --plain --no-legend --no-pager "$PREFIX*.service")
}

case "${1:-}" in
  start)  [ $# -eq 4 ] || die "usage: gpucluster-job start NAME WORKDIR COMMAND"; start "$2" "$3" "$4" ;;
  status) status ;;
  logs)   valid_name "${2:-}"; journalctl -u "$PREFIX$2.service" -n "${3:-200}" --no-pager -o cat ;;
  cancel) valid_name "${2:-}"; systemctl stop "$PREFIX$2.service"; echo "cancelled job $2" ;;
  *)      die "usage: gpucluster-job start|status|logs|cancel ..." ;;
esac
