"""Warm volumes and warm pools (issue 38): a baked group's launch template provisions the root volume's
initialization rate, `cost` prices it, and a warm pool's stopped volumes are weighed against the boot
minutes it saves; Auto Scaling's refusals stay refusals."""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import price_stack, service_prices
from gpucluster.warmpool import warm_pool_tradeoff
from test_images import AMI, baked_plan, baked_prod, by_type, problems, prod  # noqa: F401  (baked_plan: fixture)


def root_ebs(plan: Any, group: str) -> dict[str, Any]:
    [lt] = [r for r in by_type(plan, "aws:ec2/launchTemplate:LaunchTemplate")
            if r.name == f"gpu-prod-{group}-lt"]
    [mapping] = lt.inputs["blockDeviceMappings"]
    assert mapping["deviceName"]
    return dict(mapping["ebs"])


def test_the_baked_groups_template_initializes_its_root_volume_at_the_provisioned_rate(
        baked_plan: Any) -> None:  # noqa: F811
    # h100-train launches from its pinned image: 300 MiB/s, EC2's maximum (botocore: 100-300)
    assert root_ebs(baked_plan, "h100-train")["volumeInitializationRate"] == 300
    # eval is not baked: its root keeps EBS's default (lazily loaded) and the mapping as it was
    assert root_ebs(baked_plan, "eval") == {"volumeSize": 200, "volumeType": "gp3", "encrypted": "true",
                                            "deleteOnTermination": "true"}


def test_a_rate_can_be_chosen_or_turned_off_and_a_bad_one_is_one_finding() -> None:
    from base_config import plan_config

    config = baked_prod()
    config["gpucluster:images"]["groups"]["h100-train"]["volume_initialization_mibps"] = 0
    assert "volumeInitializationRate" not in root_ebs(plan_config(config, stack="prod"), "h100-train")
    config["gpucluster:images"]["groups"]["h100-train"]["volume_initialization_mibps"] = 50
    assert problems(config) == ["images.groups.h100-train.volume_initialization_mibps: must be 0 (off) or "
                                "100..300, got 50"]


def test_cost_prices_the_initialization_of_each_launch_and_marks_the_price_unverified() -> None:
    spec = parse_stack_config(baked_prod(), stack="prod")
    other = {o.name: o for o in price_stack(spec).other}
    init = other["Volume initialization h100-train"]
    group = next(g for g in spec.node_groups if g.name == "h100-train")
    per_gib = service_prices("us-east-1").ebs_volume_initialization_usd_per_gib
    per_launch = group.root_volume_size_gib * per_gib
    assert init.kind == "volume_init"
    assert init.max_usd_per_month == pytest.approx(group.max_nodes * 30 * per_launch)
    assert init.desired_usd_per_month == pytest.approx(group.desired_nodes * 30 * per_launch)
    assert "ledger: ebs-volume-initialization-price" in init.basis and "300 MiB/s" in init.basis
    assert "Volume initialization eval" not in other  # not baked
    assert not [o for o in price_stack(parse_stack_config(prod(), stack="prod")).other
                if o.kind == "volume_init"]


def test_a_warm_pool_is_weighed_against_the_boot_minutes_it_saves() -> None:
    config = prod()
    config["gpucluster:node_groups"][1].update({"capacity": {"spot_percent": 0}, "desired_nodes": 1,
                                                "warm_pool": {"min_size": 1, "max_prepared": 3}})
    spec = parse_stack_config(config, stack="prod")
    group = spec.node_groups[1]
    gp3 = service_prices("us-east-1").ebs_gp3_usd_per_gb_month
    trade = warm_pool_tradeoff(group, gp3, node_usd_per_hour=12.0)
    assert trade is not None
    # 2 stopped x 200 GiB x $0.08 = $32 a month; a warm start saves 3 min x $12/h = $0.60
    assert trade.stopped_usd_per_month == pytest.approx(32.0)
    assert trade.usd_saved_per_node_start == pytest.approx(0.6)
    assert trade.break_even_node_starts_per_month == pytest.approx(32 / 0.6)
    assert "modelled" in trade.basis
    pool = next(o for o in price_stack(spec).other if o.name == "Warm pool eval")
    assert "pays for itself above" in pool.basis and "warm node starts a month" in pool.basis
    assert warm_pool_tradeoff(spec.node_groups[0], 0.08, 1.0) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"capacity": {"spot_percent": 50}}, "launches Spot Instances"),
    ({"capacity": {"spot_percent": 0}, "instance_types": ["g6e.12xlarge", "g6e.24xlarge"]},
     "mixed instances policy"),
])
def test_warm_pools_auto_scaling_refuses_stay_refused(change: dict[str, Any], message: str) -> None:
    config = prod()
    config["gpucluster:node_groups"][1].update({**change, "warm_pool": {"min_size": 1}})
    assert any(message in p for p in problems(config))
