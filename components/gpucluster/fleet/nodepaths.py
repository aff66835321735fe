"""Where the node scripts put what the handlers and the CLI call on a node, and how long a hook may take.

Defined once, here, because three sides use them: the node bootstrap installs the tools at these
paths (`gpucluster.node.userdata`), the guardrail handlers run them through SSM (the Lambda
archive carries only the fleet core, so they cannot import the node side), and `gpucluster run`,
`jobs`, `logs` and `cancel` call them. Standard library only.
"""

from __future__ import annotations

INTERRUPTION_HOOK = "/usr/local/sbin/gpucluster-interruption-hook"
"""The node's once-per-boot wrapper around the checkpoint hook (node/interruption-hook.sh): the spot
warning's handler and the node's own IMDS watcher both run it, so the hook runs once."""
JOB_TOOL = "/usr/local/sbin/gpucluster-job"
"""Detached jobs as systemd units (node/job.sh): `gpucluster run --detach`, `jobs`, `logs`, `cancel`."""
JOB_LOG_DIR = "/var/log/gpucluster/jobs"
"""job.sh writes each job's output there; the CloudWatch agent ships it to the stack's run log group."""
CHECKPOINT_REQUEST = "/run/gpucluster/checkpoint-request"
"""The checkpoint contract (node/checkpoint.sh): the hook creates this file ..."""
CHECKPOINT_DONE = "/run/gpucluster/checkpoint-done"
"""... and the job touches this one once its checkpoint is saved."""
CAPACITY_BLOCK_HOOK_SECONDS = 480
"""EC2 warns 40 minutes before a Capacity Block ends and starts terminating its instances 10 minutes
later (EC2 user guide, "Monitor Capacity Blocks using EventBridge"): the pre-stop hook gets 8 of
those 10 minutes, the stop the rest. The handler waits no longer; the deploy sizes its timeout by it."""
