"""Replay a month of a GPU stack on a fake clock: how late the budget and idle stops come, and what it costs.

    .venv/bin/python benchmarks/guard_latency.py [--nodes 4] [--type p5.48xlarge] [--check-minutes 5]

Budget. A stack of `--nodes` on-demand `--type` nodes (catalog price) plus the shipped prod stack's
fixed costs runs weekdays 08:00-20:00 UTC; on the third Friday nobody stops it and it runs on. The
limit is set so that the month crosses it that weekend. Ground truth is the integral of what runs.
- before: AWS Budgets evaluates "up to three times a day" (8-12 h apart) on billing data that lags
  hours (DESIGN.md, AWS Budgets user guide "Best practices"): the stop comes at the first refresh whose
  lagged figure is over the limit. Best case: refreshes every 8 h on data 4 h old; worst: every 12 h,
  data 12 h old; each over every phase of the refresh clock (worst phase reported).
- after: the spend guard every `--check-minutes`, with the handler's own functions
  (`gpucluster.fleet.accrual.accrue` and `decide`): Cost Explorer's settled figure is the true cost
  through `settled_through` (the day before yesterday), the in-service instances are the timeline's,
  and the group metric's instance-hours are the timeline's too (`group_hours`).
Either way capacity reaches 0 `STOP_MINUTES` after the stop call (termination), and the nodes bill
until then. Printed: minutes from the crossing to capacity 0 and dollars past the limit.

Slurm, nodes stopped yesterday. The same weekdays, the limit crossed 30 minutes into a weekday
morning: what ran yesterday (08-20) is past the settled point and stopped. A PCS group has no Auto
Scaling metrics, so before the guard was blind to those hours until Cost Explorer settled them; now
each check records the instances it sees (`gpucluster.fleet.instanceledger`, its `gone_hours`, the
handler's own pricing) and prices them once gone.

Cost Explorer. The checks of the month, each reading the settled figure only through the kept one
(`gpucluster.fleet.settledcache`, the handler's own, over an in-memory table) and not at all while
no compute runs: reads per UTC day (at most 4) against one every check before; and the month's
guard API cost as `gpucluster cost` models it (`pricing.guard_api_line`, prod's check interval).

Idle. The last job on the group ends; the group sits idle.
- before: the utilisation alarm of prod (idle_minutes 120, 5-minute periods) plus the alarm's
  evaluation delay, 4-9 minutes as measured in issue 24.
- after: the activity alarm over the node reporter's 1-minute datapoints, with the alarm window of
  `gpucluster.aws.guardrail_events.activity_window` (the function that builds the alarm) at the new
  dev default `idle_minutes` 15, the period the job ended in (up to one more period), the datapoint
  published a minute late (`REPORT_DELAY_MINUTES`) and the alarm-to-Lambda delay (EventBridge, a
  minute assumed).
Both as minutes from the job's end to capacity 0 and dollars at the group's burn rate.

Idle by use (EKS). A pod keeps holding `nvidia.com/gpu` while its GPUs fall to 0 % (a notebook left
open, a hung job). Allocation-based scale-down (the cluster-autoscaler, Karpenter) counts the node busy
as long as the pod holds the GPU: it never stops. Here each minute the node's reporter samples the
busiest GPU `BUSY_SAMPLES` times, `BUSY_INTERVAL_SECONDS` apart, at a per-node offset into the minute
(systemd's timer), and reports busy only while a GPU pod runs AND the samples' mean reaches the
threshold (`node_busy`, the rule report.sh applies); the activity alarm then needs `idle_minutes` of
zeros, with the same report, event and stop delays as above. Every second of the minute the GPUs may
fall idle in and every timer offset are tried: best and worst, against `idle_minutes` + 5.
These are models with their assumptions printed, not measurements of AWS.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "components"))

from gpucluster import catalog
from gpucluster.aws.guardrail_events import activity_window
from gpucluster.fleet.accrual import ON_DEMAND, Instance, Prices, accrue, decide, settled_through
from gpucluster.fleet.instanceledger import Sighting, gone_hours
from gpucluster.fleet.settledcache import COST_EXPLORER_USD_PER_REQUEST, SettledCache, settled_figure
from gpucluster.plan import load_stack
from gpucluster.pricing import guard_api_line, guard_prices

MONTH = datetime(2026, 11, 1, tzinfo=UTC)
MONTH_END = datetime(2026, 12, 1, tzinfo=UTC)
STOP_MINUTES = 2.0  # UpdateAutoScalingGroup to terminated instances (the guard's 5 s settle included)
REPORT_DELAY_MINUTES = 1.0  # a node's put-metric-data lands about a minute after the minute it covers
EVENT_DELAY_MINUTES = 1.0  # alarm state change -> EventBridge -> autostop Lambda
OLD_IDLE_MINUTES, OLD_ALARM_DELAY = 120, (4.0, 9.0)  # prod's idle_minutes; issue 24's measured delay
NEW_IDLE_MINUTES = 15
BUSY_SAMPLES, BUSY_INTERVAL_SECONDS = 6, 5  # report.sh's defaults (GPUCLUSTER_BUSY_SAMPLES/_INTERVAL_SECONDS)
BUSY_THRESHOLD = 5.0  # autostop.gpu_utilization_threshold_percent's default
IDLE_BY_USE_BOUND = 5  # a group idle by use is stopped within idle_minutes + this


@dataclass
class Run:
    """One instance's life: [start, end)."""

    instance_id: str
    start: datetime
    end: datetime


