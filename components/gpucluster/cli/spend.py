"""`gpucluster spend STACK`: what the stack actually cost, what `cost` estimated, the gap, idle waste.

Only argument handling and rendering live here; the work is `gpucluster.ops.spend`
(Cost Explorer, CloudWatch and Auto Scaling reads, read-only) and `gpucluster.chart`.
Registered on the `gpucluster` app by `gpucluster.cli.entry`; it must never import another
command module.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpucluster.cli import common, render
from gpucluster.cli.common import (
    JsonOption,
    StackArg,
    aws_call,
    build_spec,
    fail_usage,
    ops_call,
    usd,
)

if TYPE_CHECKING:
    from gpucluster.ops.spend import Spend
    from gpucluster.spec import StackSpec

def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:+.1f} %" if whole else "-"


def render_spend(s: Spend) -> list[str]:
    """The human output of `gpucluster spend STACK`."""
    from gpucluster.fleet.spendreport import purchase_label

    w = s.window
    out = [f"stack {s.stack} ({s.region}), tag gpucluster:stack={s.identity}: "
           f"{w.start.isoformat()} .. {w.end.isoformat()} (exclusive), {len(w.days)} day(s), UTC",
           f"actual ${usd(s.actual)} (Cost Explorer, amortized) against the estimate "
           f"${usd(s.estimate.total)} "
           f"(as scheduled, desired nodes, {s.estimate.running_hours:,.1f} running hours): gap "
           f"{'+' if s.gap >= 0 else '-'}${usd(abs(s.gap))} ({_percent(s.gap, s.estimate.total)})"]
    if s.estimated_days:
        out.append("  Cost Explorer marks some of these days as estimated: the bill is not final yet")
    out.append("")
    groups = s.by_group_and_purchase()
    options = sorted({o for v in groups.values() for o in v})
    names = [g for g in groups if g is not None] + [g for g in s.estimate.by_group
                                                    if g is not None and g not in groups]
    rows = []
    for name in [*sorted(names), None]:
        parts = groups.get(name, {})
        label = f"node group {name}" if name is not None else "non-GPU remainder"
        rows.append([label, usd(sum(parts.values())), usd(s.estimate.by_group.get(name, 0.0)),
                     *[usd(parts.get(o, 0.0)) for o in options]])
    rows.append(["total", usd(s.actual), usd(s.estimate.total),
                 *[usd(sum(v.get(o, 0.0) for v in groups.values())) for o in options]])
    out += render.table(["", "actual $", "estimate $", *[f"{purchase_label(o)} $" for o in options]], rows)
    out += ["estimate: each node group's node-hours at its price, as `gpucluster cost` prices the group:",
            *render.node_hour_lines(s.estimate.node_hour_prices)]
    waste = s.waste
    share = waste.share_percent
    out += ["", f"idle waste: ${usd(waste.idle_usd)}"
            + (f", {share:.1f} % of the GPU spend (${usd(waste.gpu_spend_usd)})"
               if share is not None else "")
            + " (GPU-hours below the idle threshold, at the price each group paid)"]
    if waste.groups:
        out += render.table(
            ["node group", "GPU-hours", "idle GPU-hours", "$/GPU-hour", "idle $", "price"],
            [[g.group, f"{g.usage.gpu_hours:,.1f}", f"{g.usage.idle_gpu_hours:,.1f}",
              "-" if g.usd_per_gpu_hour is None else f"{g.usd_per_gpu_hour:,.4f}", usd(g.idle_usd), g.basis]
             for g in waste.groups])
    else:
        out.append("  no GPU metrics: no node of the stack published any in these days")
    if s.gap_is_large and s.reasons:
        out += ["", "why the gap is large (most likely first):", *[f"  - {r}" for r in s.reasons]]
    elif s.reasons and any("cost allocation tag" in r for r in s.reasons):
        out += ["", *[f"note: {r}" for r in s.reasons if "cost allocation tag" in r]]
    return out


def spend_by(spec: StackSpec, by: str, start: datetime, end: datetime, as_json: bool) -> None:
    """`spend --by user|job`: Slurm accounting's hours priced as `cost` prices each node group."""
    from gpucluster.ops.slurmjobs import usage

    if by not in ("user", "job"):
        fail_usage("spend", f"--by: must be user or job, got {by!r}")
    found = ops_call("spend", lambda: usage(spec, by, start, end, clients=common.clients(spec),
                                            progress=render.progress), None)
    if as_json:
        prices = sorted(found.prices.items())
        render.emit({"stack": spec.stack, "identity": spec.identity, "region": spec.region, "currency": "USD",
                     "by": by, "period": {"start": start.isoformat(), "end": end.isoformat()},
                     "usd_per_node_hour": {k: round(v.usd_per_hour, 4) for k, v in prices},
                     "price_basis": {k: v.basis for k, v in prices},
                     "total_usd": round(found.usd, 2),
                     "rows": [{"key": r.key, "jobs": r.jobs, "node_hours": round(r.node_hours, 4),
                               "gpu_hours": round(r.gpu_hours, 4),
                               "usd": None if r.usd is None else round(r.usd, 2), "detail": r.detail or None}
                              for r in found.rows]})
        return
    render.say(f"stack {spec.stack} ({spec.region}): Slurm accounting (sacct), {start:%Y-%m-%d} .. "
               f"{end:%Y-%m-%d} (exclusive), UTC, by {by}; node-hours at each node group's price as "
               "`gpucluster cost` gives it")
    for line in render.node_hour_lines(found.prices):
        render.say(line)
    if not found.rows:
        render.say("no job ran in these days")
        return
    for line in render.usage_lines(found.rows, by):
        render.say(line)
    render.say(f"total ${usd(found.usd)}" + (" (unpriced rows ran on a partition that is no node group's)"
                                              if any(r.usd is None for r in found.rows) else ""))


