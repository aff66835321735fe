"""The stack config reference, rendered from the spec models themselves.

README.md embeds this text between markers, and a test keeps the two equal,
so the documented keys, types and defaults are always the ones the code takes.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpucluster.spec import DIY_ORGANIZATION, ORGANIZATION_KEY, StackConfig, field_docs, model_in

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _type_name(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in get_args(annotation) if a is not type(None)]
        return " or ".join(names)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"map {_type_name(key)} → {_type_name(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if value is PydanticUndefined or value is None:
        return "-"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if not isinstance(value, str) or value else '`""`'


def _rows(model: type[BaseModel], prefix: str, out: list[str], nested: list[tuple[str, type]]) -> None:
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        sub = model_in(field.annotation)
        doc = field_docs(model).get(name, "").replace("\n", " ").replace("|", "\\|")
        out.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {doc} |")
        if sub is not None:
            nested.append((path + ("[]" if get_origin(_strip(field.annotation)) is list else ""), sub))


def _strip(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def render_config_reference() -> str:
    """Markdown tables: one per config key under the `gpucluster:` namespace."""
    lines = [BEGIN, "", "| key | type | default | meaning |", "|---|---|---|---|",
             "| `aws:region` | str | **required** | The AWS region, e.g. `us-east-1`. |",
             f"| `{ORGANIZATION_KEY}` | str | `{DIY_ORGANIZATION}` | The Pulumi organization the stack "
             "deploys in: part of its identity (`gpucluster:stack` tag); required on Pulumi Cloud, where "
             "`pulumi up` checks it. |"]
    queue: list[tuple[str, type]] = []
    for name, field in StackConfig.model_fields.items():
        doc = field_docs(StackConfig).get(name, "").replace("|", "\\|")
        lines.append(f"| `gpucluster:{name}` | {_type_name(field.annotation)} | {_default(field)} | {doc} |")
        sub = model_in(field.annotation)
        if sub is not None:
            queue.append((name + ("[]" if get_origin(_strip(field.annotation)) is list else ""), sub))
    while queue:
        prefix, model = queue.pop(0)
        lines += ["", f"#### `{prefix}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        nested: list[tuple[str, type]] = []
        _rows(model, prefix, lines, nested)
        queue = nested + queue
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_config_reference())
