"""Each component on its own with typed Args: an existing VPC, external ASGs, args checks, schema, aliases."""

from __future__ import annotations

import ast
import copy
import inspect
import json
from collections.abc import Callable
from typing import Any, get_type_hints, is_typeddict

import boto3
import pulumi
import pytest
from moto import mock_aws
from pulumi.provider.experimental.analyzer import Analyzer, PropertyType

from base_config import BASE_CONFIG
from gpucluster import COMPONENTS
from gpucluster.aws import args as component_args
from gpucluster.aws.args import ArgsError
from gpucluster.aws.cluster import GpuCluster
from gpucluster.aws.guardrails import Guardrails, GuardrailsArgs
from gpucluster.aws.network import ClusterNetwork
from gpucluster.aws.nodes import GpuNodeGroup, GpuNodeGroupArgs
from gpucluster.aws.settings import (
    SETTINGS_MODELS,
    CapacitySettings,
    CostTagSettings,
    FsxSettings,
    MigSettings,
)
from gpucluster.fleet import awsapi, nodegroups, runtime
from gpucluster.fleet.tags import STOPPED_BY_TAG
from gpucluster.lambdas import budget_action
from gpucluster.names import autoname
from gpucluster.plan import MOCK_ACCOUNT, PlannedResource, RecordingMonitor, record_resources, run_plan
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import CapacityConfig, CostTags, FsxConfig, MigConfig, SpecError, StackSpec, field_docs
from gpucluster.stack import cluster_args

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
ASG_TAG = "aws:autoscaling/tag:Tag"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
FUNCTION = "aws:lambda/function:Function"

SUBNET = "subnet-0aaaaaaaaaaaaaaaa"
SUBNET_B = "subnet-0bbbbbbbbbbbbbbbb"
NODES_SG = "sg-0123456789abcdef0"
PROFILE = f"arn:aws:iam::{MOCK_ACCOUNT}:instance-profile/team-a-gpu"
IDENTITY = "team-a-research"


def one(resources: list[PlannedResource], type_token: str) -> PlannedResource:
    found = [r for r in resources if r.type == type_token]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def node_group_args(**override: Any) -> GpuNodeGroupArgs:
    """An EFA group of p4d nodes in someone else's VPC: their subnet, security group and profile."""
    args: dict[str, Any] = {
        "node_group": {"name": "train", "instance_types": ["p4d.24xlarge"], "desired_nodes": 2,
                       "max_nodes": 4, "efa": "on", "capacity": {"on_demand_base": 2, "spot_percent": 50}},
        "cluster_name": "research", "region": "us-east-1", "identity": IDENTITY,
        "subnet_ids": [SUBNET], "security_group_ids": [NODES_SG], "placement_group_name": "team-a-train-pg",
        "instance_profile_arn": PROFILE, "node_role_name": "team-a-train-node-role",
        "tags": {"owner": "team-a", "cost_center": "cc-7"},
    }
    return {**args, **override}  # type: ignore[return-value]


def build(make: Callable[[], Any], export: Callable[[Any], dict[str, Any]] | None = None,
          ) -> tuple[list[PlannedResource], dict[str, Any]]:
    """Run `make` under the recording mock engine, exporting `export(component)`."""

    def program() -> None:
        component = make()
        for key, value in (export(component) if export else {}).items():
            pulumi.export(key, value)

    return record_resources(program, stack="ext", region="us-east-1")


# ------------------------------------------------------------ GpuNodeGroup in an existing VPC


@pytest.fixture(scope="module")
def existing_vpc_group() -> tuple[list[PlannedResource], dict[str, Any]]:
    return build(lambda: GpuNodeGroup("team-a-train", node_group_args()),
                 lambda g: {"asg_name": g.asg_name, "asg_arn": g.asg_arn, "lt": g.launch_template_id})


