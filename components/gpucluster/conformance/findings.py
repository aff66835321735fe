"""What a conformance check reports, and which values it cannot judge (the engine computes them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucluster.plan import PlannedResource


@dataclass(frozen=True)
class Finding:
    """One input a provider or AWS would refuse: where, what, and which type refused it."""

    urn: str
    resource_type: str
    resource_name: str
    path: str
    """The property path in engine names, e.g. `slurmConfiguration.accounting` (`-` for the resource)."""
    problem: str
    refused_by: str
    """The SDK input type, or the CloudFormation schema (`AWS::PCS::Cluster #/...`), refusing it."""

    @property
    def message(self) -> str:
        return f"{self.path}: {self.problem} (refused by {self.refused_by})"


class Computed:
    """Values the engine computes (mock ids and ARNs): unknown at preview, so patterns and enums pass.

    A string made of one (`arn:...:key/abc-id`, a JSON document holding ids) counts as computed too;
    it is looked for only when a check would otherwise fail.
    """

    def __init__(self, values: Iterable[str]) -> None:
        self.values = sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)

    def holds(self, value: Any) -> bool:
        return isinstance(value, str) and any(v in value for v in self.values)


def computed_values(resources: Iterable[PlannedResource], region: str) -> Computed:
    """What the mock engine answered for each custom resource beyond its inputs: ids, ARNs, DNS names."""
    from pulumi.runtime import MockResourceArgs

    from gpucluster.plan import PlanMocks

    mocks, found = PlanMocks(region), []
    for r in resources:
        if r.custom:
            _, state = mocks.new_resource(MockResourceArgs(typ=r.type, name=r.name, inputs=dict(r.inputs),
                                                           custom=True))
            found += [v for k, v in state.items() if isinstance(v, str) and k not in r.inputs and k != "name"]
    return Computed(found)
