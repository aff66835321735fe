"""Day-2 commands on a Slurm stack (ops.slurmjobs and the CLI over it), against moto and a Stubber.

moto holds the stack's instances (the login node tagged STACK_TAG = identity and NODE_GROUP_TAG =
login, compute nodes tagged with their group); SSM is a botocore Stubber, so each test decides
what the login node printed and asserts the command sent: one AWS-RunShellScript line whose
decoded script is the one `slurm.remote` builds (the same text tests/test_slurm_ops_real.py runs
against a real Slurm). The recorded sacct output below is shaped as Slurm's `--parsable2
--noheader` prints it (no slurmdbd on the test host: see test_slurm_real).
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws
from typer.testing import CliRunner

from base_config import base
from gpucluster.cli import app, common
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.ops.slurmjobs import (
    SlurmError,
    find_login_node,
    node_hour_prices,
    plan_submit,
    refusal,
    run_script,
    submit,
)
from gpucluster.preflight import parse_stack_config
from gpucluster.project import load_stack
from gpucluster.slurm.batch import BatchJob, sbatch_script, slurm_group
from gpucluster.slurm.remote import JOB_UID, decoded, submit_script
from gpucluster.slurm.usage import parse_usage, priced

runner = CliRunner()
NOW = datetime(2026, 11, 21, 0, 0, tzinfo=UTC)


def slurm_config(**scheduler: Any) -> dict[str, Any]:
    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4},
        {"name": "spot-a10", "instance_types": ["g5.xlarge"], "max_nodes": 2, "desired_nodes": 1,
         "capacity": {"spot_percent": 100}},
    ]
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0", **scheduler}
    return config


@pytest.fixture
def stack(tmp_path: Path, write_stack: Any) -> str:
    return str(write_stack(slurm_config(), "slurmy"))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, stack: str) -> Iterator[dict[str, Any]]:
    """moto: a login node and two train nodes of the stack (addresses 10.0.1.10, .11, .12), and
    an instance of another stack; `common.client` hands the CLI moto's EC2 and a stubbed SSM."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    identity = load_stack(stack)[2].identity
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        made = {}
        for label, ip, group, owner in (("login", "10.0.1.10", "login", identity),
                                        ("train-1", "10.0.1.11", "train", identity),
                                        ("train-2", "10.0.1.12", "train", identity),
                                        ("other", "10.0.1.13", "login", "someone-else")):
            made[label] = ec2.run_instances(
                ImageId="ami-12c6146b", InstanceType="m7i.large" if group == "login" else "p5.48xlarge",
                MinCount=1, MaxCount=1, SubnetId=subnet, PrivateIpAddress=ip,
                TagSpecifications=[{"ResourceType": "instance", "Tags": [
                    {"Key": STACK_TAG, "Value": owner}, {"Key": NODE_GROUP_TAG, "Value": group}]}],
            )["Instances"][0]["InstanceId"]
        ssm = boto3.client("ssm", region_name="us-east-1")
        sent: list[dict[str, Any]] = []
        ssm.meta.events.register("provide-client-params.ssm.SendCommand",
                                 lambda params, **_: sent.append(params))
        monkeypatch.setattr(common, "client", lambda spec, service: ssm if service == "ssm"
                            else boto3.client(service, region_name="us-east-1"))
        yield {"ec2": ec2, "ssm": ssm, "ids": made, "sent": sent, "identity": identity}


def answer(stub: Stubber, out: str = "", *, status: str = "Success", code: int = 0, err: str = "",
           n: int = 0) -> None:
    stub.add_response("send_command", {"Command": {"CommandId": f"{n:036d}"}})
    stub.add_response("get_command_invocation", {"Status": status, "ResponseCode": code,
                                                 "StandardOutputContent": out, "StandardErrorContent": err})


def page(out: str) -> str:
    """What `captured_script` prints when the whole output fits one SSM answer."""
    size = len(out.encode())
    return (f"==gpucluster:capture\n/tmp/gpucluster-out.AbCd1234\n==gpucluster:rc\n0\n==gpucluster:size\n"
            f"{size}\n==gpucluster:read\n{size}\n==gpucluster:output\n{out}")


