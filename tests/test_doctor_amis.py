"""`doctor` reads each AMI a stack boots (#34 item 6): DescribeImages through Stubber (answers checked
against the API model), faults included, and what ops.amis makes of real images' names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from fake_node import OS_RELEASES
from gpucluster.ops.amis import SUPPORTED, ami_facts, describe_amis, os_of
from gpucluster.ops.doctor import IAM_ACTIONS, check_amis, stack_images
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec

UBUNTU = "ami-0aaaaaaaaaaaaaaa1"
AL2023 = "ami-0bbbbbbbbbbbbbbb2"
OTHER = "ami-0ccccccccccccccc3"

IMAGES = {
    "Ubuntu 22.04": ("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20241115", "", "/dev/sda1"),
    "Ubuntu 24.04": ("ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20241119",
                     "Canonical, Ubuntu, 24.04, amd64 noble image", "/dev/sda1"),
    "Amazon Linux 2023": ("al2023-ami-2023.6.20241212.0-kernel-6.1-x86_64", "Amazon Linux 2023 AMI",
                          "/dev/xvda"),
    "Amazon Linux 2": ("amzn2-ami-kernel-5.10-hvm-2.0.20241113.1-x86_64-gp2", "Amazon Linux 2 AMI",
                       "/dev/xvda"),
}


def image(image_id: str, name: str, description: str = "", root: str = "/dev/sda1",
          platform: str = "Linux/UNIX") -> dict[str, Any]:
    return {"ImageId": image_id, "Name": name, "Description": description, "PlatformDetails": platform,
            "RootDeviceName": root, "State": "available"}


def slurm_stack(base_config: dict[str, Any], ami: str, prometheus: bool = False) -> StackSpec:
    base_config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": ami}
    if prometheus:
        base_config["gpucluster:observability"] = {"prometheus": {
            "enabled": True,
            "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9@sha256:" + "ab" * 32}}
    return parse_stack_config(base_config, stack="t")


def stubbed_ec2(*answers: tuple[str, dict[str, Any] | str]) -> tuple[Any, Stubber]:
    """An EC2 client answering DescribeImages per id: an image, or an error code."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    for image_id, answer in answers:
        if isinstance(answer, str):
            stub.add_client_error("describe_images", answer, answer, expected_params={"ImageIds": [image_id]})
        else:
            stub.add_response("describe_images", {"Images": [answer]}, {"ImageIds": [image_id]})
    stub.activate()
    return ec2, stub


@pytest.mark.parametrize("system", sorted(IMAGES))
def test_the_os_is_read_from_the_image_name_and_description(system: str) -> None:
    name, description, root = IMAGES[system]
    facts = ami_facts(image(UBUNTU, name, description, root))
    assert facts.os == system and facts.root_device_name == root
    assert facts.supported == (system in SUPPORTED)
    assert facts.job_user == {"Ubuntu 22.04": "ubuntu", "Ubuntu 24.04": "ubuntu",
                              "Amazon Linux 2023": "ec2-user"}.get(system)


def test_names_that_say_no_os_and_other_platforms() -> None:
    assert os_of("my-golden-image-2024-11", "built by the platform team") is None
    assert os_of("amazon-eks-node-al2023-x86_64-nvidia-1.31-v20241121") == "Amazon Linux 2023"
    assert os_of("aws-pcs-sample_ami-al2023-x86_64-slurm-24.11") == "Amazon Linux 2023"
    assert os_of("Windows_Server-2022", "", "Windows") == "Windows"
    assert os_of("RHEL-9.4.0_HVM", "", "Red Hat Enterprise Linux") == "Red Hat Enterprise Linux"
    default = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    assert os_of(default) == "Ubuntu 22.04"


def test_the_supported_list_is_the_node_scripts() -> None:
    """ops.amis.SUPPORTED and node/os.sh name the same systems, families and job users."""
    text = (Path(__file__).parent.parent / "components/gpucluster/node/os.sh").read_text()
    shell = set(re.findall(r"\) family=(\w+) user=([\w-]+) ;;", text))
    assert shell == set(SUPPORTED.values())
    assert "Ubuntu 22.04, Ubuntu 24.04 or Amazon Linux 2023" in text
    assert set(OS_RELEASES) >= {"ubuntu-22.04", "ubuntu-24.04", "al2023"}


def test_each_group_and_the_login_nodes_boot_the_image_the_launch_templates_take(
        base_config: dict[str, Any]) -> None:
    assert stack_images(parse_stack_config(base_config, stack="t")) == {"gpu": None}
    spec = slurm_stack(base_config, AL2023)
    assert stack_images(spec) == {"gpu": AL2023, "login": AL2023}


@pytest.mark.parametrize(("system", "level"), [("Ubuntu 24.04", "ok"), ("Amazon Linux 2023", "ok"),
                                               ("Amazon Linux 2", "blocker")])
