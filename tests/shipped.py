"""Plans made once per test process: shipped stacks (stacks/Pulumi.<name>.yaml), other stack files, configs.

Planning a stack runs the whole program under the mock engine (0.3-1 CPU-s); most tests of a
stack only read the result, and many modules plan the same stack or config. `shipped_plan`,
`planned_once` (a stack file) and `planned_config` (a config map) share one cache, keyed by
what a plan depends on: the stack's name, its config (content, not object) and the project's
name. Each process (each pytest-xdist worker is one) plans a key once; every caller gets a
deep copy, so no test sees another's changes, and an edited config or file is planned again.

Only for tests that run the program as it is: a test that changes what the program does (a
patched function, a changed script) must plan for itself (`gpucluster.plan.run_plan`,
`base_config.plan_config`), or the cache would hand its plan to the others.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base_config import plan_config
from gpucluster.plan import Plan, run_plan, stack_file, stack_name
from gpucluster.project import project_name, read_stack_config
from gpucluster.spec import PROJECT

STACKS = Path(__file__).resolve().parent.parent / "stacks"
_PLANS: dict[tuple[str, str, str], Plan] = {}


def shipped_stack(stack: str) -> str | None:
    """The shipped stack that `stack` (a name or path, as `gpucluster plan` reads it) is, else None.

    A copy of a shipped stack file under the same name in a project of the same name (a
    test's project) counts: a plan depends on the stack's name, its config and the project's
    name (the deployment's identity) only.
    """
    path = stack_file(stack)
    name = stack_name(path)
    shipped = STACKS / f"Pulumi.{name}.yaml"
    try:
        same = shipped.is_file() and path.read_bytes() == shipped.read_bytes()
    except OSError:
        return None
    return name if same and project_name(path) == project_name(shipped) else None


def shipped_plan(stack: str) -> Plan:
    """A deep copy of the plan of a shipped stack, planned on first use in this process."""
    name = shipped_stack(stack)
    if name is None:
        raise ValueError(f"{stack} is not a shipped stack (stacks/Pulumi.<name>.yaml)")
    return planned_once(str(STACKS / f"Pulumi.{name}.yaml"))


def planned_once(stack: str) -> Plan:
    """A deep copy of the plan of any stack file (`gpucluster plan`'s), planned on first use in this process.

    A stack file that cannot be read or is not valid gets the command's own error, every time.
    """
    path = stack_file(stack)
    try:
        config = read_stack_config(path)
    except (OSError, ValueError):  # StackFileError, SpecError
        return run_plan(stack)  # raises what the command says
    return _once(stack_name(path), config, project_name(path) or PROJECT, lambda: run_plan(str(path)))


def planned_config(config: dict[str, Any], stack: str = "t") -> Plan:
    """A deep copy of `plan_config(config, stack)`, planned on first use in this process."""
    return _once(stack, config, PROJECT, lambda: plan_config(config, stack))


def _once(stack: str, config: dict[str, Any], project: str, plan: Callable[[], Plan]) -> Plan:
    key = (stack, json.dumps(config, sort_keys=True), project)
    if key not in _PLANS:
        _PLANS[key] = plan()
    return copy.deepcopy(_PLANS[key])
