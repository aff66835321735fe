"""Provider conformance (gpucluster.conformance): plans against the SDKs' types and AWS's schemas.

Every plan the project ships or the tests build is checked: the shipped stacks, the Slurm example,
every `gpucluster init` scaffold, and the variants other tests plan (observability, baked images,
Slurm, Kubernetes): none may have a finding (the PCS cluster goes through Cloud Control, whose document
is checked against AWS::PCS::Cluster's schema). Fixtures show the check catching each kind of
problem, so none of it passes for want of looking; the shipped schemas are checked against
cfn-lint's copies byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from base_config import base
from cfnlint_data import resource_schema_path
from gpucluster.cli import app
from gpucluster.conformance import Finding, cfnschema, check_resources
from gpucluster.conformance.findings import Computed
from gpucluster.plan import Plan, PlannedResource, run_program_file
from shipped import planned_config, planned_once, shipped_plan

REPO = Path(__file__).resolve().parent.parent
AMI = "ami-0123456789abcdef0"
DIGEST = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
OBSERVABILITY = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST},
                 "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"], "editors": 2}}
Planned = tuple[list[PlannedResource], str]
"""A plan's resources and its region."""


def prod() -> dict[str, Any]:
    return yaml.safe_load((REPO / "stacks/Pulumi.prod.yaml").read_text())["config"]


def with_(config: dict[str, Any], **sections: Any) -> dict[str, Any]:
    config.update({f"gpucluster:{k}": v for k, v in sections.items()})
    return config


def baked(config: dict[str, Any]) -> dict[str, Any]:
    """tests/test_images.py's baked prod: one group baked and pinned, one not."""
    return with_(config, images={"bake": True, "schedule": "cron(0 4 ? * SUN *)", "groups": {
        "h100-train": {"ami_id": AMI, "driver": "550.127.05", "cuda": "12.4"}, "eval": {"bake": False}}})


def two_slurm_groups(**scheduler: Any) -> dict[str, Any]:
    """tests/test_slurm_ops.py's Slurm stack: a p5 group and a spot group, no autostop."""
    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4},
        {"name": "spot-a10", "instance_types": ["g5.xlarge"], "max_nodes": 2, "desired_nodes": 1,
         "capacity": {"spot_percent": 100}}]
    return with_(config, scheduler={"type": "slurm", "ami_id": AMI, **scheduler})


def eks_prod() -> dict[str, Any]:
    """tests/test_eks.py's Kubernetes prod: scheduler eks, a second zone for the control plane."""
    config = prod()
    config["gpucluster:network"]["availability_zones"] = ["us-east-1d", "us-east-1a"]
    return with_(config, scheduler={"type": "eks", "teams": ["research", "eval"]})


@cache
def scaffold(scheduler: str, root: Path) -> Path:
    """`gpucluster init` with the scheduler, in a directory of its own: its dev stack file."""
    target = root / f"init-{scheduler}"
    ami = ["--ami-id", AMI] if scheduler == "slurm" else []
    args = ["init", str(target), "--scheduler", scheduler, *ami]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return target / "stacks" / "Pulumi.dev.yaml"


def example(name: str) -> Planned:
    """One of examples/' Python programs, planned in-process as tests/test_examples.py plans it."""
    folder = REPO / "examples" / name
    config = yaml.safe_load((folder / "Pulumi.dev.yaml").read_text())["config"]
    project = yaml.safe_load((folder / "Pulumi.yaml").read_text())["name"]
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        resources, _ = run_program_file(folder / "__main__.py", config, project=project, stack="dev",
                                        region=config["aws:region"])
    finally:
        os.chdir(cwd)
    return resources, config["aws:region"]


def of(plan: Plan) -> Planned:
    return plan.resources, plan.spec.region


EXISTING_WORKSPACE = {"prometheus": {
    "remote_write_url": "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/"
                        "ws-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/api/v1/remote_write",
    "region": "us-west-2", "dcgm_exporter_image": DIGEST}}
