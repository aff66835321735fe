"""`gpucluster init`: a new project that `gpucluster plan dev` plans at once; `--version`."""

from __future__ import annotations

import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import gpucluster
from gpucluster import installed, project, scaffold
from gpucluster.cli import app
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import price_stack

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
    assert files == sorted([*scaffold.TEMPLATES, "policies/config/dev.json"])
    assert result.output.rstrip().endswith("next: cd gpu-lab && gpucluster plan dev   "
                                           "(README.md has the steps to deploy)")

    pulumi_yaml = yaml.safe_load((target / "Pulumi.yaml").read_text())
    assert pulumi_yaml["name"] == "gpu-lab"
    assert pulumi_yaml["runtime"] == {"name": "python",
                                      "options": {"toolchain": "pip", "virtualenv": ".venv"}}
    assert pulumi_yaml["stackConfigDir"] == "stacks"
    assert (target / "requirements.txt").read_text().splitlines()[-1] == scaffold.requirement_line(
        VERSION, installed.direct_url())
    assert "from gpucluster.program import run\n\nrun()\n" in (target / "__main__.py").read_text()
    stack = (target / "stacks" / "Pulumi.dev.yaml").read_text()
    assert "permissions_boundary" not in stack and "break_glass_role" not in stack
    assert json.loads((target / "policies" / "config" / "dev.json").read_text()) == {"environment-limits": {
        "enforcementLevel": "mandatory", "environments": {"dev": {
            "allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*"], "max_gpus": 8,
            "spot_only": True}}}}
    readme = (target / "README.md").read_text()
    commands = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [c.split("#")[0].strip() for c in commands] == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt",
        "gpucluster plan dev", "gpucluster cost dev", "pulumi stack init dev",
        "pulumi up -s dev --policy-pack policies --policy-pack-config policies/config/dev.json"]
    assert "bootstrap" not in readme

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
    """The repository's dev stack is the hardened one; the default differs only by the boundary lines."""
    hardened = scaffold.render("p", VERSION, "gpucluster", hardened=True)["stacks/Pulumi.dev.yaml"]
    plain = scaffold.render("p", VERSION, "gpucluster")["stacks/Pulumi.dev.yaml"]
    repo_stack = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
    assert yaml.safe_load(hardened) == yaml.safe_load(repo_stack), "copy stacks/Pulumi.dev.yaml over it"
    assert plain == hardened.replace(scaffold.HARDENED_CLUSTER, "")
    spec = parse_stack_config(yaml.safe_load(plain)["config"], stack="dev")
    assert spec.cluster.name == "gpu-dev" and [g.name for g in spec.node_groups] == ["dev-a10"]
    assert spec.cluster.permissions_boundary is None and spec.cluster.break_glass_role is None
    spec = parse_stack_config(yaml.safe_load(hardened)["config"], stack="dev")
    assert (spec.cluster.permissions_boundary, spec.cluster.break_glass_role) == (
        "gpucluster-workload-boundary", "acme-break-glass")


def test_init_hardened_ships_the_bootstrap_script_and_says_what_to_run_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", "lab", "--hardened"])
    assert result.exit_code == 0, result.output
    assert "an administrator runs infra/bootstrap_state.py once per account" in result.output
    target = tmp_path / "lab"
    script = target / "infra" / "bootstrap_state.py"
    assert script.read_text() == (REPO / "infra" / "bootstrap-state" / "bootstrap_state.py").read_text(), (
        "scaffold/templates/bootstrap_state.py.tmpl must stay a link to the infra script")
    assert "permissions_boundary: gpucluster-workload-boundary" in (
        target / "stacks" / "Pulumi.dev.yaml").read_text()
    readme = (target / "README.md").read_text()
    assert readme.index("python infra/bootstrap_state.py") < readme.index("gpucluster plan dev")
    assert "--break-glass-role acme-break-glass" in readme
    other = runner.invoke(app, ["init", str(tmp_path / "other"), "--hardened", "--json"])
    document = json.loads(other.stdout)
    assert document["hardened"] is True and "infra/bootstrap_state.py" in document["created"]


def test_scaffold_policy_pack_is_the_repository_pack() -> None:
    """The new project's pack runs the same entry point with its own .venv, where gpucluster is."""
    files = scaffold.render("p", VERSION, "gpucluster")
    assert files["policies/__main__.py"] == (REPO / "policies" / "__main__.py").read_text()
    assert yaml.safe_load(files["policies/PulumiPolicy.yaml"]) == yaml.safe_load(
        (REPO / "policies" / "PulumiPolicy.yaml").read_text())


