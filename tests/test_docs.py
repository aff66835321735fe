"""The README tells the truth: its config reference and test command match the code and CI."""

from __future__ import annotations

from pathlib import Path

from gpucluster.reference import BEGIN, END, render_config_reference
from gpucluster.spec import StackConfig

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_readme_config_reference_matches_the_models() -> None:
    start, end = README.index(BEGIN), README.index(END) + len(END)
    assert README[start:end] == render_config_reference(), (
        "README config reference is stale: regenerate with `python -m gpucluster.reference`")


def test_every_config_field_is_documented() -> None:
    reference = render_config_reference()
    assert "|  |" not in reference, "a config field has no docstring"
    for name in StackConfig.model_fields:
        assert f"`gpucluster:{name}`" in reference


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    line = next(line for line in ci.splitlines() if line.startswith("readme_test_command="))
    command = line.split("=", 1)[1].strip("'")
    assert f"```bash\n{command}\n```" in README


def test_readme_has_exactly_two_quick_start_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [block.split("\n")[1] for block in quick.split("```bash")[1:]]
    assert len(commands) == 2
    assert commands[0].endswith("gpucluster plan dev")
    assert commands[1].endswith("python -m pytest")
