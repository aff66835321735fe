#!/bin/bash
# gpucluster-mig apply|devices|exec CMD...: the node group's MIG layout (NVIDIA MIG user guide).
#   apply    every boot, before setup (gpucluster-mig.service): MIG mode on for every GPU, then each
#            GPU's instances at the spec's placements (nvidia-smi mig -cgi <profile>:<start>,... -C),
#            unless exactly those exist. Instances never survive a reboot, nor does MIG mode on Hopper
#            and later (on an A100 it does). A mode left pending (an A100 passed through to a VM) gets a
#            GPU reset, then one reboot, asked of the bootstrap ($STATE/mig-reboot). Exits 1 on any
#            failure. Lists the devices in $STATE/mig-devices.
#   devices  the MIG device UUIDs, one a line, in nvidia-smi -L order (GPU, then MIG device).
#   exec     CMD on the MIG device of this local rank (LOCAL_RANK: torchrun; OMPI_COMM_WORLD_LOCAL_RANK:
#            mpirun): a CUDA process uses one MIG device.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
STATE="${GPUCLUSTER_STATE_DIR:-/run/gpucluster}"
PERSIST="${GPUCLUSTER_PERSIST_DIR:-/var/lib/gpucluster}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
# What holds the GPUs and keeps a mode change from taking effect (the guide stops dcgm first).
CLIENTS="${GPUCLUSTER_MIG_GPU_CLIENTS:-nvidia-dcgm.service dcgm.service nvidia-persistenced.service}"

log() { echo "gpucluster-mig: $*" >&2; logger -t gpucluster-mig -- "$*" || true; }
fail() { log "FAILED: $*"; exit 1; }

# "<profile>:<start>,...": the plan of this node's instance type, or of "*" (every type).
plan_of_node() {
  local entry type token
  for entry in $GPUCLUSTER_MIG_LAYOUTS; do
    if [ "${entry%%=*}" = "*" ]; then echo "${entry#*=}"; return; fi
  done
  if ! token=$(curl -sf -X PUT --max-time 2 -H "X-aws-ec2-metadata-token-ttl-seconds: 60" "$IMDS/latest/api/token") \
      || ! type=$(curl -sf --max-time 2 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/instance-type"); then
    fail "instance type not readable from IMDSv2"
  fi
  for entry in $GPUCLUSTER_MIG_LAYOUTS; do
    if [ "${entry%%=*}" = "$type" ]; then echo "${entry#*=}"; return; fi
  done
  fail "no MIG layout for instance type $type"
}

gpus() { nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' '; }
# "<gpu> <pending mode>" for each GPU whose MIG mode is not on.
mode_off() {
  nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader \
    | awk -F', *' '$2 != "Enabled" { print $1, $3 }'
}
# "<profile>:<start>" of GPU $1's GPU instances, sorted.
layout_of() {
  { nvidia-smi mig -i "$1" -lgi 2>/dev/null || true; } \
    | awk '$2 ~ /^[0-9]+$/ && $3 == "MIG" { split($7, p, ":"); print $4 ":" p[1] }' | sort
}
# "<gpu> <uuid>" per MIG device.
mig_devices() {
  nvidia-smi -L | awk '/^GPU [0-9]+:/ { gpu = $2; sub(":", "", gpu) }
    /UUID: MIG-/ { u = $0; sub(/.*UUID: /, "", u); sub(/\).*/, "", u); print gpu, u }'
}

