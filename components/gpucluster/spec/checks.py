"""The registry of named checks: `@check` (a rule over the whole `StackSpec`) and `@group_check` (a
rule over one node group, also run alone on a GpuNodeGroup's args), and helpers several sections share.

Checks run in registration order, which is the order findings are reported in; the section modules
register theirs when `gpucluster.spec` imports them. Checks that need rendered artefacts (user data,
physical names, policy sizes) are not here: they live in `gpucluster.preflight`, above the renderers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gpucluster.spec.findings import Finding
from gpucluster.spec.models import NodeGroupConfig, StackSpec

# ------------------------------------------------------------- cross-field checks

Check = Callable[[StackSpec], Iterable[Finding]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a cross-field check; each is small, named, and reports all it finds."""
    CHECKS.append(fn)
    return fn


def join_path(prefix: str, key: str) -> str:
    """`network` + `vpc_cidr` -> `network.vpc_cidr`; an empty prefix gives the key alone."""
    return f"{prefix}.{key}" if prefix else key


def unique_name_findings(names: Sequence[str], path: str, what: str) -> Iterable[Finding]:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield Finding(f"{path}[{i}].name", f"duplicate {what} name {name!r}")
        seen.add(name)


# Per-group rules: each takes one group, the zones it runs in (None where they are not known,
# e.g. a GpuNodeGroup handed subnet ids that are Outputs) and the key path of the group.
GroupCheck = Callable[[NodeGroupConfig, "Sequence[str] | None", str], Iterable[Finding]]
GROUP_CHECKS: list[GroupCheck] = []


def group_check(fn: GroupCheck) -> GroupCheck:
    """Register a per-group rule: run alone on a GpuNodeGroup's args, and, as a stack check in its
    place among the others, on every node group of a stack."""
    GROUP_CHECKS.append(fn)
    CHECKS.append(lambda spec: _each_group(spec, fn))
    return fn


def node_group_findings(group: NodeGroupConfig, zones: Sequence[str] | None,
                        path: str = "node_group") -> list[Finding]:
    """Every per-group rule on one group alone (a GpuNodeGroup's own args)."""
    return [f for rule in GROUP_CHECKS for f in rule(group, zones, path)]


def _each_group(spec: StackSpec, rule: GroupCheck) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from rule(g, spec.azs_of(g), f"node_groups[{i}]")
