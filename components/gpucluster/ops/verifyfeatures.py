"""`verify`'s checks of the features a stack turns on: observability, baked images, Slurm on AWS PCS.

It owns, for `ops.verify.plan_checks`: the AMP workspace holds recent samples from every running GPU
node (its query API, SigV4-signed as `ops.metrics` asks it); the Grafana workspace is ACTIVE and its
role may query the AMP workspace (simulated: the stack's service-account token lives only in Pulumi's
state, so Grafana's own data source test is not run, and the detail says so); each baked group's
Image Builder pipeline's newest image is AVAILABLE; the PCS cluster, every node group and queue ACTIVE,
accounting on when the stack asks for it, every running compute instance registered with Slurm and
Slurm's ports allowed by the security groups (`ops.verifyslurm`, through the login node); and with
`--job`, `srun -N1 hostname` on each partition
through the login node (`ops.slurmjobs`). Read-only but for that opt-in job. A check that cannot run
raises (an AWS error, `Unknown`) and `ops.verify.run_check` makes it `unknown`.
"""

from __future__ import annotations

import json
import os
import shlex
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG
from gpucluster.ops.verifycheck import Deployed, Outcome, Unknown, amp_workspace
from gpucluster.ops.verifyiam import simulate
from gpucluster.ops.verifyslurm import check_nodes_registered, check_slurm_ports
from gpucluster.spec import baked_image

Opener = Callable[..., Any]
# A node launched this recently may not have written yet: the collector starts at the end of its boot
# (node/metrics.py) and the query looks back `ops.metrics.WINDOW` (5 minutes).
BOOT_GRACE = timedelta(minutes=15)
# Image Builder's ImageState.status values that are still on their way (API reference, ImageState).
BUILDING = frozenset({"PENDING", "CREATING", "BUILDING", "TESTING", "DISTRIBUTING", "INTEGRATING"})
# How long `--job` lets `srun -N1 hostname` wait for a node of a partition scaled to zero to boot.
JOB_SECONDS = 900
PULUMI_UP = "run `pulumi up` for this stack"


# ------------------------------------------------------------------------------ observability


