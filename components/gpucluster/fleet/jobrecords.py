"""A `--restart-on-replace` job's record and its re-launch: what `gpucluster run` stores and the
restart handler (`lambdas.job_restart`) acts on.

The record is an SSM parameter under the stack's own path (`jobnames.jobs_parameter_path`): the
command, the node group's environment, the Auto Scaling group, the node set it runs on and how many
nodes it needs. The rank environments and the start lines here are the ones `gpucluster run`
sends, so a re-launch starts the job exactly as the first launch did, on the new node set. Every
write is a compare-and-set on the parameter's version (`write_record`): two invocations never both
re-launch. Never deletes anything, never imports Pulumi.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .awsapi import AWS_ERRORS, error_code, log_event
from .jobnames import (  # apart from this module, which needs boto3: the program uses them too
    job_log_stream,
)
from .nodepaths import CHECKPOINT_DONE, CHECKPOINT_REQUEST, JOB_TOOL
from .runcommand import Deadline, send_command
from .runtime import RUNTIME, GuardrailError

RECORD_VERSION = 1
# SSM PutParameter, Standard tier: values up to 4 KB (Systems Manager user guide, "Managing
# parameter tiers").
MAX_RECORD_CHARS = 4096
# A re-launched node may still be booting when the command arrives: SSM holds it until the agent
# is online (SendCommand TimeoutSeconds, delivery), gpucluster-job waits for the boot steps.
DELIVERY_TIMEOUT_SECONDS = 3600
EXECUTION_TIMEOUT_SECONDS = 7200
SEND_RETRY_SECONDS = 30.0
"""A relaunch retries throttled sends this long in all (the runner's policy; the handler has 120 s)."""
# Auto Scaling lifecycle states of a member that is, or is about to be, in service.
MEMBER_STATES = frozenset({"Pending", "Pending:Wait", "Pending:Proceed", "InService"})
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")


# ------------------------------------------------------------------ names and the record


def encode_record(record: Mapping[str, Any]) -> str:
    """The record as stored; ValueError past the Standard tier's size."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_RECORD_CHARS:
        raise ValueError(f"the job's record is {len(text)} characters; SSM's Standard parameters hold "
                         f"{MAX_RECORD_CHARS}: shorten the command (a script on the nodes) or its "
                         "environment")
    return text


# ------------------------------------------------------------------- ranks and the start


def rank_environments(ips: Sequence[str], gpus: Sequence[int], *, master_port: int,
                      group_environment: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Each rank's environment (torchrun's, plus gpucluster's), for nodes already in rank order.

    NPROC_PER_NODE is the node's GPU count (its MIG devices in a MIG group); WORLD_SIZE their sum;
    MASTER_ADDR rank 0's address.
    `gpucluster run` and this handler both build ranks here, so a re-launch is the launch again.
    """
    nprocs = [max(1, g) for g in gpus]
    shared = {
        "MASTER_ADDR": str(ips[0]),
        "MASTER_PORT": str(master_port),
        "NNODES": str(len(ips)),
        "WORLD_SIZE": str(sum(nprocs)),
        "GPUCLUSTER_NODE_IPS": " ".join(ips),
        "GPUCLUSTER_CHECKPOINT_REQUEST": CHECKPOINT_REQUEST,
        "GPUCLUSTER_CHECKPOINT_DONE": CHECKPOINT_DONE,
        **dict(group_environment or {}),
    }
    return [{**shared, "NODE_RANK": str(rank), "NPROC_PER_NODE": str(nproc)}
            for rank, nproc in enumerate(nprocs)]


def start_lines(environment: Mapping[str, str], job: str, workdir: str | None, command: str,
                job_timeout_seconds: int | None = None) -> list[str]:
    """AWS-RunShellScript `commands` that start `job` under gpucluster-job with this environment."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in environment.items()]
    if job_timeout_seconds:
        lines.append(f"export GPUCLUSTER_JOB_TIMEOUT_SECONDS={job_timeout_seconds}")
    lines.append(f"exec {JOB_TOOL} start {job} {shlex.quote(workdir or '/')} {shlex.quote(command)}")
    return lines


def restart_lines(environment: Mapping[str, str], record: Mapping[str, Any], restart: int) -> list[str]:
    """The start, on a node that may still be booting: wait for cloud-init to write gpucluster-job.

    GPUCLUSTER_START_ID (the restart count and when it was planned: unique per re-launch) is the
    per-rank marker gpucluster-job checks: a send retried after its answer was lost, or after a kill
    before the send was recorded, finds the rank started and leaves it running.
    """
    start_id = f"{restart}-{record.get('launched_at', '')}"
    environment = {**environment, "GPUCLUSTER_JOB_REPLACE": "1", "GPUCLUSTER_RESTART_COUNT": str(restart),
                   "GPUCLUSTER_START_ID": start_id}
    lines = start_lines(environment, record["job"], record.get("workdir"), record["command"],
                        record.get("job_timeout_seconds"))
    return ["cloud-init status --wait >/dev/null 2>&1 || true", *lines]


# ------------------------------------------------------------------------------ handler


def load_records(ssm: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """(parameter name, record) of every job record under the stack's path; unreadable ones skipped.

    Each record carries the parameter's version it was read at under VERSION_KEY (not stored).
    """
    records = []
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=path, Recursive=False):
        for parameter in page["Parameters"]:
            try:
                record = json.loads(parameter["Value"])
            except ValueError:
                log_event("unreadable job record", logging.WARNING, name=parameter["Name"])
                continue
            if isinstance(record, dict) and record.get("version") == RECORD_VERSION:
                record[VERSION_KEY] = parameter.get("Version")
                records.append((parameter["Name"], record))
    return records


VERSION_KEY = "_parameter_version"


class RecordConflict(GuardrailError):
    """Another invocation wrote the job's record since this one read it: it does the relaunch."""


def write_record(ssm: Any, name: str, record: dict[str, Any]) -> dict[str, Any]:
    """Overwrite the job's record only if nobody wrote it since it was read; the record as written.

    SSM PutParameter has no condition, but every write makes a new version: a write that does not
    land on the version after the one read had another writer in between (two launch events of one
    replacement, a retry). The loser raises `RecordConflict` and sends nothing.
    """
    expected = record.get(VERSION_KEY)
    body = {k: v for k, v in record.items() if k != VERSION_KEY}
    answer = ssm.put_parameter(Name=name, Value=encode_record(body), Type="String", Overwrite=True)
    version = answer.get("Version")
    if isinstance(expected, int) and isinstance(version, int) and version != expected + 1:
        raise RecordConflict(f"job record {name} changed since read (version {expected} -> {version})")
    return {**body, VERSION_KEY: version}


def members(group: Mapping[str, Any]) -> list[str]:
    """Instances that are, or are about to be, in service and healthy."""
    return [i["InstanceId"] for i in group.get("Instances", [])
            if i.get("LifecycleState") in MEMBER_STATES and i.get("HealthStatus", "Healthy") == "Healthy"]


def ranked_instances(ec2: Any, instance_ids: Sequence[str]) -> list[dict[str, Any]]:
    """EC2's view of the members in rank order: launch time, then instance id (gpucluster run's)."""
    found: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=list(instance_ids)):
        found += [i for r in page["Reservations"] for i in r["Instances"]]

    def key(instance: Mapping[str, Any]) -> tuple[float, str]:
        launched = instance.get("LaunchTime")
        when = launched.timestamp() if isinstance(launched, datetime) else float("inf")
        return (when, instance["InstanceId"])

    return sorted(found, key=key)


