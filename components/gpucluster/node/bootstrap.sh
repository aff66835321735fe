#!/bin/bash
# gpucluster node bootstrap (EC2 user data, rendered by components/bootstrap for @@LABEL@@).
# Runs once at first boot: writes the node's settings and helper scripts, then starts the
# spot-interruption watcher, the CloudWatch agent (GPU utilisation, which auto-stop alarms
# on), the NVMe scratch volume and the dataset mounts. The scratch and data units run again
# at every boot, since instance-store disks come back empty after a stop.
set -euo pipefail
exec > >(tee -a /var/log/gpucluster-bootstrap.log) 2>&1
echo "gpucluster bootstrap: start $(date -Is)"
umask 022
install -d -m 0755 /etc/gpucluster /usr/local/sbin /etc/systemd/system \
  /opt/aws/amazon-cloudwatch-agent/etc

@@FILES@@

# shellcheck source=/dev/null
. /etc/gpucluster/node.env
systemctl daemon-reload

if [ "$GPUCLUSTER_WATCH_SPOT" = "true" ]; then
  systemctl enable --now gpucluster-spot-watcher.service
fi

# CloudWatch agent first: auto-stop can only stop an idle node it hears from.
# It publishes nvidia_smi_utilization_gpu per Auto Scaling group.
# Installed when the AMI lacks it: a pinned version from the regional bucket (so it also works
# through the VPC's S3 gateway endpoint), its signature checked first (gpucluster-install).
CWA_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
if [ ! -x "$CWA_CTL" ]; then
  /usr/local/sbin/gpucluster-install cloudwatch-agent
fi
"$CWA_CTL" -a fetch-config -m ec2 -s -c file:/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json

# After the agent, so a node whose disks fail to assemble is still seen (and stopped) when idle.
systemctl enable --now gpucluster-scratch.service

# Datasets can take long to copy: start them without holding up cloud-init.
systemctl enable gpucluster-data.service
systemctl start --no-block gpucluster-data.service
systemctl enable gpucluster-setup.service && systemctl start --no-block gpucluster-setup.service
echo "gpucluster bootstrap: done $(date -Is)"
