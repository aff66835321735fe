"""Baked images on Ubuntu 22.04/24.04 and Amazon Linux 2023 (#34 item 6): the Image Builder component
follows the base image's operating system through the same gpucluster-os the node scripts use.

Each step's commands run for real under bash, their absolute paths moved under the test's directory, the
operating system a fake /etc/os-release (fake_node.OS_RELEASES), and systemctl, apt-get, dnf, docker and
gpucluster-install stubs that log their calls (as in test_node_os.py). Then the spec's base check and the
recipe's root device and supported OS versions in the plan.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_node import logged_calls, write_stubs
from gpucluster.node.bake import (
    CWA_CTL,
    MAX_COMPONENT_CHARS,
    BakeSettings,
    build_steps,
    component_document,
    validate_steps,
)
from gpucluster.node.userdata import OS_TOOL, script
from test_images import AMI, baked_prod, plan_config, problems

SETTINGS = dict(node_group="g", region="us-east-1", container_image="nvcr.io/nvidia/pytorch:24.12-py3",
                fsx=True, mount_s3=False, efa=False, build_gpus=1)
SUPPORTED = ("ubuntu-22.04", "ubuntu-24.04", "al2023")


class Build:
    """One build instance: a root the steps' absolute paths are moved under, and its stubs."""

    def __init__(self, tmp_path: Path, system: str) -> None:
        from fake_node import OS_RELEASES
        self.root, self.log, self.bin = tmp_path, tmp_path / "calls.log", tmp_path / "bin"
        (tmp_path / "etc/apt/apt.conf.d").mkdir(parents=True)
        (tmp_path / "etc/os-release").write_text(OS_RELEASES[system])
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin",
                    "GPUCLUSTER_OS_RELEASE": str(tmp_path / "etc/os-release"),
                    "GPUCLUSTER_RETRY_SECONDS": "0"}
        write_stubs(self.bin, self.log, {"systemctl": "", "apt-get": "", "dnf": "", "logger": "",
                                         "modinfo": "exit 1"})

    def moved(self, commands: str) -> str:
        for path in ("/usr/local/sbin", "/etc/gpucluster", "/etc/apt", "/etc/os-release", "/opt/aws"):
            commands = commands.replace(path, f"{self.root}{path}")
        return commands

    def run(self, step: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", self.moved(step["inputs"]["commands"][0])], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)


def step(name: str, settings: BakeSettings | None = None) -> dict[str, Any]:
    s = settings or BakeSettings(**SETTINGS)  # type: ignore[arg-type]
    [found] = [x for x in build_steps(s) + validate_steps(s) if x["name"] == name]
    return found


def first_step(box: Build) -> subprocess.CompletedProcess[str]:
    return box.run(step("DisableUnattendedUpgrades"))


def with_os_tool(box: Build) -> Build:
    """gpucluster-os as InstallNodeTools leaves it (the steps after it ask it)."""
    tool = box.root / OS_TOOL.lstrip("/")
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(script("os.sh"))
    tool.chmod(0o755)
    return box


@pytest.mark.parametrize("system", ["ubuntu-22.04", "ubuntu-24.04"])
def test_on_ubuntu_the_first_step_masks_apts_own_updates(tmp_path: Path, system: str) -> None:
    box = Build(tmp_path, system)
    result = first_step(box)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [c.split()[0] for c in box.calls("systemctl")] == ["stop", "disable", "mask"]
    assert "Unattended-Upgrade \"0\"" in (tmp_path / "etc/apt/apt.conf.d/20auto-upgrades").read_text()


def test_on_al2023_the_first_step_stops_nothing(tmp_path: Path) -> None:
    box = Build(tmp_path, "al2023")
    result = first_step(box)
    assert result.returncode == 0, result.stdout + result.stderr
    assert box.calls("systemctl") == [] and result.stdout == "amzn: no automatic package updates to stop\n"
    assert not (tmp_path / "etc/apt/apt.conf.d/20auto-upgrades").exists()


@pytest.mark.parametrize(("system", "named"), [("al2", "Amazon Linux 2"), ("rocky-9", "Rocky Linux 9.4")])
def test_an_unsupported_base_stops_the_bake_before_anything_installs(tmp_path: Path, system: str,
                                                                     named: str) -> None:
    box = Build(tmp_path, system)
    assert first_step(box).returncode == 0 and box.calls("systemctl") == []  # not Ubuntu: nothing masked
    result = box.run(step("InstallNodeTools"))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"unsupported operating system {named}")
    for command in ("dnf", "apt-get", "dpkg", "curl"):
        assert box.calls(command) == [], command


