"""GpuNodeGroup: one GPU node group as a launch template and an Auto Scaling group, in any VPC.

It owns how GPU nodes are launched: the AMI (the AWS Deep Learning AMI's public
SSM parameter unless overridden, resolved once and kept until `ami_id` says
otherwise), IMDSv2 only, an encrypted gp3 root volume,
the EFA interface layout (`nics.py`), the user data (`bootstrap`), and the
capacity mix: on-demand base, spot above it, instance-type fallbacks, on-demand
capacity reservations and Capacity Blocks. Nodes are ASG capacity, never
resources of their own, so a plan's size does not depend on node counts.
Pulumi sets the desired capacity only at creation: after that it belongs to
the guardrails and to users, and so are the stop-state tags they write (the
group's own provider ignores them). With `health_checks` on, a launch lifecycle hook
holds every new node until its own GPU check answers (`aws/health.py`), and the
nodes' role gets a policy to answer for this group only. It never gives a node a public address. It takes
its subnets, security groups, placement group and instance profile as ids, so
it drops into a VPC gpucluster did not build. On a Slurm stack (`scheduler: slurm`) AWS PCS
launches the nodes from the launch template alone (`gpucluster.aws.pcs`): no Auto Scaling group, no
launch hook; the placement group and an on-demand reservation go in the template, the user data is
a MIME multi-part document (`node/multipart.py`). On an EKS stack (`scheduler: eks`) the group stays an
Auto Scaling group and becomes an EKS self-managed node group: the EKS-optimised Amazon Linux 2023 NVIDIA
AMI of the cluster's Kubernetes version (its public SSM parameter, resolved once like the default AMI)
unless the group pins one, a `nodeadm` NodeConfig part ahead of the bootstrap in MIME user data, the
`kubernetes.io/cluster/<name>` tag and the cluster-autoscaler's node-template tags (`eks_asg_tags`: a group
scales from zero), and a termination lifecycle hook so the termination handler drains a node before any
scale-in (a guard's stop included) takes it.
"""

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NotRequired, TypedDict, get_args

import pulumi
import pulumi_aws as aws

from gpucluster.aws.amis import root_device
from gpucluster.aws.args import (
    GpuNodeGroupModel,
    NodeScriptsSource,
    component_options,
    node_group_checks,
    owned_tags,
    type_token,
    validate,
)
from gpucluster.aws.health import GROUP_METRICS, health_policy_document, launch_hook
from gpucluster.aws.nics import network_interfaces
from gpucluster.aws.settings import (
    AutoStopSettings,
    ImageGroupSettings,
    NodeGroupSettings,
    ObservabilitySettings,
    SpotSettings,
)
from gpucluster.catalog import eks as eks_catalog
from gpucluster.fleet.tags import MAX_NODES_TAG, NODE_GROUP_TAG
from gpucluster.node.bundle import scripts_source
from gpucluster.node.metrics import group_metrics
from gpucluster.node.multipart import (
    GPU_TAINT,
    PCS_USER_DATA_BYTES,
    encode_multipart_user_data,
    node_config,
    node_labels,
    purchase_label,
)
from gpucluster.node.userdata import (
    MAX_USER_DATA_BYTES,
    encode_user_data,
    group_bootstrap,
    render_user_data,
)
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.parts import DataMount
from gpucluster.spec import CapacityConfig, NodeGroupConfig

# AWS Deep Learning AMI developer guide, release notes of "AWS Deep Learning Base OSS Nvidia
# Driver GPU AMI (Ubuntu 22.04)" ("Query AMI-ID with SSM Parameter"); x86_64, all our GPU types.
DEFAULT_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
# The termination hook of an EKS group: the AWS Node Termination Handler (queue mode) drains the node and
# completes the action; past the timeout the instance terminates anyway (CONTINUE). EC2 Auto Scaling user
# guide, "Amazon EC2 Auto Scaling lifecycle hooks"; the drain time is ours (ledger: eks-drain-hook).
DRAIN_HOOK_NAME = "gpucluster-drain"
TERMINATE_TRANSITION = "autoscaling:EC2_INSTANCE_TERMINATING"
DRAIN_TIMEOUT_SECONDS = 600
# cluster-autoscaler's AWS provider (its README, "Auto-Discovery Setup" and "Scaling a node group to 0";
# ledger: eks-autoscaler-node-template-tags): the tags it discovers a group by and reads the nodes of an
# empty group from.
AUTOSCALER_TAG = "k8s.io/cluster-autoscaler"
IMDS_HOP_LIMIT = 2  # one hop more than the host, so containers reach IMDSv2 (EC2 user guide, IMDS)
LATEST = "$Latest"
OLD_TYPE = "gpucluster:nodes:GpuNodeGroup"
# The tags the guardrail Lambdas write on a group they stop (components/gpucluster/fleet/tags.py:
# gpucluster:stopped-by, gpucluster:previous-desired, gpucluster:previous-min). `resume` and the start
# schedule need them, so Pulumi must never take them into its state.
STOP_STATE_TAG_PREFIXES = ("gpucluster:stopped-", "gpucluster:previous-")
# Provider settings that are secrets in stack config (`pulumi config set --secret aws:secretKey`).
SECRET_PROVIDER_KEYS = ("access_key", "secret_key", "token")


