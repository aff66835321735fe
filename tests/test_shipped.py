"""The tests' plan cache (tests/shipped.py): one plan per content and process, handed out as copies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shipped
from base_config import base, plan_config
from gpucluster.plan import Plan


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stacks the cache plans from here on (planned_config's misses)."""
    planned: list[str] = []

    def plan(config: dict[str, Any], stack: str) -> Plan:
        planned.append(stack)
        return plan_config(config, stack)

    monkeypatch.setattr(shipped, "plan_config", plan)
    return planned


def test_the_same_config_is_planned_once_and_every_caller_gets_its_own_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = shipped.planned_config(base())
    first.resources.clear()  # what one test does to its copy ...
    first.outputs["seen"] = True
    planned = counting(monkeypatch)
    again = shipped.planned_config(copy.deepcopy(base()))  # ... the next does not see
    assert planned == [] and again.resources and "seen" not in again.outputs
    changed = base()
    changed["gpucluster:cluster"]["name"] = "other"
    assert shipped.planned_config(changed).spec.cluster.name == "other" and planned == ["t"]
    assert shipped.planned_config(base(), stack="u").stack == "u" and planned == ["t", "u"]


def test_a_stack_file_and_the_same_config_share_one_plan(
        monkeypatch: pytest.MonkeyPatch, write_stack: Callable[[dict[str, Any], str], Path]) -> None:
    config = base()
    config["gpucluster:cluster"]["name"] = "file"  # planned by no other test
    planned = counting(monkeypatch)
    from_file = shipped.planned_once(str(write_stack(config, "t")))  # the command's path, not plan_config
    assert shipped.planned_config(config).as_json() == from_file.as_json() and planned == []
