"""GPU node groups under the mock engine: NICs, security and placement groups, capacity, safety."""

from __future__ import annotations

import base64
import gzip
import json
from functools import cache
from typing import Any

import pulumi
import pulumi_aws as aws
import pytest
from typer.testing import CliRunner

from base_config import base, plan_config
from gpucluster import plan as plan_module
from gpucluster.aws.args import ArgsError
from gpucluster.aws.cluster import GpuCluster
from gpucluster.aws.nodes import (
    DEFAULT_AMI_PARAMETER,
    STOP_STATE_TAG_PREFIXES,
    GpuNodeGroup,
    instance_overrides,
    instances_distribution,
)
from gpucluster.cli import app
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STATE_TAGS, STOPPED_BY_TAG
from gpucluster.names import autoname
from gpucluster.plan import (
    MOCK_AMI,
    Plan,
    PlanMocks,
    PlannedResource,
    load_stack,
    record_resources,
    run_plan,
)
from gpucluster.policy.offline import check_plan
from gpucluster.spec import SpecError
from gpucluster.stack import cluster_args
from shipped import planned_config, shipped_plan

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PG = "aws:ec2/placementGroup:PlacementGroup"
SUBNET = "aws:ec2/subnet:Subnet"

# type -> (efa setting, expected interfaces: (card, device, type))
TYPES: dict[str, tuple[str, list[tuple[int, int, str]]]] = {
    "p5.48xlarge": ("on", [(0, 0, "efa")] + [(c, 0, "efa-only") for c in range(1, 32)]),
    "p4d.24xlarge": ("on", [(0, 0, "efa"), (1, 0, "efa-only"), (2, 0, "efa-only"), (3, 0, "efa-only")]),
    "g6e.48xlarge": ("on", [(0, 0, "efa"), (1, 0, "efa-only"), (2, 0, "efa-only"), (3, 0, "efa-only")]),
    "g5.xlarge": ("off", [(0, 0, "interface")]),
}


def one(plan: Plan, type_token: str, group: str | None = None) -> PlannedResource:
    """The one resource of a type (of node group `group`'s, in a stack with several groups)."""
    found = [r for r in plan.of_type(type_token) if group is None or f"-{group}-" in r.name]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def group_config(instance_type: str, **group: Any) -> dict[str, Any]:
    config = base()
    efa = TYPES.get(instance_type, ("auto", []))[0]
    config["gpucluster:node_groups"] = [{"name": "train", "instance_types": [instance_type], "min_nodes": 0,
                                         "desired_nodes": 2, "max_nodes": 4, "efa": efa,
                                         "capacity": {"spot_percent": 50}, **group}]
    return config


@cache
def type_plan(instance_type: str) -> Plan:
    return planned_config(group_config(instance_type))


@cache
def stack_plan(stack: str) -> Plan:
    return shipped_plan(stack)


def id_of(resource: PlannedResource) -> str:
    return f"{resource.name}-id"  # what PlanMocks gives every resource


# ------------------------------------------------------------ NICs, SGs, placement


@pytest.mark.parametrize("instance_type", TYPES)
def test_launch_template_interfaces(instance_type: str) -> None:
    plan = type_plan(instance_type)
    nics = one(plan, LT).inputs["networkInterfaces"]
    expected = TYPES[instance_type][1]
    assert [(n["networkCardIndex"], n["deviceIndex"], n["interfaceType"]) for n in nics] == expected
    nodes_sg = next(r for r in plan.of_type(SG) if r.name.endswith("-train-nodes"))
    for nic in nics:
        assert nic["associatePublicIpAddress"] == "false"
        assert nic["securityGroups"] == [id_of(nodes_sg)]
        assert "subnetId" not in nic  # the ASG picks the subnet


@pytest.mark.parametrize("instance_type", TYPES)
def test_self_rules_in_both_directions_on_every_multi_node_group(instance_type: str) -> None:
    """EFA needs them, and so does NCCL over plain ENA: every group of up to 4 nodes has them."""
    plan = type_plan(instance_type)
    nodes_sg = id_of(next(r for r in plan.of_type(SG) if r.name.endswith("-train-nodes")))
    self_rules = {
        kind: [r.inputs for r in plan.of_type(token) if r.inputs.get("referencedSecurityGroupId")]
        for kind, token in (("in", INGRESS), ("out", EGRESS))
    }
    for kind in ("in", "out"):
        assert len(self_rules[kind]) == 1, kind
        rule = self_rules[kind][0]
        assert rule["securityGroupId"] == rule["referencedSecurityGroupId"] == nodes_sg
        assert rule["ipProtocol"] == "-1"


