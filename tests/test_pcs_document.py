"""The AWS PCS cluster as CloudFormation defines it: the document Cloud Control is given validates against
cfn-lint's bundled `AWS::PCS::Cluster` schema, in every Slurm plan (the Slurm variant of prod, the example,
the `init --scheduler slurm` scaffold) with accounting and idle scale-down; the policy rules read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from base_config import plan_config
from cfnlint_data import resource_schema
from gpucluster import scaffold
from gpucluster.aws.pcs import PCS_CLUSTER_TYPE, cluster_attribute, cluster_document
from gpucluster.plan import Plan
from gpucluster.policy.offline import check_plan
from shipped import planned_config

REPO = Path(__file__).resolve().parent.parent
AMI = "ami-0123456789abcdef0"
CLOUD_CONTROL = "aws:cloudcontrol/resource:Resource"
SUBNET, GROUP = "subnet-0123456789abcdef0", "sg-0123456789abcdef0"


def schema() -> dict[str, Any]:
    return resource_schema(PCS_CLUSTER_TYPE)


def problems(document: dict[str, Any]) -> list[str]:
    """Every way `document` breaks the schema (required, names, enums, ranges, additionalProperties)."""
    validator = jsonschema.Draft7Validator(schema())
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in validator.iter_errors(document))


def document_of(plan: Plan) -> dict[str, Any]:
    [cluster] = [r for r in plan.of_type(CLOUD_CONTROL) if r.inputs["typeName"] == PCS_CLUSTER_TYPE]
    document: dict[str, Any] = json.loads(cluster.inputs["desiredState"])
    return document


def shaped_ids(document: dict[str, Any]) -> dict[str, Any]:
    """The document with the mock engine's ids (`<name>-id`) as AWS shapes them (the schema's patterns)."""
    networking = document["Networking"]
    assert all(i.endswith("-id") for i in [*networking["SubnetIds"], *networking["SecurityGroupIds"]])
    return {**document, "Networking": {**networking, "SubnetIds": [SUBNET] * len(networking["SubnetIds"]),
                                       "SecurityGroupIds": [GROUP] * len(networking["SecurityGroupIds"])}}


def slurm_prod() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((REPO / "stacks" / "Pulumi.prod.yaml").read_text())["config"]
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AMI}
    return config


def example() -> dict[str, Any]:
    path = REPO / "examples" / "slurm-stack" / "Pulumi.slurm.yaml"
    config: dict[str, Any] = yaml.safe_load(path.read_text())["config"]
    return config


def init_scaffold() -> dict[str, Any]:
    text = scaffold.render("lab", "0.0.0", "gpucluster")["stacks/Pulumi.dev.yaml"]
    text += scaffold.slurm_scheduler(AMI)
    config: dict[str, Any] = yaml.safe_load(text)["config"]
    return config


def test_the_document_validates_and_the_schema_refuses_what_aws_native_would_have_dropped() -> None:
    for idle, accounting in ((30, True), (None, False)):
        document = cluster_document("gpu-prod-pcs", "25.05", "small", SUBNET, GROUP, idle, accounting,
                                    {"owner": "ml", "gpucluster:stack": "s"})
        assert problems(document) == []
        assert set(schema()["required"]) <= set(document)
    # The engine's camelCase (what aws_native.pcs.Cluster was given) is not CloudFormation's: refused.
    wrong = cluster_document("c", "25.05", "small", SUBNET, GROUP, 30, True, {})
    wrong["SlurmConfiguration"] = {"accounting": {"mode": "STANDARD"}, "scaleDownIdleTimeInSeconds": 1800}
    assert problems(wrong) == ["SlurmConfiguration: Additional properties are not allowed ('accounting', "
                               "'scaleDownIdleTimeInSeconds' were unexpected)"]
    assert problems({**wrong, "SlurmConfiguration": {"Accounting": {"Mode": "ON"}}}) == [
        "SlurmConfiguration/Accounting/Mode: 'ON' is not one of ['STANDARD', 'NONE']"]


def test_name_networking_and_size_are_what_cloudformation_makes_create_only() -> None:
    # A change to them replaces the cluster (delete first: aws/pcs.py), and so does accounting per PCS.
    assert set(schema()["createOnlyProperties"]) == {"/properties/Name", "/properties/Networking",
                                                     "/properties/Size"}
    assert {"/properties/Id", "/properties/Arn"} <= set(schema()["readOnlyProperties"])


@pytest.mark.parametrize(("config", "stack", "idle_seconds"), [
    (slurm_prod, "prod", 1800), (example, "slurm", 1800), (init_scaffold, "dev", 900)],
    ids=["prod-slurm", "example", "init-scaffold"])
def test_every_slurm_plan_gives_a_valid_document_with_accounting_and_idle_scale_down(
        config: Any, stack: str, idle_seconds: int) -> None:
    plan = planned_config(config(), stack=stack)
    document = document_of(plan)
    assert problems(shaped_ids(document)) == []
    assert document["SlurmConfiguration"]["Accounting"] == {"Mode": "STANDARD"}
    assert document["SlurmConfiguration"]["ScaleDownIdleTimeInSeconds"] == idle_seconds
    # The id every node group, queue and guardrail uses is the model's Id, not Cloud Control's own id (Arn).
    assert plan.outputs["pcs_cluster_id"].startswith("pcs_")
    assert {r.inputs["clusterId"] for r in plan.of_type("aws-native:pcs:ComputeNodeGroup")} == {
        plan.outputs["pcs_cluster_id"]}


def test_the_cluster_attributes_come_from_cloud_controls_model() -> None:
    model = json.dumps({"Id": "pcs_abc1234567", "Arn": "arn:aws:pcs:us-east-1:1:cluster/pcs_abc1234567"})
    assert cluster_attribute(model, "Id") == "pcs_abc1234567"
    assert cluster_attribute(model, "Arn").endswith("cluster/pcs_abc1234567")
    with pytest.raises(ValueError, match="without Id"):
        cluster_attribute("{}", "Id")


def test_the_policy_rules_read_the_cloud_control_document() -> None:
    config = slurm_prod()
    config["gpucluster:scheduler"]["accounting"] = False
    found = [str(v) for v in check_plan(plan_config(config, stack="prod")) if v.mandatory]
    assert len(found) == 1 and "pcs-accounting" in found[0], found
    assert "slurmConfiguration.accounting.mode is 'NONE'" in found[0]


def test_a_cloud_control_resource_reads_as_its_aws_native_type() -> None:
    """CrossGuard's view (pack.py): the document's names camelCased, Tags kept, ids from Cloud Control's
    model, the document's dependencies on each property; a document not known yet is UNKNOWN throughout."""
    from gpucluster.policy.cloudcontrol import native_view
    from gpucluster.policy.records import UNKNOWN, Resource, dig

    document = cluster_document("c", "25.05", "small", SUBNET, GROUP, 30, True, {"Owner Key": "ml"})
    arn = "arn:aws:pcs:us-east-1:1:cluster/pcs_abc1234567"
    model = json.dumps({**document, "Id": "pcs_abc1234567", "Arn": arn})
    seen = native_view(Resource(type=CLOUD_CONTROL, name="c", ids=("arn:x",),
                                deps={"desiredState": ("urn:sg",)},
                                props={"typeName": PCS_CLUSTER_TYPE, "desiredState": json.dumps(document),
                                       "properties": model}))
    assert seen.type == "aws-native:pcs:Cluster"
    assert dig(seen.props, "slurmConfiguration", "accounting", "mode") == "STANDARD"
    assert dig(seen.props, "slurmConfiguration", "scaleDownIdleTimeInSeconds") == 1800
    assert dig(seen.props, "networking", "securityGroupIds") == [GROUP]
    assert seen.props["tags"] == {"Owner Key": "ml"}  # the user's keys, not camelCased
    assert seen.ids == ("arn:x", "pcs_abc1234567", arn)
    assert seen.deps["networking"] == ("urn:sg",)
    pending = native_view(Resource(type=CLOUD_CONTROL, name="c",
                                   props={"typeName": PCS_CLUSTER_TYPE, "desiredState": UNKNOWN}))
    assert dig(pending.props, "slurmConfiguration", "accounting", "mode") is UNKNOWN
    assert pending.props.get("tags") is UNKNOWN
    other = Resource(type="aws:ec2/vpc:Vpc", name="v", props={"tags": {}})
    assert native_view(other) is other
