"""How long a group's nodes take to be ready and to run their first job, as the nodes measured it.

Every gated node (baked or warm-pool groups: gpucluster-ready) publishes, once ready,
`TimeToReadySeconds` and the moment each boot step was done (`BootStepAtSeconds` by Step: user data
start, bundle fetched, NVIDIA services up, health check, mounts, image layers read, ready), and every
launcher node, once, `TimeToFirstJobSeconds` when its first job's unit started its process
(`gpucluster-report first-job`): all seconds since the node's kernel booted, by Stack and NodeGroup
in the cluster's metric namespace. This reads them back per group over the last 14 days as median,
worst and last: what `nodes` and `status` show.

One node reports each figure once, read back in five-minute data points (CloudWatch keeps them 63
days): a point is one node, or several that reported in the same five minutes (one scale-up's nodes
often do), whose mean then counts once for each of them (the median is then approximate; the worst,
the last point and the count are exact). The stack's series are listed first (ListMetrics, one
call a page) and only those that exist are read, so a stack whose nodes never reported costs one
call; a series shows in ListMetrics some minutes after its first data point (CloudWatch API
reference, ListMetrics), so a node that reported moments ago may not count yet. Read-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import TYPE_CHECKING, Any

from gpucluster.fleet.awsapi import batches

if TYPE_CHECKING:
    from gpucluster.ops.slurmjobs import NodeView
    from gpucluster.spec import StackSpec

WINDOW = timedelta(days=14)
TIME_TO_READY = "TimeToReadySeconds"
TIME_TO_FIRST_JOB = "TimeToFirstJobSeconds"
STEP_AT = "BootStepAtSeconds"
# The boot steps gpucluster-ready publishes, in boot order (node/ready.sh's MILESTONES).
STEPS = ("userdata", "bundle", "nvidia", "health", "mounts", "image", "ready")
STATS = ("Average", "SampleCount", "Maximum")
PERIOD_SECONDS = 300
QUERIES_PER_CALL = 500  # GetMetricData's limit (CloudWatch API reference)


@dataclass(frozen=True)
class Figure:
    """One measured duration of a group: median, worst and the last node's, over `count` nodes."""

    median_seconds: float
    worst_seconds: float
    last_seconds: float
    last_at: str
    """When the last node reported it (ISO 8601, UTC)."""
    count: int

    def as_json(self) -> dict[str, Any]:
        return {"median_seconds": round(self.median_seconds, 1),
                "worst_seconds": round(self.worst_seconds, 1),
                "last_seconds": round(self.last_seconds, 1), "last_at": self.last_at, "count": self.count}


@dataclass(frozen=True)
class GroupBootTimes:
    """A node group's measured boot: time to ready, to its first job, and when each step was done."""

    node_group: str
    time_to_ready: Figure | None
    time_to_first_job: Figure | None
    steps: dict[str, Figure] = field(default_factory=dict)
    """Step -> seconds since boot when it was done (only steps some node reported)."""

    @property
    def measured(self) -> bool:
        return self.time_to_ready is not None or self.time_to_first_job is not None or bool(self.steps)

    def as_json(self) -> dict[str, Any]:
        return {"node_group": self.node_group,
                "time_to_ready": self.time_to_ready.as_json() if self.time_to_ready else None,
                "time_to_first_job": self.time_to_first_job.as_json() if self.time_to_first_job else None,
                "steps": {k: v.as_json() for k, v in self.steps.items()}}


def figure(points: Sequence[tuple[datetime, float, float, float]]) -> Figure | None:
    """(time, mean, count, maximum) data points -> the group's figure; None without data."""
    if not points:
        return None
    samples = [mean for _, mean, count, _ in points for _ in range(max(1, round(count)))]
    when, last, _, _ = max(points, key=lambda p: p[0])
    return Figure(median_seconds=median(samples), worst_seconds=max(p[3] for p in points),
                  last_seconds=last, last_at=when.astimezone(UTC).isoformat(timespec="seconds"),
                  count=len(samples))


def _query(qid: str, namespace: str, metric: str, dimensions: Mapping[str, str], stat: str) -> dict[str, Any]:
    return {"Id": qid, "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": namespace, "MetricName": metric,
                   "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()]},
        "Period": PERIOD_SECONDS, "Stat": stat}}


