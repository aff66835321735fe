"""Stack files planned once per test process: the shipped stacks (stacks/Pulumi.<name>.yaml) and any other.

Planning a stack runs the whole program under the mock engine; most tests of a
stack only read the result. `shipped_plan` and `planned_once` run each stack file
once per process (each pytest-xdist worker is one) and hand out deep copies, keyed
by the file's content, so an edited stack file is planned again.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from gpucluster.plan import Plan, run_plan, stack_file, stack_name
from gpucluster.project import project_name

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
    """A deep copy of the plan of any stack file, planned on first use in this process.

    Keyed by what a plan depends on: the stack's name, the file's content and the project's name
    (the deployment's identity), so an edited or renamed stack file is planned again. For tests
    that only read the plan; a test that changes what the program does (a patched function)
    must plan for itself.
    """
    path = stack_file(stack)
    if not path.is_file():
        return run_plan(stack)  # the command's own error (no such stack)
    key = (stack_name(path), hashlib.sha256(path.read_bytes()).hexdigest(), project_name(path))
    if key not in _PLANS:
        _PLANS[key] = run_plan(str(path))
    return copy.deepcopy(_PLANS[key])