CAPTURED = re.compile(r'bash -c "\$\(echo [A-Za-z0-9+/=]+ \| base64 -d\)" gpucluster > "\$f"')


def scripts(aws: dict[str, Any]) -> list[tuple[str, str]]:
    """(instance, decoded script) of every command sent, in order; a captured one: the script inside."""
    out = []
    for params in aws["sent"]:
        assert params["DocumentName"] == "AWS-RunShellScript"
        [line] = params["Parameters"]["commands"]
        script = decoded(line)
        inner = CAPTURED.search(script)
        out.append((params["InstanceIds"][0], decoded(inner.group(0)[:-len(' > "$f"')]) if inner else script))
    return out


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def one_line(result: Any) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


# ---------------------------------------------------------------------------- run


def test_run_detach_submits_the_groups_batch_script_on_the_login_node(aws: dict[str, Any],
                                                                      stack: str) -> None:
    spec = load_stack(stack)[2]
    with Stubber(aws["ssm"]) as stub:
        answer(stub, "4242\n")
        result = cli("run", stack, "--group", "train", "--detach", "--name", "pretrain", "--nodes", "2", "--",
                     "torchrun", "--nnodes", "$NNODES", "train.py")
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "4242"
    assert "submitted job 4242 (pretrain, 2 node(s)) to partition train" in result.output
    [(instance, script)] = scripts(aws)
    assert instance == aws["ids"]["login"]
    expected = sbatch_script(BatchJob(name="pretrain", command="torchrun --nnodes $NNODES train.py", nodes=2),
                             slurm_group(spec.node_groups[0], stack=spec.identity, cluster=spec.cluster.name,
                                         region=spec.region, spot=spec.spot))
    assert script == submit_script(expected)
    [encoded] = re.findall(r"echo ([A-Za-z0-9+/=]+) \| base64 -d > \"\$script\"", script)
    assert base64.b64decode(encoded).decode() == expected  # the batch script, byte for byte
    assert f"uid={JOB_UID}" in script and 'runuser -u "$user" -- "$sbatch" --parsable' in script
    assert "torchrun" not in aws["sent"][0]["Parameters"]["commands"][0]  # nothing typed in the shell line


def test_run_on_a_spot_group_requeues_and_dry_run_json_shows_the_exact_script(aws: dict[str, Any],
                                                                              stack: str) -> None:
    result = cli("run", stack, "--group", "spot-a10", "--detach", "--dry-run", "--json", "--name", "j1",
                 "--", "python", "eval.py")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    spec = load_stack(stack)[2]
    group = slurm_group(spec.node_groups[1], stack=spec.identity, cluster=spec.cluster.name,
                        region=spec.region, spot=spec.spot)
    job = BatchJob(name="j1", command="python eval.py", nodes=1)
    assert doc["sbatch_script"] == sbatch_script(job, group)
    assert "#SBATCH --requeue" in doc["sbatch_script"] and doc["nodes"] == 1  # desired_nodes
    assert doc["login_node_script"] == submit_script(doc["sbatch_script"])
    assert aws["sent"] == []  # a dry run sends nothing


def test_run_refusals_are_one_line_exit_2(aws: dict[str, Any], stack: str) -> None:
    result = cli("run", stack, "--group", "train", "--", "hostname")
    assert result.exit_code == 2 and "add --detach" in one_line(result)
    result = cli("run", stack, "--group", "train", "--nccl-test")
    assert result.exit_code == 2 and "runs Slurm" in one_line(result)
    result = cli("run", stack, "--group", "nope", "--detach", "--", "true")
    assert result.exit_code == 2 and "no node group 'nope'" in one_line(result)
    result = cli("run", stack, "--group", "train", "--detach", "--nodes", "9", "--", "true")
    assert result.exit_code == 2
    assert "--nodes: 9 is more than node group train's max_nodes (4)" in one_line(result)
    for args in (("hostfile", stack, "--group", "train"),
                 ("scale", stack, "--group", "train", "--desired", "1")):
        result = cli(*args)
        assert result.exit_code == 2 and "runs Slurm" in one_line(result), args
        # One clean line: the command's name once ("scale: scale: ..." before).
        assert one_line(result).startswith(f"{args[0]}: stack slurmy runs Slurm: "), one_line(result)
        assert f"{args[0]}: {args[0]}:" not in result.output
    assert aws["sent"] == []


