"""Pulumi config -> `StackSpec`: decode each `project:key` value (JSON text or plain), bound it, validate
it into the models and run every named check, reporting all problems at once as `SpecError`.

`parse_stack_config` is the one entry; callers that deploy or plan pass `gpucluster.preflight`'s
checks (which include the rendered-artefact ones). Never imports Pulumi or AWS.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from gpucluster.spec.checks import CHECKS, Check
from gpucluster.spec.fields import DIY_ORGANIZATION, ORGANIZATION_KEY, PROJECT, REGION_KEY
from gpucluster.spec.findings import (
    MAX_INPUT_BYTES,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    MAX_VALUES,
    Finding,
    SpecError,
    format_path,
    shown,
    validation_findings,
)
from gpucluster.spec.models import StackConfig, StackSpec


class _JsonRefused(Exception):
    """JSON text that parses but is not a bounded plain value (see `_decode`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _JsonRefused(f"duplicate key {shown(key)} in a mapping")
        seen[key] = value
    return seen


def _number(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def bounded(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _JsonRefused(f"a number of {len(text)} characters; at most {MAX_NUMBER_CHARS}")
        return parse(text)

    return bounded


def _decode(value: Any) -> tuple[Any, str | None]:
    """(value, problem): Pulumi hands structured config over as JSON text; YAML gives objects.

    Under `pulumi up` every value arrives as a string in PULUMI_CONFIG, so the JSON of a
    mapping or list is parsed here with the stack file's bounds: no duplicate keys, no
    endless numbers, no unbounded nesting. Text that is not JSON stays the string it is.
    """
    if not isinstance(value, str) or value[:1] not in ("[", "{") or len(value) > MAX_INPUT_BYTES:
        return value, None
    try:
        return json.loads(value, object_pairs_hook=_unique_keys, parse_int=_number(int),
                          parse_float=_number(float)), None
    except _JsonRefused as refused:
        return value, str(refused)
    except RecursionError:
        return value, f"nested more than {MAX_NESTING} deep"
    except ValueError:
        return value, None


def plain_value_problem(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """(where inside `value`, problem) for the first part that is not a bounded plain value.

    Plain: mappings with string keys, lists, strings (UTF-8, no NUL), whole numbers of at
    most MAX_NUMBER_CHARS digits, finite or not floats, booleans and null; nested at most
    MAX_NESTING deep and MAX_VALUES values in all. Iterative, so hostile objects (cycles,
    deep nesting) end in a finding, never in a RecursionError.
    """
    count = 0
    pending: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 0, ())]
    while pending:
        item, depth, loc = pending.pop()
        count += 1
        if count > MAX_VALUES:
            return loc, f"more than {MAX_VALUES} values (YAML aliases count expanded)"
        if depth > MAX_NESTING:
            return loc, f"nested more than {MAX_NESTING} deep"
        if isinstance(item, dict):
            for key in reversed(list(item)[:MAX_VALUES]):
                if not isinstance(key, str):
                    return loc, f"mapping keys must be strings, got {shown(key)}"
                pending.append((item[key], depth + 1, (*loc, key)))
        elif isinstance(item, list | tuple):
            pending.extend((v, depth + 1, (*loc, i)) for i, v in reversed(list(enumerate(item[:MAX_VALUES]))))
        elif isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return loc, problem
        elif isinstance(item, bool | float) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() > MAX_NUMBER_CHARS * 3.33:
                return loc, f"a number of more than {MAX_NUMBER_CHARS} digits"
        else:
            return loc, (f"must be a string, number, boolean, list or mapping, got "
                                      f"{type(item).__name__}")
    return None


def _text_problem(text: str) -> str | None:
    if len(text) > MAX_INPUT_BYTES:
        return f"a string of {len(text)} characters; at most {MAX_INPUT_BYTES}"
    if "\0" in text:
        return "NUL characters cannot reach a node or a Lambda environment"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "not valid Unicode text (a lone surrogate escape such as \\ud800)"
    return None


def parse_stack_config(config: Mapping[str, Any], stack: str, *, project: str = PROJECT,
                       organization: str | None = None, checks: Sequence[Check] = CHECKS) -> StackSpec:
    """Validate a stack's config map (`project:key` -> value) into a StackSpec.

    `project` is the Pulumi project's name (Pulumi.yaml `name`). `organization` is the Pulumi
    organization the stack is being deployed in, known under `pulumi up` only; the stack file's
    `gpucluster:organization` must then agree with it, or be absent in a self-managed backend, so
    that the CLI, which reads only the stack file, computes the deployment's identity exactly.
    Raises SpecError with every problem found: unknown or missing keys, bad values and all
    cross-field rules (`checks`, in order: this package's; `gpucluster.preflight.CHECKS` adds those
    that need rendered artefacts, and its `parse_stack_config` passes them).
    """
    findings: list[Finding] = []
    values: dict[str, Any] = {}
    known = list(StackConfig.model_fields)
    unset = object()
    organization_key: Any = unset
    for key, raw in config.items():
        if not isinstance(key, str):
            findings.append(Finding(shown(key), "config keys must be strings (namespace:key)"))
            continue
        namespace, _, name = key.rpartition(":")
        ours = namespace in ("", PROJECT)
        # Every value is bounded, also those of namespaces the program ignores (aws:*):
        # they all travel to the engine as JSON.
        value, problem = _decode(raw)
        where = ((), problem) if problem else plain_value_problem(value)
        if where is not None:
            findings.append(Finding(format_path((name if ours else key, *where[0])), where[1]))
            continue
        if not ours:
            continue
        if key in (ORGANIZATION_KEY, "organization"):
            organization_key = value
            continue
        if name not in known:
            hint = difflib.get_close_matches(name, [*known, "organization"], n=1, cutoff=0.6)
            tail = f"did you mean '{PROJECT}:{hint[0]}'?" if hint else f"known: {', '.join(known)}"
            findings.append(Finding(f"{PROJECT}:{name}", f"unknown key; {tail}"))
            continue
        values[name] = value
    if organization_key is not unset:
        values["organization"] = organization_key
        findings.extend(_organization_findings(organization_key, organization))
    elif organization is not None:
        values["organization"] = organization
        findings.extend(_organization_findings(None, organization))
    region = config.get(REGION_KEY)
    if region is None:
        findings.append(Finding(REGION_KEY, "required key is missing (e.g. us-east-1)"))
    elif any(f.path.startswith(REGION_KEY) for f in findings):
        region = None  # reported above; validate the rest with a stand-in
    try:
        spec = StackSpec.model_validate({**values, "stack": stack, "project": project,
                                         "region": "us-east-1" if region is None else region})
    except ValidationError as exc:
        renamed = {"region": REGION_KEY, "organization": ORGANIZATION_KEY,
                   "project": "project (Pulumi.yaml name)"}
        for finding in validation_findings(exc, StackSpec):
            findings.append(Finding(renamed.get(finding.path, finding.path), finding.message))
        raise SpecError(findings) from None
    for rule in checks:
        findings.extend(f for f in rule(spec) if f.level == "error")
    if findings:
        raise SpecError(findings)
    return spec


def _organization_findings(configured: Any, deployed: str | None) -> Iterable[Finding]:
    """The stack file's organization against the one `pulumi up` deploys in (None: not deploying)."""
    if deployed is None or configured == deployed:
        return
    if configured is None and deployed != DIY_ORGANIZATION:
        yield Finding(ORGANIZATION_KEY, f"deploying in Pulumi organization {deployed!r}: add "
                      f"`{ORGANIZATION_KEY}: {deployed}` to the stack file (status, resume and doctor "
                      "compute the gpucluster:stack identity from it)")
    elif configured is not None:
        yield Finding(ORGANIZATION_KEY, f"is {configured!r}, but this stack deploys in Pulumi "
                      f"organization {deployed!r}; set it to {deployed!r}")


def stack_warnings(spec: StackSpec, checks: Sequence[Check] = CHECKS) -> list[Finding]:
    """The warning-level findings of every check on a valid spec (what `plan` prints).

    The rendered-artefact checks of `gpucluster.preflight` report errors only, so this package's
    checks give every warning there is.
    """
    return [f for rule in checks for f in rule(spec) if f.level == "warning"]
