#!/bin/bash
# gpucluster-install on a node launched from a baked image: nothing is installed on its launch path.
# The image (EC2 Image Builder, gpucluster:images) carries the CloudWatch agent, the Lustre client,
# Mountpoint for S3 and the container image; a unit that asks for one of them here found it missing,
# so this refuses loudly (exit 1: the unit fails, gpucluster-report publishes NodeStepFailed, and
# gpucluster-ready abandons the launch with the reason) instead of downloading it at boot.
set -uo pipefail
what="${1:-?}"
msg="refusing to install $what at boot: this node launched from a baked image that should carry it; rebuild the image (gpucluster image build) and move the group's images.groups.<group>.ami_id"
echo "gpucluster-install: $msg" >&2
logger -t gpucluster-install -- "$msg" 2>/dev/null || true
exit 1
