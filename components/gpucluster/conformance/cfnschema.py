"""aws-native resources and Cloud Control documents against AWS's CloudFormation resource schemas.

The schemas are package data (`conformance/schemas/<Service>-<Resource>.json`): byte-for-byte copies
of cfn-lint's bundled us-east-1 schemas (cfn-lint is a development dependency only, so a runtime
install plans without it and nothing is downloaded; tests/test_conformance.py checks the copies
against cfn-lint's and that every type a shipped plan uses has one). An aws-native input is mapped
to the schema's property names (camelCase -> PascalCase, as the provider does; map keys such as tags
stay as given) and checked for what AWS checks of a document: required properties, enums, patterns,
lengths, ranges, types and `additionalProperties: false`, and no read-only property set. An
`aws.cloudcontrol.Resource`'s `desiredState` JSON is checked against its `typeName`'s schema as is.
cfn-lint's own extension keywords (`cfnLint`, `requiredXor`, ...) are not read. Values the engine
computes (mock ids) skip patterns and enums: at preview they are unknown.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucluster.conformance.findings import Computed, Finding

if TYPE_CHECKING:
    from gpucluster.plan import PlannedResource

SCHEMAS = Path(__file__).resolve().parent / "schemas"
SOURCE_REGION = "us-east-1"
"""The region of cfn-lint's bundle the shipped schemas are copied from."""
CLOUDCONTROL = "aws:cloudcontrol/resource:Resource"
_TYPES = {"string": str, "boolean": bool, "object": dict, "array": list}


def schema_file(type_name: str) -> Path:
    """Where the schema of `AWS::Service::Resource` ships."""
    return SCHEMAS / f"{type_name.replace('::', '-')}.json"


@functools.cache
def shipped_types() -> dict[str, str]:
    """Every shipped schema's typeName, by its lower-case form (aws-native tokens are lower-case)."""
    return {t.lower(): t for t in (p.stem.replace("-", "::") for p in SCHEMAS.glob("*.json"))}


@functools.cache
def schema(type_name: str) -> dict[str, Any] | None:
    """The shipped schema of `type_name`, read once per process (None: not shipped)."""
    path = schema_file(type_name)
    return json.loads(path.read_text()) if path.is_file() else None


def native_type_name(token: str) -> str | None:
    """`aws-native:pcs:Cluster` -> `AWS::PCS::Cluster` (the shipped schema's casing), else None."""
    parts = token.split(":")
    if len(parts) != 3 or parts[0] != "aws-native":
        return None
    wanted = f"AWS::{parts[1]}::{parts[2]}"
    return shipped_types().get(wanted.lower(), wanted)


@functools.cache
def _pattern(text: str) -> re.Pattern[str] | None:
    try:
        return re.compile(text)
    except re.error:  # an ECMA-only construct: left to AWS
        return None


def _cfn_key(key: str, names: Mapping[str, Any]) -> str | None:
    """The schema property an engine (camelCase) key names: its first letter raised, else any case."""
    if key in names:
        return key
    upper = key[:1].upper() + key[1:]
    if upper in names:
        return upper
    return next((n for n in names if n.lower() == key.lower()), None)


