"""ClusterNetwork: where GPU nodes live and what they may talk to.

It owns the VPC side of a cluster: either a created VPC (private subnets, one
per zone, an S3 gateway endpoint, the interface endpoints SSM needs, and
internet egress through one NAT gateway unless turned off) or an existing VPC
and its subnets (ids, plain or Outputs); and per node group the node security
group and, where asked for, the cluster placement group; and the VPC's flow
logs (rejected traffic by default) in a KMS-encrypted log group with a
retention. It never gives a GPU node a public address or opens ingress from
anywhere but the group itself.

Security groups are per node group, not per cluster: the all-traffic self
rules that EFA and NCCL need (NCCL picks its ports at run time) then cover
exactly the nodes of one group, every group that can hold more than one node
gets them, and a single-node group (say, inference next to training) gets none.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import (
    ClusterNetworkModel,
    GroupNetworkModel,
    component_options,
    network_checks,
    type_token,
    validate,
)
from gpucluster.subnets import plan_subnets

# Flow logs are kept 90 days: long enough to trace where data went after an incident noticed
# weeks later, short enough that their storage stays cents (pricing.py counts it).
FLOW_LOG_RETENTION_DAYS = 90
# Aggregate records over 10 minutes (the default; 1 minute multiplies the record count).
FLOW_LOG_AGGREGATION_SECONDS = 600

# Systems Manager user guide, "Improve the security of EC2 instances by using VPC endpoints
# for Systems Manager": Session Manager and Run Command need these three.
SSM_ENDPOINTS = ("ssm", "ssmmessages", "ec2messages")
# Without a NAT gateway the CloudWatch agent still needs CloudWatch (PutMetricData) and EC2
# (DescribeTags, for the AutoScalingGroupName dimension); the node health check needs Auto Scaling
# (its group, CompleteLifecycleAction, SetInstanceHealth) and SNS (its reports): without them
# every new node would wait out the launch hook and be abandoned.
NO_NAT_ENDPOINTS = ("monitoring", "ec2", "autoscaling", "sns")
# Also without a NAT gateway: nodes that remote-write GPU metrics reach Amazon Managed Service for
# Prometheus through `aps-workspaces` (AMP user guide, "Using Amazon Managed Service for Prometheus with
# interface VPC endpoints"), and PCS nodes register with their node group (RegisterComputeNodeGroupInstance)
# through `pcs` (PCS user guide, "VPC interface endpoints"; issue 34): without it PCS replaces them in a loop.
AMP_ENDPOINT = "aps-workspaces"
PCS_ENDPOINT = "pcs"
# Also without a NAT gateway, on an EKS stack (Amazon EKS user guide, "Deploy private clusters with limited
# internet access", its endpoint list; ledger: eks-private-cluster-endpoints): ECR's API and registry (the
# add-ons' images and the pause image come from EKS's regional ECR; their layers through the S3 gateway
# endpoint), STS, CloudWatch Logs, the EKS API and EKS Auth (the pod identity agent's
# AssumeRoleForPodIdentity: the autoscaler's, termination handler's and metrics agent's credentials), and
# SQS, which the node termination handler polls in queue mode. ec2 and autoscaling (the VPC CNI, the
# cluster-autoscaler) are in NO_NAT_ENDPOINTS already; no elasticloadbalancing: no load balancer controller.
EKS_ENDPOINTS = ("ecr.api", "ecr.dkr", "sts", "logs", "eks", "eks-auth", "sqs")
ANYWHERE = "0.0.0.0/0"
OLD_TYPE = "gpucluster:network:ClusterNetwork"


class NodeGroupNetwork(TypedDict):
    """What the network provides one node group: subnets in its zones, a security group, a placement group."""

    name: str
    """The node group's name; names its security group and placement group."""
    availability_zones: list[str]
    """Zones the group runs in, from the network's zones; exactly one with EFA or a placement group."""
    efa: NotRequired[bool]
    """EFA: the group's security group allows all traffic within the group, in and out."""
    multi_node: NotRequired[bool]
    """The group can hold more than one node: all traffic within the group too (NCCL, MPI)."""
    placement_group: NotRequired[bool]
    """Create a cluster placement group for the group."""