def test_node_group_drops_into_an_existing_vpc_without_a_network(existing_vpc_group: Any) -> None:
    resources, outputs = existing_vpc_group
    assert sorted(r.type for r in resources) == [
        ASG, "aws:autoscaling/lifecycleHook:LifecycleHook", LT, "aws:iam/rolePolicy:RolePolicy",
        "gpucluster:index:GpuNodeGroup", "pulumi:providers:aws"]
    # the hook and the health policy on the caller's role; the group's own provider (stop-state tags)
    asg = one(resources, ASG).inputs
    assert asg["vpcZoneIdentifiers"] == [SUBNET]
    assert asg["placementGroup"] == "team-a-train-pg"
    assert asg["mixedInstancesPolicy"]["instancesDistribution"]["onDemandBaseCapacity"] == 2
    lt = one(resources, LT).inputs
    assert lt["iamInstanceProfile"] == {"arn": PROFILE}
    nics = lt["networkInterfaces"]
    assert [n["interfaceType"] for n in nics] == ["efa", "efa-only", "efa-only", "efa-only"]
    assert all(n["securityGroups"] == [NODES_SG] for n in nics)
    assert outputs == {"asg_name": autoname("team-a-train-asg"),
                       "asg_arn": f"arn:aws:autoscaling:us-east-1:{MOCK_ACCOUNT}:team-a-train-asg",
                       "lt": "team-a-train-lt-id"}


def test_node_group_tags_carry_the_identity_the_guardrails_select_by(existing_vpc_group: Any) -> None:
    resources, _ = existing_vpc_group
    expected = {"owner": "team-a", "cost_center": "cc-7", "gpucluster:stack": IDENTITY,
                "gpucluster:cluster": "research", "gpucluster:node-group": "train", "Name": "research-train"}
    asg_tags = one(resources, ASG).inputs["tags"]
    assert {t["key"]: t["value"] for t in asg_tags} == expected
    assert all(t["propagateAtLaunch"] for t in asg_tags)
    lt = one(resources, LT).inputs
    assert all(spec["tags"] == expected for spec in lt["tagSpecifications"])
    import base64
    import gzip
    script = gzip.decompress(base64.b64decode(lt["userData"])).decode()
    assert f"GPUCLUSTER_STACK={IDENTITY}" in script and "GPUCLUSTER_CLUSTER=research" in script


def test_node_group_takes_ids_that_are_outputs_of_other_resources() -> None:
    def make() -> GpuNodeGroup:
        subnets = pulumi.Output.from_input([SUBNET, SUBNET_B])
        return GpuNodeGroup("serve", node_group_args(
            node_group={"name": "serve", "instance_types": ["g5.xlarge"], "max_nodes": 2},
            subnet_ids=subnets, security_group_ids=pulumi.Output.from_input([NODES_SG]),
            placement_group_name=None, instance_profile_arn=pulumi.Output.from_input(PROFILE)))

    resources, _ = build(make)
    asg = one(resources, ASG).inputs
    assert asg["vpcZoneIdentifiers"] == [SUBNET, SUBNET_B] and "placementGroup" not in asg
    assert one(resources, LT).inputs["networkInterfaces"][0]["securityGroups"] == [NODES_SG]


# -------------------------------------------------------------------------- args checks


def registered_before_failing(make: Callable[[], Any]) -> tuple[list[PlannedResource], ArgsError]:
    """What `make` registered before raising ArgsError (nothing, when args are checked first)."""
    caught: list[ArgsError] = []

    def program() -> None:
        with pytest.raises(ArgsError) as info:
            make()
        caught.append(info.value)

    resources, _ = record_resources(program, stack="ext")
    return resources, caught[0]


def test_bad_node_group_args_fail_with_the_stack_files_message_before_any_resource() -> None:
    group = node_group_args()["node_group"]
    bad = {**group, "capacity": {"on_demand_base": 2, "spot_percent": 150}}
    resources, error = registered_before_failing(
        lambda: GpuNodeGroup("team-a-train", node_group_args(node_group=bad)))
    assert resources == []
    assert str(error) == ("GpuNodeGroup team-a-train: node_group.capacity.spot_percent: "
                          "must be 0..100, got 150")
    assert isinstance(error, SpecError) and error.findings[0].path == "node_group.capacity.spot_percent"
    # The stack file says the same of the same value.
    config = copy.deepcopy(BASE_CONFIG)
    config["gpucluster:node_groups"] = [bad]
    with pytest.raises(SpecError) as stack_file:
        parse_stack_config(config, stack="t")
    assert [f.message for f in stack_file.value.findings] == [f.message for f in error.findings]


