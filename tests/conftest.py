"""Test setup: fake AWS credentials and Pulumi mocks before any program import.

Pulumi's mock engine must be configured before a module that declares
resources is imported (Pulumi unit-testing docs); `components.planner`
re-installs fresh mocks for every plan it runs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_SECURITY_TOKEN", "testing")
os.environ.setdefault("AWS_SESSION_TOKEN", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from components.planner import Plan, PlanMocks, run_program
from components.spec import parse_stack_config

pulumi.runtime.set_mocks(PlanMocks("us-east-1"), project="gpucluster", stack="test", preview=False)

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
}


@pytest.fixture
def base_config() -> dict[str, Any]:
    """A minimal valid stack config (fresh copy per test)."""
    return copy.deepcopy(BASE_CONFIG)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[[dict[str, Any], str], Path]:
    """Write a stack file in the Pulumi.<name>.yaml format; returns its path."""

    def write(config: dict[str, Any], name: str = "case") -> Path:
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        return path

    return write


def plan_config(config: dict[str, Any], stack: str = "t") -> Plan:
    """Validate `config` and run the program on it under the mock engine."""
    return run_program(stack, config, parse_stack_config(config, stack=stack))


def base() -> dict[str, Any]:
    """A fresh copy of the minimal valid config, for module-level (cached) plans."""
    return copy.deepcopy(BASE_CONFIG)