def test_sbatch_refusing_is_exit_1_with_its_own_words(aws: dict[str, Any], stack: str) -> None:
    with Stubber(aws["ssm"]) as stub:
        answer(stub, status="Failed", code=1, err="sbatch: error: Batch job submission failed: Invalid "
                                                 "partition name specified\n")
        result = cli("run", stack, "--group", "train", "--detach", "--", "true")
    assert result.exit_code == 1
    assert "Invalid partition name specified (Failed, exit 1)" in one_line(result)


def test_no_running_login_node_is_one_line_exit_2(aws: dict[str, Any], stack: str) -> None:
    aws["ec2"].stop_instances(InstanceIds=[aws["ids"]["login"]])
    result = cli("jobs", stack)
    line = one_line(result)
    assert result.exit_code == 2
    assert "has no running Slurm login node" in line and "gpucluster:node-group=login" in line
    assert "pulumi up" in line and aws["sent"] == []


def test_access_denied_on_send_command_is_reported_as_such(aws: dict[str, Any], stack: str) -> None:
    with Stubber(aws["ssm"]) as stub:
        stub.add_client_error("send_command", "AccessDeniedException", "not authorized to perform: "
                              "ssm:SendCommand", 400)
        result = cli("cancel", stack, "4242", "--yes")
    assert result.exit_code == 2 and "AccessDeniedException" in one_line(result)


# ------------------------------------------------------------------- jobs / cancel

SQUEUE_SACCT = """==gpucluster:squeue
4243|pretrain|RUNNING|2|train-[1-2]|train|None
4244|eval|PENDING|1||train|Resources
==gpucluster:sacct
4240|warmup|COMPLETED|1|0:0|train-1|train
4241|broken|FAILED|2|1:0|train-[1-2]|train
4243|pretrain|RUNNING|2|0:0|train-[1-2]|train
"""


def test_jobs_lists_squeue_and_sacct_of_the_last_week(aws: dict[str, Any], stack: str) -> None:
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SQUEUE_SACCT))
        result = cli("jobs", stack, "--json")
    assert result.exit_code == 0, result.output
    jobs = {j["job_id"]: j for j in json.loads(result.output)["jobs"]}
    assert [(k, j["state"], j["exit_code"]) for k, j in sorted(jobs.items())] == [
        ("4240", "COMPLETED", 0), ("4241", "FAILED", 1), ("4243", "RUNNING", None), ("4244", "PENDING", None)]
    assert jobs["4244"]["reason"] == "Resources"
    [(_, script)] = scripts(aws)
    assert "squeue --noheader '--format=%i|%j|%T|%D|%N|%P|%r'" in script
    assert re.search(r"sacct .*--starttime=\d{4}-\d\d-\d\dT", script)
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SQUEUE_SACCT))
        result = cli("jobs", stack)
    assert re.search(r"4241\s+broken\s+train\s+FAILED\s+2\s+train-\[1-2\]\s+1", result.output), result.output


def test_jobs_without_accounting_read_scontrol(aws: dict[str, Any], tmp_path: Path, write_stack: Any) -> None:
    path = str(write_stack(slurm_config(accounting=False), "slurmy"))
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page("==gpucluster:squeue\n==gpucluster:scontrol\nJobId=7 JobName=a b "
                          "UserId=ec2-user(1000) JobState=COMPLETED Reason=None ExitCode=0:0 NumNodes=1 "
                          "Partition=train NodeList=train-1\n"))
        result = cli("jobs", path, "--json")
    assert result.exit_code == 0, result.output
    assert [(j["job_id"], j["name"], j["state"]) for j in json.loads(result.output)["jobs"]] == [
        ("7", "a b", "COMPLETED")]
    assert "sacct" not in scripts(aws)[0][1]