@pytest.mark.parametrize(("override", "lines"), [
    ({"subnet_ids": [SUBNET, SUBNET_B]},  # EFA: one subnet
     ["subnet_ids: EFA needs exactly one availability zone and subnet (cluster placement group); got 2"]),
    ({"node_group": {"name": "train", "instance_types": ["p4d.24xlarge"], "max_node": 4}},
     ["node_group.max_nodes: required key is missing",
      "node_group.max_node: unknown key; did you mean 'max_nodes'?"]),
    ({"node_group": {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 2, "min_nodes": 3,
                     "capacity": {"market": "capacity_block", "spot_percent": 10}}},
     ["node_group: need min_nodes <= desired_nodes <= max_nodes, got 3 <= 0 <= 2",
      "node_group.capacity.capacity_reservation_id: a capacity block needs its reservation id (cr-...)",
      "node_group.capacity.spot_percent: capacity blocks have no spot share; must be 0, got 10",
      "placement_group_name: a Capacity Block's instances are already placed together in an EC2 "
      "UltraCluster; it takes no placement group (AWS ParallelCluster rejects one too); leave it out"]),
    ({"security_group_ids": ["default"], "identity": "", "tags": {"aws:owner": "x"}},
     ["identity: must be 1-256 characters of letters, digits, spaces and _ . : / = + - @, got ''",
      "security_group_ids: must be a security group id like sg-0abc12345def67890, got 'default'",
      "tags.aws:owner: tag key 'aws:owner' is reserved: keys under aws: and gpucluster: are set by AWS and "
      "gpucluster only"]),
    # A forged stop state would make the start schedule scale the group to whatever it says.
    ({"tags": {"gpucluster:stopped-by": "schedule", "gpucluster:previous-desired": "2000"}},
     [f"tags.gpucluster:{key}: tag key 'gpucluster:{key}' is reserved: keys under aws: and gpucluster: "
      "are set by AWS and gpucluster only" for key in ("stopped-by", "previous-desired")]),
])
def test_node_group_args_checks_list_every_problem_by_key_path(override: dict[str, Any],
                                                                lines: list[str]) -> None:
    with pytest.raises(ArgsError) as info:
        GpuNodeGroup("team-a-train", node_group_args(**override))
    expected = sorted(f"GpuNodeGroup team-a-train: {line}" for line in lines)
    assert sorted(str(info.value).splitlines()) == expected
    # Under `pulumi up` a RunError stops the program with its message and no Python traceback.
    assert isinstance(info.value, pulumi.RunError)


def test_bad_cluster_args_fail_like_the_stack_file() -> None:
    config = copy.deepcopy(BASE_CONFIG)
    args = cluster_args(parse_stack_config(config, stack="t"))
    args["node_groups"][0]["max_nodes"] = 0
    args["budget"] = {"monthly_limit_usd": 100, "alert_thresholds_percent": [80, 50]}
    resources, error = registered_before_failing(lambda: GpuCluster("c", args))
    assert resources == []
    assert str(error).splitlines() == [
        "GpuCluster c: node_groups[0].max_nodes: must be 1..2000, got 0"]
    args["node_groups"][0]["max_nodes"] = 2
    with pytest.raises(ArgsError) as info:
        GpuCluster("c", args)
    assert str(info.value) == ("GpuCluster c: budget.alert_thresholds_percent: must be strictly ascending, "
                               "got 80, 50")


def test_cluster_from_a_programs_own_args_takes_the_current_stack_as_identity() -> None:
    """GpuClusterArgs written in a program (no stack file): `stack` defaults to the Pulumi stack."""
    args = {"cluster": {"name": "lab", "tags": {"owner": "ml", "cost_center": "cc-1", "environment": "dev"}},
            "network": {"availability_zones": ["us-east-1a"], "vpc_cidr": "10.8.0.0/16",
                        "nat_gateway": False},
            "node_groups": [{"name": "gpu", "instance_types": ["g5.xlarge"], "max_nodes": 1}],
            "notifications": {"emails": ["ml@example.com"]}, "region": "us-east-1"}
    resources, outputs = build(lambda: GpuCluster("lab", args),  # type: ignore[arg-type]
                               lambda c: {"groups": c.node_groups, "vpc": c.vpc_id})
    asg_tags = {t["key"]: t["value"] for t in one(resources, ASG).inputs["tags"]}
    # the mock engine runs in no organization: a self-managed backend's name stands in
    assert asg_tags["gpucluster:stack"] == "organization/gpucluster/ext/lab"
    assert asg_tags["gpucluster:cluster"] == "lab"
    assert outputs["groups"]["gpu"]["asg_name"] == autoname("lab-gpu-asg")
    assert outputs["vpc"] == "lab-network-vpc-id"
    assert [r for r in resources if r.type == "aws:ec2/natGateway:NatGateway"] == []


