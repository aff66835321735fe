"""Checks that need rendered artefacts, run after the stack-file language's own: the node user data
rendered as a node gets it (EC2's 16 KiB), the node role's inline policies at their longest (IAM's
per-role limit), and every physical name the program gives (AWS's name limits).

They sit above what they render (`gpucluster.node.userdata`, `gpucluster.noderole`,
`gpucluster.names`) so that `gpucluster.spec` imports none of it. `CHECKS` is the spec's checks with
these in their places, so findings come in the order they always did; `parse_stack_config` is the
spec's with them: `plan`, `cost` (through `gpucluster.project.load_stack`), the Pulumi program and
`GpuCluster`'s args all validate with it, so what validates deploys. It must never import Pulumi
or call AWS (`gpucluster cost` imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster import spec as stack_spec
from gpucluster.names import name_findings
from gpucluster.node.bundle import scripts_source
from gpucluster.node.multipart import EKS_NODE_CONFIG_BYTES, PCS_USER_DATA_BYTES, multipart_size
from gpucluster.node.userdata import MAX_USER_DATA_BYTES, gzipped_size, node_bootstrap, render_user_data
from gpucluster.noderole import (
    ROLE_INLINE_POLICIES_MAX_CHARS,
    dataset_grants,
    longest_bucket_name,
    longest_health_policy,
    longest_metrics_write_policy,
    node_inline_policies_chars,
    pcs_register_policy_document,
    run_log_group_name,
)
from gpucluster.parts import DataMount
from gpucluster.spec import PROJECT, Check, Finding, StackSpec, dataset_path
from gpucluster.spec.datasets import dataset_paths, datasets
from gpucluster.spec.node_groups import group_node_setup, mig_idle_stop

# Values known only at deploy time (generated bucket names, FSx names, the topic's ARN) are stood in
# for at their longest, but they are random where the stand-ins are not: what that costs gzip.
USER_DATA_MARGIN_BYTES = 128


def user_data_size(spec: StackSpec) -> Iterable[Finding]:
    """Each group's user data, rendered as its nodes get it, fits EC2's 16 KiB gzipped: what
    validates must deploy (the launch template's user data is rendered only during `pulumi up`).

    As GpuCluster renders it: the shipped scripts in the node scripts bundle (fetched from the
    stack's bucket, at its longest name), the loader, settings, units and the group's own files inline.
    """
    mounts = [DataMount(
        name=d.name, access=d.access, bucket_name=d.bucket_name or longest_bucket_name(i), prefix=d.prefix,
        path=dataset_path(spec, d),
        fsx_dns_name=f"fs-{'0' * 17}.fsx.{spec.region}.amazonaws.com.cn" if d.access == "fsx" else None,
        fsx_mount_name="x" * 8 if d.access == "fsx" else None,
        expected_bucket_owner=d.expected_bucket_owner or "0" * 12) for i, d in enumerate(spec.datasets)]
    topic = f"arn:aws-us-gov:sns:{spec.region}:{'0' * 12}:{spec.cluster.name}-guardrails"
    source = scripts_source(longest_bucket_name(len(spec.datasets)), "0" * 12)
    limit = MAX_USER_DATA_BYTES - USER_DATA_MARGIN_BYTES
    for i, g in enumerate(spec.node_groups):
        if any(group_node_setup(g, None, "")):
            continue  # its files or setup are reported already (unreadable, ambiguous or too big alone)
        try:
            bootstrap = node_bootstrap(spec, g, mounts, notify_topic_arn=topic)
            if spec.scheduler.slurm:
                # AWS PCS takes a MIME multi-part document (the script as a text/x-shellscript part, not
                # gzipped) and adds its own part (PCS_USER_DATA_BYTES; ledger: pcs-user-data-reserve).
                size = multipart_size(render_user_data(bootstrap, source))
                form, room = "as a MIME multi-part document", PCS_USER_DATA_BYTES
            elif spec.scheduler.eks:
                # nodeadm's NodeConfig part goes ahead of the script's (its CA known only at deploy time:
                # EKS_NODE_CONFIG_BYTES holds the longest).
                size = multipart_size(render_user_data(bootstrap, source))
                form, room = "as a MIME multi-part document", EKS_NODE_CONFIG_BYTES
            else:
                size, form, room = gzipped_size(bootstrap, source), "gzipped", 0
        except ValueError:
            continue  # a value bash cannot hold (or the MIME boundary): reported by its own check
        if size > limit - room:
            yield Finding(f"node_groups[{i}]", (
                f"node user data would be {size} bytes {form}, over {limit - room} (EC2's "
                f"{MAX_USER_DATA_BYTES} less room for deploy-time names"
                f"{' and the part ' + _extra_part(spec) if room else ''}"
                "): move files or setup to S3, or shorten "
                "hook commands"))


def _extra_part(spec: StackSpec) -> str:
    return "EKS nodeadm reads" if spec.scheduler.eks else "AWS PCS adds"


def node_role_size(spec: StackSpec) -> Iterable[Finding]:
    """Each group's node role's inline policies fit IAM's limit with every dataset and the group's
    health policy, at their longest names: what validates must deploy (a bigger policy fails
    `pulumi up` half-way)."""
    grants = [g for i, d in enumerate(spec.datasets)
              for g in dataset_grants(d.bucket_name or longest_bucket_name(i), d.prefix, d.checkpoint_prefix,
                                      d.expected_bucket_owner)]
    health = [[longest_health_policy(identity=spec.identity, cluster_name=spec.cluster.name, group=g.name,
                                     region=spec.region, replace=g.health_checks.on_failure == "replace")]
              if g.health_checks.enabled else [] for g in spec.node_groups]
    if spec.observability.prometheus.active:  # aps:RemoteWrite on the workspace, on every node role
        health = [[*more, longest_metrics_write_policy(spec.identity)] for more in health]
    if spec.scheduler.slurm:  # AWS PCS registration, on every node role of a Slurm stack
        health = [[*more, pcs_register_policy_document()] for more in health]
    images = [g.container_image for g in spec.node_groups if g.container_image]
    chars = max(node_inline_policies_chars(spec.cluster.name, grants, more,
                                           run_log_group=run_log_group_name(spec.identity), images=images,
                                           node_scripts=True)
                for more in health)
    if chars > ROLE_INLINE_POLICIES_MAX_CHARS:
        yield Finding("datasets", f"the node role's policies for {len(spec.datasets)} dataset(s) would "
                      f"reach {chars} characters; IAM allows {ROLE_INLINE_POLICIES_MAX_CHARS} per role: use "
                      "fewer datasets, shorter prefixes, or short bucket names (bucket_name)")


def resource_names(spec: StackSpec) -> Iterable[Finding]:
    """Every physical name the program gives (Pulumi's auto-names included) fits AWS's limit for it."""
    yield from name_findings(spec)


# Where each runs among the spec's checks: after the one named, as when they were stack-file checks.
_AFTER: dict[Check, Check] = {mig_idle_stop: user_data_size, datasets: node_role_size,
                              dataset_paths: resource_names}
CHECKS: list[Check] = [c for rule in stack_spec.CHECKS
                       for c in (rule, *([_AFTER[rule]] if rule in _AFTER else []))]
"""Every named check of a stack, in the order findings are reported: the spec's and these."""


def parse_stack_config(config: Mapping[str, Any], stack: str, *, project: str = PROJECT,
                       organization: str | None = None) -> StackSpec:
    """`gpucluster.spec.parse_stack_config` with every check, these included: what `plan`, `cost`,
    the Pulumi program and `GpuCluster` validate a stack with (raises `SpecError`)."""
    return stack_spec.parse_stack_config(config, stack, project=project, organization=organization,
                                         checks=CHECKS)
