"""GpuCluster: a whole GPU cluster from a stack file's sections, composing every other component.

It owns the order in which parts are built and what each part is handed
(network ids to node groups, bucket names to node IAM, ASG names to the
guardrails), and the stack's outputs. Its args are the stack file's sections;
it checks them with the stack file's rules, then derives every child's args
through `gpucluster.aws.children` (the one spec -> child args mapping). It must not build
resources itself: each part is a component of its own module, parented here.

Order: network, then the datasets (buckets, FSx in a node group's subnet,
and the S3 grants and data mounts the nodes need), then per node group its
node identity (IAM role: a group's nodes may report health for that group
only) and its GpuNodeGroup, then the guardrails that act on those groups'
Auto Scaling groups, then the dashboard. The guardrails' topic, where nodes
report health findings, is handed to the groups as a deferred Output resolved
once the guardrails exist (no resource cycle: the topic depends on no group).

On a Slurm stack (`scheduler: {type: slurm}`) the AWS PCS cluster and its login group come after the
network (`gpucluster.aws.pcs`, loaded only then), every node group's launch template carries the Slurm
security group too, and each group becomes a PCS compute node group and queue on its own launch
template instead of an Auto Scaling group; the stack exports `pcs_cluster_id`. On an EKS stack
(`scheduler: {type: eks}`) the EKS control plane and its system node group come after the network
(`gpucluster.aws.eks`, loaded only then), every node group stays an Auto Scaling group that joins the
cluster (its nodes carry the cluster's security group, its role an access entry), and the stack exports
`eks_cluster_name` and `kubeconfig_command`.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws import children
from gpucluster.aws.args import component_options, owned_tags, stack_checks, type_token, validate
from gpucluster.aws.datasets import DatasetBucket, DatasetStore, LustreFileSystem
from gpucluster.aws.guardrail_lambda import LOG_RETENTION_DAYS
from gpucluster.aws.guardrails import Guardrails, PcsGuard
from gpucluster.aws.iam import NodeIdentity
from gpucluster.aws.images import NodeImages
from gpucluster.aws.network import ClusterNetwork
from gpucluster.aws.nodes import DEFAULT_AMI_PARAMETER, GpuNodeGroup, NodeDataMount
from gpucluster.aws.nodescripts import NodeScripts
from gpucluster.aws.observability import ClusterDashboard
from gpucluster.aws.settings import (
    AutoStopSettings,
    BudgetSettings,
    ClusterSettings,
    DatasetSettings,
    ImagesSettings,
    NetworkSettings,
    NodeGroupSettings,
    NotificationsSettings,
    ObservabilitySettings,
    SchedulerSettings,
    SpotSettings,
)
from gpucluster.names import node_identity_name
from gpucluster.noderole import run_log_group_name
from gpucluster.parts import S3Grant
from gpucluster.spec import DIY_ORGANIZATION, StackSpec, baked_image, launches_baked

if TYPE_CHECKING:
    from gpucluster.aws.eks import EksCluster
    from gpucluster.aws.pcs import SlurmCluster
    from gpucluster.aws.prometheus import MetricsWorkspace

OLD_TYPE = "gpucluster:cluster:GpuCluster"


class GpuClusterArgs(TypedDict):
    """A whole cluster as a stack file writes it: the `gpucluster:` sections, the stack and the region."""

    cluster: ClusterSettings
    """Name and tags."""
    network: NetworkSettings
    """A new VPC or an existing one, and the availability zones."""
    node_groups: list[NodeGroupSettings]
    """GPU node groups, each an Auto Scaling group."""
    datasets: NotRequired[list[DatasetSettings]]
    """S3 datasets and how they reach the GPUs."""
    budget: NotRequired[BudgetSettings]
    """Monthly budget, alerts and the scale-to-zero action."""
    notifications: NotRequired[NotificationsSettings]
    """Who is told what the guardrails did and when they failed (required unless budget.emails is set)."""
    autostop: NotRequired[AutoStopSettings]
    """Idle stop, schedules, maximum lifetime and the pre-stop hook (off when absent)."""
    spot: NotRequired[SpotSettings]
    """The spot-interruption hook."""
    observability: NotRequired[ObservabilitySettings]
    """GPU metrics to Amazon Managed Prometheus, Grafana dashboards (off when absent)."""
    images: NotRequired[ImagesSettings]
    """Images baked by EC2 Image Builder for the node groups (off when absent)."""
    scheduler: NotRequired[SchedulerSettings]
    """none (the launcher, the default) or slurm: an AWS PCS cluster with a queue per node group."""
    region: str
    """AWS region, e.g. us-east-1 (the stack file's aws:region)."""
    stack: NotRequired[str]
    """Stack name in the identity tag gpucluster:stack (default: the current Pulumi stack)."""
    project: NotRequired[str]
    """Project name in the identity tag gpucluster:stack (default: the current Pulumi project)."""
    organization: NotRequired[str]
    """Pulumi organization in the identity tag gpucluster:stack (default: the current one)."""


class NodeGroupSummary(TypedDict):
    """One node group as the cluster reports it."""

    instance_types: list[str]
    """Instance types in preference order."""
    efa: bool
    """EFA is on."""
    availability_zones: list[str]
    """Zones the group runs in."""
    asg_name: NotRequired[str]
    """Its Auto Scaling group (scheduler type none)."""
    pcs_compute_node_group_id: NotRequired[str]
    """Its AWS PCS compute node group (scheduler type slurm: PCS launches the nodes, no Auto Scaling
    group)."""
    launch_template_id: str
    """Its launch template."""
    security_group_id: str
    """Its nodes' security group."""
    placement_group_name: NotRequired[str]
    """Its cluster placement group, if it has one."""
    image: NotRequired[dict[str, Any]]
    """A baked group: its pinned image (ami_id, driver, cuda)."""


class DatasetSummary(TypedDict):
    """One dataset as the cluster reports it."""

    bucket_name: str
    """The bucket."""
    bucket_arn: str
    """The bucket's ARN."""
    existing: bool
    """The bucket existed before (never changed by gpucluster)."""
    access: str
    """copy_to_scratch, mount or fsx."""
    prefix: str
    """The data prefix nodes read."""
    checkpoint_prefix: NotRequired[str]
    """The prefix nodes write checkpoints to."""
    path: str
    """Where the data appears on every node."""
    fsx_file_system_id: NotRequired[str]
    """access fsx: the file system."""
    fsx_dns_name: NotRequired[str]
    """access fsx: its DNS name."""
    fsx_mount_name: NotRequired[str]
    """access fsx: its Lustre mount name."""
    fsx_availability_zone: NotRequired[str]
    """access fsx: its zone."""


@dataclass
class Datasets:
    """A cluster's datasets: their components, and what they hand the node IAM, bootstrap and stack."""

    store: DatasetStore
    buckets: dict[str, DatasetBucket] = field(default_factory=dict)
    file_systems: dict[str, LustreFileSystem] = field(default_factory=dict)
    grants: list[S3Grant] = field(default_factory=list)
    mounts: list[NodeDataMount] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_datasets(name: str, spec: StackSpec, *, vpc_id: pulumi.Input[str],
                   subnet_ids_by_zone: Mapping[str, pulumi.Input[str]],
                   node_security_group_ids: Mapping[str, pulumi.Input[str]],
                   opts: pulumi.ResourceOptions | None = None) -> Datasets:
    """Every dataset's bucket (and FSx, in its zone's subnet) under one DatasetStore named `name`."""
    parts = Datasets(store=DatasetStore(name, opts=opts))
    child = pulumi.ResourceOptions(parent=parts.store)
    for dataset in spec.datasets:
        bucket = parts.buckets[dataset.name] = DatasetBucket(
            f"{name}-{dataset.name}", children.dataset_bucket_args(spec, dataset), opts=child)
        mount = children.data_mount(spec, dataset, bucket.bucket_name, bucket_owner=bucket.bucket_owner)
        entry: dict[str, Any] = {"bucket_name": bucket.bucket_name, "bucket_arn": bucket.bucket_arn,
                                 "existing": dataset.existing, "access": dataset.access,
                                 "prefix": dataset.prefix, "checkpoint_prefix": dataset.checkpoint_prefix,
                                 "path": mount["path"]}
        if dataset.access == "fsx" and dataset.fsx is not None:
            lustre = parts.file_systems[dataset.name] = LustreFileSystem(
                f"{name}-{dataset.name}-fsx", children.lustre_args(
                    spec, dataset, bucket_name=bucket.bucket_name, vpc_id=vpc_id,
                    subnet_ids_by_zone=subnet_ids_by_zone, node_security_group_ids=node_security_group_ids),
                opts=child)
            entry |= {"fsx_file_system_id": lustre.file_system_id, "fsx_dns_name": lustre.dns_name,
                      "fsx_mount_name": lustre.mount_name,
                      "fsx_availability_zone": children.fsx_zone(spec, dataset.fsx)}
            mount = children.data_mount(spec, dataset, bucket.bucket_name, lustre.dns_name, lustre.mount_name,
                                     bucket_owner=bucket.bucket_owner)
        parts.grants.extend(bucket.grants)
        parts.mounts.append(mount)
        parts.outputs[dataset.name] = entry
    parts.store.finish(parts.outputs)
    return parts


def run_log_group(name: str, spec: StackSpec, opts: pulumi.ResourceOptions) -> aws.cloudwatch.LogGroup:
    """The stack's run log group, /gpucluster/<identity>/run, declared (so nothing on a node needs
    logs:CreateLogGroup) with the guardrail logs' retention: `gpucluster run` output (SSM) and
    detached jobs' output (the CloudWatch agent) land there; `logs --follow` reads it."""
    return aws.cloudwatch.LogGroup(
        name, name=run_log_group_name(spec.identity), retention_in_days=LOG_RETENTION_DAYS,
        tags=owned_tags(spec.tags, spec.identity, spec.cluster.name), opts=opts)


def build_images(name: str, spec: StackSpec, network: ClusterNetwork,
                 opts: pulumi.ResourceOptions) -> NodeImages | None:
    """The Image Builder pipelines of the baked groups (None when nothing is baked), built in the
    first zone's private subnet, each recipe on its group's base resolved once."""
    baked = children.baked_groups(spec)
    if not baked:
        return None
    invoke = pulumi.InvokeOptions(parent=opts.parent)
    bases = {g.name: g.ami_id or aws.ssm.get_parameter_output(
        name=g.ami_ssm_parameter or DEFAULT_AMI_PARAMETER, opts=invoke).value for g in baked}
    return NodeImages(name, children.images_args(
        spec, vpc_id=network.vpc_id, subnet_id=network.subnets[spec.network.availability_zones[0]],
        parent_images=bases), opts=opts)


def image_summary(spec: StackSpec, group: Any) -> dict[str, Any]:
    """What a baked group's summary adds: the image it launches from and what that image carries."""
    image = baked_image(spec.images, group)
    if image is None:
        return {}
    if not launches_baked(spec.images, group):
        return {"image": {"baked": True, "ami_id": None,
                          "note": "no image pinned yet: launches on the unbaked path until "
                                  f"images.groups.{group.name}.ami_id is set"}}
    return {"image": {"baked": True, "ami_id": image.ami_id, "driver": image.driver, "cuda": image.cuda}}


def metrics_workspace(name: str, spec: StackSpec, opts: pulumi.ResourceOptions) -> "MetricsWorkspace":
    """The AMP workspace (and Grafana), loaded only when observability is on: its modules bring the
    Grafana provisioner's HTTP client, which a stack without them should not pay for at every plan."""
    from gpucluster.aws.prometheus import MetricsWorkspace

    return MetricsWorkspace(name, spec, opts=opts)


def build_slurm(name: str, spec: StackSpec, network: ClusterNetwork,
                opts: pulumi.ResourceOptions) -> "SlurmCluster | None":
    """A Slurm stack's AWS PCS cluster and login group (None on a `type: none` stack, which never loads
    pulumi-aws-native); node groups are added as their launch templates exist."""
    if not spec.scheduler.slurm:
        return None
    from gpucluster.aws.pcs import SlurmCluster

    return SlurmCluster(name, children.slurm_cluster_args(
        spec, vpc_id=network.vpc_id, subnet_ids_by_zone=network.subnets, egress=network.egress_targets()),
        opts=opts)


def build_eks(name: str, spec: StackSpec, network: ClusterNetwork,
              opts: pulumi.ResourceOptions) -> "EksCluster | None":
    """An EKS stack's control plane, add-ons and system node group (None otherwise, and then neither
    `gpucluster.aws.eks` nor pulumi-kubernetes is loaded); GPU node roles are added as they exist."""
    if not spec.scheduler.eks:
        return None
    from gpucluster.aws.eks import EksCluster

    return EksCluster(name, children.eks_cluster_args(
        spec, subnet_ids=[network.subnets[z] for z in spec.network.availability_zones]), opts=opts)


def build_cluster_software(name: str, spec: StackSpec, eks: "EksCluster", groups: dict[str, GpuNodeGroup],
                           metrics: "MetricsWorkspace | None", opts: pulumi.ResourceOptions) -> Any:
    """What runs on an EKS stack's cluster (charts, Kueue, admission policies, the termination queue;
    `gpucluster.aws.eks_software`), once the control plane and its system nodes are up."""
    from gpucluster.aws.eks_software import ClusterSoftware

    asgs = {g: n for g, n in groups.items() if n.asg_name is not None}
    return ClusterSoftware(
        name, spec, eks.k8s_provider, cluster_name=eks.cluster_name,
        kubernetes_version=children.kubernetes_version(spec),
        asg_names={g: n.asg_name for g, n in asgs.items() if n.asg_name is not None},
        asg_arns={g: n.asg_arn for g, n in asgs.items() if n.asg_arn is not None},
        remote_write_url=metrics.remote_write_url if metrics is not None else None,
        workspace_arn=metrics.workspace_arn if metrics is not None else None,
        workspace_owned=metrics is not None and metrics.workspace is not None,
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[eks])))


