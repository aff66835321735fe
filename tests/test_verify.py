"""`verify`: a deployed stack checked in a moto account that boto3 builds as `pulumi up` would.

moto has neither IAM's policy simulator nor Cost Explorer's ListCostAllocationTags: the simulator is
a small fake that answers SimulatePrincipalPolicy as the IAM API reference says (its request checked
against botocore's model) from the role's inline policies in moto, evaluated by tests/iam_eval.py;
Cost Explorer is botocore's Stubber. Every check has a pass, a fail and an unknown test; faults
(AccessDenied, throttling, a 5xx, a timeout) are injected on the call each check needs.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import socket
import subprocess
import threading
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber
from botocore.validate import validate_parameters
from moto import mock_aws
from typer.testing import CliRunner

from cli_child import CliChild
from gpucluster.cli.entry import app
from gpucluster.fleet.jobnames import jobs_parameter_path
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.names import expected_names
from gpucluster.node.bake import recipe_name
from gpucluster.node.bundle import bundle_key
from gpucluster.noderole import run_log_group_name
from gpucluster.ops import Clients
from gpucluster.ops.permissions import VERIFY_LAUNCH_ACTIONS, allowed_actions, operator_policy
from gpucluster.ops.slurmjobs import stack_instances
from gpucluster.ops.verify import (
    PlannedCheck,
    VerifyError,
    check_endpoints,
    check_remote_write,
    check_schedule,
    no_nat_endpoints,
    plan_checks,
    run_check,
    verify,
)
from gpucluster.ops.verifycheck import Deployed
from gpucluster.ops.verifyfeatures import (
    check_amp_samples,
    check_grafana,
    check_image_pipeline,
    check_pcs_accounting,
    check_pcs_cluster,
    check_pcs_node_groups,
    check_pcs_queues,
    check_slurm_job,
    job_script,
)
from gpucluster.ops.verifyiam import Account, guardrail_calls, handler_actions
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec, generated_bucket_prefix
from iam_eval import allowed

REGION, ACCOUNT = "us-east-1", "123456789012"
REPO_ROOT = Path(__file__).resolve().parent.parent
HERE = Account("aws", REGION, ACCOUNT, f"arn:aws:iam::{ACCOUNT}:user/operator")
FAULTS = {"AccessDenied": 403, "ThrottlingException": 400, "InternalFailure": 500}
# Services whose IAM action prefix or action name is not their API's (Service Authorization Reference).
OBSERVED = {
    "prometheus": {
        "enabled": True,
        "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32,
    }
}
IAM_NAMES = {"monitoring:": "cloudwatch:", "s3:ListBuckets": "s3:ListAllMyBuckets"}


def stack(config: dict[str, Any]) -> StackSpec:
    return parse_stack_config(config, stack="t")


# ------------------------------------------------------------------------- the fakes


class Simulator:
    """IAM whose SimulatePrincipalPolicy answers from the role's inline policies (moto lacks it)."""

    def __init__(self, iam: Any) -> None:
        self.iam, self.fault, self.requests = iam, None, []  # type: ignore[var-annotated]
        self.model = iam.meta.service_model.operation_model("SimulatePrincipalPolicy").input_shape

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iam, name)

    def simulate_principal_policy(self, **request: Any) -> dict[str, Any]:
        validate_parameters(request, self.model)
        self.requests.append(request)
        if self.fault is not None:
            raise self.fault
        role = request["PolicySourceArn"].rpartition("/")[2]
        documents = [
            self.iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
            for name in self.iam.list_role_policies(RoleName=role)["PolicyNames"]
        ]
        context = {
            e["ContextKeyName"]: (
                e["ContextKeyValues"] if e["ContextKeyType"].endswith("List") else e["ContextKeyValues"][0]
            )
            for e in request.get("ContextEntries", [])
        }
        return {
            "IsTruncated": False,
            "EvaluationResults": [
                {
                    "EvalActionName": action,
                    "EvalResourceName": resource,
                    "EvalDecision": "allowed"
                    if allowed(documents, None, action, resource, **context)
                    else "implicitDeny",
                }
                for action in request["ActionNames"]
                for resource in request["ResourceArns"]
            ],
        }


def client_error(code: str, operation: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": FAULTS.get(code, 400)},
        },
        operation,
    )


def inject(client: Any, operation: str, error: Exception) -> None:
    """Every call of `operation` (its API name) on `client` raises `error` (after botocore's retries)."""

    def fail(**_: Any) -> None:
        raise error

    client.meta.events.register(f"before-call.{client.meta.service_model.service_name}.{operation}", fail)


def cost_tags(status: str | None = "Active", error: str | None = None) -> Any:
    client = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(client)
    expected = {"TagKeys": ["gpucluster:stack"], "Type": "UserDefined"}
    if error:
        stub.add_client_error("list_cost_allocation_tags", error, "injected", FAULTS[error], expected)
    else:
        tags = [{"TagKey": "gpucluster:stack", "Type": "UserDefined", "Status": status}] if status else []
        stub.add_response("list_cost_allocation_tags", {"CostAllocationTags": tags}, expected)
    stub.activate()
    return client


# ------------------------------------------------------------------- a deployed account


def zipped() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("lambdas/job_restart.py", "def handler(event, context):\n    return None\n")
    return buffer.getvalue()


