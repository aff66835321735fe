"""Detached jobs: `run --detach`, `jobs`, `logs`, `cancel`, and gpucluster-job on the node under bash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from typer.testing import CliRunner

from cli_text import joined_lines
from fake_node import logged_calls
from gpucluster.cli import app, common
from gpucluster.fleet.nodepaths import JOB_TOOL
from gpucluster.node import userdata
from gpucluster.node.userdata import node_files, script
from gpucluster.ops import run as ops_run
from gpucluster.ops.joblogs import END, START
from gpucluster.ops.run import parse_job_states
from test_jobs import _dry_run_ranks, _invocation, _online, _sends, aws  # noqa: F401  (fixture)

runner = CliRunner()
SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")


# --------------------------------------------------------------- gpucluster-job on a node


class Node:
    """systemd-run, systemctl, journalctl and aws as stubs that log their arguments.

    `booting` makes gpucluster-data.service report `activating` that many times first; the job's
    output files go to `root/jobs` (GPUCLUSTER_JOB_LOGS).
    """

    def __init__(self, root: Path, *, train_state: str = "exited", booting: int = 0,
                 s3_latest: str | None = None) -> None:
        self.bin, self.log, self.logs = root / "bin", root / "calls.log", root / "jobs"
        self.bin.mkdir()
        boots = root / "boots"
        boots.write_text(str(booting))
        bodies = {
            "systemd-run": "true",
            "journalctl": "echo 'step 10 loss 1.5'",
            "systemctl": f"""case "$1" in
  list-units) printf 'gpucluster-job-train.service loaded active exited gpucluster job train\\n'
              printf 'gpucluster-job-eval.service loaded failed failed gpucluster job eval\\n' ;;
  show) case "$3$5" in
          *SubState*train*) echo {train_state} ;; *SubState*eval*) echo failed ;;
          *ExecMainStatus*train*) echo 0 ;; *ExecMainStatus*eval*) echo 3 ;;
          *ExecMainStartTimestamp*) echo "Mon 2025-06-02 10:00:00 ${{TZ:-CEST}}" ;;
          *ActiveState*gpucluster-data*) n=$(cat {boots})
             if [ "$n" -gt 0 ]; then echo $((n - 1)) > {boots}; echo activating; else echo active; fi ;;
          *ActiveState*) echo active ;;
        esac ;;
