"""The one node-hour price (pricing.node_hour_price) against hand-computed figures, and the same figure
and basis in `cost`, `spend`, `spend --by`, `scale`, `start` and `resume`."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucluster import catalog, pricing
from gpucluster.cli import app
from gpucluster.ops import spend as spend_ops
from gpucluster.ops.slurmjobs import node_hour_prices
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from test_scale import autoscaling, ssm  # noqa: F401  (fixtures: the dev stack's groups on moto)

runner = CliRunner()

# Catalog figures (us-east-1 unless said) the hand computations use.
P5 = 55.04                    # p5.48xlarge on-demand
P5_SP, P5_SPOT = 0.30, 0.55   # p5 family: Savings Plan and typical spot discounts
P5_BLOCK = 31.46              # p5 family Capacity Block rate
P5E_BLOCK = 38.0              # p5e: Capacity Blocks only
G6E_12X = 10.49264            # g6e.12xlarge on-demand
G6E_SPOT = 0.55
G5_XL, G5_SPOT = 1.006, 0.65  # g5.xlarge on-demand; g5 typical spot discount
ON_DEMAND = "EC2 On-Demand pricing page (Linux, shared tenancy)"


def group_config(base_config: dict[str, Any], types: list[str], desired: int, max_nodes: int,
                 region: str = "us-east-1", **capacity: Any) -> pricing.GroupCost:
    """One node group `train` priced as `cost` prices it."""
    base_config["aws:region"] = region
    base_config["gpucluster:network"]["availability_zones"] = ["us-west-2c" if region == "us-west-2"
                                                               else "us-east-1a"]
    base_config["gpucluster:node_groups"] = [{
        "name": "train", "instance_types": types, "min_nodes": 0, "desired_nodes": desired,
        "max_nodes": max_nodes, "capacity": capacity}]
    spec = parse_stack_config(base_config, stack="t")
    return pricing.price_group(spec, spec.node_groups[0])


def test_an_on_demand_group_is_its_list_price(base_config: dict[str, Any]) -> None:
    group = group_config(base_config, ["p5.48xlarge"], 2, 4, spot_percent=0)
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx(P5)
    assert rate.basis == "purchase mix at 2 desired nodes: 2 on-demand; p5.48xlarge, us-east-1 list prices"
    assert rate.source.startswith(ON_DEMAND) and rate.as_of == catalog.price_sources()["as_of"]


def test_spot_above_an_on_demand_base(base_config: dict[str, Any]) -> None:
    # 3 desired: 1 base, 2 above it, all spot (spot_percent 100)
    group = group_config(base_config, ["p5.48xlarge"], 3, 4, on_demand_base=1, spot_percent=100)
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx((P5 + 2 * P5 * (1 - P5_SPOT)) / 3)  # 34.8587
    assert rate.basis == ("purchase mix at 3 desired nodes: 1 on-demand base + 2 spot (on-demand less the "
                          "typical 55 % spot discount of p5); p5.48xlarge, us-east-1 list prices")
    assert "Spot Instance Advisor" in rate.source and rate.source.startswith(ON_DEMAND)


def test_a_savings_plan_base_on_demand_and_spot_above_it(base_config: dict[str, Any]) -> None:
    # 4 desired: 2 base at the Savings Plan rate, 2 above: 50 % -> 1 on-demand, 1 spot
    group = group_config(base_config, ["p5.48xlarge"], 4, 8, on_demand_base=2,
                         base_commitment="savings_plan", spot_percent=50)
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx((2 * P5 * (1 - P5_SP) + P5 + P5 * (1 - P5_SPOT)) / 4)  # 39.216
    assert rate.basis.startswith("purchase mix at 4 desired nodes: 2 base (on-demand less the 30 % Savings "
                                 "Plan discount of p5) + 1 on-demand above the base + 1 spot (")


def test_a_group_that_scales_from_zero_is_priced_at_max_nodes(base_config: dict[str, Any]) -> None:
    group = group_config(base_config, ["p5.48xlarge"], 0, 4, on_demand_base=1, spot_percent=100)
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx((P5 + 3 * P5 * (1 - P5_SPOT)) / 4)
    assert rate.basis.startswith("purchase mix at 4 max nodes: 1 on-demand base + 3 spot (")


def test_a_capacity_block_group_is_the_block_rate(base_config: dict[str, Any]) -> None:
    group = group_config(base_config, ["p5.48xlarge"], 2, 4, market="capacity_block",
                         capacity_reservation_id="cr-0123456789abcdef0")
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx(P5_BLOCK)  # not the on-demand 55.04
    assert rate.basis == ("purchase mix at 2 desired nodes: 2 in a Capacity Block; p5.48xlarge, us-east-1 "
                          "list prices")
    block_only = group_config(base_config, ["p5e.48xlarge"], 1, 2, region="us-west-2",
                              market="capacity_block", capacity_reservation_id="cr-0123456789abcdef0")
    assert pricing.node_hour_price(block_only).usd_per_hour == pytest.approx(P5E_BLOCK)  # no on-demand price


def test_a_multi_type_group_is_priced_as_its_first_type(base_config: dict[str, Any]) -> None:
    group = group_config(base_config, ["g6e.12xlarge", "g5.12xlarge"], 2, 4, spot_percent=100)
    rate = pricing.node_hour_price(group)
    assert rate.usd_per_hour == pytest.approx(G6E_12X * (1 - G6E_SPOT))  # 4.7217, not g5.12xlarge's
    assert rate.basis == ("purchase mix at 2 desired nodes: 2 spot (on-demand less the typical 55 % spot "
                          "discount of g6e); g6e.12xlarge (the first of 2 types), us-east-1 list prices")


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "examples/slurm-stack/Pulumi.slurm.yaml"])
def test_the_price_times_its_nodes_is_costs_mix(stack: str) -> None:
    cost = pricing.price_stack(load_stack(stack)[2])
    for group in cost.groups:
        at: pricing.At = "desired" if group.desired.nodes else "max"
        rate = pricing.node_hour_price(group)
        assert rate.usd_per_hour * group.split(at).nodes == pytest.approx(group.usd_per_hour(at))


def run_json(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cost_spend_scale_start_and_resume_agree(autoscaling: Any, ssm: Any) -> None:  # noqa: F811
    """dev-a10 (one spot g5.xlarge at desired nodes) has one node-hour price and one basis everywhere;
    before, scale, start and resume priced it at g5.xlarge on-demand ($1.006), cost at spot."""
    spec = load_stack("dev")[2]
    price = G5_XL * (1 - G5_SPOT)  # 0.3521
    cost = run_json("cost", "dev")
    [group] = [g for g in cost["node_groups"] if g["name"] == "dev-a10"]
    assert group["usd_per_node_hour"] == round(price, 4)
    assert group["desired"]["usd_per_hour"]["mix"] == round(price * group["desired"]["nodes"], 4)
    basis = group["price_basis"]
    assert basis.startswith("purchase mix at 1 desired node: 1 spot (on-demand less the typical 65 % spot")

    by = node_hour_prices(spec)["dev-a10"]  # what `spend --by` prices sacct's node-hours with
    assert (round(by.usd_per_hour, 4), by.basis) == (round(price, 4), basis)
    monday = date(2026, 11, 16)
    estimate = spend_ops.estimate_window(pricing.price_stack(spec), spec,
                                         spend_ops.Window(monday, monday + timedelta(days=7)))
    spent = estimate.node_hour_prices["dev-a10"]  # `spend --json`'s usd_per_node_hour and price_basis
    assert (round(spent.usd_per_hour, 4), spent.basis) == (round(price, 4), basis)

    scaled = run_json("scale", "dev", "-g", "dev-a10", "--desired", "3", "--dry-run")
    [change] = scaled["changes"]
    assert change["on_demand_usd_per_hour_after"] == round(3 * price, 4)
    assert (change["usd_per_node_hour"], change["price_basis"]) == (round(price, 4), basis)

    assert runner.invoke(app, ["stop", "dev", "-g", "dev-a10", "--yes"]).exit_code == 0
    for command in ("start", "resume"):
        doc = run_json(command, "dev", "--dry-run")
        [restart] = [g for g in doc["groups"] if g["group"] == "dev-a10"]
        assert restart["nodes_after"] == 2
        assert restart["on_demand_usd_per_hour"] == round(2 * price, 4)
        assert (restart["usd_per_node_hour"], restart["price_basis"]) == (round(price, 4), basis)
    text = runner.invoke(app, ["resume", "dev", "--dry-run"]).output
    assert f"cost: ${2 * price:,.2f}/hour (${2 * price * 24:,.2f}/day), priced as `gpucluster cost`" in text
    assert f"  dev-a10: ${price:,.4f}/node-hour, purchase mix at 1 desired node: 1 spot (" in text
