"""Named checks of the `autostop` section: a start schedule needs a different stop schedule.

Small functions returning findings; never imports Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.spec.checks import check
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import AutoStopConfig, StackSpec


@check
def autostop_rules(spec: StackSpec) -> Iterable[Finding]:
    yield from autostop_findings(spec.autostop)


def autostop_findings(a: AutoStopConfig, path: str = "autostop") -> Iterable[Finding]:
    if a.start_schedule and not a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "needs a stop_schedule to undo")
    if a.start_schedule and a.start_schedule == a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "is the same as stop_schedule")
