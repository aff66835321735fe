"""The spend guard's pure maths: rates by purchase option, accrual since the settled point, decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpucluster.fleet.accrual import (
    CAPACITY_BLOCK,
    ON_DEMAND,
    SPOT,
    Instance,
    PriceError,
    Prices,
    accrue,
    cost_period,
    decide,
    instance_rates,
    when_limit,
)

NOW = datetime(2026, 11, 20, 6, 0, tzinfo=UTC)
PRICES = Prices(on_demand={"p5.48xlarge": 98.32, "g6e.xlarge": 1.861},
                capacity_block={"p5.48xlarge": 31.464}, committed={"train": (1, 70.0)},
                fixed_usd_per_hour=1.0)


def inst(i: str, purchase: str = ON_DEMAND, hours: float = 2.0, group: str = "train",
         kind: str = "p5.48xlarge", zone: str = "us-east-1a") -> Instance:
    return Instance(i, kind, purchase, NOW - timedelta(hours=hours), group, zone)


def test_rates_follow_how_each_instance_was_bought() -> None:
    rates = instance_rates(
        [inst("i-old", hours=5), inst("i-new", hours=1), inst("i-spot", SPOT),
         inst("i-blk", CAPACITY_BLOCK), inst("i-inf", group="infer", kind="g6e.xlarge")],
        PRICES, {("p5.48xlarge", "us-east-1a"): 40.0})
    # The committed base covers the oldest on-demand node of its group only.
    assert rates == {"i-old": 70.0, "i-new": 98.32, "i-spot": 40.0, "i-blk": 31.464, "i-inf": 1.861}


def test_spot_without_a_price_for_its_zone_takes_the_highest_of_its_type_then_on_demand() -> None:
    spot = {("p5.48xlarge", "us-east-1b"): 45.0, ("p5.48xlarge", "us-east-1c"): 41.0}
    assert instance_rates([inst("i-1", SPOT)], PRICES, spot) == {"i-1": 45.0}
    assert instance_rates([inst("i-1", SPOT)], PRICES, {}) == {"i-1": 98.32}


def test_accrual_counts_from_yesterday_midnight_or_launch_whichever_is_later() -> None:
    # Settled through 19 Nov 00:00; i-a launched two days ago: 30 h; i-b 2 h ago. Fixed: 30 h.
    spend = accrue(1000.0, [inst("i-a", hours=50, group="x"), inst("i-b", hours=2, group="x")],
                   PRICES, NOW)
    assert spend.settled_through == datetime(2026, 11, 19, tzinfo=UTC)
    assert spend.accrued_usd == pytest.approx(30 * 98.32 + 2 * 98.32 + 30 * 1.0)
    assert spend.total_usd == pytest.approx(1000 + 32 * 98.32 + 30)
    assert spend.usd_per_hour == pytest.approx(2 * 98.32 + 1.0)


def test_unpriced_type_is_an_error() -> None:
    with pytest.raises(PriceError, match=r"p4d\.24xlarge"):
        accrue(0.0, [inst("i-1", kind="p4d.24xlarge")], PRICES, NOW)


@pytest.mark.parametrize(("settled", "limit", "cap", "stop", "why"), [
    (900.0, 2000.0, None, False, "within budget"),
    (2100.0, 2000.0, None, True, "has reached"),
    # fixed costs accrued $30 since the settled point (30 h x $1)
    (1960.0, 2000.0, None, True, "before the next check"),  # $10 left at $197.64/h: 3 min
    (1870.0, 2000.0, None, False, "within budget"),           # $100 left: 30 min
    (900.0, 2000.0, 150.0, True, "max_usd_per_hour"),
])
def test_decide(settled, limit, cap, stop, why) -> None:
    spend = accrue(settled, [inst("i-1", hours=0, group="x"), inst("i-2", hours=0, group="x")], PRICES, NOW)
    decision = decide(spend, limit, 5, cap)
    assert decision.stop is stop and why in decision.reason


def test_nothing_to_stop_means_no_stop_but_the_breach_is_reported() -> None:
    spend = accrue(2100.0, [], PRICES, NOW)
    decision = decide(spend, 2000.0, 5, compute_running=False)
    assert not decision.stop and "already at zero" in decision.reason


def test_when_the_limit_is_hit() -> None:
    spend = accrue(0.0, [], Prices(on_demand={}, fixed_usd_per_hour=10.0), NOW)  # 30 h: $300 so far
    decision = decide(spend, 340.0, 5)
    assert when_limit(NOW, decision) == NOW + timedelta(hours=4)
    assert when_limit(NOW, decide(accrue(0.0, [], Prices(on_demand={}), NOW), 100.0, 5)) is None


def test_cost_period() -> None:
    assert cost_period(NOW) == {"Start": "2026-11-01", "End": "2026-11-19"}
    assert cost_period(datetime(2026, 12, 2, 8, tzinfo=UTC)) is None  # yesterday is the 1st
    assert cost_period(datetime(2026, 12, 1, 8, tzinfo=UTC)) is None
    # On the 1st the accrual starts at the month's start, not in the month before.
    assert accrue(0.0, [], Prices(on_demand={}, fixed_usd_per_hour=1.0),
                  datetime(2026, 12, 1, 8, tzinfo=UTC)).accrued_usd == pytest.approx(8.0)


def test_malformed_price_tables() -> None:
    bad = ({}, {"on_demand": []}, {"on_demand": {"x": "nan"}}, {"on_demand": {}, "committed": {"a": [1]}})
    for raw in bad:
        with pytest.raises(PriceError):
            Prices.from_json(raw)


def test_instances_gone_since_the_settled_point_are_counted_from_the_group_metric() -> None:
    prices = Prices(on_demand={"p5.48xlarge": 98.32}, group_max={"train": 98.32})
    still = inst("i-1", hours=3, group="train")
    # The metric saw 3 h of i-1 plus 12 h of nodes stopped yesterday evening.
    spend = accrue(0.0, [still], prices, NOW, group_hours={"train": 15.0})
    assert spend.gone_hours == {"train": pytest.approx(12.0)}
    assert spend.accrued_usd == pytest.approx(15 * 98.32)
    assert spend.usd_per_hour == pytest.approx(98.32)  # gone nodes burn nothing now
    # The metric never takes hours away from what is still running.
    assert accrue(0.0, [still], prices, NOW, group_hours={"train": 1.0}).accrued_usd == \
        pytest.approx(3 * 98.32)
    # An unknown group is priced at the table's highest rate: too high, never too low.
    assert accrue(0.0, [], PRICES, NOW, group_hours={"x": 1.0}).accrued_usd == pytest.approx(98.32 + 30)
