"""The docs site's references, from the code: stack keys, CLI commands, policy rules, the ledger.

`docs/reference/{config,cli,policies,ledger}.md` are written by `python -m gpucluster.reference --write`
and checked in; tests/test_docs.py renders them again and fails when a page differs, so the
documented keys, options, defaults and rules are always the ones the code takes. (Checked-in
pages rather than a build-time hook: they read on GitHub too, and a stale page fails the
tests, not only the site build.) The CLI and policy renderers import their subject only when
called, so rendering the config reference loads neither the CLI nor the policy pack. Every text
taken from the code goes through `_text` (or `_cell`): a placeholder such as `Pulumi.<name>.yaml`
in a help text or docstring would otherwise reach the browser as an unknown HTML tag and vanish.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpucluster.spec import DIY_ORGANIZATION, ORGANIZATION_KEY, StackConfig, field_docs, model_in

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_PLACEHOLDER = re.compile(r"<([^<>]*)>")


def _text(text: str) -> str:
    """Prose from the code for a generated page: `<name>` outside code spans as `&lt;name&gt;` (and any
    other `<` as `&lt;`), so a placeholder in a help text reads as written (on the site and on GitHub)
    instead of being an HTML tag; `->` stays as it is."""
    parts = _CODE_SPAN.split(text)
    return "".join(part if i % 2 else _PLACEHOLDER.sub(r"&lt;\1&gt;", part).replace("<", "&lt;")
                   for i, part in enumerate(parts))


def _cell(text: str) -> str:
    """One Markdown table cell from the code's text: no line breaks, pipes and placeholders escaped."""
    return _text(" ".join(str(text).split()).replace("|", "\\|"))


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
        doc = _cell(field_docs(model).get(name, ""))
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
        doc = _cell(field_docs(StackConfig).get(name, ""))
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


def _default_of(param: Any) -> str:
    if getattr(param, "is_flag", False) or param.required:
        return "**required**" if param.required else "-"
    value = param.default
    if value is None or value == "" or value == ():
        return "-"
    return f"`{getattr(value, 'value', value)}`"


def _usage_name(param: Any) -> str:
    if param.param_type_name == "argument":
        name = param.name.upper()
        return f"{name}..." if param.nargs == -1 else name
    return ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])


def _command_section(command: Any, path: str, lines: list[str]) -> None:
    lines += ["", f"## `{path}`", ""]
    if command.help:
        lines += [_text(command.help.strip().replace("\b\n", "")), ""]
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    arguments = [p for p in params if p.param_type_name == "argument"]
    usage = " ".join([path, *(("[" + _usage_name(a) + "]") if not a.required else _usage_name(a)
                              for a in arguments)])
    options = [p for p in params if p.param_type_name == "option"]
    lines += ["```", usage + (" [OPTIONS]" if options else ""), "```"]
    if params:
        lines += ["", "| argument or option | default | meaning |", "|---|---|---|"]
        for param in params:
            name = _usage_name(param) if param.param_type_name == "option" else f"`{_usage_name(param)}`"
            lines.append(f"| {name} | {_default_of(param)} | {_cell(param.help or '')} |")


def render_cli_reference() -> str:
    """Every `gpucluster` command and option, in `--help` order, from the typer app itself."""
    import typer

    from gpucluster.cli.entry import app

    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup), "the gpucluster app has commands"
    lines = ["# CLI reference", "",
             "Generated from the typer app (`gpucluster.cli.entry.app`) by `python -m gpucluster.reference "
             "--write`; `tests/test_docs.py` fails when this page and the code differ. "
             "[The gpucluster command](../guides/cli.md) explains exit codes, `--json` and output.", "",
             "## `gpucluster`", "", "Options before the command:", "",
             "| option | default | meaning |", "|---|---|---|"]
    lines += [f"| {_usage_name(p)} | {_default_of(p)} | {_cell(getattr(p, 'help', None) or '')} |"
              for p in root.params]
    for name, command in root.commands.items():
        if getattr(command, "hidden", False):
            continue
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for sub_name, sub in subcommands.items():
                _command_section(sub, f"gpucluster {name} {sub_name}", lines)
        else:
            _command_section(command, f"gpucluster {name}", lines)
    return "\n".join(lines) + "\n"