esac""",
            "aws": ("[ \"$1 $2\" = 's3 cp' ] || exit 1\n"
                    + (f"echo '{s3_latest}'" if s3_latest is not None else "echo 'NoSuchKey' >&2; exit 1")),
            "sleep": "true",
        }
        for name, body in bodies.items():
            stub = self.bin / name
            stub.write_text(f'#!/bin/bash\nprintf "%s\\n" "{name} $*" >> {self.log}\n'
                            f'for a in "$@"; do printf "  %s\\n" "$a" >> {self.log}.args; done\n{body}\n')
            stub.chmod(0o755)
        self.path = root / "job.sh"
        self.path.write_text(script("job.sh"))

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        clean = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
                 "GPUCLUSTER_JOB_LOGS": str(self.logs), "GPUCLUSTER_POLL_SECONDS": "1"}
        return subprocess.run(["bash", str(self.path), *args], env={**clean, **env}, capture_output=True,
                              text=True, timeout=20)

    def args(self) -> list[str]:
        path = Path(f"{self.log}.args")
        return [line[2:] for line in path.read_text().splitlines()] if path.exists() else []

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)



def test_job_tool_lints_clean() -> None:
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(Path(userdata.__file__).parent / "job.sh")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_start_runs_the_command_as_a_unit_with_the_rank_environment_only(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("start", "train", "/fsx/code", "torchrun --nnodes=$NNODES train.py",
                      MASTER_ADDR="10.0.0.5", NODE_RANK="1", NNODES="2", FI_PROVIDER="efa",
                      NCCL_SOCKET_IFNAME="^docker,lo,veth", GPUCLUSTER_NODE_IPS="10.0.0.5 10.0.0.6",
                      GPUCLUSTER_JOB_TIMEOUT_SECONDS="7200")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "started job train as gpucluster-job-train.service\n"
    args = node.args()
    run_at = args.index("--unit=gpucluster-job-train.service")
    sent = args[run_at:]
    assert sent[-3:] == ["/bin/bash", "-c", "torchrun --nnodes=$NNODES train.py"]
    log = node.logs / "train.log"
    assert {"--property=RemainAfterExit=yes", "--property=WorkingDirectory=/fsx/code",
            "--property=RuntimeMaxSec=7200", f"--property=StandardOutput=append:{log}",
            f"--property=StandardError=append:{log}",
            "--property=ExecStopPost=/usr/local/sbin/gpucluster-job finish train"} <= set(sent)
    env = {a.removeprefix("--setenv=") for a in sent if a.startswith("--setenv=")}
    assert env == {"MASTER_ADDR=10.0.0.5", "NODE_RANK=1", "NNODES=2", "FI_PROVIDER=efa",
                   "NCCL_SOCKET_IFNAME=^docker,lo,veth", "GPUCLUSTER_NODE_IPS=10.0.0.5 10.0.0.6",
                   "GPUCLUSTER_JOB_TIMEOUT_SECONDS=7200", "GPUCLUSTER_JOB=train",
                   "GPUCLUSTER_RESTART_COUNT=0"}  # no HOME, no secrets
    # the node's boot steps are asked first; a finished job of the same name is cleared
    assert node.calls("systemctl")[1:] == ["show -p ActiveState --value gpucluster-data.service",
                                           "show -p ActiveState --value gpucluster-setup.service",
                                           "stop gpucluster-job-train.service",
                                           "reset-failed gpucluster-job-train.service"]
    [start_line] = log.read_text().splitlines()
    assert START.match(start_line) and start_line.startswith("gpucluster-job: train started (restart 0) ")


def test_start_refuses_a_job_that_is_still_running(tmp_path: Path) -> None:
    node = Node(tmp_path, train_state="running")
    result = node.run("start", "train", "/", "true")
    assert result.returncode == 2 and "job train is already running on this node" in result.stderr
    assert node.calls("systemd-run") == []


def test_a_restart_replaces_the_running_job_once_the_node_has_booted(tmp_path: Path) -> None:
    """GPUCLUSTER_JOB_REPLACE=1 (restart-on-replace): the old run is stopped, the new one started after
    the node's data step stopped `activating`."""
    node = Node(tmp_path, train_state="running", booting=2)
    result = node.run("start", "train", "/", "python train.py", GPUCLUSTER_JOB_REPLACE="1",
                      GPUCLUSTER_RESTART_COUNT="2")
    assert result.returncode == 0, result.stderr
    assert "stopping the running train" in result.stdout
    assert "waiting for gpucluster-data.service to finish" in result.stdout
    assert node.calls("sleep") == ["1", "1"]  # polled until the step finished
    systemctl = node.calls("systemctl")
    assert systemctl.index("stop gpucluster-job-train.service") > max(
        i for i, c in enumerate(systemctl) if "ActiveState" in c)
    assert node.calls("systemd-run")
    assert (node.logs / "train.log").read_text().startswith("gpucluster-job: train started (restart 2) ")
    assert "--setenv=GPUCLUSTER_RESTART_COUNT=2" in node.args()


def test_a_restart_sent_twice_starts_the_rank_once(tmp_path: Path) -> None:
    """SendCommand has no idempotency token: the job-restart Lambda's retry (its answer lost, or killed
    before it recorded the send) sends the same start again; the node's marker makes it a no-op."""
    node = Node(tmp_path, train_state="running")
    env = {"GPUCLUSTER_JOB_REPLACE": "1", "GPUCLUSTER_RESTART_COUNT": "2",
           "GPUCLUSTER_START_ID": "2-2026-11-29T07:00:00+00:00"}
    first = node.run("start", "train", "/", "python train.py", **env)
    assert first.returncode == 0, first.stderr
    assert len(node.calls("systemd-run")) == 1
    assert not any(a.startswith("--setenv=GPUCLUSTER_START_ID") for a in node.args())  # the tool's own
    again = node.run("start", "train", "/", "python train.py", **env)
    assert again.returncode == 0 and "already made on this node; not started twice" in again.stdout
    assert len(node.calls("systemd-run")) == 1  # not stopped, not started again
    assert "stop gpucluster-job-train.service" in node.calls("systemctl")  # (the first start's, once)
    assert node.calls("systemctl").count("stop gpucluster-job-train.service") == 1
    later = node.run("start", "train", "/", "python train.py",
                     **{**env, "GPUCLUSTER_START_ID": "3-2026-11-29T09:00:00+00:00"})
    assert later.returncode == 0 and len(node.calls("systemd-run")) == 2  # the next re-launch starts


