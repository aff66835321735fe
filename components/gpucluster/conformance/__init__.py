"""Provider conformance: every planned resource checked against what its provider and AWS accept.

The mock engine takes any input; `pulumi preview` does not: the aws-native provider's Check refuses a
property its type metadata lacks, and AWS refuses a document its CloudFormation schema refuses. This
package reads a plan's recorded resources (type token, camelCase inputs) and reports each input the
provider SDK's own types (`sdktypes`) or, for aws-native resources and `aws.cloudcontrol.Resource`
documents, the CloudFormation resource schema shipped beside it (`cfnschema`), or, for Kubernetes
custom resources, the pinned schema of their kind (`crdschema`) would refuse. It is pure
apart from reading the installed SDKs' type metadata and the shipped schemas, both once per process;
`gpucluster plan` reports its findings as mandatory `provider-conformance` violations
(policy/offline.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpucluster.conformance import cfnschema, crdschema, sdktypes
from gpucluster.conformance.findings import Finding, computed_values

if TYPE_CHECKING:
    from gpucluster.plan import PlannedResource

__all__ = ["DESCRIPTION", "POLICY", "Finding", "check_resources"]

POLICY = "provider-conformance"
"""The name plan's verdict gives these findings (not a CrossGuard rule: the pack cannot import the SDKs)."""
DESCRIPTION = ("Every planned resource's inputs are what its provider SDK's input types and, for "
               "aws-native resources and Cloud Control documents, AWS's CloudFormation resource schema "
               "accept: no unknown property at any depth, no value outside an enum, no missing required "
               "property, and the schema's patterns, lengths and ranges.")


def check_resources(resources: Iterable[PlannedResource], region: str) -> list[Finding]:
    """Every finding on the custom resources of a plan, in the plan's order."""
    planned = list(resources)
    computed = computed_values(planned, region)
    found: list[Finding] = []
    for r in planned:
        if not r.custom:
            continue
        found += sdktypes.findings(r, computed)
        found += cfnschema.findings(r, computed)
        found += crdschema.findings(r, computed)
    return found
