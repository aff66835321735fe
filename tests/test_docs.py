"""The README tells the truth: its config reference and test command match the code and CI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    command = ci.split("readme_test_command=$(cat <<'README'\n", 1)[1].split("\nREADME\n)", 1)[0]
    assert "\n" not in command and command.endswith("python -m pytest")
    assert f"```bash\n{command}\n```" in README


def test_readme_has_exactly_two_quick_start_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [block.split("\n")[1] for block in quick.split("```bash")[1:]]
    assert len(commands) == 2
    assert commands[0].endswith("gpucluster plan dev")
    assert commands[1].endswith("python -m pytest")


def test_readme_shell_commands_work_in_zsh_too() -> None:
    """zsh expands an unquoted `.[chart]` (or any `[`, `*`, `?`) as a glob and stops ("no matches
    found"): extras and patterns are quoted, in the command blocks and in the text alike."""
    assert not re.search(r"(?<![\"'])\.\[\w+\]", README)
    assert "pip install -e '.[chart]'" in README
    for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL):
        for line in block.splitlines():
            bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", line.split(" #", 1)[0])
            assert not re.search(r"[\[\]*?]", bare), line


def test_an_older_python_stops_at_the_first_step_with_one_line() -> None:
    guard = README.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split(" && ", 1)[0]
    assert guard.startswith("python3 -c ")
    older = _an_older_python()
    if older is None:
        pytest.skip("no Python older than 3.11 on this machine")
    done = subprocess.run(["bash", "-c", guard.replace("python3", older, 1)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(r"gpucluster needs Python 3\.11 or newer, not 3\.\d+\.\d+\n", done.stderr)
    assert subprocess.run(["bash", "-c", guard.replace("python3", sys.executable, 1)],
                          check=False).returncode == 0


def _an_older_python() -> str | None:
    """A Python 3.8-3.10 that runs here (PATH, or pyenv's installs), else None."""
    candidates = sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python"))
    candidates += [shutil.which(f"python3.{minor}") for minor in (10, 9, 8)]
    for candidate in (c for c in candidates if c and "/shims/" not in c):  # pyenv's shims are slow
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] < (3, 11))"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    return None
