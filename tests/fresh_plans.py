"""Which optional SDKs a plan imports, for several stacks answered by one fresh process.

Whether planning a stack imports pulumi_kubernetes and gpucluster.aws.eks (EKS) or pulumi_aws_native
(Slurm: PCS through Cloud Control) shows only in a process that has not imported them yet. Starting
one (Python, pydantic, pulumi, pulumi_aws) is most of such a check's cost, 3-4 CPU-s, so one child
plans every case, in the order of CASES (the stacks that should load none of them first), and
reports which watched modules were loaded before and after each plan: a case loads a module exactly
when it was absent before the case's plan and present after it (`Loaded.by_plan`). The child runs
once per test process, on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from base_config import base

TESTS = Path(__file__).resolve().parent
WATCHED = ("pulumi_kubernetes", "gpucluster.aws.eks", "pulumi_aws_native")
SLURM_AMI = "ami-0123456789abcdef0"


def _with_scheduler(scheduler: dict[str, Any] | None) -> dict[str, Any]:
    config = base()
    if scheduler is not None:
        config["gpucluster:scheduler"] = scheduler
    return config


# Planned in this order, in one process: a case later in the list cannot hide what an earlier one
# loaded, because each case's report says what was loaded before its plan too.
CASES: dict[str, dict[str, Any]] = {
    "plain": _with_scheduler(None),
    "scheduler none": _with_scheduler({"type": "none"}),
    "slurm": _with_scheduler({"type": "slurm", "ami_id": SLURM_AMI}),
    "eks": _with_scheduler({"type": "eks"}),
}

CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from base_config import plan_config
watched = {watched!r}
out = {{}}
for name, config in json.loads(sys.argv[1]):
    before = [m for m in watched if m in sys.modules]
    plan_config(config)
    out[name] = [before, [m for m in watched if m in sys.modules]]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Loaded:
    """The watched modules loaded before and after one case's plan in the child."""

    before: frozenset[str]
    after: frozenset[str]

    @property
    def by_plan(self) -> frozenset[str]:
        """What this case's plan imported (absent before it, present after)."""
        return self.after - self.before


def loaded(case: str) -> Loaded:
    """What planning CASES[case] loads, from the one child of this process."""
    return _child()[case]


@cache
def _child() -> dict[str, Loaded]:
    code = CHILD.format(tests=str(TESTS), watched=WATCHED)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(CASES.items()))], capture_output=True,
                          text=True, cwd=TESTS.parent, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    return {name: Loaded(frozenset(before), frozenset(after)) for name, (before, after) in report.items()}
