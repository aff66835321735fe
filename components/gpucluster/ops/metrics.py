"""Which of a stack's nodes are writing GPU metrics to its Prometheus workspace: what `gpucluster nodes`
shows in its metrics column when `observability.prometheus` is on.

A node writes when its collector's `up` series for dcgm-exporter reached the workspace in the last
WINDOW (AMP's query API, `POST /workspaces/<id>/api/v1/query` signed with SigV4 for service `aps`:
AMP user guide, "Query using the Prometheus-compatible APIs"). The verdict per node: `writing`,
`exporter down` (the collector writes, dcgm-exporter does not answer it), or `not writing` (nothing
arrived: no route, no aps:RemoteWrite, or the collector is not running; the node's boot log says
which). When the workspace cannot be asked (no aps:QueryMetrics, no workspace yet) every node is
`unknown`, as the SSM column does: the listing is still worth having. Read-only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from gpucluster.dashboards.promql import DCGM_JOB, INSTANCE_LABEL, STACK_LABEL
from gpucluster.fleet.awsapi import AWS_ERRORS
from gpucluster.spec import StackSpec
from gpucluster.spec.observability import remote_write_workspace

WINDOW = "5m"
WRITING, EXPORTER_DOWN, NOT_WRITING, UNKNOWN = "writing", "exporter down", "not writing", "unknown"
QUERY_TIMEOUT_SECONDS = 15


def workspace_query_url(spec: StackSpec, amp: Any) -> str | None:
    """The query endpoint of the stack's workspace: its own (found by alias) or the existing one."""
    from gpucluster.node.metrics import remote_write_url_of

    p = spec.observability.prometheus
    if p.remote_write_url:
        found = remote_write_workspace(p.remote_write_url)
        return p.remote_write_url.removesuffix("remote_write") + "query" if found else None
    alias = "gpucluster-" + spec.identity
    for page in amp.get_paginator("list_workspaces").paginate(alias=alias[:100]):
        for ws in page.get("workspaces", []):
            if ws.get("status", {}).get("statusCode") == "ACTIVE":
                write = remote_write_url_of(spec.region, ws["workspaceId"])
                return write.removesuffix("remote_write") + "query"
    return None


def signed_query(url: str, query: str, region: str, credentials: Any) -> urllib.request.Request:
    """A SigV4-signed POST of `query` to a workspace's query API (botocore signs as the AWS CLI does)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    body = urllib.parse.urlencode({"query": query})
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(credentials, "aps", region).add_auth(request)
    return urllib.request.Request(url, data=body.encode(), method="POST", headers=dict(request.headers))


def writers_query(identity: str) -> str:
    escaped = identity.replace("\\", "\\\\").replace('"', '\\"')
    return (f'max by ({INSTANCE_LABEL}) (max_over_time(up{{{STACK_LABEL}="{escaped}", '
            f'job="{DCGM_JOB}"}}[{WINDOW}]))')


def metrics_status(spec: StackSpec, instance_ids: Sequence[str], *, amp: Any, credentials: Any,
                   opener: Any = urllib.request.urlopen) -> dict[str, str]:
    """Each instance's verdict (module docstring); every one `unknown` when the workspace cannot be asked."""
    unknown = dict.fromkeys(instance_ids, UNKNOWN)
    try:
        url = workspace_query_url(spec, amp)
    except AWS_ERRORS:
        return unknown
    found = remote_write_workspace((url or "").removesuffix("query") + "remote_write")
    if url is None or found is None or credentials is None:
        return unknown
    try:
        with opener(signed_query(url, writers_query(spec.identity), found[0], credentials),
                    timeout=QUERY_TIMEOUT_SECONDS) as response:
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return unknown
    if answer.get("status") != "success":
        return unknown
    up = {r["metric"].get(INSTANCE_LABEL): float(r["value"][1]) for r in answer["data"]["result"]}
    return {i: (WRITING if up[i] >= 1 else EXPORTER_DOWN) if i in up else NOT_WRITING for i in instance_ids}
