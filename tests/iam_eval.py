"""A small IAM policy evaluator for tests: identity policies, a permissions boundary, explicit denies.

It follows the IAM user guide's "Policy evaluation logic" for one account: an explicit Deny in any
policy wins; otherwise the request needs an Allow in an identity policy and, when the role has a
permissions boundary, an Allow in the boundary too. Conditions: the String*, Arn*, Bool and Null
operators with `...IfExists` and `ForAllValues:`/`ForAnyValue:`; a negated operator is true when the
key is absent, a positive one false ("Condition operators": "If the key ... is not present").
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

Context = Mapping[str, str | Sequence[str]]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@cache
def _compiled(pattern: str, case: bool) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern).replace("(?s:", "(?s:" if case else "(?si:", 1))


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    return _compiled(pattern, case).match(value) is not None


def _matches_action(patterns: Any, action: str) -> bool:
    return any(_glob(p, action, case=False) for p in _as_list(patterns))


def _matches_resource(patterns: Any, resource: str) -> bool:
    return any(p == "*" or _glob(p, resource) for p in _as_list(patterns))


def _test(operator: str, expected: str, actual: str) -> bool:
    base = operator.replace("Not", "")
    if base in ("StringEquals", "ArnEquals"):
        return expected == actual
    if base in ("StringLike", "ArnLike"):
        return _glob(expected, actual)
    if base == "StringEqualsIgnoreCase":
        return expected.lower() == actual.lower()
    if base == "Bool":
        return expected.lower() == actual.lower()
    raise ValueError(f"operator {operator} not supported by this evaluator")


def _condition_holds(operator: str, key: str, expected: Any, context: Context) -> bool:
    qualifier, _, operator = operator.rpartition(":")
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    present = key in context
    if operator == "Null":
        return (str(_as_list(expected)[0]).lower() == "true") != present
    if not present:
        return if_exists or "Not" in operator
    actual = [str(v) for v in _as_list(context[key])]
    values = [str(v) for v in _as_list(expected)]
    negated = "Not" in operator

    def one(value: str) -> bool:
        hit = any(_test(operator, e, value) for e in values)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in actual)
    return any(one(v) for v in actual)


def statement_applies(statement: Mapping[str, Any], action: str, resource: str, context: Context) -> bool:
    if "Action" in statement and not _matches_action(statement["Action"], action):
        return False
    if "NotAction" in statement and _matches_action(statement["NotAction"], action):
        return False
    if "Resource" in statement and not _matches_resource(statement["Resource"], resource):
        return False
    if "NotResource" in statement and _matches_resource(statement["NotResource"], resource):
        return False
    return all(_condition_holds(op, key, expected, context)
               for op, block in statement.get("Condition", {}).items() for key, expected in block.items())


def _statements(document: Mapping[str, Any] | str) -> list[Mapping[str, Any]]:
    doc = json.loads(document) if isinstance(document, str) else document
    return _as_list(doc["Statement"])


def allowed(identity: Sequence[Mapping[str, Any] | str], boundary: Mapping[str, Any] | str | None,
            action: str, resource: str = "*", **context: str | Sequence[str]) -> bool:
    """Whether a principal with these identity policies and this boundary may make the request."""
    everything = [s for d in identity for s in _statements(d)]
    fences = _statements(boundary) if boundary is not None else []
    if any(s["Effect"] == "Deny" and statement_applies(s, action, resource, context)
           for s in everything + fences):
        return False
    granted = any(s["Effect"] == "Allow" and statement_applies(s, action, resource, context)
                  for s in everything)
    capped = boundary is None or any(s["Effect"] == "Allow" and statement_applies(s, action, resource,
                                                                                  context)
                                     for s in fences)
    return granted and capped
