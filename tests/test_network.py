"""ClusterNetwork under the mock engine: created VPC with or without NAT, or an existing VPC."""

from __future__ import annotations

from typing import Any

import pytest

from base_config import base, plan_config
from gpucluster.plan import Plan, PlannedResource
from shipped import shipped_plan

ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ASG = "aws:autoscaling/group:Group"
NAT_TYPES = ("aws:ec2/natGateway:NatGateway", "aws:ec2/internetGateway:InternetGateway", "aws:ec2/eip:Eip")


def endpoints(plan: Plan) -> dict[str, dict[str, Any]]:
    return {r.inputs["serviceName"].rsplit(".", 1)[1]: r.inputs for r in plan.of_type(ENDPOINT)}


def node_egress(plan: Plan) -> list[dict[str, Any]]:
    return [r.inputs for r in plan.of_type(EGRESS) if not r.inputs.get("referencedSecurityGroupId")]


def one(plan: Plan, type_token: str) -> PlannedResource:
    [found] = plan.of_type(type_token)
    return found


def test_created_vpc_has_private_subnets_endpoints_and_nat() -> None:
    plan = shipped_plan("staging")
    vpc = one(plan, "aws:ec2/vpc:Vpc").inputs
    assert vpc["cidrBlock"] == "10.30.0.0/16" and vpc["enableDnsHostnames"] and vpc["enableDnsSupport"]
    private = {r.inputs["availabilityZone"]: r.inputs["cidrBlock"]
               for r in plan.of_type("aws:ec2/subnet:Subnet") if "-private-" in r.name}
    assert private == {"us-west-2a": "10.30.0.0/19", "us-west-2b": "10.30.32.0/19",
                       "us-west-2c": "10.30.64.0/19"}
    found = endpoints(plan)
    assert set(found) == {"s3", "ssm", "ssmmessages", "ec2messages"}
    assert found["s3"]["vpcEndpointType"] == "Gateway"
    assert found["s3"]["routeTableIds"] == ["gpu-staging-network-private-rt-id"]
    for service in ("ssm", "ssmmessages", "ec2messages"):
        assert found[service]["vpcEndpointType"] == "Interface" and found[service]["privateDnsEnabled"]
        assert len(found[service]["subnetIds"]) == 3
    for token in NAT_TYPES:
        assert len(plan.of_type(token)) == 1, token
    routes = {r.name: r.inputs for r in plan.of_type("aws:ec2/route:Route")}
    assert routes["gpu-staging-network-private-default"]["natGatewayId"] == "gpu-staging-network-nat-id"
    assert routes["gpu-staging-network-public-default"]["gatewayId"] == "gpu-staging-network-igw-id"
    assert {(e["fromPort"], e["cidrIpv4"]) for e in node_egress(plan)} == {
        (443, "0.0.0.0/0"), (80, "0.0.0.0/0")}
    assert one(plan, "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup").inputs.get("ingress") is None


def test_without_nat_there_is_no_internet_path() -> None:
    config = base()
    config["gpucluster:network"]["nat_gateway"] = False
    plan = plan_config(config)
    for token in NAT_TYPES:
        assert plan.of_type(token) == [], token
    assert plan.of_type("aws:ec2/route:Route") == []
    assert set(endpoints(plan)) == {"s3", "ssm", "ssmmessages", "ec2messages", "monitoring", "ec2",
                                    "autoscaling", "sns"}
    egress = node_egress(plan)
    assert all(e.get("cidrIpv4") != "0.0.0.0/0" for e in egress)
    assert {(e["fromPort"], e.get("cidrIpv4"), e.get("prefixListId")) for e in egress} == {
        (443, "10.0.0.0/16", None), (443, None, "pl-63a5400a")}


DIGEST = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
NO_NAT_SERVICES = {"s3", "ssm", "ssmmessages", "ec2messages", "monitoring", "ec2", "autoscaling", "sns"}


def without_nat(*, metrics: bool = False, slurm: bool = False, nat: bool = False) -> dict[str, Any]:
    config = base()
    config["gpucluster:network"]["nat_gateway"] = nat
    if metrics:  # every node remote-writes its GPU metrics to the stack's AMP workspace
        config["gpucluster:observability"] = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}
    if slurm:  # AWS PCS launches the nodes; they register with it
        config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0"}
    return config


