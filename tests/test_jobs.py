"""`gpucluster nodes`, `run` and `hostfile` against moto: instances launched by moto's Auto Scaling groups.

SSM is asserted on the calls our code makes (a recording wrapper, or botocore's
Stubber), never on moto's command list (moto records every send as sent).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws
from typer.testing import CliRunner

from cli_text import joined_lines
from gpucluster.cli import app, common
from gpucluster.noderole import run_log_group_name
from gpucluster.ops import launch
from gpucluster.ops import nodes as ops_nodes
from gpucluster.ops.nodes import Node, ranked, ssm_ping, stack_nodes
from gpucluster.ops.run import RunError, plan_job, send_job, wait_job
from gpucluster.plan import load_stack
from moto_groups import create_stack_groups, tag_node_group

runner = CliRunner()

DEV = load_stack("dev")[2].identity
PROD = load_stack("prod")[2].identity

# name -> (stack identity, min, desired, max); node groups as the stack files name them.
GROUPS = {
    "prod-h100": (PROD, 0, 3, 4),
    "prod-other": (PROD, 0, 1, 2),
    "dev-a10": (DEV, 0, 2, 2),
}
NODE_GROUPS = {"prod-h100": "h100-train", "prod-other": "spare", "dev-a10": "dev-a10"}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A moto account: the prod stack's h100-train (3 nodes) and spare (1), the dev stack's group (2)."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        ec2 = boto3.client("ec2")
        ec2.create_launch_template(LaunchTemplateName="h100-nodes", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"})
        ec2.create_launch_template(LaunchTemplateName="a10-nodes", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
        autoscaling = boto3.client("autoscaling")
        create_stack_groups(autoscaling, {k: v for k, v in GROUPS.items() if k.startswith("prod")},
                            launch_template="h100-nodes")
        create_stack_groups(autoscaling, {"dev-a10": GROUPS["dev-a10"]}, launch_template="a10-nodes")
        for group, node_group in NODE_GROUPS.items():
            tag_node_group(autoscaling, group, node_group)
        yield {"ec2": ec2, "autoscaling": autoscaling}


def _tagged_instances(ec2: Any, stack_identity: str) -> dict[str, dict[str, Any]]:
    """Running instances carrying the stack's identity tag, as EC2 itself lists them."""
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": "tag:gpucluster:stack", "Values": [stack_identity]},
        {"Name": "instance-state-name", "Values": ["running"]}])
    return {i["InstanceId"]: i for page in pages for r in page["Reservations"] for i in r["Instances"]}


def _online(monkeypatch: pytest.MonkeyPatch, status: str = "Online") -> None:
    """moto has no DescribeInstanceInformation: every node answers `status` (ssm_ping has its own test)."""
    monkeypatch.setattr(ops_nodes, "ssm_ping", lambda _ssm, ids: dict.fromkeys(ids, status))


# ------------------------------------------------------------------------ nodes


def test_nodes_lists_exactly_the_stacks_instances(aws: dict[str, Any]) -> None:
    expected = _tagged_instances(aws["ec2"], PROD)
    assert len(expected) == 4  # 3 + 1: moto launched the prod groups' desired capacity
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        ping = dict.fromkeys(sorted(expected), "Online")
        first = sorted(expected)[0]
        ping[first] = "ConnectionLost"
        stub.add_response("describe_instance_information",
                          {"InstanceInformationList": [{"InstanceId": i, "PingStatus": s}
                                                       for i, s in ping.items()]},
                          {"Filters": [{"Key": "InstanceIds", "Values": sorted(expected)}]})
        found = stack_nodes(PROD, autoscaling_client=aws["autoscaling"], ec2_client=aws["ec2"],
                            ssm_client=ssm)
    assert sorted(n.instance_id for n in found) == sorted(expected)
    assert not {n.instance_id for n in found} & set(_tagged_instances(aws["ec2"], DEV))
    for node in found:
        ec2_view = expected[node.instance_id]
        assert node.private_ip == ec2_view["PrivateIpAddress"]
        assert (node.instance_type, node.gpus) == ("p5.48xlarge", 8)
        assert node.zone == "us-east-1a" and node.lifecycle == "on-demand"
        assert (node.state, node.asg_state, node.health) == ("running", "InService", "Healthy")
        assert node.launch_time == ec2_view["LaunchTime"]
    assert {n.node_group for n in found} == {"h100-train", "spare"}
    by_id = {n.instance_id: n for n in found}
    assert by_id[first].ssm == "ConnectionLost" and by_id[first].unreachable