def test_guardrails_args_are_checked_with_the_stack_files_rules() -> None:
    with pytest.raises(ArgsError) as info:
        Guardrails("g", external_guardrails_args(
            autostop={"start_schedule": "cron(0 8 ? * MON-FRI *)"},
            groups=[{**EXTERNAL, "asg_arn": "eks-gpu-nodes"}, {**EXTERNAL, "can_run_spot": False}]))
    assert str(info.value).splitlines() == [
        "Guardrails g: groups[0].asg_arn: must be an Auto Scaling group ARN (arn:aws:autoscaling:<region>:"
        "<account>:autoScalingGroup:<id>:autoScalingGroupName/<name>), got 'eks-gpu-nodes'"]
    with pytest.raises(ArgsError) as info:
        Guardrails("g", external_guardrails_args(
            autostop={"start_schedule": "cron(0 8 ? * MON-FRI *)"}, groups=[EXTERNAL, EXTERNAL]))
    assert str(info.value).splitlines() == [
        "Guardrails g: groups[1].name: duplicate group name 'eks-gpu'",
        "Guardrails g: autostop.start_schedule: needs a stop_schedule to undo"]


def test_component_tags_never_set_reserved_keys() -> None:
    """Only the identity pair passes (how network, datasets and IAM receive it); owners override it."""
    with pytest.raises(ArgsError) as info:
        Guardrails("g", external_guardrails_args(tags={"gpucluster:previous-min": "4"}))
    assert str(info.value).startswith("Guardrails g: tags.gpucluster:previous-min: tag key "
                                      "'gpucluster:previous-min' is reserved")
    with pytest.raises(ArgsError) as info:
        ClusterNetwork("n", {"cluster_name": "lab", "region": "us-east-1", "vpc_cidr": "10.8.0.0/16",
                             "availability_zones": ["us-east-1a"], "tags": {"gpucluster:node-group": "x"}})
    assert "tags.gpucluster:node-group: tag key 'gpucluster:node-group' is reserved" in str(info.value)
    resources, _ = build(lambda: GpuNodeGroup("team-a-train", node_group_args(
        tags={"gpucluster:stack": "someone-else", "gpucluster:cluster": "x"})))
    asg_tags = {t["key"]: t["value"] for t in one(resources, ASG).inputs["tags"]}
    assert (asg_tags["gpucluster:stack"], asg_tags["gpucluster:cluster"]) == (IDENTITY, "research")


# ------------------------------------------------------- Guardrails on an ASG not ours

EKS_ASG = "eks-gpu-nodes-6ec4b1c2"
EXTERNAL = {"name": "eks-gpu", "asg_name": EKS_ASG, "can_run_spot": True,
            "asg_arn": f"arn:aws:autoscaling:us-east-1:{MOCK_ACCOUNT}:autoScalingGroup:"
                       f"0c9e4b0e-5d6f-4c8b-9d1a-2f3e4a5b6c7d:autoScalingGroupName/{EKS_ASG}"}


def external_guardrails_args(**override: Any) -> GuardrailsArgs:
    args: dict[str, Any] = {
        "groups": [EXTERNAL], "cluster_name": "team-a-eks", "identity": "team-a-eks-prod",
        "region": "us-east-1", "tags": {"owner": "team-a"},
        "budget": {"monthly_limit_usd": 5000, "action_threshold_percent": 100},
        "autostop": {"idle_minutes": 30, "pre_stop_command": "/opt/hooks/checkpoint.sh"},
        "spot": {"interruption_command": "/opt/hooks/checkpoint.sh"}, "tag_groups": True,
    }
    return {**args, **override}  # type: ignore[return-value]


@pytest.fixture(scope="module")
def external() -> list[PlannedResource]:
    return build(lambda: Guardrails("team-a-guardrails", external_guardrails_args()))[0]


def policy_of(resources: list[PlannedResource], function_name: str) -> list[dict[str, Any]]:
    fn = next(r for r in resources if r.type == FUNCTION and r.inputs["name"] == function_name)
    policy = next(r for r in resources if r.type == ROLE_POLICY
                  and r.name == fn.name.removesuffix("-function") + "-policy")
    return json.loads(policy.inputs["policy"])["Statement"]


def test_guardrails_tag_an_external_group_with_their_identity(external: list[PlannedResource]) -> None:
    tag = one(external, ASG_TAG)
    assert tag.inputs == {"autoscalingGroupName": EKS_ASG, "tag": {
        "key": "gpucluster:stack", "value": "team-a-eks-prod", "propagateAtLaunch": True}}
    assert not [r for r in external if r.type in (ASG, LT)], "the group itself is never built or changed"


