"""Time to ready and to the first job, as the nodes measured it (issue 38): `nodes` and `status` read
each group's median, worst and last from the metrics the nodes publish (moto's CloudWatch here, fed
the reports gpucluster-ready and gpucluster-report send: same names, units and dimensions)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from gpucluster.cli import app
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.ops.boottimes import Figure, boot_times, figure
from moto_groups import ACTIVE, cost_explorer
from test_jobs import PROD, _online, aws  # noqa: F401  (aws: fixture)

runner = CliRunner()
NAMESPACE = gpu_metric_namespace("gpu-prod")


def report(cloudwatch: Any, group: str, minutes_ago: float, ready: int | None, first_job: int | None,
           steps: dict[str, int] | None = None, stack: str = PROD) -> None:
    """One node's reports, as its scripts send them (ready.sh's --metric-data list; report.sh's first job)."""
    at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    dims = [{"Name": "Stack", "Value": stack}, {"Name": "NodeGroup", "Value": group}]
    data = [{"MetricName": "BootStepAtSeconds", "Unit": "Seconds", "Value": value, "Timestamp": at,
             "Dimensions": [*dims, {"Name": "Step", "Value": step}]} for step, value in (steps or {}).items()]
    if ready is not None:
        data.append({"MetricName": "TimeToReadySeconds", "Unit": "Seconds", "Value": ready, "Timestamp": at,
                     "Dimensions": dims})
    if first_job is not None:
        data.append({"MetricName": "TimeToFirstJobSeconds", "Unit": "Seconds", "Value": first_job,
                     "Timestamp": at + timedelta(minutes=2), "Dimensions": dims})
    cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=data)


def fixture_reports(cloudwatch: Any) -> None:
    """Three h100-train nodes over the last days (the newest 2 hours ago), none of eval's; another
    stack's node in the same namespace is never counted."""
    report(cloudwatch, "h100-train", 3 * 24 * 60, 250, 330,
           {"userdata": 120, "bundle": 122, "nvidia": 150, "health": 200, "mounts": 205, "image": 248,
            "ready": 250})
    report(cloudwatch, "h100-train", 24 * 60, 310, 400, {"userdata": 160, "ready": 310})
    report(cloudwatch, "h100-train", 120, 220, None, {"userdata": 100, "ready": 220})
    report(cloudwatch, "h100-train", 60, 999, 999, stack="organization/gpucluster/dev/gpu-dev")