SLURM_EXAMPLE = str(REPO / "examples/slurm-stack/Pulumi.slurm.yaml")

PLANS: dict[str, tuple[bool, Callable[[Path], Planned]]] = {
    # name: (a Slurm stack, how it is planned: its resources and region)
    "dev": (False, lambda _: of(shipped_plan("dev"))),
    "staging": (False, lambda _: of(shipped_plan("staging"))),
    "prod": (False, lambda _: of(shipped_plan("prod"))),
    "examples/slurm-stack": (True, lambda _: of(planned_once(SLURM_EXAMPLE))),
    "examples/node-group-in-existing-vpc": (False, lambda _: example("node-group-in-existing-vpc")),
    "examples/guard-existing-asgs": (False, lambda _: example("guard-existing-asgs")),
    "init --scheduler none": (False, lambda root: of(planned_once(str(scaffold("none", root))))),
    "init --scheduler slurm": (True, lambda root: of(planned_once(str(scaffold("slurm", root))))),
    "init --scheduler eks": (False, lambda root: of(planned_once(str(scaffold("eks", root))))),
    "prod with observability": (False, lambda _: of(planned_config(
        with_(prod(), observability=OBSERVABILITY), "prod"))),
    "observability, an existing workspace": (False, lambda _: of(planned_config(
        with_(base(), observability=EXISTING_WORKSPACE)))),
    "prod baked": (False, lambda _: of(planned_config(baked(prod()), "prod"))),
    "prod on Slurm": (True, lambda _: of(planned_config(
        with_(prod(), scheduler={"type": "slurm", "ami_id": AMI}), "prod"))),
    "prod on Kubernetes": (False, lambda _: of(planned_config(eks_prod(), "prod"))),
    "Slurm, two groups, no accounting": (True, lambda _: of(planned_config(
        two_slurm_groups(accounting=False)))),
    "Slurm with observability": (True, lambda _: of(planned_config(
        with_(two_slurm_groups(), autostop={"idle_minutes": 30}, observability=OBSERVABILITY)))),
}


def found(planned: Planned) -> list[Finding]:
    return check_resources(*planned)


