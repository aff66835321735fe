"""`verify`: a deployed stack checked in a moto account that boto3 builds as `pulumi up` would.

moto has neither IAM's policy simulator nor Cost Explorer's ListCostAllocationTags: the simulator is
a small fake that answers SimulatePrincipalPolicy as the IAM API reference says (its request checked
against botocore's model) from the role's inline policies in moto, evaluated by tests/iam_eval.py;
Cost Explorer is botocore's Stubber. Every check has a pass, a fail and an unknown test; faults
(AccessDenied, throttling, a 5xx, a timeout) are injected on the call each check needs.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber
from botocore.validate import validate_parameters
from moto import mock_aws
from moto.server import ThreadedMotoServer

from gpucluster.fleet.jobnames import jobs_parameter_path
from gpucluster.names import expected_names
from gpucluster.node.bundle import bundle_key
from gpucluster.noderole import run_log_group_name
from gpucluster.ops import Clients
from gpucluster.ops.permissions import VERIFY_LAUNCH_ACTIONS, allowed_actions, operator_policy
from gpucluster.ops.verify import (
    Deployed,
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


def deploy(spec: StackSpec) -> dict[str, Any]:
    """What `pulumi up` leaves of the base stack: the node group's template, group, role and bucket,
    the notify topic (encrypted, one confirmed subscription), the job and spot handlers with their
    rules and alarms. Returns what the tests change."""
    identity, c = spec.identity, spec.cluster.name
    tags = [{"Key": "gpucluster:stack", "Value": identity}, {"Key": "gpucluster:node-group", "Value": "gpu"}]
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam")
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
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
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
    boto3.client("autoscaling", region_name=REGION).create_auto_scaling_group(
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
    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]
    sns = boto3.client("sns", region_name=REGION)
    topic = sns.create_topic(Name=f"{c}-guardrails", Attributes={"KmsMasterKeyId": key["KeyId"]})["TopicArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"arn:aws:sqs:{REGION}:{ACCOUNT}:notices")
    functions = {"job_restart": f"{c}-job-restart", "spot_interruption": f"{c}-spot-interruption"}
    lam = boto3.client("lambda", region_name=REGION)
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
    events = boto3.client("events", region_name=REGION)
    for type_, name in names:
        if type_ == "aws:cloudwatch/eventRule:EventRule":
            events.put_rule(Name=name, EventPattern=json.dumps({"source": ["aws.ec2"]}), State="ENABLED")
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
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


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def run_verify(path: Path, endpoint: str, *more: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_MAX_ATTEMPTS": "1",
    }
    env.pop("AWS_PROFILE", None)
    return subprocess.run(
        [sys.executable, "-m", "gpucluster.cli", "verify", str(path), *more],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_verify_against_a_moto_server(
    moto_endpoint: str, base_config: dict[str, Any], write_stack: Callable[..., Path]
) -> None:
    """Nothing deployed: every check fails or cannot run (moto has no simulator, no Cost Explorer), exit 1."""
    path = write_stack(base_config, "t")
    done = run_verify(path, moto_endpoint, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"stack", "region", "identity", "account", "checks", "counts", "passed"}
    assert document["account"] == ACCOUNT and document["passed"] is False
    assert next(set(c) for c in document["checks"]) == {"id", "name", "subject", "result", "detail", "remedy"}
    assert sum(document["counts"].values()) == len(document["checks"]) and document["counts"]["pass"] == 0
    by_id = {c["id"]: c for c in document["checks"]}
    assert by_id["launch-template.gpu"]["result"] == "fail" and by_id["launch-template.gpu"]["remedy"]
    assert by_id["cost-tag"]["result"] == "unknown" and by_id["cost-tag"]["remedy"] is None
    text = run_verify(path, moto_endpoint)
    assert text.returncode == 1 and "remedy: run `pulumi up` for this stack" in text.stdout
    assert "could not be checked" in text.stdout.splitlines()[-1]
    assert max(len(line) for line in text.stdout.splitlines()) <= 100


def test_verify_without_aws_exits_2(base_config: dict[str, Any], write_stack: Callable[..., Path]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = run_verify(write_stack(base_config, "t"), closed, "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout)["errors"][0]["message"].startswith("cannot reach AWS")


def test_verify_of_a_bad_stack_exits_2(tmp_path: Path) -> None:
    done = run_verify(tmp_path / "Pulumi.none.yaml", "http://127.0.0.1:9")
    assert done.returncode == 2 and "Traceback" not in done.stderr
