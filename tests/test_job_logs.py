"""`gpucluster logs STACK JOB --follow`: a detached job's output from the run log group, until it ends.

CloudWatch Logs is botocore's Stubber (each FilterLogEvents call asserted with its parameters);
the nodes are moto's (the `aws` fixture of test_jobs), the `gpucluster-job status` step a stubbed SSM.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.node.userdata import cloudwatch_agent_config, node_files
from gpucluster.ops import joblogs
from gpucluster.ops.joblogs import Ending, JobFollower, follow, job_log_stream, parse_started
from gpucluster.ops.nodes import stack_nodes
from test_detached_jobs import _stub_ssm
from test_jobs import PROD, _invocation, _online, aws  # noqa: F401  (fixture)

runner = CliRunner()
GROUP = "/gpucluster/organization/gpucluster/prod/gpu-prod/run"
T0 = 1_748_858_400_000  # 2025-06-02 10:00:00 UTC, in ms


def event(event_id: str, stream: str, at: int, message: str) -> dict[str, Any]:
    return {"eventId": event_id, "logStreamName": stream, "timestamp": at, "ingestionTime": at + 4000,
            "message": message}


def started(job: str = "train") -> str:
    return f"gpucluster-job: {job} started (restart 0) 2025-06-02T10:00:00+00:00"


def ended(job: str = "train", result: str = "success", status: str = "0") -> str:
    return f"gpucluster-job: {job} ended: result {result}, exit status {status} 2025-06-02T11:00:00+00:00"


class Clock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# ------------------------------------------------------------------------------- the follower


def test_stream_names_are_the_agents_for_the_job_file() -> None:
    """publish_multi_logs: <log_stream_name>_<path, '/' as '_'> (amazon-cloudwatch-agent logfile.go)."""
    assert job_log_stream("i-0abc", "train") == "i-0abc__var_log_gpucluster_jobs_train.log"
    config = cloudwatch_agent_config("gpu-prod", GROUP)
    [entry] = config["logs"]["logs_collected"]["files"]["collect_list"]  # type: ignore[index]
    assert entry == {"file_path": "/var/log/gpucluster/jobs/*.log", "log_group_name": GROUP,
                     "log_stream_name": "{instance_id}", "publish_multi_logs": True, "from_beginning": True}


def test_every_node_ships_job_files_into_its_stacks_run_log_group() -> None:
    from test_node_setup import plain_group

    settings = plain_group()
    [agent] = [f for f in node_files(settings) if f.path.endswith("cloudwatch-agent/etc/gpucluster.json")]
    collect = json.loads(agent.content)["logs"]["logs_collected"]["files"]["collect_list"]
    assert [c["log_group_name"] for c in collect] == [f"/gpucluster/{settings.stack}/run"]


def test_a_job_that_ends_after_two_polls_prints_each_line_once() -> None:
    logs = boto3.client("logs", region_name="us-east-1")
    one, two = job_log_stream("i-1", "train"), job_log_stream("i-2", "train")
    first = [event("1", one, T0, started()), event("2", one, T0 + 100, "step 1 loss 2.0"),
             event("3", two, T0 + 150, "rank 8 ready")]
    second = [event("2", one, T0 + 100, "step 1 loss 2.0"), event("3", two, T0 + 150, "rank 8 ready"),
              # 2 and 3 again, then what is new
              event("4", one, T0 + 90_000, "step 2 loss 1.9"), event("5", one, T0 + 95_000, ended()),
              event("6", two, T0 + 95_100, ended(result="exit-code", status="1"))]
    params = {"logGroupName": GROUP, "logStreamNames": [one, two]}
    clock = Clock()
    with Stubber(logs) as stub:
        # the first poll is two pages (FilterLogEvents scans in chunks and returns a token)
        stub.add_response("filter_log_events", {"events": first[:2], "nextToken": "t1"},
                          {**params, "startTime": T0 - 60_000})
        stub.add_response("filter_log_events", {"events": first[2:]},
                          {**params, "startTime": T0 - 60_000, "nextToken": "t1"})
        # the second reaches back LOOKBACK_MS before the newest event seen, for late batches
        stub.add_response("filter_log_events", {"events": second},
                          {**params, "startTime": T0 + 150 - joblogs.LOOKBACK_MS})
        follower = JobFollower(logs, GROUP, "train", {one: "i-1", two: "i-2"}, T0 - 60_000, {one, two})
        printed: list[str] = []
        follow(follower, lambda line: printed.append(line.message), sleep=clock.sleep, clock=clock.clock)
        stub.assert_no_pending_responses()
    assert printed == [started(), "step 1 loss 2.0", "rank 8 ready", "step 2 loss 1.9", ended(),
                       ended(result="exit-code", status="1")]
    assert clock.sleeps == [joblogs.MIN_POLL_SECONDS]  # one wait, between the two polls
    assert follower.endings == {one: Ending("success", "0"), two: Ending("exit-code", "1")}
    assert follower.endings[one].ok and not follower.endings[two].ok


class QuietLogs:
    """FilterLogEvents with nothing new `quiet` times, then an end line (and a missing stream first)."""

    def __init__(self, quiet: int, stream: str) -> None:
        self.quiet, self.stream, self.calls = quiet, stream, 0

    def filter_log_events(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            from botocore.exceptions import ClientError
            raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "no stream"}},
                              "FilterLogEvents")
        if self.calls <= self.quiet:
            return {"events": []}
        return {"events": [event("9", self.stream, T0, ended())]}


def test_polling_backs_off_to_a_bounded_interval_and_never_spins() -> None:
    stream = job_log_stream("i-1", "train")
    logs, clock = QuietLogs(8, stream), Clock()
    follower = JobFollower(logs, GROUP, "train", {stream: "i-1"}, T0, {stream})
    follow(follower, lambda _: None, sleep=clock.sleep, clock=clock.clock)
    assert logs.calls == 9
    assert clock.sleeps == [2.0, 4.0, 8.0, 15.0, 15.0, 15.0, 15.0, 15.0]  # doubling, capped, never 0
    assert all(joblogs.MIN_POLL_SECONDS <= s <= joblogs.MAX_POLL_SECONDS for s in clock.sleeps)


def test_a_node_that_is_gone_stops_the_wait_and_a_restart_starts_it_again() -> None:
    stream, other = job_log_stream("i-1", "train"), job_log_stream("i-2", "train")

    class Logs:
        def filter_log_events(self, **_: Any) -> dict[str, Any]:
            return {"events": [event("1", stream, T0, ended(result="signal", status="TERM")),
                               event("2", stream, T0 + 10, started())]}  # restarted on that node

    clock = Clock()
    follower = JobFollower(Logs(), GROUP, "train", {stream: "i-1", other: "i-2"}, T0, {stream, other})
    asked: list[set[str]] = []

    def running(ids: Any) -> set[str]:
        asked.append(set(ids))
        return {"i-1"}  # i-2 was reclaimed and wrote no end line

    with pytest.raises(RuntimeError, match="stop"):
        def stop_after_gone(seconds: float) -> None:
            clock.sleep(seconds)
            if "i-2" not in {follower.streams[s] for s in follower.waiting} and len(asked) >= 1:
                raise RuntimeError("stop")
        follow(follower, lambda _: None, running=running, sleep=stop_after_gone, clock=clock.clock)
    assert follower.waiting == {stream}  # its end line was followed by a new start
    assert follower.endings == {other: Ending("node gone", "-")}
    assert asked and all(ids <= {"i-1", "i-2"} for ids in asked)


def test_started_times_from_the_job_tool() -> None:
    assert parse_started("Mon_2025-06-02_10:00:00_UTC") == datetime(2025, 6, 2, 10, tzinfo=UTC)
    assert parse_started("Mon 2025-06-02 10:00:00 UTC") == datetime(2025, 6, 2, 10, tzinfo=UTC)
    assert parse_started("n/a") is None


# --------------------------------------------------------------------------------------- CLI


def _stub_logs(monkeypatch: pytest.MonkeyPatch, logs: Any) -> None:
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: logs if service == "logs" else real(spec, service))


def test_cli_follow_of_one_node_reads_only_its_stream(aws: dict[str, Any],  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    nodes = stack_nodes(PROD, node_group="h100-train", autoscaling_client=aws["autoscaling"],
                        ec2_client=aws["ec2"],
                        ssm_client=boto3.client("ssm", region_name="us-east-1"))
    chosen = nodes[1].instance_id
    stream = job_log_stream(chosen, "pretrain")
    logs = boto3.client("logs", region_name="us-east-1")
    stub = Stubber(logs)
    stub.add_response("filter_log_events", {"events": [
        event("1", stream, T0, started("pretrain")), event("2", stream, T0 + 5, "epoch 3 done"),
        event("3", stream, T0 + 9, ended("pretrain"))]},
        {"logGroupName": GROUP, "logStreamNames": [stream], "startTime": T0 - 60_000})
    _stub_logs(monkeypatch, logs)
    status = _invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n"
                                       "other exited 0 Mon_2025-06-01_10:00:00_UTC\n")
    with _stub_ssm(monkeypatch, [status]), stub:
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "--node", chosen,
                                     "--follow"])
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    # the job's lines alone on stdout (one node: as they are); what is followed and how it ended on stderr
    assert result.stdout.splitlines() == [started("pretrain"), "epoch 3 done", ended("pretrain")]
    assert result.stderr.startswith("following job pretrain on 1 node(s) (1 running)")
    assert f"{chosen}: ended: result success, exit status 0" in result.stderr.splitlines()
    assert max(len(line) for line in result.stderr.splitlines()) <= 100


def test_cli_follow_exits_1_when_a_node_failed_and_when_no_node_has_the_job(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)

    class Logs:
        def filter_log_events(self, **kwargs: Any) -> dict[str, Any]:
            return {"events": [event(s, s, T0, ended("pretrain", "exit-code", "2"))
                               for s in kwargs["logStreamNames"]]}

    _stub_logs(monkeypatch, Logs())
    running = _invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n")
    with _stub_ssm(monkeypatch, [running] * 3):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "-f"])
    assert result.exit_code == 1, result.output
    assert result.output.count("ended: result exit-code, exit status 2") == 6  # 3 lines, 3 summaries
    assert all(" | gpucluster-job: pretrain ended" in line for line in result.output.splitlines()
               if line.startswith("i-") and "|" in line)  # several nodes: each line names its node
    with _stub_ssm(monkeypatch, [_invocation("Success", 0, "")] * 3):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "--follow"])
    assert result.exit_code == 1
    assert "logs: no job pretrain on the 3 node(s) that answered" in result.output


def test_cli_follow_ctrl_c_exits_130_quietly(aws: dict[str, Any],  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)

    class Logs:
        def filter_log_events(self, **_: Any) -> dict[str, Any]:
            raise KeyboardInterrupt

    _stub_logs(monkeypatch, Logs())
    running = _invocation("Success", 0, "pretrain running 0 Mon_2025-06-02_10:00:00_UTC\n")
    with _stub_ssm(monkeypatch, [running]):
        result = runner.invoke(app, ["logs", "prod", "pretrain", "-g", "h100-train", "--node", "0", "-f"])
    assert result.exit_code == 130
    assert "Traceback" not in result.output and "Aborted" not in result.output
