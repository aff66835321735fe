"""`gpucluster plan`: the real program under the mock engine, as a user runs it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
from typer.testing import CliRunner

from base_config import policy_clean
from gpucluster.cli import app
from gpucluster.plan import run_plan, run_program, stack_file, stack_name
from gpucluster.preflight import parse_stack_config
from gpucluster.project import stack_names
from shipped import shipped_plan

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_plan_shipped_stacks_exit_0(stack: str, cli_plans_once: None) -> None:
    """At a glance, in 100 columns: one line per node group; what it costs; which policies it breaks;
    the resource kinds only with --tree."""
    from gpucluster.project import load_stack

    result = runner.invoke(app, ["plan", stack])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    groups = [g.name for g in load_stack(stack)[2].node_groups]
    assert lines[0].startswith(f"stack {stack} (") and f"): {len(groups)} node group(s), " in lines[0]
    assert lines[1].split() == ["node", "group", "type", "x", "desired/max", "GPUs", "zone", "EFA",
                                "purchase", "$/h"]
    assert [line.split()[0] for line in lines[2:2 + len(groups)]] == groups
    assert lines[2 + len(groups)].startswith("cost: ")
    assert "resources by kind:" not in result.output
    headings = [i for i, line in enumerate(lines) if line.startswith(("cost: ", "policies: "))]
    assert [lines[i].split(":")[0] for i in headings] == ["cost", "policies"]
    assert lines[headings[1]] == "policies: no violations"
    assert max(len(line) for line in lines) <= 100
    assert len(lines) < 40 and "gpucluster.GpuCluster" not in result.output, "the tree only with --tree"
    tree = runner.invoke(app, ["plan", stack, "-v"])
    assert tree.exit_code == 0 and tree.output.startswith(result.output.rsplit("(--tree", 1)[0])
    assert "\nresources by kind:\n" in tree.output
    assert f"  gpucluster.GpuCluster  gpu-{stack}" in tree.output.splitlines()
    assert max(len(line) for line in tree.output.splitlines()) <= 100


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_plan_json_has_the_contract_keys(stack: str, cli_plans_once: None) -> None:
    result = runner.invoke(app, ["plan", stack, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["stack"] == stack
    assert {"stack", "resources", "outputs"} <= set(doc)
    assert doc["resources"], "a plan lists at least the cluster component"
    for resource in doc["resources"]:
        assert {"type", "name", "parent", "inputs"} <= set(resource)
    cluster = next(r for r in doc["resources"] if r["type"] == "gpucluster:index:GpuCluster")
    assert cluster["parent"].endswith("pulumi:pulumi:Stack::gpucluster-" + stack)


def test_plan_outputs_come_from_the_program() -> None:
    plan = shipped_plan("prod")
    assert plan.outputs["cluster_name"] == "gpu-prod"
    assert plan.outputs["node_groups"]["h100-train"]["efa"] is True


def test_plan_accepts_a_path(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> None:
    path = write_stack(policy_clean(base_config), name="mine")
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stack"] == "mine"


def test_plan_of_a_missing_stack_exits_2_listing_stacks() -> None:
    result = runner.invoke(app, ["plan", "no-such-stack"])
    assert result.exit_code == 2
    assert "no such stack file" in result.output
    assert f"stacks there: {', '.join(stack_names(REPO / 'stacks'))}" in result.output


def test_plan_of_broken_yaml_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config: [unclosed")
    result = runner.invoke(app, ["plan", str(bad)])
    assert result.exit_code == 2 and "not valid YAML" in result.output


def test_stack_file_names() -> None:
    assert stack_file("dev").name == "Pulumi.dev.yaml"
    assert stack_name(Path("x/Pulumi.team-a.yaml")) == "team-a"
    assert stack_file("x/mine.yaml") == Path("x/mine.yaml")


def test_program_rejects_bad_config_with_run_error(base_config: dict[str, Any]) -> None:
    """Under `pulumi up` bad config is a RunError (message, no traceback) before any resource."""
    spec = parse_stack_config(base_config, stack="t")
    base_config["gpucluster:node_groups"][0]["max_nodes"] = 0
    with pytest.raises(pulumi.RunError, match=r"node_groups\[0\]\.max_nodes: must be 1..2000, got 0"):
        run_program("t", base_config, spec)


def test_plans_in_one_process_do_not_leak_into_each_other() -> None:
    first = run_plan("dev")
    second = run_plan("prod")
    assert {r.name for r in second.resources}.isdisjoint({"gpu-dev"})
    assert len(first.resources) == len(run_plan("dev").resources)


def test_plan_json_lists_each_resources_dependencies(cli_plans_once: None) -> None:
    """Users read creation order from `dependencies`: explicit depends_on and input references alike."""
    result = runner.invoke(app, ["plan", "prod", "--json"])
    assert result.exit_code == 0, result.output
    resources = json.loads(result.output)["resources"]
    asg = next(r for r in resources if r["name"] == "gpu-prod-h100-train-asg")
    # Through inputs: the launch template id and the placement group name.
    assert {"gpu-prod-h100-train-lt", "gpu-prod-network-h100-train-placement"} <= set(asg["dependencies"])
    assert all(urn.endswith(tuple(asg["dependencies"])) for urn in asg["dependency_urns"])
    # Explicit depends_on: the NAT gateway waits for the internet gateway it has no input from.
    nat = next(r for r in resources if r["type"] == "aws:ec2/natGateway:NatGateway")
    assert "gpu-prod-network-igw" in nat["dependencies"]
    assert "internetGatewayId" not in json.dumps(nat["inputs"]), "the order comes from depends_on alone"


def test_plan_depends_on_follows_the_chain() -> None:
    plan = shipped_plan("prod")
    asg = plan.of_type("aws:autoscaling/group:Group")[0]
    template = next(r for r in plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
                    if r.name == asg.name.removesuffix("-asg") + "-lt")
    subnet = next(r for r in plan.of_type("aws:ec2/subnet:Subnet") if r.name.endswith("us-east-1d"))
    vpc = plan.of_type("aws:ec2/vpc:Vpc")[0]
    assert plan.depends_on(asg, template) and plan.depends_on(asg, subnet)
    assert plan.depends_on(asg, vpc), "transitively, through the subnet"
    assert not plan.depends_on(template, asg)


def test_plan_json_gains_the_node_group_summary(cli_plans_once: None) -> None:
    """Issue 25: `plan --json` only gains fields: `node_groups`, the per-group line as values."""
    doc = json.loads(runner.invoke(app, ["plan", "prod", "--json"]).output)
    assert {"stack", "region", "resources", "outputs", "warnings", "cost", "violations", "notes"} < set(doc)
    train = next(g for g in doc["node_groups"] if g["name"] == "h100-train")
    assert train == {
        "name": "h100-train", "instance_types": ["p5.48xlarge"], "desired_nodes": 8, "max_nodes": 16,
        "gpus_per_node": 8, "gpus_desired": 64, "gpus_max": 128, "availability_zones": ["us-east-1d"],
        "efa": True, "purchase": {"base": 4, "on_demand": 4, "spot": 0, "capacity_block": False},
        "usd_per_hour": train["usd_per_hour"]}
    priced = next(g for g in doc["cost"]["node_groups"] if g["name"] == "h100-train")
    assert train["usd_per_hour"] == pytest.approx(priced["desired"]["usd_per_hour"]["mix"])


def test_a_warning_is_never_cut() -> None:
    """A warning is our advice about a valid spec, ending in what to do: kept whole (JSON too), while
    an error, which may echo hostile input, stays within MAX_LINE_CHARS."""
    from gpucluster.spec import MAX_LINE_CHARS
    from gpucluster.spec.findings import Finding

    advice = "x " * 200 + "pin it (README: Datasets)"
    assert Finding("datasets[0]", advice, "warning").message == advice
    assert len(str(Finding("datasets[0]", advice))) <= MAX_LINE_CHARS
    assert Finding("p", "a\nb", "warning").message == "a\\nb"  # still one printable line
