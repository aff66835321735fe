"""What every command prints: JSON on request (errors too), flags as flags, colour only where wanted."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import typer
from moto import mock_aws
from typer.testing import CliRunner

from gpucluster.cli import app, common, entry, render
from gpucluster.fleet import asg
from gpucluster.ops.doctor import DoctorFinding
from gpucluster.project import stack_names
from moto_groups import ACTIVE, DEV, cost_explorer, create_stack_groups

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def commands_of_app() -> list[str]:
    """Every command, groups' subcommands included (`capacity search`)."""
    found = []
    for name, command in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        found += [f"{name} {sub}" for sub in subcommands] if subcommands else [name]
    return sorted(found)


def test_the_command_list_has_the_operator_commands() -> None:
    assert {"nodes", "run", "jobs", "logs", "cancel", "hostfile", "scale", "stop", "start", "spend",
            "capacity search", "capacity buy", "plan", "cost", "doctor", "status", "resume", "init",
            "recommend"} <= set(commands_of_app())


@pytest.mark.parametrize("command", commands_of_app())
def test_every_command_has_json_and_shows_flags_as_flags(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert any(line.split()[:1] == ["--json"] for line in result.output.splitlines()), result.output


@pytest.fixture
def moto_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A moto account where the dev stack has one group, stopped by the idle guardrail (and the
    budget's cost-allocation tag active: moto has no ListCostAllocationTags)."""
    monkeypatch.setattr(common, "cost_explorer", lambda spec: cost_explorer(ACTIVE))
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        boto3.client("ec2").create_launch_template(
            LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": "ami-12c6146b"})
        client = boto3.client("autoscaling")
        create_stack_groups(client, {"dev-train": (DEV, 1, 2, 4)}, launch_template="nodes")
        [group] = client.describe_auto_scaling_groups()["AutoScalingGroups"]
        asg.scale_to_zero(client, group, "idle")
        yield client


def test_status_json(moto_stack: Any) -> None:
    result = runner.invoke(app, ["status", "dev", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["stack"], doc["region"], doc["identity"], doc["cost_tag_warning"]) == (
        "dev", "us-east-1", DEV, None)
    assert doc["groups"] == [{"name": "dev-train", "min_size": 0, "desired_capacity": 0, "max_size": 4,
                              "in_service": 0, "stopped_by": "idle", "previous_desired": 2,
                              "node_group": None, "healthy": 0, "gpu_utilization_avg": None,
                              "gpu_utilization_max": None,
                              "last_replacement": None, "getting_ready": 0,
                              "getting_ready_seconds": None, "state": None}]  # no guard-state table here


def test_resume_json_dry_run_then_yes(moto_stack: Any) -> None:
    dry = runner.invoke(app, ["resume", "dev", "--json", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    doc = json.loads(dry.stdout)
    [group] = doc["groups"]
    assert (group["group"], group["action"], group["stopped_by"], group["nodes_after"]) == (
        "dev-train", "resume", "idle", 2)
    assert doc["dry_run"] is True and doc["resumed"] == []
    done = json.loads(runner.invoke(app, ["resume", "dev", "--json", "--yes"]).stdout)
    assert [(r["group"], r["action"], r["desired_capacity"]) for r in done["resumed"]] == [
        ("dev-train", "resumed", 2)]
    assert done["status"][0]["stopped_by"] is None


def test_resume_json_cannot_ask() -> None:
    result = runner.invoke(app, ["resume", "dev", "--json"])
    assert result.exit_code == 2
    message = "--json cannot ask for confirmation: add --yes to resume, or --dry-run"
    assert json.loads(result.stdout) == {"errors": [{"path": "resume", "message": message}]}


def test_doctor_json_keeps_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    findings = [DoctorFinding("ok", "efa", "p5.48xlarge", "32 EFA interfaces"),
                DoctorFinding("blocker", "offering", "h100-train us-east-1d", "p5.48xlarge not offered")]
    monkeypatch.setattr("gpucluster.ops.doctor.run_checks", lambda spec, own_groups: findings)
    result = runner.invoke(app, ["doctor", "prod", "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["blocked"] is True and doc["counts"] == {"ok": 1, "warning": 0, "blocker": 1}
    assert doc["findings"][1] == {"level": "blocker", "check": "offering", "subject": "h100-train us-east-1d",
                                  "message": "p5.48xlarge not offered"}


def test_init_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / "proj"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {"Pulumi.yaml", "__main__.py", "stacks/Pulumi.dev.yaml"} <= set(doc["created"])
    assert doc["next"] == f"cd {tmp_path / 'proj'} && gpucluster plan dev"


def test_invalid_config_as_json_errors(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> None:
    base_config["gpucluster:node_groups"][0]["max_nodes"] = 0
    path = write_stack(base_config)
    for command in (["plan"], ["cost"], ["doctor"], ["status"]):
        result = runner.invoke(app, [*command, str(path), "--json"])
        assert result.exit_code == 2, command
        assert json.loads(result.stdout) == {"errors": [
            {"path": "node_groups[0].max_nodes", "message": "must be 1..2000, got 0"}]}, command


def test_missing_stack_says_did_you_mean() -> None:
    result = runner.invoke(app, ["plan", "prdo"])
    assert result.exit_code == 2
    assert "no such stack file; did you mean prod? searched" in result.output
    assert f"stacks there: {', '.join(stack_names(REPO / 'stacks'))}" in result.output
    [error] = json.loads(runner.invoke(app, ["plan", "prdo", "--json"]).stdout)["errors"]
    assert "did you mean prod?" in error["message"]


@pytest.mark.usefixtures("cli_plans_once")
def test_bad_policy_config_as_json(tmp_path: Path) -> None:
    config = tmp_path / "policy.json"
    config.write_text(json.dumps({"no-such-policy": {"enforcementLevel": "mandatory"}}))
    result = runner.invoke(app, ["plan", "dev", "--json", "--policy-config", str(config)])
    assert result.exit_code == 2
    [error] = json.loads(result.stdout)["errors"]
    assert error["path"] and error["message"]


def test_usage_errors_are_json_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        entry.main(["plan", "dev", "--json", "--no-such-option"])
    assert exited.value.code == 2
    [error] = json.loads(capsys.readouterr().out)["errors"]
    assert "No such option: --no-such-option" in error["message"]


# ----------------------------------------------------------------------- colour

BROKEN_DEV = {"gpucluster:node_groups": [{"name": "h100", "instance_types": ["p5.48xlarge"], "max_nodes": 2,
                                          "capacity": {"on_demand_base": 1, "spot_percent": 0}}]}


@pytest.mark.usefixtures("cli_plans_once")
def test_colour_only_when_forced_and_never_with_no_color(base_config: dict[str, Any],
                                                         write_stack: Callable[..., Path]) -> None:
    path = write_stack({**base_config, **BROKEN_DEV}, name="dev-p5")
    plain = runner.invoke(app, ["plan", str(path)], env={"NO_COLOR": "", "FORCE_COLOR": ""})
    assert plain.exit_code == 1 and "\033[" not in plain.output  # not a terminal
    forced = runner.invoke(app, ["plan", str(path)], env={"FORCE_COLOR": "1", "NO_COLOR": ""})
    assert "\033[1;31mmandatory\033[0m  environment-limits" in forced.output
    assert "\033[1;31mpolicies: 5 violation(s), 5 mandatory" in forced.output
    both = runner.invoke(app, ["plan", str(path)], env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\033[" not in both.output
    assert both.output == plain.output


def run_in_terminal(args: list[str], env: dict[str, str]) -> str:
    """`gpucluster ARGS` with stdout on a pseudo-terminal, as a person runs it; what it printed."""
    main, child = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "gpucluster.cli", *args], stdout=child, stderr=child,
                               stdin=subprocess.DEVNULL, cwd=REPO, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=60)
    os.close(main)
    return b"".join(chunks).decode()


def test_a_terminal_gets_colour_unless_no_color() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM", "CI")}
    coloured = run_in_terminal(["cost", "dev"], env)
    assert "\033[32mthe stack's mix is" in coloured
    assert "\033[" not in run_in_terminal(["cost", "dev"], {**env, "NO_COLOR": "1"})


# ---------------------------------------------------------------------- spinner


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_spinner_only_for_slow_calls_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    render.use_json(False)  # what the last command in this process left
    with render.progress("asking AWS", delay=0.5):
        pass  # quick: nothing shown
    assert terminal.getvalue() == ""
    with render.progress("asking AWS", delay=0.02):
        # a call that outlasts the delay: it ends once the spinner shows (polled; a fixed 0.3 s wait
        # failed on a loaded machine, where the timer thread's first import of rich took longer)
        deadline = time.monotonic() + 30
        while "asking AWS" not in terminal.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "asking AWS" in terminal.getvalue()
    render.use_json(True)
    try:
        shown = len(terminal.getvalue())
        with render.progress("asking AWS", delay=0.0):
            time.sleep(0.1)
        assert len(terminal.getvalue()) == shown, "no spinner in JSON mode"
    finally:
        render.use_json(False)


# ----------------------------------------------------------------------- layout


def test_grid_and_wrap_fit_the_width() -> None:
    cells = [f"{n:3d} ec2.SomethingLong{n}" for n in range(25)]
    lines = render.grid(cells, width=80)
    assert max(len(line) for line in lines) <= 80 and len(lines) < 25
    assert all(sum(c in line for line in lines) == 1 for c in cells)
    assert all(len(line) <= 40 for line in render.wrap("word " * 50, indent="  ", width=40))


# ------------------------------------------------------------------ a new stack


@pytest.mark.usefixtures("cli_plans_once")
def test_a_new_environment_is_told_which_limits_it_fell_back_to(tmp_path: Path) -> None:
    dev = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
    qa = tmp_path / "Pulumi.fourth.yaml"
    qa.write_text(dev.replace("environment: dev", "environment: fourth"))
    result = runner.invoke(app, ["plan", str(qa)])
    assert result.exit_code == 0, result.output
    note = " ".join(result.output.split("note: ", 1)[1].split("(--tree")[0].split())
    assert note == ("environment fourth has no limits in the environment-limits policy config, so the "
                    "dev limits apply: allowed instance types g4dn.*, g5.*, g6.*, g6e.*; at most 8 GPUs; "
                    "spot only. Add \"fourth\" under environments in policies/config/fourth.json (or the "
                    "stack's own <stack>.json) to set its own.")
    assert json.loads(runner.invoke(app, ["plan", str(qa), "--json"]).stdout)["notes"] == [note]
    # its own policy config: its own limits, no note
    config = tmp_path / "qa.json"
    config.write_text(json.dumps({"environment-limits": {"environments": {"fourth": {
        "allowed_instance_types": ["g*"], "max_gpus": 1, "spot_only": True}}}}))
    own = runner.invoke(app, ["plan", str(qa), "--json", "--policy-config", str(config)])
    doc = json.loads(own.stdout)
    assert doc["notes"] == [] and own.exit_code == 1
    [violation] = doc["violations"]
    assert violation["message"].endswith("over the fourth limit of 1")


def test_a_violation_in_a_fallen_back_environment_says_whose_limits(tmp_path: Path) -> None:
    dev = (REPO / "stacks" / "Pulumi.prod.yaml").read_text()
    qa = tmp_path / "Pulumi.fourth.yaml"
    qa.write_text(dev.replace("environment: prod", "environment: fourth"))  # p5 nodes, dev's limits
    doc = json.loads(runner.invoke(app, ["plan", str(qa), "--json"]).stdout)
    assert "p5.48xlarge is not allowed in fourth (no limits of its own in the policy config: dev's apply) " \
        "(allowed: g4dn.*, g5.*, g6.*, g6e.*; see the environment-limits policy config)" in [
            v["message"] for v in doc["violations"]]
