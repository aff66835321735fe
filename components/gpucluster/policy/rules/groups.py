"""Node groups as the stack-level rules see them: what an Auto Scaling group can buy at its maximum.

Owns `NodeGroup`, `node_groups` (instance types, maximum size, why it may
run on-demand, its launch template) and `pcs_node_groups` (the same of AWS PCS
compute node groups), and what counts as a GPU instance type;
the capacity, guardrail, EFA and security-group rules read groups through it.
Declares no rule. Pure: reads resource records and the catalog, never Pulumi or AWS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucluster import catalog
from gpucluster.fleet.tags import SLURM_LOGIN_GROUP
from gpucluster.policy.records import EXTERNAL, UNKNOWN, Resource, Stack, dig, items, known_str, number
from gpucluster.policy.rules.tokens import ASG, INSTANCE, LAUNCH_TEMPLATE, PCS_NODE_GROUP


def is_gpu_type(instance_type: str) -> bool:
    """GPU instance types: the catalog's, plus any other p*/g* family (p3, g4ad ...)."""
    return catalog.get(instance_type) is not None or re.match(r"[pg]\d", instance_type) is not None


@dataclass(frozen=True)
class NodeGroup:
    """What an Auto Scaling group (or the spec's node group) can buy at its maximum size."""

    resource: Resource
    instance_types: tuple[str, ...]
    max_nodes: float | None
    on_demand: str | None
    """Why the group may run on-demand (or capacity-block) nodes; None when it is spot only."""
    launch_template: Any = None
    """The launch template's Resource, EXTERNAL, UNKNOWN or None."""


def node_groups(stack: Stack) -> list[NodeGroup]:
    """Every Auto Scaling group's instance types, maximum size and market."""
    groups = []
    for asg in stack.of_type(ASG):
        props = asg.props
        policy = props.get("mixedInstancesPolicy")
        types: list[str] = []
        distribution: Any
        if isinstance(policy, Mapping):
            spec = dig(policy, "launchTemplate", "launchTemplateSpecification")
            ref = dig(spec, "launchTemplateId") or dig(spec, "launchTemplateName")
            lt = stack.resolve(asg, "mixedInstancesPolicy", ref, [LAUNCH_TEMPLATE])
            overrides = items(dig(policy, "launchTemplate", "overrides"))
            types = [t for o in (overrides if overrides is not UNKNOWN else [])
                     if known_str(t := dig(o, "instanceType"))]
            distribution = dig(policy, "instancesDistribution") or {}
        else:
            spec = props.get("launchTemplate")
            ref = dig(spec, "id") or dig(spec, "name")
            lt = stack.resolve(asg, "launchTemplate", ref, [LAUNCH_TEMPLATE])
            distribution = None
        lt_props = lt.props if isinstance(lt, Resource) else {}
        lt_type = lt_props.get("instanceType")
        market = dig(lt_props, "instanceMarketOptions", "marketType")
        if not types and known_str(lt_type):
            types = [lt_type]
        max_size = props.get("maxSize")
        max_nodes = number(max_size, 0) if max_size is not None and max_size is not UNKNOWN else None
        groups.append(NodeGroup(asg, tuple(types), max_nodes,
                                _on_demand_reason(distribution, market, max_nodes, lt), lt))
    return groups


def _on_demand_reason(distribution: Any, market: Any, max_nodes: float | None, lt: Any) -> str | None:
    if market == "spot":
        return None
    if market == "capacity-block":
        return "it buys a Capacity Block (on-demand capacity)"
    if distribution is None:
        if lt is UNKNOWN or lt is EXTERNAL:
            return None
        return "it has no mixed-instances policy and no spot market options, so every node is on-demand"
    if distribution is UNKNOWN:
        return None
    base = number(dig(distribution, "onDemandBaseCapacity"), 0)
    # AWS default for onDemandPercentageAboveBaseCapacity is 100 (Auto Scaling API reference).
    above = number(dig(distribution, "onDemandPercentageAboveBaseCapacity"), 100)
    if base > 0:
        return f"onDemandBaseCapacity is {base:g}"
    if above > 0 and (max_nodes is None or max_nodes > base):
        return f"onDemandPercentageAboveBaseCapacity is {above:g}"
    return None


def pcs_node_groups(stack: Stack) -> list[NodeGroup]:
    """AWS PCS compute node groups (a Slurm stack's node groups) read like Auto Scaling groups: instance
    types, maximum size, why they may run on-demand. The login group is left out: it runs no GPU
    (pcs-login-no-gpu) and is no capacity the per-environment limits are about."""
    groups = []
    for r in stack.of_type(PCS_NODE_GROUP):
        if r.props.get("name") == SLURM_LOGIN_GROUP:
            continue
        configs = items(r.props.get("instanceConfigs"))
        types = [t for c in (configs if configs is not UNKNOWN else [])
                 if known_str(t := dig(c, "instanceType"))]
        most = dig(r.props, "scalingConfiguration", "maxInstanceCount")
        max_nodes = None if most is None or most is UNKNOWN else number(most, 0)
        # AWS PCS API reference, CreateComputeNodeGroup purchaseOption: ONDEMAND (the default), SPOT or
        # CAPACITY_BLOCK.
        option = r.props.get("purchaseOption")
        on_demand = (None if option in ("SPOT", UNKNOWN) else
                     "it buys a Capacity Block (on-demand capacity)" if option == "CAPACITY_BLOCK" else
                     f"its purchaseOption is {option or 'ONDEMAND (the default)'}")
        ref = dig(r.props, "customLaunchTemplate", "templateId")
        lt = UNKNOWN if ref is UNKNOWN else stack.resolve(r, "customLaunchTemplate", ref, [LAUNCH_TEMPLATE])
        groups.append(NodeGroup(r, tuple(types), max_nodes, on_demand, lt))
    return groups


def gpu_groups(stack: Stack) -> list[str]:
    """Names of the stack's GPU Auto Scaling groups, PCS compute node groups and GPU instances."""
    names = [g.resource.name for g in (*node_groups(stack), *pcs_node_groups(stack))
             if g.resource.type in (ASG, PCS_NODE_GROUP) and any(is_gpu_type(t) for t in g.instance_types)]
    names += [r.name for r in stack.of_type(INSTANCE)
              if known_str(t := r.props.get("instanceType")) and is_gpu_type(t)]
    return names
