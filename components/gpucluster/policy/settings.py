"""Policy pack config in Pulumi's format, read the same way offline as CrossGuard reads it.

Pulumi's `--policy-pack-config FILE` is a JSON object: each key a policy name
(or `all`), each value an enforcement level or an object with an optional
`enforcementLevel` plus the policy's own properties. `resolve` validates such a
document against the rules' schemas (so a typo fails `gpucluster plan` the way
it fails `pulumi preview`) and returns per-policy levels and settings. It owns
where the config files live (per environment, or per stack); it never runs a rule.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucluster.policy.records import LEVELS
from gpucluster.policy.rules import rules_by_name
from gpucluster.project import policy_config_dir


class PolicyConfigError(ValueError):
    """Invalid policy pack config; one `<where>: <problem>` line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def stack_config_path(stack: str, environment: str | None = None) -> Path | None:
    """The policy config file for a stack: its own (`<stack>.json`), else its environment's
    (`<environment>.json`, shared by every stack tagged with that environment), else none.

    Keyed by environment so a second prod-like stack needs no file of its own; a stack's own
    file wins so one stack can differ from its environment.
    """
    folder = policy_config_dir()
    for name in dict.fromkeys(n for n in (stack, environment) if n):
        path = folder / f"{name}.json"
        if path.is_file():
            return path
    return None


def load(path: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Read and resolve a policy config file (PolicyConfigError when missing or invalid)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise PolicyConfigError([f"{path}: no such policy config file"]) from None
    except json.JSONDecodeError as err:
        raise PolicyConfigError([f"{path}: not valid JSON ({err})"]) from None
    try:
        return resolve(document)
    except PolicyConfigError as err:
        raise PolicyConfigError([f"{path}: {p}" for p in err.problems]) from None


def resolve(document: Any) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """(level per policy, given properties per policy) from a Pulumi policy config document."""
    if not isinstance(document, Mapping):
        raise PolicyConfigError(["the policy config must be a JSON object keyed by policy name"])
    rules = rules_by_name()
    problems: list[str] = []
    levels: dict[str, str] = {}
    settings: dict[str, dict[str, Any]] = {}
    everything = document.get("all")
    if everything is not None:
        if everything in LEVELS:
            levels = dict.fromkeys(rules, str(everything))
        else:
            problems.append(f"all: enforcement level must be one of {', '.join(LEVELS)}, got {everything!r}")
    for name, value in document.items():
        if name == "all":
            continue
        rule = rules.get(name)
        if rule is None:
            hint = difflib.get_close_matches(name, list(rules), n=1, cutoff=0.6)
            problems.append(f"{name}: unknown policy" + (f"; did you mean {hint[0]!r}?" if hint else
                                                         f" (policies: {', '.join(rules)})"))
            continue
        if isinstance(value, str):
            value = {"enforcementLevel": value}
        if not isinstance(value, Mapping):
            problems.append(f"{name}: must be an enforcement level or an object, got {value!r}")
            continue
        level = value.get("enforcementLevel")
        if level is not None:
            if level in LEVELS:
                levels[name] = level
            else:
                problems.append(f"{name}.enforcementLevel: must be one of {', '.join(LEVELS)}, "
                                f"got {level!r}")
        props = {k: v for k, v in value.items() if k != "enforcementLevel"}
        problems += validate({"type": "object", "properties": dict(rule.schema),
                              "additionalProperties": False}, props, name)
        settings[name] = props
    if problems:
        raise PolicyConfigError(problems)
    return levels, settings


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float),
}


def validate(schema: Mapping[str, Any], value: Any, where: str) -> list[str]:
    """Check `value` against the JSON-schema subset the rules' schemas use; problems as lines."""
    kind = schema.get("type")
    if kind:
        numeric = kind in ("integer", "number")
        ok = isinstance(value, _TYPES[kind]) and not (numeric and isinstance(value, bool))
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            ok = True  # Pulumi hands config numbers over as floats
        if not ok:
            return [f"{where}: must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {value!r}"]
    problems: list[str] = []
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{where}: must be >= {schema['minimum']}, got {value!r}")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            problems += validate(schema["items"], item, f"{where}[{i}]")
    if kind == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                problems += validate(properties[key], item, f"{where}.{key}")
            elif extra is False:
                hint = difflib.get_close_matches(key, list(properties), n=1, cutoff=0.6)
                known = f" (known: {', '.join(properties)})" if properties else " (none are taken here)"
                problems.append(f"{where}.{key}: unknown property" + (
                    f"; did you mean {hint[0]!r}?" if hint else known))
            elif isinstance(extra, Mapping):
                problems += validate(extra, item, f"{where}.{key}")
    return problems
