"""Kubernetes custom resources (`apiextensions.CustomResource`: Kueue's flavors and queues) against
the small pinned schemas shipped with gpucluster (`gpucluster.eks.crds`).

pulumi-kubernetes has no input types for a CRD's kinds, so `sdktypes` cannot read them; the pinned
schema of the kind's apiVersion/kind stands in, checked with the same validator as the CloudFormation
schemas (`cfnschema.Validator`: unknown fields, required ones, enums, patterns, ranges). A custom
resource whose kind has no pinned schema is itself a finding: nothing would have looked at it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.conformance.cfnschema import Validator
from gpucluster.conformance.findings import Computed, Finding
from gpucluster.conformance.sdktypes import custom_resource
from gpucluster.eks import crds

if TYPE_CHECKING:
    from gpucluster.plan import PlannedResource


def findings(resource: PlannedResource, computed: Computed) -> list[Finding]:
    """What the pinned schema of a custom resource's kind refuses of its document."""
    if not custom_resource(resource.type):
        return []
    api_version, kind = resource.inputs.get("apiVersion"), resource.inputs.get("kind")
    root = crds.schema(str(api_version), str(kind))
    by = f"{api_version} {kind} (gpucluster/eks/schemas)"
    if root is None:
        return [Finding(resource.urn, resource.type, resource.name, "-",
                        f"no pinned schema of {api_version} {kind} ships with gpucluster", by)]
    check = Validator(root, computed, engine_names=False)
    check.check(dict(resource.inputs), root, "", "#")
    return [Finding(resource.urn, resource.type, resource.name, path or "-", problem, f"{by} {where}")
            for path, problem, where in check.found]
