"""The cost model against figures worked out by hand from the catalog and the price file."""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster import catalog
from gpucluster.plan import load_stack
from gpucluster.pricing import (
    HOURS_PER_MONTH,
    Assumptions,
    PricingError,
    Rate,
    cost_diff_markdown,
    cost_document,
    price_stack,
    service_prices,
    split_nodes,
)
from gpucluster.spec import parse_stack_config

# Catalog and price-file figures the hand computations below use.
P5_ON_DEMAND = 55.04          # p5.48xlarge, us-east-1
P5_SAVINGS_PLAN = 0.30        # p5 family Savings Plan discount
P5_SPOT = 0.55                # p5 family typical spot discount
P5_CAPACITY_BLOCK = 31.46
GP3, S3, NAT_HOUR, NAT_GB, FSX_P2_500 = 0.08, 0.023, 0.045, 0.045, 0.34


def spec_of(config: dict[str, Any], stack: str = "t"):
    return parse_stack_config(config, stack=stack)


def p5_config(base_config: dict[str, Any], **capacity: Any) -> dict[str, Any]:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    base_config["gpucluster:node_groups"] = [{
        "name": "train", "instance_types": ["p5.48xlarge"], "min_nodes": 0, "desired_nodes": 2,
        "max_nodes": 4, "capacity": capacity, "root_volume_size_gib": 100}]
    return base_config


@pytest.mark.parametrize(("market", "base", "spot_percent", "nodes", "expected"), [
    ("mixed", 4, 100, 8, (4, 0, 4)),      # prod at desired
    ("mixed", 4, 100, 16, (4, 0, 12)),    # prod at max
    ("mixed", 4, 100, 3, (3, 0, 0)),      # fewer nodes than the base: all base
    ("mixed", 1, 70, 6, (1, 2, 3)),       # 30 % of 5 = 1.5 on-demand -> 2
    ("mixed", 1, 70, 2, (1, 1, 0)),       # 30 % of 1 = 0.3 -> 1: no spot at all
    ("mixed", 0, 50, 5, (0, 3, 2)),
    ("mixed", 0, 33, 10, (0, 7, 3)),      # 67 % of 10 = 6.7 -> 7, exactly (no float fuzz)
    ("mixed", 0, 0, 3, (0, 3, 0)),
    ("capacity_block", 0, 0, 4, (4, 0, 0)),
])
def test_split_nodes(base_config: dict[str, Any], market: str, base: int, spot_percent: float,
                     nodes: int, expected: tuple[int, int, int]) -> None:
    cap: dict[str, Any] = {"market": market, "on_demand_base": base, "spot_percent": spot_percent}
    if market == "capacity_block":
        cap["capacity_reservation_id"] = "cr-0123456789abcdef0"
    spec = spec_of(p5_config(base_config, **cap))
    split = split_nodes(spec.node_groups[0], nodes)
    assert (split.base, split.on_demand, split.spot) == expected
    assert split.base + split.on_demand + split.spot == nodes


def test_prod_against_hand_computed_figures() -> None:
    cost = price_stack(load_stack("prod")[2])
    base_rate = P5_ON_DEMAND * (1 - P5_SAVINGS_PLAN)   # 38.528
    spot_rate = P5_ON_DEMAND * (1 - P5_SPOT)           # 24.768
    group = cost.groups[0]
    assert group.base.usd_per_hour == pytest.approx(38.528)
    assert group.spot.usd_per_hour == pytest.approx(24.768)
    # desired 8 = 4 base + 4 spot; max 16 = 4 base + 12 spot
    assert group.usd_per_hour("desired") == pytest.approx(4 * base_rate + 4 * spot_rate)  # 253.184
    assert group.usd_per_hour("max") == pytest.approx(4 * base_rate + 12 * spot_rate)     # 451.328
    assert group.usd_per_hour("max", "all_on_demand") == pytest.approx(16 * P5_ON_DEMAND)
    other = {o.kind: o for o in cost.other}
    assert other["ebs"].desired_usd_per_month == pytest.approx(8 * 500 * GP3)             # 320
    assert other["ebs"].max_usd_per_month == pytest.approx(16 * 500 * GP3)
    assert other["nat"].desired_usd_per_month == pytest.approx(NAT_HOUR * 730 + NAT_GB * 100)  # 37.35
    assert other["fsx"].desired_usd_per_month == pytest.approx(9600 * FSX_P2_500)        # 3264
    assert other["s3"].desired_usd_per_month == pytest.approx(9600 * S3)                 # 220.80
    rest = 320 + 37.35 + 3264 + 220.8
    assert cost.usd_per_month("desired") == pytest.approx(253.184 * 730 + rest)           # 188,666.47
    assert cost.usd_per_month("desired", "all_on_demand") == pytest.approx(8 * 55.04 * 730 + rest)
    assert cost.usd_per_month("desired", "all_spot") == pytest.approx(8 * spot_rate * 730 + rest)