def test_nodes_json_shows_each_groups_measured_boot(aws: dict[str, Any],  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    fixture_reports(boto3.client("cloudwatch"))
    result = runner.invoke(app, ["nodes", "prod", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["boot_times_error"] is None and len(doc["nodes"]) == 4
    boots = {b["node_group"]: b for b in doc["boot_times"]}
    assert set(boots) == {"h100-train", "eval"}  # the stack file's node groups
    train = boots["h100-train"]
    ready = train["time_to_ready"]
    assert (ready["median_seconds"], ready["worst_seconds"], ready["last_seconds"], ready["count"]) == (
        250.0, 310.0, 220.0, 3)
    first = train["time_to_first_job"]
    assert (first["median_seconds"], first["worst_seconds"], first["last_seconds"], first["count"]) == (
        365.0, 400.0, 400.0, 2)
    assert train["steps"]["userdata"]["median_seconds"] == 120.0 and train["steps"]["userdata"]["count"] == 3
    assert train["steps"]["image"] == {**train["steps"]["image"], "median_seconds": 248.0, "count": 1}
    assert list(train["steps"]) == ["userdata", "bundle", "nvidia", "health", "mounts", "image", "ready"]
    assert boots["eval"] == {"node_group": "eval", "time_to_ready": None, "time_to_first_job": None,
                              "steps": {}}

    text = runner.invoke(app, ["nodes", "prod"])
    assert text.exit_code == 0, text.output
    assert "boot, as the nodes measured it (last 14 days; from each node's boot):" in text.output
    row = next(line.split() for line in text.output.splitlines() if line.startswith("  h100-train "))
    assert row == ["h100-train", "4m10s", "5m10s", "3m40s", "3", "6m05s", "6m40s", "6m40s", "2"]
    assert "h100-train steps (median, seconds after boot): userdata 120, bundle 122," in text.output


def test_status_shows_the_same_figures_and_nothing_while_no_node_reported(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from gpucluster.cli import common

    monkeypatch.setattr(common, "cost_explorer", lambda _spec: cost_explorer(ACTIVE))  # spend: not read
    before = runner.invoke(app, ["status", "prod"])
    assert before.exit_code == 0, before.output
    assert "boot, as the nodes measured it" not in before.output  # no series: one ListMetrics, no table
    fixture_reports(boto3.client("cloudwatch"))
    doc = json.loads(runner.invoke(app, ["status", "prod", "--json"]).stdout)
    train = next(b for b in doc["boot_times"] if b["node_group"] == "h100-train")
    assert train["time_to_ready"]["median_seconds"] == 250.0 and train["steps"] == {}  # status: no steps
    assert doc["boot_times_error"] is None


def test_the_median_counts_a_minute_two_nodes_shared_twice_and_the_last_is_the_newest() -> None:
    t = datetime(2026, 11, 29, tzinfo=UTC)
    found = figure([(t, 100.0, 1.0, 100.0), (t + timedelta(minutes=5), 200.0, 2.0, 260.0),
                    (t + timedelta(minutes=1), 150.0, 1.0, 150.0)])
    assert found == Figure(median_seconds=175.0, worst_seconds=260.0, last_seconds=200.0,
                           last_at="2026-11-29T00:05:00+00:00", count=4)
    assert figure([]) is None


class NoListing:
    """A CloudWatch that holds no series: boot_times must then read no data at all."""

    def list_metrics(self, **_: Any) -> dict[str, Any]:
        return {"Metrics": []}

    def get_metric_data(self, **_: Any) -> dict[str, Any]:
        raise AssertionError("read a series that does not exist")


def test_a_stack_whose_nodes_never_reported_costs_one_listing() -> None:
    found = boot_times(NoListing(), NAMESPACE, PROD, ["h100-train"], steps=True)
    assert [b.measured for b in found] == [False]


def test_cloudwatch_refusing_is_one_line_and_the_listing_stays(aws: dict[str, Any],  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import ClientError

    from gpucluster.ops import boottimes

    def denied(*_: Any, **__: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed"}}, "ListMetrics")

    _online(monkeypatch)
    monkeypatch.setattr(boottimes, "listed", denied)
    result = runner.invoke(app, ["nodes", "prod", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["boot_times"] == [] and "not allowed" in doc["boot_times_error"] and len(doc["nodes"]) == 4
    text = runner.invoke(app, ["nodes", "prod"])
    assert text.exit_code == 0 and "boot times not read from CloudWatch" in text.output


# ------------------------------------------------------------------ Slurm: its own record

SCONTROL = ("NodeName=gpu-1 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 State=IDLE BootTime=2026-11-29T06:00:00 "
            "SlurmdStartTime=2026-11-29T06:02:31 LastBusyTime=2026-11-29T06:10:00 Partitions=h100-train\n"
            "NodeName=gpu-2 Arch=x86_64 State=IDLE BootTime=2026-11-29T07:00:00 "
            "SlurmdStartTime=2026-11-29T07:01:40 Partitions=h100-train\n"
            "NodeName=gpu-3 State=IDLE+CLOUD+POWERED_DOWN BootTime=None SlurmdStartTime=None "
            "Partitions=h100-train\n")
# an older job on gpu-1 before this boot's slurmd is not its first job; pending jobs have no nodes
SACCT = ("2026-11-28T22:00:00|gpu-1\n2026-11-29T06:05:00|gpu-[1-2]\n2026-11-29T07:04:00|gpu-2\n"
         "Unknown|None assigned\n")


def test_slurm_records_registration_and_the_first_job_since_each_nodes_boot() -> None:
    from gpucluster.slurm.remote import (
        SECTION,
        NodeBoot,
        expand_hostlist,
        nodes_script,
        parse_node_boots,
        parse_sinfo,
    )

    output = (f"gpu-1|h100-train|idle|10.0.1.5|ip-10-0-1-5|none\n{SECTION}scontrol\n{SCONTROL}"
              f"{SECTION}sacct\n{SACCT}")
    boots = parse_node_boots(output)
    assert boots["gpu-1"] == NodeBoot(151.0, 300.0, datetime(2026, 11, 29, 6, 0))
    # gpu-2's slurmd started 07:01:40: the 06:05 job predates it, its first is 07:04 (240 s after boot)
    assert boots["gpu-2"] == NodeBoot(100.0, 240.0, datetime(2026, 11, 29, 7, 0))
    assert boots["gpu-3"] == NodeBoot(None, None, None)  # powered down: no boot
    assert [n.name for n in parse_sinfo(output)] == ["gpu-1"]  # sinfo stops at the first section
    # without accounting there is no sacct section: registration only
    assert parse_node_boots(f"{SECTION}scontrol\n{SCONTROL}")["gpu-1"].first_job_seconds is None
    assert "sacct" not in nodes_script() and "--starttime=now-14days" in nodes_script(accounting=True)
    assert "scontrol --oneliner show node" in nodes_script()
    assert expand_hostlist("gpu-[1-3,05],login-1") == ["gpu-1", "gpu-2", "gpu-3", "gpu-05", "login-1"]
    assert expand_hostlist("gpu-[08-10]") == ["gpu-08", "gpu-09", "gpu-10"]


def test_slurm_boot_times_per_partition() -> None:
    from gpucluster.ops.boottimes import slurm_boot_times
    from gpucluster.ops.slurmjobs import NodeView
    from gpucluster.slurm.remote import SlurmNode, parse_node_boots

    boots = parse_node_boots(f"==gpucluster:scontrol\n{SCONTROL}==gpucluster:sacct\n{SACCT}")
    views = [NodeView(SlurmNode(name, ("h100-train",), "idle", "", "", ""), None, boots[name])
             for name in ("gpu-1", "gpu-2", "gpu-3")]
    [row] = slurm_boot_times(views)
    assert row.node_group == "h100-train" and row.time_to_ready is not None
    assert (row.time_to_ready.median_seconds, row.time_to_ready.worst_seconds, row.time_to_ready.last_seconds,
            row.time_to_ready.count) == (125.5, 151.0, 100.0, 2)  # last: gpu-2, booted last
    assert row.time_to_first_job is not None and row.time_to_first_job.median_seconds == 270.0
    first = views[0].as_json()
    assert (first["registered_seconds"], first["first_job_seconds"]) == (151.0, 300.0)
