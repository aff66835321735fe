"""Named checks of the `scheduler` section: a Slurm version AWS PCS runs, a login group without GPUs,
node groups PCS can launch, images that carry the PCS agent and Slurm, and Capacity Blocks of known size.

PCS launches compute nodes itself (EC2 Fleet, not an Auto Scaling group), one purchase option per compute
node group: on-demand, spot or a Capacity Block (AWS PCS API reference, "CreateComputeNodeGroup",
purchaseOption). So a Slurm stack's node group is either all on-demand or all spot, and has no Auto Scaling
warm pool. Every instance PCS launches (compute and login) must run the AWS PCS agent and Slurm of the
cluster's version ("Software installers to build custom AMIs for AWS PCS"): from an image baked with them
or a pinned AMI the user vouches for. Small functions returning findings; never imports Pulumi or AWS.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from gpucluster import catalog
from gpucluster.catalog import eks as eks_catalog
from gpucluster.fleet.tags import SLURM_LOGIN_GROUP
from gpucluster.spec.checks import check
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import (
    PCS_SLURM_VERSIONS,
    NodeGroupConfig,
    SchedulerConfig,
    StackSpec,
    baked_image,
)

PATH = "scheduler"


@check
def scheduler_rules(spec: StackSpec) -> Iterable[Finding]:
    s = spec.scheduler
    if s.eks:
        yield from _other_type_keys(s)
        yield from eks_rules(spec)
        return
    if not s.slurm:
        yield from _other_type_keys(s)
        return
    for key in sorted(s.model_fields_set & EKS_KEYS):
        yield Finding(f"{PATH}.{key}", "only used with type: eks")
    if s.slurm_version not in PCS_SLURM_VERSIONS:
        yield Finding(f"{PATH}.slurm_version", f"must be a Slurm version AWS PCS runs "
                      f"({', '.join(PCS_SLURM_VERSIONS)}), got {s.slurm_version!r}")
    login = catalog.get(s.login.instance_type)
    if login is not None and login.gpus > 0:
        yield Finding(f"{PATH}.login.instance_type", f"{login.name} has {login.gpus} GPUs: the login group "
                      "only submits jobs; pick a CPU type like m7i.large")
    for i, g in enumerate(spec.node_groups):
        if g.name == SLURM_LOGIN_GROUP:
            yield Finding(f"node_groups[{i}].name", f"{SLURM_LOGIN_GROUP!r} is the Slurm login group's name "
                          "on a Slurm stack: rename this node group")
        yield from pcs_group_findings(g, f"node_groups[{i}]")
        yield from pcs_name_findings(g, f"node_groups[{i}]")
    yield from _image_findings(spec)


def _image_findings(spec: StackSpec) -> Iterable[Finding]:
    """One finding when some instance PCS launches would boot an image without the PCS agent and Slurm.

    A node group is covered by scheduler.ami_id, its own ami_id, or a baked image (images.bake: on a
    Slurm stack the recipe installs both, gpucluster.node.bake). The login group has no image to bake
    and no ami_id of its own: scheduler.ami_id is its only way.
    """
    s = spec.scheduler
    if s.ami_id is not None:
        return
    bare = [g.name for g in spec.node_groups if g.ami_id is None and baked_image(spec.images, g) is None]
    # One line of at most 200 characters (spec.findings): the way for the node groups, then the login group's.
    what = f"node groups {', '.join(bare)} and login" if bare else "the login group"
    yield Finding(f"{PATH}.ami_id", f"{what} would boot without the PCS agent and Slurm {s.slurm_version}: "
                  "set an AMI with both here, or bake (images.bake) or pin (ami_id) the node groups; login "
                  "needs it here")


# The keys each scheduler type reads; a key set for another type is a finding, not silently ignored.
SLURM_KEYS = frozenset({"slurm_version", "size", "accounting", "ami_id", "login"})
EKS_KEYS = frozenset({"kubernetes_version", "endpoint_public", "teams", "max_run_minutes", "system_nodes"})


def _other_type_keys(s: SchedulerConfig) -> Iterable[Finding]:
    """Keys that only another scheduler type reads (Slurm's keys are checked in scheduler_rules' caller)."""
    own = EKS_KEYS if s.eks else frozenset()
    for key in sorted(s.model_fields_set - {"type"} - own):
        yield Finding(f"{PATH}.{key}", "only used with type: eks" if key in EKS_KEYS
                      else "only used with type: slurm")


def pcs_group_findings(g: NodeGroupConfig, path: str) -> Iterable[Finding]:
    """What a node group must be for AWS PCS to launch it as one compute node group."""
    cap = g.capacity
    if g.warm_pool is not None:
        yield Finding(f"{path}.warm_pool", "AWS PCS launches a Slurm stack's nodes itself: no Auto Scaling "
                      "warm pool (remove it, or use scheduler type none)")
    if cap.market == "mixed" and 0 < cap.spot_percent < 100:
        yield Finding(f"{path}.capacity.spot_percent", "an AWS PCS compute node group is all on-demand or "
                      f"all spot: must be 0 or 100 on a Slurm stack, got {cap.spot_percent:g}")
    elif cap.market == "capacity_block" and cap.instance_count is None:
        yield Finding(f"{path}.capacity.instance_count", "required for a Capacity Block on a Slurm stack: "
                      "the block's instance count, which caps the PCS compute node group (max_nodes)")
    elif cap.market == "mixed" and cap.spot_percent == 100 and cap.on_demand_base > 0:
        yield Finding(f"{path}.capacity.on_demand_base", "an all-spot AWS PCS compute node group has no "
                      f"on-demand base: must be 0 on a Slurm stack, got {cap.on_demand_base}")


# AWS PCS names of compute node groups and queues: 3-25 characters, a letter first (AWS PCS API reference,
# CreateComputeNodeGroup / CreateQueue; ledger: pcs-group-and-queue-names: aws-native 1.84 gives no limit).
# The spec's group names are 2-24 characters of a-z, 0-9 and '-', a letter first: only the length can miss.
PCS_NAME_MIN = 3
# pulumi-aws-native 1.84, ComputeNodeGroupSpotOptionsPropertiesAllocationStrategy: "AWS PCS supports lowest
# price, capacity optimized, and price capacity optimized".
PCS_SPOT_STRATEGIES = ("lowest-price", "capacity-optimized", "price-capacity-optimized")


def pcs_name_findings(g: NodeGroupConfig, path: str) -> Iterable[Finding]:
    """The group's name is its PCS compute node group's and queue's: what AWS PCS accepts as one."""
    if len(g.name) < PCS_NAME_MIN:
        yield Finding(f"{path}.name", f"names the AWS PCS compute node group and queue: at least "
                      f"{PCS_NAME_MIN} characters on a Slurm stack, got {g.name!r}")
    cap = g.capacity
    spot = cap.market == "mixed" and cap.spot_percent == 100
    if spot and cap.spot_allocation_strategy not in PCS_SPOT_STRATEGIES:
        yield Finding(f"{path}.capacity.spot_allocation_strategy", "AWS PCS supports "
                      f"{', '.join(PCS_SPOT_STRATEGIES)}; got {cap.spot_allocation_strategy!r}")


