"""The cost model against figures worked out by hand from the catalog and the price file."""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster import catalog
from gpucluster.costdiff import cost_diff_markdown, cost_document
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import (
    HOURS_PER_MONTH,
    Assumptions,
    PricingError,
    Rate,
    price_stack,
    service_prices,
    split_nodes,
)


# The spend guard's API calls a month (issue 35: `cost` counts them), by hand for a 5-minute check:
# Cost Explorer 4 reads a day x $0.01, 8,760 schedule invocations x $1/M, and per check DynamoDB
# 3 reads x $0.125/M + the ledger's writes (1 per KB, 160 B a node) x $0.625/M.
def guard_api(nodes: int) -> float:
    writes = max(1, -(-nodes * 160 // 1024))
    return 4 * 730 / 24 * 0.01 + 8760 / 1e6 + 8760 * (3 * 0.125 + writes * 0.625) / 1e6


# Catalog and price-file figures the hand computations below use.
P5_ON_DEMAND = 55.04          # p5.48xlarge, us-east-1
P5_SAVINGS_PLAN = 0.30        # p5 family Savings Plan discount
P5_SPOT = 0.55                # p5 family typical spot discount
P5_CAPACITY_BLOCK = 31.46
G6E_12X_ON_DEMAND = 10.49264  # g6e.12xlarge, us-east-1
G6E_SPOT = 0.55               # g6e family typical spot discount
GP3, S3, NAT_HOUR, NAT_GB, FSX_P2_500 = 0.08, 0.023, 0.045, 0.045, 0.34
IPV4_HOUR, ENDPOINT_HOUR = 0.005, 0.01   # a public IPv4 address; an interface endpoint per zone
FLOW_LOGS = 5 * 0.50 + 15 * 0.03 + 1.0   # VPC flow logs: 5 GB ingested, 3 months stored, a KMS key


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
    base_rate = P5_ON_DEMAND * (1 - P5_SAVINGS_PLAN)        # 38.528
    eval_spot = G6E_12X_ON_DEMAND * (1 - G6E_SPOT)          # 4.721688
    train, evaluation = cost.groups
    assert train.base.usd_per_hour == pytest.approx(38.528)
    assert evaluation.spot.usd_per_hour == pytest.approx(eval_spot)
    # h100-train, no spot: desired 8 = 4 base + 4 on-demand; max 16 = 4 base + 12 on-demand
    assert train.usd_per_hour("desired") == pytest.approx(4 * base_rate + 4 * P5_ON_DEMAND)  # 374.272
    assert train.usd_per_hour("max") == pytest.approx(4 * base_rate + 12 * P5_ON_DEMAND)     # 814.592
    assert train.max.spot == 0
    assert train.usd_per_hour("max", "all_on_demand") == pytest.approx(16 * P5_ON_DEMAND)
    # eval: 0 nodes at desired, 4 spot at max
    assert evaluation.usd_per_hour("desired") == 0
    assert evaluation.usd_per_hour("max") == pytest.approx(4 * eval_spot)
    other = {o.name: o for o in cost.other}
    assert other["EBS root volumes h100-train"].desired_usd_per_month == pytest.approx(8 * 500 * GP3)  # 320
    assert other["EBS root volumes eval"].max_usd_per_month == pytest.approx(4 * 200 * GP3)            # 64
    assert other["NAT gateway"].desired_usd_per_month == pytest.approx(NAT_HOUR * 730 + NAT_GB * 100)  # 37.35
    assert other["FSx for Lustre pretrain-corpus"].desired_usd_per_month == pytest.approx(9600 * FSX_P2_500)
    assert other["S3 pretrain-corpus"].desired_usd_per_month == pytest.approx(9600 * S3)             # 220.80
    assert other["NAT gateway public IPv4"].desired_usd_per_month == pytest.approx(IPV4_HOUR * 730)  # 3.65
    # ssm, ssmmessages, ec2messages in the one zone of prod's network
    endpoints = other["VPC interface endpoints"]
    assert endpoints.desired_usd_per_month == pytest.approx(3 * 1 * ENDPOINT_HOUR * 730)  # 21.90
    assert other["Spend guard API calls"].desired_usd_per_month == pytest.approx(guard_api(8))  # 1.24
    rest = 320 + 37.35 + 3.65 + 21.9 + 3264 + 220.8 + FLOW_LOGS + guard_api(8)
    assert cost.usd_per_month("desired") == pytest.approx(374.272 * 730 + rest)            # 277,091.45
    assert cost.usd_per_month("desired", "all_on_demand") == pytest.approx(8 * 55.04 * 730 + rest)
    rest_max = 640 + 64 + 37.35 + 3.65 + 21.9 + 3264 + 220.8 + FLOW_LOGS + guard_api(20)
    assert cost.usd_per_month("max") == pytest.approx((814.592 + 4 * eval_spot) * 730 + rest_max)  # 612,691


def test_prod_saves_only_through_its_savings_plan_and_the_eval_spot_group() -> None:
    cost = price_stack(load_stack("prod")[2])
    assert cost.as_json()["saving_vs_on_demand_percent"] == {"desired": 14.8, "max": 9.6}
    train = cost.groups[0]
    assert 1 - train.usd_per_hour("desired") / train.usd_per_hour("desired", "all_on_demand") == \
        pytest.approx(4 * P5_ON_DEMAND * P5_SAVINGS_PLAN / (8 * P5_ON_DEMAND))  # half the nodes at -30 %


def test_budget_warning_when_max_nodes_exceed_it() -> None:
    shipped = load_stack("dev")[2]
    assert shipped.budget is not None
    # the shipped dev budget ($700) covers max nodes; at $500 it would not: ~$607 > $500
    dev = price_stack(shipped.model_copy(update={
        "budget": shipped.budget.model_copy(update={"monthly_limit_usd": 500})}))
    spot = 1.006 * (1 - 0.65)
    expected_max = (2 * spot * 730 + 2 * 200 * GP3 + NAT_HOUR * 730 + NAT_GB * 100 + 1024 * S3
                    + IPV4_HOUR * 730 + 3 * 2 * ENDPOINT_HOUR * 730 + FLOW_LOGS + guard_api(2))
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


P5E_CAPACITY_BLOCK = 38.0     # p5e family Capacity Block rate; p5e has no on-demand price


def p5e_config(base_config: dict[str, Any], instance_types: list[str], **capacity: Any) -> dict[str, Any]:
    """A group in us-west-2c, the one zone of the region that offers p5e.48xlarge."""
    base_config["aws:region"] = "us-west-2"
    base_config["gpucluster:network"]["availability_zones"] = ["us-west-2c"]
    base_config["gpucluster:node_groups"] = [{
        "name": "train", "instance_types": instance_types, "min_nodes": 0, "desired_nodes": 2,
        "max_nodes": 4, "capacity": capacity}]
    return base_config


def test_capacity_block_only_type_is_priced_only_as_a_block(base_config: dict[str, Any]) -> None:
    spec = spec_of(p5e_config(base_config, ["p5e.48xlarge"], market="capacity_block",
                              capacity_reservation_id="cr-0123456789abcdef0"))
    group = price_stack(spec).groups[0]
    for rate in (group.on_demand, group.base, group.spot):
        assert rate.usd_per_hour == P5E_CAPACITY_BLOCK and "Capacity Block" in rate.basis
    assert "no on-demand or spot price" in group.on_demand.basis
    for strategy in ("mix", "all_on_demand", "all_spot"):
        assert group.usd_per_hour("max", strategy) == pytest.approx(4 * P5E_CAPACITY_BLOCK)  # type: ignore[arg-type]


def test_capacity_block_only_type_in_a_mixed_group_is_not_priced(base_config: dict[str, Any]) -> None:
    spec = spec_of(p5e_config(base_config, ["p5e.48xlarge"], on_demand_base=2))
    with pytest.raises(PricingError, match=r"node group train: p5e.48xlarge has no on-demand list price "
                                           r"\(AWS sells it as Capacity Blocks for ML only\)"):
        price_stack(spec)


def test_capacity_block_only_fallback_is_named_without_a_price(base_config: dict[str, Any]) -> None:
    spec = spec_of(p5e_config(base_config, ["p5.48xlarge", "p5e.48xlarge"], on_demand_base=2))
    note = price_stack(spec).groups[0].note
    assert note.endswith("(on-demand: p5e.48xlarge no on-demand price (Capacity Blocks only))")
    assert "$60" not in note


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
    assert all(o.source.startswith(("Amazon", "AWS")) and o.as_of == service_prices("us-east-1").as_of
               for o in cost.other)


def test_first_type_priced_and_fallbacks_named(base_config: dict[str, Any]) -> None:
    note = price_stack(spec_of(base_config)).groups[0].note  # g5.xlarge, then g6.xlarge
    assert note == ("priced as g5.xlarge, the first of 2 instance types; fallbacks cost differently "
                    "(on-demand: g6.xlarge $0.80/h)")


def test_region_without_prices_is_a_clear_error(base_config: dict[str, Any]) -> None:
    base_config["aws:region"] = "eu-west-1"
    base_config["gpucluster:network"]["availability_zones"] = ["eu-west-1a"]
    with pytest.raises(PricingError, match=r"g5.xlarge in eu-west-1 \(have: us-east-1, us-west-2\)"):
        price_stack(spec_of(base_config))
    with pytest.raises(PricingError, match="no EBS/NAT/FSx/S3 prices for region eu-west-1"):
        service_prices("eu-west-1")


def test_live_spot_rates_replace_the_catalog_discount() -> None:
    live = Rate(20.0, "spot, live", "EC2 DescribeSpotPriceHistory (Linux/UNIX)", "2026-11-21 10:00 UTC")
    cost = price_stack(load_stack("prod")[2], spot_rates={"eval": live})
    assert cost.groups[1].spot is live
    assert cost.groups[1].parts("max")["spot"] == pytest.approx(4 * 20.0)


def test_assumptions_change_s3_and_nat(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:datasets"] = [{"name": "data", "prefix": "d/"}]
    cost = price_stack(spec_of(base_config), Assumptions(dataset_gib=2000, nat_gb_per_month=0))
    other = {o.kind: o for o in cost.other}
    assert other["s3"].desired_usd_per_month == pytest.approx(2000 * S3)
    assert other["nat"].desired_usd_per_month == pytest.approx(NAT_HOUR * HOURS_PER_MONTH)


def test_existing_buckets_and_no_nat_add_no_nat_but_more_endpoints(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["nat_gateway"] = False
    base_config["gpucluster:datasets"] = [{"name": "old", "bucket_name": "team-data", "existing": True}]
    other = {o.kind: o for o in price_stack(spec_of(base_config)).other}
    assert set(other) == {"ebs", "endpoints", "flow_logs"}
    # without NAT the nodes also need the monitoring and ec2 endpoints (the CloudWatch agent) and
    # autoscaling and sns (the GPU health check): 7 x 2 zones
    assert other["endpoints"].desired_usd_per_month == pytest.approx(7 * 2 * ENDPOINT_HOUR * 730)
    assert "ssm, ssmmessages, ec2messages, monitoring, ec2, autoscaling, sns" in other["endpoints"].basis


def test_without_nat_remote_write_and_slurm_add_the_amp_and_pcs_endpoints(
        base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["nat_gateway"] = False
    image = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
    base_config["gpucluster:observability"] = {"prometheus": {"enabled": True, "dcgm_exporter_image": image}}
    base_config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0"}
    other = {o.kind: o for o in price_stack(spec_of(base_config)).other}
    # the seven above, aps-workspaces (remote write) and pcs (node registration): 9 x 2 zones
    assert other["endpoints"].desired_usd_per_month == pytest.approx(9 * 2 * ENDPOINT_HOUR * 730)
    assert "autoscaling, sns, aps-workspaces, pcs)" in other["endpoints"].basis


def test_an_existing_vpc_adds_no_network_costs(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"] = {
        "availability_zones": ["us-east-1a"], "existing_vpc_id": "vpc-0abc12345def67890",
        "existing_subnets": {"us-east-1a": "subnet-0abc12345def67890"}}
    # its NAT and endpoints are paid for already; the stack's flow log on it is not
    assert {o.kind for o in price_stack(spec_of(base_config)).other} == {"ebs", "flow_logs"}


def test_endpoint_list_is_the_networks() -> None:
    from gpucluster.aws import network
    from gpucluster.pricing import AMP_ENDPOINT, EKS_ENDPOINTS, NO_NAT_ENDPOINTS, PCS_ENDPOINT, SSM_ENDPOINTS

    assert (SSM_ENDPOINTS, NO_NAT_ENDPOINTS) == (network.SSM_ENDPOINTS, network.NO_NAT_ENDPOINTS)
    assert (AMP_ENDPOINT, PCS_ENDPOINT) == (network.AMP_ENDPOINT, network.PCS_ENDPOINT)
    assert EKS_ENDPOINTS == network.EKS_ENDPOINTS


# ------------------------------------------------------------------------ diff


def test_cost_diff_markdown(base_config: dict[str, Any]) -> None:
    _, config, spec = load_stack("prod")
    base = price_stack(spec).as_json()
    groups = config["gpucluster:node_groups"]
    bigger = {**config, "gpucluster:node_groups": [{**groups[0], "max_nodes": 24}, *groups[1:]],
              "gpucluster:datasets": [config["gpucluster:datasets"][0],
                                      {"name": "extra", "prefix": "x/", "access": "mount"}]}
    head = price_stack(parse_stack_config(bigger, stack="prod")).as_json()
    md = cost_diff_markdown({"cost": base}, head)  # a plan --json document and a cost --json one
    # 8 more on-demand nodes at max: 8 x 55.04 x 730 + their root volumes 8 x 500 GiB x 0.08, + new bucket
    # ... and the spend guard's instance ledger, 8 entries longer (a write unit more a check)
    delta_max = 8 * P5_ON_DEMAND * 730 + 8 * 500 * GP3 + 1024 * S3 + guard_api(28) - guard_api(20)
    pct = 100 * delta_max / base["totals"]["max"]["mix"]["usd_per_month"]
    assert md.startswith("### gpucluster cost: prod\n")
    # prod has no schedule: as scheduled is 24 x 7, and leads
    total_max = base["totals"]["max"]["mix"]["usd_per_month"]
    assert f"| **total at max nodes, as scheduled** | ${total_max:,.2f} |" in md
    assert f"**+${delta_max:,.2f} (+{pct:.1f} %)**" in md
    assert f"| total at max nodes, 24 x 7 | ${total_max:,.2f} |" in md
    assert f"| S3 extra, desired, as scheduled | - | ${1024 * S3:,.2f} | new |" in md
    assert "node group h100-train, desired" not in md  # unchanged rows are left out
    assert "Saving against all on-demand: desired 14.8 % -> 14.8 %, max 9.6 % -> " in md
    removed = cost_diff_markdown(head, base)
    assert "| S3 extra, desired, as scheduled | $23.55 | - | removed |" in removed
    # a document from before the scheduled figure: the 24 x 7 totals lead, as they did
    old = {k: v for k, v in base.items() if k not in ("scheduled_totals", "scheduled_components")}
    assert f"| **total at max nodes** | ${total_max:,.2f} |" in cost_diff_markdown(old, head)


def test_cost_diff_leads_with_the_scheduled_figure() -> None:
    _, config, spec = load_stack("dev")
    base = price_stack(spec, Assumptions(schedule_year=2026)).as_json()
    weekends = {**config, "gpucluster:autostop": {**config["gpucluster:autostop"],
                                                  "start_schedule": "cron(0 8 ? * * *)"}}
    head = price_stack(parse_stack_config(weekends, stack="dev"), Assumptions(schedule_year=2026)).as_json()
    md = cost_diff_markdown(base, head)
    # 11 h on 2 more days a week: 52 x 2 x 11 = 1144 more of 8736 hours, x 730 h, 1 spot g5.xlarge
    spot = 1.006 * (1 - 0.65)
    extra_hours = 1144 / 8736 * 730
    delta = extra_hours * (spot + 200 * GP3 / 730)          # the node and its root volume
    b = base["scheduled_totals"]["desired"]["mix"]["usd_per_month"]
    h = head["scheduled_totals"]["desired"]["mix"]["usd_per_month"]
    assert h - b == pytest.approx(delta, abs=0.01)  # the documents are rounded to the cent
    row = f"| **total at desired nodes, as scheduled** | ${b:,.2f} | ${h:,.2f} | **+${h - b:,.2f}"
    assert row in md
    assert "| total at desired nodes, 24 x 7 |" in md and "no change" in md
    assert "Schedule: stop cron(0 19 ? * * *), start cron(0 8 ? * MON-FRI *)" in md
    assert "4,004 of the 8,736 hours" in md  # 11 h x 7 days x 52 weeks


def test_cost_document_rejects_other_json() -> None:
    with pytest.raises(PricingError, match="not a cost document"):
        cost_document({"stack": "dev", "resources": []})
    with pytest.raises(PricingError, match="no on-demand price"):
        cost_document({"cost": {"error": "no on-demand price for x"}})