def check_amp_samples(deployed: Deployed, *, opener: Opener = urllib.request.urlopen,
                      now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Outcome:
    """The AMP workspace holds recent `up` samples of dcgm-exporter from every running GPU node."""
    from gpucluster.dashboards.promql import INSTANCE_LABEL
    from gpucluster.ops.metrics import (
        QUERY_TIMEOUT_SECONDS,
        WINDOW,
        signed_query,
        workspace_query_url,
        writers_query,
    )
    from gpucluster.ops.slurmjobs import stack_instances
    from gpucluster.spec.observability import remote_write_workspace

    spec = deployed.spec
    url = workspace_query_url(spec, deployed.clients("amp"))
    if url is None:
        if spec.observability.prometheus.remote_write_url:
            raise Unknown("observability.prometheus.remote_write_url names no AMP workspace to query")
        return Outcome("fail", f"no ACTIVE AMP workspace aliased gpucluster-{spec.identity}", PULUMI_UP)
    found = remote_write_workspace(url.removesuffix("query") + "remote_write")
    credentials = deployed.credentials()
    if found is None or credentials is None:
        raise Unknown("no AWS credentials to sign the query with" if found else f"{url} is no AMP workspace")
    nodes = [i for i in stack_instances(deployed.clients("ec2"), spec.identity, states=("running",))
             if {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(NODE_GROUP_TAG) != SLURM_LOGIN_GROUP]
    try:
        with opener(signed_query(url, writers_query(spec.identity), found[0], credentials),
                    timeout=QUERY_TIMEOUT_SECONDS) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace").strip()[:200]
        raise Unknown(f"the workspace's query API answered HTTP {err.code}: {body or err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise Unknown(f"the workspace's query API did not answer: {err}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise Unknown(f"the workspace's query API answered {str(answer)[:200]}")
    up = {r["metric"].get(INSTANCE_LABEL): float(r["value"][1]) for r in answer["data"]["result"]}
    booting = {i["InstanceId"] for i in nodes if i.get("LaunchTime") and now() - i["LaunchTime"] < BOOT_GRACE}
    settled = [i["InstanceId"] for i in nodes if i["InstanceId"] not in booting]
    silent = [i for i in settled if i not in up]
    down = [i for i in settled if i in up and up[i] < 1]
    later = f"; {len(booting)} launched under {BOOT_GRACE.seconds // 60} min ago not expected yet" \
        if booting else ""
    if not silent and not down:
        return Outcome("pass", f"{len(settled)} running GPU node(s) wrote dcgm-exporter samples in the last "
                       f"{WINDOW}{later}")
    parts = ([f"no samples in the last {WINDOW} from {', '.join(silent)}"] if silent else []) + (
        [f"dcgm-exporter down on {', '.join(down)}"] if down else [])
    return Outcome("fail", "; ".join(parts) + later,
                   "read the node's boot log (`gpucluster logs`/the console output): no route to AMP "
                   "(without NAT the aps-workspaces endpoint), no aps:RemoteWrite, or the collector or "
                   "dcgm-exporter not running")


def check_grafana(deployed: Deployed, opener: Any = None, sleep: Any = None) -> Outcome:
    """The stack's Grafana workspace is ACTIVE and its role may query the AMP workspace (simulated); with a
    token in $GRAFANA_TOKEN, Grafana's own data source test too (`opener`, `sleep`: tests' fake HTTP)."""
    grafana = deployed.clients("grafana")
    own = [w for page in grafana.get_paginator("list_workspaces").paginate()
           for w in page.get("workspaces", [])
           if (w.get("tags") or {}).get(STACK_TAG) == deployed.spec.identity]
    if not own:
        return Outcome("fail", f"no Grafana workspace is tagged {STACK_TAG}={deployed.spec.identity}",
                       PULUMI_UP)
    if len(own) > 1:
        raise Unknown(f"{len(own)} Grafana workspaces are tagged {STACK_TAG}={deployed.spec.identity}")
    described = grafana.describe_workspace(workspaceId=own[0]["id"])["workspace"]
    name, status = described.get("name") or described["id"], described.get("status")
    if status != "ACTIVE":
        return Outcome("fail", f"Grafana workspace {name} is {status}",
                       "wait for it to finish, or see its status in the Amazon Managed Grafana console; "
                       "a *_FAILED workspace needs `pulumi up`")
    role = described.get("workspaceRoleArn")
    if not role:
        raise Unknown(f"Grafana workspace {name} names no workspace role to query Prometheus with")
    arn, context = amp_workspace(deployed)
    denied = simulate(deployed.clients("iam"), str(role), [("aps:QueryMetrics", arn, context)])
    if denied:
        return Outcome("fail", f"Grafana workspace {name} is ACTIVE but its role may not query {arn}: "
                       f"{denied[0]}",
                       "run `pulumi up` (the grafana role's `-grafana-query` policy grants it)")
    simulated = f"Grafana workspace {name} is ACTIVE and its role may aps:QueryMetrics on {arn} (simulated)"
    token = os.environ.get(GRAFANA_TOKEN_ENV, "")
    if not token:
        return Outcome("pass", f"{simulated}; set ${GRAFANA_TOKEN_ENV} to a service-account token of the "
                       "workspace (Viewer) to also run Grafana's own data source test")
    return datasource_health(f"https://{described['endpoint']}", token, simulated, opener, sleep)


# The variable `verify` reads a Grafana service-account token from (as `dashboards export --token-env`).
GRAFANA_TOKEN_ENV = "GRAFANA_TOKEN"


def datasource_health(url: str, token: str, simulated: str, opener: Any = None, sleep: Any = None) -> Outcome:
    """Grafana's own test of the stack's AMP data source: `GET /api/datasources/uid/<uid>/health` (Grafana
    HTTP API, "Check data source health"; Grafana answers 400 with its message when the test fails;
    ledger: amg-datasource-health-api). Read-only: it runs a query through the workspace's role."""
    from gpucluster.dashboards.provision import DATASOURCE_UID, Grafana, ProvisionError

    grafana = Grafana(url, token, attempts=2)
    grafana.opener = opener or grafana.opener
    grafana.sleep = sleep or grafana.sleep
    try:
        answer = grafana.call("GET", f"/api/datasources/uid/{DATASOURCE_UID}/health")
    except ProvisionError as err:
        if err.status == 400:
            return Outcome("fail", f"{simulated}, but Grafana's data source test failed: {err}",
                           "open Connections > Data sources in the workspace; a missing data source "
                           "comes back with `pulumi up`")
        if err.status == 404:
            return Outcome("fail", f"{simulated}, but the workspace has no {DATASOURCE_UID} data source",
                           "run `pulumi up`: it provisions the data source and the dashboards")
        raise Unknown(f"Grafana's data source test could not run: {err}") from None
    status = (answer or {}).get("status")
    if status != "OK":
        return Outcome("fail", f"{simulated}, but Grafana's data source test answered {status!r}: "
                       f"{(answer or {}).get('message', '')}"[:300],
                       "open Connections > Data sources in the workspace and test it there")
    return Outcome("pass", f"{simulated}; Grafana's data source test: {answer.get('message') or 'OK'}")


# ------------------------------------------------------------------------------ baked images


def check_image_pipeline(deployed: Deployed, group: str) -> Outcome:
    """The newest image of the group's Image Builder pipeline is AVAILABLE."""
    from gpucluster.node.bake import recipe_name
    from gpucluster.ops.images import find_pipeline

    spec = deployed.spec
    imagebuilder = deployed.clients("imagebuilder")
    name = recipe_name(spec.cluster.name, spec.identity, group)
    arn = find_pipeline(imagebuilder, name)
    if arn is None:
        return Outcome("fail", f"no image pipeline {name}", PULUMI_UP)
    images = [i for page in imagebuilder.get_paginator("list_image_pipeline_images").paginate(
        imagePipelineArn=arn) for i in page.get("imageSummaryList", [])]
    if not images:
        return Outcome("fail", f"pipeline {name} has built no image yet",
                       f"`gpucluster image build {spec.stack} --wait`")
    newest = max(images, key=lambda i: str(i.get("dateCreated", "")))
    state = newest.get("state") or {}
    status, version = state.get("status"), newest.get("version") or newest.get("arn")
    if status == "AVAILABLE":
        return Outcome("pass", f"pipeline {name}: the newest image {version} is AVAILABLE")
    if status in BUILDING:
        raise Unknown(f"pipeline {name}: the newest image {version} is {status} (still building)")
    reason = f": {state['reason']}" if state.get("reason") else ""
    return Outcome("fail", f"pipeline {name}: the newest image {version} is {status}{reason}",
                   "read the build's log (Image Builder console, the build's workflow), fix the recipe "
                   f"or the stack, then `gpucluster image build {spec.stack} --wait`")


# ----------------------------------------------------------------------------- Slurm on PCS


def _cluster(deployed: Deployed) -> dict[str, Any] | Outcome:
    """The stack's PCS cluster (GetCluster), or the failure when the account holds none or several."""
    from gpucluster.ops.pcsclusters import NoPcsCluster

    try:
        return deployed.pcs_cluster()
    except NoPcsCluster as err:
        return Outcome("fail", str(err).split(": ")[0], f"{PULUMI_UP}, or delete the stale cluster")


def _errors(item: dict[str, Any]) -> str:
    found = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in item.get("errorInfo", []))
    return f" ({found})" if found else ""


def check_pcs_cluster(deployed: Deployed) -> Outcome:
    """The stack's PCS cluster is ACTIVE."""
    cluster = _cluster(deployed)
    if isinstance(cluster, Outcome):
        return cluster
    status = cluster.get("status")
    if status == "ACTIVE":
        return Outcome("pass", f"PCS cluster {cluster['name']} ({cluster['id']}) is ACTIVE")
    return Outcome("fail", f"PCS cluster {cluster['name']} is {status}{_errors(cluster)}",
                   "wait while it is CREATING/UPDATING; a *_FAILED cluster: read its error, `pulumi up`")


def check_pcs_accounting(deployed: Deployed) -> Outcome:
    """Slurm accounting is on (GetCluster's slurmConfiguration.accounting.mode STANDARD)."""
    cluster = _cluster(deployed)
    if isinstance(cluster, Outcome):
        return cluster
    mode = ((cluster.get("slurmConfiguration") or {}).get("accounting") or {}).get("mode", "NONE")
    if mode == "STANDARD":
        return Outcome("pass", f"PCS cluster {cluster['name']} keeps Slurm accounting (mode STANDARD)")
    return Outcome("fail", f"PCS cluster {cluster['name']} has accounting mode {mode}: sacct and "
                   "`spend --by user/job` have nothing to read",
                   "accounting is set when a cluster is created: replace the cluster (`pulumi up "
                   "--replace` on it), or set scheduler.accounting: false")


def _all_active(deployed: Deployed, kind: str, listing: str, key: str, expected: list[str]) -> Outcome:
    """Every expected PCS node group or queue exists and is ACTIVE."""
    cluster = _cluster(deployed)
    if isinstance(cluster, Outcome):
        return cluster
    pcs = deployed.clients("pcs")
    states = {str(i["name"]): str(i.get("status")) for page in pcs.get_paginator(listing).paginate(
        clusterIdentifier=cluster["id"]) for i in page.get(key, [])}
    missing = [n for n in expected if n not in states]
    other = [f"{n} ({states[n]})" for n in expected if n in states and states[n] != "ACTIVE"]
    if not missing and not other:
        return Outcome("pass", f"{len(expected)} {kind}s ACTIVE: {', '.join(expected)}")
    parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
        [f"not ACTIVE: {', '.join(other)}"] if other else [])
    return Outcome("fail", f"{kind}s " + "; ".join(parts),
                   f"{PULUMI_UP}; a {kind} UPDATING settles by itself, a *_FAILED one needs its error "
                   "read (`aws pcs get-compute-node-group` / `get-queue`)")


def check_pcs_node_groups(deployed: Deployed) -> Outcome:
    expected = [g.name for g in deployed.spec.node_groups] + [SLURM_LOGIN_GROUP]
    return _all_active(deployed, "node group", "list_compute_node_groups", "computeNodeGroups", expected)


def check_pcs_queues(deployed: Deployed) -> Outcome:
    expected = [g.name for g in deployed.spec.node_groups]
    return _all_active(deployed, "queue", "list_queues", "queues", expected)


def job_script(partition: str) -> str:
    """One node of `partition` runs `hostname` (bounded: a partition at zero boots a node first)."""
    return (f"timeout {JOB_SECONDS} srun --nodes=1 --ntasks=1 --partition={shlex.quote(partition)} "
            "--job-name=gpucluster-verify hostname")


def check_slurm_job(deployed: Deployed, partition: str) -> Outcome:
    """`srun -N1 hostname` on the partition, through the login node (SSM), answers with a host name."""
    from gpucluster.ops.slurmjobs import SlurmError, find_login_node, run_script

    try:
        login = find_login_node(deployed.spec, clients=deployed.clients)
    except SlurmError as err:
        raise Unknown(str(err)) from None
    done = run_script(deployed.clients("ssm"), login.instance_id, job_script(partition),
                      comment=f"gpucluster verify --job {partition}", timeout_seconds=JOB_SECONDS + 60)
    host = done.stdout.strip().splitlines()[-1:] if done.ok else []
    if host:
        return Outcome("pass", f"srun -N1 hostname on partition {partition} ran on {host[0]}")
    if done.status == "NoAnswer":
        raise Unknown(f"no answer from the login node {login.instance_id} within {JOB_SECONDS + 60} s")
    return Outcome("fail", f"srun -N1 hostname on partition {partition} failed: {done.error_line()}",
                   f"`gpucluster nodes {deployed.spec.stack}` and `sinfo` on the login node: a node that "
                   "cannot boot or register (its console output, the PCS endpoint without NAT)")


def feature_checks(deployed: Deployed, *, job: bool) -> list[tuple[str, str, str, Callable[[], Outcome]]]:
    """(id, name, subject, run) of each feature check the stack asks for (`ops.verify.plan_checks`)."""
    from functools import partial

    spec = deployed.spec
    checks: list[tuple[str, str, str, Callable[[], Outcome]]] = []
    if spec.observability.prometheus.active:
        checks.append(("amp-samples", "AMP holds recent samples from every GPU node", "dcgm-exporter up",
                       partial(check_amp_samples, deployed)))
    if spec.observability.grafana.enabled:
        checks.append(("grafana", "Grafana workspace is ACTIVE and may query AMP", "Grafana workspace",
                       partial(check_grafana, deployed)))
    for group in spec.node_groups:
        if baked_image(spec.images, group) is not None:
            checks.append((f"image-pipeline.{group.name}", "the image pipeline's newest build succeeded",
                           group.name, partial(check_image_pipeline, deployed, group.name)))
    if spec.scheduler.slurm:
        checks.append(("pcs-cluster", "PCS cluster is ACTIVE", spec.cluster.name,
                       partial(check_pcs_cluster, deployed)))
        if spec.scheduler.accounting:
            checks.append(("pcs-accounting", "Slurm accounting is on", spec.cluster.name,
                           partial(check_pcs_accounting, deployed)))
        checks.append(("pcs-node-groups", "every PCS node group is ACTIVE",
                       f"{len(spec.node_groups) + 1} node groups", partial(check_pcs_node_groups, deployed)))
        checks.append(("pcs-queues", "every PCS queue is ACTIVE", f"{len(spec.node_groups)} queues",
                       partial(check_pcs_queues, deployed)))
        checks.append(("slurm-nodes", "every running compute instance registered with Slurm", "sinfo",
                       partial(check_nodes_registered, deployed)))
        checks.append(("slurm-ports", "Slurm's ports allowed by the security groups", "scontrol show config",
                       partial(check_slurm_ports, deployed)))
        if job:
            for group in spec.node_groups:
                checks.append((f"slurm-job.{group.name}", "srun -N1 hostname runs on the partition",
                               group.name, partial(check_slurm_job, deployed, group.name)))
    if spec.scheduler.eks:
        from gpucluster.ops.verifyeks import eks_checks

        checks += eks_checks(deployed, job=job)
    return checks
