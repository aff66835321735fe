"""Reading the CLI's human output in tests: rows of its tables with their wrapped parts joined.

`gpucluster.cli.render.table` keeps every line within 100 columns: a long last column wraps
under itself and columns that do not fit go on an indented line below their row. Tests that
read a row as one line join those parts back (`joined_lines`).
"""

from __future__ import annotations


def joined_lines(output: str, indent: str = "  ") -> list[str]:
    """The output's lines, each line indented deeper than `indent` joined onto the line before it
    (a table row's continuation); other lines as they are."""
    out: list[str] = []
    for line in output.splitlines():
        if out and line.startswith(indent + " ") and out[-1].startswith(indent):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def folded(line: str) -> dict[str, str]:
    """The `header: value` pairs of a folded row's continuation line (the columns that did not fit)."""
    return dict(part.split(": ", 1) for part in line.strip().split("  ") if ": " in part)


def said(output: str) -> list[str]:
    """The messages of prose output (`render.say`): each unindented line with the lines its text
    wrapped into (indented by two spaces) joined back, one space apart."""
    out: list[str] = []
    for line in output.splitlines():
        if out and line.startswith("  ") and not out[-1].startswith(" "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out