@pytest.mark.parametrize(("direct_url", "line"), [
    (None, "gpucluster>=1.2.3,<2"),
    # a path on this machine is never named (issue 37): a directory no one else reaches and a wheel
    # file become the range a teammate installs from the package index
    ({"url": "file:///home/me/gpucluster", "dir_info": {"editable": True}}, "gpucluster>=1.2.3,<2"),
    ({"url": "file:///home/me/gpucluster", "dir_info": {}}, "gpucluster>=1.2.3,<2"),
    ({"url": "file:///tmp/dist/gpucluster-1.2.3-py3-none-any.whl", "archive_info": {"hashes": {}}},
     "gpucluster>=1.2.3,<2"),
    ({"url": "https://user:pw@files.example.com/gpucluster-1.2.3.tar.gz", "archive_info": {}},
     "gpucluster @ https://files.example.com/gpucluster-1.2.3.tar.gz"),
    ({"url": "https://github.com/acme/gpucluster", "vcs_info": {
        "vcs": "git", "requested_revision": "v1.2.3", "commit_id": "0123abc"}},
     "gpucluster @ git+https://github.com/acme/gpucluster@0123abc"),
    ({"url": "https://bot:s3cret@git.example.com/acme/gpucluster.git", "vcs_info": {
        "vcs": "git", "commit_id": "0123abc"}},
     "gpucluster @ git+https://git.example.com/acme/gpucluster.git@0123abc"),
])
def test_requirement_line_names_how_gpucluster_was_installed(direct_url: dict | None, line: str) -> None:
    assert scaffold.requirement_line("1.2.3", direct_url, checkout=lambda path: None) == line