def hours(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds() / 3600)


class Month:
    """The timeline: who runs when, and what it truly costs up to any moment."""

    def __init__(self, nodes: int, rate: float, fixed: float, runaway_day: int) -> None:
        self.rate, self.fixed, self.runs = rate, fixed, []
        day = MONTH
        while day < MONTH_END:
            if day.weekday() < 5:
                start = day + timedelta(hours=8)
                end = MONTH_END if day.day == runaway_day else day + timedelta(hours=20)
                self.runs += [Run(f"i-{day.day:02d}{n}", start, end) for n in range(nodes)]
                if day.day == runaway_day:
                    break
            day += timedelta(days=1)

    def cost(self, t: datetime) -> float:
        return (sum(hours(r.start, min(r.end, t)) for r in self.runs) * self.rate
                + hours(MONTH, t) * self.fixed)

    def running(self, t: datetime) -> list[Run]:
        return [r for r in self.runs if r.start <= t < r.end]

    def crossing(self, limit: float) -> datetime:
        lo, hi = MONTH, MONTH_END
        while (hi - lo) > timedelta(seconds=1):
            mid = lo + (hi - lo) / 2
            lo, hi = (mid, hi) if self.cost(mid) < limit else (lo, mid)
        return hi

    def stopped_at(self, t: datetime) -> Month:
        """The same month with everything ended at `t` (what the stop does)."""
        copy = Month.__new__(Month)
        copy.rate, copy.fixed = self.rate, self.fixed
        copy.runs = [Run(r.instance_id, r.start, min(r.end, t)) for r in self.runs if r.start < t]
        return copy


def guard_stop(month: Month, prices: Prices, limit: float, check_minutes: int, node_type: str) -> datetime:
    """First check at which the handler's own decision says stop."""
    t = MONTH
    while t < MONTH_END:
        since = settled_through(t)
        running = month.running(t)
        instances = [Instance(r.instance_id, node_type, ON_DEMAND, r.start, "train") for r in running]
        ran = sum(hours(max(r.start, since), min(r.end, t)) for r in month.runs)
        spend = accrue(month.cost(since), instances, prices, t, group_hours={"train": ran})
        if decide(spend, limit, check_minutes, compute_running=bool(running)).stop:
            return t
        t += timedelta(minutes=check_minutes)
    raise SystemExit("the guard never stopped: the scenario does not cross its limit")


def slurm_stop(month: Month, prices: Prices, limit: float, check_minutes: int, node_type: str, *,
               kept: bool) -> datetime:
    """First check at which the handler's decision says stop on a PCS stack (no group metric).

    `kept`: the instances each check saw are kept, and priced from `gone_hours` once gone;
    without it (before) an instance that stopped since the settled point is not seen at all.
    """
    seen: dict[str, Sighting] = {}
    t = MONTH
    while t < MONTH_END:
        since = settled_through(t)
        running = month.running(t)
        instances = [Instance(r.instance_id, node_type, ON_DEMAND, r.start, "train") for r in running]
        gone = gone_hours(seen, [i.instance_id for i in instances], since, t, check_minutes * 60)
        spend = accrue(month.cost(since), instances, prices, t, gone_instances=gone if kept else ())
        if decide(spend, limit, check_minutes, compute_running=bool(running)).stop:
            return t
        seen = {k: v for k, v in seen.items() if v.seen >= since.timestamp()}
        seen.update({i.instance_id: Sighting(i, t.timestamp()) for i in instances})
        t += timedelta(minutes=check_minutes)
    return MONTH_END


