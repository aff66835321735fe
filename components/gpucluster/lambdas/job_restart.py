"""Job restart handler: re-launch a `--restart-on-replace` job when its group is back to size.

`gpucluster run --detach --restart-on-replace` stores the job's record as an SSM
parameter under the stack's own path (`jobs_parameter_path`): its command, the
node group's environment, the Auto Scaling group, the node set it was launched
on and how many nodes it needs. EventBridge delivers Auto Scaling's
``EC2 Instance Launch Successful`` (source aws.autoscaling; detail
``AutoScalingGroupName``, ``EC2InstanceId``: EC2 Auto Scaling user guide, "Amazon
EC2 Auto Scaling event reference") for this stack's groups only. When a spot or
health replacement brings the group back to the job's node count with a node
set that differs from the one the job runs on, the handler starts the job again
on every node of the new set: new ranks (launch time, then instance id, as
`gpucluster run`), a new MASTER_ADDR, `GPUCLUSTER_JOB_REPLACE=1` (a survivor stops
its stale run first) and `GPUCLUSTER_RESTART_COUNT`; the node's gpucluster-job
waits for the new node's boot steps and hands the job the newest checkpoint
(`GPUCLUSTER_CHECKPOINT_LATEST`, from the `latest` pointer under
GPUCLUSTER_CHECKPOINT_URI). A job whose end line says it succeeded (the run log
group, `gpucluster logs`) is finished and never started again.

Two launch events of one replacement can both see the group at size; both send
the same ranks to the same nodes, so the later start replaces the earlier one:
one wasted start, never two different node sets. A send retried within one
re-launch (its answer lost, a kill before it was recorded) carries the same
GPUCLUSTER_START_ID, which gpucluster-job on the node checks against its
per-rank marker: the rank is not started twice. Acts only on groups tagged with
its stack, and on their instances (the role's SendCommand condition).

Environment: GPUCLUSTER_STACK (required), RUN_LOG_GROUP, NOTIFY_TOPIC_ARN.
"""

from __future__ import annotations

from typing import Any

from gpucluster.fleet.awsapi import describe_groups, group_tags, log_event
from gpucluster.fleet.jobnames import LAUNCH_SUCCESSFUL, jobs_parameter_path
from gpucluster.fleet.jobrecords import (
    INSTANCE_ID,
    RecordConflict,
    encode_record,
    finished,
    load_records,
    members,
    plan_relaunch,
    ranked_instances,
    relaunch,
    write_record,
)
from gpucluster.fleet.runtime import RUNTIME, env_text, ignored, notify_from_env, stack_from_env
from gpucluster.fleet.tags import STACK_TAG


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the launch rule of this stack's groups."""
    stack = stack_from_env()
    if not isinstance(event, dict) or event.get("source") != "aws.autoscaling" \
            or event.get("detail-type") != LAUNCH_SUCCESSFUL:
        return ignored("not an Auto Scaling launch event", stack=stack)
    detail = event.get("detail")
    if not isinstance(detail, dict):
        detail = {}
    group_name = detail.get("AutoScalingGroupName")
    instance_id = detail.get("EC2InstanceId")
    if not (isinstance(group_name, str) and isinstance(instance_id, str) and INSTANCE_ID.match(instance_id)):
        return ignored("launch event without a group or an instance", stack=stack)
    autoscaling = RUNTIME.client("autoscaling")
    groups = [g for g in describe_groups(autoscaling, [group_name]) if group_tags(g).get(STACK_TAG) == stack]
    if not groups:
        return ignored("group is not this stack's", group=group_name, stack=stack)
    group = groups[0]
    ssm = RUNTIME.client("ssm")
    records = [(n, r) for n, r in load_records(ssm, jobs_parameter_path(stack)) if r.get("asg") == group_name]
    if not records:
        return ignored("no restart-on-replace job on this group", group=group_name)
    current = members(group)
    desired = int(group.get("DesiredCapacity", 0))
    log_group = env_text("RUN_LOG_GROUP")
    summary: dict[str, Any] = {"action": "checked", "stack": stack, "group": group_name, "members": current,
                               "desired": desired, "jobs": {}}
    instances: list[dict[str, Any]] | None = None
    for name, record in records:
        job = record["job"]
        if len(current) != desired or desired != int(record["nnodes"]):
            summary["jobs"][job] = f"waiting: {len(current)} of {record['nnodes']} node(s)"
            continue
        resuming = sorted(current) == sorted(record.get("nodes", []))
        if resuming and set(record.get("sent", record.get("nodes", []))) >= set(record["nodes"]):
            summary["jobs"][job] = "already runs on this node set"
            continue
        if record.get("finished"):
            summary["jobs"][job] = "finished: not started again"
            continue
        if not resuming and finished(RUNTIME.client("logs"), log_group, record):
            ssm.put_parameter(Name=name, Value=encode_record({**record, "finished": True}), Type="String",
                              Overwrite=True)
            summary["jobs"][job] = "finished: not started again"
            continue
        if instances is None:
            instances = ranked_instances(RUNTIME.client("ec2"), current)
        try:
            # The record names the new set before anything is sent (a retry resumes it, never redoes it).
            pending = record if resuming else write_record(ssm, name, plan_relaunch(record, instances))
        except RecordConflict as exc:
            summary["jobs"][job] = f"left to the invocation that recorded it first ({exc})"
            continue
        updated = relaunch(ssm, name, pending, instances, log_group=log_group)
        summary["jobs"][job] = (f"re-launched (restart {updated['restarts']}), "
                                f"MASTER_ADDR {updated['master_addr']}")
        summary["action"] = "relaunched"
        notify_from_env(f"gpucluster {stack}: job {job} re-launched on {len(instances)} node(s)",
                        {**summary, "job": job, "nodes": updated["nodes"], "restarts": updated["restarts"],
                         "resumes_from": "the latest pointer under GPUCLUSTER_CHECKPOINT_URI, if any"})
    log_event("launch event handled", **summary)
    return summary
