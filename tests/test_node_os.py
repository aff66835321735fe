"""Node scripts on Ubuntu 22.04/24.04 and Amazon Linux 2023 (#34 item 6), run for real under bash.

The operating system comes from a fake /etc/os-release (fake_node.OS_RELEASES, read by the shipped
gpucluster-os); apt-get, dpkg, dnf, curl, gpg and systemctl are stubs that log their calls, as in
tests/test_node_downloads.py. Each OS family is checked by what the scripts call, and a system
gpucluster does not support by what they refuse to do.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fake_node import OS_RELEASES, os_env, write_stubs
from gpucluster.node.bake import BakeSettings, build_steps
from gpucluster.node.userdata import OS_TOOL, node_files, render_user_data, script
from test_bootstrap import Sandbox, lint, settings
from test_node_downloads import CWA_KEY, MOUNTPOINT_KEYS, lustre_sandbox, sandbox

SUPPORTED = {"ubuntu-22.04": ("ubuntu", "ubuntu"), "ubuntu-24.04": ("ubuntu", "ubuntu"),
             "al2023": ("al2023", "ec2-user")}
UNSUPPORTED = {"al2": "Amazon Linux 2", "ubuntu-20.04": "Ubuntu 20.04.6 LTS", "rocky-9": "Rocky Linux 9.4"}


def os_tool(tmp_path: Path, system: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = os_env(tmp_path, system)
    return subprocess.run(["bash", env["GPUCLUSTER_OS_TOOL"], *args], env=env, capture_output=True,
                          text=True, timeout=10)


def on(box: Sandbox, system: str) -> Sandbox:
    """`box` with its node scripts seeing `system`."""
    box.env |= os_env(box.root / "os", system)
    return box


def test_os_script_lints_clean(tmp_path: Path) -> None:
    path = tmp_path / "os.sh"
    path.write_text(script("os.sh"))
    lint(path)


@pytest.mark.parametrize("system", sorted(SUPPORTED))
def test_the_os_is_read_from_os_release_with_its_job_user(tmp_path: Path, system: str) -> None:
    family, user = SUPPORTED[system]
    assert os_tool(tmp_path, system).stdout == f"{family}\n"
    assert os_tool(tmp_path, system, "family").stdout == f"{family}\n"
    assert os_tool(tmp_path, system, "user").stdout == f"{user}\n"


@pytest.mark.parametrize("system", sorted(UNSUPPORTED))
def test_an_unsupported_os_is_refused_in_one_line_naming_it(tmp_path: Path, system: str) -> None:
    result = os_tool(tmp_path, system)
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert f"unsupported operating system {UNSUPPORTED[system]}" in line
    assert "Ubuntu 22.04, Ubuntu 24.04 or Amazon Linux 2023" in line


def test_a_missing_os_release_is_unsupported(tmp_path: Path) -> None:
    env = {**os_env(tmp_path), "GPUCLUSTER_OS_RELEASE": str(tmp_path / "absent")}
    result = subprocess.run(["bash", env["GPUCLUSTER_OS_TOOL"]], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "unsupported operating system unknown" in result.stderr


def test_every_node_ships_the_os_tool_and_the_bake_writes_it_beside_the_installer() -> None:
    files = {f.path: f for f in node_files(settings())}
    assert files[OS_TOOL].content == script("os.sh") and files[OS_TOOL].mode == "0755"
    assert files[OS_TOOL].member == "os.sh"
    [tools] = [s for s in build_steps(BakeSettings(
        node_group="g", region="us-east-1", container_image=None, fsx=False, mount_s3=False, efa=False,
        build_gpus=1)) if s["name"] == "InstallNodeTools"]
    commands = tools["inputs"]["commands"][0]
    assert f"cat > {OS_TOOL} <<'GPUCLUSTER_FILE_EOF'\n{script('os.sh')}GPUCLUSTER_FILE_EOF\n" in commands
    assert commands.index(OS_TOOL) < commands.index("gpucluster-install cloudwatch-agent")


# ------------------------------------------------------------------ bootstrap


def boot_prefix(user_data: str, root: Path) -> str:
    """The bootstrap from the OS check to the first unit it starts, with gpucluster-os moved under
    `root` and systemctl a stub: what a node runs right after writing its files."""
    start = user_data.index("systemctl daemon-reload\n")
    end = user_data.index("mig_failed=")
    return user_data[start:end].replace(OS_TOOL, str(root / "os" / "gpucluster-os"))


@pytest.mark.parametrize("system", sorted(UNSUPPORTED))
def test_the_boot_stops_on_an_unsupported_os_with_one_failed_line(tmp_path: Path, system: str) -> None:
    box = on(Sandbox(tmp_path), system)
    write_stubs(box.bin, box.log, {"systemctl": "true"})
    result = subprocess.run(["bash", "-euc", boot_prefix(render_user_data(settings()), tmp_path)],
                            env=box.env, capture_output=True, text=True, timeout=10)
    assert result.returncode == 1
    [failed] = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert failed.startswith("gpucluster bootstrap: FAILED: unsupported operating system ")
    assert UNSUPPORTED[system] in failed and result.stdout.count("\n") == 1
    assert box.calls("systemctl") == ["daemon-reload"]  # nothing stopped, masked or started


@pytest.mark.parametrize(("system", "masks"), [("ubuntu-24.04", True), ("al2023", False)])
def test_only_ubuntu_has_its_package_timers_masked(tmp_path: Path, system: str, masks: bool) -> None:
    box = on(Sandbox(tmp_path), system)
    write_stubs(box.bin, box.log, {"systemctl": "true"})
    result = subprocess.run(["bash", "-euc", boot_prefix(render_user_data(settings()), tmp_path)],
                            env=box.env, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(c.startswith("mask unattended-upgrades.service") for c in box.calls("systemctl")) == masks


# ------------------------------------------------------------------ gpucluster-install


def test_al2023_installs_the_cloudwatch_agent_with_dnf_from_its_own_repository(tmp_path: Path) -> None:
    box = on(sandbox(tmp_path, CWA_KEY), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "true"})
    result = box.run("install.sh", "cloudwatch-agent")
    assert result.returncode == 0, result.stderr + result.stdout
    assert box.calls("dnf") == ["install -y amazon-cloudwatch-agent"]
    assert box.calls("curl") == [] and box.calls("dpkg") == [] and box.calls("apt-get") == []


def test_ubuntu_24_04_takes_the_signed_deb_path(tmp_path: Path) -> None:
    box = on(sandbox(tmp_path, CWA_KEY), "ubuntu-24.04")
    write_stubs(box.bin, box.log, {"dnf": "true"})
    assert box.run("install.sh", "cloudwatch-agent").returncode == 0
    assert box.calls("curl")[-1].endswith("/ubuntu/amd64/1.300072.0b1766/amazon-cloudwatch-agent.deb")
    assert box.calls("dpkg") and box.calls("dnf") == []


@pytest.mark.parametrize("signer", MOUNTPOINT_KEYS)
def test_al2023_installs_mountpoint_from_the_signed_rpm(tmp_path: Path, signer: str) -> None:
    box = on(sandbox(tmp_path, signer), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "true"})
    result = box.run("install.sh", "mount-s3")
    assert result.returncode == 0, result.stderr + result.stdout
    base = "https://s3.amazonaws.com/mountpoint-s3-release"
    assert [c.split()[-1] for c in box.calls("curl")] == [
        f"{base}/public_keys/KEYS", f"{base}/1.18.0/x86_64/mount-s3-1.18.0-x86_64.rpm.asc",
        f"{base}/1.18.0/x86_64/mount-s3-1.18.0-x86_64.rpm"]
    [install] = box.calls("dnf")
    [verify] = [c for c in box.calls("gpg") if "--verify" in c]
    assert re.fullmatch(r"install -y \S+/mount-s3-1\.18\.0-x86_64\.rpm", install)
    assert install.split()[-1] == verify.split()[-1]  # the file that was checked
    assert box.calls("apt-get") == []


def test_al2023_never_installs_a_mountpoint_rpm_that_does_not_verify(tmp_path: Path) -> None:
    box = on(sandbox(tmp_path, CWA_KEY), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "true"})
    result = box.run("install.sh", "mount-s3")
    assert result.returncode == 1 and box.calls("dnf") == []
    rpm = "https://s3.amazonaws.com/mountpoint-s3-release/1.18.0/x86_64/mount-s3-1.18.0-x86_64.rpm"
    assert f"refusing {rpm}" in result.stdout


@pytest.mark.parametrize("pinned", ["", "A" * 40])
def test_al2023_installs_the_lustre_client_from_its_own_repository(tmp_path: Path, pinned: str) -> None:
    box = on(lustre_sandbox(tmp_path, ["A" * 40], pinned), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "true"})
    result = box.run("install.sh", "lustre-client")
    assert result.returncode == 0, result.stderr + result.stdout
    assert box.calls("dnf") == ["install -y lustre-client"]
    assert box.calls("curl") == [] and box.calls("apt-get") == [] and box.calls("gpg") == []
    assert not (tmp_path / "sources/fsxlustreclientrepo.list").exists()
    assert ("fsx.client_key_fingerprints not used" in result.stdout) == bool(pinned)


def test_a_failing_dnf_is_tried_again_then_fails_the_step(tmp_path: Path) -> None:
    box = on(sandbox(tmp_path, CWA_KEY), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "exit 1"})
    box.env |= {"GPUCLUSTER_RETRY_SECONDS": "0"}
    result = box.run("install.sh", "cloudwatch-agent")
    assert result.returncode == 1
    assert box.calls("dnf") == ["install -y amazon-cloudwatch-agent"] * 3
    assert box.calls("fuser") == []  # dnf waits for its own lock; the dpkg locks are Ubuntu's
    assert "giving up after 3 attempts: dnf install -y amazon-cloudwatch-agent" in result.stdout


@pytest.mark.parametrize(("system", "manager", "call"), [
    ("ubuntu-22.04", "apt-get", "-o DPkg::Lock::Timeout=600 install -y --no-install-recommends docker.io"),
    ("al2023", "dnf", "install -y docker"),
])
def test_the_container_runtime_comes_from_the_os_package_manager(tmp_path: Path, system: str, manager: str,
                                                                 call: str) -> None:
    box = on(sandbox(tmp_path, None), system)
    write_stubs(box.bin, box.log, {"dnf": "true", "systemctl": "true"})
    box.env["PATH"] = f"{box.bin}:/usr/bin:/bin"
    if Path("/usr/bin/docker").exists() or Path("/bin/docker").exists():
        pytest.skip("this machine has Docker: the AMI-has-it path would run")
    result = box.run("install.sh", "container-runtime")
    assert result.returncode == 0, result.stderr + result.stdout
    assert box.calls(manager) == [call]
    assert box.calls("systemctl") == ["enable --now docker"]


def test_an_ami_with_docker_gets_no_container_runtime_installed(tmp_path: Path) -> None:
    box = on(sandbox(tmp_path, None), "al2023")
    write_stubs(box.bin, box.log, {"dnf": "true", "systemctl": "true", "docker": "true"})
    result = box.run("install.sh", "container-runtime")
    assert result.returncode == 0 and box.calls("dnf") == [] and box.calls("apt-get") == []
    assert "the AMI has Docker" in result.stdout


@pytest.mark.parametrize("component", ["cloudwatch-agent", "mount-s3", "lustre-client", "container-runtime"])
def test_nothing_is_installed_on_an_unsupported_os(tmp_path: Path, component: str) -> None:
    box = on(sandbox(tmp_path, CWA_KEY), "al2")
    write_stubs(box.bin, box.log, {"dnf": "true", "yum": "true", "systemctl": "true"})
    result = box.run("install.sh", component)
    assert result.returncode == 1
    assert "unsupported operating system Amazon Linux 2" in result.stderr
    for command in ("dnf", "yum", "apt-get", "dpkg", "curl", "systemctl"):
        assert box.calls(command) == [], command


# ------------------------------------------------------------------ metrics, setup


def test_metrics_on_al2023_say_why_and_install_nothing(tmp_path: Path) -> None:
    from test_prometheus_stack import START_STUBS, run_metrics
    stubs = {k: v for k, v in START_STUBS.items() if k not in ("prometheus", "prometheus-node-exporter")}
    result, log = run_metrics(tmp_path, "start", bodies={**stubs, "dnf": ""},
                              extra_env=os_env(tmp_path / "al", "al2023"))
    assert result.returncode == 1
    assert "NOT STARTED: no Prometheus package for this OS (al2023)" in result.stdout
    installers = ("apt-get", "dnf", "docker")
    assert not [line for line in log.read_text().splitlines() if line.split()[0] in installers]


def test_metrics_install_docker_first_where_the_ami_has_none(tmp_path: Path) -> None:
    from test_prometheus_stack import START_STUBS, run_metrics
    install = tmp_path / "fake-install"
    install.write_text(f'#!/bin/bash\necho "gpucluster-install $*" >> {tmp_path / "calls.log"}\n')
    install.chmod(0o755)
    stubs = {k: v for k, v in START_STUBS.items() if k != "docker"}
    if Path("/usr/bin/docker").exists() or Path("/bin/docker").exists():
        pytest.skip("this machine has Docker")
    result, log = run_metrics(tmp_path, "start", bodies=stubs, extra_env={"GPUCLUSTER_INSTALL": str(install)})
    assert "gpucluster-install container-runtime" in log.read_text().splitlines()
    assert result.returncode != 0  # the stub installed nothing: docker run still fails


def test_setup_installs_docker_before_pulling_where_the_ami_has_none(tmp_path: Path) -> None:
    install = tmp_path / "fake-install"
    install.write_text(f'#!/bin/bash\necho "gpucluster-install $*" >> {tmp_path / "calls.log"}\nexit 1\n')
    install.chmod(0o755)
    if Path("/usr/bin/docker").exists() or Path("/bin/docker").exists():
        pytest.skip("this machine has Docker")
    box = Sandbox(tmp_path)
    box.node_env.write_text("GPUCLUSTER_NODE_GROUP=g\nGPUCLUSTER_CONTAINER_IMAGE=nvcr.io/nvidia/pytorch:24.01\n")
    box.env |= {"PATH": f"{box.bin}:/usr/bin:/bin", "GPUCLUSTER_INSTALL": str(install),
                "GPUCLUSTER_USER_SETUP": str(tmp_path / "none"),
                "GPUCLUSTER_SETUP_STATE": str(tmp_path / "st"),
                "GPUCLUSTER_SETUP_LOG": str(tmp_path / "setup.log"), "GPUCLUSTER_RETRY_SECONDS": "0"}
    result = box.run("setup.sh")
    assert result.returncode == 1
    assert box.calls("gpucluster-install") == ["container-runtime"]


def test_every_supported_system_is_known_to_the_fixtures() -> None:
    assert set(SUPPORTED) | set(UNSUPPORTED) == set(OS_RELEASES)