@pytest.mark.parametrize("name", list(PLANS))
def test_every_plan_conforms(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, build = PLANS[name]
    findings = found(build(tmp_path_factory.getbasetemp()))
    assert [f"{f.resource_type} {f.resource_name}: {f.message}" for f in findings] == []


@pytest.mark.parametrize("name", ["examples/slurm-stack", "prod on Slurm", "init --scheduler slurm"])
def test_a_slurm_stack_s_cluster_document_is_checked_and_carries_its_settings(
        name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The Slurm settings aws-native's Cluster type could not carry: in the Cloud Control document, which
    the schema check reads (a document without them, or with the old camelCase keys, is refused)."""
    resources, region = PLANS[name][1](tmp_path_factory.getbasetemp())
    [cluster] = [r for r in resources if r.type == cfnschema.CLOUDCONTROL]
    document = json.loads(cluster.inputs["desiredState"])
    assert document["SlurmConfiguration"]["Accounting"]["Mode"] in ("STANDARD", "NONE")
    assert "ScaleDownIdleTimeInSeconds" in document["SlurmConfiguration"]
    broken = {**cluster.inputs, "desiredState": json.dumps(
        {**document, "SlurmConfiguration": {"accounting": {"mode": "STANDARD"}}})}
    assert found(([dataclasses.replace(cluster, inputs=broken)], region))


def test_every_aws_native_and_cloudcontrol_type_planned_has_its_schema(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    types: set[str] = set()
    for _, build in PLANS.values():
        for r in build(tmp_path_factory.getbasetemp())[0]:
            if r.type.startswith("aws-native:"):
                types.add(cfnschema.native_type_name(r.type) or r.type)
            elif r.type == cfnschema.CLOUDCONTROL:
                types.add(r.inputs["typeName"])
    assert types, "no plan uses an aws-native or Cloud Control resource: the schema check checks nothing"
    assert sorted(t for t in types if cfnschema.schema(t) is None) == []


def test_the_plan_of_the_slurm_example_has_no_conformance_violation(cli_plans_once: None) -> None:
    result = CliRunner().invoke(app, ["plan", str(REPO / "examples/slurm-stack/Pulumi.slurm.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    assert [v for v in json.loads(result.stdout)["violations"] if v["policy"] == "provider-conformance"] == []


# ---------------------------------------------------------------- the schemas shipped


def test_the_shipped_schemas_are_cfn_lints_byte_for_byte() -> None:
    shipped = sorted(cfnschema.SCHEMAS.glob("*.json"))
    assert shipped
    for path in shipped:
        type_name = path.stem.replace("-", "::")
        assert json.loads(path.read_text())["typeName"] == type_name
        source = resource_schema_path(type_name, cfnschema.SOURCE_REGION)  # where the copies come from
        assert path.read_bytes() == source.read_bytes(), f"refresh it: cp {source} {path}"


def test_the_schemas_are_package_data() -> None:
    assert '"gpucluster.conformance" = ["schemas/*.json"]' in (REPO / "pyproject.toml").read_text()


# ---------------------------------------------------------------- what it catches


def planned(type_token: str, inputs: dict[str, Any], name: str = "r") -> PlannedResource:
    return PlannedResource(urn=f"urn:pulumi:t::p::{type_token}::{name}", type=type_token, name=name,
                           parent=None, custom=True, inputs=inputs)


PCS_CLUSTER = {"networking": {"subnetIds": ["subnet-0123456789abcdef0"],
                              "securityGroupIds": ["sg-0123456789abcdef0"]},
               "scheduler": {"type": "SLURM", "version": "25.05"}, "size": "SMALL"}


def problems(resource: PlannedResource) -> list[tuple[str, str, str]]:
    return [(f.path, f.problem, f.refused_by) for f in check_resources([resource], "us-east-1")]


def test_a_valid_pcs_cluster_has_no_finding() -> None:
    assert problems(planned("aws-native:pcs:Cluster", PCS_CLUSTER)) == []


def test_it_catches_the_pcs_cluster_typed_as_the_queue() -> None:
    cluster = planned("aws-native:pcs:Cluster", {**PCS_CLUSTER, "slurmConfiguration": {
        "accounting": {"mode": "STANDARD"}, "scaleDownIdleTimeInSeconds": 600}})
    by = "pulumi_aws_native.pcs.SlurmConfigurationPropertiesArgs"
    assert problems(cluster) == [("slurmConfiguration.accounting", "unknown property", by),
                                 ("slurmConfiguration.scaleDownIdleTimeInSeconds", "unknown property", by)]


def test_it_catches_an_unknown_nested_key_on_a_pulumi_aws_resource() -> None:
    template = planned("aws:ec2/launchTemplate:LaunchTemplate", {
        "metadataOptions": {"httpTokens": "required", "http_put_response_hop_limit": 1},
        "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"encrypted": "true", "volumeSize": 8}},
                                {"deviceName": "/dev/sdb", "ebs": {"encrypted": "true", "iops_": 3000}}]})
    assert problems(template) == [
        ("metadataOptions.http_put_response_hop_limit", "unknown property",
         "pulumi_aws.ec2.LaunchTemplateMetadataOptionsArgs"),
        ("blockDeviceMappings[1].ebs.iops_", "unknown property",
         "pulumi_aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs")]


def test_it_catches_a_value_outside_its_enum_in_the_sdk_and_the_schema() -> None:
    [(path, problem, by), (schema_path, schema_problem, schema_by)] = problems(
        planned("aws-native:pcs:Cluster", {**PCS_CLUSTER, "size": "HUGE"}))
    assert (path, by) == ("size", "pulumi_aws_native.pcs.ClusterSize") and "not one of SMALL" in problem
    assert schema_path == "size" and schema_by == "AWS::PCS::Cluster #/properties/Size"
    assert schema_problem == "'HUGE' is not one of SMALL, MEDIUM, LARGE"


def test_it_catches_a_missing_required_property() -> None:
    assert problems(planned("aws:iam/rolePolicy:RolePolicy", {"name": "p", "role": "r"})) == [
        ("policy", "required property missing", "pulumi_aws.iam.RolePolicyArgs")]
    cluster = {k: v for k, v in PCS_CLUSTER.items() if k != "scheduler"}
    assert [p[:2] for p in problems(planned("aws-native:pcs:Cluster", cluster))] == [
        ("scheduler", "required property missing"), ("scheduler", "required property missing")]


def cloudcontrol(document: dict[str, Any], type_name: str = "AWS::PCS::Cluster") -> PlannedResource:
    return planned("aws:cloudcontrol/resource:Resource", {"typeName": type_name,
                                                          "desiredState": json.dumps(document)})


DOCUMENT = {"Name": "gpu-dev", "Size": "SMALL", "Scheduler": {"Type": "SLURM", "Version": "25.05"},
            "Networking": {"SubnetIds": ["subnet-0123456789abcdef0"],
                           "SecurityGroupIds": ["sg-0123456789abcdef0"]},
            "SlurmConfiguration": {"ScaleDownIdleTimeInSeconds": 1800, "Accounting": {"Mode": "STANDARD"}},
            "Tags": {"owner": "ml"}}


def test_a_cloudcontrol_document_that_keeps_its_schema_has_no_finding() -> None:
    assert problems(cloudcontrol(DOCUMENT)) == []


def test_it_catches_a_cloudcontrol_document_that_breaks_its_schema() -> None:
    broken = {**DOCUMENT, "Size": "HUGE", "Bogus": 1, "Arn": "arn:x",
              "Networking": {"SubnetIds": ["subnet-x"]},
              "SlurmConfiguration": {"ScaleDownIdleTimeInSeconds": 0, "Accounting": {"Mode": "ON"}}}
    del broken["Scheduler"]
    found = {(path, problem) for path, problem, _ in problems(cloudcontrol(broken))}
    assert found == {
        ("desiredState.Size", "'HUGE' is not one of SMALL, MEDIUM, LARGE"),
        ("desiredState.Bogus", "unknown property"),
        ("desiredState.Arn", "read-only property: AWS sets it"),
        ("desiredState.Networking.SubnetIds[0]", "'subnet-x' does not match ^subnet-\\w{8,17}$"),
        ("desiredState.SlurmConfiguration.ScaleDownIdleTimeInSeconds", "0 is outside 1.."),
        ("desiredState.SlurmConfiguration.Accounting.Mode", "'ON' is not one of STANDARD, NONE"),
        ("desiredState.Scheduler", "required property missing"),
    }


def test_a_document_of_a_type_without_a_shipped_schema_is_a_finding() -> None:
    assert problems(cloudcontrol({"Name": "x"}, "AWS::Nope::Thing")) == [
        ("desiredState", "no CloudFormation schema of AWS::Nope::Thing ships with gpucluster",
         "AWS::Nope::Thing")]


def test_an_unknown_resource_type_is_a_finding() -> None:
    assert problems(planned("aws:nope/thing:Thing", {})) == [
        ("-", "no resource of this type in the installed provider SDKs", "aws:nope/thing:Thing")]


def test_values_the_engine_computes_skip_patterns_and_enums() -> None:
    document = {**DOCUMENT, "Networking": {"SubnetIds": ["gpu-network-private-id"]}}
    resource = cloudcontrol(document)
    assert [p[0] for p in problems(resource)] == ["desiredState.Networking.SubnetIds[0]"]
    assert cfnschema.findings(resource, Computed(["gpu-network-private-id"])) == []


@pytest.mark.parametrize("token", ["aws-native:pcs:Cluster", "aws:iam/rolePolicy:RolePolicy",
                                   "aws:ec2/launchTemplate:LaunchTemplate", "aws-native:pcs:Queue"])
def test_required_properties_read_the_same_without_the_sdks_own_helper(
        token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pulumi without `_types._required_property_names` (older releases): read from `__init__`."""
    from pulumi import _types as pulumi_types

    from gpucluster.conformance import sdktypes

    cls = sdktypes.args_class(token)
    assert cls is not None
    sdks = sdktypes.properties(cls)[1]
    monkeypatch.delattr(pulumi_types, "_required_property_names")
    sdktypes.properties.cache_clear()
    try:
        assert sdktypes.properties(cls)[1] == sdks
    finally:
        sdktypes.properties.cache_clear()


def test_a_resource_class_without_its_type_token_is_found_by_module_and_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An SDK generated before `@pulumi.type_token`: the class is still found where its token says."""
    from pulumi_aws.iam import RolePolicy

    from gpucluster.conformance import sdktypes

    monkeypatch.delattr(RolePolicy, "pulumi_type")
    assert sdktypes._imported_class("aws:iam/rolePolicy:RolePolicy") is RolePolicy
    assert sdktypes._imported_class("aws:lambda/function:Function").__name__ == "Function"  # lambda_
    assert sdktypes._imported_class("aws:iam/nope:Nope") is None


# ---------------------------------------------------------------- pulumi-kubernetes (issue 36)


VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"


def test_pulumi_kubernetes_resources_are_checked_against_its_input_types() -> None:
    policy = planned(VAP, {"apiVersion": "admissionregistration.k8s.io/v1",
                           "kind": "ValidatingAdmissionPolicy",
                           "metadata": {"name": "p", "lables": {}},
                           "spec": {"failurePolicy": "Fail", "validations": [{"expresion": "true"}]}})
    assert problems(policy) == [
        ("metadata.lables", "unknown property", "pulumi_kubernetes.meta.ObjectMetaArgs"),
        ("spec.validations[0].expresion", "unknown property",
         "pulumi_kubernetes.admissionregistration.ValidationArgs"),
        ("spec.validations[0].expression", "required property missing",
         "pulumi_kubernetes.admissionregistration.ValidationArgs")]
    release = planned("kubernetes:helm.sh/v3:Release", {"chart": "kueue", "version": "1.0.0",
                                                        "repositoryOpts": {"repo": "https://x", "url": "y"}})
    assert problems(release) == [("repositoryOpts.url", "unknown property",
                                  "pulumi_kubernetes.helm.RepositoryOptsArgs")]
    assert problems(planned("kubernetes:core/v1:Namespace", {"metadata": {"name": "ml"}})) == []
    assert problems(planned("pulumi:providers:kubernetes", {"kubeconfig": "{}", "contxt": "x"})) == [
        ("contxt", "unknown property", "pulumi_kubernetes.provider.ProviderArgs")]


def test_sdk_modules_are_found_from_kubernetes_type_tokens() -> None:
    from gpucluster.conformance import sdktypes

    for token in ("kubernetes:helm.sh/v3:Release", "kubernetes:core/v1:Namespace", VAP,
                  "kubernetes:rbac.authorization.k8s.io/v1:Role"):
        assert sdktypes._imported_class(token) is not None, token
        assert not sdktypes.custom_resource(token)
    assert sdktypes.custom_resource("kubernetes:kueue.x-k8s.io/v1beta1:ClusterQueue")


def test_a_custom_resource_is_checked_against_its_pinned_schema() -> None:
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
             "metadata": {"name": "gpu", "namespace": "ml"}, "spec": {"clusterQueue": "gpu"}}
    token = "kubernetes:kueue.x-k8s.io/v1beta1:LocalQueue"
    assert problems(planned(token, queue)) == []
    broken = {**queue, "spec": {"clusterQueue": "gpu", "stopPolicy": "Pause", "queue": "x"}}
    found = {(path, problem) for path, problem, _ in problems(planned(token, broken))}
    assert found == {("spec.stopPolicy", "'Pause' is not one of None, Hold, HoldAndDrain"),
                     ("spec.queue", "unknown property")}
    [(path, problem, _)] = problems(planned("kubernetes:example.com/v1:Widget", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}))
    assert (path, problem) == ("-", "no pinned schema of example.com/v1 Widget ships with gpucluster")