def test_a_long_listing_is_read_a_page_at_a_time(aws: dict[str, Any], stack: str) -> None:
    lines = "".join(f"{n}|job-{n}|PENDING|2||train|Priority\n" for n in range(1000, 2400))
    out = "==gpucluster:squeue\n" + lines + "==gpucluster:sacct\n"
    total = len(out.encode())
    assert 40_000 < total <= 60_000  # three pages: more than SSM returns at once
    first = (f"==gpucluster:capture\n/tmp/gpucluster-out.AbCd1234\n==gpucluster:rc\n0\n"
             f"==gpucluster:size\n{total}\n==gpucluster:read\n20000\n==gpucluster:output\n{out[:20000]}")
    with Stubber(aws["ssm"]) as stub:
        answer(stub, first)
        for n, start in enumerate((20000, 40000), start=1):
            part = out[start:start + 20000]
            answer(stub, f"==gpucluster:size\n{total}\n==gpucluster:read\n{len(part)}\n==gpucluster:output\n"
                         f"{part}", n=n)
        result = cli("jobs", stack, "--json")
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert [j["job_id"] for j in json.loads(result.output)["jobs"]] == [str(n) for n in range(1000, 2400)]
    reads = [script for _, script in scripts(aws)[1:]]
    assert ["f=/tmp/gpucluster-out.AbCd1234" in r and f"tail -c +{start + 1} " in r and 'rm -f -- "$f"' in r
            for r, start in zip(reads, (20000, 40000), strict=True)] == [True, True]


CANCEL = """==gpucluster:before
JobId=4243 JobName=pretrain JobState={before} Reason=None ExitCode=0:0 NumNodes=2 Partition=train
==gpucluster:scancel
{scancel}exit={code}
==gpucluster:job
{after}
"""


@pytest.mark.parametrize(("before", "scancel", "code", "after", "exit_code", "said"), [
    ("RUNNING", "scancel: Terminating job 4243\n", 0,
     "JobId=4243 JobName=pretrain JobState=CANCELLED Reason=None ExitCode=0:15 NumNodes=2 Partition=train",
     0, "job 4243: cancelled (Slurm state now CANCELLED)"),
    ("COMPLETED", "", 0, "JobId=4243 JobName=pretrain JobState=COMPLETED ExitCode=0:0 NumNodes=2", 1,
     "job 4243 not cancelled: it had already ended (COMPLETED)"),
    (None, "scancel: error: Kill job error on job id 4243: Invalid job id specified\n", 0,
     "slurm_load_jobs error: Invalid job id specified", 1, "job 4243 not cancelled: Slurm has no such job"),
    ("RUNNING", "scancel: error: Kill job error on job id 4243: Access/permission denied\n", 1,
     "JobId=4243 JobName=pretrain JobState=RUNNING ExitCode=0:0 NumNodes=2", 1,
     "job 4243 not cancelled: scancel refused: scancel: error: Kill job error on job id 4243: "
     "Access/permission denied"),
])
def test_cancel_reports_what_scancel_did(aws: dict[str, Any], stack: str, before: str | None, scancel: str,
                                         code: int, after: str, exit_code: int, said: str) -> None:
    out = CANCEL.format(before=before, scancel=scancel, code=code, after=after)
    if before is None:
        out = out.replace(out.splitlines()[1], "slurm_load_jobs error: Invalid job id specified")
    with Stubber(aws["ssm"]) as stub:
        answer(stub, out)
        result = cli("cancel", stack, "4243", "--yes")
    assert result.exit_code == exit_code, result.output
    assert said in one_line(result), result.output
    assert "scancel --verbose 4243" in scripts(aws)[0][1]


def test_cancel_and_logs_take_a_job_id(aws: dict[str, Any], stack: str) -> None:
    result = cli("cancel", stack, "pretrain", "--yes")
    assert result.exit_code == 2 and "a Slurm job id (digits" in one_line(result)
    result = cli("logs", stack, "12", "--node", "0")
    assert result.exit_code == 2 and "--node: a Slurm job id names one job" in one_line(result)


