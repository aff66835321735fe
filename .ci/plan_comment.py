"""Render `gpucluster plan` of every stack as one pull-request comment in Markdown.

CI glue for .github/workflows/pr.yml: runs `gpucluster plan STACK --json` for
each stacks/Pulumi.<stack>.yaml, prints a comment with each stack's verdict,
its monthly cost as scheduled (the hours its stop/start schedules leave it
running) next to 24 x 7, its policy violations and its resources by type, and
exits 1 when any stack has a mandatory violation or invalid config (so the job
fails after commenting). With `--base-stacks DIR` (the base branch's stacks/)
each stack also gets the cost difference base -> head, led by the scheduled
figure (`gpucluster cost --diff`); both sides are priced by this checkout's code,
so the difference is the stack files'.
Usage: python .ci/plan_comment.py [--base-stacks DIR] > plan-comment.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
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


def base_cost(stack: str, base_stacks: Path) -> tuple[dict[str, Any] | None, str]:
    """(`gpucluster cost --json` of the base branch's stack file, why not when None)."""
    path = base_stacks / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        return None, "new stack: no base to compare"
    done = subprocess.run([sys.executable, "-m", "gpucluster.cli", "cost", str(path), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        return None, f"base not priced: {last}"
    return json.loads(done.stdout), ""


def cost_lines(cost: Mapping[str, Any] | None) -> list[str]:
    """One line: the scheduled monthly figure first, 24 x 7 next to it."""
    if not cost or "totals" not in cost:
        reason = cost.get("error") if cost else None
        return [f"Cost: not priced ({reason})." if reason else "Cost: not priced.", ""]
    totals = cost["totals"]
    desired, peak = totals["desired"]["mix"]["usd_per_month"], totals["max"]["mix"]["usd_per_month"]
    scheduled = cost.get("scheduled_totals")
    hours = cost.get("schedule", {}).get("hours_per_month", cost["hours_per_month"])
    if scheduled:
        return [f"Cost: **${scheduled['desired']['mix']['usd_per_month']:,.2f}/month as scheduled** at "
                f"desired nodes ({hours:,.2f} of {cost['hours_per_month']} hours), ${desired:,.2f} 24 x 7; "
                f"at max nodes ${scheduled['max']['mix']['usd_per_month']:,.2f} as scheduled, "
                f"${peak:,.2f} 24 x 7.", ""]
    return [f"Cost: ${desired:,.2f}/month at desired nodes, ${peak:,.2f} at max nodes.", ""]


def cost_diff(stack: str, head: Mapping[str, Any] | None, base_stacks: Path) -> list[str]:
    """The base -> head cost difference in Markdown, led by the scheduled figure."""
    from gpucluster.costdiff import cost_diff_markdown
    from gpucluster.pricing import PricingError

    base, why = base_cost(stack, base_stacks)
    if base is None:
        return [f"_{why}_", ""]
    try:
        markdown = cost_diff_markdown(base, head or {})
    except PricingError as err:
        return [f"_cost difference not available: {err}_", ""]
    body = markdown.replace("### gpucluster cost", "#### gpucluster cost").splitlines()
    return ["<details><summary>cost difference base -> head</summary>", "", *body, "", "</details>", ""]


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_stack(stack: str, code: int, document: dict[str, Any] | None, stderr: str,
                 base_stacks: Path | None = None) -> list[str]:
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
    lines += cost_lines(document.get("cost"))
    if base_stacks is not None:
        lines += cost_diff(stack, document.get("cost"), base_stacks)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-stacks", type=Path, metavar="DIR",
                        help="the base branch's stacks/ directory: add each stack's cost difference")
    args = parser.parse_args(argv)
    lines = [MARKER, "## gpucluster plan", "",
             "Offline plan of every stack under Pulumi's mock engine, with the policy pack's verdict "
             "(`gpucluster plan STACK`).", ""]
    failed = False
    for stack in stacks():
        code, document, stderr = plan(stack)
        failed = failed or code != 0
        lines += render_stack(stack, code, document, stderr, args.base_stacks)
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