# ------------------------------------------------------------ pure capacity mapping


def instances_distribution(capacity: CapacityConfig) -> dict[str, Any]:
    """The mixed-instances distribution: on-demand base, then `spot_percent` spot above it.

    EC2 Auto Scaling user guide, "Auto Scaling groups with multiple instance types and
    purchase options": the base is filled on-demand first (where reservations, RIs and
    Savings Plans apply), the percentage splits everything above it.
    """
    return {
        "on_demand_base_capacity": capacity.on_demand_base,
        "on_demand_percentage_above_base_capacity": 100 - int(capacity.spot_percent),
        "on_demand_allocation_strategy": capacity.on_demand_allocation_strategy,
        "spot_allocation_strategy": capacity.spot_allocation_strategy,
    }


def instance_overrides(group: NodeGroupConfig) -> list[dict[str, str]]:
    """One override per instance type, in preference order: the fallbacks when one has no capacity."""
    return [{"instance_type": name} for name in group.instance_types]


def asg_capacity_reservation(capacity: CapacityConfig) -> dict[str, Any] | None:
    """The group-level reservation target of a mixed group with an on-demand capacity reservation.

    EC2 Auto Scaling user guide, "Target Capacity Reservations from your Auto Scaling
    group": set on the group (not the launch template), it applies to on-demand launches
    only, so spot launches above the base are untouched; `capacity-reservations-first`
    falls back to plain on-demand when the reservation is full instead of failing.
    """
    if capacity.market != "mixed" or capacity.capacity_reservation_id is None:
        return None
    return {"capacity_reservation_preference": "capacity-reservations-first",
            "capacity_reservation_target": {"capacity_reservation_ids": [capacity.capacity_reservation_id]}}


def capacity_block_options(capacity: CapacityConfig) -> dict[str, Any]:
    """Launch template settings of a Capacity Block group (empty for mixed groups).

    EC2 Auto Scaling user guide, "Use Capacity Blocks for machine learning workloads": the
    launch template names the market type `capacity-block` and the block's reservation id.
    """
    if capacity.market != "capacity_block":
        return {}
    return {"instance_market_options": {"market_type": "capacity-block"},
            "capacity_reservation_specification": {
                "capacity_reservation_target": {"capacity_reservation_id": capacity.capacity_reservation_id}}}


def node_tags(tags: Mapping[str, str], identity: str, cluster_name: str, group: str) -> dict[str, str]:
    """Tags of everything a node group creates: the caller's, the identity tags and the group."""
    return {**owned_tags(tags, identity, cluster_name), NODE_GROUP_TAG: group,
            "Name": f"{cluster_name}-{group}"}


def ami_ignore_changes(group: NodeGroupConfig) -> list[str]:
    """The AMI read from an SSM parameter is resolved once, at creation, and then kept.

    The default parameter names the *latest* Deep Learning AMI: followed on every `pulumi up`,
    each AMI release would make a new launch template version (and new nodes differ from the
    running ones) without anyone asking. The AMI changes only when `ami_id` is set or changed,
    which takes this away (README, "Upgrading the AMI").
    """
    return [] if group.ami_id else ["imageId"]


def camel(name: str) -> str:
    """`shared_config_files` -> `sharedConfigFiles`: a provider argument's stack config key."""
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def stack_provider_args() -> dict[str, Any]:
    """The stack's `aws:*` config as `aws.Provider` arguments: what the default provider is given.

    An explicit provider reads no stack config (Pulumi docs, "Providers"), so without this a
    stack's `aws:profile`, `aws:assumeRoles` or `aws:allowedAccountIds` would not reach it and it
    could act with other credentials than the rest of the stack. String settings pass as written,
    structured ones (lists, objects, booleans, numbers) as the JSON their config value holds.
    """
    config = pulumi.Config("aws")
    args: dict[str, Any] = {}
    for param, info in inspect.signature(aws.ProviderArgs.__init__).parameters.items():
        if param == "__self__":
            continue
        key = camel(param)
        if param in SECRET_PROVIDER_KEYS:
            if (secret := config.get_secret(key)) is not None:
                args[param] = secret
            continue
        raw = config.get(key)
        if raw is None:
            continue
        if get_args(info.annotation)[:1] == (str,):
            args[param] = raw
        else:
            try:
                args[param] = json.loads(raw)
            except json.JSONDecodeError:
                args[param] = raw
    return args


