"""Whole stacks through the rules and through `gpucluster plan`: clean ones pass, broken ones exit 1."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from policy_stacks import broken_stack, good_stack
from typer.testing import CliRunner

from gpucluster.cli import app
from gpucluster.cli import common as cli
from gpucluster.plan import Plan, PlannedResource, run_program
from gpucluster.policy import settings
from gpucluster.policy.offline import check_plan, plan_records
from gpucluster.policy.records import Resource
from gpucluster.policy.rules import RULES, evaluate
from gpucluster.preflight import parse_stack_config
from shipped import shipped_plan

runner = CliRunner()
# pulumi_aws warns about its own deprecated resources when the s3 and lambda modules load
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def good() -> list[Resource]:
    return good_stack()


@pytest.fixture(scope="module")
def broken() -> list[Resource]:
    return broken_stack()


def test_the_intended_components_pass_every_rule(good: list[Resource]) -> None:
    assert evaluate(good) == []


def test_a_mistake_per_rule_triggers_every_rule(broken: list[Resource]) -> None:
    violations = evaluate(broken)
    assert {v.policy for v in violations} == {r.name for r in RULES}
    assert all(v.level == "mandatory" for v in violations)
    where = {(v.policy, v.resource_name) for v in violations}
    assert {("efa-wiring", "b-train"), ("required-cost-tags", "b-budget"), ("no-open-ingress", "b-ssh"),
            ("s3-tls-only", "b-data"), ("nonprod-autostop", None)} <= where


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_stacks_have_no_mandatory_violation(stack: str) -> None:
    assert [str(v) for v in check_plan(shipped_plan(stack)) if v.mandatory] == []


def test_plan_records_read_the_real_auto_scaling_group() -> None:
    records = plan_records(shipped_plan("prod"))
    asgs = {r.name: r for r in records if r.type == "aws:autoscaling/group:Group"}
    assert sorted(asgs) == ["gpu-prod-eval-asg", "gpu-prod-h100-train-asg"]
    asg = asgs["gpu-prod-h100-train-asg"]
    policy = asg.props["mixedInstancesPolicy"]
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == ["p5.48xlarge"]
    assert asg.props["maxSize"] == 16 and policy["instancesDistribution"]["onDemandBaseCapacity"] == 4


def test_plan_records_carry_the_mock_engine_ids() -> None:
    planned = PlannedResource(urn="urn:x", type="aws:s3/bucket:Bucket", name="data", parent=None,
                              custom=True, inputs={"bucket": "acme-data"})
    records = plan_records(Plan(stack="t", spec=shipped_plan("dev").spec, resources=[planned]))
    # S3 answers a bucket's name as its id and ARN; references by any of them resolve
    assert records[0].ids == ("acme-data", "arn:aws:s3:::acme-data", "data")


# -------------------------------------------------------------- gpucluster plan


def dev_with_on_demand_p5(config: dict[str, Any]) -> dict[str, Any]:
    config["gpucluster:node_groups"] = [{
        "name": "h100", "instance_types": ["p5.48xlarge"], "max_nodes": 2,
        "capacity": {"on_demand_base": 1, "spot_percent": 0}}]
    return config


@pytest.mark.usefixtures("cli_plans_once")
def test_plan_exits_1_on_a_dev_stack_with_on_demand_p5(base_config: dict[str, Any],
                                                      write_stack: Callable[..., Path]) -> None:
    path = write_stack(dev_with_on_demand_p5(base_config), name="dev-p5")
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 1, result.output
    # the test stack also has no budget and no auto-stop: two more mandatory stack violations
    lines = result.output.splitlines()
    assert "policies: 5 violation(s), 5 mandatory (the policy pack stops `pulumi up`)" in lines
    # each violation: level, policy and where on one line, the message under it
    under_asg = [lines[i + 1] for i, line in enumerate(lines)
                 if line == "  mandatory  environment-limits  autoscaling.Group test-h100-asg"]
    assert "      dev is spot-only, but onDemandBaseCapacity is 1" in under_asg
    heads = [line for line in lines if line.startswith("  mandatory  ")]
    assert {"  mandatory  environment-limits  stack", "  mandatory  gpu-budget-with-action  stack",
            "  mandatory  nonprod-autostop  stack"} <= set(heads)
    assert "      at maximum size the stack runs 16 GPUs" in result.output
    assert max(len(line) for line in lines) <= 100


@pytest.mark.usefixtures("cli_plans_once")
def test_plan_json_lists_violations_and_exits_1(base_config: dict[str, Any],
                                                write_stack: Callable[..., Path]) -> None:
    path = write_stack(dev_with_on_demand_p5(base_config), name="dev-p5")
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["stack"] == "dev-p5" and document["resources"]
    first = document["violations"][0]
    assert first == {"policy": "environment-limits", "level": "mandatory",
                     "resource_type": "aws:autoscaling/group:Group", "resource_name": "test-h100-asg",
                     # the mock engine's URNs name only the parent's type, not the whole chain
                     "urn": "urn:pulumi:dev-p5::gpucluster::gpucluster:index:GpuNodeGroup$"
                            "aws:autoscaling/group:Group::test-h100-asg",
                     "message": "p5.48xlarge is not allowed in dev (allowed: g4dn.*, g5.*, g6.*, g6e.*; "
                                "see the environment-limits policy config)"}


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
@pytest.mark.usefixtures("cli_plans_once")
def test_plan_json_of_shipped_stacks_has_no_violations(stack: str) -> None:
    result = runner.invoke(app, ["plan", stack, "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["violations"] == []


def test_plan_text_of_a_clean_stack_says_so(cli_plans_once: None) -> None:
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 0 and "policies: no violations" in result.output.splitlines()


@pytest.mark.usefixtures("cli_plans_once")
def test_advisory_config_turns_the_exit_code_to_0(base_config: dict[str, Any],
                                                  write_stack: Callable[..., Path], tmp_path: Path) -> None:
    path = write_stack(dev_with_on_demand_p5(base_config), name="dev-p5")
    config = tmp_path / "advisory.json"
    config.write_text(json.dumps({"environment-limits": "advisory", "gpu-budget-with-action": "advisory",
                                  "nonprod-autostop": "advisory"}))
    result = runner.invoke(app, ["plan", str(path), "--policy-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "policies: 5 violation(s), 0 mandatory" in result.output
    assert "  advisory   environment-limits" in result.output


@pytest.mark.usefixtures("cli_plans_once")
def test_config_limits_can_allow_what_defaults_forbid(
        base_config: dict[str, Any], write_stack: Callable[..., Path], tmp_path: Path) -> None:
    path = write_stack(dev_with_on_demand_p5(base_config), name="dev-p5")
    config = tmp_path / "big-dev.json"
    config.write_text(json.dumps({"environment-limits": {"environments": {
        "dev": {"allowed_instance_types": ["p5.*"], "max_gpus": 16, "spot_only": False}}},
        "gpu-budget-with-action": "disabled", "nonprod-autostop": "disabled"}))
    result = runner.invoke(app, ["plan", str(path), "--policy-config", str(config)])
    assert result.exit_code == 0 and "policies: no violations" in result.output


@pytest.mark.usefixtures("cli_plans_once")
def test_a_stacks_own_config_file_is_used(base_config: dict[str, Any], write_stack: Callable[..., Path],
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_stack(dev_with_on_demand_p5(base_config), name="dev-p5")
    (tmp_path / "dev-p5.json").write_text(json.dumps({"all": "disabled"}))
    monkeypatch.setattr(settings, "policy_config_dir", lambda: tmp_path)
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 0 and "policies: no violations" in result.output


def test_shipped_prod_config_narrows_prod(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:cluster"]["tags"]["environment"] = "prod"
    base_config["gpucluster:node_groups"][0]["instance_types"] = ["g5.xlarge"]
    spec = parse_stack_config(base_config, stack="prod")
    plan = run_program("prod", base_config, spec)  # policies/config/prod.json applies to stack prod
    messages = [v.message for v in check_plan(plan) if v.policy == "environment-limits"]
    assert messages == ["g5.xlarge is not allowed in prod (allowed: p5.*, p5e.*, p5en.*, p6-b200.*, "
                        "g6e.*; see the environment-limits policy config)"]


@pytest.mark.usefixtures("cli_plans_once")
def test_a_bad_policy_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"environment-limit": "mandatory",
                                  "efa-wiring": {"enforcementLevel": "blocking"}}))
    result = runner.invoke(app, ["plan", "dev", "--policy-config", str(config)])
    assert result.exit_code == 2
    assert f"{config}: environment-limit: unknown policy; did you mean 'environment-limits'?" in result.output
    assert ("efa-wiring.enforcementLevel: must be one of mandatory, advisory, remediate, disabled, "
            "got 'blocking'") in result.output


def test_plan_exits_1_on_the_broken_stack(broken: list[Resource], monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI path with every rule broken: the recorded broken stack stands in for a planned one."""
    dev = shipped_plan("dev")
    planned = [PlannedResource(urn=r.urn, type=r.type, name=r.name, parent=r.parent, custom=True,
                               inputs=dict(r.props), protect=r.protect, retain_on_delete=r.retain_on_delete)
               for r in broken]
    monkeypatch.setattr(cli, "run_plan", lambda stack: Plan(stack="dev", spec=dev.spec, resources=planned))
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 1
    for r in RULES:
        assert f"  mandatory  {r.name}  " in result.output, r.name
