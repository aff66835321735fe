"""What GpuCluster hands each child: the one mapping from a `StackSpec` to the Args of the network,
dataset buckets and file systems, node identities, node groups, guardrails and dashboard.

Pure functions, no resources and no Pulumi import (the Args types are imported for type checking
only): `GpuCluster` calls them to derive its children's args from its own. What another component
produces (subnet ids, ARNs, bucket names) comes in as a parameter, a plain value or an Output, and
goes out untouched. Settings sections are handed on as the stack file wrote them (`model_dump` with
`exclude_unset`), so each component re-checks exactly what the user set, with the stack file's own
rules; tags are the stack's tags, identity tags included. It must never import `gpucluster.stack`
(the program's mapping to GpuClusterArgs sits above the components).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpucluster import catalog
from gpucluster.catalog import eks as eks_catalog
from gpucluster.noderole import run_log_group_name
from gpucluster.parts import S3Grant
from gpucluster.pricing import guard_prices
from gpucluster.spec import (
    DatasetConfig,
    FsxConfig,
    NodeGroupConfig,
    StackSpec,
    baked_image,
    can_run_spot,
    dataset_path,
    launches_baked,
)

if TYPE_CHECKING:
    from gpucluster.aws.datasets import DatasetBucketArgs, LustreFileSystemArgs
    from gpucluster.aws.eks import EksClusterArgs
    from gpucluster.aws.guardrails import GuardrailsArgs
    from gpucluster.aws.iam import NodeIdentityArgs
    from gpucluster.aws.images import NodeImagesArgs
    from gpucluster.aws.network import ClusterNetworkArgs
    from gpucluster.aws.nodes import EksNodeSettings, GpuNodeGroupArgs, NodeDataMount
    from gpucluster.aws.nodescripts import NodeScriptsArgs
    from gpucluster.aws.observability import ClusterDashboardArgs
    from gpucluster.aws.pcs import SlurmClusterArgs, SlurmComputeGroup


def settings(section: Any) -> Any:
    """A validated section back in the stack file's words: only the keys the user set."""
    return section.model_dump(exclude_unset=True)



def network_args(spec: StackSpec) -> ClusterNetworkArgs:
    """The network section, plus what each node group needs: its zones, EFA, a placement group."""
    net = spec.network
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name, "region": spec.region,
        "availability_zones": list(net.availability_zones), "nat_gateway": net.nat_gateway,
        "tags": spec.tags, "flow_logs": net.flow_logs,
        "node_groups": [{"name": g.name, "availability_zones": spec.azs_of(g), "efa": g.efa_enabled,
                         "multi_node": g.max_nodes > 1, "placement_group": g.uses_placement_group}
                        for g in spec.node_groups],
    }
    if net.vpc_cidr is not None:
        args["vpc_cidr"] = net.vpc_cidr
    if not net.nat_gateway:  # what nodes without NAT must reach besides SSM's and the agents' endpoints
        args |= {"remote_write": spec.observability.prometheus.active, "slurm": spec.scheduler.slurm,
                 "eks": spec.scheduler.eks}
    if net.existing_vpc_id is not None:
        args["existing_vpc_id"] = net.existing_vpc_id
        args["existing_subnet_ids"] = dict(net.existing_subnets)
    return with_boundary(spec, args)  # type: ignore[return-value]


def dataset_bucket_args(spec: StackSpec, dataset: DatasetConfig) -> DatasetBucketArgs:
    args: dict[str, Any] = {"dataset": settings(dataset), "cluster_name": spec.cluster.name,
                            "region": spec.region, "tags": spec.tags}
    if spec.cluster.break_glass_role is not None:
        args["break_glass_role"] = spec.cluster.break_glass_role
    return args  # type: ignore[return-value]


def fsx_zone(spec: StackSpec, fsx: FsxConfig) -> str:
    """fsx.availability_zone, or the first zone of the first node group."""
    return fsx.availability_zone or spec.azs_of(spec.node_groups[0])[0]