def asg_ignore_tags(configured: Any = None) -> aws.ProviderIgnoreTagsArgs:
    """The stack's own `aws:ignoreTags` plus the stop-state tag prefixes."""
    configured = configured if isinstance(configured, Mapping) else {}
    prefixes = [*configured.get("keyPrefixes", []),
                *(p for p in STOP_STATE_TAG_PREFIXES if p not in configured.get("keyPrefixes", []))]
    return aws.ProviderIgnoreTagsArgs(keys=list(configured.get("keys", [])) or None, key_prefixes=prefixes)


def baked_ami(m: GpuNodeGroupModel) -> str | None:
    """The pinned baked image the group launches from, or None (today's path)."""
    return m.image.ami_id if m.image is not None else None


def volume_initialization_rate(m: GpuNodeGroupModel) -> int | None:
    """MiB/s at which EBS initializes the root volume of a node launched from the group's pinned baked
    image, or None (EBS's default rate).

    A volume created from a snapshot (an AMI's root) fetches each block from S3 on its first read
    (EBS user guide, "Initialize Amazon EBS volumes"): the OS and the image's ~10 GB of container
    layers would be read at that speed by the first boot and the first job. A provisioned rate
    (botocore's ec2 model, LaunchTemplateEbsBlockDeviceRequest.VolumeInitializationRate: 100-300
    MiB/s, only for volumes created from snapshots) initializes it at a predictable rate after
    creation; Fast Snapshot Restore is the other option (the volume is fully initialized at creation,
    billed per snapshot and zone while enabled), left to the user: it lives on the AMI's snapshot.
    That the rate applies to the root volume through a launch template mapping that names no
    snapshot is unverified (ledger: ebs-volume-initialization-rate).
    """
    if baked_ami(m) is None or m.image is None:
        return None
    return m.image.volume_initialization_mibps or None


def plain_template(group: NodeGroupConfig) -> bool:
    """A plain launch template naming the one instance type (no mixed instances policy): Capacity
    Blocks and warm-pool groups."""
    return group.capacity.market == "capacity_block" or group.warm_pool is not None


def warm_pool(group: NodeGroupConfig) -> aws.autoscaling.GroupWarmPoolArgsDict | None:
    """The Auto Scaling warm pool of a group that asks for one: stopped instances (EBS only).

    EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto Scaling": `Stopped` instances
    are charged for their EBS volumes, not instance hours; a warm instance goes through the same
    launch lifecycle hook (Warmed:Pending:Wait) before it is stopped, and again when it is started
    into service. max_group_prepared_capacity -1 (the default) means the group's maximum.
    """
    pool = group.warm_pool
    if pool is None:
        return None
    return {"pool_state": "Stopped", "min_size": pool.min_size,
            "max_group_prepared_capacity": pool.max_prepared if pool.max_prepared is not None else -1,
            "instance_reuse_policy": {"reuse_on_scale_in": pool.reuse_on_scale_in}}


def pinned_ami(m: GpuNodeGroupModel) -> str | None:
    """The AMI the group launches from when one is named: its baked image, its ami_id, or (a Slurm
    stack) the scheduler's AMI; None: the default SSM parameter's, resolved at creation."""
    return baked_ami(m) or m.node_group.ami_id or (m.slurm_ami_id if m.scheduler == "slurm" else None)


def pcs_launch_options(group: NodeGroupConfig, placement_group: pulumi.Input[str] | None) -> dict[str, Any]:
    """What a Slurm stack's launch template carries that an Auto Scaling group would have held.

    AWS PCS launches from the template alone, so the cluster placement group (EFA) goes in the
    template's placement, and an on-demand group's capacity reservation in its
    capacity_reservation_specification (EC2 user guide, "Launch instances into an existing Capacity
    Reservation"; AWS PCS user guide, "Using Amazon EC2 Capacity Reservations with AWS PCS", from
    memory). A Capacity Block's market type and reservation are there already (`capacity_block_options`).
    """
    # Unlike the Auto Scaling group's capacity-reservations-first, a template's target does not fall
    # back to plain on-demand when the reservation is full.
    options: dict[str, Any] = {}
    if placement_group is not None:
        options["placement"] = {"group_name": placement_group}
    capacity = group.capacity
    if (capacity.market == "mixed" and capacity.capacity_reservation_id is not None
            and capacity.spot_percent == 0):
        options["capacity_reservation_specification"] = {
            "capacity_reservation_target": {"capacity_reservation_id": capacity.capacity_reservation_id}}
    return options


