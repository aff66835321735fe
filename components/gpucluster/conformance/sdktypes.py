"""A planned resource's inputs against its provider SDK's own input types, recursively.

The resource class comes from its type token (`@pulumi.type_token`: every class the program
instantiated is loaded already; pulumi_aws / pulumi_aws_native are imported for one that is not), its
input type is the `<Class>Args` beside it, and `pulumi._types` gives each `@pulumi.input_type` class's
properties by their Pulumi (engine) names, their types and which are required. Nested `*Args`
classes, lists and maps are followed; enums must hold the value. Primitive types are not compared
(the engine carries booleans of some pulumi_aws types as strings, numbers as floats): what the
provider's Check refuses is an unknown property, a missing required one and a value outside an enum.
Each class's metadata is read once per process.
"""

from __future__ import annotations

import collections.abc
import enum
import functools
import importlib
import inspect
import json
import sys
import types
import typing
from typing import TYPE_CHECKING, Any

import pulumi
from pulumi import _types as pulumi_types

from gpucluster.conformance.findings import Computed, Finding

if TYPE_CHECKING:
    from gpucluster.plan import PlannedResource

_PACKAGES = {"aws": "pulumi_aws", "aws-native": "pulumi_aws_native", "kubernetes": "pulumi_kubernetes"}
_SEQUENCES = {list, collections.abc.Sequence, typing.Sequence, tuple}
_MAPPINGS = {dict, collections.abc.Mapping, typing.Mapping}


def _subclasses(cls: type) -> typing.Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


_LOADED: dict[str, type] = {}


def _loaded_class(token: str) -> type | None:
    """The loaded resource class decorated with `token`, if any (the classes listed again on a miss)."""
    if token not in _LOADED:
        _LOADED.update({getattr(cls, "pulumi_type", ""): cls for cls in _subclasses(pulumi.CustomResource)
                        if "pulumi_type" in vars(cls)})
    return _LOADED.get(token)


def _imported_class(token: str) -> type | None:
    """Import the class of `token` from its SDK: `pkg:module/x:Name` or `pulumi:providers:pkg`."""
    parts = token.split(":")
    if len(parts) != 3:
        return None
    if parts[0] == "pulumi" and parts[1] == "providers":
        module_names, name = [_PACKAGES.get(parts[2], "")], "Provider"
    elif parts[0] == "kubernetes":
        # `kubernetes:<group>/<version>:<Kind>`: the SDK's module is the group's first label (`core`
        # for the core group), then the version (`helm.sh/v3` -> pulumi_kubernetes.helm.v3).
        group, _, version = parts[1].rpartition("/")
        module_names = [f"{_PACKAGES['kubernetes']}.{group.split('.')[0]}.{version}"]
        name = parts[2]
    elif parts[0] in _PACKAGES:
        service = parts[1].split("/")[0]
        base = _PACKAGES[parts[0]]
        module_names = [base] if service == "index" else [f"{base}.{service}", f"{base}.{service}_"]
        name = parts[2]
    else:
        return None
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, name, None)
        # An SDK generated before `@pulumi.type_token` (pulumi_aws 7.2 may be one: not checked) names
        # the class by module and name only.
        if isinstance(cls, type) and issubclass(cls, pulumi.CustomResource) \
                and getattr(cls, "pulumi_type", token) == token:
            return cls
    return None


@functools.cache
def args_class(token: str) -> type | None:
    """The `*Args` input type of the resource `token` names (None: the SDK has no such resource)."""
    cls = _loaded_class(token) or _imported_class(token)
    if cls is None:
        return None
    module = sys.modules[cls.__module__]
    for name in (f"{cls.__name__}InitArgs", f"{cls.__name__}Args"):  # InitArgs: where a nested type
        args = getattr(module, name, None)                           # took the name (BucketVersioning)
        if isinstance(args, type) and args.__module__ == cls.__module__ and pulumi_types.is_input_type(args):
            return args
    return None


