"""What a policy rule is: its check plus what CrossGuard and `gpucluster plan` need to know about it.

`@rule(...)` turns a check function into a `Rule` (name, description, kind,
default enforcement level, config schema and defaults); the concern modules
beside this one declare their rules with it, and the package's `RULES` lists
them in the pack's order. No rule lives here, and nothing here imports Pulumi,
pulumi_policy or calls AWS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from gpucluster.policy.records import Resource, Stack

ResourceCheck = Callable[[Resource, Mapping[str, Any]], Iterable[str]]
StackCheck = Callable[[Stack, Mapping[str, Any]], Iterable[tuple[Resource | None, str]]]


@dataclass(frozen=True)
class Rule:
    """One policy: its check and what CrossGuard and `gpucluster plan` need to know about it."""

    name: str
    description: str
    kind: Literal["resource", "stack"]
    check: ResourceCheck | StackCheck
    level: str = "mandatory"
    schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """JSON-schema `properties` of the policy's config (Pulumi's `configSchema`)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def settings(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The rule's config: defaults, overridden key by key (environments: one by one)."""
        merged = dict(self.defaults)
        for key, value in (given or {}).items():
            if key == "environments" and isinstance(value, Mapping):
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
        return merged

    def resource_messages(self, resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
        """What a `kind: resource` rule reports on one resource (its `check` is a ResourceCheck)."""
        return cast("ResourceCheck", self.check)(resource, config)

    def stack_findings(self, stack: Stack,
                       config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
        """What a `kind: stack` rule reports on the stack (its `check` is a StackCheck)."""
        return cast("StackCheck", self.check)(stack, config)


def rule(name: str, description: str, kind: Literal["resource", "stack"], level: str = "mandatory",
         schema: Mapping[str, Mapping[str, Any]] | None = None,
         defaults: Mapping[str, Any] | None = None) -> Callable[[Callable[..., Any]], Rule]:
    """Declare the decorated check as the rule `name`; the decorated name then holds the `Rule`.

    Declaring does not register: the pack's order is the one `RULES` spells out, in one place.
    """

    def declare(check: Callable[..., Any]) -> Rule:
        return Rule(name, description, kind, check, level, schema or {}, defaults or {})

    return declare
