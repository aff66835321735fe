"""The CLI works where the user is: stacks from the enclosing Pulumi project, `--stacks-dir`, clear misses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster import project
from gpucluster.cli import app

REPO = Path(__file__).resolve().parent.parent
DEV_STACK = REPO / "stacks" / "Pulumi.dev.yaml"

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_stacks_override() -> Iterator[None]:
    """`--stacks-dir` is process-wide state: never let one test's leak into the next."""
    project.use_stacks_dir(None)
    yield
    project.use_stacks_dir(None)


def make_project(root: Path, stack_config_dir: str | None = "envs") -> Path:
    """A Pulumi project at `root` with the dev stack in its stack directory; returns that directory."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["name: elsewhere", "runtime: python"]
    if stack_config_dir is not None:
        lines.append(f"stackConfigDir: {stack_config_dir}")
    (root / "Pulumi.yaml").write_text("\n".join(lines) + "\n")
    stacks = root / stack_config_dir if stack_config_dir else root
    stacks.mkdir(exist_ok=True)
    shutil.copy(DEV_STACK, stacks / "Pulumi.dev.yaml")
    return stacks


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output
    return lines[-1]


def test_plan_finds_the_stack_from_a_subdirectory_of_the_project(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(tmp_path / "proj", stack_config_dir="envs")
    deep = tmp_path / "proj" / "src" / "deep"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert project.find_project_root() == (tmp_path / "proj").resolve()
    assert project.stacks_dir() == (tmp_path / "proj").resolve() / "envs"
    result = runner.invoke(app, ["plan", "dev", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stack"] == "dev"


def test_stack_config_dir_unset_means_the_project_root(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(tmp_path, stack_config_dir=None)
    monkeypatch.chdir(tmp_path)
    assert project.stacks_dir() == tmp_path.resolve()
    assert runner.invoke(app, ["plan", "dev", "--json"]).exit_code == 0


def test_outside_a_project_stacks_come_from_dot_stacks(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stacks").mkdir()
    shutil.copy(DEV_STACK, tmp_path / "stacks" / "Pulumi.dev.yaml")
    monkeypatch.chdir(tmp_path)
    assert project.find_project_root() is None
    assert project.stacks_dir() == tmp_path / "stacks"


def test_stacks_dir_option_overrides_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(tmp_path / "proj")  # its envs/ has only dev
    monkeypatch.chdir(tmp_path / "proj")
    result = runner.invoke(app, ["--stacks-dir", str(REPO / "stacks"), "plan", "prod", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stack"] == "prod"
    # The next command without the option reads the project's stacks again.
    result = runner.invoke(app, ["plan", "prod"])
    assert result.exit_code == 2
    assert f"searched {(tmp_path / 'proj' / 'envs').resolve()}" in result.output


def test_stacks_dir_that_is_not_a_directory_exits_2_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = runner.invoke(app, ["--stacks-dir", str(missing), "plan", "dev"])
    assert result.exit_code == 2
    assert one_line(result.output) == f"--stacks-dir: {missing} is not a directory"


def test_missing_stack_names_the_directory_searched_why_and_the_stacks_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stacks = make_project(tmp_path / "proj")
    shutil.copy(DEV_STACK, stacks / "Pulumi.team-a.yaml")
    monkeypatch.chdir(tmp_path / "proj")
    result = runner.invoke(app, ["plan", "qa"])
    assert result.exit_code == 2
    assert one_line(result.output) == (
        f"{stacks.resolve()}/Pulumi.qa.yaml: no such stack file; searched {stacks.resolve()} "
        f"(stack directory of {(tmp_path / 'proj').resolve()}/Pulumi.yaml); stacks there: dev, team-a")


def test_missing_stack_outside_any_project_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 2
    line = one_line(result.output)
    assert f"searched {tmp_path.resolve()} (no Pulumi.yaml in {tmp_path.resolve()} or above" in line
    assert line.endswith("stacks there: none")


def test_missing_stack_dir_of_the_project_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: python\nstackConfigDir: stacks\n")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 2
    assert f"searched {tmp_path.resolve()}/stacks" in result.output
    assert "which is not a directory (--stacks-dir DIR to choose another)" in result.output


def test_missing_stack_given_as_a_path_names_only_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert one_line(result.output) == f"{path}: no such stack file"


def test_policy_config_is_read_from_the_project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a subdirectory, plan applies the project's policies/config/<stack>.json (here: a stricter one)."""
    make_project(tmp_path)
    config = tmp_path / "policies" / "config"
    config.mkdir(parents=True)
    (config / "dev.json").write_text(json.dumps(
        {"environment-limits": {"environments": {"dev": {"max_gpus": 1}}}}))
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 1, result.output
    assert "over the dev limit of 1" in result.output
