"""The policy guide's table and limits (docs/guides/ci-and-policies.md) are the pack's own."""

from __future__ import annotations

from pathlib import Path

from gpucluster.policy.rules import RULES
from gpucluster.policy.rules.capacity import DEFAULT_ENVIRONMENTS

README = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "ci-and-policies.md").read_text()
POLICIES = README.split("## Policies", 1)[1].split("\n## ", 1)[0]


def test_readme_lists_every_policy_with_its_level_and_description() -> None:
    rows = [line for line in POLICIES.splitlines() if line.startswith("| `")]
    assert rows == [f"| `{r.name}` | {r.kind} | {r.level} | {r.description} |" for r in RULES]


def test_readme_environment_limits_are_the_defaults() -> None:
    for env, limits in DEFAULT_ENVIRONMENTS.items():
        row = next(line for line in POLICIES.splitlines() if line.startswith(f"| {env} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == str(limits["max_gpus"])
        assert cells[3] == ("yes" if limits["spot_only"] else "no")
        families = [p.removesuffix(".*") for p in limits["allowed_instance_types"]]
        assert [f.strip().removesuffix(".\\*") for f in cells[1].split(" (")[0].split(",")] == families
