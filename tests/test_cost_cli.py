"""`gpucluster cost`, `recommend`, `doctor` and the cost in `plan`, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber
from typer.testing import CliRunner

from base_config import policy_clean
from cli_child import CliChild
from cli_text import joined_lines
from gpucluster.chart import chart_series, draw_chart
from gpucluster.cli import app
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import STRATEGIES, price_stack
from test_pricing import guard_api

REPO_ROOT = Path(__file__).resolve().parent.parent

runner = CliRunner()


def prod_cost() -> Any:
    return price_stack(load_stack("prod")[2])


# ------------------------------------------------------------------------ cost


def test_cost_prod_says_how_much_the_mix_saves() -> None:
    result = runner.invoke(app, ["cost", "prod"])
    assert result.exit_code == 0, result.output
    cost = prod_cost()
    saved = cost.usd_per_month("desired", "all_on_demand") - cost.usd_per_month("desired")
    assert (f"the stack's mix is 14.8 % below the same capacity all on-demand at desired nodes "
            f"(${saved:,.0f}/month less) and 9.6 % at max nodes") in " ".join(result.output.split())
    row = "  desired      8     4          4     0    154.11         220.16      0.00   374.27"  # no spot
    assert row in result.output
    eval_max = "  max          4     0          0     4      0.00           0.00     18.89    18.89"
    assert eval_max in result.output
    assert "FSx for Lustre pretrain-corpus         3,264.00" in result.output
    total = f"{cost.usd_per_month('desired'):,.2f}"
    # prod has no schedule: as scheduled is the 24 x 7 figure
    assert f"  stack's mix         379.58       {total}    {total}" in result.output
    assert "EC2 Spot Instance Advisor, typical savings of the family (2026-11-21)" in " ".join(
        result.output.split())


def test_cost_json_matches_the_model() -> None:
    result = runner.invoke(app, ["cost", "prod", "--json"])
    assert result.exit_code == 0, result.output
    doc, cost = json.loads(result.output), prod_cost()
    for at in ("desired", "max"):
        for strategy in STRATEGIES:
            assert doc["totals"][at][strategy]["usd_per_month"] == round(cost.usd_per_month(at, strategy), 2)
    assert doc["node_groups"][0]["max"] | {"usd_per_hour": None} == {
        "nodes": 16, "base": 4, "on_demand": 12, "spot": 0, "usd_per_hour": None}
    assert doc["node_groups"][1]["max"] | {"usd_per_hour": None} == {
        "nodes": 4, "base": 0, "on_demand": 0, "spot": 4, "usd_per_hour": None}
    assert doc["node_groups"][0]["rates"]["base"]["as_of"] == "2026-11-21"


def test_plan_json_carries_the_cost(cli_plans_once: None) -> None:
    result = runner.invoke(app, ["plan", "prod", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["cost"] == json.loads(json.dumps(prod_cost().as_json()))
    assert {"stack", "resources", "outputs", "cost"} <= set(doc)


def test_plan_prints_one_cost_line(cli_plans_once: None) -> None:
    result = runner.invoke(app, ["plan", "dev"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("cost:"))
    cost = price_stack(load_stack("dev")[2])
    assert lines[at:at + 3] == [
        f"cost: ${cost.usd_per_month('desired'):,.0f}/month at desired nodes, "
        f"${cost.usd_per_month('max'):,.0f} at max (55.3 % / 59.1 % below all on-demand)",
        "  as scheduled (239 h/month) $203 at desired nodes",
        "  `gpucluster cost dev` for the breakdown"]


def test_cost_dev_shows_the_scheduled_hours_next_to_24x7() -> None:
    result = runner.invoke(app, ["cost", "dev"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert ("hours a month: 730 24 x 7, 238.99 as scheduled (stop cron(0 19 ? * * *), start "
            "cron(0 8 ? * MON-FRI *), max lifetime 12 h in Europe/Berlin: 2,860 of the 8,736 "
            "hours") in " ".join(out.split())
    assert "total: 24 x 7 (730 h/month) and as scheduled (238.99 h/month)" in out
    # docs/guides/cost-and-spend.md's figure: 386.57 24 x 7 and 202.92 as scheduled at desired nodes
    # (flow logs, $3.95/month, and the spend guard's API calls, $1.23, run all month whatever the schedule)
    assert "  stack's mix           0.53           386.57        202.92" in out
    assert ("  Spend guard API calls                1.23         1.23  Cost Explorer <= 4 reads/day x $0.01"
            in out)
    assert "  NAT gateway public IPv4              3.65         3.65  1 Elastic IP x $0.005/h" in out
    assert "VPC interface endpoints             43.80        43.80  3 endpoints" in out


def eu_stack(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> Path:
    base_config["aws:region"] = "eu-west-1"
    base_config["gpucluster:network"]["availability_zones"] = ["eu-west-1a"]
    return write_stack(base_config, name="eu")


def test_region_without_prices(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> None:
    path = eu_stack(policy_clean(base_config), write_stack)
    result = runner.invoke(app, ["cost", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == ("cost: cannot price stack eu: no on-demand price for g5.xlarge in "
                                     "eu-west-1 (have: us-east-1, us-west-2): `gpucluster catalog prices "
                                     "--region eu-west-1` (AWS credentials) writes them to "
                                     "gpucluster-prices.yaml")
    plan = runner.invoke(app, ["plan", str(path), "--json"])
    assert plan.exit_code == 0
    assert json.loads(plan.output)["cost"] == {
        "error": "no on-demand price for g5.xlarge in eu-west-1 (have: us-east-1, us-west-2): `gpucluster "
                 "catalog prices --region eu-west-1` (AWS credentials) writes them to gpucluster-prices.yaml"}


@pytest.mark.parametrize(("args", "message"), [
    (["cost"], "cost: give a STACK (or --diff BASE.json HEAD.json)"),
    (["cost", "prod", "--dataset-gib", "-1"], "cost: --dataset-gib and --nat-gb must be >= 0"),
    (["recommend", "--mode", "train"],
     "recommend: --model or --params is required (e.g. --model llama-3.1-8b or --params 70b)"),
    (["recommend", "--params", "7"],
     "recommend: --mode is required (train, finetune, lora, qlora or inference)"),
    (["recommend", "--params", "7", "--mode", "train", "--precision", "int4"],
     "recommend: --precision: train takes bf16, fp16, fp32, got 'int4'"),
    (["recommend", "--params", "7", "--mode", "inference", "--region", "eu-west-1"],
     "recommend: --region: no prices for eu-west-1 (the catalog carries us-east-1, us-west-2): "
     "`gpucluster catalog prices --region eu-west-1` (AWS credentials) writes them to "
     "gpucluster-prices.yaml"),
    (["recommend", "--model", "llama-3.1-8b", "--mode", "train", "--zone", "us-west-2a"],
     "recommend: --zone: 'us-west-2a' is not a zone of region 'us-east-1' (--region)"),
    (["recommend", "--model", "llama-3.1-8b", "--mode", "train", "--mfu", "0"],
     "recommend: --mfu: must be a fraction of the peak in (0, 1], e.g. 0.4, got 0"),
])
def test_bad_arguments_one_line_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.output.strip() == message


def test_invalid_stack_exits_2(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> None:
    base_config["gpucluster:node_groups"][0]["max_nodes"] = 0
    result = runner.invoke(app, ["cost", str(write_stack(base_config))])
    assert result.exit_code == 2
    assert "node_groups[0].max_nodes: must be 1..2000, got 0" in result.output


def test_cost_diff_prints_markdown(tmp_path: Path, base_config: dict[str, Any],
                                   write_stack: Callable[..., Path], cli_plans_once: None) -> None:
    base_json, head_json = tmp_path / "base.json", tmp_path / "head.json"
    base_json.write_text(runner.invoke(app, ["plan", "prod", "--json"]).output)
    config = load_stack("prod")[1]
    config["gpucluster:node_groups"][0]["desired_nodes"] = 6
    head = runner.invoke(app, ["cost", str(write_stack(config, name="prod")), "--json"])
    head_json.write_text(head.output)
    result = runner.invoke(app, ["cost", "--diff", str(base_json), str(head_json)])
    assert result.exit_code == 0, result.output
    # 2 fewer on-demand nodes at desired: 2 x 55.04 x 730 + 2 root volumes 500 GiB x 0.08
    # ... and the spend guard's instance ledger, 2 entries shorter (test_pricing.guard_api)
    delta = 2 * 55.04 * 730 + 2 * 500 * 0.08 + guard_api(8) - guard_api(6)
    assert f"**-${delta:,.2f}" in result.output
    assert result.output.splitlines()[0] == "### gpucluster cost: prod"
    max_total = f"${prod_cost().usd_per_month('max'):,.2f}"
    row = f"| **total at max nodes, as scheduled** | {max_total} | {max_total} | **no change** |"
    assert row in result.output
    assert "| node group h100-train, max |" not in result.output  # unchanged components are left out


def test_cost_diff_of_bad_files(tmp_path: Path) -> None:
    bad, plan_json = tmp_path / "bad.json", tmp_path / "plan.json"
    bad.write_text("{not json")
    plan_json.write_text(json.dumps({"stack": "x", "resources": []}))
    result = runner.invoke(app, ["cost", "--diff", str(bad), str(plan_json)])
    assert result.exit_code == 2 and result.output.startswith(f"cost --diff: {bad} is not JSON")
    result = runner.invoke(app, ["cost", "--diff", str(plan_json), str(plan_json)])
    assert result.exit_code == 2 and "not a cost document" in result.output
    result = runner.invoke(app, ["cost", "prod", "--diff", str(plan_json), str(plan_json)])
    assert result.output.strip() == "cost: give a STACK or --diff BASE.json HEAD.json, not both"


def test_chart_is_written(tmp_path: Path) -> None:
    out = tmp_path / "prod-cost.png"
    result = runner.invoke(app, ["cost", "prod", "--chart", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert f"chart: {out}" in result.output


def test_chart_bars_are_the_cost_model() -> None:
    cost = prod_cost()
    series = chart_series(cost)
    for at in ("desired", "max"):
        for strategy in STRATEGIES:
            bars = series[at][strategy]  # type: ignore[index]
            assert sum(v for _, v in bars) == pytest.approx(cost.usd_per_month(at, strategy))  # type: ignore[arg-type]
            assert [n for n, _ in bars] == ["node group h100-train", "node group eval",
                                            "EBS root volumes h100-train", "EBS root volumes eval",
                                            "Spend guard API calls",
                                            "NAT gateway", "NAT gateway public IPv4",
                                            "VPC interface endpoints", "FSx for Lustre pretrain-corpus",
                                            "S3 pretrain-corpus", "VPC flow logs"]


def test_chart_without_matplotlib_says_how_to_install(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = runner.invoke(app, ["cost", "prod", "--chart", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert result.output.strip() == "cost: --chart needs matplotlib: pip install -e '.[chart]'"


def test_draw_chart_returns_what_it_drew(tmp_path: Path) -> None:
    cost = price_stack(load_stack("dev")[2])
    assert draw_chart(cost, tmp_path / "dev.png") == chart_series(cost)


def test_cost_live_prices_spot_from_describe_spot_price_history(monkeypatch: pytest.MonkeyPatch) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [   # h100-train
        {"AvailabilityZone": "us-east-1d", "InstanceType": "p5.48xlarge", "SpotPrice": "21.50",
         "Timestamp": datetime(2026, 11, 21, 9, 30, tzinfo=UTC)}]})
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [   # eval
        {"AvailabilityZone": "us-east-1d", "InstanceType": "g6e.12xlarge", "SpotPrice": "3.25",
         "Timestamp": datetime(2026, 11, 21, 9, 30, tzinfo=UTC)}]})
    stub.activate()
    made: list[tuple[str, str]] = []

    def client(service: str, region_name: str) -> Any:
        made.append((service, region_name))
        return ec2

    monkeypatch.setattr("gpucluster.ops.doctor.make_client", client)
    result = runner.invoke(app, ["cost", "prod", "--live", "--json"])
    assert result.exit_code == 0, result.output
    assert made == [("ec2", "us-east-1")]
    train, evaluation = json.loads(result.output)["node_groups"]
    assert train["rates"]["spot"] == {
        "usd_per_hour": 21.5, "basis": "spot, live: mean of the latest price in us-east-1d",
        "source": "EC2 DescribeSpotPriceHistory (Linux/UNIX)", "as_of": "2026-11-21 09:30 UTC"}
    assert train["max"]["usd_per_hour"]["spot"] == 0  # on-demand only: a live spot price costs nothing
    assert evaluation["rates"]["spot"]["usd_per_hour"] == 3.25
    assert evaluation["max"]["usd_per_hour"]["spot"] == 4 * 3.25
    stub.assert_no_pending_responses()


def test_cost_live_without_aws_falls_back_to_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "not allowed")
    stub.activate()
    monkeypatch.setattr("gpucluster.ops.doctor.make_client", lambda service, region_name: ec2)
    result = runner.invoke(app, ["cost", "prod", "--live"])
    assert result.exit_code == 0
    assert "cost --live: no live spot prices" in result.output
    assert "on-demand less the typical 55 % spot discount of p5" in result.output


# ------------------------------------------------------------------- recommend


def test_recommend_prints_fits_and_a_pasteable_snippet(base_config: dict[str, Any]) -> None:
    result = runner.invoke(app, ["recommend", "--params", "70b", "--mode", "train"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # each fit's row, whole within 100 columns
    assert max(len(line) for line in lines) <= 100
    rows = [line.split() for line in lines if re.match(r"\s+\d+\s+[a-z0-9-]+\.", line)]
    assert rows[0][:3] == ["1", "p6-b200.48xlarge", "1"]
    assert "llama-3.1-70b train" in result.output
    assert "ranked by price per effective TFLOP-hour" in result.output
    per_tflop = [float(r[-1]) for r in rows]
    assert per_tflop == sorted(per_tflop)
    assert all(r[1] != "p5e.48xlarge" for r in rows)  # not offered in us-east-1
    snippet = result.output.split("stacks/Pulumi.<env>.yaml):\n\n", 1)[1]
    pasted = yaml.safe_load(snippet)   # indented for a stack file's `config:` block
    zones = pasted["gpucluster:node_groups"][0]["availability_zones"]
    base_config["gpucluster:network"]["availability_zones"] = zones
    spec = parse_stack_config({**base_config, **pasted}, stack="t")
    assert spec.node_groups[0].instance_types == ["p6-b200.48xlarge"] and zones == ["us-east-1c"]


def test_recommend_with_tokens_shows_hours_and_job_cost() -> None:
    result = runner.invoke(app, ["recommend", "--model", "llama-3.1-8b", "--mode", "finetune",
                                 "--tokens", "1b"])
    assert result.exit_code == 0, result.output
    assert "job: 1,000,000,000 tokens x 6 x 8.03B parameters = 4.82e+19 FLOPs at 40 % of" in result.output
    lines = result.output.splitlines()
    header = next(re.split(r"\s{2,}", line.strip()) for line in lines
                  if line.startswith("  #  instance type"))
    rows = {r.split()[1]: dict(zip(header, re.split(r"\s{2,}", r.strip()), strict=True))
            for r in lines if re.match(r"\s+\d+\s+[a-z]", r)}
    assert [rows["p5.48xlarge"][k] for k in ("hours", "job $")] == ["4.2", "232.76"]  # tests/test_sizing.py
    assert [rows["g6e.12xlarge"][k] for k in ("hours", "job $")] == ["23.1", "242.42"]
    assert max(len(line) for line in lines) <= 100, "recommend fits 100 columns"


def test_recommend_json() -> None:
    result = runner.invoke(app, ["recommend", "--params", "7", "--mode", "inference", "--json", "--top", "2"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["workload"]["model"] == "mistral-7b" and doc["workload"]["concurrency"] == 8
    # by cost per generated token: one A10G (600 GB/s for $1.006/h) beats one L40S (864 GB/s, $1.861/h)
    assert [f["instance_type"] for f in doc["fits"]] == ["g5.xlarge", "g5.2xlarge"]
    assert doc["memory_gib"]["kv_cache"] == 4.0   # 8 sequences x 4096 tokens x 0.5 GiB / 4096 tokens
    first = doc["fits"][0]
    assert first["usd_per_effective_tflop_hour"] == pytest.approx(1.006 / (70 * 0.4))  # still there
    assert first["usd_per_million_tokens"] == pytest.approx(
        first["usd_per_hour"] / (first["tokens_per_second"] * 3600) * 1e6)
    assert first["tensor_parallel"] == 1 and doc["decode_bandwidth_utilisation"] == 0.6
    assert doc["on_demand_pick"] == "g5.xlarge"
    assert doc["snippet"].startswith("# 1 x g5.xlarge (1 x A10G) for mistral-7b inference (bf16)")


def test_recommend_nothing_fits_exits_1() -> None:
    result = runner.invoke(app, ["recommend", "--params", "405", "--mode", "train", "--max-nodes", "4"])
    assert result.exit_code == 1
    assert "nothing offered in us-east-1 fits: raise --max-nodes" in result.output


# ---------------------------------------------------------------------- doctor


def run_doctor(child: CliChild, stack: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    """`gpucluster doctor STACK` as its own process would run it (`cli_child.py`)."""
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_MAX_ATTEMPTS": "1"}
    return child.run(["doctor", stack], env=env, cwd=REPO_ROOT, timeout=60)


def test_doctor_against_a_moto_server(cli_child: CliChild, moto_endpoint: str, base_config: dict[str, Any],
                                      write_stack: Callable[..., Path]) -> None:
    # prod names a permissions boundary and a break-glass role: before they exist, the boundary blocks
    missing = run_doctor(cli_child, "prod", moto_endpoint)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    rows = [" ".join(line.split()) for line in joined_lines(missing.stdout)[2:-1]]
    assert any(r.startswith("blocker boundary gpucluster-workload-boundary gpucluster:cluster.permissions_"
                            "boundary: arn:aws:iam::123456789012:policy/gpucluster-workload-boundary does "
                            "not exist") for r in rows), rows
    assert any(r.startswith("warning break-glass acme-break-glass gpucluster:cluster.break_glass_role: no "
                            "role acme-break-glass") for r in rows), rows
    assert max(len(line) for line in missing.stdout.splitlines()) <= 100
    iam = boto3.client("iam", endpoint_url=moto_endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    iam.create_policy(PolicyName="gpucluster-workload-boundary", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    iam.create_role(RoleName="acme-break-glass", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": "arn:aws:iam::123456789012:root"}}]}))

    prod = run_doctor(cli_child, "prod", moto_endpoint)
    assert prod.returncode == 0, prod.stdout + prod.stderr
    rows = [" ".join(line.split()) for line in joined_lines(prod.stdout)[2:-1]]
    assert "ok efa p5.48xlarge 32 EFA interfaces, 32 network cards, as the catalog says" in rows
    assert "ok offering h100-train us-east-1d p5.48xlarge offered" in rows
    assert "ok offering eval us-east-1d g6e.12xlarge offered" in rows
    # moto has no EC2 service quotas or cost allocation tags: reported as not checked, not a crash
    assert ("warning quota Running On-Demand P instances (L-417A185B) could not check (HTTP 500 with no AWS "
            "error code: not an AWS answer)") in rows
    assert any(r.startswith("ok identity organization/gpucluster/prod/gpu-prod no other Auto Scaling group")
               for r in rows)
    assert "ok boundary gpucluster-workload-boundary arn:aws:iam::123456789012:policy/" \
           "gpucluster-workload-boundary exists" in rows
    # each group's AMI read from the account (issue 34: which OS it boots, and that it is supported)
    assert sum(r.startswith("ok ami ") for r in rows) == 2, rows
    assert prod.stdout.splitlines()[-1] == "9 ok, 3 warning(s), 0 blocker(s)"

    # A type the shipped offerings do not place in the zone is refused offline, before AWS is asked
    # (doctor's own offering blocker, for an account whose zones differ, is in tests/test_doctor.py).
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    base_config["gpucluster:node_groups"][0]["instance_types"] = ["p4de.24xlarge"]
    refused = run_doctor(cli_child, str(write_stack(base_config, name="p4de")), moto_endpoint)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ("node_groups[0].instance_types[0]: p4de.24xlarge is not offered in us-east-1a; in us-east-1 "
            "it is offered in us-east-1b, us-east-1c") in refused.stderr


def test_a_budget_below_one_hour_of_burn_is_a_plan_warning(base_config: dict[str, Any],
                                                           write_stack: Callable[..., Path],
                                                           cli_plans_once: None) -> None:
    """Issue 35 item 5: said with the verdict and in --json's warnings, exit 0 (valid, against advice)."""
    policy_clean(base_config)
    base_config["gpucluster:node_groups"][0].update(instance_types=["g5.48xlarge"], desired_nodes=1,
                                                     max_nodes=1)  # 8 GPUs, spot: within dev's limits
    burn = price_stack(parse_stack_config(base_config, stack="t")).usd_per_hour("desired")
    assert burn > 4
    base_config["gpucluster:budget"]["monthly_limit_usd"] = int(burn / 2)
    stack = write_stack(base_config)
    text = runner.invoke(app, ["plan", str(stack)])
    assert text.exit_code == 0, text.output
    assert "warning: budget.monthly_limit_usd: $" in " ".join(text.output.split())
    assert "is below one hour of the stack's burn at desired nodes" in " ".join(text.output.split())
    doc = json.loads(runner.invoke(app, ["plan", str(stack), "--json"]).stdout)
    [hour] = [w for w in doc["warnings"] if w["path"] == "budget.monthly_limit_usd"]
    assert "below one hour" in hour["message"] and "raise budget.monthly_limit_usd" in hour["message"]


def test_no_shipped_stack_has_a_budget_below_one_hour_of_burn() -> None:
    for name in ("dev", "staging", "prod"):
        assert price_stack(load_stack(name)[2]).budget_below_an_hour() is None, name