def lustre_args(spec: StackSpec, dataset: DatasetConfig, *, bucket_name: Any, vpc_id: Any,
                subnet_ids_by_zone: Mapping[str, Any],
                node_security_group_ids: Mapping[str, Any]) -> LustreFileSystemArgs:
    """FSx of an `access: fsx` dataset: in its zone's subnet, open to every node group."""
    if dataset.fsx is None:
        raise ValueError(f"datasets: dataset {dataset.name!r} has no fsx settings")
    zone = fsx_zone(spec, dataset.fsx)
    if zone not in subnet_ids_by_zone:
        raise ValueError(f"datasets: no subnet for FSx zone {zone!r} of dataset {dataset.name!r}; "
                         f"subnets: {', '.join(sorted(subnet_ids_by_zone))}")
    return {"dataset": settings(dataset), "bucket_name": bucket_name, "vpc_id": vpc_id,
            "subnet_id": subnet_ids_by_zone[zone], "node_security_group_ids": dict(node_security_group_ids),
            "tags": spec.tags}


def data_mount(spec: StackSpec, dataset: DatasetConfig, bucket_name: Any, fsx_dns_name: Any = None,
               fsx_mount_name: Any = None, bucket_owner: Any = None) -> NodeDataMount:
    """How the node bootstrap brings one dataset: where it appears on the node, from where, and the
    account that must own the bucket (`bucket_owner`, else the dataset's expected_bucket_owner)."""
    mount: dict[str, Any] = {"name": dataset.name, "access": dataset.access, "bucket_name": bucket_name,
                             "prefix": dataset.prefix, "path": dataset_path(spec, dataset)}
    if dataset.access == "fsx":
        mount |= {"fsx_dns_name": fsx_dns_name, "fsx_mount_name": fsx_mount_name}
        if dataset.fsx is not None and dataset.fsx.client_key_fingerprints:
            mount["fsx_client_key_fingerprints"] = list(dataset.fsx.client_key_fingerprints)
    owner = bucket_owner if bucket_owner is not None else dataset.expected_bucket_owner
    if owner is not None:
        mount["expected_bucket_owner"] = owner
    return mount  # type: ignore[return-value]


def node_scripts_args(spec: StackSpec) -> NodeScriptsArgs:
    """The stack's node-scripts bucket: tagged as the stack, deletable only by the break-glass role."""
    args: dict[str, Any] = {"cluster_name": spec.cluster.name, "identity": spec.identity,
                            "region": spec.region, "tags": spec.tags}
    if spec.cluster.break_glass_role is not None:
        args["break_glass_role"] = spec.cluster.break_glass_role
    return args  # type: ignore[return-value]


def node_identity_args(spec: StackSpec, grants: Sequence[S3Grant],
                       node_scripts: Any = None) -> NodeIdentityArgs:
    """The nodes' role: the datasets' grants (each pinned to its bucket's owner), the run log group,
    the node groups' container images (ECR pulls), the node scripts bundle's read and the boundary."""
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name,
        "s3_grants": [grant_args(g) for g in grants],
        "tags": spec.tags, "run_log_group": run_log_group_name(spec.identity)}
    if node_scripts is not None:
        args["node_scripts"] = node_scripts
    images = sorted({g.container_image for g in spec.node_groups if g.container_image})
    if images:
        args["container_images"] = images
    if spec.scheduler.slurm:  # AWS PCS launches the nodes: the profile PCS accepts, registration
        args["pcs"] = True
    if spec.scheduler.eks:  # the nodes join an EKS cluster
        args["eks"] = True
    return with_boundary(spec, args)  # type: ignore[return-value]


def grant_args(grant: S3Grant) -> dict[str, Any]:
    args = {"bucket_name": grant.bucket_name, "prefix": grant.prefix, "write": grant.write}
    if grant.expected_bucket_owner is not None:
        args["expected_bucket_owner"] = grant.expected_bucket_owner
    return args