@pytest.mark.parametrize(("metrics", "slurm", "extra"), [
    (True, False, {"aps-workspaces"}), (False, True, {"pcs"}), (True, True, {"aps-workspaces", "pcs"})])
def test_without_nat_nodes_reach_amp_and_pcs_through_endpoints_priced_as_planned(
        metrics: bool, slurm: bool, extra: set[str]) -> None:
    """Remote write (AMP) and node registration (PCS's RegisterComputeNodeGroupInstance) without NAT need
    the aps-workspaces and pcs interface endpoints; the cost model prices exactly the planned ones."""
    from gpucluster.preflight import parse_stack_config
    from gpucluster.pricing import interface_endpoints

    config = without_nat(metrics=metrics, slurm=slurm)
    found = endpoints(plan_config(config))
    assert set(found) == NO_NAT_SERVICES | extra
    for service in extra:
        assert found[service]["vpcEndpointType"] == "Interface" and found[service]["privateDnsEnabled"]
        assert found[service]["serviceName"] == f"com.amazonaws.us-east-1.{service}"
    priced = interface_endpoints(parse_stack_config(config, stack="dev"))
    assert set(priced) == set(found) - {"s3"} and len(priced) == len(set(priced))


def test_with_nat_nodes_reach_amp_and_pcs_through_it() -> None:
    found = endpoints(plan_config(without_nat(metrics=True, slurm=True, nat=True)))
    assert set(found) == {"s3", "ssm", "ssmmessages", "ec2messages"}


def test_existing_vpc_is_used_as_is() -> None:
    config = base()
    config["gpucluster:network"] = {
        "availability_zones": ["us-east-1a", "us-east-1b"], "existing_vpc_id": "vpc-0123456789abcdef0",
        "existing_subnets": {"us-east-1a": "subnet-0aaaaaaaaaaaaaaaa",
                             "us-east-1b": "subnet-0bbbbbbbbbbbbbbbb"}}
    plan = plan_config(config)
    created = {r.type for r in plan.resources}
    assert not created & {"aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", ENDPOINT, *NAT_TYPES}
    assert one(plan, "aws:ec2/securityGroup:SecurityGroup").inputs["vpcId"] == "vpc-0123456789abcdef0"
    assert one(plan, ASG).inputs["vpcZoneIdentifiers"] == [
        "subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"]
    assert plan.outputs["vpc_id"] == "vpc-0123456789abcdef0"
    assert plan.outputs["subnet_ids"] == {"us-east-1a": "subnet-0aaaaaaaaaaaaaaaa",
                                          "us-east-1b": "subnet-0bbbbbbbbbbbbbbbb"}


def test_each_group_gets_its_own_security_group() -> None:
    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p4d.24xlarge"], "max_nodes": 4},
        {"name": "serve", "instance_types": ["g5.xlarge"], "max_nodes": 2},
        {"name": "solo", "instance_types": ["g5.xlarge"], "max_nodes": 1}]
    plan = plan_config(config)
    groups = {r.name: r for r in plan.of_type("aws:ec2/securityGroup:SecurityGroup")
              if r.name.endswith("-nodes")}
    assert set(groups) == {"test-network-train-nodes", "test-network-serve-nodes",
                           "test-network-solo-nodes"}
    self_rules = [r.inputs for r in plan.resources if r.inputs.get("referencedSecurityGroupId")]
    # EFA and the non-EFA multi-node group; a single-node group needs no peer
    assert {r["securityGroupId"] for r in self_rules} == {"test-network-train-nodes-id",
                                                          "test-network-serve-nodes-id"}
    asgs = {r.name: r.inputs for r in plan.of_type(ASG)}
    assert asgs["test-train-asg"]["vpcZoneIdentifiers"] == ["test-network-private-us-east-1a-id"]
    assert len(asgs["test-serve-asg"]["vpcZoneIdentifiers"]) == 2
    assert len(plan.of_type("aws:ec2/placementGroup:PlacementGroup")) == 1


INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_multi_node_groups_reach_each_other_and_nothing_else_gets_in(stack: str) -> None:
    """All traffic within each multi-node group, both ways; inbound only from the group itself
    (and, for FSx, the file system's Lustre ports from its own security group)."""
    plan = shipped_plan(stack)
    nodes = {f"{r.name}-id" for r in plan.of_type("aws:ec2/securityGroup:SecurityGroup")
             if r.name.endswith("-nodes")}
    assert len(nodes) == len(plan.spec.node_groups)  # every shipped group can hold more than one node
    for sg in sorted(nodes):
        for token in (INGRESS, EGRESS):
            rules = [r.inputs for r in plan.of_type(token) if r.inputs["securityGroupId"] == sg
                     and r.inputs.get("referencedSecurityGroupId") == sg]
            assert [(r["ipProtocol"], r.get("fromPort"), r.get("cidrIpv4")) for r in rules] == [
                ("-1", None, None)]
        inbound = [r.inputs for r in plan.of_type(INGRESS) if r.inputs["securityGroupId"] == sg]
        for rule in inbound:
            assert "cidrIpv4" not in rule and "cidrIpv6" not in rule and "prefixListId" not in rule
            peer = rule["referencedSecurityGroupId"]
            assert peer == sg or (peer.endswith("-fsx-sg-id") and rule["ipProtocol"] == "tcp"
                                  and rule["fromPort"] in (988, 1018)), rule



FLOW_LOG = "aws:ec2/flowLog:FlowLog"


def test_flow_logs_record_rejected_traffic_by_default_encrypted_and_kept() -> None:
    plan = shipped_plan("staging")
    flow = one(plan, FLOW_LOG).inputs
    assert flow["trafficType"] == "REJECT" and flow["logDestinationType"] == "cloud-watch-logs"
    assert flow["vpcId"] == "gpu-staging-network-vpc-id"
    group = next(r.inputs for r in plan.of_type("aws:cloudwatch/logGroup:LogGroup")
                 if r.name.endswith("-flow-logs"))
    assert group["name"] == "/gpucluster/vpc-flow-logs/gpu-staging"
    assert group["retentionInDays"] == 90 and group["kmsKeyId"]
    import json
    key = next(r.inputs for r in plan.of_type("aws:kms/key:Key") if r.name.endswith("-flow-logs-key"))
    statements = {s["Sid"]: s for s in json.loads(key["policy"])["Statement"]}
    logs = statements["LogsEncryptTheFlowLogGroupOnly"]
    assert logs["Principal"] == {"Service": "logs.us-west-2.amazonaws.com"}
    assert logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"].endswith(
        ":log-group:/gpucluster/vpc-flow-logs/gpu-staging")
    role_policy = next(r.inputs for r in plan.of_type("aws:iam/rolePolicy:RolePolicy")
                       if r.name.endswith("-flow-logs-policy"))
    [statement] = json.loads(role_policy["policy"])["Statement"]
    assert all(res.split(":log-group:")[1].startswith("/gpucluster/vpc-flow-logs/gpu-staging")
               for res in statement["Resource"])
    assert not any("Delete" in a for a in statement["Action"])


def test_flow_logs_can_record_all_traffic_or_be_turned_off() -> None:
    config = base()
    config["gpucluster:network"]["flow_logs"] = "all"
    assert one(plan_config(config), FLOW_LOG).inputs["trafficType"] == "ALL"
    config["gpucluster:network"]["flow_logs"] = "off"
    plan = plan_config(config)
    assert plan.of_type(FLOW_LOG) == []
    assert not [r for r in plan.resources if "flow-logs" in r.name]


def test_an_existing_vpc_gets_flow_logs_too() -> None:
    config = base()
    config["gpucluster:network"] = {
        "availability_zones": ["us-east-1a"], "existing_vpc_id": "vpc-0123456789abcdef0",
        "existing_subnets": {"us-east-1a": "subnet-0aaaaaaaaaaaaaaaa"}}
    assert one(plan_config(config), FLOW_LOG).inputs["vpcId"] == "vpc-0123456789abcdef0"