def render_policy_reference() -> str:
    """Every rule of the policy pack, in the pack's order, with its default level and settings."""
    import json

    from gpucluster import conformance
    from gpucluster.policy.rules import RULES

    lines = ["# Policy rules", "",
             "Generated from `gpucluster.policy.rules.RULES` (the pack `pulumi preview --policy-pack "
             "policies` runs and `gpucluster plan` evaluates offline) by `python -m gpucluster.reference "
             "--write`. Levels and settings are changed per stack in `policies/config/` "
             "([CI and policies](../guides/ci-and-policies.md)).", "",
             "| rule | checks | default level | description |", "|---|---|---|---|"]
    lines += [f"| [`{r.name}`](#{r.name}) | one {r.kind if r.kind == 'resource' else 'stack'} "
              f"| `{r.level}` | {_cell(r.description)} |" for r in RULES]
    name = conformance.POLICY
    lines.append(f"| [`{name}`](#{name}) | every resource, `gpucluster plan` only "
                 f"| `mandatory` | {_cell(conformance.DESCRIPTION)} |")
    for r in RULES:
        lines += ["", f"## `{r.name}`", "", _cell(r.description), "",
                  f"Checks {'each resource' if r.kind == 'resource' else 'the whole stack'}; "
                  f"default level `{r.level}`."]
        if r.schema:
            lines += ["", "| setting | type | default | meaning |", "|---|---|---|---|"]
            for key, schema in r.schema.items():
                default = json.dumps(r.defaults[key], sort_keys=True) if key in r.defaults else "-"
                lines.append(f"| `{key}` | {schema.get('type', '-')} | `{default}` "
                             f"| {_cell(schema.get('description', ''))} |")
    lines += ["", f"## `{name}`", "", _cell(conformance.DESCRIPTION), "",
              "Checked by `gpucluster plan` only, on every resource it records (`gpucluster.conformance`): "
              "not a CrossGuard rule (it reads the provider SDKs' type metadata, which the pack's rules "
              "never import), and `pulumi preview` itself refuses what it finds. Always `mandatory`: the "
              "policy config does not change it. What it reads: "
              "[Development](../development.md#provider-conformance)."]
    return "\n".join(lines) + "\n"


def render_config_page() -> str:
    """docs/reference/config.md: the config reference with its introduction."""
    return ("# Stack file reference\n\n"
            "Every key a stack file (`stacks/Pulumi.<env>.yaml`) takes, generated from the spec models "
            "(`gpucluster.spec`) by `python -m gpucluster.reference --write`; `tests/test_docs.py` fails "
            "when this page and the models differ. How a stack file is laid out: "
            "[Stack files](../guides/stack-files.md).\n\n" + render_config_reference() + "\n")


def render_ledger_page() -> str:
    """docs/reference/ledger.md: every entry of the ledger (`gpucluster.ledger`), a summary table first."""
    from gpucluster.ledger import CONDITIONS, STATUSES, load_ledger

    entries = load_ledger()
    counts = ", ".join(f"{sum(e.status == s for e in entries)} {s}" for s in STATUSES)
    lines = ["# Ledger of facts mocks cannot check", "",
             "Facts about AWS (and the software it runs) that gpucluster relies on and no test here can "
             "observe: mocks and moto accept whatever they are given. Generated from "
             "`components/gpucluster/catalog/data/ledger.yaml` by `python -m gpucluster.reference --write`. "
             "The code cites an entry as `ledger: <id>` where it relies on it; `gpucluster plan` names the "
             "entries of the planned stack that no named source or measurement backs, and `gpucluster "
             "verify` checks, after `pulumi up`, those an account's read-only calls can show.", "",
             f"{len(entries)} entries: {counts}. A stack relies on an entry when every term of its "
             f"*stacks* holds ({', '.join(f'`{c}`' for c in CONDITIONS)}).", "",
             "| fact | status | stacks | checked by `gpucluster verify` |", "|---|---|---|---|"]
    lines += [f"| [`{e.id}`](#{e.id}) | {e.status} | {', '.join(e.when)} | {'yes' if e.verify else 'no'} |"
              for e in entries]
    for e in entries:
        lines += ["", f"## {e.id}", "", _cell(e.says), "",
                  f"- **Source**: {_cell(e.source)}", f"- **Status**: {e.status}",
                  f"- **Stacks**: {', '.join(e.when)}",
                  "- **`gpucluster verify`**: "
                  + (_cell(e.verify) if e.verify else "cannot check it in an account")]
        lines += [f"- **Re-check**: {_cell(e.recheck)}"] if e.recheck else []
        lines += [f"- **Note**: {_cell(e.note)}"] if e.note else []
    return "\n".join(lines) + "\n"


PAGES = {"config.md": render_config_page, "cli.md": render_cli_reference,
         "policies.md": render_policy_reference, "ledger.md": render_ledger_page}
"""The generated pages under docs/reference/, by file name."""


def write_pages(directory: Path) -> list[Path]:
    """Write every generated page into `directory` (docs/reference); returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, render in PAGES.items():
        (directory / name).write_text(render())
        written.append(directory / name)
    return written


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for path in write_pages(Path("docs") / "reference"):
            print(f"wrote {path}")
    else:
        print(render_config_reference())