class ClusterNetworkArgs(TypedDict):
    """A new VPC (or an existing one) for GPU nodes, and each node group's security and placement group."""

    cluster_name: str
    """Short name in every resource's Name tag (2-24 characters a-z, 0-9, '-')."""
    region: str
    """AWS region, e.g. us-east-1 (the VPC endpoints' service names)."""
    availability_zones: list[str]
    """Zones the network spans: a private subnet each (created VPC) or an existing subnet each."""
    vpc_cidr: NotRequired[str]
    """Create a VPC with this CIDR (private subnets, NAT, S3/SSM endpoints)."""
    nat_gateway: NotRequired[bool]
    """Internet egress for nodes through one NAT gateway (created VPCs only; default true)."""
    existing_vpc_id: NotRequired[pulumi.Input[str]]
    """Use this VPC instead of creating one (then existing_subnet_ids is required)."""
    existing_subnet_ids: NotRequired[dict[str, pulumi.Input[str]]]
    """With existing_vpc_id: the private subnet to use in each availability zone."""
    tags: NotRequired[dict[str, str]]
    """Tags for every resource (keys not under aws:)."""
    node_groups: NotRequired[list[NodeGroupNetwork]]
    """The node groups to give a security group (and placement group) each."""
    flow_logs: NotRequired[str]
    """VPC flow logs to a KMS-encrypted CloudWatch log group (90 days): reject (default), all, or off."""
    permissions_boundary: NotRequired[str]
    """Name of a customer managed policy the flow-log role carries as its boundary."""
    remote_write: NotRequired[bool]
    """Nodes remote-write metrics to AMP: without NAT, the VPC gets the aps-workspaces endpoint."""
    slurm: NotRequired[bool]
    """AWS PCS runs the nodes: without NAT, the VPC gets the pcs endpoint (nodes register through it)."""
    eks: NotRequired[bool]
    """The nodes join an EKS cluster: without NAT, the VPC gets the endpoints a private cluster's nodes and
    controllers reach (ECR, STS, Logs, EKS, EKS Auth, SQS)."""


@dataclass(frozen=True)
class GroupNetwork:
    """What one node group gets from the network: subnets, security group, placement group."""

    subnet_ids: list[pulumi.Input[str]]
    security_group: aws.ec2.SecurityGroup
    placement_group: aws.ec2.PlacementGroup | None


