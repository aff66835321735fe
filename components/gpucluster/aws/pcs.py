"""SlurmCluster: a Slurm stack's AWS PCS cluster, its compute node groups and queues, and its login group.

It owns what AWS PCS (managed Slurm) is given on a `scheduler: {type: slurm}` stack: the cluster (the
Slurm version, the controller size, its interface in one private subnet of the stack with a security
group of its own, the idle scale-down time, accounting), one compute node group per gpucluster node
group built on that group's own launch template (`GpuNodeGroup`: EFA interfaces, placement, IMDSv2,
encrypted root, no public address, the node bootstrap) and instance profile, one queue (Slurm
partition) per node group named as the group, and the login compute node group `login` (a small
launch template of its own, no GPUs, no queue) where users run sbatch/srun/squeue through SSM.
It also owns the security group rules Slurm needs between the controller and every Slurm node.
It never launches nodes itself and never opens anything to outside the stack's Slurm nodes.

pulumi-aws-native is the only provider with PCS resources (pulumi-aws 7 has none) and makes the node
groups and queues; the cluster itself is an `aws.cloudcontrol.Resource` of CloudFormation's
AWS::PCS::Cluster (SlurmCluster's constructor says why). pulumi-aws-native is imported here and
nowhere else, and GpuCluster imports this module only on a Slurm stack, so a `type: none` stack never
loads it (its top-level import costs about 0.1 s).

Sources: "Security groups in AWS PCS" (https://docs.aws.amazon.com/pcs/latest/userguide/
working-with_networking_sg.html): the controller's interface and the instances must reach each other,
slurmctld on 6817 from the instances, slurmd on 6818 from the controller, and where a launch
template defines network interfaces its security groups go on each interface; the rules themselves,
slurmdbd's and srun's ports included, are `slurm.ports.slurm_rules` (which `verify` checks too).
Names: pulumi-aws-native 1.84's PCS docstrings give no length or pattern ("The name that
identifies the compute node group"); ledger: pcs-group-and-queue-names (API reference: CreateComputeNodeGroup,
CreateQueue): 3-25 characters, a letter first, then letters, digits, '-' and '_', not starting
`pcs_`: `spec/scheduler.py` checks a Slurm stack's group names against that.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws
import pulumi_aws_native as aws_native

from gpucluster.aws.amis import root_device
from gpucluster.aws.args import component_options, owned_tags, type_token
from gpucluster.aws.iam import NodeIdentity
from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP
from gpucluster.node.multipart import PCS_USER_DATA_BYTES, encode_multipart_user_data
from gpucluster.node.userdata import MAX_USER_DATA_BYTES
from gpucluster.slurm.ports import slurm_rules

OLD_TYPE = "gpucluster:pcs:SlurmCluster"
PCS_CLUSTER_TYPE = "AWS::PCS::Cluster"  # the CloudFormation type Cloud Control creates
LOGIN_ROOT_GIB = 64
DEFAULT_LOGIN_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
# A login node runs what users type: the SSM agent (no SSH: no key, no port 22, no sshd), and nothing of
# the GPU bootstrap. The AMI carries the PCS agent and Slurm (sackd), which AWS PCS configures.
LOGIN_SCRIPT = """#!/bin/bash
# gpucluster: a Slurm login node (AWS PCS). Reached through SSM Session Manager only.
set -euo pipefail
systemctl enable --now amazon-ssm-agent 2>/dev/null \\
  || systemctl enable --now snap.amazon-ssm-agent.amazon-ssm-agent.service