# ---------------------------------------------------------------------------- logs

LOCATE = """==gpucluster:job
JobId=4243 JobName=pretrain JobState=RUNNING Reason=None ExitCode=0:0 NumNodes=2 Partition=train \
BatchHost=train-1 StdOut=/home/ec2-user/gpucluster-pretrain-4243.out
==gpucluster:node
NodeName=train-1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.1.11 NodeHostName=ip-10-0-1-11 State=ALLOCATED
"""


def test_logs_reads_the_output_file_on_the_batch_host(aws: dict[str, Any], stack: str) -> None:
    with Stubber(aws["ssm"]) as stub:
        answer(stub, LOCATE)
        answer(stub, "==gpucluster:size\n40\n==gpucluster:output\nstep 1 loss 2.0\nstep 2 loss 1.9\n", n=1)
        result = cli("logs", stack, "4243", "--lines", "50")
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("step 1 loss 2.0\nstep 2 loss 1.9\n")
    (login, locate), (host, tail) = scripts(aws)
    assert (login, host) == (aws["ids"]["login"], aws["ids"]["train-1"])  # matched by NodeAddr
    assert "scontrol --oneliner show job 4243" in locate
    assert "f=/home/ec2-user/gpucluster-pretrain-4243.out" in tail and 'tail -n 50 -- "$f"' in tail


def test_logs_of_a_pending_job_says_there_is_no_output_yet(aws: dict[str, Any], stack: str) -> None:
    with Stubber(aws["ssm"]) as stub:
        answer(stub, "==gpucluster:job\nJobId=9 JobName=x JobState=PENDING Reason=Resources ExitCode=0:0 "
                     "NumNodes=2 Partition=train BatchHost= StdOut=/home/u/x.out\n==gpucluster:node\n")
        result = cli("logs", stack, "9")
    assert result.exit_code == 2 and "job 9 is PENDING: it has no batch host yet" in one_line(result)


def test_logs_follow_streams_until_the_job_ends(aws: dict[str, Any], stack: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.ops import slurmjobs

    # No wait between polls: `follow_output`'s `sleep` default is bound when the module loads, so
    # patching time.sleep left it sleeping its real poll interval (10 s a test).
    no_wait = functools.partial(slurmjobs.follow_output, sleep=lambda _s: None)
    monkeypatch.setattr(slurmjobs, "follow_output", no_wait)
    with Stubber(aws["ssm"]) as stub:
        answer(stub, LOCATE)
        answer(stub, "==gpucluster:size\n13\n==gpucluster:read\n7\n==gpucluster:output\nstep 1\n", n=1)
        # 6 of the 13 bytes left: read on at once, no sleep, no question to the controller
        answer(stub, "==gpucluster:size\n13\n==gpucluster:read\n6\n==gpucluster:output\nstep 2", n=2)
        answer(stub, LOCATE, n=3)  # still running
        answer(stub, "==gpucluster:size\n20\n==gpucluster:read\n7\n==gpucluster:output\n\nstep 3", n=4)
        answer(stub, LOCATE.replace("JobState=RUNNING", "JobState=COMPLETED"), n=5)
        answer(stub, "==gpucluster:size\n20\n==gpucluster:read\n0\n==gpucluster:output\n", n=6)
        result = cli("logs", stack, "4243", "--follow")
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    assert result.stdout == "step 1\nstep 2\nstep 3"
    tails = [s for i, s in scripts(aws) if i == aws["ids"]["train-1"]]
    assert [re.search(r"tail -c \+(\d+) ", t).group(1) for t in tails] == ["1", "8", "14", "21"]
    assert "job 4243: COMPLETED" in result.stderr


# --------------------------------------------------------------------------- nodes


def test_nodes_show_slurm_state_beside_ec2(aws: dict[str, Any], stack: str) -> None:
    sinfo = ("train-1|train|allocated|10.0.1.11|ip-10-0-1-11|none\n"
             "train-2|train|drained|ip-10-0-1-12|ip-10-0-1-12|gpucluster: xid 79\n"
             "train-3|train|idle~|train-3|train-3|none\n")
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(sinfo))
        result = cli("nodes", stack, "--json")
    assert result.exit_code == 0, result.output
    nodes = json.loads(result.output)["nodes"]
    assert [(n["slurm_node"], n["slurm_state"], n["instance_id"], n["ec2_state"], n["reason"])
            for n in nodes] == [
        ("train-1", "allocated", aws["ids"]["train-1"], "running", None),
        ("train-2", "drained", aws["ids"]["train-2"], "running", "gpucluster: xid 79"),
        ("train-3", "idle~", None, None, None),
        (None, None, aws["ids"]["login"], "running", None)]  # the login node: no Slurm node for it
    assert "sinfo --noheader --Node '--format=%N|%R|%T|%o|%n|%E'" in scripts(aws)[0][1]
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(sinfo))
        result = cli("nodes", stack, "--group", "train")
    assert result.exit_code == 0
    assert re.search(r"train-2\s+train\s+drained\s+i-\w+\s+p5.48xlarge\s+10.0.1.12\s+running\s+"
                     r"gpucluster: xid 79", result.output), result.output


