"""Schedule arithmetic: EventBridge cron in a time zone, DST, lifetimes, the hours the cost model prices."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any

import pytest

from gpucluster import schedule
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import Assumptions, price_stack
from gpucluster.spec import AutoStopConfig, SpecError

BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def autostop(**kw: Any) -> AutoStopConfig:
    return AutoStopConfig(enabled=True, **kw)


# ------------------------------------------------------------------ cron firings


@pytest.mark.parametrize(("expression", "expected"), [
    ("cron(0 12 L * ? *)", [date(2026, 1, 31), date(2026, 2, 28), date(2026, 3, 31)]),
    ("cron(0 12 LW * ? *)", [date(2026, 1, 30), date(2026, 2, 27), date(2026, 3, 31)]),   # Jan 31 a Saturday
    ("cron(0 12 15W * ? *)", [date(2026, 1, 15), date(2026, 2, 16), date(2026, 3, 16)]),  # Feb 15 a Sunday
    ("cron(0 12 ? * 6L *)", [date(2026, 1, 30), date(2026, 2, 27), date(2026, 3, 27)]),   # last Friday
    ("cron(0 12 ? * MON#2 *)", [date(2026, 1, 12), date(2026, 2, 9), date(2026, 3, 9)]),
    ("cron(0 12 1,15 */2 ? *)", [date(2026, 1, 1), date(2026, 1, 15), date(2026, 3, 1), date(2026, 3, 15)]),
    ("cron(0 12 ? * FRI-MON 2026)", None),  # a range that wraps round the week
])
def test_cron_days(expression: str, expected: list[date] | None) -> None:
    fired = schedule.firings(expression, "UTC", utc(2026, 1, 1), utc(2026, 4, 1))
    days = [f.date() for f in fired]
    if expected is None:
        assert {d.strftime("%a") for d in days} == {"Fri", "Sat", "Sun", "Mon"}
        assert len(days) == 13 * 4  # Jan 1 2026 is a Thursday: 12 whole weeks, then Mar 26 (Thu)..31
        return
    assert days == expected
    assert all(f.hour == 12 and f.minute == 0 for f in fired)


def test_a_time_the_spring_change_skips_never_fires_and_the_autumn_one_fires_once() -> None:
    # Europe/Berlin: 2026-03-29 02:00 -> 03:00 (CET -> CEST), 2026-10-25 03:00 -> 02:00.
    spring = schedule.firings("cron(30 2 ? * * *)", BERLIN, utc(2026, 3, 28), utc(2026, 3, 31))
    assert spring == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30)]   # none on the 29th
    autumn = schedule.firings("cron(30 2 ? * * *)", BERLIN, utc(2026, 10, 24), utc(2026, 10, 27))
    # 02:30 happens twice on the 25th; the first (still CEST, UTC+2) only
    assert autumn == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_night_runs_across_both_dst_changes() -> None:
    """Start 20:00, stop 06:00 Berlin time: the night of a change is an hour shorter or longer."""
    a = autostop(start_schedule="cron(0 20 ? * * *)", stop_schedule="cron(0 6 ? * * *)",
                 schedule_timezone=BERLIN)
    march = schedule.running_intervals(a, utc(2026, 3, 27, 12), utc(2026, 3, 31))
    assert [(i.start, i.end) for i in march] == [
        (utc(2026, 3, 27, 19), utc(2026, 3, 28, 5)),   # CET: 20:00 = 19:00 UTC, 10 h
        (utc(2026, 3, 28, 19), utc(2026, 3, 29, 4)),   # across the change: 06:00 CEST = 04:00 UTC, 9 h
        (utc(2026, 3, 29, 18), utc(2026, 3, 30, 4)),   # CEST: 10 h again
        (utc(2026, 3, 30, 18), utc(2026, 3, 31)),      # cut at the window's end
    ]
    assert [i.hours for i in march] == [10, 9, 10, 6]
    october = schedule.running_intervals(a, utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert [i.hours for i in october] == [11, 10]      # the night of the 25th has 11 hours
    # per UTC day (Cost Explorer's days): the 28th holds 5 h of the first night and 5 of the second
    by_day = schedule.hours_by_day(march, [date(2026, 3, 28), date(2026, 3, 29)])
    assert by_day == {date(2026, 3, 28): 5 + 5, date(2026, 3, 29): 4 + 6}


def test_dev_runs_eleven_hours_on_weekdays() -> None:
    a = load_stack("dev")[2].autostop   # stop 19:00 daily, start 08:00 Mon-Fri, Berlin, lifetime 12 h
    share = schedule.scheduled_share(a, 2026)
    assert share.window_hours == 52 * 7 * 24 == 8736
    assert share.running_hours == 52 * 5 * 11 == 2860   # both DST changes fall on Sundays, when it is off
    assert share.share * 730 == pytest.approx(238.988, abs=1e-3)
    # the same 52 weeks any year: a weekly schedule does not drift
    assert schedule.scheduled_share(a, 2027).running_hours == 2860


def test_the_lifetime_ends_a_stretch_and_the_next_start_begins_one() -> None:
    a = autostop(start_schedule="cron(0 8 ? * * *)", stop_schedule="cron(0 22 ? * * *)",
                 max_lifetime_hours=4)
    got = schedule.running_intervals(a, utc(2026, 5, 4), utc(2026, 5, 6))
    # 4 h plus one lifetime check (15 minutes) each day, not the 14 h to the stop
    assert [(i.start, i.hours) for i in got] == [(utc(2026, 5, 4, 8), 4.25), (utc(2026, 5, 5, 8), 4.25)]


def test_without_a_start_schedule_the_bound_is_24x7() -> None:
    stop_only = autostop(stop_schedule="cron(0 22 ? * * *)", max_lifetime_hours=12)
    assert not schedule.is_scheduled(stop_only)
    assert schedule.running_hours(stop_only, utc(2026, 5, 4), utc(2026, 5, 11)) == 7 * 24
    disabled = AutoStopConfig(enabled=False, stop_schedule="cron(0 22 ? * * *)",
                              start_schedule="cron(0 8 ? * * *)")
    assert schedule.running_hours(disabled, utc(2026, 5, 4), utc(2026, 5, 5)) == 24


def test_a_window_starting_while_stopped_waits_for_the_start() -> None:
    a = autostop(start_schedule="cron(0 8 ? * MON-FRI *)", stop_schedule="cron(0 18 ? * * *)")
    # Saturday 2026-05-09 to Tuesday 2026-05-12 noon: off all weekend, Monday 10 h, Tuesday 4 h
    got = schedule.running_intervals(a, utc(2026, 5, 9), utc(2026, 5, 12, 12))
    assert [(i.start, i.end) for i in got] == [(utc(2026, 5, 11, 8), utc(2026, 5, 11, 18)),
                                               (utc(2026, 5, 12, 8), utc(2026, 5, 12, 12))]


# ------------------------------------------------------------- the cost model


def test_cost_dev_as_scheduled_against_24x7() -> None:
    spec = load_stack("dev")[2]
    cost = price_stack(spec, Assumptions(schedule_year=2026))
    hours = 2860 / 8736 * 730                       # 238.99 h a month
    assert cost.schedule.scheduled and cost.schedule.hours_per_month == pytest.approx(hours)
    spot = 1.006 * (1 - 0.65)                       # g5.xlarge spot, the dev group's one node
    flow_logs = 5 * 0.50 + 15 * 0.03 + 1.0          # VPC flow logs: ingested, 3 months stored, the key
    # the spend guard's own API calls (#35: guardcost, its line a fixed monthly figure)
    [guard] = [o.desired_usd_per_month for o in cost.other if o.kind == "guard"]
    fixed = 0.045 * 730 + 0.045 * 100 + 0.005 * 730 + 3 * 2 * 0.01 * 730 + 1024 * 0.023 + flow_logs + guard
    assert cost.usd_per_month("desired") == pytest.approx(spot * 730 + 200 * 0.08 + fixed)        # 386.57
    assert cost.usd_per_month("desired", scheduled=True) == pytest.approx(
        spot * hours + 200 * 0.08 * hours / 730 + fixed)                                          # 202.92
    doc = cost.as_json()
    assert doc["schedule"]["hours_per_month"] == 238.99
    assert doc["scheduled_totals"]["desired"]["mix"]["usd_per_month"] == pytest.approx(202.92, abs=0.01)
    assert doc["node_groups"][0]["scheduled_hours_per_month"] == 238.99


def block_stack(base_config: dict[str, Any], **capacity: Any) -> Any:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    base_config["gpucluster:node_groups"] = [{
        "name": "block", "instance_types": ["p5.48xlarge"], "desired_nodes": 2, "max_nodes": 2,
        "root_volume_size_gib": 100,
        "capacity": {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                     **capacity}}]
    base_config["gpucluster:autostop"] = {"stop_schedule": "cron(0 19 ? * * *)",
                                          "start_schedule": "cron(0 8 ? * * *)"}
    return parse_stack_config(base_config, stack="t")


def test_a_capacity_block_is_priced_for_its_duration_whatever_the_schedule(
        base_config: dict[str, Any]) -> None:
    cost = price_stack(block_stack(base_config, duration_hours=72), Assumptions(schedule_year=2026))
    group = cost.groups[0]
    assert group.usd_per_month("desired") == pytest.approx(2 * 31.46 * 72)          # 4,530.24, not x 730
    assert group.usd_per_month("desired", scheduled=True) == pytest.approx(2 * 31.46 * 72)
    assert group.as_json()["capacity_block_hours"] == 72
    ebs = next(o for o in cost.other if o.kind == "ebs")
    assert ebs.desired_usd_per_month == pytest.approx(2 * 100 * 0.08 * 72 / 730)
    # without a duration: a whole month, as before, and the assumption says so
    whole = price_stack(block_stack(base_config), Assumptions(schedule_year=2026)).groups[0]
    assert whole.usd_per_month("desired") == pytest.approx(2 * 31.46 * 730)
    assert any("capacity.duration_hours" in a for a in cost.assumptions)


@pytest.mark.parametrize(("capacity", "message"), [
    ({"duration_hours": 400}, "whole days up to 14 days (336 h), then whole weeks"),
    ({"duration_hours": 36}, "whole days up to 14 days"),
    ({"duration_hours": 5000}, "must be 24..4368"),
])
def test_block_durations_aws_sells(base_config: dict[str, Any], capacity: dict[str, Any],
                                   message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        block_stack(base_config, **capacity)
    assert err.value.findings[0].path == "node_groups[0].capacity.duration_hours"


def test_block_durations_that_are_valid(base_config: dict[str, Any]) -> None:
    for hours in (24, 14 * 24, 21 * 24, 182 * 24):
        block_stack(base_config, duration_hours=hours)


def test_duration_only_for_capacity_blocks(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:node_groups"][0]["capacity"]["duration_hours"] = 48
    with pytest.raises(SpecError, match=r"node_groups\[0\].capacity.duration_hours: only used with "
                                        "market: capacity_block"):
        parse_stack_config(base_config, stack="t")