def with_boundary(spec: StackSpec, args: dict[str, Any]) -> dict[str, Any]:
    """`args` plus the stack's permissions boundary, when it names one (every role the stack makes)."""
    if spec.cluster.permissions_boundary is not None:
        args["permissions_boundary"] = spec.cluster.permissions_boundary
    return args


def node_group_args(spec: StackSpec, group: NodeGroupConfig, *, subnet_ids: Sequence[Any],
                    security_group_ids: Sequence[Any], placement_group_name: Any,
                    instance_profile_arn: Any, data_mounts: Sequence[NodeDataMount],
                    node_role_name: Any = None, notify_topic_arn: Any = "",
                    notify_key_arn: Any = "", remote_write_url: Any = None,
                    node_scripts: Any = None, eks: EksNodeSettings | None = None) -> GpuNodeGroupArgs:
    """One node group in the network's subnets for its zones, with every dataset mounted.

    `node_role_name` is the role of `instance_profile_arn` (it gets the group's health
    permission); the topic and key are where nodes report health findings.
    """
    args: dict[str, Any] = {
        "node_group": settings(group), "cluster_name": spec.cluster.name, "region": spec.region,
        "identity": spec.identity, "subnet_ids": list(subnet_ids),
        "security_group_ids": list(security_group_ids), "instance_profile_arn": instance_profile_arn,
        "tags": spec.tags, "spot": settings(spec.spot), "data_mounts": list(data_mounts),
        "autostop": settings(spec.autostop), "notify_topic_arn": notify_topic_arn,
        "notify_key_arn": notify_key_arn,
    }
    if node_role_name is not None:
        args["node_role_name"] = node_role_name
    if node_scripts is not None:
        args["node_scripts"] = node_scripts
    if spec.observability.prometheus.active:  # only then: a stack without it keeps its args as they were
        args["observability"] = settings(spec.observability)
        if remote_write_url is not None:
            args["remote_write_url"] = remote_write_url
    if launches_baked(spec.images, group):
        args["image"] = settings(baked_image(spec.images, group))
    if placement_group_name is not None:
        args["placement_group_name"] = placement_group_name
    if spec.scheduler.slurm:  # only then: a stack without it keeps its args as they were
        args["scheduler"] = "slurm"
        if spec.scheduler.ami_id is not None:
            args["slurm_ami_id"] = spec.scheduler.ami_id
    if eks is not None:  # an EKS stack: the group is a self-managed node group of this cluster
        args["scheduler"] = "eks"
        args["eks"] = eks
    return args  # type: ignore[return-value]


def guardrails_args(spec: StackSpec, asgs: Mapping[str, tuple[Any, Any]]) -> GuardrailsArgs:
    """Guardrails of every node group (`asgs`: group name -> (ASG name, ASG ARN)), in spec order.

    The groups are the stack's own and already carry the identity tag: no `tag_groups`.
    """
    args: dict[str, Any] = {
        "groups": [{"name": g.name, "asg_name": asgs[g.name][0], "asg_arn": asgs[g.name][1],
                    "can_run_spot": can_run_spot(g),
                    **({"capacity_block_reservation_id": g.capacity.capacity_reservation_id}
                       if g.capacity.market == "capacity_block" else {})}
                   for g in spec.node_groups],
        "cluster_name": spec.cluster.name, "identity": spec.identity, "region": spec.region,
        "tags": spec.tags, "autostop": settings(spec.autostop), "spot": settings(spec.spot),
        "tag_groups": False, "notify_emails": list(spec.notifications.emails),
        # gpucluster's own nodes run gpucluster-job: `run --restart-on-replace` works on them (not on a
        # Slurm stack: no Auto Scaling group to watch; Slurm requeues its jobs)
        # (nor on an EKS stack: Kueue requeues a preempted job's workload)
        "restart_jobs": not spec.scheduler.slurm and not spec.scheduler.eks,
    }
    if spec.budget is not None:
        args["budget"] = settings(spec.budget)
        if spec.budget.action_threshold_percent is not None:
            args["spend_prices"] = guard_prices(spec)
    return with_boundary(spec, args)  # type: ignore[return-value]


