"""Which AWS PCS cluster is a Slurm stack's: the one tagged with its identity.

The CLI has no Pulumi CLI to read the stack's `pcs_cluster_id` output from, and the stack tags
every PCS resource with `gpucluster:stack` (aws/pcs.py), as it tags its Auto Scaling groups: so a
Slurm stack's cluster is found as they are, by tag (PCS ListClusters, then ListTagsForResource on
each: PCS lists no tags with its clusters, AWS PCS API reference "ListClusters").
"""

from __future__ import annotations

from typing import Any

from gpucluster.fleet.tags import STACK_TAG
from gpucluster.ops import OpsError


class NoPcsCluster(OpsError):
    """The Slurm stack has no PCS cluster in its region (not deployed, or deployed elsewhere)."""


def stack_pcs_cluster(identity: str, pcs_client: Any) -> str:
    """The id of the PCS cluster tagged `gpucluster:stack=identity` (NoPcsCluster when there is none)."""
    found = [c["id"] for page in pcs_client.get_paginator("list_clusters").paginate()
             for c in page.get("clusters", [])
             if pcs_client.list_tags_for_resource(resourceArn=c["arn"]).get("tags", {}).get(STACK_TAG)
             == identity]
    if not found:
        region = pcs_client.meta.region_name
        raise NoPcsCluster(f"no AWS PCS cluster in {region} is tagged {STACK_TAG}={identity}: "
                           "deploy the stack first (`pulumi up`)")
    if len(found) > 1:
        raise NoPcsCluster(f"{len(found)} AWS PCS clusters are tagged {STACK_TAG}={identity} "
                           f"({', '.join(sorted(found))}): remove the stale one")
    return found[0]