@functools.cache
def properties(input_cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """An input type's properties by engine name with their types, and the required ones (the SDK's
    own answer where this pulumi has it, else the `__init__` parameters without a default)."""
    by_name = pulumi_types.input_type_types(input_cls)
    required = getattr(pulumi_types, "_required_property_names", None)
    if required is not None:
        return by_name, required(input_cls)
    names = pulumi_types.input_type_py_to_pulumi_names(input_cls)
    parameters = inspect.signature(input_cls).parameters.values()
    return by_name, frozenset(names[p.name] for p in parameters if p.default is p.empty and p.name in names)


def _type_name(typ: Any) -> str:
    """`pulumi_aws.iam.RolePolicyArgs`: a type as its SDK's service package exports it."""
    if not isinstance(typ, type):
        return str(typ)
    package = [p for p in typ.__module__.split(".")[:2] if not p.startswith("_")]
    return ".".join([*package, typ.__qualname__])


def checked(token: str) -> bool:
    """Whether `token` is a resource of an SDK this check reads (pulumi_aws, pulumi_aws_native,
    pulumi_kubernetes, their providers); another package's (a dynamic provider's) has no type metadata
    to check against, and a Kubernetes custom resource (a kind the SDK lacks) is `crdschema`'s."""
    parts = token.split(":")
    if parts[0] == "kubernetes":
        return args_class(token) is not None
    return parts[0] in _PACKAGES or (parts[:2] == ["pulumi", "providers"] and parts[-1] in _PACKAGES)


def custom_resource(token: str) -> bool:
    """A Kubernetes object of a kind pulumi_kubernetes has no type of (an instance of a CRD)."""
    return token.startswith("kubernetes:") and args_class(token) is None


Shape = tuple[str, Any]
"""One alternative of a property's type: ("object", cls), ("enum", cls), ("list", item type),
("map", item type) or ("any", None) for what the check does not compare."""


@functools.cache
def shapes(typ: Any) -> tuple[Shape, ...]:
    """The alternatives of a type (Input[T], Optional[T], T | TDict unwrapped), each as a Shape."""
    typ = pulumi_types.unwrap_type(typ)
    members = [typ]
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        members = [m for m in (pulumi_types.unwrap_type(m) for m in typing.get_args(typ))
                   if m is not type(None) and typing.get_origin(m) not in (collections.abc.Awaitable,
                                                                           typing.Awaitable, pulumi.Output)]
    out: list[Shape] = []
    for member in members:
        origin, args = typing.get_origin(member), typing.get_args(member)
        if isinstance(member, type) and pulumi_types.is_input_type(member):
            out.append(("object", member))
        elif isinstance(member, type) and issubclass(member, enum.Enum):
            out.append(("enum", member))
        elif origin in _SEQUENCES:
            out.append(("list", args[0] if args else Any))
        elif origin in _MAPPINGS:
            out.append(("map", args[1] if len(args) == 2 else Any))
        else:
            out.append(("any", None))
    return tuple(out) or (("any", None),)


def _decoded(value: Any) -> Any:
    """A provider's object input as the engine carries it (a JSON string), decoded."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


class _Walk:
    """One resource's inputs against its types; collects (path, problem, refused_by)."""

    def __init__(self, computed: Computed) -> None:
        self.computed = computed
        self.found: list[tuple[str, str, str]] = []

    def value(self, value: Any, typ: Any, path: str) -> None:
        alternatives = shapes(typ)
        if len(alternatives) == 1:
            self.one(value, alternatives[0], path)
            return
        attempts: list[list[tuple[str, str, str]]] = []
        for shape in alternatives:
            walk = _Walk(self.computed)
            walk.one(value, shape, path)
            if not walk.found:
                return
            attempts.append(walk.found)
        shortest: list[tuple[str, str, str]] = min(attempts, key=len)
        self.found.extend(shortest)

    def one(self, value: Any, shape: Shape, path: str) -> None:
        kind, what = shape
        if value is None or kind == "any":
            return
        if kind == "object":
            self.object(_decoded(value), what, path)
        elif kind == "enum":
            allowed = [m.value for m in what]
            if value not in allowed and not self.computed.holds(value):
                self.found.append((path, f"{value!r} is not one of {', '.join(map(str, allowed))}",
                                   _type_name(what)))
        elif kind == "list":
            value = _decoded(value)
            if not isinstance(value, list):
                self.found.append((path, f"expects a list, not {type(value).__name__}", str(what)))
                return
            for i, element in enumerate(value):
                self.value(element, what, f"{path}[{i}]")
        else:
            value = _decoded(value)
            if not isinstance(value, dict):
                self.found.append((path, f"expects a map, not {type(value).__name__}", str(what)))
                return
            for key, element in value.items():
                self.value(element, what, f"{path}.{key}")

    def object(self, value: Any, cls: type, path: str) -> None:
        if not isinstance(value, dict):
            self.found.append((path, f"expects an object, not {type(value).__name__}", _type_name(cls)))
            return
        types, required = properties(cls)
        prefix = f"{path}." if path else ""
        for key, element in value.items():
            if key not in types:
                self.found.append((f"{prefix}{key}", "unknown property", _type_name(cls)))
            else:
                self.value(element, types[key], f"{prefix}{key}")
        self.found += [(f"{prefix}{key}", "required property missing", _type_name(cls))
                       for key in sorted(required) if value.get(key) is None]


def findings(resource: PlannedResource, computed: Computed) -> list[Finding]:
    """What the resource's provider SDK refuses of its inputs."""
    if not checked(resource.type):
        return []
    cls = args_class(resource.type)
    if cls is None:
        return [Finding(resource.urn, resource.type, resource.name, "-",
                        "no resource of this type in the installed provider SDKs", resource.type)]
    walk = _Walk(computed)
    walk.object(resource.inputs, cls, "")
    return [Finding(resource.urn, resource.type, resource.name, path, problem, by)
            for path, problem, by in walk.found]