def dashboard_args(spec: StackSpec, asg_names: Mapping[str, Any], *, notify_topic_arn: Any = None,
                   guardrail_log_groups: Sequence[Any] = (),
                   alarm_arns: Sequence[Any] = ()) -> ClusterDashboardArgs:
    """The stack's dashboard: every node group (group name -> ASG name), with its stuck-job alarm if set."""
    groups: list[dict[str, Any]] = []
    for g in spec.node_groups:
        entry: dict[str, Any] = {"name": g.name, "asg_name": asg_names[g.name]}
        if g.health_checks.stuck_alarm_minutes is not None:
            entry["stuck_alarm_minutes"] = g.health_checks.stuck_alarm_minutes
            if g.mig is not None:
                entry["mig"] = True
        groups.append(entry)
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name, "identity": spec.identity, "region": spec.region,
        "groups": groups, "guardrail_log_groups": list(guardrail_log_groups),
        "alarm_arns": list(alarm_arns), "tags": spec.tags,
    }
    if notify_topic_arn is not None:
        args["notify_topic_arn"] = notify_topic_arn
    if spec.budget is not None:
        args["budget"] = settings(spec.budget)
    return args  # type: ignore[return-value]


def slurm_cluster_args(spec: StackSpec, *, vpc_id: Any, subnet_ids_by_zone: Mapping[str, Any],
                       egress: Sequence[tuple[str, Mapping[str, Any], int, str]]) -> SlurmClusterArgs:
    """A Slurm stack's AWS PCS cluster: the scheduler section, the controller's interface (and the login
    nodes) in the subnet of the first group's first zone, idle scale-down from autostop.idle_minutes."""
    s = spec.scheduler
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name, "identity": spec.identity, "region": spec.region,
        "tags": spec.tags, "slurm_version": s.slurm_version, "size": s.size, "accounting": s.accounting,
        "vpc_id": vpc_id, "subnet_id": subnet_ids_by_zone[spec.azs_of(spec.node_groups[0])[0]],
        "egress": [{"name": name, "port": port, "why": why, **target} for name, target, port, why in egress],
        "login_instance_type": s.login.instance_type, "login_count": s.login.count,
    }
    if spec.autostop.enabled:
        args["idle_minutes"] = spec.autostop.idle_minutes
    if s.ami_id is not None:
        args["login_ami_id"] = s.ami_id
    return with_boundary(spec, args)  # type: ignore[return-value]


def pcs_purchase_option(market: str, spot_percent: float) -> str:
    """ONDEMAND, SPOT or CAPACITY_BLOCK: one per compute node group (the spec allows 0 or 100 % spot)."""
    if market == "capacity_block":
        return "CAPACITY_BLOCK"
    return "SPOT" if spot_percent >= 100 else "ONDEMAND"


def slurm_compute_group(spec: StackSpec, group: NodeGroupConfig, *, launch_template_id: Any,
                        launch_template_version: Any, instance_profile_arn: Any,
                        subnet_ids: Sequence[Any]) -> SlurmComputeGroup:
    """One node group as an AWS PCS compute node group (and its queue) on its own launch template:
    min_nodes stay up (static capacity), max_nodes is the most the queue scales to."""
    cap = group.capacity
    option = pcs_purchase_option(cap.market, cap.spot_percent)
    entry: dict[str, Any] = {
        "name": group.name, "launch_template_id": launch_template_id,
        "launch_template_version": launch_template_version, "instance_profile_arn": instance_profile_arn,
        "instance_types": list(group.instance_types), "min_nodes": group.min_nodes,
        "max_nodes": group.max_nodes, "subnet_ids": list(subnet_ids), "purchase_option": option,
    }
    if option == "SPOT":
        entry["spot_allocation_strategy"] = cap.spot_allocation_strategy
    image = baked_image(spec.images, group)
    ami = (image.ami_id if image is not None and launches_baked(spec.images, group) else None) \
        or group.ami_id or spec.scheduler.ami_id
    if ami is not None:
        entry["ami_id"] = ami
    return entry  # type: ignore[return-value]