def eks_purchase(group: NodeGroupConfig) -> str:
    """The group's purchase label on EKS (on-demand, spot or capacity-block)."""
    return purchase_label(group.capacity.market, group.capacity.spot_percent)


def eks_asg_tags(group: NodeGroupConfig, cluster: str, mig_strategy: str | None = None) -> dict[str, str]:
    """The Auto Scaling group's tags on an EKS stack: ownership by the cluster, the cluster-autoscaler's
    discovery, and its node template (labels, the GPU taint, the GPU resources and EFA devices of the
    group's first type), so it scales a group up from zero nodes. A MIG group's GPU resources are what the
    GPU Operator's device plugin will advertise under the stack's `mig_strategy` (`queues.mig_strategy`),
    the same figures Kueue's quota counts (`queues.node_gpu_resources`)."""
    # Imported here: only an EKS stack loads gpucluster.eks (tests/test_speed.py pins a dev plan's modules).
    from gpucluster.eks.labels import EFA_RESOURCE
    from gpucluster.eks.queues import node_gpu_resources

    first = group.types[0]
    template = f"{AUTOSCALER_TAG}/node-template"
    tags = {f"kubernetes.io/cluster/{cluster}": "owned", f"{AUTOSCALER_TAG}/enabled": "true",
            f"{AUTOSCALER_TAG}/{cluster}": "owned",
            # a guard's stop zeroes MaxSize on EKS and a start puts this back (fleet/asg.py)
            MAX_NODES_TAG: str(group.max_nodes)}
    tags |= {f"{template}/label/{k}": v for k, v in node_labels(group.name, eks_purchase(group)).items()}
    key, value, effect = GPU_TAINT
    tags[f"{template}/taint/{key}"] = f"{value}:{effect}"
    for resource, count in node_gpu_resources(first.gpus, group.mig_layout, mig_strategy).items():
        tags[f"{template}/resources/{resource}"] = str(count)
    if group.efa_enabled:
        efa = sum(1 for nic in network_interfaces(first, True) if nic.interface_type in ("efa", "efa-only"))
        tags[f"{template}/resources/{EFA_RESOURCE}"] = str(efa)
    return tags


def can_hold_spot(group: NodeGroupConfig) -> bool:
    return group.capacity.market == "mixed" and group.capacity.spot_percent > 0


# ------------------------------------------------------------------------ component


class NodeDataMount(TypedDict):
    """One dataset as the node bootstrap brings it to the GPUs."""

    name: str
    """Dataset name (2-24 characters a-z, 0-9, '-'); the node's systemd units carry it."""
    access: str
    """copy_to_scratch (to NVMe at boot), mount (Mountpoint for S3) or fsx (FSx for Lustre)."""
    bucket_name: pulumi.Input[str]
    """The bucket the data is in."""
    prefix: NotRequired[str]
    """The data's prefix in the bucket (folder-like, ending in '/'; default: the whole bucket)."""
    path: str
    """Where the data appears on the node (scratch sub-folder, mount point, or FSx mount path)."""
    fsx_dns_name: NotRequired[pulumi.Input[str]]
    """access fsx: the file system's DNS name."""
    fsx_mount_name: NotRequired[pulumi.Input[str]]
    """access fsx: the file system's Lustre mount name."""
    fsx_client_key_fingerprints: NotRequired[list[str]]
    """access fsx: the fingerprints AWS's Lustre client apt key may have (40 hex digits; none: not pinned)."""
    expected_bucket_owner: NotRequired[pulumi.Input[str]]
    """The 12-digit account that must own the bucket: the nodes' S3 calls name it (default: none named)."""


class EksNodeSettings(TypedDict):
    """The EKS cluster a GPU node group's nodes join (GpuNodeGroupArgs.eks): what nodeadm is told."""

    cluster_name: str
    """The EKS cluster's name."""
    endpoint: pulumi.Input[str]
    """Its API server endpoint."""
    certificate_authority: pulumi.Input[str]
    """Its CA, base64."""
    service_cidr: pulumi.Input[str]
    """Its service CIDR."""
    kubernetes_version: str
    """Its Kubernetes version (the AMI's SSM parameter names it)."""
    mig_strategy: NotRequired[str]
    """single or mixed: the GPU Operator's MIG strategy on a stack with MIG groups (`queues.mig_strategy`),
    so a MIG group's autoscaler tags name what its nodes advertise."""


