"""`gpucluster init`: a new project that `gpucluster plan dev` plans at once; `--version`."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import gpucluster
from gpucluster import project, scaffold
from gpucluster.cli import app
from gpucluster.preflight import parse_stack_config

REPO = Path(__file__).resolve().parent.parent
VERSION = metadata.version("gpucluster")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_stacks_override() -> None:
    project.use_stacks_dir(None)


def test_init_writes_the_project_and_plan_dev_plans_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", "gpu-lab"])
    assert result.exit_code == 0, result.output
    target = tmp_path / "gpu-lab"
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == sorted(scaffold.TEMPLATES)
    assert result.output.rstrip().endswith("next: cd gpu-lab && gpucluster plan dev   "
                                           "(README.md has the steps to deploy)")

    pulumi_yaml = yaml.safe_load((target / "Pulumi.yaml").read_text())
    assert pulumi_yaml["name"] == "gpu-lab"
    assert pulumi_yaml["runtime"] == {"name": "python",
                                      "options": {"toolchain": "pip", "virtualenv": ".venv"}}
    assert pulumi_yaml["stackConfigDir"] == "stacks"
    assert (target / "requirements.txt").read_text().splitlines()[-1] == f"gpucluster=={VERSION}"
    assert "from gpucluster.program import run\n\nrun()\n" in (target / "__main__.py").read_text()
    assert (target / "policies" / "config" / "README.md").read_text().count("\n") == 1

    monkeypatch.chdir(target)
    planned = runner.invoke(app, ["plan", "dev", "--json"])
    assert planned.exit_code == 0, planned.output
    document = json.loads(planned.output)
    assert document["stack"] == "dev" and document["violations"] == []
    assert any(r["type"] == "aws:autoscaling/group:Group" for r in document["resources"])


def test_init_in_the_current_empty_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "My Lab!").mkdir()
    monkeypatch.chdir(tmp_path / "My Lab!")
    result = runner.invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    assert "next: gpucluster plan dev" in result.output
    assert yaml.safe_load(Path("Pulumi.yaml").read_text())["name"] == "My-Lab"


def test_init_refuses_a_non_empty_directory_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["init", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"init: {tmp_path} is not empty; give a new or empty directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_init_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    result = runner.invoke(app, ["init", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"init: {path} exists and is not a directory"


def test_template_dev_stack_is_the_repository_dev_stack_and_validates() -> None:
    text = scaffold.render("p", VERSION, "gpucluster")["stacks/Pulumi.dev.yaml"]
    assert text == (REPO / "stacks" / "Pulumi.dev.yaml").read_text(), "copy stacks/Pulumi.dev.yaml over it"
    spec = parse_stack_config(yaml.safe_load(text)["config"], stack="dev")
    assert spec.cluster.name == "gpu-dev" and [g.name for g in spec.node_groups] == ["dev-a10"]


def test_scaffold_policy_pack_is_the_repository_pack() -> None:
    """The new project's pack runs the same entry point with its own .venv, where gpucluster is."""
    files = scaffold.render("p", VERSION, "gpucluster")
    assert files["policies/__main__.py"] == (REPO / "policies" / "__main__.py").read_text()
    assert yaml.safe_load(files["policies/PulumiPolicy.yaml"]) == yaml.safe_load(
        (REPO / "policies" / "PulumiPolicy.yaml").read_text())


@pytest.mark.parametrize(("direct_url", "line"), [
    (None, "gpucluster==1.2.3"),
    ({"url": "file:///home/me/gpucluster", "dir_info": {"editable": True}}, "gpucluster==1.2.3"),
    ({"url": "https://github.com/acme/gpucluster", "vcs_info": {
        "vcs": "git", "requested_revision": "v1.2.3", "commit_id": "0123abc"}},
     "gpucluster @ git+https://github.com/acme/gpucluster@0123abc"),
    ({"url": "https://bot:s3cret@git.example.com/acme/gpucluster.git", "vcs_info": {
        "vcs": "git", "commit_id": "0123abc"}},
     "gpucluster @ git+https://git.example.com/acme/gpucluster.git@0123abc"),
])
def test_requirement_line_names_how_gpucluster_was_installed(direct_url: dict | None, line: str) -> None:
    assert scaffold.requirement_line("1.2.3", direct_url) == line


def test_version_comes_from_the_installed_metadata() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"gpucluster {VERSION}\n"
    assert gpucluster.__version__ == VERSION, "gpucluster.__version__ and pyproject's version differ"
