"""Job restart handler: a `--restart-on-replace` job starts again on the new node set, and only then.

moto's Auto Scaling groups and SSM parameters; the commands asserted are the calls the handler makes
(recorded), never moto's command list. The record is the one `gpucluster run` writes (`job_record`).
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from conftest import STACK, shared_client
from gpucluster.fleet import jobrecords, runtime
from gpucluster.fleet.jobnames import job_parameter_name, jobs_parameter_path
from gpucluster.lambdas import job_restart
from gpucluster.ops.nodes import Node
from gpucluster.ops.run import job_record, plan_job

LOG_GROUP = "/gpucluster/dev/run"
PATH = jobs_parameter_path(STACK)


def launch_event(group: str, instance_id: str) -> dict[str, Any]:
    """EC2 Auto Scaling user guide, "Amazon EC2 Auto Scaling event reference" (launch successful)."""
    return {
        "version": "0", "id": "5b1d8b2e-0000-0000-0000-000000000000",
        "detail-type": "EC2 Instance Launch Successful", "source": "aws.autoscaling",
        "account": "123456789012", "time": "2026-11-21T08:22:00Z", "region": "us-east-1",
        "resources": [f"arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x:"
                      f"autoScalingGroupName/{group}",
                      f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
        "detail": {"StatusCode": "InProgress", "AutoScalingGroupName": group, "ActivityId": "a",
                   "EC2InstanceId": instance_id, "Cause": "replacing an unhealthy instance",
                   "Details": {"Availability Zone": "us-east-1a"}},
    }


def described(instance_ids: list[str]) -> list[dict[str, Any]]:
    ec2 = shared_client("ec2")
    pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=instance_ids)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def store(name: str, record: dict[str, Any]) -> None:
    shared_client("ssm").put_parameter(Name=name, Value=json.dumps(record), Type="String", Overwrite=True)


def stored(name: str) -> dict[str, Any]:
    return json.loads(shared_client("ssm").get_parameter(Name=name)["Parameter"]["Value"])


def record_for(group: str, nodes: list[str], *, job: str = "pretrain") -> dict[str, Any]:
    """What `gpucluster run --detach --restart-on-replace` stores, for a run on `nodes`."""
    found = [Node(i, "train", group, "g5.12xlarge", "us-east-1a", f"10.0.0.{n + 1}", "on-demand", "running",
                  "InService", "Healthy", None, "Online") for n, i in enumerate(nodes)]
    # the group launches g5.12xlarge and g5.xlarge (what moto's launch template gives replacements)
    environment = {"GPUCLUSTER_CHECKPOINT_URI": "/fsx/checkpoints/", "FI_PROVIDER": "efa"}
    plan = plan_job(found, "torchrun train.py", log_group=LOG_GROUP, detach=job, workdir="/fsx/code",
                    group_environment=environment)
    return job_record(plan, node_group="train", master_port=29400, group_environment=environment,
                      launched_at="2026-11-21T08:00:00+00:00", instance_types=["g5.12xlarge", "g5.xlarge"])


@pytest.fixture
def parameters(moto_account: str) -> Any:
    """Job records are removed after each test (the handler itself never deletes one)."""
    yield
    ssm = shared_client("ssm")
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=PATH):
        for parameter in page["Parameters"]:
            ssm.delete_parameter(Name=parameter["Name"])


def exports(commands: list[str]) -> dict[str, str]:
    return {k: shlex.split(v)[0] for line in commands if line.startswith("export ")
            for k, _, v in [line.removeprefix("export ").partition("=")]}


def test_a_replacement_restarts_the_job_on_the_new_node_set(cluster, recorded, parameters,
                                                            monkeypatch) -> None:
    monkeypatch.setenv("RUN_LOG_GROUP", LOG_GROUP)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    current = cluster.instances("dev-train")
    replaced = "i-0000000000000dead"  # the node the job ran on before the replacement
    name = job_parameter_name(STACK, "pretrain")
    store(name, record_for("dev-train", [replaced, current[1]]))

    result = job_restart.handler(launch_event("dev-train", current[0]), None)

    assert result["action"] == "relaunched", result
    ranked = sorted(described(current), key=lambda i: (i["LaunchTime"], i["InstanceId"]))
    sent = recorded.of("ssm", "send_command")
    assert [s["InstanceIds"] for s in sent] == [[i["InstanceId"]] for i in ranked]  # one per node, rank order
    for rank, (command, instance) in enumerate(zip(sent, ranked, strict=True)):
        lines = command["Parameters"]["commands"]
        env = exports(lines)
        assert env["NODE_RANK"] == str(rank) and env["NNODES"] == "2"
        assert env["MASTER_ADDR"] == ranked[0]["PrivateIpAddress"]  # the new rank 0
        assert env["GPUCLUSTER_NODE_IPS"] == " ".join(i["PrivateIpAddress"] for i in ranked)
        # the replacements are g5.xlarge: one GPU each, from the record's table of the group's types
        assert (env["MASTER_PORT"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == ("29400", "1", "2")
        assert env["GPUCLUSTER_CHECKPOINT_URI"] == "/fsx/checkpoints/" and env["FI_PROVIDER"] == "efa"
        assert (env["GPUCLUSTER_JOB_REPLACE"], env["GPUCLUSTER_RESTART_COUNT"]) == ("1", "1")
        # the per-rank marker gpucluster-job checks: one id per re-launch, the same on every rank
        assert env["GPUCLUSTER_START_ID"].startswith("1-") and len(env["GPUCLUSTER_START_ID"]) > 2
        assert lines[0] == "cloud-init status --wait >/dev/null 2>&1 || true"  # a node still booting
        assert lines[-1] == "exec /usr/local/sbin/gpucluster-job start pretrain /fsx/code 'torchrun train.py'"
        assert command["DocumentName"] == "AWS-RunShellScript"
        assert command["TimeoutSeconds"] == jobrecords.DELIVERY_TIMEOUT_SECONDS
        assert command["CloudWatchOutputConfig"]["CloudWatchLogGroupName"] == LOG_GROUP
        assert instance["InstanceId"] != replaced
    record = stored(name)
    assert record["nodes"] == [i["InstanceId"] for i in ranked] and record["restarts"] == 1
    assert record["command"] == "torchrun train.py" and record["nnodes"] == 2
    published = recorded.of("sns", "publish")
    assert len(published) == 1 and "job pretrain re-launched on 2 node(s)" in published[0]["Subject"]

    # the other launch event of the same replacement: the set is the recorded one now
    again = job_restart.handler(launch_event("dev-train", current[1]), None)
    assert again["jobs"] == {"pretrain": "already runs on this node set"}
    assert len(recorded.of("ssm", "send_command")) == 2


def test_no_restart_until_the_group_is_back_to_the_job_s_size(cluster, recorded, parameters) -> None:
    current = cluster.instances("dev-train")
    store(job_parameter_name(STACK, "wide"), record_for("dev-train", [*current, "i-0000000000000abc"],
                                                        job="wide"))
    result = job_restart.handler(launch_event("dev-train", current[0]), None)
    assert result["jobs"] == {"wide": "waiting: 2 of 3 node(s)"}
    assert recorded.of("ssm", "send_command") == []


def test_a_job_that_ended_well_is_never_started_again(cluster, recorded, parameters, monkeypatch) -> None:
    monkeypatch.setenv("RUN_LOG_GROUP", LOG_GROUP)
    current = cluster.instances("dev-train")
    name = job_parameter_name(STACK, "pretrain")
    old = ["i-0000000000000dead", current[1]]
    store(name, record_for("dev-train", old))

    calls: list[dict[str, Any]] = []

    class Logs:
        def filter_log_events(self, **kwargs: Any) -> dict[str, Any]:
            calls.append(kwargs)
            line = "gpucluster-job: pretrain ended: result success, exit status 0 2026-11-21T09:00:00+00:00"
            return {"events": [{"eventId": "1", "timestamp": 1, "logStreamName": kwargs["logStreamNames"][1],
                                "message": line}]}

    recorded.fakes["logs"] = Logs()
    result = job_restart.handler(launch_event("dev-train", current[0]), None)
    assert result["jobs"] == {"pretrain": "finished: not started again"}
    assert recorded.of("ssm", "send_command") == []
    [query] = calls
    assert query["logGroupName"] == LOG_GROUP
    assert query["logStreamNames"] == [f"{i}__var_log_gpucluster_jobs_pretrain.log" for i in old]
    assert query["filterPattern"] == '"gpucluster-job: pretrain ended: result success, exit status 0"'
    assert query["startTime"] == int(datetime(2026, 11, 21, 8, tzinfo=UTC).timestamp() * 1000)
    assert stored(name)["finished"] is True
    assert job_restart.handler(launch_event("dev-train", current[0]), None)["jobs"] == {
        "pretrain": "finished: not started again"}  # and it does not ask again


def test_a_job_whose_log_has_no_stream_yet_is_not_finished(cluster, recorded, parameters,
                                                           monkeypatch) -> None:
    """No run log group stream (the job wrote nothing before the node died): it restarts."""
    monkeypatch.setenv("RUN_LOG_GROUP", LOG_GROUP)  # moto has no such group: ResourceNotFoundException
    current = cluster.instances("dev-train")
    store(job_parameter_name(STACK, "pretrain"), record_for("dev-train", ["i-0000000000000dead", current[1]]))
    assert job_restart.handler(launch_event("dev-train", current[0]), None)["action"] == "relaunched"


def test_only_its_own_stack_s_groups_and_jobs(cluster, recorded, parameters) -> None:
    prod_node = cluster.instances("prod-train")[0]
    # a record of this stack naming the other stack's group: never acted on
    store(job_parameter_name(STACK, "sneaky"),
          record_for("prod-train", ["i-0000000000000dead"], job="sneaky"))
    result = job_restart.handler(launch_event("prod-train", prod_node), None)
    assert result == {"action": "ignored", "reason": "group is not this stack's"}
    assert recorded.of("ssm", "send_command") == []
    # the other stack's records live under its own path, which this handler never reads
    assert jobs_parameter_path("prod") != PATH and not jobs_parameter_path("prod").startswith(PATH)
    dev_node = cluster.instances("dev-infer")[0]
    assert job_restart.handler(launch_event("dev-infer", dev_node), None)["reason"] == \
        "no restart-on-replace job on this group"
    for event in ({"source": "aws.ec2", "detail-type": "EC2 Instance Launch Successful"},
                  {**launch_event("dev-train", "i-1"), "detail": {"AutoScalingGroupName": "dev-train"}},
                  "not an event"):
        assert job_restart.handler(event, None)["action"] == "ignored"


def test_a_start_that_cannot_be_sent_fails_the_invocation_for_a_retry(cluster, recorded, parameters) -> None:
    current = cluster.instances("dev-train")
    name = job_parameter_name(STACK, "pretrain")
    store(name, record_for("dev-train", ["i-0000000000000dead", current[1]]))

    class RefusingSsm:
        def __init__(self) -> None:
            self.real = shared_client("ssm")

        def send_command(self, **kwargs: Any) -> Any:
            error = {"Error": {"Code": "InvalidInstanceId", "Message": "not managed"}}
            raise ClientError(error, "SendCommand")

        def __getattr__(self, item: str) -> Any:
            return getattr(self.real, item)

    recorded.fakes["ssm"] = RefusingSsm()
    with pytest.raises(runtime.GuardrailError, match="the start was not sent to"):
        job_restart.handler(launch_event("dev-train", current[0]), None)
    # The relaunch was recorded before any send, with nothing sent: the retry resumes it.
    pending = stored(name)
    assert (pending["restarts"], pending["sent"], sorted(pending["nodes"])) == (1, [], sorted(current))
    del recorded.fakes["ssm"]
    job_restart.handler(launch_event("dev-train", current[0]), None)
    done = stored(name)
    assert done["restarts"] == 1 and sorted(done["sent"]) == sorted(current)  # one restart, not two


def test_a_retry_sends_only_to_the_ranks_that_never_got_the_start(cluster, recorded, parameters) -> None:
    current = cluster.instances("dev-train")
    name = job_parameter_name(STACK, "pretrain")
    store(name, record_for("dev-train", ["i-0000000000000dead", current[1]]))

    class SecondRefused:
        def __init__(self) -> None:
            self.real, self.sends = shared_client("ssm"), 0

        def send_command(self, **kwargs: Any) -> Any:
            self.sends += 1
            if self.sends == 2:
                # a refusal: throttling is retried by the runner since issue 32
                error = {"Error": {"Code": "InvalidInstanceId", "Message": "not a managed node"}}
                raise ClientError(error, "SendCommand")
            return self.real.send_command(**kwargs)

        def __getattr__(self, item: str) -> Any:
            return getattr(self.real, item)

    recorded.fakes["ssm"] = SecondRefused()
    with pytest.raises(runtime.GuardrailError, match="the start was not sent to"):
        job_restart.handler(launch_event("dev-train", current[0]), None)
    first = [s["InstanceIds"][0] for s in recorded.of("ssm", "send_command")]
    assert stored(name)["sent"] == first[:1]
    del recorded.fakes["ssm"]
    job_restart.handler(launch_event("dev-train", current[1]), None)  # Lambda's retry, or the next event
    sends = [s["InstanceIds"][0] for s in recorded.of("ssm", "send_command")]
    assert sends[2:] == [first[1]]  # only the rank that never got it; rank 0 is not started twice
    assert sorted(stored(name)["sent"]) == sorted(current) and stored(name)["restarts"] == 1


def test_two_invocations_at_once_relaunch_once(cluster, recorded, parameters) -> None:
    current = cluster.instances("dev-train")
    name = job_parameter_name(STACK, "pretrain")
    store(name, record_for("dev-train", ["i-0000000000000dead", current[1]]))
    inner: list[Any] = []

    class Racing:
        """The second launch event's invocation runs between this one's read and its first write."""

        def __init__(self) -> None:
            self.real, self.raced = shared_client("ssm"), False

        def put_parameter(self, **kwargs: Any) -> Any:
            if not self.raced:
                self.raced = True
                recorded.fakes.pop("ssm")
                inner.append(job_restart.handler(launch_event("dev-train", current[1]), None))
                recorded.fakes["ssm"] = self
            return self.real.put_parameter(**kwargs)

        def __getattr__(self, item: str) -> Any:
            return getattr(self.real, item)

    recorded.fakes["ssm"] = Racing()
    outer = job_restart.handler(launch_event("dev-train", current[0]), None)
    assert inner[0]["action"] == "relaunched"
    assert "left to the invocation that recorded it first" in outer["jobs"]["pretrain"]
    sends = [s["InstanceIds"][0] for s in recorded.of("ssm", "send_command")]
    assert sorted(sends) == sorted(current)  # each node got the start once
    assert stored(name)["restarts"] == 1


def test_record_size_is_bounded_by_the_standard_tier() -> None:
    record = record_for("dev-train", ["i-0000000000000001"])
    assert record["gpus"] == {"g5.12xlarge": 4, "g5.xlarge": 1}  # every type the group may launch
    assert len(jobrecords.encode_record(record)) < jobrecords.MAX_RECORD_CHARS
    with pytest.raises(ValueError, match="SSM's Standard parameters hold 4096"):
        jobrecords.encode_record({**record, "command": "x" * 4096})
