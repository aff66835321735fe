#!/bin/bash
# gpucluster node bootstrap (EC2 user data, rendered by components/bootstrap for @@LABEL@@).
# Runs once at first boot: writes the node's settings and helper scripts, then starts the
# GPU health check (the launch lifecycle hook waits for it), the spot-interruption watcher,
# the CloudWatch agent (GPU metrics, which auto-stop alarms on), the NVMe scratch volume and
# the dataset mounts. The scratch and data units run again
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

# The health check first: the group's launch lifecycle hook holds this node until it answers, and
# whatever fails later in this script must not keep it from answering.
if [ "$GPUCLUSTER_HEALTH_CHECKS" = "true" ]; then
  systemctl enable gpucluster-health-launch.service gpucluster-health-check.timer
  systemctl start --no-block gpucluster-health-launch.service
  systemctl start gpucluster-health-check.timer
fi

if [ "$GPUCLUSTER_WATCH_SPOT" = "true" ]; then
  systemctl enable --now gpucluster-spot-watcher.service
fi

# The agent, the disks and the datasets each run as a unit of their own: a step that fails (a busy
# dpkg lock at first boot, a download that does not verify, a bucket that does not answer) is
# retried by systemd a bounded number of times and reported after every run (gpucluster-report:
# metric gpucluster NodeStepFailed), and never stops the others.
# CloudWatch agent first: auto-stop can only stop an idle node it hears from (it publishes
# nvidia_smi_utilization_gpu per Auto Scaling group). Installed when the AMI lacks it: a pinned
# version from the regional bucket, its signature checked first (gpucluster-install).
systemctl enable gpucluster-agent.service
systemctl start --no-block gpucluster-agent.service

# After the agent, so a node whose disks fail to assemble is still seen (and stopped) when idle.
if ! systemctl enable --now gpucluster-scratch.service; then
  echo "gpucluster bootstrap: scratch failed (reported); datasets wait for it"
fi

# Datasets can take long to copy: start them without holding up cloud-init.
systemctl enable gpucluster-data.service
systemctl start --no-block gpucluster-data.service
systemctl enable gpucluster-setup.service && systemctl start --no-block gpucluster-setup.service
echo "gpucluster bootstrap: done $(date -Is)"
