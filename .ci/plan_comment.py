"""Render `gpucluster plan` of every stack as one pull-request comment in Markdown.

CI glue for .github/workflows/pr.yml: runs `gpucluster plan STACK --json` for
each stacks/Pulumi.<stack>.yaml, prints a comment with each stack's verdict,
its policy violations and its resources by type, and exits 1 when any stack has
a mandatory violation or invalid config (so the job fails after commenting).
Usage: python .ci/plan_comment.py > plan-comment.md
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from gpucluster.project import stack_names

REPO = Path(__file__).resolve().parent.parent
MARKER = "<!-- gpucluster-plan -->"


def stacks() -> list[str]:
    """Every stack in stacks/ (the same list pr.yml previews: .ci/stacks.py)."""
    return stack_names(REPO / "stacks")


def plan(stack: str) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, the --json document when there is one, stderr) of `gpucluster plan STACK --json`."""
    done = subprocess.run([sys.executable, "-m", "gpucluster.cli", "plan", stack, "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    try:
        document = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        document = None
    return done.returncode, document, done.stderr


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_stack(stack: str, code: int, document: dict[str, Any] | None, stderr: str) -> list[str]:
    if document is None:
        lines = [f"### `{stack}`: invalid (exit {code})", "", "```", stderr.strip(), "```"]
        return lines
    violations = document.get("violations", [])
    mandatory = [v for v in violations if v["level"] in ("mandatory", "remediate")]
    verdict = (f"blocked, {len(mandatory)} mandatory violation(s)" if mandatory else
               f"passes, {len(violations)} advisory violation(s)" if violations else "passes, no violations")
    lines = [f"### `{stack}` ({document.get('region', '?')}): {verdict}", ""]
    lines += [f"> **Note:** {cell(note)}" for note in document.get("notes", [])]
    lines += [""] if document.get("notes") else []
    if violations:
        lines += ["| level | policy | resource | message |", "|---|---|---|---|"]
        for v in violations:
            where = f"`{v['resource_type']}` {v['resource_name']}" if v["resource_type"] else "stack"
            lines.append(f"| {v['level']} | `{v['policy']}` | {cell(where)} | {cell(v['message'])} |")
        lines.append("")
    custom = [r for r in document.get("resources", []) if r.get("custom")]
    counts = Counter(r["type"] for r in custom)
    lines += [f"<details><summary>{len(custom)} resources</summary>", "", "| count | type |", "|---:|---|"]
    lines += [f"| {n} | `{t}` |" for t, n in sorted(counts.items())]
    lines += ["", "</details>", ""]
    return lines


def main() -> int:
    lines = [MARKER, "## gpucluster plan", "",
             "Offline plan of every stack under Pulumi's mock engine, with the policy pack's verdict "
             "(`gpucluster plan STACK`).", ""]
    failed = False
    for stack in stacks():
        code, document, stderr = plan(stack)
        failed = failed or code != 0
        lines += render_stack(stack, code, document, stderr)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