@pytest.mark.parametrize("instance_type", TYPES)
def test_efa_groups_get_one_subnet_and_a_cluster_placement_group(instance_type: str) -> None:
    plan = type_plan(instance_type)
    asg = one(plan, ASG).inputs
    subnets = {r.inputs["availabilityZone"]: id_of(r) for r in plan.of_type(SUBNET)
               if r.name.endswith(("-us-east-1a", "-us-east-1b"))}
    if TYPES[instance_type][0] == "on":
        assert asg["vpcZoneIdentifiers"] == [subnets["us-east-1a"]]
        pg = one(plan, PG)
        assert pg.inputs["strategy"] == "cluster"
        assert asg["placementGroup"] == autoname(pg.name)  # the name AWS gives it, as the mocks do
        assert plan.outputs["node_groups"]["train"]["placement_group_name"] == autoname(pg.name)
    else:
        assert asg["vpcZoneIdentifiers"] == [subnets["us-east-1a"], subnets["us-east-1b"]]
        assert plan.of_type(PG) == [] and "placementGroup" not in asg
        assert plan.outputs["node_groups"]["train"]["placement_group_name"] is None


CAPACITY_BLOCK = {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}
RESERVATION = {"on_demand_base": 4, "capacity_reservation_id": "cr-0aaaabbbbccccdddd"}


@pytest.mark.parametrize(("capacity", "asked", "placed"), [
    (CAPACITY_BLOCK, None, False),  # already placed in an UltraCluster
    (RESERVATION, None, False),     # the reservation sits where it was made
    (RESERVATION, True, True),      # unless the user asks for one
])
def test_reserved_efa_groups_get_a_placement_group_only_when_it_helps(
        capacity: dict[str, Any], asked: bool | None, placed: bool) -> None:
    group: dict[str, Any] = {"min_nodes": 0, "capacity": capacity}
    if asked is not None:
        group["placement_group"] = asked
    plan = planned_config(group_config("p5.48xlarge", **group))
    asg = one(plan, ASG).inputs
    assert len(asg["vpcZoneIdentifiers"]) == 1  # EFA: one subnet all the same
    assert (len(plan.of_type(PG)), "placementGroup" in asg) == ((1, True) if placed else (0, False))
    violations = [v for v in check_plan(plan) if v.policy == "efa-wiring"]
    assert violations == []


def test_capacity_block_with_a_placement_group_is_a_config_error() -> None:
    with pytest.raises(SpecError) as err:
        plan_config(group_config("p5.48xlarge", min_nodes=0, capacity=CAPACITY_BLOCK, placement_group=True))
    assert [(f.path, "already placed together in an EC2 UltraCluster" in f.message)
            for f in err.value.findings] == [("node_groups[0].placement_group", True)]


def test_capacity_block_node_group_args_take_no_placement_group() -> None:
    with pytest.raises(ArgsError) as err:
        GpuNodeGroup("cb", {
            "node_group": {"name": "cb", "instance_types": ["p5.48xlarge"], "max_nodes": 2, "efa": "on",
                           "capacity": CAPACITY_BLOCK},
            "cluster_name": "lab", "region": "us-east-1", "identity": "lab",
            "subnet_ids": ["subnet-0aaaaaaaa"],
            "security_group_ids": ["sg-0123456789abcdef0"], "placement_group_name": "lab-pg",
            "instance_profile_arn": "arn:aws:iam::123456789012:instance-profile/lab"})
    assert str(err.value).startswith("GpuNodeGroup cb: placement_group_name: a Capacity Block's instances")


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_stacks_keep_their_placement(stack: str) -> None:
    plan = stack_plan(stack)
    assert len(plan.of_type(PG)) == (1 if stack == "prod" else 0)
    assert [v for v in check_plan(plan) if v.policy == "efa-wiring"] == []


@pytest.mark.parametrize("plan_name", ["dev", "staging", "prod", *TYPES])
def test_no_ingress_from_anywhere(plan_name: str) -> None:
    plan = stack_plan(plan_name) if plan_name in ("dev", "staging", "prod") else type_plan(plan_name)
    for rule in plan.of_type(INGRESS):
        assert rule.inputs.get("cidrIpv4") != "0.0.0.0/0", rule.name
        assert "cidrIpv6" not in rule.inputs
    for sg in plan.of_type(SG):
        assert not sg.inputs.get("ingress"), sg.name  # no inline rules either


