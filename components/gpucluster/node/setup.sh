#!/bin/bash
# gpucluster-setup: the node group's own setup, after the bootstrap (gpucluster-setup.service).
# 1. Pulls the group's container_image, so the first job does not wait for it (Docker and the
#    NVIDIA container toolkit come with the Deep Learning AMI; on an AMI without Docker it is
#    installed first, gpucluster-install container-runtime; ECR images log in first).
# 2. Runs the group's setup (its `setup` commands or `setup_script`, rendered to
#    /etc/gpucluster/user-setup.sh) as root, once per instance: success leaves a marker, so a
#    reboot does not run it again; a failure fails the unit and runs again at the next boot.
# Everything goes to /var/log/gpucluster-setup.log and the journal. Exits non-zero when either
# step failed, after trying both.
set -uo pipefail
NODE_ENV="${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
# Exported, so the user's setup sees GPUCLUSTER_STACK, GPUCLUSTER_NODE_GROUP, ...
set -a
# shellcheck source=/dev/null
. "$NODE_ENV"
set +a
USER_SETUP="${GPUCLUSTER_USER_SETUP:-/etc/gpucluster/user-setup.sh}"
STATE="${GPUCLUSTER_SETUP_STATE:-/var/lib/gpucluster}"
LOG="${GPUCLUSTER_SETUP_LOG:-/var/log/gpucluster-setup.log}"
RETRY_SECONDS="${GPUCLUSTER_RETRY_SECONDS:-10}"
exec > >(tee -a "$LOG") 2>&1

log() { echo "gpucluster-setup: $*"; }

# ECR registries: <account>.dkr.ecr.<region>.amazonaws.com[.cn] (ECR user guide, "Private registry
# authentication"); `aws ecr get-login-password` gives a 12-hour token for docker login.
ECR_REGISTRY='^[0-9]{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$'

pull_image() {
  local image="$1" registry="${1%%/*}" attempt
  if ! command -v docker >/dev/null; then
    "${GPUCLUSTER_INSTALL:-/usr/local/sbin/gpucluster-install}" container-runtime || return 1
  fi
  for attempt in 1 2 3 4 5 6; do
    docker info >/dev/null 2>&1 && break
    log "waiting for the Docker daemon ($attempt)"
    sleep "$RETRY_SECONDS"
  done
  if [[ "$image" == */* && "$registry" =~ $ECR_REGISTRY ]]; then
    log "logging in to $registry"
    if ! aws ecr get-login-password --region "${BASH_REMATCH[1]}" \
        | docker login --username AWS --password-stdin "$registry"; then
      log "ECR login to $registry failed (does the node role allow ecr:GetAuthorizationToken?)"
      return 1
    fi
  fi
  for attempt in 1 2 3; do
    log "pulling $image (attempt $attempt)"
    docker pull --quiet "$image" && return 0
    sleep $((RETRY_SECONDS * attempt))
  done
  log "could not pull $image"
  return 1
}

status=0
if [ -n "${GPUCLUSTER_CONTAINER_IMAGE:-}" ]; then
  pull_image "$GPUCLUSTER_CONTAINER_IMAGE" || status=1
fi

# The Deep Learning AMI may hold the dpkg lock at first boot (cloud-init, unattended upgrades): a
# setup that installs packages waits for cloud-init and for the lock, at most 60 tries.
wait_for_dpkg() {
  local try
  cloud-init status --wait >/dev/null 2>&1 || true
  for try in $(seq 60); do
    fuser /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock >/dev/null 2>&1 || return 0
    log "dpkg is locked by another process; waiting ($try)"
    sleep "$RETRY_SECONDS"
  done
  log "dpkg still locked; running the setup anyway"
}

mkdir -p "$STATE"
if [ ! -e "$USER_SETUP" ]; then
  log "no setup for node group ${GPUCLUSTER_NODE_GROUP:-?}"
elif [ -e "$STATE/setup.done" ]; then
  log "setup already done on this instance ($(cat "$STATE/setup.done"))"
else
  wait_for_dpkg
  log "running the node group's setup: start $(date -Is)"
  if head -c 2 "$USER_SETUP" | grep -q '^#!'; then
    "$USER_SETUP"
  else
    bash "$USER_SETUP"
  fi
  rc=$?
  if [ "$rc" -eq 0 ]; then
    date -Is > "$STATE/setup.done"
    log "setup done"
  else
    log "setup failed with exit $rc; it runs again at the next boot"
    status=1
  fi
fi
exit "$status"
