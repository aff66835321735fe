"""The minimal valid stack config the tests start from (fixture `base_config` copies it)."""

from __future__ import annotations

import copy
from typing import Any

from gpucluster.plan import Plan, run_program
from gpucluster.preflight import parse_stack_config

BASE_CONFIG: dict[str, Any] = {
    "aws:region": "us-east-1",
    "gpucluster:cluster": {
        "name": "test",
        "tags": {"owner": "ml", "cost_center": "cc-1", "environment": "dev"},
    },
    "gpucluster:network": {"availability_zones": ["us-east-1a", "us-east-1b"], "vpc_cidr": "10.0.0.0/16"},
    "gpucluster:node_groups": [
        {"name": "gpu", "instance_types": ["g5.xlarge", "g6.xlarge"], "min_nodes": 0,
         "desired_nodes": 1, "max_nodes": 2, "capacity": {"spot_percent": 100}},
    ],
    "gpucluster:notifications": {"emails": ["ml@example.com"]},
}


def plan_config(config: dict[str, Any], stack: str = "t") -> Plan:
    """Validate `config` and run the program on it under the mock engine."""
    return run_program(stack, config, parse_stack_config(config, stack=stack))


def base() -> dict[str, Any]:
    """A fresh copy of the minimal valid config, for module-level (cached) plans."""
    return copy.deepcopy(BASE_CONFIG)


def policy_clean(config: dict[str, Any]) -> dict[str, Any]:
    """Add what the policy pack requires of a dev stack (a budget with an action, auto-stop)."""
    config["gpucluster:budget"] = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}
    config["gpucluster:autostop"] = {"idle_minutes": 30}
    return config