# -------------------------------------------------------------------------- capacity


def test_staging_capacity_split() -> None:
    asg = one(stack_plan("staging"), ASG).inputs
    policy = asg["mixedInstancesPolicy"]
    assert policy["instancesDistribution"] == {
        "onDemandBaseCapacity": 1, "onDemandPercentageAboveBaseCapacity": 30,
        "spotAllocationStrategy": "price-capacity-optimized", "onDemandAllocationStrategy": "prioritized"}
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == [
        "g6e.12xlarge", "g5.12xlarge", "g6.12xlarge"]
    assert policy["launchTemplate"]["launchTemplateSpecification"]["launchTemplateId"] == id_of(
        one(stack_plan("staging"), LT))
    assert (asg["minSize"], asg["maxSize"], asg["desiredCapacity"]) == (1, 6, 2)
    assert "capacityReservationSpecification" not in asg


def test_prod_capacity_split() -> None:
    plan = stack_plan("prod")
    asg = one(plan, ASG, "h100-train").inputs
    policy = asg["mixedInstancesPolicy"]
    assert policy["instancesDistribution"] == {   # multi-node EFA training: on-demand only
        "onDemandBaseCapacity": 4, "onDemandPercentageAboveBaseCapacity": 100,
        "spotAllocationStrategy": "price-capacity-optimized",
        "onDemandAllocationStrategy": "prioritized"}
    overrides = policy["launchTemplate"]["overrides"]
    assert [o["instanceType"] for o in overrides] == ["p5.48xlarge"]
    assert asg["capacityRebalance"] is False
    evaluation = one(plan, ASG, "eval").inputs   # single-node work is the spot group
    distribution = evaluation["mixedInstancesPolicy"]["instancesDistribution"]
    assert distribution["onDemandPercentageAboveBaseCapacity"] == 0
    assert evaluation["capacityRebalance"] is True  # spot, and the stack handles rebalance


def test_pure_capacity_mapping_matches_the_spec() -> None:
    _, _, spec = load_stack("staging")
    group = spec.node_groups[0]
    assert instances_distribution(group.capacity)["on_demand_percentage_above_base_capacity"] == 30
    assert instance_overrides(group) == [{"instance_type": t} for t in group.instance_types]