def finished(logs: Any, log_group: str | None, record: Mapping[str, Any]) -> bool:
    """Did the job end successfully on a node of its current set (its end line in the run log group)?"""
    if not log_group or not record.get("nodes"):
        return False
    launched = datetime.fromisoformat(record["launched_at"])
    pattern = f'"gpucluster-job: {record["job"]} ended: result success, exit status 0"'
    kwargs: dict[str, Any] = {
        "logGroupName": log_group, "filterPattern": pattern, "limit": 1,
        "logStreamNames": [job_log_stream(i, record["job"]) for i in record["nodes"]][:100],
        "startTime": int(launched.timestamp() * 1000)}
    try:
        while True:
            page = logs.filter_log_events(**kwargs)
            if page.get("events"):
                return True
            if not page.get("nextToken") or page["nextToken"] == kwargs.get("nextToken"):
                return False
            kwargs["nextToken"] = page["nextToken"]
    except AWS_ERRORS as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False  # no stream yet: the job wrote nothing, so it did not finish
        raise


def plan_relaunch(record: dict[str, Any], instances: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The record of a relaunch on `instances` before anything is sent: who runs which rank, none sent."""
    ips = [i.get("PrivateIpAddress") for i in instances]
    if not all(ips):
        raise GuardrailError("a node of the new set has no private address yet: try again")
    return {**record, "nodes": [i["InstanceId"] for i in instances],
            "restarts": int(record.get("restarts", 0)) + 1, "launched_at": RUNTIME.now().isoformat(),
            "master_addr": ips[0], "sent": []}


def relaunch(ssm: Any, name: str, record: dict[str, Any], instances: Sequence[Mapping[str, Any]], *,
             log_group: str | None) -> dict[str, Any]:
    """Send the job's start to each rank of the recorded node set not sent yet; the record as it stands.

    The record names the new set before any send (`plan_relaunch`, written by the caller), and each
    rank's send is recorded right after it lands, so a retried invocation sends only to the ranks
    that never got it: the job starts once per node.
    """
    by_id = {i["InstanceId"]: i for i in instances}
    nodes = [by_id[n] for n in record["nodes"]]
    gpus = [int(record.get("gpus", {}).get(i.get("InstanceType", ""), 1)) for i in nodes]
    ips = [str(i.get("PrivateIpAddress")) for i in nodes]
    environments = rank_environments(ips, gpus, master_port=int(record["master_port"]),
                                     group_environment=record.get("environment"))
    errors = {}
    deadline = Deadline.after(SEND_RETRY_SECONDS)
    for rank, (instance, environment) in enumerate(zip(nodes, environments, strict=True)):
        if instance["InstanceId"] in record.get("sent", []):
            continue
        try:
            send_command(ssm, [instance["InstanceId"]],
                         restart_lines(environment, record, int(record["restarts"])),
                         comment=f"gpucluster restart {record['job']} rank {rank}",
                         delivery_timeout=DELIVERY_TIMEOUT_SECONDS,
                         execution_timeout=EXECUTION_TIMEOUT_SECONDS, log_group=log_group, deadline=deadline)
        except AWS_ERRORS as exc:
            errors[instance["InstanceId"]] = str(exc)
            continue
        sent = [*record.get("sent", []), instance["InstanceId"]]
        record = write_record(ssm, name, {**record, "sent": sent})
    if errors:
        raise GuardrailError(f"job {record['job']}: the start was not sent to {sorted(errors)}: {errors}")
    return record
