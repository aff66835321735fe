"""The stack file as the one component it deploys: `StackSpec` -> `GpuClusterArgs`.

Pure, no resources and no Pulumi import: `program.run` builds the GpuCluster's args from the stack
file with it. GpuCluster then derives its children's args itself (`gpucluster.aws.children`), so the
components never import this module; it sits above them (imports flow program -> stack -> aws).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.spec import StackSpec

if TYPE_CHECKING:
    from gpucluster.aws.cluster import GpuClusterArgs


def cluster_args(spec: StackSpec) -> GpuClusterArgs:
    """The stack file as GpuClusterArgs: its sections as written, where it is deployed, the region.

    Organization, project and stack are always passed on, so the GpuCluster's identity is the one
    the stack file gives (the CLI computes it from the same three).
    """
    args = spec.model_dump(exclude_unset=True)
    args |= {"organization": spec.organization, "project": spec.project, "stack": spec.stack}
    return args  # type: ignore[return-value]