# ------------------------------------------------------------------------------------------ EKS


# Amazon EKS user guide, "View Amazon EKS networking requirements for VPC and subnets": the cluster's
# subnets are in at least two availability zones (ledger: eks-subnets-two-zones).
EKS_MIN_ZONES = 2


def eks_rules(spec: StackSpec, today: dt.date | None = None) -> Iterable[Finding]:
    """An EKS stack: a Kubernetes version EKS still runs (a warning with its price in extended support), a
    system node group without GPUs, and node groups of one purchase option each (their nodes' label and
    the cluster-autoscaler's priority are per group) without an Auto Scaling warm pool."""
    s = spec.scheduler
    yield from eks_version_findings(s.kubernetes_version, spec.region, today or eks_catalog.today())
    if len(spec.network.availability_zones) < EKS_MIN_ZONES:
        yield Finding("network.availability_zones", f"an EKS control plane needs subnets in at least "
                      f"{EKS_MIN_ZONES} availability zones: add a second zone (an EFA group stays in its "
                      "first)")
    if not spec.network.nat_gateway and spec.network.vpc_cidr is not None:
        yield no_nat_images_warning()
    system = catalog.get(s.system_nodes.instance_type)
    if system is not None and system.gpus > 0:
        yield Finding(f"{PATH}.system_nodes.instance_type", f"{system.name} has {system.gpus} GPUs: the "
                      "system nodes run controllers only; pick a CPU type like m7i.large")
    for i, g in enumerate(spec.node_groups):
        yield from eks_group_findings(g, f"node_groups[{i}]")


