"""The tag keys gpucluster puts on what it creates, in one place.

The standard library only: the guardrail handlers read them in AWS, and the Pulumi
program, the spec, node roles and the CLI tag and select by the same keys without
importing a handler (whose boto3 a plan would otherwise load).
"""

from __future__ import annotations

STACK_TAG = "gpucluster:stack"
"""The deployment's identity (`StackSpec.identity`): guardrails, IAM conditions and the CLI select by it."""
CLUSTER_TAG = "gpucluster:cluster"
NODE_GROUP_TAG = "gpucluster:node-group"
"""The node group (as named in the stack file) an Auto Scaling group or instance belongs to."""
SLURM_LOGIN_GROUP = "login"
"""A Slurm stack's login node group: its NODE_GROUP_TAG value and PCS name (no node group may take it)."""

MAX_NODES_TAG = "gpucluster:max-nodes"
"""On an EKS stack's Auto Scaling groups: the group's configured maximum. A stop there sets MaxSize to 0
too (the cluster-autoscaler would scale a group whose maximum it can still reach back up for a pending
pod), and a start puts this maximum back (`asg.AutoScalingCapacity`)."""

STOPPED_BY_TAG = "gpucluster:stopped-by"
PREVIOUS_DESIRED_TAG = "gpucluster:previous-desired"
PREVIOUS_MIN_TAG = "gpucluster:previous-min"
STATE_TAGS = (STOPPED_BY_TAG, PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG)
"""A stopped group's stop state: who stopped it and the capacity to restore."""
