"""`verify` on an EKS stack: what only an account shows (the cluster up, its add-ons, nodes joined, the
charts' controllers available) and, with `--job`, a one-pod GPU job through Kueue.

Each check is read-only but the job, which creates one JobSet (one pod asking for one node's GPUs) and
deletes it at the end. The cluster comes from EKS by its stack tag (`ops.eksapi`); the Kubernetes views
from the API as the caller, so a caller without an access entry makes them `unknown`, never `pass`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpucluster.fleet.awsapi import group_tags
from gpucluster.fleet.tags import NODE_GROUP_TAG
from gpucluster.ops.verifycheck import Deployed, Outcome, Unknown

EKS_ADDONS = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "eks-node-monitoring-agent")
"""The add-ons an EKS stack installs (issue 36, "Control plane")."""
JOB_SECONDS = 900
"""How long the --job check waits for its pod: a group at zero boots a node first."""
JOB_POLL_SECONDS = 15.0
PULUMI_UP = "`pulumi up` the stack"


def _kube(deployed: Deployed) -> tuple[Any, Any]:
    """(cluster, API client), or Unknown with why the API cannot be asked."""
    from gpucluster.ops.eksapi import NoEksCluster

    try:
        return deployed.eks()
    except NoEksCluster as err:
        raise Unknown(str(err)) from None


def _api_call(what: str, call: Callable[[], Any]) -> Any:
    """A Kubernetes API call; its refusal or failure makes the check unknown (with the API's words)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpucluster.ops import OpsError
    from gpucluster.ops.eksapi import api_error

    try:
        return call()
    except ApiException as err:
        raise Unknown(str(api_error(err, what))) from None
    except OpsError as err:  # the job flows' own one-line errors (the API's, already worded)
        raise Unknown(str(err)) from None
    except HTTPError as err:
        raise Unknown(f"{what}: the Kubernetes API did not answer ({type(err).__name__}: is the endpoint "
                      "private? run verify from inside the VPC)") from None


def check_eks_cluster(deployed: Deployed) -> Outcome:
    """The stack's EKS cluster is ACTIVE (DescribeCluster)."""
    from gpucluster.ops.eksapi import NoEksCluster, stack_eks_cluster

    try:
        cluster = stack_eks_cluster(deployed.spec.identity, deployed.clients("eks"))
    except NoEksCluster as err:
        return Outcome("fail", str(err).split(": ")[0], f"{PULUMI_UP}, or delete the stale cluster")
    if cluster.status == "ACTIVE":
        return Outcome("pass", f"EKS cluster {cluster.name} (Kubernetes {cluster.version}) is ACTIVE")
    return Outcome("fail", f"EKS cluster {cluster.name} is {cluster.status}",
                   "wait while it is CREATING/UPDATING; FAILED: read `aws eks describe-cluster`, then "
                   f"{PULUMI_UP}")


def check_eks_addons(deployed: Deployed) -> Outcome:
    """Every add-on the stack installs exists and is ACTIVE (ListAddons, DescribeAddon's health issues)."""
    from gpucluster.ops.eksapi import NoEksCluster, stack_eks_cluster

    eks = deployed.clients("eks")
    try:
        name = stack_eks_cluster(deployed.spec.identity, eks).name
    except NoEksCluster as err:
        raise Unknown(str(err)) from None
    present = [a for page in eks.get_paginator("list_addons").paginate(clusterName=name)
               for a in page.get("addons", [])]
    missing = [a for a in EKS_ADDONS if a not in present]
    other = []
    for addon in present:
        found = eks.describe_addon(clusterName=name, addonName=addon)["addon"]
        if found.get("status") != "ACTIVE":
            issues = "; ".join(f"{i.get('code')}: {i.get('message')}"
                               for i in (found.get("health") or {}).get("issues", []))
            other.append(f"{addon} ({found.get('status')}{f': {issues}' if issues else ''})")
    if not missing and not other:
        return Outcome("pass", f"{len(present)} add-ons ACTIVE: {', '.join(present)}")
    parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
        [f"not ACTIVE: {', '.join(other)}"] if other else [])
    return Outcome("fail", "add-ons " + "; ".join(parts),
                   f"{PULUMI_UP}; a DEGRADED add-on's health issues say why (often its pods cannot schedule: "
                   "no system node)")


def check_eks_nodes(deployed: Deployed, group: str) -> Outcome:
    """The group's nodes joined: Ready nodes with its label equal its Auto Scaling group's InService."""
    from kubernetes.client import CoreV1Api

    from gpucluster.eks.jobset import GROUP_LABEL

    _, api = _kube(deployed)
    groups = [g for g in deployed.groups() if group_tags(g).get(NODE_GROUP_TAG) == group]
    if not groups:
        raise Unknown(f"no Auto Scaling group tagged {NODE_GROUP_TAG}={group}")
    in_service = sum(1 for g in groups for i in g.get("Instances", [])
                     if i.get("LifecycleState") == "InService")
    nodes = _api_call(f"listing the nodes of {group}", lambda: CoreV1Api(api).list_node(
        label_selector=f"{GROUP_LABEL}={group}").items)
    ready = sum(1 for n in nodes if any(c.type == "Ready" and c.status == "True"
                                       for c in (n.status.conditions or [])))
    if in_service == 0 and not nodes:
        return Outcome("unknown", f"no node of {group} is running (the group is at zero): nothing to see "
                                  "join")
    if ready >= in_service:
        return Outcome("pass", f"{ready} Ready node(s) labelled {GROUP_LABEL}={group} for {in_service} "
                               "InService instance(s)")
    return Outcome("fail", f"{ready} Ready node(s) labelled {GROUP_LABEL}={group} for {in_service} InService "
                           "instance(s): some did not join (or are not Ready)",
                   "read a node's console output and `journalctl -u kubelet -u nodeadm-run`; check the node "
                   "role's EC2_LINUX access entry and the cluster security group")


