"""`--json` of the operator commands (run, with --nccl-test and --restart-on-replace, hostfile, scale,
stop, start, jobs, logs, cancel, spend, capacity): one JSON object on stdout (`logs --follow`: JSON
Lines, an object a line), errors as `{"errors": [...]}` with the same exit code, and nothing that
asks: without --yes a command that would ask is a usage error (exit 2), nothing done."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.fleet.jobnames import job_parameter_name
from test_capacity import OFFERING, ec2, offering, purchased, searched  # noqa: F401  (ec2: fixture)
from test_detached_jobs import _stub_ssm
from test_job_logs import GROUP, T0, _stub_logs, ended, event
from test_jobs import PROD, _invocation, _online, aws  # noqa: F401  (aws: fixture)
from test_nccl_test import FakeSsm
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


# ------------------------------------------- run --nccl-test, --restart-on-replace, logs --follow


def test_run_nccl_test_json_gives_the_bandwidth_per_size_and_the_verdict(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    fake = FakeSsm()
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: fake if service == "ssm" else real(spec, service))
    dry = run_json("run", "prod", "-g", "h100-train", "--nccl-test", "--dry-run")
    assert fake.sent == [] and dry["dry_run"] is True
    ids = dry["phases"]["authorize"]
    assert len(ids) == 3
    assert dry["phases"] == {"key": ids[:1], "authorize": ids, "run": ids[:1], "revoke": ids}
    assert (dry["instance_type"], dry["efa"], dry["gpus_per_node"], dry["max_bytes"]) == (
        "p5.48xlarge", True, 8, "4G")

    doc = run_json("run", "prod", "-g", "h100-train", "--nccl-test", code=1)  # 10 % of the network
    assert doc["passed"] is False and doc["failed_phase"] is None and doc["key_revoked"] is True
    assert [row["size_bytes"] for row in doc["rows"]] == [2097152 << i for i in range(5)]
    assert doc["rows"][0] == {"size_bytes": 2097152, "dtype": "float", "busbw_out_of_place_gbs": 18.53,
                              "busbw_in_place_gbs": 22.46, "wrong": 0}
    assert (doc["expected_busbw_gbs"], doc["network_gbps"], doc["avg_busbw_gbs"]) == (400.0, 3200, 33.127)
    assert doc["peak"] == {"size_bytes": 33554432, "busbw_gbs": 41.52, "of_expected": 0.1038}
    assert any(f.startswith("below 50% of the network") for f in doc["findings"])
    assert list(doc["phases"]) == ["key", "authorize", "run", "revoke"]
    assert [len(doc["phases"][p]) for p in doc["phases"]] == [1, 3, 1, 3]
    assert doc["log_on_rank_0"] == f"/var/log/gpucluster/nccl-test-{doc['run_id']}.log"


def test_run_restart_on_replace_json_shows_the_record(aws: dict[str, Any],  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    name = job_parameter_name(PROD, "pretrain")
    dry = run_json("run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain", "--dry-run",
                   "--restart-on-replace", "--", "torchrun", "train.py")
    assert dry["restart_record"]["parameter"] == name
    assert (dry["restart_record"]["record"]["nnodes"], dry["restart_record"]["record"]["command"]) == (
        3, "torchrun train.py")
    started = _invocation("Success", 0, "started job pretrain\n")
    with _stub_ssm(monkeypatch, [started] * 3) as stub:
        stub.add_response("put_parameter", {"Version": 1}, {
            "Name": name, "Value": ANY, "Type": "String", "Overwrite": True, "Description": ANY})
        doc = run_json("run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                       "--restart-on-replace", "--", "torchrun", "train.py")
        stub.assert_no_pending_responses()
    assert doc["ok"] is True and doc["restart_on_replace"] is True
    assert (doc["restart_record"]["parameter"], doc["restart_record"]["stored"]) == (name, True)
    assert "back to 3 node(s)" in doc["restart_record"]["message"]
    with _stub_ssm(monkeypatch, [started] * 3) as stub:  # SSM refuses the record: the job runs, exit 1
        stub.add_client_error("put_parameter", "AccessDeniedException")
        doc = run_json("run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                       "--restart-on-replace", "--", "torchrun", "train.py", code=1)
    assert doc["ok"] is True and doc["restart_record"]["stored"] is False
    assert doc["restart_record"]["message"].startswith("run: the job runs, but restart-on-replace is off")


def test_logs_follow_json_is_json_lines(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """One compact object a log line as it arrives, then how the job ended; errors on one line too."""
    _online(monkeypatch)

    class Logs:
        def filter_log_events(self, **kwargs: Any) -> dict[str, Any]:
            return {"events": [e for s in kwargs["logStreamNames"] for e in (
                event(f"{s}-1", s, T0, "epoch 1 done"), event(f"{s}-2", s, T0 + 5, ended("pretrain")))]}

    _stub_logs(monkeypatch, Logs())
    running = _invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n")
    with _stub_ssm(monkeypatch, [running] * 3):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "--follow", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    docs = [json.loads(line) for line in lines]  # every line is one JSON document
    assert result.stderr == ""  # no banner, no spinner: stdout is the whole answer
    assert [d["event"] for d in docs] == ["line"] * 6 + ["end"]
    assert {d["instance_id"] for d in docs[:6]} == {n["instance_id"] for n in docs[-1]["nodes"]}
    assert [d["message"] for d in docs[:6]].count("epoch 1 done") == 3
    assert all(d["timestamp"] in (T0, T0 + 5) for d in docs[:6])
    end = docs[-1]
    assert (end["stack"], end["job"], end["log_group"], end["ok"], end["no_answer"]) == (
        "prod", "pretrain", GROUP, True, [])
    assert [(n["result"], n["exit_status"], n["ok"]) for n in end["nodes"]] == [("success", "0", True)] * 3

    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "")] * 3):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "-f", "--json"])
    assert result.exit_code == 1
    assert result.stdout == json.dumps({"errors": [{"path": "logs", "message": (
        "no job pretrain on the 3 node(s) that answered (see `gpucluster jobs prod`)")}]},
        separators=(",", ":")) + "\n"
    bad = runner.invoke(app, ["logs", "prod", "Bad;name", "-f", "--json"])
    assert bad.exit_code == 2 and len(bad.stdout.splitlines()) == 1
    assert json.loads(bad.stdout)["errors"][0]["path"] == "logs"


@pytest.mark.parametrize(("args", "message"), [
    (("run", "prod", "-g", "h100-train", "--nccl-test", "--", "true"),
     "--nccl-test runs its own benchmark: give no command, --detach, --name or --restart-on-replace"),
    (("run", "prod", "-g", "h100-train", "--nccl-test", "--nccl-max-bytes", "9T"),
     "--nccl-max-bytes: a size like 512M or 4G, got '9T'"),
    (("run", "prod", "-g", "h100-train", "--restart-on-replace", "--", "true"),
     "--restart-on-replace restarts detached jobs: add --detach"),
    (("logs", "prod", "pretrain", "--follow", "--lines", "0"), "--lines: must be 1..5000, got 0"),
])
def test_the_new_modes_refuse_in_json(args: tuple[str, ...], message: str, aws: dict[str, Any],  # noqa: F811
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    assert error_of(run_json(*args, code=2)) == (args[0], message)


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