def baked_groups(spec: StackSpec) -> list[NodeGroupConfig]:
    """The groups Image Builder bakes an image for (`images.bake`, less the groups that opt out)."""
    return [g for g in spec.node_groups if baked_image(spec.images, g) is not None]


def images_args(spec: StackSpec, *, vpc_id: Any, subnet_id: Any,
                parent_images: Mapping[str, Any]) -> NodeImagesArgs:
    """The stack's image pipelines: one per baked group, on its resolved base (`parent_images`)."""
    images = spec.images
    build = catalog.get(images.build_instance_type)
    groups = []
    for g in baked_groups(spec):
        mounts = spec.datasets  # every dataset reaches every node group
        entry: dict[str, Any] = {
            "name": g.name, "parent_image": parent_images[g.name],
            "root_volume_size_gib": g.root_volume_size_gib,
            "fsx": any(d.access == "fsx" for d in mounts),
            "mount_s3": any(d.access == "mount" for d in mounts), "efa": g.efa_enabled,
            "lustre_key_fingerprints": sorted({fpr for d in mounts if d.fsx
                                               for fpr in d.fsx.client_key_fingerprints}),
        }
        if g.container_image:
            entry["container_image"] = g.container_image
        if spec.scheduler.slurm:  # the PCS agent and Slurm baked in (gpucluster.node.bake)
            entry["slurm_version"] = spec.scheduler.slurm_version
        groups.append(entry)
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name, "identity": spec.identity, "region": spec.region,
        "vpc_id": vpc_id, "subnet_id": subnet_id, "groups": groups, "version": images.version,
        "build_instance_type": images.build_instance_type, "build_gpus": build.gpus if build else 1,
        "schedule_timezone": images.schedule_timezone, "tags": spec.tags,
    }
    if images.schedule is not None:
        args["schedule"] = images.schedule
    return with_boundary(spec, args)  # type: ignore[return-value]


def kubernetes_version(spec: StackSpec) -> str:
    """The EKS cluster's Kubernetes version: the stack's, else the catalog's newest in standard support."""
    return eks_catalog.resolved_version(spec.scheduler.kubernetes_version, eks_catalog.today())


def eks_cluster_args(spec: StackSpec, *, subnet_ids: Sequence[Any]) -> EksClusterArgs:
    """An EKS stack's control plane in the stack's private subnets, with its system node group."""
    s = spec.scheduler
    args: dict[str, Any] = {
        "cluster_name": spec.cluster.name, "identity": spec.identity, "region": spec.region,
        "tags": spec.tags, "kubernetes_version": kubernetes_version(spec),
        "endpoint_public": s.endpoint_public, "subnet_ids": list(subnet_ids),
        "system_instance_type": s.system_nodes.instance_type, "system_count": s.system_nodes.count,
    }
    return with_boundary(spec, args)  # type: ignore[return-value]


def eks_node(spec: StackSpec, *, cluster_name: str, endpoint: Any, certificate_authority: Any,
             service_cidr: Any) -> EksNodeSettings:
    """What every GPU node group of an EKS stack tells nodeadm: the cluster it joins; with MIG groups the
    GPU Operator's MIG strategy too (what their autoscaler tags advertise)."""
    settings: EksNodeSettings = {"cluster_name": cluster_name, "endpoint": endpoint,
                                 "certificate_authority": certificate_authority,
                                 "service_cidr": service_cidr, "kubernetes_version": kubernetes_version(spec)}
    from gpucluster.eks.queues import mig_strategy  # only an EKS stack loads gpucluster.eks

    strategy = mig_strategy(spec)
    if strategy is not None:
        settings["mig_strategy"] = strategy
    return settings