# --------------------------------------------------------------------------- login


def test_login_prints_the_session_command(aws: dict[str, Any], stack: str, base_config: dict[str, Any],
                                          write_stack: Any) -> None:
    result = cli("login", stack)
    assert result.exit_code == 0
    assert result.output.strip() == f"aws ssm start-session --target {aws['ids']['login']} --region us-east-1"
    doc = json.loads(cli("login", stack, "--json").output)
    assert (doc["instance_id"], doc["private_ip"]) == (aws["ids"]["login"], "10.0.1.10")
    assert doc["command"][:4] == ["aws", "ssm", "start-session", "--target"]
    result = cli("login", str(write_stack(base_config, "plain")))
    assert result.exit_code == 2 and "scheduler type none" in one_line(result)


# ------------------------------------------------------------------ the ops pieces


def test_find_login_node_ignores_other_stacks(aws: dict[str, Any], stack: str) -> None:
    spec = load_stack(stack)[2]
    clients = lambda service: aws["ssm"] if service == "ssm" else aws["ec2"]  # noqa: E731
    assert find_login_node(spec, clients=clients).private_ip == "10.0.1.10"
    aws["ec2"].terminate_instances(InstanceIds=[aws["ids"]["login"]])
    with pytest.raises(SlurmError, match="no running Slurm login node"):
        find_login_node(spec, clients=clients)


def test_run_script_waits_past_invocation_does_not_exist_and_stops_at_its_deadline() -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    slept: list[float] = []
    ticks = iter(range(0, 10_000, 30))
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        stub.add_client_error("get_command_invocation", "InvocationDoesNotExist")
        stub.add_response("get_command_invocation", {"Status": "Success", "ResponseCode": 0,
                                                     "StandardOutputContent": "ok"})
        done = run_script(ssm, "i-1", "true", comment="t", sleep=slept.append, clock=lambda: 0.0)
    assert (done.ok, done.stdout, slept) == (True, "ok", [1.0])
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        for _ in range(7):
            stub.add_response("get_command_invocation", {"Status": "InProgress"})
        done = run_script(ssm, "i-1", "sleep 999", comment="t", timeout_seconds=120, sleep=slept.append,
                          clock=lambda: float(next(ticks)))
    assert done.status == "NoAnswer" and not done.ok
    # The runner's policy (issue 32): a throttled poll is asked again, a refused one is raised at once.
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        stub.add_client_error("get_command_invocation", "ThrottlingException")
        stub.add_response("get_command_invocation", {"Status": "Success", "ResponseCode": 0})
        assert run_script(ssm, "i-1", "true", comment="t", sleep=slept.append, clock=lambda: 0.0).ok
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        stub.add_client_error("get_command_invocation", "AccessDeniedException")
        with pytest.raises(ClientError, match="AccessDeniedException"):
            run_script(ssm, "i-1", "true", comment="t", sleep=slept.append, clock=lambda: 0.0)
        stub.assert_no_pending_responses()