class GpuNodeGroupArgs(TypedDict):
    """A GPU node group in any VPC: subnets, security groups, an instance profile, and its settings."""

    node_group: NodeGroupSettings
    """The group as a stack file's node_groups entry spells it (availability_zones: checks only)."""
    cluster_name: str
    """Short name in the nodes' Name tag and in descriptions (2-24 characters a-z, 0-9, '-')."""
    region: str
    """AWS region the nodes run in, e.g. us-east-1 (the node bootstrap uses it)."""
    identity: str
    """The gpucluster:stack tag value: the guardrails and the CLI find the group and its nodes by it."""
    subnet_ids: pulumi.Input[list[pulumi.Input[str]]]
    """Private subnets the group launches into (one with EFA); the ASG spreads nodes over them."""
    security_group_ids: pulumi.Input[list[pulumi.Input[str]]]
    """Security groups of every network interface (EFA: one allowing all traffic within itself)."""
    placement_group_name: NotRequired[pulumi.Input[str]]
    """A cluster placement group to launch into (EFA groups; not with Capacity Blocks)."""
    instance_profile_arn: pulumi.Input[str]
    """The instance profile the nodes run as (SSM and CloudWatch agent permissions at least)."""
    tags: NotRequired[dict[str, str]]
    """Tags for the launch template, the ASG and (propagated) every node, volume and interface."""
    spot: NotRequired[SpotSettings]
    """The spot-interruption hook the nodes' watcher runs, as a stack file's spot section."""
    data_mounts: NotRequired[list[NodeDataMount]]
    """Datasets the node bootstrap brings to the GPUs."""
    autostop: NotRequired[AutoStopSettings]
    """The stack's autostop section: a failing node runs its pre_stop_command before it is replaced."""
    node_role_name: NotRequired[pulumi.Input[str]]
    """The role in instance_profile_arn: it gets the group's health permission (needed with health checks)."""
    notify_topic_arn: NotRequired[pulumi.Input[str]]
    """SNS topic the nodes publish health findings to (empty or absent: none)."""
    notify_key_arn: NotRequired[pulumi.Input[str]]
    """The KMS key of an encrypted notify_topic_arn."""
    observability: NotRequired[ObservabilitySettings]
    """The stack's observability section: with prometheus on, nodes run dcgm-exporter and a collector."""
    remote_write_url: NotRequired[pulumi.Input[str]]
    """The stack's AMP workspace remote-write URL (observability.prometheus.enabled)."""
    image: NotRequired[ImageGroupSettings]
    """The group's pinned baked image (ami_id, driver, cuda): launch from it, install nothing at boot."""
    scheduler: NotRequired[str]
    """none (default): an Auto Scaling group launches the nodes; slurm: AWS PCS does, from the launch
    template alone (no Auto Scaling group, placement and reservation in the template, MIME user data);
    eks: an Auto Scaling group as an EKS self-managed node group (needs `eks`)."""
    slurm_ami_id: NotRequired[str]
    """slurm: the AMI (PCS agent and Slurm) of a group with neither a baked image nor an ami_id."""
    eks: NotRequired[EksNodeSettings]
    """eks: the cluster the nodes join (name, endpoint, CA, service CIDR, Kubernetes version)."""
    node_scripts: NotRequired[NodeScriptsSource]
    """A NodeScripts bucket (its `source`): nodes fetch the shipped scripts from it and check their
    sha256, the user data keeps only the loader and settings (absent: every script in the user data,
    within EC2's 16 KiB). The role of instance_profile_arn needs NodeIdentityArgs.node_scripts."""


