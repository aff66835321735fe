"""The neutral records the policy rules read: one resource, one violation, one stack.

CrossGuard hands rules `ResourceValidationArgs` / `PolicyResource` objects and
`gpucluster plan` hands them `PlannedResource`s; both are mapped onto
`Resource` here (by `pack.py` and `offline.py`), so the rules
never see either framework. Values the engine does not know yet (during
`pulumi preview`) are the `UNKNOWN` sentinel: rules must treat them as "cannot
judge" and pass, never crash. No Pulumi import here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

Level = Literal["mandatory", "advisory", "remediate", "disabled"]
LEVELS: tuple[str, ...] = ("mandatory", "advisory", "remediate", "disabled")


class _Unknown:
    """A value only known after deployment (a preview's computed output)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN: Any = _Unknown()


class _External:
    """A reference to something that is not in this stack (an existing VPC's security group...)."""

    def __repr__(self) -> str:
        return "<external>"


EXTERNAL: Any = _External()


@dataclass(frozen=True)
class Resource:
    """One resource as the rules see it: engine type token, name and inputs (camelCase keys)."""

    type: str
    name: str
    props: Mapping[str, Any] = field(default_factory=dict)
    """Engine inputs (CrossGuard: the resource's inputs, or its outputs for stack policies)."""
    urn: str = ""
    parent: str | None = None
    protect: bool = False
    retain_on_delete: bool = False
    """Only `gpucluster plan` knows this; CrossGuard's resource options carry `protect` only."""
    ids: tuple[str, ...] = ()
    """Values other resources use to refer to this one: its id, ARN and physical name, when known."""
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Property name -> URNs of the resources the property's value came from (CrossGuard)."""
    default_tags: Mapping[str, Any] = field(default_factory=dict)
    """Tags the AWS provider adds to every resource (`defaultTags`), when the rules can see them."""

    @property
    def label(self) -> str:
        return f"{self.type} {self.name}"


@dataclass(frozen=True)
class Violation:
    """One broken rule: which policy, at which level, on which resource (None: the whole stack)."""

    policy: str
    level: str
    message: str
    resource_type: str | None = None
    resource_name: str | None = None
    urn: str | None = None

    @property
    def mandatory(self) -> bool:
        return self.level in ("mandatory", "remediate")

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "level": self.level, "resource_type": self.resource_type,
                "resource_name": self.resource_name, "urn": self.urn, "message": self.message}

    def __str__(self) -> str:
        where = f"{self.resource_type} {self.resource_name}" if self.resource_type else "stack"
        return f"[{self.level}] {self.policy}: {where}: {self.message}"


# ------------------------------------------------------------------- value helpers


def dig(value: Any, *path: str | int) -> Any:
    """`value[path[0]][path[1]]...`; None where a key is missing, UNKNOWN where a step is unknown."""
    for key in path:
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(key, int):
            if not isinstance(value, Sequence) or isinstance(value, str) or key >= len(value):
                return None
            value = value[key]
        else:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
    return value


def items(value: Any) -> list[Any]:
    """A list input as a list: None -> [], a single value -> [value]; UNKNOWN stays UNKNOWN."""
    if value is None:
        return []
    if value is UNKNOWN:
        return UNKNOWN
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return [value]


def truthy(value: Any) -> bool:
    """Booleans as the engine sends them: launch templates use the strings "true"/"false"."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def true_or_unknown(value: Any) -> bool:
    """True, or not known yet: a setting the rules cannot fault."""
    return value is UNKNOWN or truthy(value)


def known_str(value: Any) -> TypeGuard[str]:
    """A string value the rules can read (not UNKNOWN, not missing, not a list)."""
    return isinstance(value, str)


def number(value: Any, default: float) -> float:
    """Numbers arrive as floats (or strings from some providers); missing -> default."""
    if value is None or value is UNKNOWN:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def effective_tags(resource: Resource) -> Mapping[str, Any] | Any:
    """The tags a resource ends up with: provider default tags, then `tagsAll`, then `tags`.

    Auto Scaling groups take a list of {key, value, propagateAtLaunch}; it is
    read as a map. UNKNOWN when the tag map itself is not known yet.
    """
    tags = resource.props.get("tags")
    if tags is UNKNOWN:
        return UNKNOWN
    merged: dict[str, Any] = dict(resource.default_tags)
    tags_all = resource.props.get("tagsAll")
    if isinstance(tags_all, Mapping):
        merged.update(tags_all)
    if isinstance(tags, Mapping):
        merged.update(tags)
    elif isinstance(tags, Sequence) and not isinstance(tags, str):
        for tag in tags:
            key = dig(tag, "key")
            if key is UNKNOWN or tag is UNKNOWN:
                return UNKNOWN  # an unknown key could be any of the required ones
            if isinstance(key, str):
                merged[key] = dig(tag, "value")
    return merged


# --------------------------------------------------------------------- the stack


class Stack:
    """Every resource of one stack, with lookups from references to the resources they name."""

    def __init__(self, resources: Iterable[Resource]) -> None:
        self.resources = list(resources)
        self.by_urn = {r.urn: r for r in self.resources if r.urn}
        self._by_ref: dict[str, list[Resource]] = defaultdict(list)
        for r in self.resources:
            for ref in r.ids:
                self._by_ref[ref].append(r)

    def of_type(self, *types: str) -> list[Resource]:
        return [r for r in self.resources if r.type in types]

    def resolve(self, source: Resource, prop: str, value: Any, types: Sequence[str]) -> Any:
        """The resource of one of `types` that `value` (found under `source.props[prop]`) names.

        Returns the resource; EXTERNAL for a known value naming nothing in this
        stack; UNKNOWN when the value is unknown and the property's dependencies
        do not settle it; None when `value` is None and no dependency names one.
        """
        if isinstance(value, str):
            matches = [r for r in self._by_ref.get(value, []) if r.type in types]
            if len(matches) == 1:
                return matches[0]
        dependencies = [self.by_urn[u] for u in source.deps.get(prop, ()) if u in self.by_urn]
        candidates = [r for r in dependencies if r.type in types]
        if len(candidates) == 1:
            return candidates[0]
        if isinstance(value, str):
            return EXTERNAL
        return None if value is None else UNKNOWN

    def environment(self) -> str | None:
        """The stack's environment: the most common known `environment` tag value."""
        seen: Counter[str] = Counter()
        for r in self.resources:
            tags = effective_tags(r)
            value = tags.get("environment") if isinstance(tags, Mapping) else None
            if isinstance(value, str) and value:
                seen[value] += 1
        return seen.most_common(1)[0][0] if seen else None
