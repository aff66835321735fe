"""The EKS cluster's name, which the Pulumi component gives it and the day-2 commands look up by.

Pure (standard library only): `gpucluster.aws.eks` names the cluster with it, and `ops` asks EKS for
that one cluster (DescribeCluster on its name) instead of listing and describing every cluster in the
account, which an operator's policy need not allow.
"""

from __future__ import annotations

import hashlib


def eks_cluster_name(cluster_name: str, identity: str) -> str:
    """The EKS cluster's name: unique per account and region, as EKS names are, so the identity's hash keeps
    two stacks with the same cluster name apart (as the PCS cluster's). At most 24 + 9 characters: within
    EKS's 100 (`[0-9A-Za-z][A-Za-z0-9\\-_]*`, pulumi-aws 7 ClusterArgs.name)."""
    return f"{cluster_name}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"
