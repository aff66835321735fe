"""The Pulumi program: stack config -> StackSpec -> GpuClusterArgs -> GpuCluster -> stack outputs.

`__main__.py` calls `run()` under `pulumi up`; `gpucluster plan` calls the same
`run()` under Pulumi's mock engine. Config is validated in full before the
first resource is declared, so bad input never creates anything half-way.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from gpucluster import catalog
from gpucluster.aws.cluster import GpuCluster
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import DIY_ORGANIZATION, SpecError, StackSpec
from gpucluster.spec.files import find_project_root
from gpucluster.stack import cluster_args


def read_config_map() -> dict[str, Any]:
    """Every config value of this stack (`namespace:key` -> value), as the engine passed it.

    Pulumi's SDK reads single keys only; unknown-key detection needs them all,
    so this merges the process-wide `PULUMI_CONFIG` bag with explicitly set values.
    """
    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def load_spec() -> StackSpec:
    """Validate the stack's config; a one-line-per-problem RunError (no traceback) if bad.

    The deployment's organization and project go in too: its identity is made of them, and the
    stack file must name the same organization the CLI will compute it from.
    """
    try:
        return parse_stack_config(read_config_map(), stack=pulumi.get_stack(), project=pulumi.get_project(),
                                  organization=pulumi.get_organization() or DIY_ORGANIZATION)
    except SpecError as err:
        raise pulumi.RunError(f"invalid stack config for {pulumi.get_stack()}:\n{err}") from None


def run() -> GpuCluster:
    root = find_project_root()  # `pulumi up` runs the program in the project: its price file prices too
    if root is not None and catalog.price_file() is None:
        catalog.use_price_file(root / catalog.PRICE_FILE_NAME)
    spec = load_spec()
    try:
        cluster = GpuCluster(spec.cluster.name, cluster_args(spec))
    except SpecError as err:  # a component's args check: still bad input, not a crash
        raise pulumi.RunError(f"invalid stack config for {pulumi.get_stack()}:\n{err}") from None
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)
    return cluster
