"""`--json` of the operator commands (run, hostfile, scale, stop, start, jobs, logs, cancel, spend,
capacity): one JSON object on stdout, errors as `{"errors": [...]}` with the same exit code, and
nothing that asks: without --yes a command that would ask is a usage error (exit 2), nothing done."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from gpucluster.cli import app
from test_capacity import OFFERING, ec2, offering, purchased, searched  # noqa: F401  (ec2: fixture)
from test_detached_jobs import _stub_ssm
from test_jobs import PROD, _invocation, _online, aws  # noqa: F401  (aws: fixture)
from test_scale import DEV as DEV_IDENTITY
from test_scale import _state, autoscaling, ssm  # noqa: F401  (fixtures)

runner = CliRunner()


def run_json(*args: str, code: int = 0, stdin: str | None = None) -> dict[str, Any]:
    """`gpucluster ARGS --json` (before any `--`): its exit code checked, its stdout parsed (nothing
    else on it)."""
    at = args.index("--") if "--" in args else len(args)
    result = runner.invoke(app, [*args[:at], "--json", *args[at:]], input=stdin)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def error_of(doc: dict[str, Any]) -> tuple[str | None, str]:
    [error] = doc["errors"]
    return error["path"], error["message"]


# ---------------------------------------------------------------------- run, hostfile


def test_run_dry_run_json_gives_each_ranks_script(aws: dict[str, Any],  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    doc = run_json("run", "prod", "--group", "h100-train", "--dry-run", "--", "torchrun", "train.py")
    assert (doc["stack"], doc["identity"], doc["dry_run"], doc["command"]) == (
        "prod", PROD, True, "torchrun train.py")
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    assert doc["master_addr"] == doc["ranks"][0]["private_ip"]
    for r in doc["ranks"]:
        assert f"export NODE_RANK={r['rank']}" in r["script"]
        assert r["script"][-1] == "exec bash -c 'torchrun train.py'"


def test_run_json_reports_every_node_and_keeps_exit_1_on_a_failure(aws: dict[str, Any],  # noqa: F811
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    replies = [_invocation("Success", 0, "ok\n"), _invocation("Failed", 3, "", "boom\n"),
               _invocation("Success", 0, "ok\n")]
    with _stub_ssm(monkeypatch, replies):
        doc = run_json("run", "prod", "-g", "h100-train", "--", "python", "train.py", code=1)
    assert doc["ok"] is False and doc["note"] == "1 of 3 node(s) failed"
    assert [(r["rank"], r["status"], r["exit_code"], r["ok"]) for r in doc["results"]] == [
        (0, "Success", 0, True), (1, "Failed", 3, False), (2, "Success", 0, True)]
    assert doc["results"][1]["output_tail"] == ["boom"]
    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "ok\n")] * 3):
        doc = run_json("run", "prod", "-g", "h100-train", "--", "true")
    assert doc["ok"] is True and doc["note"] == "finished"


def test_run_and_hostfile_errors_are_json(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    assert error_of(run_json("run", "prod", "--", "true", code=2)) == (
        "run", "--group is required (the node group to run on)")
    assert error_of(run_json("hostfile", "prod", "-g", "nope", code=2)) == (
        "hostfile", "no node group 'nope' in this stack (node groups: h100-train, spare)")
    doc = run_json("hostfile", "prod", "-g", "h100-train", "--format", "plain")
    assert doc["lines"] == [h["private_ip"] for h in doc["hosts"]] and len(doc["hosts"]) == 3
    assert {h["slots"] for h in doc["hosts"]} == {8}


# ------------------------------------------------------------------- jobs, logs, cancel


def test_jobs_logs_and_cancel_json(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    replies = [_invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n"),
               _invocation("Failed", 1, "", "no such tool\n"),
               _invocation("Success", 0, "")]
    with _stub_ssm(monkeypatch, replies):
        doc = run_json("jobs", "prod", "-g", "h100-train", code=1)  # a node did not answer: exit 1
    [job] = doc["jobs"]
    assert (job["job"], job["state"], job["exit_status"], job["node_group"]) == (
        "pretrain", "running", 0, "h100-train")
    assert [n["output_tail"] for n in doc["no_answer"]] == [["no such tool"]]

    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "step 10\nstep 11\n")]):
        doc = run_json("logs", "prod", "pretrain", "-g", "h100-train", "--node", "0")
    [node] = doc["nodes"]
    assert doc["job"] == "pretrain" and node["output"] == ["step 10", "step 11"] and node["rank"] == 0

    # cancel cannot ask with --json: without --yes nothing is sent (no SSM reply queued)
    assert error_of(run_json("cancel", "prod", "pretrain", "-g", "h100-train", code=2)) == (
        "cancel", "--json cannot ask for confirmation: add --yes")
    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "cancelled job pretrain\n")] * 3,
                   record="before") as stub:
        doc = run_json("cancel", "prod", "pretrain", "-g", "h100-train", "--yes")
        stub.assert_no_pending_responses()
    assert [n["cancelled"] for n in doc["nodes"]] == [True] * 3
    assert doc["restart_record_removed"] is False  # there was none (ParameterNotFound)


# -------------------------------------------------------------------- scale, stop, start


def test_scale_json_dry_run_asks_nothing_and_yes_scales(autoscaling: Any) -> None:  # noqa: F811
    doc = run_json("scale", "dev", "-g", "dev-a10", "--desired", "3", "--dry-run")
    [change] = doc["changes"]
    assert (change["group"], change["desired_now"], change["desired_after"]) == ("dev-a10", 2, 3)
    assert change["on_demand_usd_per_hour_after"] > 0 and doc["changed"] is False
    assert error_of(run_json("scale", "dev", "-g", "dev-a10", "--desired", "3", code=2)) == (
        "scale", "--json cannot ask for confirmation: add --yes")
    assert _state(autoscaling, "dev-a10")[1] == 2  # nothing changed
    doc = run_json("scale", "dev", "-g", "dev-a10", "--desired", "3", "--yes")
    assert [(r["group"], r["action"]) for r in doc["results"]] == [("dev-a10", "scaled")]
    assert _state(autoscaling, "dev-a10")[1] == 3
    assert error_of(run_json("scale", "dev", "-g", "dev-a10", "--desired", "9", code=2))[0] == "scale"


def test_stop_and_start_json(autoscaling: Any, ssm: Any) -> None:  # noqa: F811
    assert error_of(run_json("stop", "dev", "-g", "dev-a10", code=2)) == (
        "stop", "--json cannot ask for confirmation: add --yes")
    doc = run_json("stop", "dev", "-g", "dev-a10", "--yes")
    assert doc["identity"] == DEV_IDENTITY and doc["to_stop"] == ["dev-a10"]
    assert doc["hook"]["ok"] is True and doc["errors"] == {}
    assert "dev-a10" in doc["stopped"]
    assert {g["name"]: g["stopped_by"] for g in doc["status"]}["dev-a10"] == "manual"
    doc = run_json("start", "dev", "--dry-run")
    assert [(g["group"], g["action"], g["stopped_by"]) for g in doc["groups"]] == [
        ("dev-a10", "resume", "manual"), ("dev-extra", "skipped", None)]
    assert doc["started"] == [] and _state(autoscaling, "dev-a10") == (0, 0, "manual")
    doc = run_json("start", "dev", "--yes")
    assert [(r["group"], r["action"], r["desired_capacity"]) for r in doc["started"]] == [
        ("dev-a10", "resumed", 2)]


# ------------------------------------------------------------------------ spend, capacity


def test_spend_errors_are_json() -> None:
    assert error_of(run_json("spend", "dev", "--days", "0", code=2)) == (
        "spend", "--days: must be 1..366, got 0")


def test_capacity_search_and_buy_json(ec2: Stubber) -> None:  # noqa: F811
    assert error_of(run_json("capacity", "search", "--type", "p5.48xlarge", "--count", "65", "--days", "7",
                             code=2)) == (
        "capacity search", "--count: a Capacity Block holds 1-64 instances, got 65")
    assert searched(ec2, offering()).exit_code == 0  # what `buy` reads (search --json: test_capacity)
    # buying cannot ask with --json: without --yes nothing is bought (no purchase queued)
    assert error_of(run_json("capacity", "buy", OFFERING, code=2)) == (
        "buy", "--json cannot ask for confirmation: add --yes")
    purchased(ec2)
    doc = run_json("capacity", "buy", OFFERING, "--yes")
    assert doc["reservation_id"] == "cr-0fedcba9876543210" and doc["upfront_usd"] == 35232.0
    assert "capacity_reservation_id: cr-0fedcba9876543210" in doc["node_group"]