def test_guardrail_roles_act_only_on_the_external_group_while_it_carries_the_tag(
        external: list[PlannedResource]) -> None:
    owned = {"StringEquals": {"autoscaling:ResourceTag/gpucluster:stack": "team-a-eks-prod"}}
    for function in ("team-a-eks-budget-action", "team-a-eks-autostop"):
        statements = {s["Sid"]: s for s in policy_of(external, function)}
        scale = statements["ScaleThisStacksGroups"]
        assert scale["Resource"] == [EXTERNAL["asg_arn"]] and scale["Condition"] == owned
        assert statements["TagStopState"]["Resource"] == [EXTERNAL["asg_arn"]]
    for function in ("team-a-eks-autostop", "team-a-eks-spot-interruption"):
        instances = {s["Sid"]: s for s in policy_of(external, function)}["OnThisStacksInstances"]
        assert instances["Condition"] == {
            "StringEquals": {"ssm:resourceTag/gpucluster:stack": "team-a-eks-prod"}}
    functions = [r.inputs for r in external if r.type == FUNCTION]
    assert {f["environment"]["variables"]["GPUCLUSTER_STACK"] for f in functions} == {"team-a-eks-prod"}
    [alarm] = [r.inputs for r in external
               if r.type == "aws:cloudwatch/metricAlarm:MetricAlarm" and "autostop-idle-" in r.name
               and "no-jobs" not in r.name]
    assert alarm["dimensions"] == {"AutoScalingGroupName": EKS_ASG} and alarm["name"] == f"{EKS_ASG}-gpu-idle"
    # The idle alarm the Lambda acts on is the composite, named after the group.
    composite = one(external, "aws:cloudwatch/compositeAlarm:CompositeAlarm").inputs
    assert composite["alarmName"] == f"{EKS_ASG}-idle"
    budget = one(external, "aws:budgets/budget:Budget").inputs
    assert budget["costFilters"] == [
        {"name": "TagKeyValue", "values": ["user:gpucluster:stack$team-a-eks-prod"]}]


def test_groups_gpucluster_built_are_not_tagged_again() -> None:
    resources, _ = build(lambda: Guardrails("g", external_guardrails_args(tag_groups=False)))
    assert [r for r in resources if r.type == ASG_TAG] == []


def test_budget_lambda_stops_the_external_group_once_the_tag_resource_is_applied(
        external: list[PlannedResource], monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on moto: the planned Tag, applied as the provider applies it, makes the Lambda act."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NOTIFY_TOPIC_ARN", raising=False)
    environment = next(r for r in external if r.type == FUNCTION
                       and r.inputs["handler"] == "lambdas.budget_action.handler").inputs["environment"]
    monkeypatch.setenv("GPUCLUSTER_STACK", environment["variables"]["GPUCLUSTER_STACK"])
    breach = {"Records": [{"EventSource": "aws:sns", "Sns": {"Type": "Notification", "Message": "breach"}}]}
    with mock_aws():
        monkeypatch.setattr(runtime.RUNTIME, "client", lambda service: boto3.client(service))
        monkeypatch.setattr(runtime.RUNTIME, "sleep", lambda seconds: None)  # moto settles at once
        autoscaling = boto3.client("autoscaling")
        boto3.client("ec2").create_launch_template(
            LaunchTemplateName="eks-gpu", LaunchTemplateData={"ImageId": "ami-12c6146b"})
        autoscaling.create_auto_scaling_group(  # made by EKS: no gpucluster tag
            AutoScalingGroupName=EKS_ASG, MinSize=1, DesiredCapacity=2, MaxSize=4,
            LaunchTemplate={"LaunchTemplateName": "eks-gpu", "Version": "$Latest"},
            AvailabilityZones=["us-east-1a"], Tags=[{"Key": "eks:nodegroup-name", "Value": "gpu",
                                                     "ResourceId": EKS_ASG,
                                                     "ResourceType": "auto-scaling-group"}])
        assert budget_action.handler(breach, None)["groups"] == []  # untagged: left alone

        tag = one(external, ASG_TAG).inputs  # what aws.autoscaling.Tag does: CreateOrUpdateTags
        autoscaling.create_or_update_tags(Tags=[{
            "ResourceId": tag["autoscalingGroupName"], "ResourceType": "auto-scaling-group",
            "Key": tag["tag"]["key"], "Value": tag["tag"]["value"],
            "PropagateAtLaunch": tag["tag"]["propagateAtLaunch"]}])
        result = budget_action.handler(breach, None)
        assert result["groups"] == [EKS_ASG]
        [group] = autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[EKS_ASG])["AutoScalingGroups"]
        assert (group["MinSize"], group["DesiredCapacity"]) == (0, 0)
        assert awsapi.group_tags(group)[STOPPED_BY_TAG] == nodegroups.BUDGET


