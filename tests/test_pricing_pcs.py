"""AWS PCS fees in the cost model: priced on a Slurm stack only, each its own line, hand-computed here.

The figures come from catalog/data/pcs_prices.yaml (from memory, not re-checked: its header says so);
these tests read them back from the file so a corrected figure does not break them, and hold the
arithmetic and the type-none stacks (unchanged to the cent) fixed.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster import catalog
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import HOURS_PER_MONTH, PCS_PRICES_FILE, PricingError, guard_prices, price_stack
from gpucluster.spec.models import SchedulerConfig

RATES = catalog.read_data_file(PCS_PRICES_FILE)["regions"]["us-east-1"]
AMI = "ami-0123456789abcdef0"


def slurm(base_config: dict[str, Any], **scheduler: Any) -> dict[str, Any]:
    base_config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AMI, **scheduler}
    return base_config


def pcs_lines(cost: Any) -> dict[str, Any]:
    return {o.name: o for o in cost.other if o.kind == "pcs"}


def test_the_price_file_names_its_source_and_says_it_was_not_rechecked() -> None:
    raw = catalog.read_data_file(PCS_PRICES_FILE)
    header = PCS_PRICES_FILE.read_text().split("as_of:", 1)[0]
    assert "https://aws.amazon.com/pcs/pricing/" in header and "NOT RE-CHECKED" in header
    assert "not re-checked" in raw["source"] and raw["source"].startswith("AWS PCS pricing page")
    assert set(RATES["controller_usd_per_hour"]) == {"small", "medium", "large"}


def test_slurm_stack_against_hand_computed_fees(base_config: dict[str, Any]) -> None:
    # base: one group of up to 2 spot g5/g6 nodes, 1 at desired, all month (no schedule)
    cost = price_stack(parse_stack_config(slurm(base_config, size="medium"), stack="t"))
    lines = pcs_lines(cost)
    assert list(lines) == ["AWS PCS Slurm controller (medium)", "AWS PCS node management",
                           "AWS PCS Slurm accounting", "AWS PCS login nodes"]
    controller = RATES["controller_usd_per_hour"]["medium"] * 730
    assert lines["AWS PCS Slurm controller (medium)"].usd_per_month("desired") == pytest.approx(controller)
    assert lines["AWS PCS Slurm controller (medium)"].usd_per_month("max") == pytest.approx(controller)
    fee = RATES["node_management_usd_per_instance_hour"]
    # desired: 1 compute node + 1 login node all month; max: 2 + 1
    assert lines["AWS PCS node management"].usd_per_month("desired") == pytest.approx(2 * 730 * fee)
    assert lines["AWS PCS node management"].usd_per_month("max") == pytest.approx(3 * 730 * fee)
    assert lines["AWS PCS Slurm accounting"].usd_per_month("max") == pytest.approx(
        RATES["accounting_usd_per_hour"]["medium"] * 730)
    login = RATES["login_instance_usd_per_hour"]["m7i.large"]
    assert login == 0.1008  # the default login type's on-demand rate
    assert lines["AWS PCS login nodes"].usd_per_month("desired") == pytest.approx(730 * login)
    assert all("not re-checked" in o.source for o in lines.values() if o.name != "AWS PCS login nodes")
    assert any("AWS PCS fees" in a for a in cost.assumptions)
    none = price_stack(parse_stack_config({k: v for k, v in base_config.items()
                                           if k != "gpucluster:scheduler"}, stack="t"))
    for at in ("desired", "max"):
        assert cost.usd_per_month(at) == pytest.approx(
            none.usd_per_month(at) + sum(o.usd_per_month(at) for o in lines.values()))


def test_accounting_off_and_more_login_nodes(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(slurm(base_config, accounting=False, login={"count": 3}), stack="t")
    lines = pcs_lines(price_stack(spec))
    assert "AWS PCS Slurm accounting" not in lines
    assert "AWS PCS Slurm controller (small)" in lines
    assert lines["AWS PCS login nodes"].usd_per_month("max") == pytest.approx(3 * 0.1008 * 730)
    assert lines["AWS PCS node management"].usd_per_month("desired") == pytest.approx(
        (1 + 3) * 730 * RATES["node_management_usd_per_instance_hour"])


def test_node_management_follows_the_schedule_login_does_not(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:autostop"] = {"enabled": True, "idle_minutes": 30,
                                          "stop_schedule": "cron(0 19 ? * * *)",
                                          "start_schedule": "cron(0 8 ? * MON-FRI *)"}
    cost = price_stack(parse_stack_config(slurm(base_config), stack="t"))
    hours = cost.groups[0].scheduled_hours_per_month
    assert hours < 730
    fee = RATES["node_management_usd_per_instance_hour"]
    assert pcs_lines(cost)["AWS PCS node management"].usd_per_month("desired", scheduled=True) == \
        pytest.approx((hours + 730) * fee)


def test_unpriced_login_type_is_a_pricing_error_naming_the_key(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(slurm(base_config), stack="t")
    s = spec.scheduler
    spec = spec.model_copy(update={"scheduler": s.model_copy(update={
        "login": s.login.model_copy(update={"instance_type": "r7i.large"})})})
    with pytest.raises(PricingError, match=r"^scheduler.login.instance_type: no price for r7i.large"):
        price_stack(spec)


def test_the_spend_guard_counts_the_pcs_fees(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(slurm(base_config), stack="t")
    with_pcs = guard_prices(spec)["fixed_usd_per_hour"]
    without = guard_prices(spec.model_copy(update={"scheduler": SchedulerConfig()}))["fixed_usd_per_hour"]
    lines = pcs_lines(price_stack(spec)).values()
    expected = sum(o.usd_per_month("desired") for o in lines) / HOURS_PER_MONTH
    assert with_pcs == pytest.approx(without + expected, abs=1e-4)


# What the shipped stacks (scheduler type none) cost before AWS PCS was priced, to the cent: 24 x 7 and
# as scheduled, at desired and at max nodes (worked out on main c35b38d).
SHIPPED = {
    "dev": ((385.33, 658.37), (201.69, 291.07)),
    "staging": ((15501.46, 33597.58), (15501.46, 33597.58)),
    "prod": ((277090.21, 612695.14), (277090.21, 612695.14)),
}


@pytest.mark.parametrize("stack", sorted(SHIPPED))
def test_a_type_none_stack_costs_exactly_what_it_did(stack: str) -> None:
    spec = load_stack(stack)[2]
    assert not spec.scheduler.slurm
    cost = price_stack(spec)
    assert pcs_lines(cost) == {}
    flat, scheduled = SHIPPED[stack]

    def guard(at: str, on_schedule: bool = False) -> float:  # the spend guard's API line came later (#35)
        return sum(o.usd_per_month(at, on_schedule) for o in cost.other if o.kind == "guard")

    assert tuple(round(cost.usd_per_month(at) - guard(at), 2) for at in ("desired", "max")) == flat
    assert tuple(round(cost.usd_per_month(at, scheduled=True) - guard(at, True), 2)
                 for at in ("desired", "max")) == scheduled
    assert not any("PCS" in a for a in cost.assumptions)


@pytest.mark.parametrize("stack", sorted(SHIPPED))
def test_a_slurm_variant_adds_only_the_pcs_lines(stack: str) -> None:
    spec = load_stack(stack)[2]
    slurm_spec = spec.model_copy(update={"scheduler": SchedulerConfig(type="slurm", ami_id=AMI)})
    before, after = price_stack(spec), price_stack(slurm_spec)
    added = pcs_lines(after)
    assert len(added) == 4
    assert [o for o in after.other if o.kind != "pcs"] == list(before.other)
    for at in ("desired", "max"):
        assert after.usd_per_month(at) == pytest.approx(before.usd_per_month(at) + sum(
            o.usd_per_month(at) for o in added.values()))
