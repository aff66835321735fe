"""Test setup: fake AWS credentials and Pulumi mocks before any program import.

Pulumi's mock engine must be configured before a module that declares
resources is imported (Pulumi unit-testing docs); `gpucluster.plan`
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

from base_config import BASE_CONFIG
from gpucluster.plan import PlanMocks

pulumi.runtime.set_mocks(PlanMocks("us-east-1"), project="gpucluster", stack="test", preview=False)

pytest_plugins = ["wheel_venv"]  # the built wheel in a fresh venv: fixtures `wheel`, `venv`



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