def test_a_checkout_is_named_by_its_origin_at_the_commit_checked_out(tmp_path: Path) -> None:
    """gpucluster installed from a git checkout (editable or not): the project names the checkout's
    own source, its `origin` at HEAD, credentials removed; scp-style remotes become ssh:// URLs."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True, env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                              "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout
    direct_url = {"url": tmp_path.as_uri(), "dir_info": {"editable": True}}
    assert scaffold.local_checkout(str(tmp_path)) is None  # not a checkout
    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "one")
    head = git("rev-parse", "HEAD").strip()
    assert scaffold.local_checkout(str(tmp_path)) is None  # no remote: nobody else can fetch it
    git("remote", "add", "origin", "https://bot:s3cret@git.example.com/acme/gpucluster.git")
    line = scaffold.requirement_line("1.2.3", direct_url)
    assert line == f"gpucluster @ git+https://git.example.com/acme/gpucluster.git@{head}"
    assert "origin remote at the commit" in scaffold.requirement_note("1.2.3", direct_url, line)
    git("remote", "set-url", "origin", "git@github.com:acme/gpucluster.git")
    assert scaffold.requirement_line("1.2.3", direct_url) == (
        f"gpucluster @ git+ssh://git@github.com/acme/gpucluster.git@{head}")
    git("remote", "set-url", "origin", "/srv/git/gpucluster.git")  # a path on this machine
    assert scaffold.requirement_line("1.2.3", direct_url) == "gpucluster>=1.2.3,<2"


def test_the_note_says_where_a_local_install_came_from() -> None:
    wheel = {"url": "file:///tmp/dist/gpucluster-1.2.3-py3-none-any.whl", "archive_info": {}}
    note = scaffold.requirement_note("1.2.3", wheel, "gpucluster>=1.2.3,<2")
    assert note.startswith("# gpucluster 1.2.3 was installed here from a local file "
                           "(/tmp/dist/gpucluster-1.2.3")
    assert all(line.startswith("# ") for line in note.splitlines())
    assert scaffold.requirement_note("1.2.3", None, "gpucluster>=1.2.3,<2") == ""


@pytest.mark.parametrize(("version", "spec"), [
    ("1.2.3", ">=1.2.3,<2"), ("0.1.0", ">=0.1.0,<0.2"), ("0.4.2.post1", ">=0.4.2.post1,<0.5"),
    ("2.0.0rc1", ">=2.0.0rc1,<3"),
])
def test_a_published_version_becomes_a_compatible_range(version: str, spec: str) -> None:
    assert scaffold.version_range(version) == spec


def test_version_comes_from_the_installed_metadata() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"gpucluster {VERSION}\n"
    assert gpucluster.__version__ == VERSION, "gpucluster.__version__ and pyproject's version differ"


def test_init_scheduler_slurm_scaffolds_a_slurm_dev_stack_that_passes_preflight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.spec.scheduler import pcs_group_findings

    monkeypatch.chdir(tmp_path)
    needs = runner.invoke(app, ["init", "lab", "--scheduler", "slurm"])
    assert needs.exit_code == 2 and not (tmp_path / "lab").exists()
    assert needs.output.strip().startswith("init: --scheduler slurm needs --ami-id: an AMI with the AWS PCS")
    result = runner.invoke(app, ["init", "lab", "--scheduler", "slurm", "--ami-id", "ami-0123456789abcdef0"])
    assert result.exit_code == 0, result.output
    assert "runs Slurm on AWS PCS" in result.output and "ami-0123456789abcdef0" in result.output
    text = (tmp_path / "lab" / "stacks" / "Pulumi.dev.yaml").read_text()
    plain_text = scaffold.render("lab", VERSION, "gpucluster")["stacks/Pulumi.dev.yaml"]
    assert f"monthly_limit_usd: {scaffold.DEV_BUDGET_USD}\n" in plain_text
    assert text == plain_text.replace(
        f"monthly_limit_usd: {scaffold.DEV_BUDGET_USD}\n",
        f"monthly_limit_usd: {scaffold.SLURM_DEV_BUDGET_USD}           # with the PCS controller, "
        "accounting and login node\n") + scaffold.slurm_scheduler("ami-0123456789abcdef0")
    config = yaml.safe_load(text)["config"]
    assert config["gpucluster:scheduler"] == {"type": "slurm", "slurm_version": "25.05", "accounting": True,
                                              "ami_id": "ami-0123456789abcdef0"}
    spec = parse_stack_config(config, stack="dev")  # the spec's checks and preflight: no finding
    assert spec.scheduler.slurm and spec.scheduler.accounting
    # within its budget at max nodes with the PCS fees (the launcher's $700 would warn before any job)
    assert price_stack(spec).warnings == []
    assert [list(pcs_group_findings(g, "g")) for g in spec.node_groups] == [[]]  # groups PCS can launch
    readme = (tmp_path / "lab" / "README.md").read_text()
    assert "## Jobs through Slurm" in readme and "gpucluster run dev --group dev-a10 --detach" in readme
    plain = runner.invoke(app, ["init", str(tmp_path / "plain"), "--json"])
    assert json.loads(plain.stdout)["scheduler"] == "none"
    assert "gpucluster:scheduler" not in (tmp_path / "plain" / "stacks" / "Pulumi.dev.yaml").read_text()
    assert "Jobs through Slurm" not in (tmp_path / "plain" / "README.md").read_text()
    bad = runner.invoke(app, ["init", str(tmp_path / "bad"), "--scheduler", "pbs"])
    assert bad.exit_code == 2
    assert bad.output.strip() == "init: --scheduler: must be none, slurm or eks, got 'pbs'"
    assert not (tmp_path / "bad").exists()


def test_init_scheduler_eks_scaffolds_an_eks_dev_stack_that_plans_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.spec.scheduler import eks_group_findings

    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", "lab", "--scheduler", "eks"])
    assert result.exit_code == 0, result.output
    assert "runs Kubernetes on Amazon EKS" in result.output
    text = (tmp_path / "lab" / "stacks" / "Pulumi.dev.yaml").read_text()
    plain_text = scaffold.render("lab", VERSION, "gpucluster")["stacks/Pulumi.dev.yaml"]
    assert text == plain_text.replace(
        f"monthly_limit_usd: {scaffold.DEV_BUDGET_USD}\n",
        f"monthly_limit_usd: {scaffold.EKS_DEV_BUDGET_USD}            # with the EKS control plane and "
        "system nodes\n") + scaffold.EKS_SCHEDULER
    config = yaml.safe_load(text)["config"]
    assert config["gpucluster:scheduler"] == {"type": "eks", "endpoint_public": False, "teams": ["ml"],
                                              "max_run_minutes": 720,
                                              "system_nodes": {"instance_type": "m7i.large", "count": 2}}
    spec = parse_stack_config(config, stack="dev")  # the spec's checks and preflight: no finding
    assert spec.scheduler.eks
    assert price_stack(spec).warnings == []  # within its budget with the control plane and system nodes
    assert [list(eks_group_findings(g, "g")) for g in spec.node_groups] == [[]]
    readme = (tmp_path / "lab" / "README.md").read_text()
    assert "## Jobs on Kubernetes" in readme and "kubeconfig_command" in readme
    assert "Jobs on Kubernetes" not in scaffold.render("lab", VERSION, "gpucluster")["README.md"]
    planned = runner.invoke(app, ["plan", str(tmp_path / "lab" / "stacks" / "Pulumi.dev.yaml"), "--json"])
    assert planned.exit_code == 0, planned.output  # no policy violation, no conformance finding
