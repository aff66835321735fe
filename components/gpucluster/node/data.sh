#!/bin/bash
# gpucluster-data: bring each dataset to the GPUs, as listed in /etc/gpucluster/data-mounts.tsv
# (access, name, bucket, prefix, path, FSx DNS name, FSx mount name; "-" for none):
#   copy_to_scratch  aws s3 sync into <scratch>/<name> (NVMe, fastest reads, gone on stop)
#   mount            Mountpoint for Amazon S3, read-only, at <path>
#   fsx              FSx for Lustre at <path>
# Idempotent, run at every boot after the scratch volume.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
MOUNTS="${GPUCLUSTER_DATA_MOUNTS:-/etc/gpucluster/data-mounts.tsv}"
INSTALL="${GPUCLUSTER_INSTALL:-/usr/local/sbin/gpucluster-install}"

log() { echo "gpucluster-data: $*"; logger -t gpucluster-data -- "$*" || true; }

if [ ! -s "$MOUNTS" ]; then
  log "no datasets for this node group"
  exit 0
fi

# Pinned versions, signatures checked before installing: gpucluster-install (install.sh).
ensure_mount_s3() {
  command -v mount-s3 >/dev/null 2>&1 || "$INSTALL" mount-s3
}

ensure_lustre_client() {
  modinfo lustre >/dev/null 2>&1 || "$INSTALL" lustre-client
}

# fd 3, so that commands in the loop (aws, apt-get) cannot eat the list from stdin
while IFS=$'\t' read -r -u 3 access name bucket prefix path fsx_dns fsx_mount; do
  [ "$prefix" = "-" ] && prefix=""
  case "$access" in
    copy_to_scratch)
      dest="$GPUCLUSTER_SCRATCH_MOUNT/$name"
      mkdir -p "$dest"
      log "copying s3://$bucket/$prefix to $dest"
      aws s3 sync --only-show-errors --region "$GPUCLUSTER_REGION" "s3://$bucket/$prefix" "$dest"
      ;;
    mount)
      mkdir -p "$path"
      if mountpoint -q "$path"; then continue; fi
      ensure_mount_s3
      args=(--read-only --allow-other --region "$GPUCLUSTER_REGION")
      if [ -n "$prefix" ]; then args+=(--prefix "$prefix"); fi
      log "mounting s3://$bucket/$prefix at $path"
      mount-s3 "${args[@]}" "$bucket" "$path"
      ;;
    fsx)
      mkdir -p "$path"
      if mountpoint -q "$path"; then continue; fi
      ensure_lustre_client
      log "mounting FSx for Lustre $fsx_dns@tcp:/$fsx_mount at $path"
      mount -t lustre -o relatime,flock "$fsx_dns@tcp:/$fsx_mount" "$path"
      ;;
    *)
      log "unknown access '$access' for dataset $name"
      exit 1
      ;;
  esac
done 3< "$MOUNTS"
log "all datasets in place"
