"""The `scheduler` section: Slurm on AWS PCS is opt-in, and what PCS cannot launch is refused offline
with one finding naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from base_config import base
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import PCS_SLURM_VERSIONS, SpecError


def slurm(**scheduler: Any) -> dict[str, Any]:
    """A Slurm stack whose groups boot an AMI with the PCS agent and Slurm (test_pcs_images: without one)."""
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0", **scheduler}
    return config


def findings(config: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    return [(f.path, f.message) for f in err.value.findings]


def test_the_default_is_the_launcher_and_slurm_defaults_are_a_supported_version() -> None:
    assert parse_stack_config(base(), stack="t").scheduler.type == "none"
    spec = parse_stack_config(slurm(), stack="t")
    assert spec.scheduler.slurm and spec.scheduler.accounting
    assert spec.scheduler.slurm_version in PCS_SLURM_VERSIONS
    assert spec.scheduler.login.instance_type == "m7i.large"


def test_an_unknown_slurm_version_names_the_key() -> None:
    [(path, message)] = findings(slurm(slurm_version="22.05"))
    assert path == "scheduler.slurm_version"
    assert "24.11, 25.05, 25.11" in message and "'22.05'" in message


def test_a_login_group_with_gpus_is_refused() -> None:
    [(path, message)] = findings(slurm(login={"instance_type": "g5.xlarge"}))
    assert path == "scheduler.login.instance_type"
    assert "1 GPUs" in message


def test_slurm_keys_without_slurm_are_refused() -> None:
    config = base()
    config["gpucluster:scheduler"] = {"slurm_version": "25.05", "accounting": False}
    assert findings(config) == [("scheduler.accounting", "only used with type: slurm"),
                                ("scheduler.slurm_version", "only used with type: slurm")]


def test_eks_keys_parse_on_eks_and_are_refused_elsewhere() -> None:
    config = base()
    config["gpucluster:scheduler"] = {"type": "eks", "teams": ["research", "infer"],
                                      "kubernetes_version": "1.33"}
    s = parse_stack_config(config, stack="t").scheduler
    assert s.eks and not s.slurm and s.teams == ["research", "infer"] and s.max_run_minutes == 1440
    assert s.system_nodes.count == 2 and not s.endpoint_public
    config["gpucluster:scheduler"] = {"type": "eks", "accounting": False}
    assert findings(config) == [("scheduler.accounting", "only used with type: slurm")]
    config["gpucluster:scheduler"] = {"teams": ["research"]}
    assert findings(config) == [("scheduler.teams", "only used with type: eks")]
    config = slurm(endpoint_public=True)
    assert ("scheduler.endpoint_public", "only used with type: eks") in findings(config)
    config = base()
    config["gpucluster:scheduler"] = {"type": "eks", "kubernetes_version": "v1.33"}
    [(path, _)] = findings(config)
    assert path == "scheduler.kubernetes_version"


def test_a_group_pcs_cannot_launch_names_its_key() -> None:
    config = slurm()
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 50}
    [(path, message)] = findings(config)
    assert path == "node_groups[0].capacity.spot_percent" and "got 50" in message
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 100, "on_demand_base": 1}
    [(path, _)] = findings(config)
    assert path == "node_groups[0].capacity.on_demand_base"


def test_an_all_on_demand_or_all_spot_group_is_fine() -> None:
    for capacity in ({"spot_percent": 0, "on_demand_base": 2}, {"spot_percent": 100}):
        config = slurm()
        config["gpucluster:node_groups"][0]["capacity"] = capacity
        assert parse_stack_config(config, stack="t").scheduler.slurm


def test_the_login_groups_name_is_reserved_on_a_slurm_stack() -> None:
    config = slurm()
    config["gpucluster:node_groups"][0]["name"] = "login"
    [(path, message)] = findings(config)
    assert path == "node_groups[0].name" and "'login'" in message
    config["gpucluster:scheduler"] = {"type": "none"}
    assert parse_stack_config(config, stack="t").node_groups[0].name == "login"