@pytest.mark.parametrize("at", ["desired", "max"])
def test_prod_mix_is_at_least_40_percent_below_all_on_demand(at: str) -> None:
    cost = price_stack(load_stack("prod")[2])
    assert cost.saving_percent(at) >= 40  # type: ignore[arg-type]
    compute_saving = 1 - cost.compute_usd_per_hour(at) / cost.compute_usd_per_hour(at, "all_on_demand")  # type: ignore[arg-type]
    assert compute_saving >= 0.40
    assert cost.as_json()["saving_vs_on_demand_percent"] == {"desired": 42.0, "max": 48.4}


def test_budget_warning_when_max_nodes_exceed_it() -> None:
    shipped = load_stack("dev")[2]
    assert shipped.budget is not None
    # the shipped dev budget ($700) covers max nodes; at $500 it would not: ~$607 > $500
    dev = price_stack(shipped.model_copy(update={
        "budget": shipped.budget.model_copy(update={"monthly_limit_usd": 500})}))
    spot = 1.006 * (1 - 0.65)
    expected_max = 2 * spot * 730 + 2 * 200 * GP3 + NAT_HOUR * 730 + NAT_GB * 100 + 1024 * S3
    assert dev.usd_per_month("max") == pytest.approx(expected_max)
    assert dev.warnings == [f"at max nodes the stack's mix costs ${expected_max:,.0f}/month, "
                            f"{100 * (expected_max / 500 - 1):.0f} % over the $500 budget "
                            "(budget.monthly_limit_usd)"]
    assert price_stack(load_stack("prod")[2]).warnings == []
    assert price_stack(shipped).warnings == []


def test_no_budget_is_a_warning(base_config: dict[str, Any]) -> None:
    assert "no budget" in price_stack(spec_of(base_config)).warnings[0]


def test_capacity_block_priced_at_block_rate(base_config: dict[str, Any]) -> None:
    spec = spec_of(p5_config(base_config, market="capacity_block",
                             capacity_reservation_id="cr-0123456789abcdef0"))
    cost = price_stack(spec)
    group = cost.groups[0]
    assert group.base.usd_per_hour == P5_CAPACITY_BLOCK and "Capacity Block" in group.base.basis
    assert group.usd_per_hour("desired") == pytest.approx(2 * P5_CAPACITY_BLOCK)
    assert group.usd_per_hour("max") == pytest.approx(4 * P5_CAPACITY_BLOCK)


@pytest.mark.parametrize(("commitment", "rate", "word"), [
    ("none", P5_ON_DEMAND, "on-demand"),
    ("savings_plan", P5_ON_DEMAND * 0.7, "Savings Plan"),
    ("reserved_instances", P5_ON_DEMAND * 0.7, "reserved instances"),
])
def test_base_commitment_rates(base_config: dict[str, Any], commitment: str, rate: float, word: str) -> None:
    spec = spec_of(p5_config(base_config, on_demand_base=2, base_commitment=commitment, spot_percent=50))
    group = price_stack(spec).groups[0]
    assert group.base.usd_per_hour == pytest.approx(rate)
    assert word in group.base.basis
    # max 4 = 2 base + 2 above: 50 % -> 1 on-demand at list price, 1 spot
    assert group.usd_per_hour("max") == pytest.approx(2 * rate + P5_ON_DEMAND + P5_ON_DEMAND * (1 - P5_SPOT))


def test_rates_carry_source_and_date() -> None:
    cost = price_stack(load_stack("prod")[2])
    as_of = catalog.price_sources()["as_of"]
    group = cost.groups[0]
    assert group.on_demand.source.startswith("EC2 On-Demand pricing page") and group.on_demand.as_of == as_of
    assert "Spot Instance Advisor" in group.spot.source
    assert "Savings Plans" in group.base.source
    assert all(o.source.startswith("Amazon") and o.as_of == service_prices("us-east-1").as_of
               for o in cost.other)


