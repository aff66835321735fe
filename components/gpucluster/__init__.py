"""gpucluster: Pulumi components for cost-guarded GPU clusters on AWS.

The public API is the components and their Args (and the stack-file section
types the Args use), importable from here:
`from gpucluster import GpuNodeGroup, GpuNodeGroupArgs`. They load lazily
(PEP 562), so the CLI and the pure modules (`gpucluster.spec`, `.pricing`,
`.sizing`) never pay for importing pulumi_aws.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_COMPONENTS = {
    "gpucluster.aws.network": ("ClusterNetwork", "ClusterNetworkArgs", "NodeGroupNetwork"),
    "gpucluster.aws.nodes": ("GpuNodeGroup", "GpuNodeGroupArgs", "NodeDataMount"),
    "gpucluster.aws.iam": ("NodeIdentity", "NodeIdentityArgs", "BucketGrant"),
    "gpucluster.aws.datasets": ("DatasetBucket", "DatasetBucketArgs", "LustreFileSystem",
                                "LustreFileSystemArgs"),
    "gpucluster.aws.guardrails": ("Guardrails", "GuardrailsArgs", "GuardedGroup"),
    "gpucluster.aws.observability": ("ClusterDashboard", "ClusterDashboardArgs", "DashboardGroup"),
    "gpucluster.aws.cluster": ("GpuCluster", "GpuClusterArgs"),
    "gpucluster.aws.nodescripts": ("NodeScripts", "NodeScriptsArgs"),
    # The stack file's sections as typed dicts, and what only components take.
    "gpucluster.aws.settings": ("AutoStopSettings", "BudgetSettings", "CapacitySettings", "ClusterSettings",
                                "CostTagSettings", "DatasetSettings", "FsxSettings", "GrafanaSettings",
                                "HealthCheckSettings", "NetworkSettings", "NodeGroupSettings",
                                "ObservabilitySettings", "PrometheusSettings", "SpotSettings"),
    # The error every component raises on bad args, and the node scripts' source a component takes.
    "gpucluster.aws.args": ("ArgsError", "NodeScriptsSource"),
}
_EXPORTS = {name: module for module, names in _COMPONENTS.items() for name in names}
COMPONENTS = ("ClusterNetwork", "GpuNodeGroup", "NodeIdentity", "DatasetBucket", "LustreFileSystem",
              "Guardrails", "ClusterDashboard", "GpuCluster", "NodeScripts")
"""The component package: what `pulumi package add` of this repository exposes."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucluster' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
