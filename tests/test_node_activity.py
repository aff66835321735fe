"""`gpucluster-report activity` under bash with fake nvidia-smi, systemctl, aws and logger on PATH, and
shellcheck."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fake_node import logged_calls, run_script, write_stubs
from gpucluster.node.userdata import ACTIVITY_METRIC, NodeBootstrap, node_env, node_files, script

SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
NODE = NodeBootstrap(stack="organization/gpucluster/dev/gpu-dev", cluster="gpu-dev", node_group="dev-a10",
                     region="us-east-1", scratch_mount="/scratch", efa=False, gpudirect_rdma=False,
                     watch_spot=False, interruption_command=None, interruption_timeout_seconds=90,
                     handle_rebalance=False, data_mounts=())


def run(tmp_path: Path, *, apps: str = "", smi_fails: bool = False, units: str = "",
        aws_fails: bool = False) -> tuple[subprocess.CompletedProcess[str], Path]:
    log = tmp_path / "calls.log"
    env_file = tmp_path / "node.env"
    env_file.write_text(node_env(NODE))
    (tmp_path / "apps.txt").write_text(apps)
    (tmp_path / "units.txt").write_text(units)
    write_stubs(tmp_path / "bin", log, {
        "nvidia-smi": "exit 9" if smi_fails else f"cat {tmp_path}/apps.txt",
        "systemctl": f"cat {tmp_path}/units.txt",
        "aws": "exit 255" if aws_fails else "exit 0",
        "logger": "exit 0",
    })
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(env_file)}
    return run_script(tmp_path, "report.sh", "activity", env=env, timeout=30), log


def published(log: Path) -> list[str]:
    return logged_calls(log, "aws")


def value(log: Path) -> str:
    [call] = published(log)
    return call.split("--value ", 1)[1].split()[0]


def test_a_gpu_process_is_activity(tmp_path: Path) -> None:
    result, log = run(tmp_path, apps="4242\n4343\n")
    assert result.returncode == 0, result.stderr
    [call] = published(log)
    assert value(log) == "1"
    assert f"--metric-name {ACTIVITY_METRIC}" in call and "--namespace gpucluster/gpu-dev" in call
    assert "--dimensions Stack=organization/gpucluster/dev/gpu-dev,NodeGroup=dev-a10" in call
    assert "--region us-east-1" in call
    assert logged_calls(log, "nvidia-smi") == ["--query-compute-apps=pid --format=csv,noheader"]


def test_a_job_unit_is_activity_even_before_it_touches_a_gpu(tmp_path: Path) -> None:
    result, log = run(tmp_path, units="gpucluster-job-train-7.service loaded active running gpucluster job\n")
    assert result.returncode == 0 and value(log) == "1"
    [query] = logged_calls(log, "systemctl")
    assert "--state=active" in query and "gpucluster-job-*" in query
    assert logged_calls(log, "nvidia-smi") == []  # a job is enough


def test_nothing_running_reports_zero(tmp_path: Path) -> None:
    result, log = run(tmp_path, apps="\n")
    assert result.returncode == 0 and value(log) == "0"


def test_a_broken_nvidia_smi_is_not_idle(tmp_path: Path) -> None:
    result, log = run(tmp_path, smi_fails=True)
    assert result.returncode == 0
    assert published(log) == []  # nothing published: missing data never stops a group
    assert logged_calls(log, "nvidia-smi")  # it asked


def test_a_broken_nvidia_smi_with_a_job_running_is_still_active(tmp_path: Path) -> None:
    result, log = run(tmp_path, smi_fails=True, units="gpucluster-job-a.service loaded active running x\n")
    assert result.returncode == 0 and value(log) == "1"


def test_a_failed_publish_fails_the_unit(tmp_path: Path) -> None:
    result, log = run(tmp_path, apps="1\n", aws_fails=True)
    assert result.returncode != 0  # the unit fails: the journal shows it
    assert len(published(log)) == 1


def test_the_timer_runs_it_every_minute() -> None:
    files = {f.path: f for f in node_files(NODE)}
    timer = files["/etc/systemd/system/gpucluster-activity.timer"].content
    assert "OnCalendar=minutely" in timer and "WantedBy=timers.target" in timer
    service = files["/etc/systemd/system/gpucluster-activity.service"].content
    assert "ExecStart=/usr/local/sbin/gpucluster-report activity" in service
    assert files["/usr/local/sbin/gpucluster-report"].mode == "0755"
    assert "systemctl enable --now gpucluster-activity.timer" in script("bootstrap.sh")


def test_shellcheck(tmp_path: Path) -> None:
    path = tmp_path / "report.sh"
    source = Path(__file__).resolve().parents[1] / "components/gpucluster/node/report.sh"
    path.write_text(source.read_text())
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("name", ["report.sh"])
def test_shipped_without_comments_still_lints(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(script(name))
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