class GpuNodeGroup(pulumi.ComponentResource):
    """A GPU node group: a launch template and an Auto Scaling group, dropped into any VPC.

    The Auto Scaling group is managed through an aws provider of its own (the stack's `aws:*`
    settings plus `ignore_tags` for the guardrails' stop-state tags), unless an aws provider is
    passed in `opts`: that one must ignore the tag prefixes `STOP_STATE_TAG_PREFIXES` itself.
    Python users also get `asg` (the `aws.autoscaling.Group`), `launch_template` (the
    `aws.ec2.LaunchTemplate`) and, on an EKS stack, `drain_hook` (its termination lifecycle hook).
    """

    asg_name: pulumi.Output[str] | None
    """The Auto Scaling group's name (none on a Slurm stack: AWS PCS launches the nodes)."""
    asg_arn: pulumi.Output[str] | None
    """The Auto Scaling group's ARN (what guardrails scope their IAM to; none on a Slurm stack)."""
    launch_template_id: pulumi.Output[str]
    """The launch template's id."""
    launch_template_version: pulumi.Output[int]
    """The launch template's latest version (what an AWS PCS compute node group launches)."""

    def __init__(self, name: str, args: GpuNodeGroupArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("GpuNodeGroup", name, GpuNodeGroupModel, args, node_group_checks)
        super().__init__(type_token("GpuNodeGroup"), name, None, component_options(opts, OLD_TYPE))
        group = m.node_group
        tags = node_tags(m.tags, m.identity, m.cluster_name, group.name)
        mounts = [DataMount(name=d.name, access=d.access, bucket_name=d.bucket_name, prefix=d.prefix,
                            path=d.path, fsx_dns_name=d.fsx_dns_name, fsx_mount_name=d.fsx_mount_name,
                            fsx_client_key_fingerprints=tuple(d.fsx_client_key_fingerprints),
                            expected_bucket_owner=d.expected_bucket_owner)
                  for d in m.data_mounts]
        slurm = m.scheduler == "slurm"
        image = self._image_id(group, m)
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"gpucluster {m.cluster_name}/{group.name} GPU nodes",
            image_id=image,
            # AWS PCS picks the type from its instance configs and passes the compute node group's
            # instance profile itself: a Slurm stack's template names neither.
            instance_type=group.instance_types[0] if plain_template(group) and not slurm else None,
            iam_instance_profile=None if slurm else {"arn": m.instance_profile_arn},
            user_data=self._user_data(m, mounts),
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": IMDS_HOP_LIMIT,
                              "instance_metadata_tags": "disabled"},
            block_device_mappings=[{"device_name": root_device(image, pulumi.InvokeOptions(parent=self)),
                                    "ebs": {
                "volume_size": group.root_volume_size_gib, "volume_type": "gp3", "encrypted": "true",
                "delete_on_termination": "true",
                **({"volume_initialization_rate": rate}
                   if (rate := volume_initialization_rate(m)) else {})}}],
            network_interfaces=[{
                "network_card_index": nic.network_card_index, "device_index": nic.device_index,
                "interface_type": nic.interface_type, "associate_public_ip_address": "false",
                "delete_on_termination": "true", "security_groups": m.security_group_ids,
            } for nic in network_interfaces(group.types[0], group.efa_enabled)],
            tag_specifications=[{"resource_type": kind, "tags": tags}
                                for kind in ("instance", "volume", "network-interface")],
            update_default_version=True,
            tags=tags,
            # A pinned baked image is followed: changing the pin is how the user moves the group.
            opts=pulumi.ResourceOptions(parent=self,
                                        ignore_changes=[] if pinned_ami(m) else ami_ignore_changes(group)),
            **capacity_block_options(group.capacity),
            **(pcs_launch_options(group, m.placement_group_name) if slurm else {}),
        )
        self.launch_template_version = self.launch_template.latest_version
        health = group.health_checks
        self.asg: aws.autoscaling.Group | None = None
        self.launch_hook: aws.autoscaling.LifecycleHook | None = None
        self.health_policy: aws.iam.RolePolicy | None = None
        if slurm:
            # AWS PCS launches the nodes (no Auto Scaling group, so no launch hook); the health check
            # keeps its metrics and reports.
            if health.enabled:
                self.health_policy = aws.iam.RolePolicy(
                    f"{name}-health", role=m.node_role_name, policy=self._health_policy(m, None),
                    opts=pulumi.ResourceOptions(parent=self))
            self.asg_name = self.asg_arn = None
            self.launch_template_id = self.launch_template.id
            self.register_outputs({"launch_template_id": self.launch_template_id,
                                   "launch_template_version": self.launch_template_version})
            return
        capacity = self._capacity(group)
        asg_tags = [aws.autoscaling.GroupTagArgs(key=key, value=value, propagate_at_launch=True)
                    for key, value in tags.items()]
        if m.eks is not None:  # the autoscaler reads the group's tags, not the instances'
            asg_tags += [aws.autoscaling.GroupTagArgs(key=key, value=value,
                                                      propagate_at_launch=key.startswith("kubernetes.io/"))
                         for key, value in eks_asg_tags(group, m.eks.cluster_name,
                                                        m.eks.mig_strategy).items()]
        asg = self.asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=group.min_nodes,
            max_size=group.max_nodes,
            desired_capacity=group.desired_nodes,
            vpc_zone_identifiers=m.subnet_ids,
            placement_group=m.placement_group_name,
            capacity_rebalance=can_hold_spot(group) and m.spot.handle_rebalance,
            wait_for_capacity_timeout="0",  # GPU capacity may take hours: never block `pulumi up`
            tags=asg_tags,
            metrics_granularity="1Minute", enabled_metrics=[aws.autoscaling.Metric(m) for m in GROUP_METRICS],
            # The guardrail Lambdas set min and desired to 0 when they stop a group (DESIGN.md): if
            # Pulumi owned these fields, the next `pulumi up` would silently restart what they stopped.
            # The stop-state tags they write are ignored by the group's provider (`_asg_provider`).
            # An initial lifecycle hook exists so the group's very first nodes are held too; any
            # change to it replaces the whole group (terraform-provider-aws #34260), so after
            # creation the hook resource below owns it. On EKS a stop zeroes MaxSize too (the
            # cluster-autoscaler could otherwise bring a stopped group back), so Pulumi owns it only
            # at creation: the gpucluster:max-nodes tag carries the configured maximum, which a start
            # puts back and `gpucluster start` applies to a group that runs (fleet/asg.py).
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=[
                "desiredCapacity", "minSize", "initialLifecycleHooks",
                *(["maxSize"] if m.eks is not None else [])],
                provider=self._asg_provider(name, m.region)),
            initial_lifecycle_hooks=[launch_hook(group)] if health.enabled else None,
            warm_pool=warm_pool(group),
            launch_template=capacity.get("launch_template"),
            capacity_reservation_specification=capacity.get("capacity_reservation_specification"),
            mixed_instances_policy=capacity.get("mixed_instances_policy"),
        )
        child = pulumi.ResourceOptions(parent=self)
        if health.enabled:
            # The same hook by name (PutLifecycleHook creates or updates): it reaches groups created
            # before health checks, applies timeout changes, and is deleted when checks are turned off.
            self.launch_hook = aws.autoscaling.LifecycleHook(
                f"{name}-launch-check", autoscaling_group_name=asg.name, **launch_hook(group),
                opts=child)
            self.health_policy = aws.iam.RolePolicy(
                f"{name}-health", role=m.node_role_name, policy=self._health_policy(m, asg.arn),
                opts=child)
        self.drain_hook: aws.autoscaling.LifecycleHook | None = None
        if m.eks is not None:
            self.drain_hook = aws.autoscaling.LifecycleHook(
                f"{name}-drain", aws.autoscaling.LifecycleHookArgs(
                    autoscaling_group_name=asg.name, name=DRAIN_HOOK_NAME,
                    lifecycle_transition=TERMINATE_TRANSITION, default_result="CONTINUE",
                    heartbeat_timeout=DRAIN_TIMEOUT_SECONDS), opts=child)
        self.asg_name = asg.name
        self.asg_arn = asg.arn
        self.launch_template_id = self.launch_template.id
        self.register_outputs({"asg_name": self.asg_name, "asg_arn": self.asg_arn,
                               "launch_template_id": self.launch_template_id})

    def _asg_provider(self, name: str, region: str) -> pulumi.ProviderResource:
        """An aws provider that never reads the stop-state tags: the stack's settings plus `ignore_tags`.

        The provider reads every tag of an Auto Scaling group, so after `pulumi refresh` the next
        `up` would delete the tags a stop wrote. Its `ignore_tags` applies to a group's tag blocks
        too (terraform-provider-aws internal/service/autoscaling/group.go, resourceGroupRead:
        `KeyValueTags(...).IgnoreAWS().IgnoreConfig(ignoreTagsConfig)`; hashicorp/terraform-provider-aws
        #33492). A provider handed down through `opts` is used as it is: it must ignore them itself.
        """
        given = self.get_provider("aws:autoscaling/group:Group")
        if given is not None:
            pulumi.log.warn(f"GpuNodeGroup {name}: the aws provider passed in opts must ignore the tag "
                            f"prefixes {', '.join(STOP_STATE_TAG_PREFIXES)} (ignore_tags), or a `pulumi "
                            "refresh` makes the next `up` delete the guardrails' stop state", resource=self)
            return given
        args = stack_provider_args()
        args["ignore_tags"] = asg_ignore_tags(args.get("ignore_tags"))
        args["region"] = region
        return aws.Provider(f"{name}-asg-provider", **args, opts=pulumi.ResourceOptions(parent=self))

    def _image_id(self, group: NodeGroupConfig, m: GpuNodeGroupModel) -> pulumi.Input[str]:
        if (ami := pinned_ami(m)) is not None:
            return ami
        # An invoke (resolved once, kept by ignore_changes like the default AMI), not `resolve:ssm:` in the
        # template: that would resolve at every launch, so one group's nodes could boot different AMIs.
        default = eks_catalog.ami_parameter(m.eks.kubernetes_version) if m.eks else DEFAULT_AMI_PARAMETER
        parameter = group.ami_ssm_parameter or default
        return aws.ssm.get_parameter_output(name=parameter, opts=pulumi.InvokeOptions(parent=self)).value

    @staticmethod
    def _user_data(m: GpuNodeGroupModel, data_mounts: Sequence[DataMount]) -> pulumi.Output[str]:
        """Render once every bucket/FSx name a mount depends on, and the topic, are known."""
        values = [v for d in data_mounts
                  for v in (d.bucket_name, d.fsx_dns_name, d.fsx_mount_name, d.expected_bucket_owner)]
        eks = m.eks

        def render(resolved: list[Any]) -> str:
            topic, url, bucket, owner, endpoint, ca, cidr, resolved = (
                resolved[0], resolved[1], resolved[2], resolved[3], resolved[4], resolved[5], resolved[6],
                resolved[7:])
            mounts = [replace(d, bucket_name=resolved[4 * i], fsx_dns_name=resolved[4 * i + 1],
                              fsx_mount_name=resolved[4 * i + 2], expected_bucket_owner=resolved[4 * i + 3])
                      for i, d in enumerate(data_mounts)]
            script = render_user_data(group_bootstrap(
                m.node_group, stack=m.identity, cluster=m.cluster_name, region=m.region, spot=m.spot,
                data_mounts=mounts, autostop=m.autostop, notify_topic_arn=topic or "",
                metrics=None if eks is not None else group_metrics(m.observability, m.region, url or None),
                baked=baked_ami(m) is not None, eks_cluster=eks.cluster_name if eks is not None else ""),
                scripts_source(bucket, owner) if bucket else None)
            if m.scheduler == "slurm":
                return encode_multipart_user_data(script, MAX_USER_DATA_BYTES - PCS_USER_DATA_BYTES)
            if eks is not None:
                group = m.node_group
                return encode_multipart_user_data(script, MAX_USER_DATA_BYTES, node_config(
                    cluster_name=eks.cluster_name, endpoint=endpoint, certificate_authority=ca, cidr=cidr,
                    labels=node_labels(group.name, eks_purchase(group))))
            return encode_user_data(script)

        scripts = m.node_scripts
        return pulumi.Output.all(m.notify_topic_arn, m.remote_write_url,
                                 scripts.bucket_name if scripts else "", scripts.owner if scripts else "",
                                 eks.endpoint if eks else "", eks.certificate_authority if eks else "",
                                 eks.service_cidr if eks else "", *values).apply(render)

    @staticmethod
    def _health_policy(m: GpuNodeGroupModel, asg_arn: pulumi.Input[str] | None) -> pulumi.Output[str]:
        """This group's health statements, once its ARN (none: no Auto Scaling group) and the topic and
        key are known."""
        health = m.node_group.health_checks

        def document(values: list[Any]) -> str:
            asg_arn, topic, key = values
            return json.dumps(health_policy_document(
                asg_arn=asg_arn, identity=m.identity, group=m.node_group.name,
                namespace=gpu_metric_namespace(m.cluster_name), region=m.region,
                replace=health.on_failure == "replace", topic_arn=topic or "", key_arn=key or ""))

        return pulumi.Output.all(asg_arn or "", m.notify_topic_arn, m.notify_key_arn).apply(document)

    def _capacity(self, group: NodeGroupConfig) -> dict[str, Any]:
        template = {"launch_template_id": self.launch_template.id, "version": LATEST}
        if group.capacity.market == "capacity_block":
            # A Capacity Block is one instance type in one zone: a plain launch template.
            return {"launch_template": {"id": self.launch_template.id, "version": LATEST}}
        if group.warm_pool is not None:
            # Auto Scaling keeps no warm pool for a group with a mixed instances policy (the spec
            # allows a warm pool on one on-demand type only): a plain launch template.
            return {"launch_template": {"id": self.launch_template.id, "version": LATEST},
                    "capacity_reservation_specification": asg_capacity_reservation(group.capacity)}
        return {
            "mixed_instances_policy": {
                "instances_distribution": instances_distribution(group.capacity),
                "launch_template": {"launch_template_specification": template,
                                    "overrides": instance_overrides(group)},
            },
            "capacity_reservation_specification": asg_capacity_reservation(group.capacity),
        }
