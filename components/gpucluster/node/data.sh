#!/bin/bash
# gpucluster-data: bring each dataset to the GPUs, as listed in /etc/gpucluster/data-mounts.tsv
# (access, name, bucket, prefix, path, FSx DNS name, FSx mount name, expected bucket owner; "-" for
# none):
#   copy_to_scratch  aws s3 sync into <scratch>/<name> (NVMe, fastest reads, gone on stop)
#   mount            Mountpoint for Amazon S3, read-only, at <path>
#   fsx              FSx for Lustre at <path>
# S3 requests name the account that must own the bucket (S3 user guide, "Verifying bucket ownership
# with bucket owner condition"), so a bucket of the same name re-created in another account is never
# read; the node role's s3:ResourceAccount condition holds the same line. GpuCluster always names
# one: the deploying account, or the dataset's expected_bucket_owner.
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
while IFS=$'\t' read -r -u 3 access name bucket prefix path fsx_dns fsx_mount owner; do
  [ "$prefix" = "-" ] && prefix=""
  [ "${owner:--}" = "-" ] && owner=""
  case "$access" in
    copy_to_scratch)
      dest="$GPUCLUSTER_SCRATCH_MOUNT/$name"
      mkdir -p "$dest"
      log "copying s3://$bucket/$prefix (owner ${owner:-not named}) to $dest"
      # `aws s3 sync` takes no --expected-bucket-owner (AWS CLI reference, "s3 sync"): the
      # s3api listing that does goes first, and fails on a bucket of another owner.
      if [ -n "$owner" ]; then
        aws s3api list-objects-v2 --region "$GPUCLUSTER_REGION" --bucket "$bucket" --prefix "$prefix" \
          --expected-bucket-owner "$owner" --max-items 1 > /dev/null
      fi
      aws s3 sync --only-show-errors --region "$GPUCLUSTER_REGION" "s3://$bucket/$prefix" "$dest"
      ;;
    mount)
      mkdir -p "$path"
      if mountpoint -q "$path"; then continue; fi
      ensure_mount_s3
      # Mountpoint for S3 (`mount-s3 --help`, bucket options): every request names the owner.
      args=(--read-only --allow-other --region "$GPUCLUSTER_REGION")
      if [ -n "$owner" ]; then args+=(--expected-bucket-owner "$owner"); fi
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