def test_a_start_that_failed_is_not_marked(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (node.bin / "systemd-run").write_text("#!/bin/bash\nexit 1\n")
    env = {"GPUCLUSTER_START_ID": "1-x"}
    assert node.run("start", "train", "/", "true", **env).returncode != 0
    assert not (node.logs / ".starts" / "train").exists()  # the retry tries again


def test_boot_wait_is_bounded(tmp_path: Path) -> None:
    node = Node(tmp_path, booting=100)
    result = node.run("start", "train", "/", "true", GPUCLUSTER_READY_TIMEOUT_SECONDS="3")
    assert result.returncode == 0, result.stderr
    assert "gpucluster-data.service still running after 3s; starting anyway" in result.stdout
    assert len(node.calls("sleep")) == 3 and node.calls("systemd-run")


@pytest.mark.parametrize(("pointer", "expected"), [
    ("step-1200/", "{dir}/step-1200/"),  # relative to the prefix
    ("{dir}/step-1300/\n", "{dir}/step-1300/"),  # absolute
    ("s3://elsewhere/step-9/", "s3://elsewhere/step-9/"),
    ("", None),
])
def test_start_tells_the_job_its_latest_checkpoint_from_an_fsx_pointer(tmp_path: Path, pointer: str,
                                                                        expected: str | None) -> None:
    checkpoints = tmp_path / "fsx" / "checkpoints"
    checkpoints.mkdir(parents=True)
    if pointer:
        (checkpoints / "latest").write_text(pointer.format(dir=checkpoints))
    node = Node(tmp_path)
    uri = f"{checkpoints}/"
    result = node.run("start", "train", "/", "true", GPUCLUSTER_CHECKPOINT_URI=uri,
                      GPUCLUSTER_CHECKPOINT_LATEST="stale-from-the-caller")
    assert result.returncode == 0, result.stderr
    env = {a.removeprefix("--setenv=") for a in node.args() if a.startswith("--setenv=")}
    latest = {e for e in env if e.startswith("GPUCLUSTER_CHECKPOINT_LATEST=")}
    if expected is None:
        assert latest == set()
    else:
        resolved = expected.format(dir=checkpoints)
        assert latest == {f"GPUCLUSTER_CHECKPOINT_LATEST={resolved}"}
        assert f"gpucluster-job: train resumes from {resolved}" in (node.logs / "train.log").read_text()
    assert f"GPUCLUSTER_CHECKPOINT_URI={uri}" in env


def test_start_reads_an_s3_latest_pointer_and_survives_none(tmp_path: Path) -> None:
    uri = "s3://acme-ckpt/runs/llm/"
    node = Node(tmp_path, s3_latest="step-42/")
    assert node.run("start", "train", "/", "true", GPUCLUSTER_CHECKPOINT_URI=uri).returncode == 0
    assert node.calls("aws") == [f"s3 cp --only-show-errors {uri}latest -"]
    assert f"--setenv=GPUCLUSTER_CHECKPOINT_LATEST={uri}step-42/" in node.args()
    (tmp_path / "fresh").mkdir()
    fresh = Node(tmp_path / "fresh", s3_latest=None)  # no pointer yet: a first run
    result = fresh.run("start", "train", "/", "true", GPUCLUSTER_CHECKPOINT_URI=uri)
    assert result.returncode == 0, result.stderr
    assert not any(a.startswith("--setenv=GPUCLUSTER_CHECKPOINT_LATEST") for a in fresh.args())


def test_finish_writes_the_end_line_the_follower_reads(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("finish", "train", SERVICE_RESULT="exit-code", EXIT_STATUS="3", EXIT_CODE="exited")
    assert result.returncode == 0, result.stderr
    [line] = (node.logs / "train.log").read_text().splitlines()
    end = END.match(line)
    assert end and (end["name"], end["result"], end["status"]) == ("train", "exit-code", "3")


def test_status_logs_cancel_and_bad_names(tmp_path: Path) -> None:
    node = Node(tmp_path)
    status = node.run("status")
    assert status.returncode == 0, status.stderr
    assert parse_job_states(status.stdout) == [
        ops_run.JobState("train", "exited", 0, "Mon 2025-06-02 10:00:00 UTC"),  # TZ=UTC for the follower
        ops_run.JobState("eval", "failed", 3, "Mon 2025-06-02 10:00:00 UTC")]
    logs = node.run("logs", "train", "50")  # no file yet: a job from before files, in the journal
    assert logs.stdout == "step 10 loss 1.5\n"
    assert node.calls("journalctl") == ["-u gpucluster-job-train.service -n 50 --no-pager -o cat"]
    node.logs.mkdir()
    (node.logs / "train.log").write_text("".join(f"line {i}\n" for i in range(10)))
    assert node.run("logs", "train", "3").stdout == "line 7\nline 8\nline 9\n"
    assert len(node.calls("journalctl")) == 1
    assert node.run("cancel", "train").stdout == "cancelled job train\n"
    assert node.calls("systemctl")[-1] == "stop gpucluster-job-train.service"
    bad = node.run("cancel", "Train;rm")
    assert bad.returncode == 2 and "job names are 1-40 characters" in bad.stderr
    assert node.run("logs", "train", "3;x").returncode == 2


def test_every_node_gets_the_job_tool() -> None:
    from test_node_setup import plain_group

    tool = next(f for f in node_files(plain_group()) if f.path == JOB_TOOL)
    assert tool.mode == "0755" and tool.content == script("job.sh")


# ------------------------------------------------------------------------- the CLI


def test_run_detach_dry_run_hands_the_command_to_the_job_tool(aws: dict[str, Any],  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    result = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                                 "--timeout", "86400", "--dry-run", "--", "torchrun", "train.py"])
    assert result.exit_code == 0, result.output
    assert [r["NODE_RANK"] for r in _dry_run_ranks(result.output)] == ["0", "1", "2"]
    assert result.output.count("  export GPUCLUSTER_JOB_TIMEOUT_SECONDS=86400\n") == 3
    assert result.output.count("  exec /usr/local/sbin/gpucluster-job start pretrain / "
                               "'torchrun train.py'\n") == 3
    bad = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "Bad Name",
                              "--", "true"])
    assert bad.exit_code == 2 and "job names are 1-40 characters" in bad.output
    bad = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--name", "x", "--", "true"])
    assert (bad.exit_code, bad.output) == (2, "run: --name names a detached job: add --detach\n")