def test_submit_and_refusal_on_a_none_stack() -> None:
    spec = parse_stack_config(base(), stack="t")
    assert refusal(spec, "hostfile") is None
    slurm = parse_stack_config(slurm_config(), stack="t")
    assert "runs Slurm" in (refusal(slurm, "hostfile") or "")
    with pytest.raises(SlurmError, match="command: is empty"):
        plan_submit(slurm, "train", "  ")
    sub = plan_submit(slurm, "train", "true", name="x")
    assert sub.job.nodes == 4  # desired 0: the group's max_nodes
    assert "#SBATCH --requeue" not in sub.sbatch_script  # on-demand, no --restart-on-replace
    assert "#SBATCH --requeue" in plan_submit(slurm, "train", "true", restart_on_replace=True).sbatch_script
    assert callable(submit)


def test_a_none_stack_refuses_nodes_option(base_config: dict[str, Any], write_stack: Any) -> None:
    path = str(write_stack(base_config, "plain"))
    result = cli("run", path, "--group", "gpu", "--nodes", "2", "--", "true")
    assert result.exit_code == 2 and "--nodes: only on a Slurm stack" in one_line(result)


# --------------------------------------------------------------------------- spend

# sacct --noheader --parsable2 --allocations --allusers --format=JobID,User,Partition,NNodes,ElapsedRaw,
# Start,End,State,AllocTRES,JobName, as Slurm prints it (a pending job: Start/End Unknown, no AllocTRES).
SACCT = "".join(line + "\n" for line in (
    "41|alice|train|2|3600|2026-11-20T10:00:00|2026-11-20T11:00:00|COMPLETED|"
    "billing=384,cpu=384,gres/gpu=16,mem=4000G,node=2|pretrain",
    "42|bob|train|1|1800|2026-11-20T12:00:00|2026-11-20T12:30:00|FAILED|"
    "billing=192,cpu=192,gres/gpu=8,mem=2000G,node=1|eval",
    "43|alice|train|2|0|Unknown|Unknown|PENDING||next",
    "44|carol|train|2|7200|2026-11-19T23:00:00|2026-11-20T01:00:00|CANCELLED by 1001|"
    "billing=384,cpu=384,gres/gpu=16,node=2|spans|with bar",
    "45|bob|spot-a10|1|600|2026-11-20T23:30:00|Unknown|RUNNING|billing=4,cpu=4,gres/gpu=1,node=1|live",
    "46|dave|debug|1|3600|2026-11-20T05:00:00|2026-11-20T06:00:00|COMPLETED|cpu=2,node=1|elsewhere",
))
START, END = datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)


def test_usage_clips_each_job_to_the_window_and_reads_its_gpus() -> None:
    jobs = {j.job_id: j for j in parse_usage(SACCT, START, END, NOW)}
    assert {k: (j.hours, j.gpus, j.nodes) for k, j in jobs.items()} == {
        "41": (1.0, 16, 2), "42": (0.5, 8, 1), "43": (0.0, 0, 2), "44": (1.0, 16, 2), "45": (0.5, 1, 1),
        "46": (1.0, 0, 1)}
    assert (jobs["44"].name, jobs["44"].state) == ("spans|with bar", "CANCELLED")
    rows = {r.key: r for r in priced(jobs.values(), "user", {"train": 100.0, "spot-a10": 1.0})}
    assert (rows["alice"].jobs, rows["alice"].gpu_hours, rows["alice"].usd) == (1, 16.0, 200.0)
    assert (rows["bob"].gpu_hours, rows["bob"].usd) == (4.5, 50.5)
    assert rows["dave"].usd is None  # partition debug is no node group's: unpriced
    by_job = priced(jobs.values(), "job", {"train": 100.0, "spot-a10": 1.0, "debug": 0.0})
    assert [r.key for r in by_job] == ["41", "44", "42", "45", "46"]  # GPU-hours, largest first