def test_doctor_says_which_os_the_ami_boots_and_whether_it_is_supported(
        base_config: dict[str, Any], system: str, level: str) -> None:
    name, description, root = IMAGES[system]
    ec2, stub = stubbed_ec2((AL2023, image(AL2023, name, description, root)))
    findings = list(check_amis(slurm_stack(base_config, AL2023), ec2))
    stub.assert_no_pending_responses()  # one call for the image both the group and the login nodes boot
    assert [(f.level, f.check, f.subject) for f in findings] == [(level, "ami", "gpu"),
                                                                  (level, "ami", "login")]
    message = findings[0].message
    assert f"boots {system}" in message and name in message and f"root {root}" in message
    if level == "ok":
        assert f"jobs run as {SUPPORTED[system][1]}" in message
    else:
        assert "Ubuntu 22.04, Ubuntu 24.04, Amazon Linux 2023" in message and "FAILED" in message


def test_an_image_whose_name_says_nothing_warns(base_config: dict[str, Any]) -> None:
    ec2, _ = stubbed_ec2((OTHER, image(OTHER, "golden-2024-11", "our own", "/dev/sda1")))
    [group, login] = check_amis(slurm_stack(base_config, OTHER), ec2)
    assert group.level == login.level == "warning" and "name no operating system" in group.message


def test_a_windows_image_blocks(base_config: dict[str, Any]) -> None:
    ec2, _ = stubbed_ec2((OTHER, image(OTHER, "Windows_Server-2022-English-Full-Base", "", "/dev/sda1",
                                       "Windows")))
    assert {f.level for f in check_amis(slurm_stack(base_config, OTHER), ec2)} == {"blocker"}


def test_al2023_with_prometheus_warns_that_its_nodes_send_no_metrics(base_config: dict[str, Any]) -> None:
    name, description, root = IMAGES["Amazon Linux 2023"]
    ec2, _ = stubbed_ec2((AL2023, image(AL2023, name, description, root)))
    findings = list(check_amis(slurm_stack(base_config, AL2023, prometheus=True), ec2))
    warned = [f for f in findings if f.level == "warning"]
    assert [f.subject for f in warned] == ["gpu"]  # the login node runs no exporter
    assert "no Prometheus package" in warned[0].message


def test_an_image_that_does_not_exist_blocks(base_config: dict[str, Any]) -> None:
    ec2, _ = stubbed_ec2((AL2023, "InvalidAMIID.NotFound"))
    findings = list(check_amis(slurm_stack(base_config, AL2023), ec2))
    assert [f.level for f in findings] == ["blocker", "blocker"]
    assert "no such image in us-east-1" in findings[0].message


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "RequestLimitExceeded", "InternalError"])
def test_describe_images_refused_is_could_not_check(base_config: dict[str, Any], code: str) -> None:
    ec2, _ = stubbed_ec2((AL2023, code))
    [finding] = check_amis(slurm_stack(base_config, AL2023), ec2)
    assert finding.level == "warning" and finding.message.startswith(f"could not check ({code}")


def test_a_stack_on_the_default_image_asks_ec2_nothing(base_config: dict[str, Any]) -> None:
    ec2, stub = stubbed_ec2()
    [finding] = check_amis(parse_stack_config(base_config, stack="t"), ec2)
    assert finding.level == "ok" and "Ubuntu 22.04" in finding.message
    stub.assert_no_pending_responses()


def test_an_ssm_parameter_is_judged_by_its_name(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id")
    [finding] = check_amis(parse_stack_config(base_config, stack="t"), stubbed_ec2()[0])
    assert finding.level == "ok" and "Amazon Linux 2023" in finding.message
    base_config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = "/platform/golden-gpu-image/latest"
    [finding] = check_amis(parse_stack_config(base_config, stack="t"), stubbed_ec2()[0])
    assert finding.level == "warning" and "names no operating system" in finding.message
    base_config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id")
    [finding] = check_amis(parse_stack_config(base_config, stack="t"), stubbed_ec2()[0])
    assert finding.level == "ok" and "Ubuntu 24.04" in finding.message


def test_describe_amis_leaves_out_an_unknown_id_and_raises_other_errors() -> None:
    from botocore.exceptions import ClientError

    ec2, _ = stubbed_ec2((UBUNTU, image(UBUNTU, *IMAGES["Ubuntu 22.04"])), (OTHER, "InvalidAMIID.Malformed"))
    assert list(describe_amis(ec2, [UBUNTU, OTHER])) == [UBUNTU]
    ec2, _ = stubbed_ec2((UBUNTU, "AuthFailure"))
    with pytest.raises(ClientError):
        describe_amis(ec2, [UBUNTU])
    assert "ec2:DescribeImages" in IAM_ACTIONS