enable_mode() {
  local off gpu pending unit stopped=()
  off=$(mode_off)
  [ -n "$off" ] || return 0
  for unit in $CLIENTS; do
    if systemctl is-active --quiet "$unit"; then systemctl stop "$unit" && stopped+=("$unit"); fi
  done
  while read -r gpu _; do
    log "GPU $gpu: turning MIG mode on"
    nvidia-smi -i "$gpu" -mig 1 || log "GPU $gpu: nvidia-smi -mig 1 exited $?"
  done <<<"$off"
  while read -r gpu pending; do
    if [ "$pending" = "Enabled" ]; then
      log "GPU $gpu: MIG mode pending, resetting the GPU"
      nvidia-smi --gpu-reset -i "$gpu" || log "GPU $gpu: reset refused"
    fi
  done < <(mode_off)
  for unit in "${stopped[@]}"; do systemctl start "$unit" || log "could not restart $unit"; done
  off=$(mode_off)
  [ -n "$off" ] || return 0
  if grep -qv ' Enabled$' <<<"$off"; then
    fail "MIG mode could not be turned on for GPU(s) $(awk '$2 != "Enabled" { print $1 }' <<<"$off" | paste -sd, -)"
  fi
  pending=$(cut -d' ' -f1 <<<"$off" | paste -sd, -)
  if [ -e "$PERSIST/mig-rebooted" ]; then
    fail "MIG mode still pending on GPU(s) $pending after a reboot"
  fi
  mkdir -p "$PERSIST" "$STATE"
  date -Is >"$PERSIST/mig-rebooted"
  touch "$STATE/mig-reboot"
  fail "MIG mode pending on GPU(s) $pending until the node reboots (the bootstrap reboots once)"
}

apply() {
  local plan want count gpu have devices
  plan=$(plan_of_node)
  if ! devices=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1) || ! grep -q '^ *[0-9]' <<<"$devices"; then
    fail "nvidia-smi lists no GPU: $(head -n 1 <<<"$devices")"
  fi
  want=$(tr , '\n' <<<"$plan" | sort)
  count=$(grep -c . <<<"$want")
  enable_mode
  devices=$(mig_devices)
  for gpu in $(gpus); do
    have=$(layout_of "$gpu")
    if [ "$have" = "$want" ] && [ "$(grep -c "^$gpu " <<<"$devices" || true)" -eq "$count" ]; then
      log "GPU $gpu: layout $plan already in place"
      continue
    fi
    if [ -n "$have" ]; then
      log "GPU $gpu: replacing its MIG instances ($(paste -sd, - <<<"$have"))"
      nvidia-smi mig -i "$gpu" -dci || true  # exits non-zero when the GPU has no compute instances
      nvidia-smi mig -i "$gpu" -dgi || fail "GPU $gpu: its MIG instances cannot be removed (in use?)"
    fi
    log "GPU $gpu: creating $plan"
    nvidia-smi mig -i "$gpu" -cgi "$plan" -C || fail "GPU $gpu: nvidia-smi mig -cgi $plan -C failed"
  done
  devices=$(mig_devices)
  for gpu in $(gpus); do
    if [ "$(layout_of "$gpu")" != "$want" ] || [ "$(grep -c "^$gpu " <<<"$devices" || true)" -ne "$count" ]; then
      fail "GPU $gpu: the MIG layout is not $plan after creating it"
    fi
  done
  mkdir -p "$STATE"
  cut -d' ' -f2 <<<"$devices" >"$STATE/mig-devices.new"
  mv "$STATE/mig-devices.new" "$STATE/mig-devices"
  rm -f "$STATE/mig-reboot"
  log "$(grep -c . "$STATE/mig-devices") MIG devices: $count per GPU ($plan)"
}

on_device() {
  local rank="${LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-}}" devices=()
  [ "$#" -gt 0 ] || { echo "usage: gpucluster-mig exec CMD [ARG...]" >&2; exit 2; }
  if ! [[ $rank =~ ^[0-9]+$ ]]; then
    echo "gpucluster-mig exec: no local rank (LOCAL_RANK from torchrun, OMPI_COMM_WORLD_LOCAL_RANK from mpirun)" >&2
    exit 2
  fi
  [ -s "$STATE/mig-devices" ] || { echo "gpucluster-mig exec: no MIG devices (see journalctl -u gpucluster-mig)" >&2; exit 1; }
  mapfile -t devices <"$STATE/mig-devices"
  if [ "$rank" -ge "${#devices[@]}" ]; then
    echo "gpucluster-mig exec: local rank $rank, but this node has ${#devices[@]} MIG devices" >&2
    exit 2
  fi
  export CUDA_VISIBLE_DEVICES="${devices[$rank]}"
  exec "$@"
}

case "${1:-}" in
  apply) apply ;;
  devices) cat "$STATE/mig-devices" ;;
  exec) shift; on_device "$@" ;;
  *) echo "usage: gpucluster-mig apply|devices|exec CMD..." >&2; exit 2 ;;
esac