class Fixed(datetime):
    """`datetime` whose now() is NOW: the window (`--days 3`) and a running job's end."""

    @classmethod
    def now(cls, tz: Any = None) -> Fixed:  # type: ignore[override]
        return cls.fromtimestamp(NOW.timestamp(), tz)


def test_spend_by_user_and_job_prices_sacct_like_cost(aws: dict[str, Any], stack: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.cli import spend as spend_cli
    from gpucluster.ops import slurmjobs

    monkeypatch.setattr(spend_cli, "datetime", Fixed)
    monkeypatch.setattr(slurmjobs, "datetime", Fixed)
    spec = load_stack(stack)[2]
    prices = node_hour_prices(spec)
    assert prices["train"].usd_per_hour > 50  # a p5.48xlarge node-hour, on demand
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SACCT))
        result = cli("spend", stack, "--by", "user", "--days", "3", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {r["key"]: r for r in doc["rows"]}
    assert rows["alice"]["gpu_hours"] == 16.0
    assert rows["alice"]["usd"] == round(2.0 * prices["train"].usd_per_hour, 2)
    assert rows["bob"]["gpu_hours"] == 4.5  # eval 0.5 h x 8, live 0.5 h x 1 (running until now)
    assert doc["period"] == {"start": "2026-11-18T00:00:00+00:00", "end": "2026-11-21T00:00:00+00:00"}
    [(_, script)] = scripts(aws)
    assert "export TZ=UTC" in script and "--format=JobID,User,Partition,NNodes,ElapsedRaw,Start,End,State," \
        "AllocTRES,JobName" in script
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SACCT))
        result = cli("spend", stack, "--by", "job", "--days", "3")
    assert result.exit_code == 0, result.output
    assert re.search(r"41\s+2.00\s+16.00\s+[\d,.]+\s+pretrain \(alice, train, COMPLETED\)", result.output)
    assert "unpriced" in result.output


def test_spend_by_prices_each_group_as_cost_does(aws: dict[str, Any], stack: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`spend --by` and `cost` show the same node-hour price and basis per group (the spot group too)."""
    from gpucluster.cli import spend as spend_cli
    from gpucluster.ops import slurmjobs

    monkeypatch.setattr(spend_cli, "datetime", Fixed)
    monkeypatch.setattr(slurmjobs, "datetime", Fixed)
    cost = json.loads(cli("cost", stack, "--json").output)
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SACCT))
        result = cli("spend", stack, "--by", "user", "--days", "3", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["usd_per_node_hour"] == {g["name"]: g["usd_per_node_hour"] for g in cost["node_groups"]}
    assert doc["price_basis"] == {g["name"]: g["price_basis"] for g in cost["node_groups"]}
    assert doc["price_basis"]["spot-a10"].startswith("purchase mix at 1 desired node: 1 spot (")
    with Stubber(aws["ssm"]) as stub:
        answer(stub, page(SACCT))
        text = cli("spend", stack, "--by", "user", "--days", "3").output
    assert f"  spot-a10: ${doc['usd_per_node_hour']['spot-a10']:,.4f}/node-hour, purchase mix at 1" in text


def test_spend_by_is_refused_without_slurm_accounting(aws: dict[str, Any], base_config: dict[str, Any],
                                                      write_stack: Any) -> None:
    result = cli("spend", str(write_stack(base_config, "plain")), "--by", "user")
    assert result.exit_code == 2 and "scheduler type none" in one_line(result)
    result = cli("spend", str(write_stack(slurm_config(accounting=False), "noacct")), "--by", "job")
    assert result.exit_code == 2 and "accounting off" in one_line(result)
    result = cli("spend", str(write_stack(slurm_config(), "ok")), "--by", "team")
    assert result.exit_code == 2 and "--by: must be user or job" in one_line(result)
    result = cli("spend", str(write_stack(slurm_config(), "ok")), "--by", "user", "--chart", "x.png")
    assert result.exit_code == 2 and "--chart draws the bill" in one_line(result)
    assert aws["sent"] == []
