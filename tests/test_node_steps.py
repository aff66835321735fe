"""A busy first boot: installs wait for the dpkg lock and retry; failed steps are retried and reported.

The Deep Learning AMI can hold the apt/dpkg lock during first boot (SkyPilot issue #4237). The node
scripts run here under bash with fake fuser, dpkg, apt-get, aws and the CloudWatch agent's ctl on
PATH (tests/test_bootstrap.py's Sandbox); the systemd units they run in are checked with
`systemd-analyze verify`, which refuses settings systemd would refuse.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpucluster.node.userdata import (
    NODE_STEP_METRIC,
    STEP_BURST,
    node_files,
    render_user_data,
)
from gpucluster.noderole import gpu_metric_namespace
from test_bootstrap import Sandbox, settings
from test_node_downloads import CWA_KEY, sandbox

QUICK = {"GPUCLUSTER_LOCK_POLL_SECONDS": "0.05", "GPUCLUSTER_RETRY_SECONDS": "0"}


def stub(box: Sandbox, name: str, body: str) -> None:
    """Replace (or add) the command `name` on the sandbox's PATH; it logs its arguments first."""
    path = box.bin / name
    path.write_text(f'#!/bin/bash\necho "{name} $*" >> {box.log}\n{body}\n')
    path.chmod(0o755)


def fail_first(box: Sandbox, name: str, times: int) -> None:
    """`name` exits 1 the first `times` calls, then 0."""
    stub(box, name, f'n=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$0.count"\n'
                    f'[ "$n" -gt {times} ]')


# ----------------------------------------------------------------- the dpkg lock


def test_the_agent_install_waits_for_the_dpkg_lock(tmp_path: Path) -> None:
    box = sandbox(tmp_path, CWA_KEY)
    box.env |= QUICK | {"FAKE_LOCK_HELD": "3"}  # three checks find the lock held

    result = box.run("install.sh", "cloudwatch-agent")

    assert result.returncode == 0, result.stdout + result.stderr
    assert len(box.calls("fuser")) == 4 and box.calls("dpkg")[0].startswith("-i -E ")
    assert result.stdout.count("waiting for the dpkg lock") == 1
    lock_files = box.calls("fuser")[0].split()
    assert "/var/lib/dpkg/lock-frontend" in lock_files and "/var/lib/dpkg/lock" in lock_files


def test_a_lock_held_past_the_bound_fails_without_installing(tmp_path: Path) -> None:
    box = sandbox(tmp_path, CWA_KEY)
    box.env |= QUICK | {"FAKE_LOCK_HELD": "forever", "GPUCLUSTER_LOCK_TIMEOUT_SECONDS": "1",
                        "GPUCLUSTER_INSTALL_ATTEMPTS": "2"}

    result = box.run("install.sh", "cloudwatch-agent", timeout=20)

    assert result.returncode == 1
    assert box.calls("dpkg") == []  # never run while another package manager holds the lock
    assert result.stdout.count("the dpkg lock is still held after 1s") == 2
    assert "giving up after 2 attempts: dpkg -i -E" in result.stdout


def test_a_failed_install_is_tried_again(tmp_path: Path) -> None:
    box = sandbox(tmp_path, CWA_KEY)
    box.env |= QUICK
    fail_first(box, "dpkg", 1)  # e.g. the lock taken again between the check and dpkg

    result = box.run("install.sh", "cloudwatch-agent")

    assert result.returncode == 0, result.stdout
    assert len(box.calls("dpkg")) == 2
    assert "attempt 1 of 3 failed: dpkg -i -E" in result.stdout


def test_apt_waits_for_the_lock_itself_and_is_retried(tmp_path: Path) -> None:
    box = sandbox(tmp_path, "8AEFE705EBE329C0948C75A66F1C3B3AEF4B030B")
    box.env |= QUICK
    fail_first(box, "apt-get", 2)

    result = box.run("install.sh", "mount-s3")

    assert result.returncode == 0, result.stdout
    calls = box.calls("apt-get")
    assert len(calls) == 3 and all(c.startswith("-o DPkg::Lock::Timeout=600 install -y ") for c in calls)


# ----------------------------------------------------------------- the agent step


def agent_box(tmp_path: Path, status: str = "running", installed: bool = False,
              install_fails: bool = False) -> Sandbox:
    """A sandbox with a fake agent ctl (absent unless `installed`) and a fake gpucluster-install."""
    box = Sandbox(tmp_path)
    ctl = tmp_path / "cwa-ctl"
    box.env |= {"GPUCLUSTER_CWA_CTL": str(ctl), "GPUCLUSTER_INSTALL": str(box.bin / "gpucluster-install")}
    answer = f'{{"status": "{status}", "configstatus": "configured"}}'
    ctl_body = f'echo "cwa-ctl $*" >> {box.log}\ncase "$*" in *status*) echo {_quote(answer)} ;; esac'

    install_body = f'printf \'#!/bin/bash\\n%s\\n\' {_quote(ctl_body)} > {ctl}; chmod 755 {ctl}'
    stub(box, "gpucluster-install", "exit 1" if install_fails else install_body)
    if installed:
        ctl.write_text(f"#!/bin/bash\n{ctl_body}\n")
        ctl.chmod(0o755)
    return box


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_the_agent_step_installs_a_missing_agent_then_starts_it(tmp_path: Path) -> None:
    box = agent_box(tmp_path)

    result = box.run("agent.sh")

    assert result.returncode == 0, result.stdout + result.stderr
    assert box.calls("gpucluster-install") == ["cloudwatch-agent"]
    assert box.calls("cwa-ctl") == [
        "-a fetch-config -m ec2 -s -c file:/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json",
        "-m ec2 -a status"]
    assert "GPU utilisation is published" in result.stdout