@pytest.mark.parametrize(("system", "manager", "calls"), [
    ("ubuntu-22.04", "apt-get", ["-o DPkg::Lock::Timeout=600 update",
                                 "-o DPkg::Lock::Timeout=600 install -y datacenter-gpu-manager"]),
    ("ubuntu-24.04", "apt-get", ["-o DPkg::Lock::Timeout=600 update",
                                 "-o DPkg::Lock::Timeout=600 install -y datacenter-gpu-manager"]),
    ("al2023", "dnf", ["install -y datacenter-gpu-manager"]),
])
def test_dcgm_comes_from_the_bases_own_package_manager(tmp_path: Path, system: str, manager: str,
                                                       calls: list[str]) -> None:
    if Path("/usr/bin/dcgmi").exists():
        pytest.skip("this machine has DCGM")
    box = with_os_tool(Build(tmp_path, system))
    result = box.run(step("InstallDcgm"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert box.calls(manager) == calls
    other = "dnf" if manager == "apt-get" else "apt-get"
    assert box.calls(other) == []


def test_al2023_installs_the_node_tools_with_dnf(tmp_path: Path) -> None:
    box = Build(tmp_path, "al2023")
    assert first_step(box).returncode == 0
    result = box.run(step("InstallNodeTools"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert box.calls("dnf") == ["install -y amazon-cloudwatch-agent", "install -y lustre-client"]
    assert box.calls("apt-get") == [] and box.calls("dpkg") == []


@pytest.mark.parametrize("system", SUPPORTED)
def test_the_image_pull_installs_docker_first_where_the_base_has_none(tmp_path: Path, system: str) -> None:
    if Path("/usr/bin/docker").exists() or Path("/bin/docker").exists():
        pytest.skip("this machine has Docker")
    box = Build(tmp_path, system)
    (tmp_path / "usr/local/sbin").mkdir(parents=True)
    install = tmp_path / "usr/local/sbin/gpucluster-install"
    # What gpucluster-install container-runtime leaves: a docker on the PATH.
    install.write_text(f'#!/bin/bash\necho "gpucluster-install $*" >> {box.log}\n'
                       f'printf \'#!/bin/bash\\necho "docker $*" >> {box.log}\\n\' > {box.bin}/docker\n'
                       f"chmod +x {box.bin}/docker\n")
    install.chmod(0o755)
    result = box.run(step("PullContainerImage"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split()[0] for line in box.log.read_text().splitlines()] == [
        "gpucluster-install", "systemctl", "docker"]
    assert box.calls("docker") == ["pull --quiet nvcr.io/nvidia/pytorch:24.12-py3"]


@pytest.mark.parametrize(("system", "masked", "missing"), [
    ("ubuntu-22.04", "masked", ""), ("ubuntu-24.04", "enabled", "unattended-upgrades-masked"),
    ("al2023", "enabled", ""),  # nothing of apt's to mask there
])
def test_the_validate_phase_asks_for_apts_mask_on_ubuntu_only(tmp_path: Path, system: str, masked: str,
                                                               missing: str) -> None:
    box = with_os_tool(Build(tmp_path, system))
    write_stubs(box.bin, box.log, {"systemctl": f"echo {masked}", "dcgmi": "", "modinfo": "",
                                   "docker": ""})
    ctl = tmp_path / CWA_CTL.lstrip("/")
    ctl.parent.mkdir(parents=True)
    ctl.write_text("#!/bin/bash\n")
    ctl.chmod(0o755)
    result = box.run(step("CheckBaked"))
    if missing:
        assert result.returncode == 1 and result.stdout == f"missing: {missing}\n"
    else:
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_pcs_installers_are_the_same_on_both_families() -> None:
    doc = yaml.safe_load(component_document(BakeSettings(**{**SETTINGS, "slurm_version": "24.11"})))
    [pcs] = [s["inputs"]["commands"][0] for p in doc["phases"] for s in p["steps"]
             if s["name"] == "InstallAwsPcs"]
    for manager in ("apt-get", "dpkg", "dnf"):
        assert manager not in pcs


def test_the_largest_component_fits_image_builders_limit() -> None:
    doc = component_document(BakeSettings(
        node_group="a-long-group-name", region="ap-southeast-2",
        container_image="123456789012.dkr.ecr.ap-southeast-2.amazonaws.com/a/long/repository:tag-2024.12",
        fsx=True, mount_s3=True, efa=True, build_gpus=8, lustre_key_fingerprints=("A" * 40, "B" * 40),
        slurm_version="24.11"))
    assert len(doc) <= MAX_COMPONENT_CHARS


# ------------------------------------------------------------------- the spec and the plan


def test_an_amazon_linux_2023_dlami_base_may_be_baked() -> None:
    from gpucluster.preflight import parse_stack_config
    config = baked_prod()
    config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id")
    parse_stack_config(config, stack="prod")


def test_an_amazon_linux_2_dlami_base_is_refused_naming_the_key() -> None:
    config = baked_prod()
    config["gpucluster:node_groups"][0]["ami_ssm_parameter"] = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2/latest/ami-id")
    [finding] = problems(config)
    assert finding.startswith("node_groups[0].ami_ssm_parameter: ")
    assert "Ubuntu or Amazon Linux 2023" in finding


def test_the_recipe_puts_the_root_volume_on_the_bases_root_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_ami_root_device import ROOTS, answering_images
    al2023 = "ami-0bbbbbbbbbbbbbbb2"
    answering_images(monkeypatch)
    monkeypatch.setitem(ROOTS, AMI, "/dev/sda1")
    config = baked_prod()
    group = config["gpucluster:node_groups"][0]
    group["ami_id"] = al2023
    plan = plan_config(config, stack="prod")
    recipes = {r.name: r for r in plan.resources if r.type == "aws:imagebuilder/imageRecipe:ImageRecipe"}
    recipe = next(r for name, r in recipes.items() if group["name"] in name)
    assert recipe.inputs["blockDeviceMappings"][0]["deviceName"] == "/dev/xvda"
    [component] = [r for r in plan.resources if r.type == "aws:imagebuilder/component:Component"
                   and group["name"] in r.name]
    # No OS version list Image Builder would prefix-match against names not checkable here: the
    # component's own first step refuses an unsupported OS.
    assert "supportedOsVersions" not in component.inputs
