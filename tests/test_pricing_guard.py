"""The spend guard's price table and the flow-log cost: what the Lambda accrues with, and its sources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from base_config import base
from gpucluster import catalog
from gpucluster.fleet.accrual import Prices
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import Assumptions, guard_prices, price_stack


def spec_of(config: dict[str, Any]):
    return parse_stack_config(config, stack="t")


def test_guard_prices_carry_the_stack_types_at_their_catalog_rates() -> None:
    spec = spec_of(base())
    table = guard_prices(spec)
    wanted = {t for g in spec.node_groups for t in g.instance_types}
    assert set(table["on_demand"]) == wanted
    for name, price in table["on_demand"].items():
        assert price == pytest.approx(catalog.get(name).on_demand_price(spec.region), abs=1e-4)
    Prices.from_json(table)  # the Lambda's parser takes it as it is


def test_fixed_costs_are_the_other_costs_without_root_volumes() -> None:
    spec = spec_of(base())
    cost = price_stack(spec)
    expected = sum(o.desired_usd_per_month for o in cost.other if o.kind != "ebs") / 730
    assert guard_prices(spec)["fixed_usd_per_hour"] == pytest.approx(expected, abs=1e-4)
    assert expected > 0


def test_a_committed_base_and_capacity_blocks_are_priced_as_bought() -> None:
    config = base()
    group = config["gpucluster:node_groups"][0]
    group["instance_types"] = ["p5.48xlarge"]
    group["capacity"] = {"on_demand_base": 2, "base_commitment": "savings_plan"}
    group["max_nodes"] = 4
    table = guard_prices(spec_of(config))
    p5 = catalog.get("p5.48xlarge")
    discount = p5.family.savings_plan_discount_percent
    assert table["committed"][group["name"]] == [2, pytest.approx(
        p5.on_demand_price("us-east-1") * (1 - discount / 100), abs=1e-3)]


def test_flow_logs_are_in_the_cost_model_by_default_and_leave_with_them() -> None:
    config = base()
    cost = price_stack(spec_of(config))
    [flow] = [o for o in cost.other if o.kind == "flow_logs"]
    # 5 GB x $0.50 ingested + 15 GB-months x $0.03 stored + $1 key (CloudWatch and KMS pricing pages)
    assert flow.desired_usd_per_month == pytest.approx(5 * 0.50 + 15 * 0.03 + 1.0)
    assert "CloudWatch pricing page" in flow.source
    all_config = copy.deepcopy(config)
    all_config["gpucluster:network"]["flow_logs"] = "all"
    [flow_all] = [o for o in price_stack(spec_of(all_config)).other if o.kind == "flow_logs"]
    assert flow_all.desired_usd_per_month == pytest.approx(50 * 0.50 + 150 * 0.03 + 1.0)
    config["gpucluster:network"]["flow_logs"] = "off"
    assert not [o for o in price_stack(spec_of(config)).other if o.kind == "flow_logs"]
    assumed = price_stack(spec_of(all_config), Assumptions(flow_log_gb_per_month=1))
    assumed_flow = next(o for o in assumed.other if o.kind == "flow_logs")
    assert assumed_flow.desired_usd_per_month == pytest.approx(10 * 0.5 + 30 * 0.03 + 1.0)