class Validator:
    """One document against one schema; collects (path, problem, schema path)."""

    def __init__(self, root: dict[str, Any], computed: Computed, engine_names: bool) -> None:
        self.root, self.computed, self.engine_names = root, computed, engine_names
        self.found: list[tuple[str, str, str]] = []

    def resolve(self, node: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
        while "$ref" in node and isinstance(node["$ref"], str) and node["$ref"].startswith("#/"):
            where, node = node["$ref"], self.root
            for part in where[2:].split("/"):
                node = node[part]
        return node, where

    def check(self, value: Any, node: dict[str, Any], path: str, where: str) -> None:
        node, where = self.resolve(node, where)
        if value is None:
            return
        for key in ("allOf",):
            for i, sub in enumerate(node.get(key, [])):
                self.check(value, sub, path, f"{where}/{key}/{i}")
        for key in ("anyOf", "oneOf"):
            if key in node:
                tries = []
                for i, sub in enumerate(node[key]):
                    inner = Validator(self.root, self.computed, self.engine_names)
                    inner.check(value, sub, path, f"{where}/{key}/{i}")
                    if not inner.found:
                        break
                    tries.append(inner.found)
                else:
                    self.found.append((path, f"matches none of {key}", where))
        if not self.typed(value, node, path, where):
            return
        if isinstance(value, dict):
            self.object(value, node, path, where)
        elif isinstance(value, list):
            self.array(value, node, path, where)
        else:
            self.scalar(value, node, path, where)

    def typed(self, value: Any, node: dict[str, Any], path: str, where: str) -> bool:
        wanted = node.get("type")
        if wanted is None:
            return True
        kinds = wanted if isinstance(wanted, list) else [wanted]
        for kind in kinds:
            if kind in _TYPES and isinstance(value, _TYPES[kind]):
                return True
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if numeric and (kind == "number" or (kind == "integer" and float(value).is_integer())):
                return True
        if self.computed.holds(value):
            return True
        self.found.append((path, f"expects {' or '.join(kinds)}, not {type(value).__name__}", where))
        return False

    def scalar(self, value: Any, node: dict[str, Any], path: str, where: str) -> None:
        if self.computed.holds(value):
            return
        if "enum" in node and value not in node["enum"]:
            self.found.append((path, f"{value!r} is not one of {', '.join(map(str, node['enum']))}", where))
        if "const" in node and value != node["const"]:
            self.found.append((path, f"{value!r} is not {node['const']!r}", where))
        if isinstance(value, str):
            pattern = _pattern(node["pattern"]) if "pattern" in node else None
            if pattern is not None and not pattern.search(value):
                self.found.append((path, f"{value!r} does not match {node['pattern']}", where))
            if len(value) < node.get("minLength", 0) or len(value) > node.get("maxLength", len(value)):
                self.found.append((path, f"length {len(value)} is outside {node.get('minLength', 0)}.."
                                   f"{node.get('maxLength', '')}", where))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            low, high = node.get("minimum"), node.get("maximum")
            if (low is not None and value < low) or (high is not None and value > high):
                self.found.append((path, f"{value:g} is outside {low if low is not None else ''}.."
                                   f"{high if high is not None else ''}", where))

    def array(self, value: list[Any], node: dict[str, Any], path: str, where: str) -> None:
        if len(value) < node.get("minItems", 0) or len(value) > node.get("maxItems", len(value)):
            self.found.append((path, f"{len(value)} items, outside {node.get('minItems', 0)}.."
                               f"{node.get('maxItems', '')}", where))
        items = node.get("items")
        if isinstance(items, dict):
            for i, element in enumerate(value):
                self.check(element, items, f"{path}[{i}]", f"{where}/items")

    def object(self, value: dict[str, Any], node: dict[str, Any], path: str, where: str) -> None:
        declared: dict[str, Any] = node.get("properties", {})
        patterns: dict[str, Any] = node.get("patternProperties", {})
        prefix = f"{path}." if path else ""
        seen: set[str] = set()
        for key, element in value.items():
            name = _cfn_key(key, declared) if self.engine_names and declared else key
            if name in declared:
                seen.add(name)
                self.check(element, declared[name], f"{prefix}{key}", f"{where}/properties/{name}")
                continue
            matched = [p for p in patterns if (_pattern(p) or re.compile("")).search(key)]
            for p in matched:
                self.check(element, patterns[p], f"{prefix}{key}", f"{where}/patternProperties/{p}")
            extra = node.get("additionalProperties", True)
            if matched:
                continue
            if extra is False:
                self.found.append((f"{prefix}{key}", "unknown property", where))
            elif isinstance(extra, dict):
                self.check(element, extra, f"{prefix}{key}", f"{where}/additionalProperties")
        for name in node.get("required", []):
            if name not in seen and not (not self.engine_names and value.get(name) is not None):
                engine = name[:1].lower() + name[1:] if self.engine_names else name
                self.found.append((f"{prefix}{engine}", "required property missing", where))


def validate(document: Any, type_name: str, computed: Computed,
             engine_names: bool) -> list[tuple[str, str, str]] | None:
    """(path, problem, schema path) for each way `document` breaks the schema of `type_name`;
    None when no schema of it ships. `engine_names`: the document's keys are camelCase."""
    root = schema(type_name)
    if root is None:
        return None
    check = Validator(root, computed, engine_names)
    check.check(document, root, "", "#")
    if isinstance(document, dict):
        read_only = {p.rsplit("/", 1)[-1] for p in root.get("readOnlyProperties", []) if p.count("/") == 2}
        for key in document:
            name = _cfn_key(key, root.get("properties", {})) if engine_names else key
            if name in read_only:
                check.found.append((key, "read-only property: AWS sets it", "#/readOnlyProperties"))
    return check.found


def findings(resource: PlannedResource, computed: Computed) -> list[Finding]:
    """What the CloudFormation schema of an aws-native resource or a Cloud Control document refuses."""
    if resource.type == CLOUDCONTROL:
        type_name, raw = resource.inputs.get("typeName"), resource.inputs.get("desiredState")
        if not isinstance(type_name, str) or not isinstance(raw, str):
            return []
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as err:
            return [Finding(resource.urn, resource.type, resource.name, "desiredState",
                            f"not JSON ({err.msg})", type_name)]
        engine_names, prefix = False, "desiredState."
    else:
        native = native_type_name(resource.type)
        if native is None:
            return []
        type_name, document, engine_names, prefix = native, resource.inputs, True, ""
    found = validate(document, type_name, computed, engine_names)
    if found is None:
        return [Finding(resource.urn, resource.type, resource.name, prefix.rstrip(".") or "-",
                        f"no CloudFormation schema of {type_name} ships with gpucluster", type_name)]
    return [Finding(resource.urn, resource.type, resource.name, f"{prefix}{path}".rstrip(".") or "-",
                    problem, f"{type_name} {where}") for path, problem, where in found]