class MemoryTable:
    """GetItem/PutItem over a dict: the guard-state table as the kept figure uses it."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, object]] = {}

    def get_item(self, Key: dict[str, dict[str, str]], **_: object) -> dict[str, object]:
        item = self.items.get(Key["group"]["S"])
        return {"Item": item} if item else {}

    def put_item(self, Item: dict[str, dict[str, str]], **_: object) -> None:
        self.items[Item["group"]["S"]] = Item


def cost_explorer_reads(month: Month, check_minutes: int) -> dict[str, int]:
    """UTC day -> Cost Explorer reads the spend guard makes, through the kept settled figure."""
    cache = SettledCache(MemoryTable(), "guard", "prod")
    per_day: dict[str, int] = {}
    t = MONTH
    while t < MONTH_END:
        day = t.date().isoformat()
        per_day.setdefault(day, 0)
        if month.running(t):  # the handler reads nothing while no compute runs

            def read(day: str = day, at: datetime = t) -> float:
                per_day[day] += 1
                return month.cost(settled_through(at))

            settled_figure(read, cache, t)
        t += timedelta(minutes=check_minutes)
    return per_day


def budgets_stop(month: Month, limit: float, every_h: float, lag_h: float) -> datetime:
    """Worst phase of a refresh clock every `every_h` hours over data `lag_h` hours old."""
    worst = MONTH
    for phase in range(int(every_h * 4)):
        t = MONTH + timedelta(minutes=15 * phase)
        while t < MONTH_END and month.cost(t - timedelta(hours=lag_h)) < limit:
            t += timedelta(hours=every_h)
        worst = max(worst, t)
    return worst


def row(label: str, month: Month, crossing: datetime, stop: datetime, limit: float) -> str:
    zero = stop + timedelta(minutes=STOP_MINUTES)
    minutes = (zero - crossing).total_seconds() / 60
    over = month.stopped_at(zero).cost(zero) - limit
    return f"  {label:<44} {minutes:>9,.0f} min  {over:>+12,.0f} USD past the limit"


def idle_rows(rate_per_hour: float) -> list[str]:
    old = [OLD_IDLE_MINUTES + d + STOP_MINUTES for d in OLD_ALARM_DELAY]
    period, evaluations = activity_window(NEW_IDLE_MINUTES)
    # The job ends somewhere in a period: that period still holds a 1 (Maximum), so the alarm needs
    # `evaluations` whole periods after it, each published a report delay late: up to one period more.
    window = period / 60 * evaluations
    new = [window + extra + REPORT_DELAY_MINUTES + EVENT_DELAY_MINUTES + STOP_MINUTES
           for extra in (0.0, period / 60)]
    lines = []
    for label, (best, worst) in (("before: utilisation, idle_minutes 120", old),
                                 (f"after: activity, idle_minutes {NEW_IDLE_MINUTES} "
                                  f"({evaluations} x {period} s)", new)):
        lines.append(f"  {label:<44} {best:>5.0f}-{worst:<4.0f}min  "
                     f"{best / 60 * rate_per_hour:>8,.0f}-{worst / 60 * rate_per_hour:,.0f} USD")
    return lines


def node_busy(gpu_pods: int, samples: list[float], threshold: float) -> bool:
    """report.sh's rule on an EKS node: a Running pod holds a GPU and the busiest GPU's mean reaches the
    threshold (no sample readable: busy)."""
    if gpu_pods < 1:
        return False
    return not samples or sum(samples) / len(samples) >= threshold


def idle_by_use_minutes(idle_minutes: int, threshold: float = BUSY_THRESHOLD) -> tuple[float, float]:
    """(best, worst) minutes from the GPUs falling idle (the pod still holding them) to capacity 0."""
    period, evaluations = activity_window(idle_minutes)
    assert period == 60, "the activity alarm's period is one minute"
    found = []
    for drop in range(60):  # the second of minute 0 the GPUs fall to 0 %
        for offset in range(0, 60 - BUSY_SAMPLES * BUSY_INTERVAL_SECONDS + 1, 5):  # the timer's offset
            def utilisation(second: float, drop: int = drop) -> float:
                return 95.0 if second < drop else 0.0
            busy = [node_busy(1, [utilisation(m * 60 + offset + i * BUSY_INTERVAL_SECONDS)
                                  for i in range(BUSY_SAMPLES)], threshold) for m in range(idle_minutes + 3)]
            # The alarm is in ALARM at the end of the first minute m whose last `evaluations` datapoints
            # are all 0 (Maximum over one node), seen a report delay later.
            last_busy = max(m for m, b in enumerate(busy) if b) if any(busy) else -1
            alarm_end = (last_busy + 1 + evaluations)  # minutes from the start of minute 0
            found.append(alarm_end - drop / 60 + REPORT_DELAY_MINUTES + EVENT_DELAY_MINUTES + STOP_MINUTES)
    return min(found), max(found)


def idle_by_use_rows(rate_per_hour: float, idle_minutes: int = NEW_IDLE_MINUTES) -> list[str]:
    best, worst = idle_by_use_minutes(idle_minutes)
    bound = idle_minutes + IDLE_BY_USE_BOUND
    return [f"  {'EKS allocation (cluster-autoscaler, Karpenter)':<44} {'never':>10} "
            "while the pod holds the GPU",
            f"  {f'EKS by use: NodeActive, idle_minutes {idle_minutes}':<44} {best:>5.1f}-{worst:<4.1f}min  "
            f"{best / 60 * rate_per_hour:>8,.0f}-{worst / 60 * rate_per_hour:,.0f} USD",
            f"  within idle_minutes + {IDLE_BY_USE_BOUND} ({bound} min): {'yes' if worst <= bound else 'NO'}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--type", default="p5.48xlarge")
    parser.add_argument("--check-minutes", type=int, default=5)
    parser.add_argument("--runaway-day", type=int, default=20, help="the Friday nobody stops it")
    args = parser.parse_args()
    instance = catalog.get(args.type)
    if instance is None:
        raise SystemExit(f"{args.type} is not in the catalog")
    rate = instance.on_demand_price("us-east-1")
    fixed = guard_prices(load_stack("prod")[2])["fixed_usd_per_hour"]
    month = Month(args.nodes, rate, fixed, args.runaway_day)
    # A limit the month crosses 30 hours into the runaway weekend.
    runaway = next(r.start for r in month.runs if r.start.day == args.runaway_day)
    limit = round(month.cost(runaway + timedelta(hours=30)), -2)
    crossing = month.crossing(limit)
    prices = Prices(on_demand={args.type: rate}, group_max={"train": rate}, fixed_usd_per_hour=fixed)
    burn = args.nodes * rate + fixed
    print(f"stack: {args.nodes} x {args.type} on-demand at ${rate:,.2f}/h + fixed ${fixed:,.2f}/h "
          f"= ${burn:,.2f}/h running; weekdays 08-20 UTC, left running from "
          f"{runaway:%a %d %b %H:%M}")
    print(f"budget: limit ${limit:,.0f}, crossed {crossing:%a %d %b %H:%M} UTC; capacity 0 comes "
          f"{STOP_MINUTES:g} min after the stop call")
    print(row("before: Budgets every 8 h, data 4 h late", month, crossing,
              budgets_stop(month, limit, 8, 4), limit))
    print(row("before: Budgets every 12 h, data 12 h late", month, crossing,
              budgets_stop(month, limit, 12, 12), limit))
    print(row(f"after: spend guard every {args.check_minutes} min", month, crossing,
              guard_stop(month, prices, limit, args.check_minutes, args.type), limit))
    # Slurm: the limit crossed 30 minutes into a weekday morning; yesterday's nodes stopped at 20:00.
    morning = next(r.start for r in month.runs if r.start.day == args.runaway_day - 1)
    slurm_limit = round(month.cost(morning + timedelta(minutes=30)), -1)
    slurm_crossing = month.crossing(slurm_limit)
    print(f"slurm: limit ${slurm_limit:,.0f}, crossed {slurm_crossing:%a %d %b %H:%M} UTC; yesterday's "
          f"{args.nodes} nodes ran 08-20 and stopped (no Auto Scaling metric on a PCS group)")
    for label, kept in (("before: no metric, stopped nodes unseen", False),
                        ("after: instance ledger in the table", True)):
        stop = slurm_stop(month, prices, slurm_limit, args.check_minutes, args.type, kept=kept)
        print(row(label, month, slurm_crossing, stop, slurm_limit))
    per_day = cost_explorer_reads(month, args.check_minutes)
    reads = sum(per_day.values())
    spec = load_stack("prod")[2]
    api = guard_api_line(spec, "-")
    checks = len(per_day) * 24 * 60 // args.check_minutes
    print(f"cost explorer: {max(per_day.values())} reads/day at most (<= 4), {reads} in the month "
          f"(${reads * COST_EXPLORER_USD_PER_REQUEST:,.2f}); before: one a check, {checks:,} "
          f"(${checks * COST_EXPLORER_USD_PER_REQUEST:,.2f})")
    if api is not None:
        print(f"guard API cost (prod, `gpucluster cost`): ${api.desired_usd_per_month:,.2f}/month "
              f"({api.basis})")
    print(f"idle: {args.nodes} x {args.type} idle after the last job (${args.nodes * rate:,.2f}/h)")
    for line in idle_rows(args.nodes * rate):
        print(line)
    print(f"idle by use: a pod holds all GPUs, which fall to 0 % (threshold {BUSY_THRESHOLD:g} %, "
          f"{BUSY_SAMPLES} samples {BUSY_INTERVAL_SECONDS} s apart a minute)")
    for line in idle_by_use_rows(args.nodes * rate):
        print(line)


if __name__ == "__main__":
    main()