def test_the_agent_step_fails_when_the_agent_cannot_be_installed_or_does_not_run(tmp_path: Path) -> None:
    failed_install = agent_box(tmp_path / "a", install_fails=True)
    result = failed_install.run("agent.sh")
    assert result.returncode == 1 and failed_install.calls("cwa-ctl") == []

    stopped = agent_box(tmp_path / "b", status="stopped", installed=True)
    result = stopped.run("agent.sh")
    assert result.returncode == 1
    assert stopped.calls("gpucluster-install") == []  # the AMI's own agent is used
    assert 'not running after fetch-config: {"status": "stopped"' in result.stdout


# ----------------------------------------------------------------- the report


@pytest.mark.parametrize(("result", "value"), [(None, "0"), ("exit-code", "1"), ("timeout", "1")])
def test_every_run_of_a_step_is_reported_as_a_metric(tmp_path: Path, result: str | None, value: str) -> None:
    box = Sandbox(tmp_path)
    if result:
        box.env |= {"SERVICE_RESULT": result, "EXIT_CODE": "exited", "EXIT_STATUS": "1"}

    run = box.run("report.sh", "agent")

    assert run.returncode == 0
    [put] = box.calls("aws")
    assert put == ("cloudwatch put-metric-data --cli-connect-timeout 5 --cli-read-timeout 10 --region "
                   f"us-east-1 --namespace {gpu_metric_namespace('c')} --metric-name {NODE_STEP_METRIC} "
                   f"--unit Count --value {value} --dimensions Stack=t,NodeGroup=g,Step=agent")
    assert ("step agent FAILED (" in run.stdout) == (value == "1")


def test_a_normal_stop_is_not_reported_and_a_report_never_fails_its_unit(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, SERVICE_RESULT="success")
    assert box.run("report.sh", "data").returncode == 0 and box.calls("aws") == []
    box.env["SERVICE_RESULT"] = "exit-code"
    stub(box, "aws", "exit 255")  # no route to CloudWatch
    run = box.run("report.sh", "data")
    assert run.returncode == 0 and "could not publish NodeStepFailed=1 for step data" in run.stdout


def test_a_dataset_that_cannot_be_brought_fails_the_data_step(tmp_path: Path) -> None:
    """Never silently skipped: Mountpoint that cannot be installed fails the unit (and so is retried)."""
    table = tmp_path / "mounts.tsv"
    table.write_text("mount\tmodels\tacme-models\t-\t" + str(tmp_path / "models") + "\t-\t-\n")
    box = Sandbox(tmp_path, GPUCLUSTER_DATA_MOUNTS=str(table))
    (box.bin / "mount-s3").unlink()  # the AMI lacks Mountpoint
    stub(box, "gpucluster-install", "exit 1")
    box.env["GPUCLUSTER_INSTALL"] = str(box.bin / "gpucluster-install")

    result = box.run("data.sh")

    assert result.returncode == 1
    assert box.calls("gpucluster-install") == ["mount-s3"] and "all datasets in place" not in result.stdout


# ----------------------------------------------------------------- the units


def units() -> dict[str, str]:
    return {Path(f.path).name: f.content for f in node_files(settings()) if f.path.endswith(".service")}


@pytest.mark.parametrize("step", ["agent", "data"])
def test_agent_and_data_steps_are_retried_a_bounded_number_of_times_and_reported(step: str) -> None:
    unit = units()[f"gpucluster-{step}.service"]
    assert re.search(r"^Restart=on-failure$", unit, re.M) and re.search(r"^RestartSec=\d+$", unit, re.M)
    assert f"StartLimitBurst={STEP_BURST}\n" in unit and "StartLimitIntervalSec=" in unit
    assert f"ExecStartPost=/usr/local/sbin/gpucluster-report {step}\n" in unit
    assert f"ExecStopPost=/usr/local/sbin/gpucluster-report {step}\n" in unit


def test_the_bootstrap_starts_the_agent_as_its_own_unit_and_never_installs_inline() -> None:
    text = render_user_data(settings())
    body = [line for line in text.split("systemctl daemon-reload\n", 1)[1].splitlines()
            if not line.startswith("#")]
    assert "systemctl start --no-block gpucluster-agent.service" in body
    assert not [line for line in body if "gpucluster-install" in line or "fetch-config" in line]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """`systemd-analyze verify` refuses what systemd would (e.g. Restart=always on a oneshot unit)."""
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for f in node_files(settings()):
        if f.path.startswith("/usr/local/sbin/"):
            target = sbin / Path(f.path).name
            target.write_text(f.content)
            target.chmod(0o755)
    paths = []
    for name, text in units().items():
        path = tmp_path / name
        path.write_text(text.replace("/usr/local/sbin/", f"{sbin}/"))
        paths.append(str(path))
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True)
    problems = [line for line in result.stderr.splitlines() if "gpucluster" in line]
    assert result.returncode == 0 and problems == [], result.stderr
    broken = tmp_path / "broken" / "gpucluster-agent.service"
    broken.parent.mkdir()
    broken.write_text((tmp_path / "gpucluster-agent.service").read_text().replace(
        "Restart=on-failure", "Restart=always"))
    assert subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True).returncode != 0