systemctl disable --now ssh.service sshd.service 2>/dev/null || true
"""


# ------------------------------------------------------------------ pure: what PCS is given


def cluster_slurm_configuration(idle_minutes: int | None, accounting: bool) -> dict[str, Any]:
    """The cluster's SlurmConfiguration as CloudFormation names it (AWS::PCS::Cluster: Accounting.Mode,
    ScaleDownIdleTimeInSeconds). Without autostop, PCS's own default idle time applies (no key).
    Accounting STANDARD or NONE, always said: "Slurm accounting in AWS PCS", set at creation only.
    """
    config: dict[str, Any] = {"Accounting": {"Mode": "STANDARD" if accounting else "NONE"}}
    if idle_minutes is not None:
        config["ScaleDownIdleTimeInSeconds"] = idle_minutes * 60
    return config


def pcs_cluster_name(component: str, identity: str) -> str:
    """The PCS cluster's name: unique per account and region, as PCS names are, not per stack, so the
    identity's hash keeps two stacks with the same cluster name apart (as Image Builder's recipe names).
    The component's name is at most 28 characters (a 24-character cluster name and `-pcs`): 37 in all,
    within the 40 the schema's Id pattern allows a name (`[A-Za-z][A-Za-z0-9-]{1,40}`;
    ledger: pcs-cluster-name-length)."""
    return f"{component}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def cluster_document(name: str, slurm_version: str, size: str, subnet_id: Any, security_group_id: Any,
                     idle_minutes: int | None, accounting: bool, tags: dict[str, Any]) -> dict[str, Any]:
    """The AWS::PCS::Cluster document Cloud Control is given: property names and shapes as CloudFormation's
    schema has them (cfn-lint's bundled `AWS::PCS::Cluster`; tests/test_pcs_document.py validates it).
    Name, Networking and Size are create-only there, and so is what PCS says of accounting.
    """
    return {
        "Name": name,
        "Scheduler": {"Type": "SLURM", "Version": slurm_version},
        "Size": size.upper(),
        "Networking": {"SubnetIds": [subnet_id], "SecurityGroupIds": [security_group_id],
                       "NetworkType": "IPV4"},
        "SlurmConfiguration": cluster_slurm_configuration(idle_minutes, accounting),
        "Tags": tags,  # a map in this schema (patternProperties), not a list of Key/Value
    }


def cluster_attribute(properties: str | None, key: str) -> str:
    """One read-only attribute (Id, Arn) of the cluster from the model Cloud Control returns (`properties`,
    a JSON string of the whole AWS::PCS::Cluster model, read-only properties included)."""
    value = json.loads(properties or "{}").get(key)
    if not isinstance(value, str):
        raise ValueError(f"AWS::PCS::Cluster model without {key}: {properties!r}")
    return value


# ------------------------------------------------------------------------------ args


class SlurmEgressRule(TypedDict):
    """An outbound rule of the login node: what the node groups' own security groups allow."""

    name: str
    """Its part of the rule's name."""
    port: int
    """TCP port."""
    why: str
    """Its description."""
    cidr_ipv4: NotRequired[pulumi.Input[str]]
    """Where to (a CIDR), or:"""
    prefix_list_id: NotRequired[pulumi.Input[str]]
    """where to (a prefix list: S3's gateway endpoint)."""


class SlurmComputeGroup(TypedDict):
    """One gpucluster node group as a PCS compute node group and its queue."""

    name: str
    """The node group's name: the compute node group's and the queue's (the Slurm partition)."""
    launch_template_id: pulumi.Input[str]
    """The group's launch template (GpuNodeGroup's)."""
    launch_template_version: pulumi.Input[Any]
    """Its latest version: a new version (an AMI pin, a bootstrap change) updates the node group."""
    instance_profile_arn: pulumi.Input[str]
    """The group's instance profile (role under /aws-pcs/, pcs:RegisterComputeNodeGroupInstance)."""
    instance_types: list[str]
    """Instance types PCS may launch, in the group's order."""
    min_nodes: int
    """Static nodes PCS keeps running (a Capacity Block, a reservation, a committed base)."""
    max_nodes: int
    """The most nodes the queue may scale to."""
    subnet_ids: pulumi.Input[list[pulumi.Input[str]]]
    """The subnets of the group's zones."""
    purchase_option: str
    """ONDEMAND, SPOT or CAPACITY_BLOCK."""
    spot_allocation_strategy: NotRequired[str]
    """SPOT: lowest-price, capacity-optimized or price-capacity-optimized."""
    ami_id: NotRequired[pulumi.Input[str]]
    """The AMI when one is named (baked image, ami_id, scheduler.ami_id); else the template's."""


class SlurmClusterArgs(TypedDict):
    """An AWS PCS cluster in a stack's VPC, with its login group (compute groups are added after)."""

    cluster_name: str
    """The stack's cluster name (descriptions, the login node's Name tag)."""
    identity: str
    """The gpucluster:stack tag value."""
    region: str
    """AWS region."""
    tags: NotRequired[dict[str, str]]
    """The stack's tags (identity tags added)."""
    slurm_version: str
    """Slurm major version AWS PCS runs (24.11, 25.05, 25.11)."""
    size: str
    """Controller size: small, medium or large."""
    accounting: bool
    """Slurm accounting (STANDARD)."""
    idle_minutes: NotRequired[int]
    """Idle compute nodes are scaled down after this (autostop.idle_minutes); absent: PCS's default."""
    vpc_id: pulumi.Input[str]
    """The stack's VPC."""
    subnet_id: pulumi.Input[str]
    """The private subnet of the controller's interface and the login nodes."""
    egress: list[SlurmEgressRule]
    """The login node's outbound rules (SSM, packages): the node groups' own."""
    login_instance_type: str
    """The login nodes' type (no GPUs)."""
    login_count: int
    """Login nodes, always running."""
    login_ami_id: NotRequired[str]
    """The login nodes' AMI (PCS agent and Slurm); absent: the default parameter's, resolved once."""
    permissions_boundary: NotRequired[str]
    """The boundary of the login nodes' role."""


# ------------------------------------------------------------------------- component


class SlurmCluster(pulumi.ComponentResource):
    """An AWS PCS cluster, its Slurm security groups, its login group, and a compute node group and queue
    per node group (`add_node_group`, then `finish`).

    Python users also get `cluster` (`aws.cloudcontrol.Resource` of AWS::PCS::Cluster),
    `cluster_security_group` and
    `node_security_group` (`aws.ec2.SecurityGroup`: the controller's; every Slurm node's, to put on
    each interface of a node group's launch template), `node_groups` and `queues` (name ->
    `aws_native.pcs.ComputeNodeGroup` / `Queue`), `login_identity`, `login_template`.
    """

    cluster_id: pulumi.Output[str]
    """The PCS cluster's id (what the guardrails and the CLI call PCS with)."""
    cluster_arn: pulumi.Output[str]
    """The PCS cluster's ARN."""
    node_group_ids: pulumi.Output[dict[str, str]]
    """gpucluster node group name (and `login`) -> its PCS compute node group id."""

    def __init__(self, name: str, args: SlurmClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("SlurmCluster"), name, None, component_options(opts, OLD_TYPE))
        self._name, self._args = name, args
        self._tags = owned_tags(args.get("tags", {}), args["identity"], args["cluster_name"])
        child = self._child = pulumi.ResourceOptions(parent=self)
        label = args["cluster_name"]
        self.cluster_security_group = aws.ec2.SecurityGroup(
            f"{name}-controller", vpc_id=args["vpc_id"],
            description=f"gpucluster {label}: the AWS PCS controller's interface (Slurm ports only)",
            tags={**self._tags, "Name": f"{label}-slurm-controller"}, opts=child)
        self.node_security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes", vpc_id=args["vpc_id"],
            description=f"gpucluster {label}: every Slurm node (Slurm ports: the controller, each other)",
            tags={**self._tags, "Name": f"{label}-slurm-nodes"}, opts=child)
        groups = {"cluster": self.cluster_security_group, "nodes": self.node_security_group}
        self.rules: dict[str, pulumi.CustomResource] = {}
        for rule in slurm_rules(args["accounting"]):
            kind = (aws.vpc.SecurityGroupIngressRule if rule.direction == "in"
                    else aws.vpc.SecurityGroupEgressRule)
            self.rules[rule.name] = kind(
                f"{name}-{rule.name}", security_group_id=groups[rule.group].id,
                referenced_security_group_id=groups[rule.peer].id, ip_protocol="tcp",
                from_port=rule.from_port, to_port=rule.to_port, description=rule.why,
                tags={**self._tags, "Name": f"{label}-slurm-{rule.name}"}, opts=child)
        # The cluster goes through Cloud Control with CloudFormation's own document, not
        # aws_native.pcs.Cluster: pulumi-aws-native 1.84.0 names inline objects `<Prop>Properties`, so the
        # Cluster's, ComputeNodeGroup's and Queue's SlurmConfiguration collide and the Queue's wins
        # (`pcs.SlurmConfigurationPropertiesArgs`: only slurm_custom_settings). Its Check rejects
        # Accounting and ScaleDownIdleTimeInSeconds, and unchecked would drop them: accounting could
        # never be turned on (it is set at creation only). Upstream: pulumi/pulumi-aws-native, the PCS
        # SlurmConfiguration type collision (to report there; aws-native 1.84.0).
        # An existing stack's aws-native cluster is replaced by this one (another resource type). That
        # is accepted: accounting cannot be turned on later, and the old resource never deployed (its
        # preview fails on the keys above). Named (pcs_cluster_name): Cloud Control does not generate
        # names as aws-native did. Name is create-only, so a replacement deletes the old cluster first
        # (its node groups and queues follow).
        pcs_name = pcs_cluster_name(name, args["identity"])
        document = pulumi.Output.all(self.cluster_security_group.id, args["subnet_id"]).apply(
            lambda ids: json.dumps(cluster_document(
                pcs_name, args["slurm_version"], args["size"], ids[1], ids[0], args.get("idle_minutes"),
                args["accounting"], self._tags), sort_keys=True))
        self.cluster = aws.cloudcontrol.Resource(
            name, type_name=PCS_CLUSTER_TYPE, desired_state=document,
            # The controller must reach the nodes as soon as it exists.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.rules.values()),
                                        delete_before_replace=True))
        self.cluster_id = self.cluster.properties.apply(lambda p: cluster_attribute(p, "Id"))
        self.cluster_arn = self.cluster.properties.apply(lambda p: cluster_attribute(p, "Arn"))
        self.node_groups: dict[str, aws_native.pcs.ComputeNodeGroup] = {}
        self.queues: dict[str, aws_native.pcs.Queue] = {}
        self._login()

    def _login(self) -> None:
        """The login group: its role, security group, launch template and compute node group (no queue)."""
        args, name, child, label = self._args, self._name, self._child, self._args["cluster_name"]
        identity: dict[str, Any] = {"cluster_name": label, "tags": self._tags, "pcs": True}
        if "permissions_boundary" in args:
            identity["permissions_boundary"] = args["permissions_boundary"]
        self.login_identity = NodeIdentity(f"{name}-login", identity, opts=child)  # type: ignore[arg-type]
        self.login_security_group = aws.ec2.SecurityGroup(
            f"{name}-login", vpc_id=args["vpc_id"],
            description=f"gpucluster {label}: Slurm login nodes (no inbound; access through SSM)",
            tags={**self._tags, "Name": f"{label}-login"}, opts=child)
        for rule in args["egress"]:
            target = {k: rule[k] for k in ("cidr_ipv4", "prefix_list_id") if k in rule}
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-login-egress-{rule['name']}", security_group_id=self.login_security_group.id,
                ip_protocol="tcp", from_port=rule["port"], to_port=rule["port"], description=rule["why"],
                tags={**self._tags, "Name": f"{label}-login-egress-{rule['name']}"}, opts=child, **target)
        tags = {**self._tags, NODE_GROUP_TAG: SLURM_LOGIN_GROUP, "Name": f"{label}-{SLURM_LOGIN_GROUP}"}
        ami = args.get("login_ami_id")
        image = ami or aws.ssm.get_parameter_output(
            name=DEFAULT_LOGIN_AMI_PARAMETER, opts=pulumi.InvokeOptions(parent=self)).value
        self.login_template = aws.ec2.LaunchTemplate(
            f"{name}-login-lt", description=f"gpucluster {label}/{SLURM_LOGIN_GROUP}: Slurm login nodes",
            image_id=image,
            user_data=encode_multipart_user_data(LOGIN_SCRIPT, MAX_USER_DATA_BYTES - PCS_USER_DATA_BYTES),
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 1, "instance_metadata_tags": "disabled"},
            # The AMI's own root device (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux): `aws.amis`.
            block_device_mappings=[{"device_name": root_device(image, pulumi.InvokeOptions(parent=self)),
                                    "ebs": {
                "volume_size": LOGIN_ROOT_GIB, "volume_type": "gp3", "encrypted": "true",
                "delete_on_termination": "true"}}],
            network_interfaces=[{
                "device_index": 0, "associate_public_ip_address": "false", "delete_on_termination": "true",
                "security_groups": [self.login_security_group.id, self.node_security_group.id]}],
            tag_specifications=[{"resource_type": kind, "tags": tags}
                                for kind in ("instance", "volume", "network-interface")],
            update_default_version=True, tags=tags,
            # The default parameter names the latest image: resolved at creation, then kept.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=[] if ami else ["imageId"]))
        login: SlurmComputeGroup = {
            "name": SLURM_LOGIN_GROUP, "launch_template_id": self.login_template.id,
            "launch_template_version": self.login_template.latest_version,
            "instance_profile_arn": self.login_identity.instance_profile_arn,
            "instance_types": [args["login_instance_type"]], "min_nodes": args["login_count"],
            "max_nodes": args["login_count"], "subnet_ids": [args["subnet_id"]],
            "purchase_option": "ONDEMAND"}
        if ami:
            login["ami_id"] = ami
        self.add_node_group(login, queue=False)

    def add_node_group(self, group: SlurmComputeGroup, queue: bool = True) -> aws_native.pcs.ComputeNodeGroup:
        """The group's compute node group on its own launch template, and (unless `queue` is false) its
        queue. Names are fixed (the group's): a replacement deletes the old one first."""
        name, gname = self._name, group["name"]
        tags = {**self._tags, NODE_GROUP_TAG: gname}
        pcs = aws_native.pcs
        spot = (pcs.SpotOptionsPropertiesArgs(allocation_strategy=(
                    pcs.ComputeNodeGroupSpotOptionsPropertiesAllocationStrategy(
                        group["spot_allocation_strategy"])))
                if group["purchase_option"] == "SPOT" and "spot_allocation_strategy" in group else None)
        # The template's latest version is unknown until it exists (None in a preview): passed on as such.
        version: pulumi.Output[str] = pulumi.Output.from_input(group["launch_template_version"]).apply(
            lambda v: str(int(v)) if v is not None else None)  # type: ignore[arg-type, return-value]
        # The SDK's typed Args: Python itself refuses a key the provider would not know. The node group's
        # own SlurmConfiguration (ScaleDownIdleTimeInSeconds...) is typed as the Queue's in
        # pulumi-aws-native 1.84.0 (the collision the cluster's comment names); none is set here: the
        # cluster's idle time applies to every group.
        node_group = self.node_groups[gname] = pcs.ComputeNodeGroup(
            f"{name}-{gname}", name=gname, cluster_id=self.cluster_id,
            custom_launch_template=pcs.CustomLaunchTemplatePropertiesArgs(
                template_id=group["launch_template_id"], version=version),
            iam_instance_profile_arn=group["instance_profile_arn"],
            instance_configs=[pcs.ComputeNodeGroupInstanceConfigArgs(instance_type=t)
                              for t in group["instance_types"]],
            scaling_configuration=pcs.ScalingConfigurationPropertiesArgs(
                min_instance_count=group["min_nodes"], max_instance_count=group["max_nodes"]),
            subnet_ids=group["subnet_ids"],
            purchase_option=pcs.ComputeNodeGroupPurchaseOption(group["purchase_option"]),
            ami_id=group.get("ami_id"), spot_options=spot,
            tags=tags, opts=pulumi.ResourceOptions(
                parent=self, delete_before_replace=True,
                # The guardrails stop a group by setting its minimum and maximum to 0 and resume it by
                # restoring them (`fleet.pcsgroups`): after creation the scaling belongs to them, as an
                # Auto Scaling group's minimum does (GpuNodeGroup), or `pulumi up` would restart what they
                # stopped. The login group keeps its count from the stack file.
                ignore_changes=["scalingConfiguration"] if queue else []))
        if queue:
            self.queues[gname] = pcs.Queue(
                f"{name}-{gname}-queue", name=gname, cluster_id=self.cluster_id,
                compute_node_group_configurations=[pcs.QueueComputeNodeGroupConfigurationArgs(
                    compute_node_group_id=node_group.aws_id)],
                tags=tags, opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))
        return node_group

    def finish(self) -> None:
        """Every group is in: the outputs."""
        # from_input resolves the Outputs inside the dict; its annotation takes a plain Input[T] only.
        self.node_group_ids = pulumi.Output.from_input(
            {g: n.aws_id for g, n in self.node_groups.items()})  # type: ignore[misc]
        self.register_outputs({"cluster_id": self.cluster_id, "cluster_arn": self.cluster_arn,
                               "node_group_ids": self.node_group_ids})