# ------------------------------------------------------------------------------- schema

# Outputs of every component, exactly: anything more is a Python attribute leaking into the schema.
OUTPUTS = {
    "ClusterNetwork": {"vpcId", "subnetIds", "securityGroupIds", "placementGroupNames"},
    "GpuNodeGroup": {"asgName", "asgArn", "launchTemplateId", "launchTemplateVersion"},
    "NodeIdentity": {"roleName", "roleArn", "instanceProfileName", "instanceProfileArn"},
    "DatasetBucket": {"bucketName", "bucketArn"},
    "LustreFileSystem": {"fileSystemId", "dnsName", "mountName", "securityGroupId"},
    "Guardrails": {"notifyTopicArn", "budgetName", "budgetActionTopicArn", "functionNames", "idleAlarmNames",
                   "scheduleNames"},
    "ClusterDashboard": {"dashboardName", "dashboardUrl", "stuckAlarmNames"},
    "NodeScripts": {"bucketName", "bucketArn", "bucketOwner", "bundleKey", "bundleSha256"},
    "GpuCluster": {"clusterName", "region", "vpcId", "subnetIds", "nodeGroups", "datasets", "notifyTopicArn",
                   "budgetName", "budgetActionTopicArn", "functionNames", "idleAlarmNames", "scheduleNames",
                   "dashboardName", "dashboardUrl", "stuckAlarmNames", "pcsClusterId",
                   "eksClusterName"},
}
# Required inputs of every component (the rest are optional).
REQUIRED = {
    "ClusterNetwork": {"clusterName", "region", "availabilityZones"},
    "GpuNodeGroup": {"nodeGroup", "clusterName", "region", "identity", "subnetIds", "securityGroupIds",
                     "instanceProfileArn"},
    "NodeIdentity": {"clusterName"},
    "DatasetBucket": {"dataset", "clusterName", "region"},
    "LustreFileSystem": {"dataset", "bucketName", "vpcId", "subnetId"},
    "Guardrails": {"groups", "clusterName", "identity", "region"},
    "ClusterDashboard": {"clusterName", "identity", "region", "groups"},
    "NodeScripts": {"clusterName", "identity", "region"},
    "GpuCluster": {"cluster", "network", "nodeGroups", "region"},
}


@pytest.fixture(scope="module")
def schema() -> Any:
    import gpucluster
    return Analyzer("gpucluster").analyze([getattr(gpucluster, name) for name in COMPONENTS])


def test_schema_has_every_component_with_described_inputs_and_outputs(schema: Any) -> None:
    components = schema["component_definitions"]
    assert set(components) == set(OUTPUTS) == set(COMPONENTS)
    for name, component in components.items():
        assert set(component.outputs) == OUTPUTS[name], name
        assert {k for k, p in component.inputs.items() if not p.optional} == REQUIRED[name], name
        assert component.description, name
        for prop_name, prop in [*component.inputs.items(), *component.outputs.items()]:
            assert prop.description, f"{name}.{prop_name} has no description"
            assert prop.type is not None or prop.ref, f"{name}.{prop_name} has no type"


