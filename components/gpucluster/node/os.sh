#!/bin/bash
# gpucluster-os: which operating system this node runs, read from os-release(5), as the one name the
# other node scripts branch on: `ubuntu` (Ubuntu 22.04 or 24.04: apt, the job user `ubuntu`) or
# `al2023` (Amazon Linux 2023: dnf, the job user `ec2-user`). `gpucluster-os user` prints the job
# user instead (the AMI's default user, uid 1000: gpucluster.slurm.remote.JOB_UID). Any other system
# is refused: one line on stderr naming what it is and what is supported, exit 1; the bootstrap
# stops there (its FAILED line), before anything is installed.
# The same names and versions as gpucluster.ops.amis.SUPPORTED (doctor reads an AMI with them).
set -euo pipefail
OS_RELEASE="${GPUCLUSTER_OS_RELEASE:-/etc/os-release}"
SUPPORTED="Ubuntu 22.04, Ubuntu 24.04 or Amazon Linux 2023"

ID="" VERSION_ID="" PRETTY_NAME=""
if [ -r "$OS_RELEASE" ]; then
  # shellcheck source=/dev/null
  . "$OS_RELEASE"
fi
case "$ID:$VERSION_ID" in
  ubuntu:22.04 | ubuntu:24.04) family=ubuntu user=ubuntu ;;
  amzn:2023) family=al2023 user=ec2-user ;;
  *)
    echo "unsupported operating system ${PRETTY_NAME:-${ID:-unknown}${VERSION_ID:+ $VERSION_ID}}" \
      "($OS_RELEASE): gpucluster's node scripts run on $SUPPORTED" >&2
    exit 1
    ;;
esac
case "${1:-family}" in
  family) echo "$family" ;;
  user) echo "$user" ;;
  *) echo "usage: gpucluster-os [family|user]" >&2; exit 2 ;;
esac