def guardrail_policy(
    identity: str, functions: list[str], topic: str, key: str, *, notify: bool = True
) -> str:
    """The statements aws/guardrail_lambda.py and guardrail_events.py give the job and spot handlers."""
    run_logs = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{run_log_group_name(identity)}"
    records = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{jobs_parameter_path(identity)}"
    statements: list[dict[str, Any]] = [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": [f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/{f}:*" for f in functions],
        },
        {
            "Effect": "Allow",
            "Resource": "*",
            "Action": [
                "autoscaling:DescribeAutoScalingGroups",
                "autoscaling:DescribeAutoScalingInstances",
                "ec2:DescribeInstances",
                "ssm:GetCommandInvocation",
            ],
        },
        {
            "Effect": "Allow",
            "Action": ["ssm:SendCommand"],
            "Resource": [f"arn:aws:ssm:{REGION}::document/AWS-RunShellScript"],
        },
        {
            "Effect": "Allow",
            "Action": ["ssm:SendCommand"],
            "Resource": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/*"],
            "Condition": {"StringEquals": {"ssm:resourceTag/gpucluster:stack": identity}},
        },
        {
            "Effect": "Allow",
            "Action": ["ssm:GetParametersByPath", "ssm:PutParameter"],
            "Resource": [records, f"{records}/*"],
        },
        {"Effect": "Allow", "Action": ["logs:FilterLogEvents"], "Resource": [run_logs, f"{run_logs}:*"]},
        {"Effect": "Allow", "Action": ["kms:GenerateDataKey*", "kms:Decrypt"], "Resource": [key]},
    ]
    if notify:
        statements.append(
            {"Sid": "Notify", "Effect": "Allow", "Action": ["sns:Publish"], "Resource": [topic]}
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def scripts_policy(bucket: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{bucket}/node-scripts/*"],
                    "Condition": {"StringEquals": {"s3:ResourceAccount": ACCOUNT}},
                }
            ],
        }
    )


_DEPLOYING: dict[tuple[str, str | None, frozenset[tuple[str, str]]], Any] = {}


def deploying(service: str, region: str | None = REGION) -> Any:
    """The client `deploy` makes its resources with: one per service, region and AWS_* environment a
    process (a client is a third of a deploy's CPU, 9 a test). Only `deploy` uses them, and it adds no
    handler or stub to them, so each test's account is made by the same calls as with fresh clients; moto's
    answers come from the backends of the `mock_aws` in force, whichever made the client."""
    key = (service, region, frozenset((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    if key not in _DEPLOYING:
        _DEPLOYING[key] = boto3.client(service, region_name=region)  # type: ignore[call-overload]
    return _DEPLOYING[key]


def deploy(spec: StackSpec) -> dict[str, Any]:
    """What `pulumi up` leaves of the base stack: the node group's template, group, role and bucket,
    the notify topic (encrypted, one confirmed subscription), the job and spot handlers with their
    rules and alarms. Returns what the tests change."""
    identity, c = spec.identity, spec.cluster.name
    tags = [{"Key": "gpucluster:stack", "Value": identity}, {"Key": "gpucluster:node-group", "Value": "gpu"}]
    ec2, iam = deploying("ec2"), deploying("iam", None)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone="us-east-1a")["Subnet"][
        "SubnetId"
    ]
    trust = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}}
            ],
        }
    )
    iam.create_role(RoleName="test-node-identity-role-1a2b3c4", AssumeRolePolicyDocument=trust)
    bucket = generated_bucket_prefix(c, "node-scripts") + "20261129000000000000000001"
    deploying("s3").create_bucket(Bucket=bucket)
    iam.put_role_policy(
        RoleName="test-node-identity-role-1a2b3c4",
        PolicyName="scripts",
        PolicyDocument=scripts_policy(bucket),
    )
    iam.create_instance_profile(InstanceProfileName="test-node-identity-profile-1a2b3c4")
    iam.add_role_to_instance_profile(
        InstanceProfileName="test-node-identity-profile-1a2b3c4", RoleName="test-node-identity-role-1a2b3c4"
    )
    template = ec2.create_launch_template(
        LaunchTemplateName="test-gpu-lt-1a2b3c4",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "IamInstanceProfile": {"Name": "test-node-identity-profile-1a2b3c4"},
        },
        TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
    )["LaunchTemplate"]
    deploying("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName="test-gpu-asg-1a2b3c4",
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=0,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Default"},
        VPCZoneIdentifier=subnet,
        Tags=[
            {
                "ResourceId": "test-gpu-asg-1a2b3c4",
                "ResourceType": "auto-scaling-group",
                "PropagateAtLaunch": True,
                **t,
            }
            for t in tags
        ],
    )
    key = deploying("kms").create_key()["KeyMetadata"]
    sns = deploying("sns")
    topic = sns.create_topic(Name=f"{c}-guardrails", Attributes={"KmsMasterKeyId": key["KeyId"]})["TopicArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"arn:aws:sqs:{REGION}:{ACCOUNT}:notices")
    functions = {"job_restart": f"{c}-job-restart", "spot_interruption": f"{c}-spot-interruption"}
    lam = deploying("lambda")
    trust_lambda = trust.replace("ec2.amazonaws.com", "lambda.amazonaws.com")
    for module, function in functions.items():
        role = iam.create_role(RoleName=f"{function}-role-1a2b3c4", AssumeRolePolicyDocument=trust_lambda)[
            "Role"
        ]
        iam.put_role_policy(
            RoleName=f"{function}-role-1a2b3c4",
            PolicyName="policy",
            PolicyDocument=guardrail_policy(identity, list(functions.values()), topic, key["Arn"]),
        )
        environment = {"GPUCLUSTER_STACK": identity, "NOTIFY_TOPIC_ARN": topic}
        if module == "job_restart":
            environment["RUN_LOG_GROUP"] = run_log_group_name(identity)
        lam.create_function(
            FunctionName=function,
            Role=role["Arn"],
            Runtime="python3.13",
            Handler=f"lambdas.{module}.handler",
            Code={"ZipFile": zipped()},
            Environment={"Variables": environment},
        )
    names = [(n.physical.type, n.physical.name) for n in expected_names(spec)]
    events = deploying("events")
    for type_, name in names:
        if type_ == "aws:cloudwatch/eventRule:EventRule":
            events.put_rule(Name=name, EventPattern=json.dumps({"source": ["aws.ec2"]}), State="ENABLED")
    cloudwatch = deploying("cloudwatch")
    alarms = [name for type_, name in names if type_ == "aws:cloudwatch/metricAlarm:MetricAlarm"]
    for name in alarms:
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            MetricName="Errors",
            Namespace="AWS/Lambda",
            Statistic="Sum",
            Period=60,
            EvaluationPeriods=1,
            Threshold=1,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            AlarmActions=[topic],
        )
    return {
        "topic": topic,
        "key": key["Arn"],
        "template": template["LaunchTemplateId"],
        "bucket": bucket,
        "functions": functions,
        "alarms": alarms,
        "subnet": subnet,
        "vpc": vpc,
    }


@pytest.fixture
def spec(base_config: dict[str, Any]) -> StackSpec:
    return stack(base_config)


@pytest.fixture
def account(spec: StackSpec, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        deployed = deploy(spec)
        simulator = Simulator(boto3.client("iam"))
        made: dict[str, Any] = {"iam": simulator, "ce": cost_tags()}
        deployed |= {"made": made, "simulator": simulator}
        yield deployed


def clients_of(account: dict[str, Any]) -> Clients:
    made = account["made"]

    def make(service: str) -> Any:
        if service not in made:
            made[service] = boto3.client(service, region_name=REGION)
        return made[service]

    return Clients(REGION, make=make)


def results(spec: StackSpec, account: dict[str, Any]) -> dict[str, Any]:
    return {c.id: c for c in verify(spec, clients_of(account)).checks}


# ------------------------------------------------------------------------------- plan


def test_the_plan_names_each_check_with_a_stable_id(base_config: dict[str, Any]) -> None:
    plain = [c.id for c in plan_checks(stack(base_config), Clients(REGION), HERE)]
    assert plain == [
        "guardrail-iam.job_restart",
        "guardrail-iam.spot_interruption",
        "launch-template.gpu",
        "scripts-bundle.gpu",
        "cost-tag",
        "notify-subscription",
        "rule.job-restart",
        "rule.spot-interruption",
        "alarms",
    ]
    base_config["gpucluster:budget"] = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}
    base_config["gpucluster:autostop"] = {"idle_minutes": 30, "stop_schedule": "cron(0 20 ? * MON-FRI *)"}
    base_config["gpucluster:network"]["nat_gateway"] = False
    base_config["gpucluster:observability"] = OBSERVED
    full = [c.id for c in plan_checks(stack(base_config), Clients(REGION), HERE)]
    assert {
        "guardrail-iam.budget_action",
        "guardrail-iam.spend_guard",
        "guardrail-iam.autostop",
        "schedule.spend-guard",
        "schedule.stop",
        "rule.idle",
        "endpoints",
        "amp-remote-write.gpu",
    } <= set(full)
    assert len(full) == len(set(full))


def test_without_nat_the_endpoints_are_network_py_s_and_amp_s(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["nat_gateway"] = False
    assert no_nat_endpoints(stack(base_config)) == [
        "ssm",
        "ssmmessages",
        "ec2messages",
        "monitoring",
        "ec2",
        "autoscaling",
        "sns",
    ]
    base_config["gpucluster:observability"] = OBSERVED
    assert no_nat_endpoints(stack(base_config))[-1] == "aps-workspaces"


def test_a_handler_is_asked_only_what_its_stack_deployed_it_to_do() -> None:
    bare = handler_actions("autostop", {}, starts_groups=False)
    assert not {
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "ec2:DescribeInstances",
        "autoscaling:DeleteTags",
    } & set(bare)
    full = handler_actions(
        "autostop", {"PRE_STOP_COMMAND": "sync", "MAX_LIFETIME_HOURS": "8"}, starts_groups=True
    )
    assert {"ssm:SendCommand", "ec2:DescribeInstances", "autoscaling:DeleteTags"} <= set(full)
    assert "ssm:SendCommand" not in handler_actions("spot_interruption", {}, starts_groups=False)
    slurm = handler_actions("budget_action", {"PCS_CLUSTER_ID": "pcs_1"}, starts_groups=False)
    assert "pcs:UpdateComputeNodeGroup" in slurm and not [a for a in slurm if a.startswith("autoscaling:")]
    assert "ssm:SendCommand" in handler_actions("job_restart", {}, starts_groups=False)


def test_on_a_slurm_stack_a_handler_is_asked_about_its_pcs_groups_and_login_node() -> None:
    """PCS_CLUSTER_ID in the environment: the stack's compute node groups (the login group's left out,
    no guardrail may change it) and Run Command on the login node only, no Auto Scaling call."""
    pcs = boto3.client("pcs", region_name=REGION)
    stub = Stubber(pcs)
    group = f"arn:aws:pcs:{REGION}:{ACCOUNT}:cluster/pcs_1/computenodegroup/"
    answer = {
        "computeNodeGroups": [
            {
                "name": n,
                "id": f"{n}_1",
                "arn": group + f"{n}_1",
                "clusterId": "pcs_1",
                "status": "ACTIVE",
                "createdAt": "2026-11-29T00:00:00Z",
                "modifiedAt": "2026-11-29T00:00:00Z",
            }
            for n in ("train", "login")
        ]
    }
    for _ in range(2):  # GetComputeNodeGroup and UpdateComputeNodeGroup
        stub.add_response("list_compute_node_groups", answer, {"clusterIdentifier": "pcs_1"})
    stub.activate()
    env = {"PCS_CLUSTER_ID": "pcs_1"}
    calls, caveats = guardrail_calls(
        "spend_guard",
        "t-spend-guard",
        env,
        HERE,
        "acme/t",
        {"pcs": pcs}.__getitem__,
        list,
        starts_groups=False,
    )
    assert caveats == [
        "the function has no GUARD_STATE_TABLE: the guard-state calls were not simulated",
        "the function has no NOTIFY_TOPIC_ARN: sns:Publish not simulated",
    ]
    on = {(action, resource) for action, resource, _ in calls}
    assert ("pcs:UpdateComputeNodeGroup", group + "train_1") in on
    assert not [r for a, r in on if r == group + "login_1" or a.startswith("autoscaling:")]
    login = [c for a, r, c in calls if a == "ssm:SendCommand" and ":instance/" in r]
    assert dict(login[0]) == {
        "ssm:resourceTag/gpucluster:stack": "acme/t",
        "ssm:resourceTag/gpucluster:node-group": "login",
    }


# ------------------------------------------------------------------------------- pass


def test_a_deployed_stack_passes_every_check(spec: StackSpec, account: dict[str, Any]) -> None:
    found = results(spec, account)
    assert {i: (c.result, c.detail) for i, c in found.items() if c.result != "pass"} == {}
    assert all(c.remedy is None for c in found.values())
    assert "EC2 would launch it" in found["launch-template.gpu"].detail
    assert bundle_key() in found["scripts-bundle.gpu"].detail
    # the simulator was asked about the stack's own resources with the keys the policies condition on
    asked = {(r["ResourceArns"][0], a) for r in account["simulator"].requests for a in r["ActionNames"]}
    assert (account["topic"], "sns:Publish") in asked and (account["key"], "kms:GenerateDataKey") in asked
    sends = [
        r
        for r in account["simulator"].requests
        if r["ResourceArns"][0].endswith(":instance/i-00000000000000000")
    ]
    assert sends and sends[0]["ContextEntries"] == [
        {
            "ContextKeyName": "ssm:resourceTag/gpucluster:stack",
            "ContextKeyValues": [spec.identity],
            "ContextKeyType": "string",
        }
    ]


def test_every_call_verify_makes_is_in_the_operator_policy(spec: StackSpec, account: dict[str, Any]) -> None:
    made: list[str] = []
    clients = clients_of(account)

    def record(model: Any, **_: Any) -> None:
        name = f"{model.service_model.endpoint_prefix}:{model.name}"
        for api, iam in IAM_NAMES.items():
            name = name.replace(api, iam)
        made.append(name)

    for service in ("sts", "lambda", "ec2", "autoscaling", "s3", "sns", "kms", "events", "cloudwatch"):
        clients(service).meta.events.register("before-call", record)
    verify(spec, clients)
    made += ["iam:SimulatePrincipalPolicy"] * bool(account["simulator"].requests)
    policy = allowed_actions(operator_policy(spec.identity))
    assert "ec2:RunInstances" in made and set(VERIFY_LAUNCH_ACTIONS) & policy == set()
    assert set(made) - policy == {
        "sts:GetCallerIdentity",
        "ec2:RunInstances",
    }  # needs no permission; see docs


# ------------------------------------------------------------------------------- fail


def test_a_guardrail_role_missing_a_call_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    role = "test-job-restart-role-1a2b3c4"
    boto3.client("iam").put_role_policy(
        RoleName=role,
        PolicyName="policy",
        PolicyDocument=guardrail_policy(
            spec.identity, list(account["functions"].values()), account["topic"], account["key"], notify=False
        ),
    )
    check = results(spec, account)["guardrail-iam.job_restart"]
    assert (
        check.result == "fail"
        and f"sns:Publish on {account['topic']} (no statement allows it)" in check.detail
    )
    assert "pulumi up" in str(check.remedy)
    assert results(spec, account)["guardrail-iam.spot_interruption"].result == "pass"


def test_a_guardrail_that_is_not_deployed_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    boto3.client("lambda", region_name=REGION).delete_function(FunctionName="test-spot-interruption")
    check = results(spec, account)["guardrail-iam.spot_interruption"]
    assert (check.result, check.detail) == (
        "fail",
        "no Lambda function test-spot-interruption: the guardrail is not deployed",
    )


def test_a_missing_launch_template_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    boto3.client("ec2", region_name=REGION).delete_launch_template(LaunchTemplateId=account["template"])
    found = results(spec, account)
    assert found["launch-template.gpu"].result == "fail" and found["launch-template.gpu"].remedy
    assert found["scripts-bundle.gpu"].result == "unknown"  # its role is found through the template


def test_a_launch_ec2_refuses_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    clients = clients_of(account)
    inject(clients("ec2"), "RunInstances", client_error("UnauthorizedOperation", "RunInstances"))
    check = {c.id: c for c in verify(spec, clients).checks}["launch-template.gpu"]
    assert check.result == "fail" and "decode-authorization-message" in str(check.remedy)


def test_a_template_with_network_interfaces_launches_in_the_group_s_subnet(
    spec: StackSpec, account: dict[str, Any]
) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    group = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=account["vpc"])["GroupId"]
    ec2.create_launch_template_version(
        LaunchTemplateId=account["template"],
        SourceVersion="1",
        LaunchTemplateData={
            "NetworkInterfaces": [
                {
                    "DeviceIndex": 0,
                    "NetworkCardIndex": 0,
                    "Groups": [group],
                    "InterfaceType": "efa",
                    "DeleteOnTermination": True,
                }
            ]
        },
    )
    ec2.modify_launch_template(LaunchTemplateId=account["template"], DefaultVersion="2")
    check = results(spec, account)["launch-template.gpu"]
    assert check.result == "pass" and account["subnet"] in check.detail


def test_a_template_without_its_group_cannot_be_tried(spec: StackSpec, account: dict[str, Any]) -> None:
    boto3.client("autoscaling", region_name=REGION).delete_auto_scaling_group(
        AutoScalingGroupName="test-gpu-asg-1a2b3c4", ForceDelete=True
    )
    check = results(spec, account)["launch-template.gpu"]
    assert check.result == "unknown" and "no Auto Scaling group of node group gpu" in check.detail


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("InvalidAMIID.NotFound", "fail"),
        ("InvalidParameterValue", "fail"),
        ("InvalidClientTokenId", "unknown"),
        ("InsufficientInstanceCapacity", "unknown"),
    ],
)
def test_what_ec2_says_of_a_template(
    spec: StackSpec, account: dict[str, Any], code: str, result: str
) -> None:
    clients = clients_of(account)
    inject(clients("ec2"), "RunInstances", client_error(code, "RunInstances"))
    assert {c.id: c for c in verify(spec, clients).checks}["launch-template.gpu"].result == result


def test_a_node_role_that_cannot_read_the_bundle_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    boto3.client("iam").delete_role_policy(RoleName="test-node-identity-role-1a2b3c4", PolicyName="scripts")
    check = results(spec, account)["scripts-bundle.gpu"]
    assert check.result == "fail" and f"s3://{account['bucket']}/{bundle_key()}" in check.detail


@pytest.mark.parametrize("status", ["Inactive", None])
def test_an_inactive_cost_tag_fails(spec: StackSpec, account: dict[str, Any], status: str | None) -> None:
    account["made"]["ce"] = cost_tags(status)
    check = results(spec, account)["cost-tag"]
    assert check.result == "fail" and "update-cost-allocation-tags-status" in str(check.remedy)


def test_a_topic_without_a_confirmed_subscription_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    sns = boto3.client("sns", region_name=REGION)
    stub = Stubber(sns)
    stub.add_response(
        "list_subscriptions_by_topic",
        {
            "Subscriptions": [
                {"SubscriptionArn": "PendingConfirmation", "Protocol": "email", "TopicArn": account["topic"]}
            ]
        },
        {"TopicArn": account["topic"]},
    )
    stub.activate()
    account["made"]["sns"] = sns
    check = results(spec, account)["notify-subscription"]
    assert check.result == "fail" and "none confirmed" in check.detail
    for subscription in boto3.client("sns", region_name=REGION).list_subscriptions()["Subscriptions"]:
        boto3.client("sns", region_name=REGION).unsubscribe(SubscriptionArn=subscription["SubscriptionArn"])
    account["made"].pop("sns")
    assert results(spec, account)["notify-subscription"].result == "fail"


def test_a_disabled_or_missing_rule_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    events = boto3.client("events", region_name=REGION)
    events.disable_rule(Name="test-job-restart")
    events.delete_rule(Name="test-spot-interruption")
    found = results(spec, account)
    assert (found["rule.job-restart"].result, found["rule.spot-interruption"].result) == (
        "fail",
        "fail",
    )
    assert "enable-rule" in str(found["rule.job-restart"].remedy)


def test_a_missing_or_silenced_alarm_fails(spec: StackSpec, account: dict[str, Any]) -> None:
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    gone, silenced = account["alarms"][:2]
    cloudwatch.delete_alarms(AlarmNames=[gone])
    cloudwatch.disable_alarm_actions(AlarmNames=[silenced])
    check = results(spec, account)["alarms"]
    assert (
        check.result == "fail"
        and f"missing: {gone}" in check.detail
        and f"disabled: {silenced}" in check.detail
    )


# ---------------------------------------------------- schedules, endpoints, AMP (their stacks)


def run_alone(account: dict[str, Any], spec: StackSpec, check: Callable[[Deployed], Any]) -> Any:
    deployed = Deployed(spec, clients_of(account), HERE)
    return run_check(PlannedCheck("x", "x", "x", lambda: check(deployed)))


def test_schedules(spec: StackSpec, account: dict[str, Any]) -> None:
    scheduler = boto3.client("scheduler", region_name=REGION)
    target = {
        "Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:test-spend-guard",
        "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/scheduler",
    }
    for name, state in (("test-spend-guard", "ENABLED"), ("test-stop", "DISABLED")):
        scheduler.create_schedule(
            Name=name,
            GroupName="default",
            ScheduleExpression="rate(5 minutes)",
            FlexibleTimeWindow={"Mode": "OFF"},
            Target=target,
            State=state,
        )
    assert run_alone(account, spec, lambda d: check_schedule(d, "test-spend-guard")).result == "pass"
    assert run_alone(account, spec, lambda d: check_schedule(d, "test-stop")).result == "fail"
    assert run_alone(account, spec, lambda d: check_schedule(d, "test-start")).result == "fail"
    inject(clients_of(account)("scheduler"), "GetSchedule", client_error("AccessDenied", "GetSchedule"))
    assert run_alone(account, spec, lambda d: check_schedule(d, "test-spend-guard")).result == "unknown"


def test_endpoints_without_nat(base_config: dict[str, Any], account: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["nat_gateway"] = False
    no_nat = stack(base_config)
    services = no_nat_endpoints(no_nat)
    ec2 = boto3.client("ec2", region_name=REGION)
    for service in services[:-1]:
        ec2.create_vpc_endpoint(
            VpcId=account["vpc"],
            ServiceName=f"com.amazonaws.{REGION}.{service}",
            VpcEndpointType="Interface",
            TagSpecifications=[
                {
                    "ResourceType": "vpc-endpoint",
                    "Tags": [{"Key": "gpucluster:stack", "Value": no_nat.identity}],
                }
            ],
        )
    check = run_alone(account, no_nat, lambda d: check_endpoints(d, services))
    assert check.result == "fail" and check.detail.startswith(f"missing: {services[-1]}")
    assert run_alone(account, no_nat, lambda d: check_endpoints(d, services[:-1])).result == "pass"
    inject(
        clients_of(account)("ec2"),
        "DescribeVpcEndpoints",
        client_error("InternalFailure", "DescribeVpcEndpoints"),
    )
    assert run_alone(account, no_nat, lambda d: check_endpoints(d, services)).result == "unknown"


def test_endpoints_whose_service_has_a_dot_are_found(base_config: dict[str, Any],
                                                     account: dict[str, Any]) -> None:
    """ecr.api and ecr.dkr (an EKS stack without NAT): the service is all that follows the region."""
    base_config["gpucluster:network"]["nat_gateway"] = False
    no_nat = stack(base_config)
    ec2 = boto3.client("ec2", region_name=REGION)
    ec2.create_vpc_endpoint(
        VpcId=account["vpc"], ServiceName=f"com.amazonaws.{REGION}.ecr.dkr", VpcEndpointType="Interface",
        TagSpecifications=[{"ResourceType": "vpc-endpoint",
                            "Tags": [{"Key": "gpucluster:stack", "Value": no_nat.identity}]}])
    check = run_alone(account, no_nat, lambda d: check_endpoints(d, ["ecr.api", "ecr.dkr"]))
    assert check.result == "fail" and check.detail.startswith("missing: ecr.api (")
    assert run_alone(account, no_nat, lambda d: check_endpoints(d, ["ecr.dkr"])).result == "pass"


def test_remote_write_to_amp(base_config: dict[str, Any], account: dict[str, Any]) -> None:
    base_config["gpucluster:observability"] = OBSERVED
    observed = stack(base_config)
    workspace = boto3.client("amp", region_name=REGION).create_workspace(
        alias="gpucluster-t", tags={"gpucluster:stack": observed.identity}
    )["arn"]
    iam = boto3.client("iam")
    assert run_alone(account, observed, lambda d: check_remote_write(d, "gpu")).result == "fail"
    iam.put_role_policy(
        RoleName="test-node-identity-role-1a2b3c4",
        PolicyName="metrics",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["aps:RemoteWrite"],
                        "Resource": [workspace],
                        "Condition": {
                            "StringEquals": {"aws:ResourceTag/gpucluster:stack": observed.identity}
                        },
                    }
                ],
            }
        ),
    )
    check = run_alone(account, observed, lambda d: check_remote_write(d, "gpu"))
    assert check.result == "pass" and workspace in check.detail
    account["simulator"].fault = client_error("ThrottlingException", "SimulatePrincipalPolicy")
    assert run_alone(account, observed, lambda d: check_remote_write(d, "gpu")).result == "unknown"


# ------------------------------------------------------------------------------ unknown

# (check id, the service and API call it needs): a fault there makes the check unknown, never pass.
NEEDS = [
    ("guardrail-iam.job_restart", "lambda", "GetFunctionConfiguration"),
    ("guardrail-iam.spot_interruption", "kms", "DescribeKey"),
    ("launch-template.gpu", "ec2", "DescribeLaunchTemplates"),
    ("launch-template.gpu", "ec2", "RunInstances"),
    ("scripts-bundle.gpu", "s3", "ListBuckets"),
    ("scripts-bundle.gpu", "iam", "GetInstanceProfile"),
    ("notify-subscription", "sns", "ListSubscriptionsByTopic"),
    ("rule.job-restart", "events", "DescribeRule"),
    ("alarms", "cloudwatch", "DescribeAlarms"),
    ("alarms", "autoscaling", "DescribeAutoScalingGroups"),
]


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize(("check_id", "service", "operation"), NEEDS)
def test_a_check_that_cannot_run_is_unknown(
    spec: StackSpec, account: dict[str, Any], check_id: str, service: str, operation: str, fault: str
) -> None:
    clients = clients_of(account)
    target = clients(service).iam if service == "iam" else clients(service)
    inject(target, operation, client_error(fault, operation))
    found = {c.id: c for c in verify(spec, clients).checks}
    assert found[check_id].result == "unknown", found[check_id]
    assert found[check_id].detail.startswith("could not check: ") and fault in found[check_id].detail
    assert found[check_id].remedy is None
    assert found["cost-tag"].result == "pass"  # the others still run


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_simulator_or_cost_explorer_failing_is_unknown(
    spec: StackSpec, account: dict[str, Any], fault: str
) -> None:
    account["simulator"].fault = client_error(fault, "SimulatePrincipalPolicy")
    account["made"]["ce"] = cost_tags(error=fault)
    found = results(spec, account)
    for check_id in (
        "guardrail-iam.job_restart",
        "guardrail-iam.spot_interruption",
        "scripts-bundle.gpu",
        "cost-tag",
    ):
        assert found[check_id].result == "unknown" and fault in found[check_id].detail, found[check_id]
    assert found["launch-template.gpu"].result == "pass"


def test_a_timeout_is_unknown(spec: StackSpec, account: dict[str, Any]) -> None:
    clients = clients_of(account)
    inject(
        clients("events"),
        "DescribeRule",
        ReadTimeoutError(endpoint_url="https://events.us-east-1.amazonaws.com"),
    )
    check = {c.id: c for c in verify(spec, clients).checks}["rule.job-restart"]
    assert check.result == "unknown" and "Read timeout" in check.detail


def test_aws_out_of_reach_is_an_error_not_a_checklist(spec: StackSpec, account: dict[str, Any]) -> None:
    clients = clients_of(account)
    inject(
        clients("sts"), "GetCallerIdentity", EndpointConnectionError(endpoint_url="https://sts.amazonaws.com")
    )
    with pytest.raises(VerifyError, match="cannot reach AWS"):
        verify(spec, clients)


# ---------------------------------------------------------------------------- the command


def run_verify(child: CliChild, path: Path, endpoint: str, *more: str) -> subprocess.CompletedProcess[str]:
    """`gpucluster verify PATH` as its own process would run it (`cli_child.py`)."""
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_MAX_ATTEMPTS": "1",
    }
    env.pop("AWS_PROFILE", None)
    return child.run(["verify", str(path), *more], env=env, cwd=REPO_ROOT, timeout=120)


def test_verify_against_a_moto_server(
    cli_child: CliChild, moto_endpoint: str, base_config: dict[str, Any], write_stack: Callable[..., Path]
) -> None:
    """Nothing deployed: every check fails or cannot run (moto has no simulator, no Cost Explorer), exit 1."""
    path = write_stack(base_config, "t")
    done = run_verify(cli_child, path, moto_endpoint, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"stack", "region", "identity", "account", "checks", "counts", "passed"}
    assert document["account"] == ACCOUNT and document["passed"] is False
    assert next(set(c) for c in document["checks"]) == {"id", "name", "subject", "result", "detail", "remedy"}
    assert sum(document["counts"].values()) == len(document["checks"]) and document["counts"]["pass"] == 0
    by_id = {c["id"]: c for c in document["checks"]}
    assert by_id["launch-template.gpu"]["result"] == "fail" and by_id["launch-template.gpu"]["remedy"]
    assert by_id["cost-tag"]["result"] == "unknown" and by_id["cost-tag"]["remedy"] is None
    text = run_verify(cli_child, path, moto_endpoint)
    assert text.returncode == 1 and "remedy: run `pulumi up` for this stack" in text.stdout
    assert "could not be checked" in text.stdout.splitlines()[-1]
    assert max(len(line) for line in text.stdout.splitlines()) <= 100


def test_verify_without_aws_exits_2(cli_child: CliChild, base_config: dict[str, Any],
                                    write_stack: Callable[..., Path]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = run_verify(cli_child, write_stack(base_config, "t"), closed, "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout)["errors"][0]["message"].startswith("cannot reach AWS")


def test_verify_of_a_bad_stack_exits_2(cli_child: CliChild, tmp_path: Path) -> None:
    done = run_verify(cli_child, tmp_path / "Pulumi.none.yaml", "http://127.0.0.1:9")
    assert done.returncode == 2 and "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------------------------
# The feature checks (ops/verifyfeatures.py): AMP's query API is a local HTTP server (the signed request
# is sent there instead); Grafana and Image Builder are botocore Stubbers; PCS (moto has none) is a small
# fake whose requests are checked against botocore's model and whose answers are shaped as it says; the
# login node's Slurm is SSM answered by a Stubber, as in tests/test_slurm_ops.py.

runner = CliRunner()
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def run_with(account: dict[str, Any], spec: StackSpec, check: Any, **made: Any) -> Any:
    """`run_alone`, with some services answered by `made`'s fakes."""
    account["made"].update(made)
    return run_alone(account, spec, check)


def assert_unknown(found: Any, fault: str) -> None:
    assert found.result == "unknown" and fault in found.detail and found.remedy is None, found


# ------------------------------------------------------------------------------------ AMP


class Prometheus(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.asked.append(dict(self.headers))  # type: ignore[attr-defined]
        status, answer = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[Any]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    httpd.asked, httpd.answer = [], (200, {})  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def opener(request: urllib.request.Request, timeout: float) -> Any:
        httpd.signed_for = request.full_url  # type: ignore[attr-defined]
        local = urllib.request.Request(
            f"http://127.0.0.1:{httpd.server_address[1]}/api/v1/query",
            data=request.data,
            method="POST",
            headers=dict(request.header_items()),
        )
        return urllib.request.urlopen(local, timeout=timeout)

    httpd.opener = opener  # type: ignore[attr-defined]
    yield httpd
    httpd.shutdown()


def up(instances: dict[str, str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"instance_id": i}, "value": [0, v]} for i, v in instances.items()],
        },
    }


def observed_nodes(observed: StackSpec) -> list[str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    for group in ("gpu", "gpu", "login"):
        ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="g5.xlarge",
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": STACK_TAG, "Value": observed.identity},
                        {"Key": NODE_GROUP_TAG, "Value": group},
                    ],
                }
            ],
        )
    return [
        i["InstanceId"]
        for i in stack_instances(ec2, observed.identity, states=("running",))
        if {t["Key"]: t["Value"] for t in i["Tags"]}[NODE_GROUP_TAG] != "login"
    ]


def amp_check(prometheus: Any, now: datetime | None = None) -> Any:
    """The check with its clock `now`; by default an hour after this moment, so the nodes moto launches
    now are past the boot grace whatever the real date (a fixed date turned them into booting nodes once
    the real clock reached it)."""
    at = now or datetime.now(UTC) + timedelta(hours=1)
    return lambda d: check_amp_samples(d, opener=prometheus.opener, now=lambda: at)


def test_amp_samples(base_config: dict[str, Any], account: dict[str, Any], prometheus: Any) -> None:
    base_config["gpucluster:observability"] = OBSERVED
    observed = stack(base_config)
    check = amp_check(prometheus)
    assert run_with(account, observed, check).result == "fail"  # no workspace
    workspace = boto3.client("amp", region_name=REGION).create_workspace(
        alias=f"gpucluster-{observed.identity}", tags={STACK_TAG: observed.identity}
    )["workspaceId"]
    nodes = observed_nodes(observed)
    assert len(nodes) >= 2
    prometheus.answer = (200, up(dict.fromkeys(nodes, "1")))
    found = run_with(account, observed, check)
    assert found.result == "pass" and f"{len(nodes)} running GPU node(s)" in found.detail, found
    assert prometheus.signed_for == (
        f"https://aps-workspaces.{REGION}.amazonaws.com/workspaces/{workspace}/api/v1/query"
    )
    assert f"/{REGION}/aps/aws4_request" in prometheus.asked[-1]["Authorization"]
    prometheus.answer = (200, up({nodes[0]: "1", nodes[1]: "0"}))
    found = run_with(account, observed, check)
    assert found.result == "fail" and f"dcgm-exporter down on {nodes[1]}" in found.detail and found.remedy
    prometheus.answer = (200, up({nodes[1]: "1"}))
    found = run_with(account, observed, check)
    assert found.result == "fail" and f"no samples in the last 5m from {nodes[0]}" in found.detail
    # nodes that just booted are not expected yet (moto launches them now)
    fresh = run_with(account, observed, amp_check(prometheus, datetime.now(UTC) + timedelta(minutes=1)))
    assert fresh.result == "pass" and "not expected yet" in fresh.detail, fresh


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_amp_samples_that_cannot_be_asked_are_unknown(
    base_config: dict[str, Any], account: dict[str, Any], prometheus: Any, fault: str
) -> None:
    base_config["gpucluster:observability"] = OBSERVED
    observed = stack(base_config)
    boto3.client("amp", region_name=REGION).create_workspace(alias=f"gpucluster-{observed.identity}")
    prometheus.answer = (
        FAULTS[fault] if fault != "ThrottlingException" else 429,
        {"message": f"injected {fault}"},
    )
    assert_unknown(run_with(account, observed, amp_check(prometheus)), fault)
    amp = boto3.client("amp", region_name=REGION)
    amp.meta.events.register(
        "before-call.amp.ListWorkspaces",
        lambda **_: (_ for _ in ()).throw(client_error(fault, "ListWorkspaces")),
    )
    assert_unknown(run_with(account, observed, amp_check(prometheus), amp=amp), fault)


# ---------------------------------------------------------------------------------- Grafana


def grafana(identity: str, status: str = "ACTIVE", fault: str | None = None) -> Any:
    client = boto3.client("grafana", region_name=REGION)
    stub = Stubber(client)
    if fault:
        stub.add_client_error("list_workspaces", fault, "injected", FAULTS[fault])
    else:
        stub.add_response(
            "list_workspaces",
            {
                "workspaces": [
                    {
                        "id": "g-other",
                        "authentication": {"providers": ["AWS_SSO"]},
                        "created": NOW,
                        "endpoint": "x",
                        "grafanaVersion": "10.4",
                        "modified": NOW,
                        "status": "ACTIVE",
                        "tags": {STACK_TAG: "else"},
                    },
                    {
                        "id": "g-1",
                        "authentication": {"providers": ["AWS_SSO"]},
                        "created": NOW,
                        "endpoint": "x",
                        "grafanaVersion": "10.4",
                        "modified": NOW,
                        "status": status,
                        "tags": {STACK_TAG: identity},
                    },
                ]
            },
        )
        stub.add_response(
            "describe_workspace",
            {
                "workspace": {
                    "id": "g-1",
                    "name": "t-grafana",
                    "authentication": {"providers": ["AWS_SSO"]},
                    "created": NOW,
                    "dataSources": ["PROMETHEUS"],
                    "endpoint": "x",
                    "grafanaVersion": "10.4",
                    "modified": NOW,
                    "status": status,
                    "workspaceRoleArn": f"arn:aws:iam::{ACCOUNT}:role/t-grafana-role",
                }
            },
            {"workspaceId": "g-1"},
        )
    stub.activate()
    return client


def test_grafana(base_config: dict[str, Any], account: dict[str, Any]) -> None:
    base_config["gpucluster:observability"] = {
        **OBSERVED,
        "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]},
    }
    observed = stack(base_config)
    arn = boto3.client("amp", region_name=REGION).create_workspace(
        alias="a", tags={STACK_TAG: observed.identity}
    )["arn"]
    iam = boto3.client("iam")
    iam.create_role(RoleName="t-grafana-role", AssumeRolePolicyDocument="{}")
    found = run_with(account, observed, check_grafana, grafana=grafana(observed.identity))
    assert found.result == "fail" and "may not query" in found.detail and found.remedy
    iam.put_role_policy(
        RoleName="t-grafana-role",
        PolicyName="q",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "aps:QueryMetrics", "Resource": arn}],
            }
        ),
    )
    found = run_with(account, observed, check_grafana, grafana=grafana(observed.identity))
    assert found.result == "pass" and arn in found.detail, found
    found = run_with(account, observed, check_grafana, grafana=grafana(observed.identity, "CREATION_FAILED"))
    assert found.result == "fail" and found.detail == "Grafana workspace t-grafana is CREATION_FAILED"
    found = run_with(account, observed, check_grafana, grafana=grafana("nobody"))
    assert found.result == "fail" and found.detail.startswith("no Grafana workspace is tagged")
    for fault in FAULTS:
        assert_unknown(
            run_with(account, observed, check_grafana, grafana=grafana(observed.identity, fault=fault)), fault
        )


# ----------------------------------------------------------------------------- Image Builder


def imagebuilder(
    pipeline: str | None, images: list[tuple[str, str, str | None]], fault: str | None = None
) -> Any:
    client = boto3.client("imagebuilder", region_name=REGION)
    stub = Stubber(client)
    arn = f"arn:aws:imagebuilder:{REGION}:{ACCOUNT}:image-pipeline/{(pipeline or 'x').lower()}"
    stub.add_response(
        "list_image_pipelines", {"imagePipelineList": [{"arn": arn, "name": pipeline}] if pipeline else []}
    )
    if fault:
        stub.add_client_error("list_image_pipeline_images", fault, "injected", FAULTS[fault])
    elif pipeline:
        stub.add_response(
            "list_image_pipeline_images",
            {
                "imageSummaryList": [
                    {
                        "arn": f"{arn}/{version}",
                        "version": version,
                        "dateCreated": f"2026-11-2{version[-1]}T00:00:00Z",
                        "state": {"status": status, **({"reason": reason} if reason else {})},
                    }
                    for version, status, reason in images
                ]
            },
            {"imagePipelineArn": arn},
        )
    stub.activate()
    return client


def test_image_pipeline(base_config: dict[str, Any], account: dict[str, Any]) -> None:
    base_config["gpucluster:images"] = {"bake": True}
    baked = stack(base_config)
    assert "image-pipeline.gpu" in [c.id for c in plan_checks(baked, Clients(REGION), HERE)]
    name = recipe_name(baked.cluster.name, baked.identity, "gpu")
    check = lambda d: check_image_pipeline(d, "gpu")  # noqa: E731
    good = [("1.0.1", "FAILED", "old"), ("1.0.2", "AVAILABLE", None)]
    found = run_with(account, baked, check, imagebuilder=imagebuilder(name, good))
    assert found.result == "pass" and "1.0.2 is AVAILABLE" in found.detail
    bad = [("1.0.3", "FAILED", "component install-nvidia failed"), ("1.0.2", "AVAILABLE", None)]
    found = run_with(account, baked, check, imagebuilder=imagebuilder(name, bad))
    assert found.result == "fail" and found.detail.endswith(
        "1.0.3 is FAILED: component install-nvidia failed"
    )
    assert "image build" in str(found.remedy)
    assert run_with(account, baked, check, imagebuilder=imagebuilder(None, [])).result == "fail"
    assert run_with(account, baked, check, imagebuilder=imagebuilder(name, [])).result == "fail"
    building = run_with(account, baked, check, imagebuilder=imagebuilder(name, [("1.0.4", "BUILDING", None)]))
    assert building.result == "unknown" and "still building" in building.detail
    for fault in FAULTS:
        assert_unknown(run_with(account, baked, check, imagebuilder=imagebuilder(name, [], fault)), fault)


# ------------------------------------------------------------------------------------ PCS


class Pcs:
    """AWS PCS as botocore's model describes it (moto has none): requests validated, answers shaped."""

    def __init__(
        self,
        identity: str,
        *,
        status: str = "ACTIVE",
        mode: str = "STANDARD",
        groups: dict[str, str] | None = None,
        queues: dict[str, str] | None = None,
    ) -> None:
        self.model = boto3.client("pcs", region_name=REGION).meta.service_model
        self.identity, self.status, self.mode = identity, status, mode
        self.groups = groups if groups is not None else {"gpu": "ACTIVE", "login": "ACTIVE"}
        self.queues = queues if queues is not None else {"gpu": "ACTIVE"}
        self.faults: dict[str, Exception] = {}
        self.asked: list[str] = []
        self.meta = type("Meta", (), {"region_name": REGION})()

    def _call(self, operation: str, request: dict[str, Any]) -> None:
        validate_parameters(request, self.model.operation_model(operation).input_shape)
        self.asked.append(f"pcs:{operation}")
        if operation in self.faults:
            raise self.faults[operation]

    def arn(self, kind: str, id_: str) -> str:
        return f"arn:aws:pcs:{REGION}:{ACCOUNT}:{kind}/{id_}"

    def get_paginator(self, name: str) -> Any:
        operation = self.model.operation_model("".join(p.title() for p in name.split("_"))).name
        fake = self

        class Pages:
            def paginate(self, **request: Any) -> list[dict[str, Any]]:
                fake._call(operation, request)
                if operation == "ListClusters":
                    return [
                        {
                            "clusters": [
                                {
                                    "name": n,
                                    "id": i,
                                    "arn": fake.arn("cluster", i),
                                    "createdAt": NOW,
                                    "modifiedAt": NOW,
                                    "status": "ACTIVE",
                                }
                                for n, i in (("other", "pcs_other"), ("t", "pcs_t1"))
                            ]
                        }
                    ]
                kind, key, items = (
                    ("computenodegroup", "computeNodeGroups", fake.groups)
                    if operation == "ListComputeNodeGroups"
                    else ("queue", "queues", fake.queues)
                )
                return [
                    {
                        key: [
                            {
                                "name": n,
                                "id": f"{n}1",
                                "arn": fake.arn(kind, f"{n}1"),
                                "clusterId": "pcs_t1",
                                "createdAt": NOW,
                                "modifiedAt": NOW,
                                "status": s,
                            }
                            for n, s in items.items()
                        ]
                    }
                ]

        return Pages()

    def list_tags_for_resource(self, **request: Any) -> dict[str, Any]:
        self._call("ListTagsForResource", request)
        mine = request["resourceArn"].endswith("pcs_t1")
        return {"tags": {STACK_TAG: self.identity if mine else "someone-else"}}

    def get_cluster(self, **request: Any) -> dict[str, Any]:
        self._call("GetCluster", request)
        assert request == {"clusterIdentifier": "pcs_t1"}
        return {
            "cluster": {
                "name": "t",
                "id": "pcs_t1",
                "arn": self.arn("cluster", "pcs_t1"),
                "status": self.status,
                "createdAt": NOW,
                "modifiedAt": NOW,
                "scheduler": {"type": "SLURM", "version": "25.05"},
                "size": "SMALL",
                "networking": {},
                "slurmConfiguration": {"accounting": {"mode": self.mode}},
                "errorInfo": [{"code": "InternalServerError", "message": "slurmctld did not start"}]
                if self.status.endswith("FAILED")
                else [],
            }
        }


SLURM = {"type": "slurm", "ami_id": "ami-0123456789abcdef0"}


def slurm_spec(base_config: dict[str, Any], **scheduler: Any) -> StackSpec:
    base_config["gpucluster:scheduler"] = {**SLURM, **scheduler}
    return stack(base_config)


def test_the_slurm_checks_are_planned(base_config: dict[str, Any]) -> None:
    ids = [c.id for c in plan_checks(slurm_spec(base_config), Clients(REGION), HERE)]
    assert ids[-6:] == ["pcs-cluster", "pcs-accounting", "pcs-node-groups", "pcs-queues", "slurm-nodes",
                        "slurm-ports"]
    ids = [
        c.id for c in plan_checks(slurm_spec(base_config, accounting=False), Clients(REGION), HERE, job=True)
    ]
    assert ids[-6:] == ["pcs-cluster", "pcs-node-groups", "pcs-queues", "slurm-nodes", "slurm-ports",
                        "slurm-job.gpu"]
    assert not any(
        i.startswith(("pcs-", "amp-", "grafana", "image-", "slurm-"))
        for i in [
            c.id
            for c in plan_checks(stack(base_config | {"gpucluster:scheduler": {}}), Clients(REGION), HERE)
        ]
    )


def test_pcs_cluster_node_groups_queues_and_accounting(
    base_config: dict[str, Any], account: dict[str, Any]
) -> None:
    slurm = slurm_spec(base_config)
    checks = (check_pcs_cluster, check_pcs_accounting, check_pcs_node_groups, check_pcs_queues)
    for check in checks:
        found = run_with(account, slurm, check, pcs=Pcs(slurm.identity))
        assert found.result == "pass", found
    found = run_with(account, slurm, check_pcs_cluster, pcs=Pcs(slurm.identity, status="UPDATE_FAILED"))
    assert (
        found.result == "fail"
        and "UPDATE_FAILED (InternalServerError: slurmctld did not start)" in found.detail
    )
    found = run_with(account, slurm, check_pcs_accounting, pcs=Pcs(slurm.identity, mode="NONE"))
    assert found.result == "fail" and "mode NONE" in found.detail and "--replace" in str(found.remedy)
    found = run_with(
        account, slurm, check_pcs_node_groups, pcs=Pcs(slurm.identity, groups={"gpu": "CREATE_FAILED"})
    )
    assert (
        found.result == "fail"
        and found.detail == "node groups missing: login; not ACTIVE: gpu (CREATE_FAILED)"
    )
    found = run_with(account, slurm, check_pcs_queues, pcs=Pcs(slurm.identity, queues={"gpu": "UPDATING"}))
    assert found.result == "fail" and found.detail == "queues not ACTIVE: gpu (UPDATING)"
    for check in checks:
        found = run_with(account, slurm, check, pcs=Pcs("no-such-stack"))
        assert found.result == "fail" and found.detail.startswith("no AWS PCS cluster in us-east-1 is tagged")


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize(
    "operation", ["ListClusters", "ListTagsForResource", "GetCluster", "ListComputeNodeGroups", "ListQueues"]
)
def test_pcs_that_cannot_be_asked_is_unknown(
    base_config: dict[str, Any], account: dict[str, Any], fault: str, operation: str
) -> None:
    slurm = slurm_spec(base_config)
    pcs = Pcs(slurm.identity)
    pcs.faults[operation] = client_error(fault, operation)
    account["made"]["pcs"] = pcs
    found = {c.id: run_check(c) for c in plan_checks(slurm, clients_of(account), HERE)}
    asked = {"ListComputeNodeGroups": ["pcs-node-groups"], "ListQueues": ["pcs-queues"]}.get(
        operation, ["pcs-cluster", "pcs-accounting", "pcs-node-groups", "pcs-queues"]
    )
    for check_id in ("pcs-cluster", "pcs-accounting", "pcs-node-groups", "pcs-queues"):
        if check_id in asked:
            assert_unknown(found[check_id], fault)
        else:
            assert found[check_id].result == "pass", found[check_id]


# ------------------------------------------------------------------------------ --job


def ssm_answering(*answers: tuple[str, int, str] | str) -> tuple[Any, list[dict[str, Any]]]:
    """SSM whose SendCommand/GetCommandInvocation answer (status, code, stdout), or raise a fault."""
    ssm = boto3.client("ssm", region_name=REGION)
    stub = Stubber(ssm)
    sent: list[dict[str, Any]] = []
    ssm.meta.events.register("provide-client-params.ssm.SendCommand", lambda params, **_: sent.append(params))
    for n, answer in enumerate(answers):
        if isinstance(answer, str):
            stub.add_client_error("send_command", answer, "injected", FAULTS[answer])
            continue
        status, code, out = answer
        stub.add_response("send_command", {"Command": {"CommandId": f"{n:036d}"}})
        stub.add_response(
            "get_command_invocation",
            {
                "Status": status,
                "ResponseCode": code,
                "StandardOutputContent": out,
                "StandardErrorContent": "srun: error: Unable to allocate resources" if code else "",
            },
        )
    stub.activate()
    return ssm, sent


def login_node(identity: str) -> str:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    return ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="m7i.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=subnet,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": STACK_TAG, "Value": identity}, {"Key": NODE_GROUP_TAG, "Value": "login"}],
            }
        ],
    )["Instances"][0]["InstanceId"]


def test_slurm_job_on_each_partition(base_config: dict[str, Any], account: dict[str, Any]) -> None:
    from gpucluster.slurm.remote import decoded

    slurm = slurm_spec(base_config)
    check = lambda d: check_slurm_job(d, "gpu")  # noqa: E731
    assert run_with(account, slurm, check).result == "unknown"  # no login node
    login = login_node(slurm.identity)
    ssm, sent = ssm_answering(("Success", 0, "gpu-1\n"))
    found = run_with(account, slurm, check, ssm=ssm)
    assert found.result == "pass" and found.detail.endswith("ran on gpu-1"), found
    assert sent[0]["InstanceIds"] == [login]
    assert decoded(sent[0]["Parameters"]["commands"][0]).strip().endswith(job_script("gpu"))
    assert job_script("gpu") == (
        "timeout 900 srun --nodes=1 --ntasks=1 --partition=gpu --job-name=gpucluster-verify hostname"
    )
    ssm, _ = ssm_answering(("Failed", 1, ""))
    found = run_with(account, slurm, check, ssm=ssm)
    assert found.result == "fail" and "Unable to allocate resources" in found.detail and found.remedy
    # SendCommand refused: unknown (throttling and 5xx are retried by the runner to its deadline:
    # fleet.runcommand)
    ssm, _ = ssm_answering("AccessDenied")
    assert_unknown(run_with(account, slurm, check, ssm=ssm), "AccessDenied")


def test_job_on_a_stack_without_slurm_is_bad_input(base_config: dict[str, Any], write_stack: Any) -> None:
    done = runner.invoke(app, ["verify", str(write_stack(base_config, "t")), "--job"])
    assert done.exit_code == 2 and "--job runs a Slurm job" in done.output


def test_every_call_the_feature_checks_make_is_in_the_operator_policy(
    base_config: dict[str, Any], account: dict[str, Any], prometheus: Any
) -> None:
    made: list[str] = []

    def record(model: Any, **_: Any) -> None:
        made.append(f"{model.service_model.endpoint_prefix}:{model.name}")

    base_config["gpucluster:observability"] = {
        **OBSERVED,
        "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]},
    }
    observed = stack(base_config)
    boto3.client("amp", region_name=REGION).create_workspace(
        alias=f"gpucluster-{observed.identity}", tags={STACK_TAG: observed.identity}
    )
    prometheus.answer = (200, up({}))
    name = recipe_name(observed.cluster.name, observed.identity, "gpu")
    fakes = {
        "grafana": grafana(observed.identity),
        "imagebuilder": imagebuilder(name, [("1.0.1", "AVAILABLE", None)]),
    }
    clients = clients_of(account)
    for service in ("amp", "ec2"):
        clients(service).meta.events.register("before-call", record)
    for client in fakes.values():  # a Stubber answers in before-call: record the call before it
        client.meta.events.register("before-parameter-build", record)
    pcs = Pcs(observed.identity)
    for check in (amp_check(prometheus), check_grafana, lambda d: check_image_pipeline(d, "gpu")):
        run_with(account, observed, check, **fakes)
    for check in (check_pcs_cluster, check_pcs_accounting, check_pcs_node_groups, check_pcs_queues):
        run_with(account, slurm_spec(base_config), check, pcs=pcs)
    made += pcs.asked + ["aps:QueryMetrics"] * bool(prometheus.asked)
    made += ["iam:SimulatePrincipalPolicy"] * bool(account["simulator"].requests)
    assert {"aps:QueryMetrics", "grafana:DescribeWorkspace", "imagebuilder:ListImagePipelineImages"} <= set(
        made
    )
    assert {"pcs:GetCluster", "pcs:ListQueues", "ec2:DescribeInstances"} <= set(made)
    assert set(made) - allowed_actions(operator_policy(observed.identity)) == set()


class FakeGrafanaHttp:
    """Grafana's HTTP API as `urllib.request.urlopen` reaches it: each call answers the next of `answers`
    (a JSON body, an HTTP status with its body, or an OSError: no answer)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[Any] = []

    def __call__(self, request: Any, timeout: float) -> Any:
        import io
        import urllib.error

        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        if isinstance(answer, tuple):
            status, body = answer
            raise urllib.error.HTTPError(request.full_url, status, "refused", {},  # type: ignore[arg-type]
                                         io.BytesIO(json.dumps(body).encode()))
        return io.BytesIO(json.dumps(answer).encode())


def test_grafana_runs_its_own_data_source_test_with_a_token(
        base_config: dict[str, Any], account: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """With $GRAFANA_TOKEN, the check also asks Grafana to test the stack's AMP data source (read-only):
    OK passes, Grafana's 400 and a missing data source fail with a remedy, no answer is unknown."""
    from functools import partial

    base_config["gpucluster:observability"] = {
        **OBSERVED, "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]}}
    observed = stack(base_config)
    arn = boto3.client("amp", region_name=REGION).create_workspace(
        alias="a", tags={STACK_TAG: observed.identity})["arn"]
    iam = boto3.client("iam")
    iam.create_role(RoleName="t-grafana-role", AssumeRolePolicyDocument="{}")
    iam.put_role_policy(RoleName="t-grafana-role", PolicyName="q", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "aps:QueryMetrics", "Resource": arn}]}))

    def check(http: FakeGrafanaHttp) -> Any:
        return run_with(account, observed, partial(check_grafana, opener=http, sleep=lambda _s: None),
                        grafana=grafana(observed.identity))

    found = check(FakeGrafanaHttp())
    assert found.result == "pass" and "GRAFANA_TOKEN" in found.detail  # no token: says how to run it
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test")
    http = FakeGrafanaHttp({"status": "OK", "message": "Successfully queried the Prometheus API."})
    found = check(http)
    assert found.result == "pass" and "Successfully queried" in found.detail, found
    [request] = http.requests
    assert request.full_url == "https://x/api/datasources/uid/gpucluster-amp/health"
    assert request.get_method() == "GET" and request.headers["Authorization"] == "Bearer glsa_test"
    found = check(FakeGrafanaHttp((400, {"status": "ERROR", "message": "403 Forbidden from AMP"})))
    assert found.result == "fail" and "403 Forbidden from AMP" in found.detail and found.remedy
    found = check(FakeGrafanaHttp((404, {"message": "Data source not found"})))
    assert found.result == "fail" and "no gpucluster-amp data source" in found.detail
    assert "pulumi up" in (found.remedy or "")
    found = check(FakeGrafanaHttp(OSError("no route"), OSError("no route")))
    assert found.result == "unknown" and "could not run" in found.detail and "no route" in found.detail
    found = check(FakeGrafanaHttp((401, {"message": "invalid API key"})))
    assert found.result == "unknown" and "401" in found.detail
