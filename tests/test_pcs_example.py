"""examples/slurm-stack: the Slurm stack file a user copies parses, prices the AWS PCS fees and plans with
no mandatory policy violation; a login type of any EC2 family is taken (the GPU catalog is not the list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from base_config import base
from gpucluster.policy.offline import check_plan
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import price_stack
from gpucluster.spec import SpecError
from shipped import planned_config

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "slurm-stack" / "Pulumi.slurm.yaml"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())["config"]


def test_the_example_is_a_slurm_stack_with_a_pinned_pcs_image() -> None:
    spec = parse_stack_config(example(), stack="slurm")
    s = spec.scheduler
    assert s.slurm and s.slurm_version == "25.05" and s.accounting and s.ami_id
    assert [g.name for g in spec.node_groups] == ["train"]
    assert spec.node_groups[0].max_nodes == 2  # a two-node torchrun job


def test_the_example_prices_the_pcs_fees_as_their_own_lines() -> None:
    cost = price_stack(parse_stack_config(example(), stack="slurm"))
    assert [o.name for o in cost.other if o.kind == "pcs"] == [
        "AWS PCS Slurm controller (small)", "AWS PCS node management", "AWS PCS Slurm accounting",
        "AWS PCS login nodes"]
    assert cost.warnings == []  # within its budget at max nodes


def test_the_example_plans_with_no_mandatory_policy_violation() -> None:
    plan = planned_config(example(), stack="slurm")
    assert [str(v) for v in check_plan(plan) if v.mandatory] == []


@pytest.mark.parametrize("login_type", ["m7i.large", "c7i.xlarge", "t3.large"])
def test_any_cpu_type_is_a_login_type(login_type: str) -> None:
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0",
                                      "login": {"instance_type": login_type}}
    assert parse_stack_config(config, stack="t").scheduler.login.instance_type == login_type


def test_a_login_type_that_is_no_instance_type_names_the_key() -> None:
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0",
                                      "login": {"instance_type": "large"}}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert [(f.path, f.message) for f in err.value.findings] == [
        ("scheduler.login.instance_type", "must be an EC2 instance type like m7i.large, got 'large'")]