def test_capacity_block_uses_market_options_and_no_mixed_policy() -> None:
    plan = planned_config(group_config("p5.48xlarge", min_nodes=0, capacity={
        "market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}))
    lt, asg = one(plan, LT).inputs, one(plan, ASG).inputs
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert lt["instanceType"] == "p5.48xlarge"
    assert "mixedInstancesPolicy" not in asg
    assert asg["launchTemplate"] == {"id": id_of(one(plan, LT)), "version": "$Latest"}
    assert asg["capacityRebalance"] is False


def test_on_demand_reservation_is_targeted_by_the_group_not_the_template() -> None:
    plan = plan_config(group_config("p4d.24xlarge", capacity={
        "on_demand_base": 2, "spot_percent": 50, "capacity_reservation_id": "cr-0aaaabbbbccccdddd"}))
    lt, asg = one(plan, LT).inputs, one(plan, ASG).inputs
    assert asg["capacityReservationSpecification"] == {
        "capacityReservationPreference": "capacity-reservations-first",
        "capacityReservationTarget": {"capacityReservationIds": ["cr-0aaaabbbbccccdddd"]}}
    assert "capacityReservationSpecification" not in lt and "instanceMarketOptions" not in lt
    assert asg["mixedInstancesPolicy"]["instancesDistribution"]["onDemandBaseCapacity"] == 2


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_desired_capacity_is_set_once_then_left_to_guardrails(stack: str) -> None:
    plan = stack_plan(stack)
    for group in plan.spec.node_groups:
        asg = one(plan, ASG, group.name)
        # The guardrails set both to 0; the lifecycle hook resource owns the hook after creation.
        assert asg.ignore_changes == ("desiredCapacity", "minSize", "initialLifecycleHooks")
        assert asg.inputs["desiredCapacity"] == group.desired_nodes
        assert asg.inputs["waitForCapacityTimeout"] == "0"


def test_resource_count_does_not_grow_with_nodes() -> None:
    name, config, _ = load_stack("prod")
    counts = {}
    for nodes in (2, 512):
        scaled = json.loads(json.dumps(config))
        group = scaled["gpucluster:node_groups"][0]
        group.update(min_nodes=1, desired_nodes=nodes, max_nodes=nodes)
        group["capacity"]["on_demand_base"] = 1  # spot above the base at every size: same guardrails
        plan = plan_config(scaled, stack=name)
        assert one(plan, ASG, group["name"]).inputs["maxSize"] == nodes
        counts[nodes] = len(plan.resources)
    assert counts[2] == counts[512] == len(stack_plan("prod").resources)


# ---------------------------------------------------------------------------- safety


@pytest.mark.parametrize("plan_name", ["dev", "staging", "prod", *TYPES])
def test_imdsv2_no_public_ips_encrypted_volumes(plan_name: str) -> None:
    plan = stack_plan(plan_name) if plan_name in ("dev", "staging", "prod") else type_plan(plan_name)
    for group in plan.spec.node_groups:
        lt = one(plan, LT, group.name).inputs
        assert lt["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                         "httpPutResponseHopLimit": 2, "instanceMetadataTags": "disabled"}
        assert all(n["associatePublicIpAddress"] == "false" for n in lt["networkInterfaces"])
        assert "vpcSecurityGroupIds" not in lt  # groups live on each interface
        for mapping in lt["blockDeviceMappings"]:
            assert mapping["ebs"]["encrypted"] == "true" and mapping["ebs"]["volumeType"] == "gp3"
        assert lt["blockDeviceMappings"][0]["ebs"]["volumeSize"] == group.root_volume_size_gib
    for subnet in plan.of_type(SUBNET):
        assert subnet.inputs["mapPublicIpOnLaunch"] is False, subnet.name


# Resources AWS gives no tags of their own: sub-resources of a bucket, topic, function or rule.
UNTAGGED = {
    "aws:autoscaling/lifecycleHook:LifecycleHook", "aws:cloudwatch/dashboard:Dashboard",  # not taggable
    "aws:cloudwatch/logMetricFilter:LogMetricFilter",
    "aws:cloudwatch/eventTarget:EventTarget", "aws:kms/alias:Alias", "aws:lambda/permission:Permission",
    "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig", "aws:scheduler/schedule:Schedule",
    "aws:sns/topicPolicy:TopicPolicy", "aws:sns/topicSubscription:TopicSubscription",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls", "aws:s3/bucketPolicy:BucketPolicy",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketVersioning:BucketVersioning",
}


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_tags_on_everything_propagated_to_instances_and_volumes(stack: str) -> None:
    plan = stack_plan(stack)
    for group in plan.spec.node_groups:
        expected = {**plan.spec.tags, "gpucluster:node-group": group.name}
        assert expected["gpucluster:stack"] == f"organization/gpucluster/{stack}/gpu-{stack}"
        assert "cost_center" in expected
        asg = one(plan, ASG, group.name).inputs
        asg_tags = {t["key"]: t["value"] for t in asg["tags"]}
        assert expected.items() <= asg_tags.items()
        assert all(t["propagateAtLaunch"] is True for t in asg["tags"])
        lt = one(plan, LT, group.name).inputs
        assert {s["resourceType"] for s in lt["tagSpecifications"]} == {"instance", "volume",
                                                                          "network-interface"}
        for spec in lt["tagSpecifications"]:
            assert expected.items() <= spec["tags"].items()
    for r in plan.resources:
        if r.custom and r.type not in UNTAGGED and r.type not in (
                                       "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                                       "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
                                       "aws:iam/rolePolicy:RolePolicy",
                                       "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                                       "aws:ec2/route:Route",
                                       "aws:ec2/routeTableAssociation:RouteTableAssociation",
                                       "aws:autoscaling/group:Group", PROVIDER):
            assert plan.spec.tags.items() <= r.inputs.get("tags", {}).items(), r.name


def test_user_data_is_the_rendered_bootstrap_of_the_group() -> None:
    lt = one(stack_plan("prod"), LT, "h100-train").inputs
    script = gzip.decompress(base64.b64decode(lt["userData"])).decode()
    assert script.startswith("#!/bin/bash\n")
    assert "GPUCLUSTER_NODE_GROUP=h100-train" in script
    assert "GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS=100" in script
    assert "copy_to_scratch\teval-sets\tacme-ml-eval-sets\teval/" in script  # the existing bucket
    assert "FI_EFA_USE_DEVICE_RDMA=1" in script


# ------------------------------------------------------------------------------ AMI


def record_ami_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    original = PlanMocks.call

    def call(self: PlanMocks, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:ssm/getParameter:getParameter":
            seen.append(args.args["name"])
        return original(self, args)

    monkeypatch.setattr(PlanMocks, "call", call)
    return seen


def test_default_ami_is_the_deep_learning_base_ami(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_ami_lookups(monkeypatch)
    plan = plan_config(group_config("g5.xlarge"))
    assert seen == [DEFAULT_AMI_PARAMETER]
    assert DEFAULT_AMI_PARAMETER == (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
    assert one(plan, LT).inputs["imageId"] == MOCK_AMI


def test_ami_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_ami_lookups(monkeypatch)
    plan = plan_config(group_config("g5.xlarge", ami_ssm_parameter="/my/golden/ami"))
    assert seen == ["/my/golden/ami"]
    seen.clear()
    plan = plan_config(group_config("g5.xlarge", ami_id="ami-0fedcba9876543210"))
    assert seen == [] and one(plan, LT).inputs["imageId"] == "ami-0fedcba9876543210"


def unignored_changes(before: Plan, after: Plan) -> dict[str, list[str]]:
    """Resource name -> inputs a `pulumi up` from `before` to `after` would change (ignore_changes aside)."""
    old = {r.urn: r for r in before.resources}
    changed: dict[str, list[str]] = {}
    for new in after.resources:
        prior = old.get(new.urn)
        if prior is None:
            changed[new.name] = ["<created>"]
            continue
        keys = sorted(k for k in {*prior.inputs, *new.inputs} if prior.inputs.get(k) != new.inputs.get(k)
                      and k not in new.ignore_changes)
        if keys:
            changed[new.name] = keys
    return changed


@pytest.mark.parametrize("group", [{}, {"ami_ssm_parameter": "/my/golden/ami"}])
def test_a_new_ami_release_changes_nothing_on_the_next_up(monkeypatch: pytest.MonkeyPatch,
                                                          group: dict[str, Any]) -> None:
    config = group_config("p4d.24xlarge", **group)
    before = plan_config(config)
    monkeypatch.setattr(plan_module, "MOCK_AMI", "ami-0ffffffffffffffff")  # the parameter moved on
    after = plan_config(config)
    assert one(after, LT).inputs["imageId"] == "ami-0ffffffffffffffff"
    assert one(after, LT).ignore_changes == ("imageId",)
    assert unignored_changes(before, after) == {}


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_a_second_up_with_nothing_changed_changes_nothing(stack: str) -> None:
    assert unignored_changes(stack_plan(stack), run_plan(stack)) == {}


def test_setting_ami_id_is_the_deliberate_upgrade() -> None:
    pinned = plan_config(group_config("p4d.24xlarge", ami_id="ami-0fedcba9876543210"))
    upgraded = plan_config(group_config("p4d.24xlarge", ami_id="ami-0123456789abcdef1"))
    lt = one(upgraded, LT)
    assert lt.ignore_changes == () and lt.inputs["imageId"] == "ami-0123456789abcdef1"
    assert unignored_changes(pinned, upgraded) == {lt.name: ["imageId"]}


# ------------------------------------------------------------------- stop-state tags


PROVIDER = "pulumi:providers:aws"


def asg_provider(plan: Plan, group: str | None = None) -> PlannedResource:
    asg = one(plan, ASG, group)
    return next(r for r in plan.resources if r.urn == asg.provider)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_the_groups_provider_never_takes_the_stop_state_tags_into_pulumis_state(stack: str) -> None:
    """A `pulumi refresh` must not read the tags a stop wrote, or the next `up` deletes them."""
    plan = stack_plan(stack)
    written = (STOPPED_BY_TAG, PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG,
               *STATE_TAGS)
    for group in plan.spec.node_groups:
        provider = asg_provider(plan, group.name)
        assert provider.type == PROVIDER and provider.inputs["region"] == plan.spec.region
        ignored = json.loads(provider.inputs["ignoreTags"])
        assert all(any(key.startswith(p) for p in ignored["keyPrefixes"]) for key in written)
        # ... while every tag Pulumi sets stays Pulumi's to manage.
        asg_tags = [t["key"] for t in one(plan, ASG, group.name).inputs["tags"]]
        assert not [k for k in asg_tags if k.startswith(tuple(ignored["keyPrefixes"]))]
    # Only the Auto Scaling groups need it: everything else stays on the stack's default provider.
    assert sorted(r.name for r in plan.resources if r.provider) == sorted(r.name for r in plan.of_type(ASG))


def test_the_groups_provider_acts_with_the_stacks_own_aws_settings() -> None:
    """An explicit provider reads no stack config: the stack's aws:* settings are handed to it."""
    config = group_config("g5.xlarge")
    role = "arn:aws:iam::123456789012:role/deployer"
    config |= {"aws:profile": "ml-prod", "aws:assumeRoles": [{"roleArn": role}],
               "aws:allowedAccountIds": ["123456789012"], "aws:skipMetadataApiCheck": True,
               "aws:ignoreTags": {"keys": ["team-owned"], "keyPrefixes": ["kubernetes.io/"]}}
    provider = asg_provider(plan_config(config)).inputs
    assert provider["profile"] == "ml-prod"
    assert json.loads(provider["assumeRoles"]) == [{"roleArn": role}]
    assert json.loads(provider["allowedAccountIds"]) == ["123456789012"]
    assert provider["skipMetadataApiCheck"] == "true"
    assert json.loads(provider["ignoreTags"]) == {
        "keys": ["team-owned"], "keyPrefixes": ["kubernetes.io/", *STOP_STATE_TAG_PREFIXES]}


def test_a_provider_given_to_the_group_is_used_as_it_is() -> None:
    def program() -> None:
        given = aws.Provider("mine", region="us-east-1", ignore_tags=aws.ProviderIgnoreTagsArgs(
            key_prefixes=list(STOP_STATE_TAG_PREFIXES)))
        GpuNodeGroup("cb", {
            "node_group": {"name": "cb", "instance_types": ["g5.xlarge"], "max_nodes": 2},
            "cluster_name": "lab", "region": "us-east-1", "identity": "lab",
            "subnet_ids": ["subnet-0aaaaaaaa"], "security_group_ids": ["sg-0123456789abcdef0"],
            "instance_profile_arn": "arn:aws:iam::123456789012:instance-profile/lab",
            "node_role_name": "lab-nodes"},  # health checks are on: the role answers the launch check
            opts=pulumi.ResourceOptions(providers={"aws": given}))

    resources, _ = record_resources(program)
    providers = [r for r in resources if r.type == PROVIDER]
    assert [p.name for p in providers] == ["mine"]
    assert next(r for r in resources if r.type == ASG).provider == providers[0].urn


# -------------------------------------------------------------------------- outputs


def test_outputs_per_group_and_network() -> None:
    plan = stack_plan("prod")
    out = plan.outputs
    assert out["vpc_id"] == id_of(one(plan, "aws:ec2/vpc:Vpc"))
    assert out["subnet_ids"] == {"us-east-1d": "gpu-prod-network-private-us-east-1d-id"}
    group = out["node_groups"]["h100-train"]
    assert group["asg_name"] == autoname(one(plan, ASG, "h100-train").name)
    assert group["launch_template_id"] == id_of(one(plan, LT, "h100-train"))
    assert group["security_group_id"] == "gpu-prod-network-h100-train-nodes-id"
    assert group["placement_group_name"] == autoname(one(plan, PG).name)
    assert group["efa"] is True and group["instance_types"] == ["p5.48xlarge"]
    evaluation = out["node_groups"]["eval"]
    assert evaluation["efa"] is False and evaluation["placement_group_name"] is None


def test_cluster_exposes_node_groups_with_their_asg() -> None:
    _, _, spec = load_stack("staging")
    built: dict[str, GpuCluster] = {}
    record_resources(lambda: built.setdefault("c", GpuCluster("c", cluster_args(spec))), stack="staging",
                     region=spec.region)
    group = built["c"].groups["l40s-4x"]
    assert isinstance(group.asg, aws.autoscaling.Group)
    assert isinstance(group.launch_template, aws.ec2.LaunchTemplate)


def test_plan_prod_shows_the_whole_tree(cli_plans_once: None) -> None:
    result = CliRunner().invoke(app, ["plan", "prod", "--tree"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for needle in ("    gpucluster.ClusterNetwork  gpu-prod-network",
                   "    gpucluster.NodeIdentity  gpu-prod-node-identity",
                   "    gpucluster.GpuNodeGroup  gpu-prod-h100-train",
                   "      ec2.LaunchTemplate  gpu-prod-h100-train-lt",
                   "      autoscaling.Group  gpu-prod-h100-train-asg",
                   "      ec2.PlacementGroup  gpu-prod-network-h100-train-placement"):
        assert needle in lines, needle
