"""Baked images (gpucluster:images) and warm pools: the spec's rules, the component document, and the
plan of a baked variant of prod (Image Builder resources, the groups launching from the pinned image,
user data that installs, downloads and pulls nothing at launch)."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from base_config import plan_config
from fake_node import with_bundled_scripts
from gpucluster.cli import app
from gpucluster.node.bake import IMAGE_TAGS, BakeSettings, component_document
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError
from shipped import planned_config

REPO = Path(__file__).parent.parent
runner = CliRunner()
AMI = "ami-0123456789abcdef0"


def prod() -> dict[str, Any]:
    return yaml.safe_load((REPO / "stacks/Pulumi.prod.yaml").read_text())["config"]


def baked_prod(**images: Any) -> dict[str, Any]:
    config = prod()
    config["gpucluster:images"] = {"bake": True, "schedule": "cron(0 4 ? * SUN *)", "groups": {
        "h100-train": {"ami_id": AMI, "driver": "550.127.05", "cuda": "12.4"}, "eval": {"bake": False}},
        **images}
    return config


def problems(config: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="prod")
    return [str(f) for f in err.value.findings]


# ------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize(("images", "path", "message"), [
    ({"bake": True, "schedule": "every sunday"}, "images.schedule", "must be an EventBridge cron expression"),
    ({"bake": True, "groups": {"h100-trian": {}}}, "images.groups.h100-trian", "did you mean 'h100-train'"),
    ({"groups": {"eval": {"ami_id": AMI}}}, "images.groups.eval", "not baked"),
    ({"bake": True, "groups": {"eval": {"driver": "550.1"}}}, "images.groups.eval.ami_id", "set ami_id"),
    ({"bake": True, "build_instance_type": "m7i.large"}, "images.build_instance_type",
     "unknown instance type"),  # the catalog holds GPU types only
    ({"bake": True, "version": "1.0"}, "images.version", "semantic version"),
])
def test_bad_images_settings_are_one_finding_naming_the_key(images: dict[str, Any], path: str,
                                                            message: str) -> None:
    config = prod()
    config["gpucluster:images"] = images
    [finding] = problems(config)
    assert finding.startswith(f"{path}: ") and message in finding


def test_baking_a_group_on_a_base_the_recipe_cannot_install_on_is_refused() -> None:
    config = baked_prod()
    config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2/latest/ami-id")
    [finding] = problems(config)
    assert finding.startswith("node_groups[0].ami_ssm_parameter: ") and "Ubuntu" in finding
    config["gpucluster:images"]["groups"]["h100-train"]["bake"] = False  # opted out: fine
    del config["gpucluster:images"]["groups"]["h100-train"]["ami_id"]
    del config["gpucluster:images"]["groups"]["h100-train"]["driver"]
    del config["gpucluster:images"]["groups"]["h100-train"]["cuda"]
    parse_stack_config(config, stack="prod")


@pytest.mark.parametrize(("change", "message"), [
    ({"capacity": {"spot_percent": 100}}, "launches Spot Instances"),
    ({"instance_types": ["g6e.12xlarge", "g6e.24xlarge"]}, "needs one instance type"),
    ({"capacity": {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                   "duration_hours": 24}}, "Capacity Block"),
    ({"health_checks": {"enabled": False}}, "needs health_checks.enabled"),
])
def test_a_warm_pool_aws_would_refuse_is_refused(change: dict[str, Any], message: str) -> None:
    config = prod()
    group = config["gpucluster:node_groups"][1]
    group.update({"capacity": {"spot_percent": 0}, "warm_pool": {"min_size": 1}})
    group.update(change)
    found = [f for f in problems(config) if f.startswith("node_groups[1].warm_pool")]
    assert found and any(message in f for f in found), found


def test_baking_a_group_without_health_checks_is_refused() -> None:
    config = baked_prod()
    config["gpucluster:node_groups"][0]["health_checks"] = {"enabled": False}
    assert [f for f in problems(config) if f.startswith("node_groups[0].health_checks.enabled: ")]


def test_baking_without_a_way_out_of_the_private_subnet_is_refused() -> None:
    config = baked_prod()
    config["gpucluster:network"]["nat_gateway"] = False
    assert [f for f in problems(config) if f.startswith("images.bake: ")]


def test_bad_schedule_is_one_line_and_exit_2(write_stack: Callable[..., Path]) -> None:
    config = baked_prod(schedule="cron(0 4 * * SUN *)")  # day-of-month and day-of-week both set
    result = runner.invoke(app, ["plan", str(write_stack(config))])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if "images.schedule" in line]
    assert len(lines) == 1 and "Traceback" not in result.output


# ------------------------------------------------------------------------ the component


def test_the_component_installs_once_validates_and_records_the_driver() -> None:
    doc = yaml.safe_load(component_document(BakeSettings(
        node_group="h100-train", region="us-east-1", container_image="nvcr.io/nvidia/pytorch:24.12-py3",
        fsx=True, mount_s3=False, efa=True, build_gpus=1)))
    phases = {p["name"]: {s["name"]: s["inputs"]["commands"][0] for s in p["steps"]} for p in doc["phases"]}
    build = phases["build"]
    assert list(build) == ["DisableUnattendedUpgrades", "InstallNodeTools", "InstallDcgm", "CheckEfa",
                           "PullContainerImage"]
    assert "systemctl mask unattended-upgrades.service" in build["DisableUnattendedUpgrades"]
    assert "gpucluster-install lustre-client" in build["InstallNodeTools"]
    assert "gpucluster-install mount-s3" not in build["InstallNodeTools"]  # no mounted dataset
    assert "verified_download" in build["InstallNodeTools"]  # the same pinned, signature-checked installer
    assert "docker pull --quiet 'nvcr.io/nvidia/pytorch:24.12-py3'" in build["PullContainerImage"]
    assert "modinfo lustre" in phases["validate"]["CheckBaked"]
    test = phases["test"]["RecordGpuAndDriver"]
    for tag in IMAGE_TAGS:
        assert f"Key={tag}," in test
    assert "driver_version" in test and "CUDA Version" in test


def test_an_ecr_image_logs_in_to_its_own_registry() -> None:
    image = "123456789012.dkr.ecr.us-west-2.amazonaws.com/train:1"
    doc = component_document(BakeSettings("g", "us-east-1", image, False, False, False, 1))
    assert ("aws ecr get-login-password --region us-west-2 | docker login --username AWS --password-stdin "
            "123456789012.dkr.ecr.us-west-2.amazonaws.com") in doc


# ------------------------------------------------------------------------------ the plan


@pytest.fixture(scope="module")
def baked_plan() -> Any:
    return planned_config(baked_prod(), stack="prod")


def by_type(plan: Any, token: str) -> list[Any]:
    return [r for r in plan.resources if r.type == token]


def user_data(resource: Any) -> str:
    """A launch template's user data, with the scripts it installs from the bundle written out."""
    return with_bundled_scripts(gzip.decompress(base64.b64decode(resource.inputs["userData"])).decode())


