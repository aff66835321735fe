"""The capacity rule: per-environment instance types, GPU totals and spot-only environments.

Owns `environment-limits`, its default limits per environment and config
schema, and the note `gpucluster plan` prints when an environment borrows
another's limits (`fallback_note`). Pure: reads resource records and the
catalog, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from gpucluster import catalog
from gpucluster.policy.records import Resource, Stack
from gpucluster.policy.rules.groups import node_groups, pcs_node_groups
from gpucluster.policy.rules.registry import rule


def _gpus(instance_type: str) -> int:
    t = catalog.get(instance_type)
    return t.gpus if t else 0


ENVIRONMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allowed_instance_types": {"type": "array", "items": {"type": "string"},
                                   "description": "Instance types allowed, as globs (g5.*, p5.48xlarge)."},
        "max_gpus": {"type": "integer", "minimum": 0,
                     "description": "GPUs the whole stack may run at its groups' maximum sizes."},
        "spot_only": {"type": "boolean", "description": "Every GPU node must be spot."},
    },
    "additionalProperties": False,
}

DEFAULT_ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "dev": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*"], "max_gpus": 8,
            "spot_only": True},
    "staging": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*", "p4d.*", "p4de.*",
                                           "p5.*", "p5e.*"], "max_gpus": 64, "spot_only": False},
    "prod": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*", "p4d.*", "p4de.*", "p5.*",
                                        "p5e.*", "p5en.*", "p6-b200.*"], "max_gpus": 512,
             "spot_only": False},
}


@rule("environment-limits",
      "Per-environment limits from the policy config: allowed instance types, the most GPUs a "
      "stack may run, and spot-only environments (dev).",
      "stack",
      schema={
          "environments": {"type": "object", "additionalProperties": ENVIRONMENT_SCHEMA,
                           "description": "Limits per environment tag value (dev, staging, prod ...)."},
          "fallback_environment": {"type": "string",
                                   "description": "Whose limits apply to an environment not listed."},
      },
      defaults={"environments": DEFAULT_ENVIRONMENTS, "fallback_environment": "dev"})
def environment_limits(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    env = stack.environment()
    if env is None:
        return  # no environment tag anywhere: required-cost-tags reports that
    whose, limits = limits_of(env, config)
    allowed = list(limits.get("allowed_instance_types", ["*"]))
    where = env if whose == env else f"{env} (no limits of its own in the policy config: {whose}'s apply)"
    total, parts = 0, []
    for group in (*node_groups(stack), *pcs_node_groups(stack)):  # Auto Scaling and PCS groups alike
        for t in group.instance_types:
            if not any(fnmatchcase(t, pattern) for pattern in allowed):
                yield group.resource, (f"{t} is not allowed in {where} (allowed: {', '.join(allowed)}; "
                                       "see the environment-limits policy config)")
        if limits.get("spot_only") and group.on_demand:
            yield group.resource, f"{where} is spot-only, but {group.on_demand}"
        gpus = max((_gpus(t) for t in group.instance_types), default=0)
        if group.max_nodes and gpus:
            total += int(group.max_nodes) * gpus
            parts.append(f"{group.resource.name} {int(group.max_nodes)} x {gpus}")
    max_gpus = limits.get("max_gpus")
    if max_gpus is not None and total > max_gpus:
        yield None, (f"at maximum size the stack runs {total} GPUs ({', '.join(parts)}), over the "
                     f"{where} limit of {max_gpus:g}")


def limits_of(env: str, config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(whose limits apply, the limits) for environment `env`: its own, else the fallback's."""
    environments = config["environments"]
    if env in environments:
        return env, environments[env]
    fallback = config["fallback_environment"]
    return fallback, environments.get(fallback) or {}


def fallback_note(env: str, config: Mapping[str, Any]) -> str | None:
    """For an environment without limits of its own: which limits apply instead, spelled out."""
    whose, limits = limits_of(env, config)
    if whose == env:
        return None
    spelled = [f"allowed instance types {', '.join(limits.get('allowed_instance_types', ['*']))}"]
    if limits.get("max_gpus") is not None:
        spelled.append(f"at most {limits['max_gpus']:g} GPUs")
    spelled.append("spot only" if limits.get("spot_only") else "on-demand allowed")
    return (f"environment {env} has no limits in the environment-limits policy config, so the {whose} "
            f"limits apply: {'; '.join(spelled)}. Add \"{env}\" under environments in "
            f"policies/config/{env}.json (or the stack's own <stack>.json) to set its own.")