def listed(cloudwatch: Any, namespace: str, identity: str) -> set[tuple[str, str, str | None]]:
    """(node group, metric, step) of the stack's boot series CloudWatch holds (ListMetrics)."""
    found: set[tuple[str, str, str | None]] = set()
    kwargs: dict[str, Any] = {"Namespace": namespace, "Dimensions": [{"Name": "Stack", "Value": identity}]}
    while True:
        page = cloudwatch.list_metrics(**kwargs)
        for metric in page.get("Metrics", []):
            if metric.get("MetricName") not in (TIME_TO_READY, TIME_TO_FIRST_JOB, STEP_AT):
                continue
            dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
            if dims.get("Stack") == identity and "NodeGroup" in dims:
                found.add((dims["NodeGroup"], metric["MetricName"], dims.get("Step")))
        if not page.get("NextToken"):
            return found
        kwargs["NextToken"] = page["NextToken"]


def boot_times(cloudwatch: Any, namespace: str, identity: str, node_groups: Sequence[str], *,
               steps: bool = False, now: datetime | None = None) -> list[GroupBootTimes]:
    """Each node group's measured boot over the last 14 days (with `steps`, each step's moment too)."""
    now = now or datetime.now(UTC)
    wanted: list[tuple[str, str, str | None]] = []  # (node group, metric, step)
    for group in node_groups:
        wanted += [(group, TIME_TO_READY, None), (group, TIME_TO_FIRST_JOB, None)]
        if steps:
            wanted += [(group, STEP_AT, step) for step in STEPS]
    published = listed(cloudwatch, namespace, identity)
    series = [key for key in wanted if key in published]
    queries = []
    for i, (group, metric, step) in enumerate(series):
        dims = {"Stack": identity, "NodeGroup": group, **({"Step": step} if step else {})}
        queries += [_query(f"q{i}s{j}", namespace, metric, dims, stat) for j, stat in enumerate(STATS)]
    values: dict[str, dict[datetime, float]] = {}
    for batch in batches(queries, QUERIES_PER_CALL):
        kwargs: dict[str, Any] = {"MetricDataQueries": batch, "StartTime": now - WINDOW, "EndTime": now}
        while True:
            page = cloudwatch.get_metric_data(**kwargs)
            for result in page.get("MetricDataResults", []):
                found = values.setdefault(result["Id"], {})
                found.update(zip(result.get("Timestamps", []), result.get("Values", []), strict=False))
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
    figures: dict[tuple[str, str, str | None], Figure | None] = dict.fromkeys(wanted)
    for i, key in enumerate(series):
        mean, count, peak = (values.get(f"q{i}s{j}", {}) for j in range(len(STATS)))
        figures[key] = figure([(t, mean[t], count.get(t, 1.0), peak.get(t, mean[t])) for t in sorted(mean)])
    out = []
    for group in node_groups:
        measured_steps = {s: f for s in STEPS if steps and (f := figures[group, STEP_AT, s]) is not None}
        out.append(GroupBootTimes(group, figures[group, TIME_TO_READY, None],
                                  figures[group, TIME_TO_FIRST_JOB, None], measured_steps))
    return out


def slurm_boot_times(views: Sequence[NodeView]) -> list[GroupBootTimes]:
    """A Slurm stack's boot per partition from Slurm's own record of its current nodes (`nodes`):
    time to ready is registration (slurmd started, SlurmdStartTime - BootTime), the first job sacct's
    first start on the node since (accounting only); the last is the node booted last. Powered-down
    nodes and nodes Slurm booted long ago (a record that outlives the 14 days) count as they are."""
    by_partition: dict[str, list[tuple[datetime, float | None, float | None]]] = {}
    for v in views:
        if v.slurm is None or v.boot is None or v.boot.booted is None:
            continue
        for partition in v.slurm.partitions:
            by_partition.setdefault(partition, []).append(
                (v.boot.booted, v.boot.registered_seconds, v.boot.first_job_seconds))
    out = []
    for partition, rows in sorted(by_partition.items()):
        registered = [(t, s, 1.0, s) for t, s, _ in rows if s is not None]
        first = [(t, s, 1.0, s) for t, _, s in rows if s is not None]
        out.append(GroupBootTimes(partition, figure(registered), figure(first)))
    return out


def stack_boot_times(spec: StackSpec, cloudwatch: Any, *, node_group: str | None = None, steps: bool = False,
                     now: datetime | None = None) -> tuple[list[GroupBootTimes], str | None]:
    """(each of the stack's node groups' boot times, why they could not be read or None): the
    listing a command shows is worth having without them."""
    from gpucluster.fleet.awsapi import AWS_ERRORS
    from gpucluster.noderole import gpu_metric_namespace

    names = [g.name for g in spec.node_groups if node_group in (None, g.name)]
    try:
        return boot_times(cloudwatch, gpu_metric_namespace(spec.cluster.name), spec.identity, names,
                          steps=steps, now=now), None
    except AWS_ERRORS as exc:
        return [], f"boot times not read from CloudWatch: {exc}"