def eks_node(spec: StackSpec, eks: "EksCluster | None") -> Any:
    """What a GPU node group of an EKS stack is told of its cluster (None on other stacks)."""
    if eks is None:
        return None
    from gpucluster.eks.naming import eks_cluster_name

    return children.eks_node(spec, cluster_name=eks_cluster_name(spec.cluster.name, spec.identity),
                             endpoint=eks.endpoint, certificate_authority=eks.certificate_authority,
                             service_cidr=eks.service_cidr)


def group_handles(groups: Mapping[str, GpuNodeGroup],
                  pcs: "SlurmCluster | None") -> dict[str, tuple[Any, Any]]:
    """Node group name -> (name, ARN) the guardrails and the dashboard act on: its Auto Scaling group's,
    or on a Slurm stack its PCS compute node group's (until the guardrails have a PCS backend)."""
    if pcs is None:
        return {g: (n.asg_name, n.asg_arn) for g, n in groups.items()}
    return {g: (pcs.node_groups[g].name, pcs.node_groups[g].arn) for g in groups}


def pcs_guard(pcs: "SlurmCluster | None") -> PcsGuard | None:
    """What the guardrails act on, on a Slurm stack: the PCS cluster and its compute node groups
    (`PCS_CLUSTER_ID` in the stopping Lambdas, pcs: statements scoped to these ARNs)."""
    if pcs is None:
        return None
    return PcsGuard(cluster_id=pcs.cluster_id, cluster_arn=pcs.cluster_arn,
                    node_group_ids={g: n.aws_id for g, n in pcs.node_groups.items()})


