"""ClusterNetwork: where GPU nodes live and what they may talk to.

It owns the VPC side of a cluster: either a created VPC (private subnets, one
per zone, an S3 gateway endpoint, the interface endpoints SSM needs, and
internet egress through one NAT gateway unless the stack turns it off) or an
existing VPC and its subnets from config; and per node group the node security
group and, where asked for, the cluster placement group. It never gives a GPU
node a public address or opens ingress from anywhere but the group itself.

Security groups are per node group, not per cluster: EFA's all-traffic self
rules then cover exactly the nodes of one EFA group, and a non-EFA group (say,
inference next to training) gets no such rules at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
from gpucluster.spec import NodeGroupConfig, StackSpec
from gpucluster.subnets import plan_subnets

# Systems Manager user guide, "Improve the security of EC2 instances by using VPC endpoints
# for Systems Manager": Session Manager and Run Command need these three.
SSM_ENDPOINTS = ("ssm", "ssmmessages", "ec2messages")
# Without a NAT gateway the CloudWatch agent still needs CloudWatch (PutMetricData) and EC2
# (DescribeTags, for the AutoScalingGroupName dimension).
NO_NAT_ENDPOINTS = ("monitoring", "ec2")
ANYWHERE = "0.0.0.0/0"


@dataclass(frozen=True)
class GroupNetwork:
    """What one node group gets from the network: subnets, security group, placement group."""

    subnet_ids: list[pulumi.Input[str]]
    security_group: aws.ec2.SecurityGroup
    placement_group: aws.ec2.PlacementGroup | None


class ClusterNetwork(pulumi.ComponentResource):
    """A created or existing VPC, plus each node group's security and placement groups."""

    vpc_id: pulumi.Input[str]
    subnet_ids: dict[str, pulumi.Input[str]]
    """Private subnet per availability zone, in network.availability_zones order."""
    groups: dict[str, GroupNetwork]
    internet_egress: bool

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:network:ClusterNetwork", name, None, opts)
        self._name, self._spec = name, spec
        self._child = pulumi.ResourceOptions(parent=self)
        net = spec.network
        self.s3_prefix_list_id: pulumi.Input[str] | None = None
        if net.existing_vpc_id:
            self.vpc_id = net.existing_vpc_id
            self.subnet_ids = {az: net.existing_subnets[az] for az in net.availability_zones}
            self.internet_egress = True  # the VPC's own routing decides; we cannot see it
        else:
            self.internet_egress = net.nat_gateway
            self._create_vpc()
        self.groups = {group.name: self._group_network(group) for group in spec.node_groups}
        self.register_outputs({"vpc_id": self.vpc_id, "subnet_ids": self.subnet_ids})

    def _tags(self, name: str) -> dict[str, str]:
        return {**self._spec.tags, "Name": name}

    def _create_vpc(self) -> None:
        spec, name, child = self._spec, self._name, self._child
        cidr = spec.network.vpc_cidr
        assert cidr is not None  # the spec requires vpc_cidr or existing_vpc_id
        zones = spec.network.availability_zones
        plan = plan_subnets(cidr, zones)
        label = spec.cluster.name
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=cidr, enable_dns_support=True,
                          enable_dns_hostnames=True,  # interface endpoints' private DNS needs both
                          tags=self._tags(label), opts=child)
        self.vpc_id = vpc.id
        # Take over the VPC's default security group with no rules, so nothing can use it.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id,
                                     tags=self._tags(f"{label}-default-unused"), opts=child)
        private_rt = aws.ec2.RouteTable(f"{name}-private-rt", vpc_id=vpc.id,
                                        tags=self._tags(f"{label}-private"), opts=child)
        self.subnet_ids = {}
        for az, block in plan.private.items():
            subnet = aws.ec2.Subnet(f"{name}-private-{az}", vpc_id=vpc.id, cidr_block=block,
                                    availability_zone=az, map_public_ip_on_launch=False,
                                    tags=self._tags(f"{label}-private-{az}"), opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=subnet.id,
                                          route_table_id=private_rt.id, opts=child)
            self.subnet_ids[az] = subnet.id
        s3 = aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{spec.region}.s3",
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
        services = SSM_ENDPOINTS + (() if self.internet_egress else NO_NAT_ENDPOINTS)
        for service in services:
            aws.ec2.VpcEndpoint(f"{name}-{service}", vpc_id=vpc.id,
                                service_name=f"com.amazonaws.{spec.region}.{service}",
                                vpc_endpoint_type="Interface", private_dns_enabled=True,
                                subnet_ids=list(self.subnet_ids.values()),
                                security_group_ids=[endpoint_sg.id],
                                tags=self._tags(f"{label}-{service}"), opts=child)
        if self.internet_egress:
            self._create_nat(vpc, plan.public, zones[0], private_rt)

    def _create_nat(self, vpc: aws.ec2.Vpc, public_cidr: str, zone: str,
                    private_rt: aws.ec2.RouteTable) -> None:
        name, child, label = self._name, self._child, self._spec.cluster.name
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

    def _group_network(self, group: NodeGroupConfig) -> GroupNetwork:
        spec, child = self._spec, self._child
        name = f"{self._name}-{group.name}"
        label = f"{spec.cluster.name}-{group.name}"
        # Declared without inline rules: the provider removes AWS's default allow-all egress
        # (pulumi-aws ec2.SecurityGroup docs), so only the rule resources below apply.
        sg = aws.ec2.SecurityGroup(f"{name}-nodes", vpc_id=self.vpc_id,
                                   description=f"gpucluster {label} GPU nodes (no inbound from outside "
                                               "the group; access through SSM)",
                                   tags=self._tags(f"{label}-nodes"), opts=child)
        if group.efa_enabled:
            # EC2 user guide, "Get started with EFA": all traffic in AND out to the group itself.
            aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in", security_group_id=sg.id,
                                             referenced_security_group_id=sg.id, ip_protocol="-1",
                                             description="EFA: all traffic from the group itself",
                                             tags=self._tags(f"{label}-efa-in"), opts=child)
            aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out", security_group_id=sg.id,
                                            referenced_security_group_id=sg.id, ip_protocol="-1",
                                            description="EFA: all traffic to the group itself",
                                            tags=self._tags(f"{label}-efa-out"), opts=child)
        for rule, target, port, why in self._egress_targets():
            aws.vpc.SecurityGroupEgressRule(f"{name}-egress-{rule}", security_group_id=sg.id,
                                            ip_protocol="tcp", from_port=port, to_port=port,
                                            description=why, tags=self._tags(f"{label}-egress-{rule}"),
                                            opts=child, **target)
        placement = None
        if group.uses_placement_group:
            placement = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster",
                                               tags=self._tags(f"{label}-cluster"), opts=child)
        subnets = [self.subnet_ids[az] for az in spec.azs_of(group)]
        return GroupNetwork(subnet_ids=subnets, security_group=sg, placement_group=placement)

    def _egress_targets(self) -> list[tuple[str, Mapping[str, pulumi.Input[str]], int, str]]:
        """Outbound rules of node groups: only what SSM, S3, CloudWatch and packages need.

        DNS, NTP and IMDS need none: security groups do not filter traffic to the Amazon
        DNS server, Time Sync or instance metadata (VPC user guide, "Security group rules").
        """
        if self.internet_egress:
            return [("https", {"cidr_ipv4": ANYWHERE}, 443, "HTTPS: SSM, S3, CloudWatch, package installs"),
                    ("http", {"cidr_ipv4": ANYWHERE}, 80, "HTTP: Ubuntu package mirrors (signed packages)")]
        cidr = self._spec.network.vpc_cidr
        assert cidr is not None and self.s3_prefix_list_id is not None
        return [("endpoints", {"cidr_ipv4": cidr}, 443, "HTTPS to the VPC interface endpoints"),
                ("s3", {"prefix_list_id": self.s3_prefix_list_id}, 443, "HTTPS to S3 (gateway endpoint)")]