def check_eks_controllers(deployed: Deployed) -> Outcome:
    """The charts' controllers run: every Helm-managed Deployment has its replicas available and every
    Helm-managed DaemonSet its pods (device plugins, dcgm-exporter) on the nodes it is scheduled to."""
    from kubernetes.client import AppsV1Api

    _, api = _kube(deployed)
    apps, selector = AppsV1Api(api), "app.kubernetes.io/managed-by=Helm"
    deployments = _api_call("listing Deployments", lambda: apps.list_deployment_for_all_namespaces(
        label_selector=selector).items)
    daemonsets = _api_call("listing DaemonSets", lambda: apps.list_daemon_set_for_all_namespaces(
        label_selector=selector).items)
    if not deployments:
        return Outcome("fail", "no Helm-managed Deployment on the cluster: the charts are not installed",
                       PULUMI_UP)
    short = [f"{d.metadata.namespace}/{d.metadata.name} "
             f"({d.status.available_replicas or 0}/{d.spec.replicas})" for d in deployments
             if (d.status.available_replicas or 0) < (d.spec.replicas or 0)]
    short += [f"{d.metadata.namespace}/{d.metadata.name} ({d.status.number_available or 0}/"
              f"{d.status.desired_number_scheduled})" for d in daemonsets
              if (d.status.number_available or 0) < (d.status.desired_number_scheduled or 0)]
    if not short:
        return Outcome("pass", f"{len(deployments)} Deployment(s) and {len(daemonsets)} DaemonSet(s) of the "
                               "charts available")
    return Outcome("fail", f"not available: {', '.join(short)}",
                   "`kubectl -n <namespace> describe` the workload: its pods' events say why (image pull, "
                   "no node that fits, a crash)")


def check_eks_job(deployed: Deployed, group: str, *, sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> Outcome:
    """One pod asking for one node's GPUs, queued by Kueue on `group`, runs `nvidia-smi -L` and lists a GPU;
    the JobSet is deleted at the end whatever happened."""
    from gpucluster.ops.eksjobs import EksJobError, cancel, find_job, leader_log, plan_submit, submit

    cluster, api = _kube(deployed)
    name = datetime.now(UTC).strftime("gpucluster-verify-%H%M%S")
    try:
        sub = plan_submit(deployed.spec, group, "nvidia-smi -L", name=name, nodes=1, master_port=29500,
                          workdir=None, timeout=JOB_SECONDS, restart_on_replace=False)
    except EksJobError as err:
        raise Unknown(str(err)) from None
    _api_call("creating the test JobSet", lambda: submit(api, sub))
    try:
        deadline = clock() + JOB_SECONDS
        job = _api_call("reading the test JobSet", lambda: find_job(api, cluster.name, name))
        while job.active and clock() < deadline:
            sleep(JOB_POLL_SECONDS)
            job = _api_call("reading the test JobSet", lambda: find_job(api, cluster.name, name))
        log = _api_call("reading the test pod's log", lambda: leader_log(api, cluster.name, name, 20))
    finally:
        removed = _api_call("deleting the test JobSet", lambda: cancel(api, cluster.name, name))
    if not removed.deleted:
        raise Unknown(f"the test JobSet {sub.namespace}/{name} was not deleted ({removed.message}): delete "
                      "it with kubectl")
    gpus = [line for line in log.text.splitlines() if line.startswith("GPU ")]
    if job.state == "Completed" and gpus:
        return Outcome("pass", f"a one-pod job through Kueue ran on {group}: {gpus[0]}")
    if job.active:
        return Outcome("fail", f"the test job on {group} was still {job.state} after {JOB_SECONDS} s "
                               f"(Kueue: {job.admission})",
                       "a pending admission: the ClusterQueue's quota or the group's max_nodes; admitted but "
                       "no pod: the cluster-autoscaler's log (can it scale the group from zero?)")
    return Outcome("fail", f"the test job on {group} ended {job.state} (Kueue: {job.admission}); its output: "
                           f"{' | '.join(log.text.splitlines()[-3:]) or 'none'}",
                   "the pod's events (`kubectl describe pod`): the device plugin, the image, the taint")


def eks_checks(deployed: Deployed, *, job: bool) -> list[tuple[str, str, str, Callable[[], Outcome]]]:
    """(id, name, subject, run) of each EKS check (`ops.verifyfeatures.feature_checks`)."""
    spec = deployed.spec
    checks: list[tuple[str, str, str, Callable[[], Outcome]]] = [
        ("eks-cluster", "EKS cluster is ACTIVE", spec.cluster.name, partial(check_eks_cluster, deployed)),
        ("eks-addons", "every EKS add-on is ACTIVE", f"{len(EKS_ADDONS)} add-ons",
         partial(check_eks_addons, deployed)),
    ]
    for group in spec.node_groups:
        checks.append((f"eks-nodes.{group.name}", "the group's nodes joined the cluster", group.name,
                       partial(check_eks_nodes, deployed, group.name)))
    checks.append(("eks-controllers", "the charts' Deployments and DaemonSets are available", "Helm releases",
                   partial(check_eks_controllers, deployed)))
    if job:
        for group in spec.node_groups:
            checks.append((f"eks-job.{group.name}", "a one-pod GPU job runs through Kueue", group.name,
                           partial(check_eks_job, deployed, group.name)))
    return checks