def test_schema_types_of_the_drop_in_components(schema: Any) -> None:
    nodes = schema["component_definitions"]["GpuNodeGroup"]
    assert nodes.inputs["nodeGroup"].ref == "#/types/gpucluster:index:NodeGroupSettings"
    assert nodes.inputs["nodeGroup"].plain  # drives the group's structure: a plain value
    subnets = nodes.inputs["subnetIds"]
    assert subnets.type == PropertyType.ARRAY and subnets.items.type == PropertyType.STRING
    assert not subnets.plain  # an Input: another resource's output fits
    assert nodes.inputs["instanceProfileArn"].type == PropertyType.STRING and not nodes.inputs[
        "instanceProfileArn"].plain
    # No Auto Scaling group on a Slurm stack (AWS PCS launches the nodes): its name and ARN are optional.
    assert {k: (p.type, p.optional) for k, p in nodes.outputs.items()} == {
        "asgName": (PropertyType.STRING, True), "asgArn": (PropertyType.STRING, True),
        "launchTemplateId": (PropertyType.STRING, False),
        "launchTemplateVersion": (PropertyType.INTEGER, False)}
    guard = schema["component_definitions"]["Guardrails"]
    assert guard.inputs["groups"].items.ref == "#/types/gpucluster:index:GuardedGroup"
    assert guard.inputs["tagGroups"].type == PropertyType.BOOLEAN
    assert all(p.optional for p in guard.outputs.values())  # parts not asked for are not built
    network = schema["component_definitions"]["ClusterNetwork"]
    assert network.outputs["subnetIds"].type == PropertyType.OBJECT
    assert network.outputs["subnetIds"].additional_properties.type == PropertyType.STRING
    cluster = schema["component_definitions"]["GpuCluster"]
    summary = cluster.outputs["nodeGroups"].additional_properties
    assert summary.ref == "#/types/gpucluster:index:NodeGroupSummary"
    types = schema["type_definitions"]
    assert {k: (p.type, p.optional) for k, p in types["GuardedGroup"].properties.items()} == {
        "name": (PropertyType.STRING, False), "asgName": (PropertyType.STRING, False),
        "asgArn": (PropertyType.STRING, False), "canRunSpot": (PropertyType.BOOLEAN, False),
        "capacityBlockReservationId": (PropertyType.STRING, True)}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@pytest.mark.parametrize("settings", [*SETTINGS_MODELS, CostTagSettings, CapacitySettings, FsxSettings,
                                      MigSettings], ids=lambda t: t.__name__)
def test_settings_types_spell_the_stack_file_key_for_key_with_its_descriptions(schema: Any,
                                                                               settings: type) -> None:
    model = {CostTagSettings: CostTags, CapacitySettings: CapacityConfig, FsxSettings: FsxConfig,
             MigSettings: MigConfig, **SETTINGS_MODELS}[settings]
    typed = schema["type_definitions"][settings.__name__]
    assert set(typed.properties) == {camel(k) for k in model.model_fields}
    docs = field_docs(model)
    for key, field in model.model_fields.items():
        prop = typed.properties[camel(key)]
        assert prop.description == docs.get(key), key
        assert prop.optional is not field.is_required(), key


@pytest.mark.parametrize("component", COMPONENTS)
def test_args_type_and_its_checking_model_have_the_same_keys(component: str) -> None:
    import gpucluster
    args_type = get_type_hints(getattr(gpucluster, component).__init__)["args"]
    assert is_typeddict(args_type)
    if component == "GpuCluster":  # checked as a stack file: the StackSpec model itself
        model_fields = {"cluster", "network", "node_groups", "datasets", "budget", "notifications",
                        "autostop", "spot", "scheduler",
                        "observability", "images", "stack", "region", "project", "organization"}
        assert set(args_type.__annotations__) == model_fields == set(StackSpec.model_fields)
        return
    model = getattr(component_args, f"{component}Model")
    assert set(args_type.__annotations__) == set(model.model_fields)
    assert args_type.__required_keys__ == {k for k, f in model.model_fields.items() if f.is_required()}


