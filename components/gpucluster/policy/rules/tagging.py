"""The cost-tag rule: every taggable resource, and what launch templates launch, carries the cost tags.

Owns `required-cost-tags` and the list of resource types that take tags.
Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource, dig, effective_tags, items
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import LAUNCH_TEMPLATE

# Resources whose pulumi-aws 7 inputs take `tags` (tests/policies/test_policy_pack.py checks each
# against the installed pulumi_aws). Any other resource that carries a `tags` input is checked too.
TAGGABLE: frozenset[str] = frozenset({
    "aws:autoscaling/group:Group",
    "aws:budgets/budget:Budget",
    "aws:budgets/budgetAction:BudgetAction",
    "aws:cloudwatch/compositeAlarm:CompositeAlarm",
    "aws:cloudwatch/eventRule:EventRule",
    "aws:cloudwatch/logGroup:LogGroup",
    "aws:cloudwatch/metricAlarm:MetricAlarm",
    "aws:ebs/volume:Volume",
    "aws:ec2/capacityReservation:CapacityReservation",
    "aws:ec2/eip:Eip",
    "aws:ec2/flowLog:FlowLog",
    "aws:ec2/instance:Instance",
    "aws:ec2/internetGateway:InternetGateway",
    "aws:ec2/launchTemplate:LaunchTemplate",
    "aws:ec2/natGateway:NatGateway",
    "aws:ec2/networkInterface:NetworkInterface",
    "aws:ec2/placementGroup:PlacementGroup",
    "aws:ec2/routeTable:RouteTable",
    "aws:ec2/securityGroup:SecurityGroup",
    "aws:ec2/subnet:Subnet",
    "aws:ec2/vpc:Vpc",
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:iam/instanceProfile:InstanceProfile",
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider",
    "aws:iam/policy:Policy",
    "aws:iam/role:Role",
    "aws:kms/key:Key",
    "aws:lambda/function:Function",
    "aws:s3/bucket:Bucket",
    "aws:s3/bucketV2:BucketV2",
    "aws:scheduler/scheduleGroup:ScheduleGroup",
    "aws:sns/topic:Topic",
    "aws:sqs/queue:Queue",
    "aws:ssm/document:Document",
    "aws:ssm/parameter:Parameter",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
})

OPEN_IPV4, OPEN_IPV6 = "0.0.0.0/0", "::/0"


def _present(value: Any) -> bool:
    """A tag value counts when it is a non-empty string, or not known yet."""
    return value is UNKNOWN or (isinstance(value, str) and value.strip() != "")


@rule("required-cost-tags",
      "Every taggable resource carries the cost tags owner, cost_center and environment; launch "
      "templates also tag the instances and volumes they launch.",
      "resource",
      schema={"required_tags": {"type": "array", "items": {"type": "string"},
                                "description": "Tag keys every taggable resource must carry."}},
      defaults={"required_tags": ["owner", "cost_center", "environment"]})
def required_cost_tags(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    if resource.type.startswith(("pulumi:", "gpucluster:")):
        return
    if resource.type not in TAGGABLE and "tags" not in resource.props:
        return
    required = list(config["required_tags"])
    tags = effective_tags(resource)
    if tags is not UNKNOWN:
        missing = [k for k in required if not _present(tags.get(k))]
        if missing:
            yield f"missing cost tags: {', '.join(missing)}"
    if resource.type == LAUNCH_TEMPLATE:
        specs = items(resource.props.get("tagSpecifications"))
        if specs is UNKNOWN:
            return
        for kind in ("instance", "volume"):
            tagged = [s for s in specs if dig(s, "resourceType") in (kind, UNKNOWN)]
            if not tagged:
                yield f"tagSpecifications has no `{kind}` entry, so launched {kind}s carry no cost tags"
                continue
            given = dig(tagged[0], "tags")
            if given is UNKNOWN or not isinstance(given, Mapping):
                continue
            missing = [k for k in required if not _present(given.get(k))]
            if missing:
                yield f"tagSpecifications `{kind}` is missing cost tags: {', '.join(missing)}"