class ClusterNetwork(pulumi.ComponentResource):
    """A created or existing VPC, plus each node group's security and placement groups.

    Python users also get `groups` (node group name -> `GroupNetwork`: subnet ids, the
    `aws.ec2.SecurityGroup`, the `aws.ec2.PlacementGroup` or None), `subnets` (zone -> subnet
    id, as Inputs) and `internet_egress` (whether nodes reach the internet through a NAT).
    """

    vpc_id: pulumi.Output[str]
    """The VPC the nodes run in (created or existing)."""
    subnet_ids: pulumi.Output[dict[str, str]]
    """Private subnet per availability zone."""
    security_group_ids: pulumi.Output[dict[str, str]]
    """Node group name -> the security group of its nodes."""
    placement_group_names: pulumi.Output[dict[str, str]]
    """Node group name -> its cluster placement group (only groups that have one)."""

    def __init__(self, name: str, args: ClusterNetworkArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("ClusterNetwork", name, ClusterNetworkModel, args, network_checks)
        super().__init__(type_token("ClusterNetwork"), name, None, component_options(opts, OLD_TYPE))
        self._name, self._args = name, m
        self._child = pulumi.ResourceOptions(parent=self)
        self.s3_prefix_list_id: pulumi.Input[str] | None = None
        vpc_id: pulumi.Input[str]
        if m.existing_vpc_id is not None:
            vpc_id = m.existing_vpc_id
            self.subnets: dict[str, pulumi.Input[str]] = {az: m.existing_subnet_ids[az]
                                                          for az in m.availability_zones}
            self.internet_egress = True  # the VPC's own routing decides; we cannot see it
        else:
            self.internet_egress = m.nat_gateway
            vpc_id = self._create_vpc()
        self._vpc_id = vpc_id
        self.flow_log: aws.ec2.FlowLog | None = None
        if m.flow_logs != "off":
            self.flow_log = self._flow_logs(vpc_id)
        self.groups = {group.name: self._group_network(group) for group in m.node_groups}
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        # from_input resolves the Outputs inside a dict; its annotation takes a plain Input[T] only.
        self.subnet_ids = pulumi.Output.from_input(self.subnets)  # type: ignore[arg-type]
        self.security_group_ids = pulumi.Output.from_input(
            {g: n.security_group.id for g, n in self.groups.items()})  # type: ignore[misc]
        self.placement_group_names = pulumi.Output.from_input(
            {g: n.placement_group.name for g, n in self.groups.items() if n.placement_group})  # type: ignore[misc]
        self.register_outputs({"vpc_id": self.vpc_id, "subnet_ids": self.subnet_ids,
                               "security_group_ids": self.security_group_ids,
                               "placement_group_names": self.placement_group_names})

    def _flow_logs(self, vpc_id: pulumi.Input[str]) -> aws.ec2.FlowLog:
        """Flow logs of the VPC into an encrypted log group only this stack's flow-log role writes.

        The key policy lets CloudWatch Logs use the key for this one log group only
        (CloudWatch Logs user guide, "Encrypt log data in CloudWatch Logs using AWS KMS");
        the role's trust and actions are the VPC user guide's ("IAM role for publishing flow
        logs to CloudWatch Logs"), narrowed to the log group and to this account.
        """
        m, name, child = self._args, self._name, self._child
        invoke = pulumi.InvokeOutputOptions(parent=self)
        account = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        group_name = f"/gpucluster/vpc-flow-logs/{m.cluster_name}"
        group_arn = pulumi.Output.concat("arn:", partition, ":logs:", m.region, ":", account,
                                         ":log-group:", group_name)
        key = aws.kms.Key(
            f"{name}-flow-logs-key", description=f"gpucluster {m.cluster_name}: VPC flow logs",
            enable_key_rotation=True, deletion_window_in_days=30,
            policy=pulumi.Output.all(partition, account, group_arn).apply(
                lambda v: flow_log_key_policy(v[0], m.region, v[1], v[2])),
            tags=self._tags(f"{m.cluster_name}-flow-logs"), opts=child)
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs", name=group_name, retention_in_days=FLOW_LOG_RETENTION_DAYS,
            kms_key_id=key.arn, tags=self._tags(f"{m.cluster_name}-flow-logs"), opts=child)
        role = aws.iam.Role(
            f"{name}-flow-logs-role", description=f"gpucluster {m.cluster_name}: VPC flow logs delivery",
            assume_role_policy=account.apply(lambda a: json.dumps({
                "Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                    "Condition": {"StringEquals": {"aws:SourceAccount": a}}}]}, sort_keys=True)),
            permissions_boundary=pulumi.Output.concat("arn:", partition, ":iam::", account, ":policy/",
                                                      m.permissions_boundary)
            if m.permissions_boundary else None,
            tags=self._tags(f"{m.cluster_name}-flow-logs"), opts=child)
        policy = aws.iam.RolePolicy(
            f"{name}-flow-logs-policy", role=role.id,
            policy=group_arn.apply(lambda arn: json.dumps({
                "Version": "2012-10-17", "Statement": [{
                    "Sid": "DeliverToTheFlowLogGroupOnly", "Effect": "Allow",
                    "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                    "Resource": [arn, f"{arn}:*"]}]}, sort_keys=True)),
            opts=child)
        return aws.ec2.FlowLog(
            f"{name}-flow-log", vpc_id=vpc_id, traffic_type=m.flow_logs.upper(),
            log_destination_type="cloud-watch-logs", log_destination=log_group.arn, iam_role_arn=role.arn,
            max_aggregation_interval=FLOW_LOG_AGGREGATION_SECONDS,
            tags=self._tags(f"{m.cluster_name}-flow-log"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))

    def _tags(self, name: str) -> dict[str, str]:
        return {**self._args.tags, "Name": name}

    def _create_vpc(self) -> pulumi.Output[str]:
        m, name, child = self._args, self._name, self._child
        cidr = m.vpc_cidr
        assert cidr is not None  # the args require vpc_cidr or existing_vpc_id
        zones = m.availability_zones
        plan = plan_subnets(cidr, zones)
        label = m.cluster_name
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=cidr, enable_dns_support=True,
                          enable_dns_hostnames=True,  # interface endpoints' private DNS needs both
                          tags=self._tags(label), opts=child)
        # Take over the VPC's default security group with no rules, so nothing can use it.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id,
                                     tags=self._tags(f"{label}-default-unused"), opts=child)
        private_rt = aws.ec2.RouteTable(f"{name}-private-rt", vpc_id=vpc.id,
                                        tags=self._tags(f"{label}-private"), opts=child)
        self.subnets = {}
        for az, block in plan.private.items():
            subnet = aws.ec2.Subnet(f"{name}-private-{az}", vpc_id=vpc.id, cidr_block=block,
                                    availability_zone=az, map_public_ip_on_launch=False,
                                    tags=self._tags(f"{label}-private-{az}"), opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=subnet.id,
                                          route_table_id=private_rt.id, opts=child)
            self.subnets[az] = subnet.id
        s3 = aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{m.region}.s3",
                                 vpc_endpoint_type="Gateway", route_table_ids=[private_rt.id],
                                 tags=self._tags(f"{label}-s3"), opts=child)
        self.s3_prefix_list_id = s3.prefix_list_id
        endpoint_sg = aws.ec2.SecurityGroup(f"{name}-endpoints", vpc_id=vpc.id,
                                            description=f"gpucluster {label}: VPC interface endpoints",
                                            tags=self._tags(f"{label}-endpoints"), opts=child)
        aws.vpc.SecurityGroupIngressRule(f"{name}-endpoints-https", security_group_id=endpoint_sg.id,
                                         description="HTTPS from inside the VPC", cidr_ipv4=cidr,
                                         ip_protocol="tcp", from_port=443, to_port=443,
                                         tags=self._tags(f"{label}-endpoints-https"), opts=child)
        for service in self._interface_endpoints():
            aws.ec2.VpcEndpoint(f"{name}-{service}", vpc_id=vpc.id,
                                service_name=f"com.amazonaws.{m.region}.{service}",
                                vpc_endpoint_type="Interface", private_dns_enabled=True,
                                subnet_ids=list(self.subnets.values()),
                                security_group_ids=[endpoint_sg.id],
                                tags=self._tags(f"{label}-{service}"), opts=child)
        if self.internet_egress:
            self._create_nat(vpc, plan.public, zones[0], private_rt)
        return vpc.id

    def _interface_endpoints(self) -> tuple[str, ...]:
        """SSM's always; without NAT also what the nodes' agents, checks, metrics, PCS and EKS must reach."""
        if self.internet_egress:
            return SSM_ENDPOINTS
        m = self._args
        return (SSM_ENDPOINTS + NO_NAT_ENDPOINTS + ((AMP_ENDPOINT,) if m.remote_write else ())
                + ((PCS_ENDPOINT,) if m.slurm else ()) + (EKS_ENDPOINTS if m.eks else ()))

    def _create_nat(self, vpc: aws.ec2.Vpc, public_cidr: str, zone: str,
                    private_rt: aws.ec2.RouteTable) -> None:
        name, child, label = self._name, self._child, self._args.cluster_name
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=self._tags(label), opts=child)
        public = aws.ec2.Subnet(f"{name}-public", vpc_id=vpc.id, cidr_block=public_cidr,
                                availability_zone=zone, map_public_ip_on_launch=False,
                                tags=self._tags(f"{label}-public-nat"), opts=child)
        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=vpc.id,
                                       tags=self._tags(f"{label}-public"), opts=child)
        aws.ec2.Route(f"{name}-public-default", route_table_id=public_rt.id,
                      destination_cidr_block=ANYWHERE, gateway_id=igw.id, opts=child)
        aws.ec2.RouteTableAssociation(f"{name}-public", subnet_id=public.id,
                                      route_table_id=public_rt.id, opts=child)
        eip = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags=self._tags(f"{label}-nat"), opts=child)
        nat = aws.ec2.NatGateway(f"{name}-nat", allocation_id=eip.id, subnet_id=public.id,
                                 tags=self._tags(f"{label}-nat"),
                                 opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))
        aws.ec2.Route(f"{name}-private-default", route_table_id=private_rt.id,
                      destination_cidr_block=ANYWHERE, nat_gateway_id=nat.id, opts=child)

    def _group_network(self, group: GroupNetworkModel) -> GroupNetwork:
        child = self._child
        name = f"{self._name}-{group.name}"
        label = f"{self._args.cluster_name}-{group.name}"
        # Declared without inline rules: the provider removes AWS's default allow-all egress
        # (pulumi-aws ec2.SecurityGroup docs), so only the rule resources below apply.
        sg = aws.ec2.SecurityGroup(f"{name}-nodes", vpc_id=self._vpc_id,
                                   description=f"gpucluster {label} GPU nodes (no inbound from outside "
                                               "the group; access through SSM)",
                                   tags=self._tags(f"{label}-nodes"), opts=child)
        if group.efa or group.multi_node:
            self._self_rules(name, label, sg)
        for rule, target, port, why in self._egress_targets():
            aws.vpc.SecurityGroupEgressRule(f"{name}-egress-{rule}", security_group_id=sg.id,
                                            ip_protocol="tcp", from_port=port, to_port=port,
                                            description=why, tags=self._tags(f"{label}-egress-{rule}"),
                                            opts=child, **target)
        placement = None
        if group.placement_group:
            placement = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster",
                                               tags=self._tags(f"{label}-cluster"), opts=child)
        subnets = [self.subnets[az] for az in group.availability_zones]
        return GroupNetwork(subnet_ids=subnets, security_group=sg, placement_group=placement)

    def _self_rules(self, name: str, label: str, sg: aws.ec2.SecurityGroup) -> None:
        """All traffic in AND out between the group's own nodes, nothing from anywhere else.

        EC2 user guide, "Get started with EFA": EFA needs both directions to the group
        itself; NCCL's socket and bootstrap traffic (ports chosen at run time) needs the
        same on any multi-node group. Aliases keep the URNs of the former EFA-only rules.
        """
        for direction, rule_type, peer in (("in", aws.vpc.SecurityGroupIngressRule, "from"),
                                           ("out", aws.vpc.SecurityGroupEgressRule, "to")):
            rule_type(f"{name}-self-{direction}", security_group_id=sg.id,
                      referenced_security_group_id=sg.id, ip_protocol="-1",
                      description=f"All traffic {peer} the group's own nodes (EFA, NCCL)",
                      tags=self._tags(f"{label}-self-{direction}"),
                      opts=pulumi.ResourceOptions(parent=self, aliases=[
                          pulumi.Alias(name=f"{name}-efa-{direction}")]))

    def egress_targets(self) -> list[tuple[str, Mapping[str, pulumi.Input[str]], int, str]]:
        """The node groups' outbound rules (name, target, port, why); a Slurm stack's login nodes' too."""
        return self._egress_targets()

    def _egress_targets(self) -> list[tuple[str, Mapping[str, pulumi.Input[str]], int, str]]:
        """Outbound rules of node groups: only what SSM, S3, CloudWatch and packages need.

        DNS, NTP and IMDS need none: security groups do not filter traffic to the Amazon
        DNS server, Time Sync or instance metadata (VPC user guide, "Security group rules").
        """
        if self.internet_egress:
            return [("https", {"cidr_ipv4": ANYWHERE}, 443, "HTTPS: SSM, S3, CloudWatch, package installs"),
                    ("http", {"cidr_ipv4": ANYWHERE}, 80, "HTTP: Ubuntu package mirrors (signed packages)")]
        cidr = self._args.vpc_cidr
        assert cidr is not None and self.s3_prefix_list_id is not None
        return [("endpoints", {"cidr_ipv4": cidr}, 443, "HTTPS to the VPC interface endpoints"),
                ("s3", {"prefix_list_id": self.s3_prefix_list_id}, 443, "HTTPS to S3 (gateway endpoint)")]


def flow_log_key_policy(partition: str, region: str, account: str, log_group_arn: str) -> str:
    """The account administers the key through IAM; CloudWatch Logs may use it for one log group."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "AccountAdministersThroughIam", "Effect": "Allow",
         "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": "kms:*", "Resource": "*"},
        {"Sid": "LogsEncryptTheFlowLogGroupOnly", "Effect": "Allow",
         "Principal": {"Service": f"logs.{region}.amazonaws.com"},
         "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                    "kms:Describe*"],
         "Resource": "*",
         "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arn}}},
    ]}, sort_keys=True)