def test_first_type_priced_and_fallbacks_named() -> None:
    note = price_stack(load_stack("prod")[2]).groups[0].note
    assert note.startswith("priced as p5.48xlarge, the first of 2 instance types")
    assert "p5e.48xlarge $60.00/h" in note


def test_region_without_prices_is_a_clear_error(base_config: dict[str, Any]) -> None:
    base_config["aws:region"] = "eu-west-1"
    base_config["gpucluster:network"]["availability_zones"] = ["eu-west-1a"]
    with pytest.raises(PricingError, match=r"g5.xlarge in eu-west-1 \(have: us-east-1, us-west-2\)"):
        price_stack(spec_of(base_config))
    with pytest.raises(PricingError, match="no EBS/NAT/FSx/S3 prices for region eu-west-1"):
        service_prices("eu-west-1")


def test_live_spot_rates_replace_the_catalog_discount() -> None:
    live = Rate(20.0, "spot, live", "EC2 DescribeSpotPriceHistory (Linux/UNIX)", "2026-11-21 10:00 UTC")
    cost = price_stack(load_stack("prod")[2], spot_rates={"h100-train": live})
    assert cost.groups[0].spot is live
    assert cost.groups[0].parts("max")["spot"] == pytest.approx(12 * 20.0)


def test_assumptions_change_s3_and_nat(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:datasets"] = [{"name": "data", "prefix": "d/"}]
    cost = price_stack(spec_of(base_config), Assumptions(dataset_gib=2000, nat_gb_per_month=0))
    other = {o.kind: o for o in cost.other}
    assert other["s3"].desired_usd_per_month == pytest.approx(2000 * S3)
    assert other["nat"].desired_usd_per_month == pytest.approx(NAT_HOUR * HOURS_PER_MONTH)


def test_existing_buckets_and_no_nat_add_nothing(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["nat_gateway"] = False
    base_config["gpucluster:datasets"] = [{"name": "old", "bucket_name": "team-data", "existing": True}]
    assert {o.kind for o in price_stack(spec_of(base_config)).other} == {"ebs"}


# ------------------------------------------------------------------------ diff


def test_cost_diff_markdown(base_config: dict[str, Any]) -> None:
    _, config, spec = load_stack("prod")
    base = price_stack(spec).as_json()
    bigger = {**config, "gpucluster:node_groups": [{**config["gpucluster:node_groups"][0], "max_nodes": 24}],
              "gpucluster:datasets": [config["gpucluster:datasets"][0],
                                      {"name": "extra", "prefix": "x/", "access": "mount"}]}
    head = price_stack(parse_stack_config(bigger, stack="prod")).as_json()
    md = cost_diff_markdown({"cost": base}, head)  # a plan --json document and a cost --json one
    # 8 more spot nodes at max: 8 x 24.768 x 730 + their root volumes 8 x 500 GiB x 0.08, + new bucket
    delta_max = 8 * 24.768 * 730 + 8 * 500 * GP3 + 1024 * S3
    pct = 100 * delta_max / base["totals"]["max"]["mix"]["usd_per_month"]
    assert md.startswith("### gpucluster cost: prod\n")
    assert f"| **total at max nodes** | ${base['totals']['max']['mix']['usd_per_month']:,.2f} |" in md
    assert f"**+${delta_max:,.2f} (+{pct:.1f} %)**" in md
    assert f"| **total at desired nodes** | ${base['totals']['desired']['mix']['usd_per_month']:,.2f}" in md
    assert f"| S3 extra, desired | - | ${1024 * S3:,.2f} | new |" in md
    assert "node group h100-train, desired" not in md  # unchanged rows are left out
    assert "Saving against all on-demand: desired 42.0 % -> 42.0 %, max 48.4 % -> " in md
    removed = cost_diff_markdown(head, base)
    assert "| S3 extra, desired | $23.55 | - | removed |" in removed


def test_cost_document_rejects_other_json() -> None:
    with pytest.raises(PricingError, match="not a cost document"):
        cost_document({"stack": "dev", "resources": []})
    with pytest.raises(PricingError, match="no on-demand price"):
        cost_document({"cost": {"error": "no on-demand price for x"}})
