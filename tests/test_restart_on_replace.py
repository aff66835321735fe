"""`run --detach --restart-on-replace`: the record `run` stores, and the rule and role that act on it.

The Lambda's behaviour is in tests/lambdas/test_job_restart.py; here the wiring in the prod plan
(evaluated as IAM would, tests/iam_eval.py) and the CLI's calls (botocore's Stubber).
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from typer.testing import CliRunner

from cli_text import said
from gpucluster.cli import app, common
from gpucluster.fleet.jobnames import LAUNCH_SUCCESSFUL, job_parameter_name, jobs_parameter_path
from gpucluster.plan import Plan
from iam_eval import allowed
from shipped import shipped_plan
from test_jobs import PROD, _invocation, _online, _sends, aws  # noqa: F401  (fixture)

runner = CliRunner()
ACCOUNT = "123456789012"
FUNCTION = "aws:lambda/function:Function"


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


def restart_policy(plan: Plan) -> dict[str, Any]:
    [policy] = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy")
                if r.name.endswith("-guardrails-jobs-handler-policy")]
    return json.loads(policy.inputs["policy"])


def test_the_launch_rule_watches_only_the_stack_s_groups(prod: Plan) -> None:
    [rule] = [r for r in prod.of_type("aws:cloudwatch/eventRule:EventRule")
              if r.inputs["name"] == "gpu-prod-job-restart"]
    pattern = json.loads(rule.inputs["eventPattern"])
    asgs = [prod.outputs["node_groups"][g.name]["asg_name"] for g in prod.spec.node_groups]  # spec order
    assert pattern == {"source": ["aws.autoscaling"], "detail-type": [LAUNCH_SUCCESSFUL],
                       "detail": {"AutoScalingGroupName": asgs}}
    assert all(a.startswith("gpu-prod-") for a in asgs)
    assert len(asgs) == 2  # h100-train and eval
    [fn] = [r for r in prod.of_type(FUNCTION) if r.inputs["name"] == "gpu-prod-job-restart"]
    assert fn.inputs["handler"] == "lambdas.job_restart.handler"
    assert fn.inputs["environment"]["variables"]["RUN_LOG_GROUP"] == f"/gpucluster/{PROD}/run"
    assert fn.inputs["environment"]["variables"]["GPUCLUSTER_STACK"] == PROD
    [config] = [r for r in prod.of_type("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
                if r.inputs["functionName"] == "gpu-prod-job-restart"]
    assert (config.inputs["maximumEventAgeInSeconds"], config.inputs["maximumRetryAttempts"]) == (3600, 2)


def test_the_restart_role_touches_only_its_stack_s_records_logs_and_nodes(prod: Plan) -> None:
    document = restart_policy(prod)

    def can(action: str, resource: str = "*", **context: str) -> bool:
        return allowed([document], None, action, resource, **context)

    parameter = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter"
    path = jobs_parameter_path(PROD)
    assert can("ssm:GetParametersByPath", parameter + path)
    assert can("ssm:PutParameter", parameter + job_parameter_name(PROD, "pretrain"))
    for other in ("/gpucluster/organization/gpucluster/dev/gpu-dev/jobs/x", "/db-password", path + "-x/y"):
        assert not can("ssm:PutParameter", parameter + other), other
        assert not can("ssm:GetParametersByPath", parameter + other), other
    for action in ("ssm:DeleteParameter", "ssm:GetParameter", "ssm:GetParameters"):
        assert not can(action, parameter + job_parameter_name(PROD, "pretrain")), action
    group = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/gpucluster/{PROD}/run"
    assert can("logs:FilterLogEvents", group) and can("logs:FilterLogEvents", group + ":*")
    assert not can("logs:FilterLogEvents", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/x")
    instance = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-1"
    assert can("ssm:SendCommand", instance, **{"ssm:resourceTag/gpucluster:stack": PROD})
    assert not can("ssm:SendCommand", instance, **{"ssm:resourceTag/gpucluster:stack": "another"})
    assert not can("ssm:SendCommand", f"arn:aws:ssm:us-east-1:{ACCOUNT}:document/Evil")
    for action in ("autoscaling:UpdateAutoScalingGroup", "autoscaling:CreateOrUpdateTags",
                   "ec2:TerminateInstances"):
        assert not can(action), action


def test_every_stack_gets_the_handler_and_names_know_it() -> None:
    from gpucluster.names import expected_names

    for stack in ("dev", "staging"):
        plan = shipped_plan(stack)
        names = {e.physical.name for e in expected_names(plan.spec)}
        assert f"{plan.spec.cluster.name}-job-restart" in names
        functions = {r.inputs.get("name") for r in plan.of_type(FUNCTION)}
        assert f"{plan.spec.cluster.name}-job-restart" in functions


# --------------------------------------------------------------------------------------- CLI


def test_run_restart_on_replace_stores_the_record_after_the_start(aws: dict[str, Any],  # noqa: F811
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    _sends(stub, 3, checked=True)
    for n in range(3):
        stub.add_response("get_command_invocation", _invocation("Success", 0, "started job pretrain\n"),
                          {"CommandId": f"{n:036d}", "InstanceId": ANY})
    name = job_parameter_name(PROD, "pretrain")
    stub.add_response("put_parameter", {"Version": 1},
                      {"Name": name, "Value": ANY, "Type": "String", "Overwrite": True, "Description": ANY})
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: ssm if service == "ssm" else real(spec, service))
    sent: list[dict[str, Any]] = []
    ssm.meta.events.register("provide-client-params.ssm.PutParameter",
                             lambda params, **_: sent.append(params))
    with stub:
        result = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                                     "--restart-on-replace", "--", "torchrun", "train.py"])
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert "restart-on-replace: when a replacement brings h100-train back to 3 node(s)" in result.output
    record = json.loads(sent[0]["Value"])
    assert (record["job"], record["command"], record["nnodes"], record["restarts"]) == (
        "pretrain", "torchrun train.py", 3, 0)
    assert record["asg"] and len(record["nodes"]) == 3 and record["gpus"] == {"p5.48xlarge": 8}
    assert record["environment"]["GPUCLUSTER_CHECKPOINT_URI"] == "/fsx/checkpoints/"
    assert record["environment"]["FI_PROVIDER"] == "efa" and record["master_port"] == 29500


def test_restart_on_replace_refusals_are_one_line(aws: dict[str, Any],  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    bad = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--restart-on-replace", "--", "true"])
    assert (bad.exit_code, bad.output) == (
        2, "run: --restart-on-replace restarts detached jobs: add --detach\n")
    long = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--restart-on-replace", "--",
                               "echo", "x" * 5000])
    assert long.exit_code == 2 and len(long.output.splitlines()) == 1
    assert "SSM's Standard parameters hold 4096" in long.output
    dry = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "p", "--dry-run",
                              "--restart-on-replace", "--", "true"])
    assert dry.exit_code == 0
    lines = dry.output.splitlines()
    at = lines.index(f"restart-on-replace: would record {job_parameter_name(PROD, 'p')}:")
    assert lines[-1] == "dry run: nothing sent"
    assert json.loads("\n".join(lines[at + 1:-1]))["nnodes"] == 3  # the record, indented JSON
    assert max(map(len, lines[at:])) <= 100


def test_a_detached_run_that_cannot_drop_an_old_record_warns_in_one_line(
        aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    _sends(stub, 3)
    for _ in range(3):
        stub.add_response("get_command_invocation", _invocation("Success", 0, "started\n"))
    stub.add_client_error("delete_parameter", "AccessDeniedException", expected_params={
        "Name": job_parameter_name(PROD, "pretrain")})
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: ssm if service == "ssm" else real(spec, service))
    with stub:
        result = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--detach", "--name", "pretrain",
                                     "--", "true"])
    assert result.exit_code == 0, result.output
    assert said(result.output)[-1] == (  # one message (wrapped to 100 columns), the last
        f"run: warning: could not remove an older restart record {job_parameter_name(PROD, 'pretrain')} "
        "(AccessDeniedException); `gpucluster cancel` removes it")


def test_cancel_removes_the_record_before_it_stops_the_job(aws: dict[str, Any],  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    stub.add_response("delete_parameter", {}, {"Name": job_parameter_name(PROD, "pretrain")})
    _sends(stub, 3)
    for _ in range(3):
        stub.add_response("get_command_invocation", _invocation("Success", 0, "cancelled job pretrain\n"))
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: ssm if service == "ssm" else real(spec, service))
    with stub:
        result = runner.invoke(app, ["cancel", "prod", "pretrain", "-g", "h100-train", "--yes"])
        stub.assert_no_pending_responses()  # the record went first, then the three stops
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "pretrain: restart-on-replace record removed"
