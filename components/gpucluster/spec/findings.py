"""What a check reports: the `Finding` (a key path and a one-line message), `SpecError`, and
pydantic's errors worded as findings.

Also the bounds every echoed value and message obeys (a hostile stack file gets a short answer).
It must never import the models or the checks: everything else in `gpucluster.spec` builds on it.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ValidationError

# --------------------------------------------------------------------------- errors

# Bounds on any input, whatever its source (a stack file, PULUMI_CONFIG under `pulumi up`,
# a caller's dict): a hostile file ends in a short error within a second, never a hang,
# a traceback or megabytes of output.
MAX_INPUT_BYTES = 256 * 1024
"""A stack file (or one config value as JSON text); the shipped ones are about 3 KB."""
MAX_NESTING = 32
"""Mappings and lists inside each other; a stack file needs 7."""
MAX_VALUES = 10_000
"""Values in one stack's config, counted with every YAML alias expanded."""
MAX_NUMBER_CHARS = 100
"""Digits of one number (Python refuses to convert ints past 4300 digits)."""
SHOWN_CHARS = 60
"""A value echoed in an error is cut to this many characters."""
MAX_PATH_CHARS = 100
MAX_LINE_CHARS = 200
MAX_FINDINGS = 50


def clip(text: str, limit: int) -> str:
    """`text` on one printable line of at most `limit` characters (cut ones end in '…')."""
    if len(text) > 4 * limit:
        text = text[:4 * limit]
    text = printable(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def printable(text: str) -> str:
    """`text` on one printable line: control characters (newlines too) as their escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(value: Any) -> str:
    """A value as an error message echoes it: its repr, cut to SHOWN_CHARS characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<a {value.bit_length()}-bit number>"  # repr() refuses ints past 4300 digits
    if isinstance(value, str):  # the quotes do not count
        return clip(repr(value[:SHOWN_CHARS + 1]), SHOWN_CHARS + 2)
    return clip(_SHORT_REPR.repr(value), SHOWN_CHARS)


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, SHOWN_CHARS, SHOWN_CHARS
_SHORT_REPR.maxlong = 80


@dataclass(frozen=True)
class Finding:
    """One problem in a stack's config, at a key path such as `node_groups[0].max_nodes`.

    Path and message are cut on creation, so every consumer (terminal, JSON) gets one
    printable line of at most MAX_LINE_CHARS, however long the key or value was. A warning's
    message is ours (about a valid spec; any value in it already cut by `shown`) and ends in its
    advice, so it is never cut: a terminal wraps it, JSON carries it whole.
    """

    path: str
    message: str
    level: Literal["error", "warning"] = "error"

    def __post_init__(self) -> None:
        path = clip(str(self.path), MAX_PATH_CHARS)
        object.__setattr__(self, "path", path)
        message = str(self.message)
        object.__setattr__(self, "message", printable(message) if self.level == "warning"
                           else clip(message, MAX_LINE_CHARS - len(path) - 2))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Invalid stack config; `findings` holds the errors, one line each in `str()`.

    At most MAX_FINDINGS are kept (the last one says how many more there were).
    """

    def __init__(self, findings: list[Finding]) -> None:
        if len(findings) > MAX_FINDINGS:
            more = len(findings) - MAX_FINDINGS + 1
            findings = [*findings[:MAX_FINDINGS - 1],
                        Finding("…", f"{more} more problems not shown; fix the ones above first")]
        self.findings = findings
        super().__init__("\n".join(str(f) for f in findings))


# ----------------------------------------------------------------------- parsing


def _describe(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> list[str]:
    """Field names of the model found at `loc` inside `model`, for did-you-mean hints."""
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = model_in(field.annotation)
    return list(model.model_fields) if model else []


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, `list[X]`, `Annotated[X, ...]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = model_in(arg)
        if found:
            return found
    return None


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Mapping[str, Any], root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        known = _describe(root, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        tail = f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(known)}"
        return f"unknown key; {tail}"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {shown(value)}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number, got {shown(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, got {shown(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got {shown(value)}"
    if kind == "string_type":
        return f"must be a string, got {shown(value)}"
    if kind == "list_type":
        return f"must be a list, got {type(value).__name__}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of keys, got {type(value).__name__}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"allows at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    return str(error["msg"])


def _findings_from(exc: ValidationError, root: type[BaseModel],
                   prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    findings = []
    for error in exc.errors():
        # a dict key's own error carries a trailing "[key]" marker after the key
        loc = tuple(p for p in error["loc"] if p != "[key]")
        findings.append(Finding(format_path(prefix + loc), _message(error, root, loc)))
    return findings


def validation_findings(exc: ValidationError, root: type[BaseModel] | None = None,
                        prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    """A pydantic error as findings worded like the stack file's (component Args are checked with it)."""
    return _findings_from(exc, root, prefix)  # type: ignore[arg-type]
