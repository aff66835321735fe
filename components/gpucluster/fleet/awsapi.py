"""The AWS helpers the guardrail Lambdas and `gpucluster.ops` share: boto3 and the standard library only.

It owns what every caller of the Auto Scaling, EC2 and SSM APIs needs the same
way: client creation, error codes, per-call batching, the JSON log line, and
selecting a stack's Auto Scaling groups by its identity tag (never by name).
It is carried into the Lambda archive as ``gpucluster.fleet`` and imported by
`ops/`, so it must never import Pulumi or anything outside this directory, and
it never changes anything in AWS: writes belong to a node-group backend (`asg`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from .tags import STACK_TAG

T = TypeVar("T")

AWS_ERRORS = (ClientError, BotoCoreError)

LOG = logging.getLogger("gpucluster.guardrails")
LOG.setLevel(logging.INFO)
# Lambda's root handler still receives every line; a CLI reusing these functions never prints
# raw JSON through logging's last-resort handler.
LOG.addHandler(logging.NullHandler())


def log_event(msg: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log one JSON line, so CloudWatch Logs Insights can filter on the fields."""
    LOG.log(level, json.dumps({"msg": msg, **fields}, default=str, sort_keys=True))


def pricing_region(region: str) -> str:
    """The AWS Price List endpoint nearest `region`: it answers in us-east-1, eu-central-1 and ap-south-1
    only (botocore's endpoints.json, `api.pricing`), each for the prices of every region."""
    if region.startswith("ap-"):
        return "ap-south-1"
    if region.split("-", 1)[0] in ("eu", "me", "af", "il"):
        return "eu-central-1"
    return "us-east-1"


def make_client(service: str) -> Any:
    """Build a plain boto3 client: honours AWS_REGION and AWS_ENDPOINT_URL (the Price List, `pricing`,
    at the endpoint nearest AWS_REGION)."""
    if service == "pricing":
        return boto3.client(service, region_name=pricing_region(os.environ.get("AWS_REGION", "")))
    return boto3.client(service)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("" for other errors)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def batches(items: Sequence[T], size: int) -> list[list[T]]:
    """`items` in order, in runs of at most `size`: what one call of an API with a per-call limit takes."""
    return [list(items[start : start + size]) for start in range(0, len(items), size)]


# --- Auto Scaling groups ---------------------------------------------------------------------


def group_tags(group: Mapping[str, Any]) -> dict[str, str]:
    """Tags of a DescribeAutoScalingGroups entry as a plain dict."""
    return {t["Key"]: t.get("Value", "") for t in group.get("Tags", [])}


def in_service_instance_ids(group: Mapping[str, Any]) -> list[str]:
    """Instances that can run a hook: only InService ones have a live SSM agent."""
    return [
        i["InstanceId"]
        for i in group.get("Instances", [])
        if i.get("LifecycleState") == "InService"
    ]


def stack_groups(autoscaling: Any, stack: str) -> list[dict[str, Any]]:
    """All Auto Scaling groups tagged with this stack, sorted by name."""
    paginator = autoscaling.get_paginator("describe_auto_scaling_groups")
    groups: list[dict[str, Any]] = []
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [stack]}]
    for page in paginator.paginate(Filters=filters):
        # Check again client-side: the filter is a server feature we do not want to trust blindly.
        groups.extend(g for g in page["AutoScalingGroups"] if group_tags(g).get(STACK_TAG) == stack)
    return sorted(groups, key=lambda g: g["AutoScalingGroupName"])


def describe_groups(autoscaling: Any, names: Iterable[str]) -> list[dict[str, Any]]:
    """Groups by name (missing names are simply absent)."""
    wanted = sorted(set(names))
    groups: list[dict[str, Any]] = []
    # DescribeAutoScalingGroups takes at most 100 names per call.
    for batch in batches(wanted, 100):
        paginator = autoscaling.get_paginator("describe_auto_scaling_groups")
        for page in paginator.paginate(AutoScalingGroupNames=batch):
            groups.extend(page["AutoScalingGroups"])
    return sorted(groups, key=lambda g: g["AutoScalingGroupName"])