def _stub_ssm(monkeypatch: pytest.MonkeyPatch, replies: list[dict[str, Any]], *,
              record: str | None = None) -> Stubber:
    """SSM answering one SendCommand and one GetCommandInvocation per reply, in order.

    `record`: the job's restart record is dropped `before` (cancel) or `after` (run --detach
    without --restart-on-replace) the commands; there is none (ParameterNotFound).
    """
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    if record == "before":
        stub.add_client_error("delete_parameter", "ParameterNotFound", expected_params={"Name": ANY})
    _sends(stub, len(replies), checked=True)
    for n, reply in enumerate(replies):
        stub.add_response("get_command_invocation", reply, {"CommandId": f"{n:036d}", "InstanceId": ANY})
    if record == "after":
        stub.add_client_error("delete_parameter", "ParameterNotFound", expected_params={"Name": ANY})
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: ssm if service == "ssm" else real(spec, service))
    return stub


def test_run_detach_returns_once_started(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    started = _invocation("Success", 0, "started job pretrain as gpucluster-job-pretrain.service\n")
    with _stub_ssm(monkeypatch, [started] * 3, record="after") as stub:
        result = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                                     "--", "torchrun", "train.py"])
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).endswith(  # wrapped at 100 columns
        "run: job pretrain started on all 3 node(s); follow it with `gpucluster jobs prod`, "
        "`gpucluster logs prod pretrain --follow`, stop it with `gpucluster cancel prod pretrain`")


def test_jobs_lists_each_jobs_state_per_node(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    replies = [_invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n"),
               _invocation("Success", 0, "pretrain failed 1 Mon_2025-06-02_10:00:00_UTC\n"),
               _invocation("Success", 0, "")]
    with _stub_ssm(monkeypatch, replies):
        result = runner.invoke(app, ["jobs", "prod", "-g", "h100-train"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in joined_lines(result.output)[1:]]
    assert sorted((r[0], r[4], r[5]) for r in rows) == [("pretrain", "failed", "1"),
                                                        ("pretrain", "running", "0")]


def test_logs_of_one_node_and_cancel(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "step 10 loss 1.5\nstep 11 loss 1.4\n")]):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "--node", "1",
                                     "-n", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("== i-") and lines[1:] == ["step 10 loss 1.5", "step 11 loss 1.4"]

    result = runner.invoke(app, ["cancel", "prod", "pretrain", "-g", "h100-train"], input="n\n")
    assert result.exit_code == 1 and "cancel cancelled: nothing changed" in result.output
    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "cancelled job pretrain\n")] * 3, record="before"):
        result = runner.invoke(app, ["cancel", "prod", "pretrain", "-g", "h100-train", "--yes"])
    assert result.exit_code == 0, result.output
    assert [line.split(": ")[1] for line in result.output.splitlines()] == ["cancelled"] * 3
