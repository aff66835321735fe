"""The shipped stacks (stacks/Pulumi.<name>.yaml) planned once per test process.

Planning a stack runs the whole program under the mock engine; most tests of a
shipped stack only read the result. `shipped_plan` runs each one once per
process (each pytest-xdist worker is one) and hands out deep copies, keyed by
the file's content, so an edited stack file is planned again.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from gpucluster.plan import Plan, run_plan, stack_file, stack_name
from gpucluster.project import project_name

STACKS = Path(__file__).resolve().parent.parent / "stacks"
_PLANS: dict[tuple[str, str], Plan] = {}


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
    path = STACKS / f"Pulumi.{name}.yaml"
    key = (name, hashlib.sha256(path.read_bytes()).hexdigest())
    if key not in _PLANS:
        _PLANS[key] = run_plan(str(path))
    return copy.deepcopy(_PLANS[key])
