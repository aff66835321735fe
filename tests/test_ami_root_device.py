"""The launch templates' root volume goes on the AMI's own root device (#34 item 6, aws/amis.py):
DescribeImages' RootDeviceName through `aws.ec2.getAmi` by image id, for the compute groups and the
Slurm login nodes; under the mock engine the invoke answers as EC2 would for the image."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from base_config import base, plan_config
from gpucluster.plan import MOCK_AMI, PlanMocks

TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
AL2023 = "ami-0bbbbbbbbbbbbbbb2"
ROOTS = {AL2023: "/dev/xvda", MOCK_AMI: "/dev/sda1"}


def answering_images(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """getAmi answers each image's root device as EC2 would; the filters it was asked with, in order."""
    asked: list[Any] = []
    original = PlanMocks.call

    def call(self: PlanMocks, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:ec2/getAmi:getAmi":
            asked.append(args.args["filters"])
            [image] = args.args["filters"][0]["values"]
            return {"id": image, "imageId": image, "rootDeviceName": ROOTS[image]}
        return original(self, args)

    monkeypatch.setattr(PlanMocks, "call", call)
    return asked


def root_devices(plan: Any) -> dict[str, str]:
    return {r.name: r.inputs["blockDeviceMappings"][0]["deviceName"] for r in plan.of_type(TEMPLATE)}


def test_an_amazon_linux_group_maps_its_root_volume_to_xvda(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answering_images(monkeypatch)
    config = base()
    config["gpucluster:node_groups"][0]["ami_id"] = AL2023
    assert set(root_devices(plan_config(config)).values()) == {"/dev/xvda"}
    assert asked == [[{"name": "image-id", "values": [AL2023]}]]  # by id: no owner filter needed


def test_the_default_image_keeps_sda1(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answering_images(monkeypatch)
    assert set(root_devices(plan_config(base())).values()) == {"/dev/sda1"}
    assert asked == [[{"name": "image-id", "values": [MOCK_AMI]}]]  # the SSM parameter's image, looked up


def test_the_slurm_login_nodes_root_comes_from_its_ami(monkeypatch: pytest.MonkeyPatch) -> None:
    answering_images(monkeypatch)
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AL2023}
    devices = root_devices(plan_config(config))
    assert [name for name in devices if name.endswith("-login-lt")]
    assert set(devices.values()) == {"/dev/xvda"}  # the login template and the compute group's
