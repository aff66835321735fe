#!/bin/bash
# gpucluster-scratch: every NVMe instance-store disk as one RAID0 volume at the scratch mount.
# Instance store is erased on stop and terminate: scratch only, never the only copy of data.
# Idempotent, run at every boot: after a reboot the array and its file system are reused,
# after a stop/start they are built again. Types without instance store get a plain
# directory on the root volume, and nothing else happens.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
MOUNT="$GPUCLUSTER_SCRATCH_MOUNT"
ARRAY=/dev/md0

log() { echo "gpucluster-scratch: $*"; logger -t gpucluster-scratch -- "$*" || true; }

mkdir -p "$MOUNT"
if mountpoint -q "$MOUNT"; then
  log "$MOUNT is already mounted"
  exit 0
fi

# Instance-store disks report this model (EC2 user guide, "SSD instance store volumes");
# EBS volumes report "Amazon Elastic Block Store" and are never touched.
mapfile -t DISKS < <(lsblk -dpno NAME,MODEL | awk '/Amazon EC2 NVMe Instance Storage/ {print $1}' | sort)
if [ "${#DISKS[@]}" -eq 0 ]; then
  log "no NVMe instance store on this type; $MOUNT is a directory on the root volume"
  exit 0
fi

# Already mounted elsewhere (the Deep Learning AMI mounts instance store at /opt/dlami/nvme):
# use that file system rather than tearing it down.
existing=$(lsblk -nrpo MOUNTPOINT "${DISKS[@]}" | awk 'NF {print; exit}')
if [ -n "$existing" ]; then
  mount --bind "$existing" "$MOUNT"
  chmod 1777 "$MOUNT"
  log "instance store already mounted at $existing; bound to $MOUNT"
  exit 0
fi

array=$(lsblk -nrpo NAME,TYPE "${DISKS[@]}" | awk '$2 ~ /^raid/ {print $1; exit}')
if [ -n "$array" ]; then
  DEVICE="$array"
  log "reusing assembled array $DEVICE"
elif [ "${#DISKS[@]}" -eq 1 ]; then
  DEVICE="${DISKS[0]}"
else
  log "creating RAID0 $ARRAY from ${#DISKS[@]} disks: ${DISKS[*]}"
  mdadm --create "$ARRAY" --level=0 --raid-devices="${#DISKS[@]}" --run --force "${DISKS[@]}"
  DEVICE="$ARRAY"
fi

if ! blkid -s TYPE -o value "$DEVICE" >/dev/null 2>&1; then
  if command -v mkfs.xfs >/dev/null 2>&1; then
    mkfs.xfs -f -K "$DEVICE"
  else
    mkfs.ext4 -F -E nodiscard "$DEVICE"
  fi
fi
mount -o noatime "$DEVICE" "$MOUNT"
chmod 1777 "$MOUNT"
log "mounted $DEVICE at $MOUNT ($(df -h --output=size "$MOUNT" | tail -n1 | tr -d ' '))"