def cluster_spec(name: str, args: Any) -> StackSpec:
    """GpuClusterArgs checked as a stack file is: every model and named check, or ArgsError.

    Where the args do not say where the cluster is deployed, the running deployment's Pulumi
    organization, project and stack make its identity (`spec.stack_identity`).
    """
    values = dict(args) if isinstance(args, dict) else args
    if isinstance(values, dict):
        values.setdefault("stack", pulumi.get_stack())
        values.setdefault("project", pulumi.get_project())
        # None under a mock engine given no organization: Pulumi's self-managed backends' name then.
        values.setdefault("organization", pulumi.get_organization() or DIY_ORGANIZATION)
    return validate("GpuCluster", name, StackSpec, values, stack_checks)


class GpuCluster(pulumi.ComponentResource):
    """A GPU cluster: network, datasets, node identities, node groups, guardrails and a dashboard.

    Python users also get the parts: `network` (ClusterNetwork), `run_logs` (the run log group),
    `node_scripts` (NodeScripts: the bucket of the scripts bundle every node fetches),
    `buckets` and `file_systems`
    (dataset name -> DatasetBucket / LustreFileSystem), `node_identities` (node group name ->
    NodeIdentity; `node_identity` is the first group's), `groups`
    (node group name -> GpuNodeGroup, whose `.asg` the guardrails act on), `guardrails`, `dashboard`
    (ClusterDashboard), `spec`
    (the checked StackSpec), `outputs` (what the stack exports), `pcs` (None on a `type: none`
    stack; on a Slurm stack the `SlurmCluster`: `cluster_id`, `cluster_arn`, `node_group_ids`: group
    name, `login` included -> its PCS compute node group id) and `eks` (on an EKS stack the `EksCluster`:
    `k8s_provider`, `cluster_name`, `node_role_arns`; else None).
    """

    cluster_name: pulumi.Output[str]
    """The cluster's name."""
    region: pulumi.Output[str]
    """The AWS region."""
    vpc_id: pulumi.Output[str]
    """The VPC the nodes run in."""
    subnet_ids: pulumi.Output[dict[str, str]]
    """Private subnet per availability zone."""
    node_groups: pulumi.Output[dict[str, NodeGroupSummary]]
    """Node group name -> its instance types, zones, ASG, launch template, security and placement group."""
    datasets: pulumi.Output[dict[str, DatasetSummary]]
    """Dataset name -> its bucket, access, path on the nodes and FSx names."""
    notify_topic_arn: pulumi.Output[str] | None
    """The guardrail topic (when any guardrail is on)."""
    budget_name: pulumi.Output[str] | None
    """The AWS Budgets budget (with budget)."""
    budget_action_topic_arn: pulumi.Output[str] | None
    """The budget's scale-to-zero topic (with budget.action_threshold_percent)."""
    function_names: pulumi.Output[dict[str, str]] | None
    """Guardrail Lambda function names (when any guardrail is on)."""
    idle_alarm_names: pulumi.Output[dict[str, str]] | None
    """Node group name -> its idle alarm (with autostop)."""
    schedule_names: pulumi.Output[dict[str, str]] | None
    """stop / start / lifetime -> its schedule (with autostop schedules)."""
    dashboard_name: pulumi.Output[str]
    """The stack's CloudWatch dashboard."""
    dashboard_url: pulumi.Output[str]
    """The dashboard in the CloudWatch console (`gpucluster status` prints it too)."""
    stuck_alarm_names: pulumi.Output[dict[str, str]]
    """Node group name -> its stuck-job alarm (groups with health_checks.stuck_alarm_minutes)."""
    pcs_cluster_id: pulumi.Output[str] | None
    """A Slurm stack's AWS PCS cluster (scheduler type slurm)."""
    eks_cluster_name: pulumi.Output[str] | None
    """An EKS stack's cluster (scheduler type eks)."""

    def __init__(self, name: str, args: GpuClusterArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        spec = self.spec = cluster_spec(name, args)
        super().__init__(type_token("GpuCluster"), name, None, component_options(opts, OLD_TYPE))
        child = pulumi.ResourceOptions(parent=self)
        self.network = ClusterNetwork(f"{name}-network", children.network_args(spec), opts=child)
        parts = build_datasets(
            f"{name}-datasets", spec, vpc_id=self.network.vpc_id, subnet_ids_by_zone=self.network.subnets,
            node_security_group_ids={g: n.security_group.id for g, n in self.network.groups.items()},
            opts=child)
        self.dataset_store, self.buckets, self.file_systems = parts.store, parts.buckets, parts.file_systems
        mounts, datasets = parts.mounts, parts.outputs
        self.run_logs = run_log_group(f"{name}-run-logs", spec, child)
        # The shipped node scripts, outside EC2's 16 KiB of user data: every group's nodes fetch and
        # verify this one bundle (gpucluster.node.bundle).
        self.node_scripts = NodeScripts(f"{name}-node-scripts", children.node_scripts_args(spec), opts=child)
        self.images = build_images(f"{name}-images", spec, self.network, child)
        topic_arn: pulumi.Output[str]
        key_arn: pulumi.Output[str]
        resolve_topic: Callable[[pulumi.Output[str]], None]
        resolve_key: Callable[[pulumi.Output[str]], None]
        topic_arn, resolve_topic = pulumi.deferred_output()
        key_arn, resolve_key = pulumi.deferred_output()
        # observability.prometheus: the workspace first, its remote-write URL goes into the user data.
        self.metrics = (metrics_workspace(f"{name}-metrics", spec, child)
                        if spec.observability.prometheus.active else None)
        self.node_identities: dict[str, NodeIdentity] = {}
        self.groups: dict[str, GpuNodeGroup] = {}
        self.pcs = build_slurm(f"{name}-pcs", spec, self.network, child)
        self.eks = build_eks(f"{name}-eks", spec, self.network, child)
        eks_settings = eks_node(spec, self.eks)
        try:
            for i, group in enumerate(spec.node_groups):
                # One role per group: IAM scopes SetInstanceHealth to a group, not to an instance.
                identity = self.node_identities[group.name] = NodeIdentity(
                    node_identity_name(name, group.name, first=i == 0),
                    children.node_identity_args(spec, parts.grants, self.node_scripts.source), opts=child)
                # Nodes write their own metrics, except on EKS, where the cluster's Prometheus agent
                # writes through its own pod role (aws/eks_software.py): the node role gets no aps: grant.
                if self.metrics is not None and not spec.scheduler.eks:
                    self.metrics.grant_write(group.name, identity.role_name)
                network = self.network.groups[group.name]
                # A Slurm stack's nodes also carry the Slurm security group, on every interface.
                slurm_sg = [self.pcs.node_security_group.id] if self.pcs is not None else []
                # An EKS stack's nodes carry the cluster's security group: the control plane and the
                # system nodes reach them, and they reach both.
                if self.eks is not None:
                    slurm_sg.append(self.eks.cluster_security_group_id)
                self.groups[group.name] = GpuNodeGroup(f"{name}-{group.name}", children.node_group_args(
                    spec, group, subnet_ids=network.subnet_ids,
                    security_group_ids=[network.security_group.id, *slurm_sg],
                    placement_group_name=network.placement_group.name if network.placement_group else None,
                    instance_profile_arn=identity.instance_profile_arn, data_mounts=mounts,
                    node_role_name=identity.role_name, notify_topic_arn=topic_arn, notify_key_arn=key_arn,
                    remote_write_url=self.metrics.remote_write_url if self.metrics else None,
                    node_scripts=self.node_scripts.source, eks=eks_settings),
                    opts=child)
                if self.eks is not None:
                    self.eks.add_node_role(group.name, identity.role_arn)
                if self.pcs is not None:
                    nodes = self.groups[group.name]
                    self.pcs.add_node_group(children.slurm_compute_group(
                        spec, group, launch_template_id=nodes.launch_template_id,
                        launch_template_version=nodes.launch_template_version,
                        instance_profile_arn=identity.instance_profile_arn, subnet_ids=network.subnet_ids))
            if self.pcs is not None:
                self.pcs.finish()
            if self.eks is not None:
                self.eks.finish()
                self.cluster_software = build_cluster_software(
                    f"{name}-software", spec, self.eks, self.groups, self.metrics, child)
            self.guardrails = Guardrails(f"{name}-guardrails", children.guardrails_args(
                spec, group_handles(self.groups, self.pcs)), opts=child, pcs=pcs_guard(self.pcs))
        finally:
            # Always resolved, so a failure above surfaces as itself, never as a hung program.
            notify = getattr(self, "guardrails", None)
            notify = notify.notifications if notify is not None else None
            resolve_topic(notify.topic.arn if notify else pulumi.Output.from_input(""))
            resolve_key(notify.key.arn if notify else pulumi.Output.from_input(""))
        self.node_identity = self.node_identities[spec.node_groups[0].name]
        guard = self.guardrails
        # Every guardrail Lambda that scales groups to zero (asg.scale_to_zero logs each stop).
        stoppers = [function
                    for part in (guard.autostop, guard.budget, guard.spend_guard, guard.capacity_block)
                    if (function := getattr(part, "function", None)) is not None]
        self.dashboard = ClusterDashboard(f"{name}-dashboard", children.dashboard_args(
            spec, {g: handle[0] for g, handle in group_handles(self.groups, self.pcs).items()},
            notify_topic_arn=guard.notify_topic_arn,
            guardrail_log_groups=[f.log_group.name for f in stoppers],
            alarm_arns=[a.arn for a in guard.autostop.alarms.values()] if guard.autostop else []),
            opts=child)
        node_groups = {
            group.name: {
                "instance_types": list(group.instance_types),
                "efa": group.efa_enabled,
                "availability_zones": spec.azs_of(group),
                **({"pcs_compute_node_group_id": self.pcs.node_groups[group.name].aws_id}
                   if self.pcs is not None else {"asg_name": self.groups[group.name].asg_name}),
                "launch_template_id": self.groups[group.name].launch_template_id,
                "security_group_id": (network := self.network.groups[group.name]).security_group.id,
                "placement_group_name": pg.name if (pg := network.placement_group) else None,
                **image_summary(spec, group),
            }
            for group in spec.node_groups
        }
        self.outputs: dict[str, Any] = {
            "cluster_name": spec.cluster.name,
            "region": spec.region,
            "vpc_id": self.network.vpc_id,
            "subnet_ids": self.network.subnet_ids,
            "node_groups": node_groups,
            "datasets": datasets,
            **({"pcs_cluster_id": self.pcs.cluster_id} if self.pcs is not None else {}),
            **({"eks_cluster_name": self.eks.cluster_name, "kubeconfig_command": self.eks.kubeconfig_command}
               if self.eks is not None else {}),
            **self.guardrails.outputs,
            **({"image_pipeline_arns": self.images.pipeline_arns} if self.images else {}),
            "dashboard_name": self.dashboard.dashboard_name,
            "dashboard_url": self.dashboard.dashboard_url,
            "stuck_alarm_names": self.dashboard.stuck_alarm_names,
            **(self.metrics.outputs if self.metrics is not None else {}),
            "node_scripts": {"bucket_name": self.node_scripts.bucket_name,
                             "bundle_key": self.node_scripts.bundle_key,
                             "bundle_sha256": self.node_scripts.bundle_sha256},
        }
        self.cluster_name = pulumi.Output.from_input(spec.cluster.name)
        self.region = pulumi.Output.from_input(spec.region)
        self.vpc_id = self.network.vpc_id
        self.subnet_ids = self.network.subnet_ids
        # from_input resolves the Outputs inside the summaries; its annotation takes a plain Input[T] only.
        self.node_groups = pulumi.Output.from_input(node_groups)  # type: ignore[arg-type]
        self.datasets = pulumi.Output.from_input(datasets)  # type: ignore[arg-type]
        self.notify_topic_arn = self.guardrails.notify_topic_arn
        self.budget_name = self.guardrails.budget_name
        self.budget_action_topic_arn = self.guardrails.budget_action_topic_arn
        self.function_names = self.guardrails.function_names
        self.idle_alarm_names = self.guardrails.idle_alarm_names
        self.schedule_names = self.guardrails.schedule_names
        self.dashboard_name = self.dashboard.dashboard_name
        self.dashboard_url = self.dashboard.dashboard_url
        self.stuck_alarm_names = self.dashboard.stuck_alarm_names
        self.pcs_cluster_id = self.pcs.cluster_id if self.pcs is not None else None
        self.eks_cluster_name = self.eks.cluster_name if self.eks is not None else None
        self.register_outputs(self.outputs)