# Where the charts' images come from (each chart's default values, from memory; ledger: eks-chart-images):
# the device plugin, GPU Operator and dcgm-exporter from nvcr.io, the autoscaler, Kueue and JobSet from
# registry.k8s.io, the termination handler from public.ecr.aws, the Prometheus agent from quay.io. The
# VPC endpoints reach this region's ECR only, so without NAT none of them can be pulled.
CHART_IMAGE_REGISTRIES = ("nvcr.io", "registry.k8s.io", "public.ecr.aws", "quay.io")


def no_nat_images_warning() -> Finding:
    """An EKS stack without NAT: its nodes reach AWS through the VPC's endpoints (aws/network.py
    EKS_ENDPOINTS), but the charts' images are on public registries: a warning, not a pretence."""
    return Finding("network.nat_gateway", "nodes join through VPC endpoints, but the charts' images on "
                   f"{', '.join(CHART_IMAGE_REGISTRIES)} need internet: device plugin, autoscaler, Kueue "
                   "won't start", level="warning")


def eks_version_findings(configured: str | None, region: str, today: dt.date) -> Iterable[Finding]:
    """One finding when the version is not one EKS runs on `today`; a warning with the price when it is in
    extended support (eks_versions.yaml, eks_prices.yaml)."""
    key = f"{PATH}.kubernetes_version"
    name = eks_catalog.resolved_version(configured, today)
    found = eks_catalog.version(name)
    listed = [v.version for v in eks_catalog.versions() if v.support(today) != "ended"]
    if found is None:
        yield Finding(key, f"EKS runs Kubernetes {', '.join(listed)} (eks_versions.yaml), got {name!r}")
        return
    support = found.support(today)
    if support == "ended":
        yield Finding(key, f"EKS support of Kubernetes {name} ended on {found.extended_end}: pick one of "
                      f"{', '.join(listed)}")
    elif support == "extended":
        rates = eks_catalog.prices(region)
        fee = ""
        if rates is not None:
            hourly = rates.control_plane_usd_per_hour
            ext, std = hourly["extended"], hourly["standard"]
            fee = f"the control plane costs ${ext:g}/h instead of ${std:g}/h; "
        newest = eks_catalog.default_version(today).version
        yield Finding(key, f"Kubernetes {name} is in EKS extended support until {found.extended_end} "
                      f"(standard support ended {found.standard_end}): {fee}upgrade to {newest}",
                      level="warning")


def eks_group_findings(g: NodeGroupConfig, path: str) -> Iterable[Finding]:
    """What a node group must be to run as one EKS self-managed node group of one purchase option."""
    cap = g.capacity
    if g.warm_pool is not None:
        yield Finding(f"{path}.warm_pool", "an EKS node joins the cluster at its first boot: a warm pool's "
                      "stopped instances would linger as NotReady nodes (remove it, or use type none)")
    if cap.market == "mixed" and 0 < cap.spot_percent < 100:
        yield Finding(f"{path}.capacity.spot_percent", "an EKS node group is all on-demand or all spot (its "
                      "nodes' purchase label and the autoscaler's priority are per group): must be 0 or "
                      f"100, got {cap.spot_percent:g}")
    elif cap.market == "mixed" and cap.spot_percent == 100 and cap.on_demand_base > 0:
        yield Finding(f"{path}.capacity.on_demand_base", "an all-spot EKS node group has no on-demand "
                      f"base: must be 0 on an EKS stack, got {cap.on_demand_base}")