def test_nodes_of_one_group_and_an_unknown_group(aws: dict[str, Any]) -> None:
    _online_ssm = _FakeSsm()
    found = stack_nodes(PROD, node_group="h100-train", autoscaling_client=aws["autoscaling"],
                        ec2_client=aws["ec2"], ssm_client=_online_ssm)
    assert len(found) == 3 and {n.asg for n in found} == {"prod-h100"}
    assert stack_nodes(PROD, node_group="prod-h100", autoscaling_client=aws["autoscaling"],
                       ec2_client=aws["ec2"], ssm_client=_online_ssm) == found  # the ASG's own name
    with pytest.raises(ops_nodes.NodesError, match="no node group 'dev-a10' in this stack "
                                                   r"\(node groups: h100-train, spare\)"):
        stack_nodes(PROD, node_group="dev-a10", autoscaling_client=aws["autoscaling"],
                    ec2_client=aws["ec2"], ssm_client=_online_ssm)


class _FakeSsm:
    """DescribeInstanceInformation for moto's instances: every one Online (moto lacks the call)."""

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_instance_information"
        return self

    def paginate(self, Filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        yield {"InstanceInformationList": [{"InstanceId": i, "PingStatus": "Online"}
                                           for i in Filters[0]["Values"]]}


def test_ssm_ping_marks_unlisted_nodes_and_survives_a_refusal() -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_response("describe_instance_information",
                          {"InstanceInformationList": [{"InstanceId": "i-0a", "PingStatus": "Online"}]})
        assert ssm_ping(ssm, ["i-0b", "i-0a"]) == {"i-0a": "Online", "i-0b": "not registered"}
        stub.add_client_error("describe_instance_information", "AccessDeniedException")
        assert ssm_ping(ssm, ["i-0a"]) == {"i-0a": "unknown"}


def test_cli_nodes_table_and_json(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    result = runner.invoke(app, ["nodes", "prod", "--group", "h100-train"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "stack prod (us-east-1): 3 node(s), 3 in service"
    assert lines[1].split()[:4] == ["instance", "node", "group", "type"]
    rows = [line.split() for line in joined_lines(result.output)[2:]]  # a row folds at 100 columns
    assert len(rows) == 3 and all(r[1:4] == ["h100-train", "p5.48xlarge", "8"] for r in rows)
    assert max(map(len, lines)) <= 100 and result.output.count("SSM: Online") == 3

    result = runner.invoke(app, ["nodes", "prod", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["stack"], doc["region"], doc["identity"]) == ("prod", "us-east-1", PROD)
    listed = doc["nodes"]
    assert sorted(n["instance_id"] for n in listed) == sorted(_tagged_instances(aws["ec2"], PROD))
    assert {n["ssm"] for n in listed} == {"Online"} and {n["lifecycle"] for n in listed} == {"on-demand"}


def test_cli_nodes_of_an_unknown_group_is_one_line_exit_2(aws: dict[str, Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    result = runner.invoke(app, ["nodes", "prod", "--group", "nope"])
    assert result.exit_code == 2
    assert result.output == "nodes: no node group 'nope' in this stack (node groups: h100-train, spare)\n"


# --------------------------------------------------------------------- rank order


def _node(instance_id: str, ip: str, launched: int, *, gpus_type: str = "p5.48xlarge",
          asg_state: str = "InService", ssm: str = "Online") -> Node:
    return Node(instance_id, "g", "asg", gpus_type, "us-east-1a", ip, "on-demand", "running",
                asg_state, "Healthy", datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=launched), ssm)


def test_rank_order_is_launch_time_then_instance_id() -> None:
    nodes = [_node("i-0c", "10.0.0.9", 5), _node("i-0b", "10.0.0.1", 0), _node("i-0a", "10.0.0.5", 0)]
    assert [n.instance_id for n in ranked(nodes)] == ["i-0a", "i-0b", "i-0c"]


def test_plan_job_environment_and_refusals() -> None:
    nodes = ranked([_node("i-0a", "10.0.0.5", 0), _node("i-0b", "10.0.0.1", 1),
                    _node("i-0c", "10.0.0.7", 2, asg_state="Pending")])
    plan = plan_job(nodes, "torchrun train.py", log_group="/gpucluster/x/run",
                    group_environment={"FI_PROVIDER": "efa"})
    assert [r.node.instance_id for r in plan.ranks] == ["i-0a", "i-0b"]  # Pending is left out
    env0, env1 = plan.ranks[0].environment, plan.ranks[1].environment
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == "10.0.0.5"
    assert (env0["NODE_RANK"], env1["NODE_RANK"]) == ("0", "1")
    assert env0["NNODES"] == "2" and env0["NPROC_PER_NODE"] == "8" and env0["WORLD_SIZE"] == "16"
    assert env0["FI_PROVIDER"] == "efa"
    script = plan.script(plan.ranks[1])
    assert script[-1] == "exec bash -c 'torchrun train.py'"
    assert "export NODE_RANK=1" in script
    with pytest.raises(RunError, match="SSM cannot reach i-0d \\(ConnectionLost\\)"):
        plan_job([_node("i-0d", "10.0.0.2", 0, ssm="ConnectionLost")], "true", log_group="/x")
    with pytest.raises(RunError, match="no node in service"):
        plan_job([_node("i-0e", "10.0.0.2", 0, asg_state="Pending")], "true", log_group="/x")
    with pytest.raises(RunError, match=r"--timeout: must be 1\.\.172800"):
        plan_job(nodes, "true", timeout_seconds=200000, log_group="/x")


def test_run_log_group_is_a_valid_log_group_name() -> None:
    assert run_log_group_name("acme/ml:prod gpu") == "/gpucluster/acme/ml-prod-gpu/run"


# --------------------------------------------------------------------------- run


def _dry_run_ranks(output: str) -> list[dict[str, str]]:
    """rank -> the environment exported for it, from `run --dry-run` output."""
    ranks: list[dict[str, str]] = []
    for line in output.splitlines():
        if line.startswith("rank "):
            ranks.append({"_header": line})
        elif line.startswith("  export ") and ranks:
            key, _, value = line.removeprefix("  export ").partition("=")
            ranks[-1][key] = value.strip("'")
    return ranks


def test_cli_run_dry_run_gives_ranks_master_and_nnodes(aws: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    result = runner.invoke(app, ["run", "prod", "--group", "h100-train", "--dry-run", "--",
                                 "torchrun", "--nnodes=$NNODES", "--node-rank=$NODE_RANK", "train.py"])
    assert result.exit_code == 0, result.output
    ranks = _dry_run_ranks(result.output)
    ips = {i["PrivateIpAddress"] for i in _tagged_instances(aws["ec2"], PROD).values()}
    assert [r["NODE_RANK"] for r in ranks] == ["0", "1", "2"]
    assert {r["NNODES"] for r in ranks} == {"3"}
    assert len({r["MASTER_ADDR"] for r in ranks}) == 1 and ranks[0]["MASTER_ADDR"] in ips
    assert ranks[0]["_header"].split()[3] == ranks[0]["MASTER_ADDR"]  # rank 0's own address
    assert {r["NPROC_PER_NODE"] for r in ranks} == {"8"} and {r["WORLD_SIZE"] for r in ranks} == {"24"}
    assert {r["FI_PROVIDER"] for r in ranks} == {"efa"}  # prod's h100-train is an EFA group
    assert {r["FI_EFA_USE_DEVICE_RDMA"] for r in ranks} == {"1"}
    assert {r["GPUCLUSTER_CONTAINER_IMAGE"] for r in ranks} == {"nvcr.io/nvidia/pytorch:24.12-py3"}
    assert {r["GPUCLUSTER_CHECKPOINT_URI"] for r in ranks} == {"/fsx/checkpoints/"}  # prod's FSx dataset
    assert "  exec bash -c 'torchrun --nnodes=$NNODES --node-rank=$NODE_RANK train.py'" in result.output
    assert result.output.rstrip().endswith("dry run: nothing sent")


class RecordingSsm:
    """The real (moto) client, with every SendCommand our code makes recorded."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.sent: list[dict[str, Any]] = []

    def send_command(self, **kwargs: Any) -> Any:
        self.sent.append(kwargs)
        return self._client.send_command(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_cli_run_sends_one_command_per_node(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    recorder = RecordingSsm(boto3.client("ssm", region_name="us-east-1"))
    real_client = common.client
    monkeypatch.setattr(common, "client", lambda spec, service: recorder if service == "ssm"
                        else real_client(spec, service))
    result = runner.invoke(app, ["run", "prod", "--group", "h100-train", "--timeout", "600", "--",
                                 "nvidia-smi", "-L"])
    assert result.exit_code == 0, result.output
    instances = _tagged_instances(aws["ec2"], PROD)
    h100 = {i for i, d in instances.items()
            if {"Key": "aws:autoscaling:groupName", "Value": "prod-h100"} in d["Tags"]}
    assert len(recorder.sent) == 3
    assert sorted(c["InstanceIds"][0] for c in recorder.sent) == sorted(h100)
    assert all(len(c["InstanceIds"]) == 1 for c in recorder.sent)
    for rank, call in enumerate(recorder.sent):
        commands = call["Parameters"]["commands"]
        assert f"export NODE_RANK={rank}" in commands and commands[-1] == "exec bash -c 'nvidia-smi -L'"
        assert call["Parameters"]["executionTimeout"] == ["600"]
        assert call["DocumentName"] == "AWS-RunShellScript"
        assert call["CloudWatchOutputConfig"] == {"CloudWatchOutputEnabled": True,
                                                  "CloudWatchLogGroupName": run_log_group_name(PROD)}
    assert "run: all 3 node(s) succeeded" in result.output
    first = " ".join(" ".join(result.output.split("\n", 2)[:2]).split())  # the first line, wrapped
    assert first.startswith("run on 3 node(s) of h100-train, MASTER_ADDR ") and first.endswith(
        ", stopped after 600 s (--timeout): nvidia-smi -L"), first


def test_the_first_line_states_the_time_limit() -> None:
    """Issue 25: a plain run stops at 3,600 s unless --timeout; its first line says so."""
    from types import SimpleNamespace

    from gpucluster.cli.jobs import time_limit
    from gpucluster.ops.run import DEFAULT_TIMEOUT_SECONDS

    assert DEFAULT_TIMEOUT_SECONDS == 3600
    plain = SimpleNamespace(detach=None, timeout_seconds=DEFAULT_TIMEOUT_SECONDS, job_timeout_seconds=None)
    assert time_limit(plain, None) == ("stopped after 3,600 s (the default; --timeout N to change, "
                                       "up to 172800)")
    detached = SimpleNamespace(detach="job-1", timeout_seconds=300, job_timeout_seconds=None)
    assert time_limit(detached, None) == "no time limit (detached)"
    limited = SimpleNamespace(detach="job-1", timeout_seconds=300, job_timeout_seconds=86400)
    assert time_limit(limited, 86400) == "stopped after 86400 s (--timeout)"


def _invocation(status: str, code: int, out: str = "", err: str = "") -> dict[str, Any]:
    return {"Status": status, "ResponseCode": code, "StandardOutputContent": out,
            "StandardErrorContent": err}


def _sends(stub: Stubber, count: int, *, checked: bool = False,
           instance_ids: Sequence[str] | None = None) -> None:
    """`count` answers to send_command, command ids 0, 1, ... (36 digits); `checked` or `instance_ids`:
    each request must be a run-shell-script command with output to CloudWatch (to `instance_ids[n]`)."""
    for n in range(count):
        expected = None
        if checked or instance_ids is not None:
            expected = {"InstanceIds": ANY if instance_ids is None else [instance_ids[n]],
                        "DocumentName": "AWS-RunShellScript", "Comment": ANY, "TimeoutSeconds": ANY,
                        "Parameters": ANY, "CloudWatchOutputConfig": ANY}
        stub.add_response("send_command", {"Command": {"CommandId": f"{n:036d}"}}, expected)


def test_run_reports_a_failing_node_as_a_failure(aws: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    found = stack_nodes(PROD, node_group="h100-train", autoscaling_client=aws["autoscaling"],
                        ec2_client=aws["ec2"],
                        ssm_client=boto3.client("ssm", region_name="us-east-1"))
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    _sends(stub, len(found), instance_ids=[node.instance_id for node in found])
    # First poll: rank 0 done, rank 1 failed, rank 2 still running; second poll: rank 2 done.
    for n, response in enumerate([_invocation("Success", 0, "ok\n"),
                                  _invocation("Failed", 1, "step 1\n", "CUDA error: out of memory\n"),
                                  _invocation("InProgress", -1), _invocation("Success", 0, "ok\n")]):
        rank = min(n, 2)
        stub.add_response("get_command_invocation", response,
                          {"CommandId": f"{rank:036d}", "InstanceId": found[rank].instance_id})
    plan = plan_job(found, "python train.py", log_group=run_log_group_name(PROD))
    seen: list[tuple[int, str]] = []
    with stub:
        job = send_job(ssm, plan)
        job = wait_job(ssm, job, timeout_seconds=60, sleep=lambda _s: None,
                       on_change=lambda r: seen.append((r.rank, r.status)))
        stub.assert_no_pending_responses()
    assert not job.ok
    assert [(r.rank, r.status, r.exit_code) for r in job.failed] == [(1, "Failed", 1)]
    assert job.failed[0].tail() == ["step 1", "CUDA error: out of memory"]
    assert seen == [(0, "Success"), (1, "Failed"), (2, "InProgress"), (2, "Success")]


def test_cli_run_exits_1_and_names_the_failed_rank(aws: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    _sends(stub, 3)
    for n in range(3):
        stub.add_response("get_command_invocation",
                          _invocation("Failed", 2, err="boom\n") if n == 2 else _invocation("Success", 0))
    real_client = common.client
    monkeypatch.setattr(common, "client", lambda spec, service: ssm if service == "ssm"
                        else real_client(spec, service))
    with stub:
        result = runner.invoke(app, ["run", "prod", "--group", "h100-train", "--", "false"])
    assert result.exit_code == 1, result.output
    assert re.search(r"^rank 2 i-\w+ [\d.]+: Failed, exit 2$", result.output, re.M)
    assert "  | boom" in result.output
    assert result.output.rstrip().endswith("run: 1 of 3 node(s) failed (ranks 2)")


def test_a_launch_that_fails_on_one_node_is_cancelled_on_all() -> None:
    nodes = ranked([_node("i-0a", "10.0.0.5", 0), _node("i-0b", "10.0.0.6", 1),
                    _node("i-0c", "10.0.0.7", 2)])
    plan = plan_job(nodes, "true", log_group="/x")
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        stub.add_client_error("send_command", "InvalidInstanceId", "not a managed node")
        stub.add_response("cancel_command", {}, {"CommandId": "c" * 36, "InstanceIds": ["i-0a"]})
        job = send_job(ssm, plan)
        stub.assert_no_pending_responses()
    assert job.cancelled and not job.ok
    assert [r.status for r in job.results] == ["Cancelled", "NotSent", "NotSent"]
    assert job.results[1].error.startswith("InvalidInstanceId")


def test_cli_run_without_group_or_command(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    result = runner.invoke(app, ["run", "prod", "--", "true"])
    assert (result.exit_code, result.output) == (2, "run: --group is required (the node group to run on)\n")
    result = runner.invoke(app, ["run", "prod", "--group", "h100-train"])
    assert (result.exit_code, result.output) == (2, "run: no command given (put it after --)\n")


# ---------------------------------------------------------------------- hostfile


def test_cli_hostfile_formats(aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    found = stack_nodes(PROD, node_group="h100-train", autoscaling_client=aws["autoscaling"],
                        ec2_client=aws["ec2"],
                        ssm_client=boto3.client("ssm", region_name="us-east-1"))
    ips = [n.private_ip for n in found]
    for fmt, expected in (("mpi", [f"{ip} slots=8" for ip in ips]),
                          ("deepspeed", [f"{ip} slots=8" for ip in ips]),
                          ("plain", ips)):
        result = runner.invoke(app, ["hostfile", "prod", "--group", "h100-train", "--format", fmt])
        assert result.exit_code == 0, result.output
        assert result.output.splitlines() == expected
    result = runner.invoke(app, ["hostfile", "prod", "--group", "h100-train", "--format", "slurm"])
    assert result.exit_code == 2 and "--format: must be mpi, deepspeed or plain" in result.output


def test_checkpoint_uri_of_a_named_bucket_and_of_none(base_config: dict[str, Any]) -> None:
    from gpucluster.preflight import parse_stack_config

    base_config["gpucluster:datasets"] = [
        {"name": "data", "bucket_name": "acme-data", "existing": True, "prefix": "d/"},
        {"name": "ckpt", "bucket_name": "acme-ckpt", "checkpoint_prefix": "runs/"}]
    assert launch.checkpoint_uri(parse_stack_config(base_config, stack="t")) == "s3://acme-ckpt/runs/"
    base_config["gpucluster:datasets"] = [{"name": "ckpt", "checkpoint_prefix": "runs/"}]
    assert launch.checkpoint_uri(parse_stack_config(base_config, stack="t")) is None  # named at deploy
