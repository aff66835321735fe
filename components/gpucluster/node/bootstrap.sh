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
# Installed from the regional bucket when the AMI lacks it, so it also works through
# the VPC's S3 gateway endpoint without internet egress (CloudWatch agent user guide,
# "Download and install the CloudWatch agent using the command line").
CWA_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
if [ ! -x "$CWA_CTL" ]; then
  deb=$(mktemp --suffix=.deb)
  curl -fsSL --retry 5 -o "$deb" \
    "https://amazoncloudwatch-agent-${GPUCLUSTER_REGION}.s3.${GPUCLUSTER_REGION}.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb"
  dpkg -i -E "$deb"
  rm -f "$deb"
fi
"$CWA_CTL" -a fetch-config -m ec2 -s -c file:/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json

# After the agent, so a node whose disks fail to assemble is still seen (and stopped) when idle.
systemctl enable --now gpucluster-scratch.service

# Datasets can take long to copy: start them without holding up cloud-init.
systemctl enable gpucluster-data.service
systemctl start --no-block gpucluster-data.service
echo "gpucluster bootstrap: done $(date -Is)"
