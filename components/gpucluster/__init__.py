"""gpucluster: Pulumi components for cost-guarded GPU clusters on AWS.

The public API is the components and their Args, importable from here:
`from gpucluster import GpuNodeGroup, GpuNodeGroupArgs`. They load lazily
(PEP 562), so the CLI and the pure modules (`gpucluster.spec`, `.pricing`,
`.sizing`) never pay for importing pulumi_aws.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ClusterNetwork": "gpucluster.aws.network",
    "GpuNodeGroup": "gpucluster.aws.nodes",
    "NodeIdentity": "gpucluster.aws.iam",
    "DatasetBucket": "gpucluster.aws.datasets",
    "LustreFileSystem": "gpucluster.aws.datasets",
    "Guardrails": "gpucluster.aws.guardrails",
    "GpuCluster": "gpucluster.aws.cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucluster' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