def spend(
    stack: StackArg,
    days: Annotated[int | None, typer.Option(
        "--days", help="The N whole UTC days before today (default 7).")] = None,
    month: Annotated[str | None, typer.Option(
        "--month", metavar="YYYY-MM", help="One calendar month (up to yesterday for this month).")] = None,
    as_json: JsonOption = False,
    chart: Annotated[Path | None, typer.Option(
        "--chart", metavar="FILE.png", help="Also draw actual against estimate per day.")] = None,
    by: Annotated[str | None, typer.Option(
        "--by", metavar="user|job", help="Slurm stacks with accounting: GPU-hours and their cost per user or "
                                         "per job (sacct on the login node), instead of the bill.")] = None,
) -> None:
    """Actual cost (Cost Explorer) by node group and purchase option, next to the estimate, and idle waste.

    With --by user|job on a Slurm stack with accounting: GPU-hours per user or job from sacct, priced
    at each node group's node-hour price.
    """
    from gpucluster.ops.spend import SpendError, stack_spend, window_for

    render.use_json(as_json)
    try:
        window = window_for(datetime.now(UTC).date(), days, month)
    except SpendError as err:
        fail_usage("spend", str(err))
    spec = build_spec(stack)
    if by is not None:
        if chart is not None:
            fail_usage("spend", "--chart draws the bill: give no --by with it")
        spend_by(spec, by, window.start_time, window.end_time, as_json)
        return
    clients = common.clients(spec)
    try:
        result = aws_call("spend", lambda: stack_spend(spec, window, ce=clients("ce"), cloudwatch=clients(
                              "cloudwatch"), autoscaling=clients("autoscaling")),
                           f"reading {spec.stack}'s costs (Cost Explorer) and GPU metrics")
    except SpendError as err:
        fail_usage("spend", str(err))
    if chart is not None:
        from gpucluster.chart import ChartUnavailable, draw_spend_chart

        try:
            draw_spend_chart(result, chart)
        except ChartUnavailable as err:
            fail_usage("spend", str(err))
    if as_json:
        render.emit(result.as_json())
        return
    for line in render_spend(result):
        render.say(line)
    if chart is not None:
        render.say(f"chart: {chart}")
