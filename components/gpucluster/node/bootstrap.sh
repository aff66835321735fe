#!/bin/bash
# gpucluster node bootstrap (EC2 user data, rendered by components/bootstrap for @@LABEL@@).
# Runs once at first boot: writes the node's settings and helper scripts, splits the GPUs into
# the group's MIG instances (if it has a layout), then starts the GPU health check (the launch
# lifecycle hook waits for it), the spot-interruption watcher, the CloudWatch agent (GPU metrics,
# which auto-stop alarms on), the NVMe scratch volume and the dataset mounts. The MIG, health,
# scratch and data units run again at every boot, since MIG instances and instance-store disks do
# not survive one.
set -euo pipefail
exec > >(tee -a /var/log/gpucluster-bootstrap.log) 2>&1
echo "gpucluster bootstrap: start $(date -Is)"
umask 022
# Boot milestones (gpucluster-ready publishes them as BootStepAtSeconds): seconds since boot now, and
# once the node scripts are fetched and the node's files written.
install -d -m 0755 /run/gpucluster
echo "userdata $(cut -d. -f1 /proc/uptime)" >> /run/gpucluster/boot-steps
install -d -m 0755 /etc/gpucluster /usr/local/sbin /etc/systemd/system \
  /opt/aws/amazon-cloudwatch-agent/etc

# The node scripts, when they ship outside the user data: fetched from the stack's bucket, checked
# against the sha256 rendered here, unpacked; a bundle that fails either ends the boot here.
@@SCRIPTS@@
@@FILES@@

# shellcheck source=/dev/null
. /etc/gpucluster/node.env
echo "bundle $(cut -d. -f1 /proc/uptime)" >> /run/gpucluster/boot-steps
systemctl daemon-reload

# The operating system (gpucluster-os, from /etc/os-release): the node scripts install with its own
# package manager. One they do not support ends the boot here, before anything is installed or started.
if ! os=$(/usr/local/sbin/gpucluster-os 2>&1); then
  echo "gpucluster bootstrap: FAILED: $os $(date -Is)"
  exit 1
fi

# Before the first install: Ubuntu's own package updates (unattended-upgrades, apt-daily) would hold
# the dpkg lock for minutes at first boot. Stopped and masked for this node's life (a baked image
# has them off already); the installs still wait for the lock (gpucluster-install) in case one runs.
# Amazon Linux 2023 installs no updates by itself (ledger: al2023-node-packages); dnf waits for its lock.
if [ "$os" = ubuntu ]; then
  apt=(unattended-upgrades.service apt-daily{,-upgrade}.{timer,service})
  systemctl stop "${apt[@]}" && systemctl mask "${apt[@]}" || echo "gpucluster bootstrap: apt not stopped"
fi

# MIG first: nothing may run on a GPU before it is split (gpucluster-mig; setup requires it). The
# units are enabled before, so the one reboot MIG mode may need (an A100 passed through to a VM
# leaves it pending) brings the node up complete: systemd then starts them all, MIG first, and the
# health check after it answers the launch hook, which waits through the reboot.
mig_failed=""
if [ -n "$GPUCLUSTER_MIG_LAYOUTS" ]; then
  systemctl enable gpucluster-mig.service gpucluster-agent.service gpucluster-scratch.service \
    gpucluster-data.service gpucluster-setup.service gpucluster-activity.timer
  if [ "$GPUCLUSTER_WATCH_SPOT" = "true" ]; then systemctl enable gpucluster-spot-watcher.service; fi
  if [ "$GPUCLUSTER_HEALTH_CHECKS" = "true" ]; then
    systemctl enable gpucluster-health-launch.service gpucluster-health-check.timer
  fi
  if ! systemctl start gpucluster-mig.service; then
    if [ -e /run/gpucluster/mig-reboot ]; then
      echo "gpucluster bootstrap: MIG mode takes effect after a reboot: rebooting (once)"
      systemctl reboot
      exit 0
    fi
    mig_failed=1
    echo "gpucluster bootstrap: MIG layout NOT applied (journalctl -u gpucluster-mig): setup will not run"
  fi
fi

# The health check next (after MIG, which it checks): the group's launch lifecycle hook holds this
# node until it answers, and whatever fails later in this script must not keep it from answering.
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
# Every minute: does a GPU process or a gpucluster job run here (gpucluster-report activity, NodeActive)?
systemctl enable --now gpucluster-activity.timer

# After the agent, so a node whose disks fail to assemble is still seen (and stopped) when idle.
if ! systemctl enable --now gpucluster-scratch.service; then
  echo "gpucluster bootstrap: scratch failed (reported); datasets wait for it"
fi

# Datasets can take long to copy: start them without holding up cloud-init.
systemctl enable gpucluster-data.service
systemctl start --no-block gpucluster-data.service
systemctl enable gpucluster-setup.service && systemctl start --no-block gpucluster-setup.service
if [ -n "$mig_failed" ]; then
  echo "gpucluster bootstrap: FAILED: the GPUs have no MIG layout (NodeStepFailed, Step=mig) $(date -Is)"
  exit 1
fi
echo "gpucluster bootstrap: done $(date -Is)"