def test_python_only_attributes_stay_out_of_the_class_annotations() -> None:
    """The analyzer takes every public class-level annotation of a component as an output."""
    import gpucluster
    for name in COMPONENTS:
        source = ast.parse(inspect.getsource(getattr(gpucluster, name)))
        cls = source.body[0]
        assert isinstance(cls, ast.ClassDef)
        annotated = {n.target.id for n in cls.body
                     if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        assert {camel(a) for a in annotated} == OUTPUTS[name], name


# ------------------------------------------------------------------------------ aliases

# The type tokens before the component package (0.1): existing stacks' URNs are built from them.
OLD_TOKENS = {
    "GpuCluster": "gpucluster:cluster:GpuCluster",
    "ClusterNetwork": "gpucluster:network:ClusterNetwork",
    "GpuNodeGroup": "gpucluster:nodes:GpuNodeGroup",
    "NodeIdentity": "gpucluster:iam:NodeIdentity",
    "DatasetStore": "gpucluster:datasets:DatasetStore",
    "DatasetBucket": "gpucluster:datasets:DatasetBucket",
    "LustreFileSystem": "gpucluster:datasets:LustreFileSystem",
    "Guardrails": "gpucluster:guardrails:Guardrails",
    "Notifications": "gpucluster:guardrails:Notifications",
    "Budget": "gpucluster:guardrails:Budget",
    "AutoStop": "gpucluster:guardrails:AutoStop",
    "SpotInterruption": "gpucluster:guardrails:SpotInterruption",
    "GuardrailFunction": "gpucluster:guardrails:GuardrailFunction",
}


# Components added since: nothing to alias (their resources are created, not taken over).
NEW_COMPONENTS = {"ClusterDashboard", "JobRestart", "GuardState", "GuardrailAlarms", "SpendGuard",
                  "NodeScripts"}


def old_type(token: str) -> str:
    name = token.split(":")[2]
    return OLD_TOKENS[name] if token.startswith("gpucluster:index:") and name not in NEW_COMPONENTS else token


def test_every_component_aliases_its_old_token_so_existing_urns_still_match(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations of the prod stack, run through the engine's alias rules against the old URNs.

    pulumi/pulumi pkg/resource/deploy/step_generator.go `generateAliases`: a resource's
    candidates are its URN, its own aliases, and both re-parented under the old URN its
    parent matched. Every resource, the protected buckets included, must find its old URN.
    """
    seen: list[tuple[str, str, str, list[str], str]] = []  # type, name, parent URN, alias types, URN
    register = RecordingMonitor.RegisterResource

    def recording(self: RecordingMonitor, request: Any) -> Any:
        response = register(self, request)
        aliases = [a.spec.type for a in request.aliases if a.HasField("spec")]
        if request.type != "pulumi:pulumi:Stack":  # the root: real URNs do not name it
            seen.append((request.type, request.name, request.parent, aliases, response.urn))
        return response

    monkeypatch.setattr(RecordingMonitor, "RegisterResource", recording)
    plan = run_plan("prod")
    by_urn = {u: (t, n, p) for t, n, p, _, u in seen}

    def types(urn_: str, mapping: Callable[[str], str]) -> str:
        """The type chain of a registration (the mock engine's URNs name only the parent's type)."""
        if urn_ not in by_urn:  # the root stack's children have no parent type
            return ""
        t, _, parent = by_urn[urn_]
        above = types(parent, mapping)
        return f"{above}${mapping(t)}" if above else mapping(t)

    def urn(chain: str, name: str) -> str:
        return f"urn:pulumi:prod::gpucluster::{chain}::{name}"

    old_state = {urn(types(u, old_type), n) for _, n, _, _, u in seen}
    matched: dict[str, str] = {}  # new mock URN -> the old URN it took over
    for t, n, parent, aliases, u in seen:  # registration order: parents first
        parent_types = types(parent, str)
        candidates = [urn(types(u, str), n),
                      *(urn(f"{parent_types}${a}" if parent_types else a, n) for a in aliases)]
        if parent in matched:
            parent_old = matched[parent].split("::")[2]
            candidates += [urn(f"{parent_old}${child}", n) for child in [t, *aliases]]
        found = [c for c in candidates if c in old_state]
        assert found, f"{t} {n} would be replaced: no old URN among {candidates}"
        matched[u] = found[0]
    component_aliases = {t: aliases for t, _, _, aliases, _ in seen if t.startswith("gpucluster:")}
    assert component_aliases == {f"gpucluster:index:{k}": [v] for k, v in OLD_TOKENS.items()} | {
        f"gpucluster:index:{k}": [] for k in NEW_COMPONENTS}
    bucket = next(r for r in plan.resources if r.type == "aws:s3/bucket:Bucket")
    assert bucket.protect and matched[bucket.urn] == urn(
        "gpucluster:cluster:GpuCluster$gpucluster:datasets:DatasetStore$gpucluster:datasets:DatasetBucket"
        "$aws:s3/bucket:Bucket", bucket.name)


# ------------------------------------------------------------------------- public API


def test_components_and_their_args_are_exported_lazily() -> None:
    """`import gpucluster.spec` (and the stack mapping) must not load Pulumi or pulumi_aws."""
    import subprocess
    import sys
    code = ("import sys, gpucluster, gpucluster.spec, gpucluster.stack\n"
            "assert 'pulumi_aws' not in sys.modules and 'pulumi' not in sys.modules, 'eager import'\n"
            "from gpucluster import GpuNodeGroup, GpuNodeGroupArgs, Guardrails, GuardrailsArgs, ArgsError\n"
            "from gpucluster import NodeGroupSettings, GpuCluster, GpuClusterArgs\n"
            "assert GpuNodeGroupArgs.__required_keys__ >= {'subnet_ids', 'instance_profile_arn'}\n"
            "assert 'pulumi_aws' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    import gpucluster
    for name in COMPONENTS:
        assert {name, f"{name}Args"} <= set(gpucluster.__all__), name