def test_baked_prod_plans_image_builder_for_the_baked_group_only(baked_plan: Any) -> None:
    [pipeline] = by_type(baked_plan, "aws:imagebuilder/imagePipeline:ImagePipeline")
    assert pipeline.name == "gpu-prod-images-h100-train-pipeline"
    assert pipeline.inputs["schedule"] == {"scheduleExpression": "cron(0 4 ? * SUN *)", "timezone": "UTC",
                                           "pipelineExecutionStartCondition": "EXPRESSION_MATCH_ONLY"}
    assert pipeline.inputs["imageTestsConfiguration"]["imageTestsEnabled"] is True
    [infra] = by_type(baked_plan, "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration")
    assert infra.inputs["instanceMetadataOptions"]["httpTokens"] == "required"
    assert infra.inputs["subnetId"] == "gpu-prod-network-private-us-east-1d-id"
    assert infra.inputs["instanceTypes"] == ["g6.xlarge"]
    [recipe] = by_type(baked_plan, "aws:imagebuilder/imageRecipe:ImageRecipe")
    assert recipe.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 500
    assert recipe.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] is True
    [dist] = by_type(baked_plan, "aws:imagebuilder/distributionConfiguration:DistributionConfiguration")
    tags = dist.inputs["distributions"][0]["amiDistributionConfiguration"]["amiTags"]
    assert tags["gpucluster:stack"] and tags["gpucluster:node-group"] == "h100-train"
    [sg] = [r for r in by_type(baked_plan, "aws:ec2/securityGroup:SecurityGroup") if "build" in r.name]
    assert not sg.inputs.get("ingress") and {e["fromPort"] for e in sg.inputs["egress"]} == {80, 443}
    attached = {r.inputs["policyArn"]
                for r in by_type(baked_plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if "images" in r.name}
    assert attached == {"arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
                        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"}
    [role] = [r for r in by_type(baked_plan, "aws:iam/role:Role") if "images" in r.name]
    assert role.inputs["permissionsBoundary"].endswith(":policy/gpucluster-workload-boundary")
    [policy] = [r for r in by_type(baked_plan, "aws:iam/rolePolicy:RolePolicy")
                if r.name == "gpu-prod-images-build"]
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == ["ec2:CreateTags"]
    assert statement["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"] == list(IMAGE_TAGS)


def test_the_baked_group_launches_from_its_pin_and_installs_nothing(baked_plan: Any) -> None:
    templates = {r.name: r for r in by_type(baked_plan, "aws:ec2/launchTemplate:LaunchTemplate")}
    baked = templates["gpu-prod-h100-train-lt"]
    assert baked.inputs["imageId"] == AMI
    text = user_data(baked)
    start = text.index("GPUCLUSTER_STACK=")
    env = text[start:text.index("GPUCLUSTER_FILE_EOF", start)]
    assert "GPUCLUSTER_BAKED=true" in env and "GPUCLUSTER_CONTAINER_IMAGE=''" in env
    # No installer, no download, no pull on the launch path: the installer is the refusing one.
    assert "verified_download" not in text and "apt-get update" not in text
    assert "fsx-lustre-client-repo" not in text and "amazoncloudwatch-agent-" not in text
    assert "refusing to install" in text
    unbaked = user_data(templates["gpu-prod-eval-lt"])
    assert "GPUCLUSTER_BAKED" not in unbaked and "verified_download" in unbaked
    summary = baked_plan.outputs["node_groups"]["h100-train"]["image"]
    assert summary == {"baked": True, "ami_id": AMI, "driver": "550.127.05", "cuda": "12.4"}
    assert "image" not in baked_plan.outputs["node_groups"]["eval"]


def test_a_baked_group_without_a_pin_yet_keeps_the_unbaked_path() -> None:
    config = baked_prod()
    del config["gpucluster:images"]["groups"]["h100-train"]
    plan = plan_config(config, stack="prod")
    assert by_type(plan, "aws:imagebuilder/imagePipeline:ImagePipeline")
    [lt] = [r for r in by_type(plan, "aws:ec2/launchTemplate:LaunchTemplate") if "h100" in r.name]
    assert "GPUCLUSTER_BAKED" not in user_data(lt)
    assert plan.outputs["node_groups"]["h100-train"]["image"]["ami_id"] is None


def test_shipped_stacks_plan_no_image_builder() -> None:
    for stack in ("dev", "staging", "prod"):
        config = yaml.safe_load((REPO / f"stacks/Pulumi.{stack}.yaml").read_text())["config"]
        plan = planned_config(config, stack=stack)
        assert not [r for r in plan.resources if r.type.startswith("aws:imagebuilder")], stack
        assert not [r for r in plan.resources if r.type == "aws:autoscaling/group:Group"
                    and r.inputs.get("warmPool")], stack


def test_a_warm_pool_group_launches_one_type_from_a_plain_template() -> None:
    config = prod()
    config["gpucluster:node_groups"][1].update({"capacity": {"spot_percent": 0},
                                                "warm_pool": {"min_size": 2, "reuse_on_scale_in": True}})
    plan = plan_config(config, stack="prod")
    [asg] = [r for r in by_type(plan, "aws:autoscaling/group:Group") if "eval" in r.name]
    assert asg.inputs["warmPool"] == {"poolState": "Stopped", "minSize": 2, "maxGroupPreparedCapacity": -1,
                                      "instanceReusePolicy": {"reuseOnScaleIn": True}}
    assert "mixedInstancesPolicy" not in asg.inputs and asg.inputs["launchTemplate"]["version"] == "$Latest"
    [lt] = [r for r in by_type(plan, "aws:ec2/launchTemplate:LaunchTemplate") if "eval" in r.name]
    assert lt.inputs["instanceType"] == "g6e.12xlarge"
    assert "GPUCLUSTER_READY_GATE=true" in user_data(lt)


# ------------------------------------------------------------------------------ the cost


def test_warm_pool_ebs_and_image_builds_are_in_the_cost_model() -> None:
    from gpucluster.pricing import price_stack

    config = baked_prod()
    config["gpucluster:node_groups"][1].update({"capacity": {"spot_percent": 0}, "desired_nodes": 1,
                                                "warm_pool": {"min_size": 1, "max_prepared": 3}})
    cost = price_stack(parse_stack_config(config, stack="prod"))
    other = {o.name: o for o in cost.other}
    pool = other["Warm pool eval"]
    # 3 prepared less the 1 running = 2 stopped x 200 GiB x $0.08; at max nodes (4) the floor, 1.
    assert (pool.kind, pool.desired_usd_per_month, pool.max_usd_per_month) == ("warm_pool", 32.0, 16.0)
    builds = other["Image builds"]
    # one baked group (eval opts out), weekly: 4.35 builds x 1.5 h x g6.xlarge on-demand
    assert builds.desired_usd_per_month == pytest.approx(4.35 * 1.5 * 0.805, rel=1e-3)
    unbaked = price_stack(parse_stack_config(prod(), stack="prod"))
    assert not [o for o in unbaked.other if o.kind in ("warm_pool", "images")]


def test_plan_says_which_image_each_group_launches_from(write_stack: Callable[..., Path],
                                                        cli_plans_once: None) -> None:
    result = runner.invoke(app, ["plan", str(write_stack(baked_prod(), "prod"))])
    assert result.exit_code == 0, result.output
    tail = result.output[result.output.index("images (EC2 Image Builder):"):]
    assert f"h100-train: launches from {AMI} (driver 550.127.05, CUDA 12.4), installs nothing" in tail
    assert "eval: not baked: installs at boot" in tail
    plain = runner.invoke(app, ["plan", str(write_stack(prod(), "prod"))])
    assert "images (EC2 Image Builder)" not in plain.output


# ------------------------------------------------------- unbaked: unattended upgrades stopped first


APT_UNITS = ("unattended-upgrades.service apt-daily.timer apt-daily.service apt-daily-upgrade.timer "
             "apt-daily-upgrade.service")


def apt_block() -> str:
    from gpucluster.node.userdata import script

    text = script("bootstrap.sh")
    start = text.index("apt=(")
    return text[start:text.index("\n", text.index("systemctl stop", start)) + 1]


@pytest.mark.parametrize("stop_fails", [False, True])
def test_unattended_upgrades_are_stopped_and_masked_before_anything_installs(tmp_path: Path,
                                                                             stop_fails: bool) -> None:
    import os
    import subprocess

    from gpucluster.node.userdata import script

    log = tmp_path / "calls"
    (tmp_path / "systemctl").write_text(f'#!/bin/bash\necho "systemctl $*" >> {log}\n'
                                        + ('[ "$1" != stop ]\n' if stop_fails else ""))
    (tmp_path / "systemctl").chmod(0o755)
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + apt_block() + "echo next"],
                          env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.endswith("next\n")  # never stops the bootstrap
    calls = log.read_text().splitlines()
    if stop_fails:
        assert calls == [f"systemctl stop {APT_UNITS}"] and "apt not stopped" in done.stdout
    else:
        assert calls == [f"systemctl stop {APT_UNITS}", f"systemctl mask {APT_UNITS}"]
    text = script("bootstrap.sh")  # before the first unit that installs starts
    assert text.index("apt=(") < text.index("gpucluster-mig.service") < text.index("gpucluster-agent.service")


def test_groups_without_the_gate_get_no_gate_lines(baked_plan: Any) -> None:
    templates = {r.name: user_data(r) for r in by_type(baked_plan, "aws:ec2/launchTemplate:LaunchTemplate")}
    assert "health-launch.ok" in templates["gpu-prod-h100-train-lt"]
    assert "health-launch.ok" not in templates["gpu-prod-eval-lt"]
    assert "Warmed:Pending:Wait" not in templates["gpu-prod-eval-lt"]
