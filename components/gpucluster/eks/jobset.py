"""A multi-node torchrun job as a JobSet (`jobset.x-k8s.io/v1alpha2`), queued by Kueue: what
`gpucluster run --detach` submits on an EKS stack, and what the guide shows. Pure: a plain dict.

One replicated job of N pods, one pod a node (each asks for all of its node's GPUs), Indexed so a pod's
completion index is its NODE_RANK. The pods carry what the launcher's and Slurm's jobs get:
MASTER_ADDR (the leader pod's name under the JobSet's headless service: JobSet gives every pod a DNS
host name `<jobset>-<replicated job>-<job index>-<pod index>.<subdomain>`, the subdomain defaulting to
the JobSet's name; ledger: jobset-pod-dns), MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE, WORLD_SIZE and
the group's EFA/NCCL settings (`node.userdata.efa_environment`, the nodes' own source), plus NCCL_DEBUG=INFO
so the log says which transport NCCL chose. On an EFA group each pod also asks for the type's EFA
interfaces (`vpc.amazonaws.com/efa`, the EFA device plugin's resource): without it NCCL silently falls back
to TCP. `/dev/shm` is a memory-backed emptyDir (a container's default is 64 MiB, too small for NCCL and data
loaders). Scheduling: the group's label and the GPU taint the node groups carry (`GROUP_LABEL`, `GPU_TAINT`);
admission: the Kueue LocalQueue named by the `kueue.x-k8s.io/queue-name` label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpucluster.spec import NodeGroupConfig

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
GROUP_LABEL = "gpucluster.io/group"
"""The node label of a node group's nodes (the NodeConfig the EKS node groups boot with)."""
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
"""The taint on every GPU node: only pods that tolerate it (GPU jobs) land there."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE = "default"
"""The LocalQueue every team namespace has, on the cluster's `gpucluster` ClusterQueue."""
JOB_LABEL = "gpucluster.io/job"
"""On every JobSet gpucluster submits: its name (`jobs` lists by this label)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpucluster"}
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
REPLICATED_JOB = "node"
"""The one replicated job's name: pod names read `<job>-node-0-<rank>`."""
CONTAINER = "main"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
"""An Indexed Job's pod annotation holding its index (Kubernetes docs, "Jobs": Completion mode)."""
NCCL_DEBUG = "INFO"
"""NCCL prints its chosen network at init (`NET/OFI Selected Provider is efa` on EFA)."""
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
"""A JobSet name short enough that its pods' host names (`<name>-node-0-<rank>`, 63 at most) fit."""


class JobSetError(ValueError):
    """The job cannot run on the group as asked: one line naming the option."""


@dataclass(frozen=True)
class JobSetJob:
    """One torchrun job as the user asked for it."""

    name: str
    namespace: str
    command: str
    image: str
    nodes: int
    master_port: int = 29500
    workdir: str | None = None
    timeout_seconds: int | None = None
    max_restarts: int = 0
    """Times JobSet recreates every pod after one fails (`--restart-on-replace`: a replaced node)."""


@dataclass(frozen=True)
class PodShape:
    """What one pod of a group asks for: all of one node's GPUs and, on EFA groups, its EFA interfaces."""

    gpus: int
    efa_interfaces: int
    environment: dict[str, str]


def pod_shape(group: NodeGroupConfig, environment: dict[str, str]) -> PodShape:
    """The group's pod: GPUs of its smallest type, EFA interfaces of its types (which an EFA group's types
    share: the launch template's count), `environment` its EFA/NCCL settings."""
    if group.mig_layout:
        raise JobSetError(f"--group: node group {group.name} has MIG devices, which the device plugin names "
                          "per profile: submit a JobSet of your own that asks for them")
    types = group.types
    gpus = min((t.gpus for t in types), default=0)
    if gpus < 1:
        raise JobSetError(f"--group: node group {group.name} has no GPUs the catalog knows of")
    efa = types[0].efa_interface_count if group.efa_enabled else 0
    return PodShape(gpus, efa, dict(environment))


def leader_host(name: str) -> str:
    """The leader pod's (rank 0) host name under the JobSet's headless service (ledger: jobset-pod-dns)."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def check(job: JobSetJob, group: NodeGroupConfig) -> None:
    """JobSetError naming the option when `job` cannot run on `group`."""
    if not NAME.fullmatch(job.name):
        raise JobSetError(f"--name: {job.name!r} must be 1-40 lower-case letters, digits or '-' (a JobSet "
                          "name whose pods' host names fit DNS), starting and ending with a letter or digit")
    if not job.command.strip():
        raise JobSetError("command: is empty; give the command to run after `--`")
    if "\0" in job.command:
        raise JobSetError("command: contains a NUL byte, which no shell can pass on")
    if not 1 <= job.nodes <= group.max_nodes:
        raise JobSetError(f"--nodes: must be 1..{group.max_nodes} (node group {group.name}'s max_nodes), "
                          f"got {job.nodes}")
    if not 1 <= job.master_port <= 65535:
        raise JobSetError(f"--master-port: must be 1..65535, got {job.master_port}")


def jobset(job: JobSetJob, group: NodeGroupConfig, shape: PodShape) -> dict[str, Any]:
    """The JobSet of `job` on `group`: N pods, one a node, rank = completion index, queued by Kueue."""
    check(job, group)
    labels = {**MANAGED_BY, JOB_LABEL: job.name, GROUP_LABEL: group.name}
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "labels": {**labels, QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {
            # Every pod gets a DNS host name under a headless service named after the JobSet.
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": job.max_restarts},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                "template": {"spec": job_spec(job, group, shape, labels)}}],
        },
    }


def job_spec(job: JobSetJob, group: NodeGroupConfig, shape: PodShape,
             labels: dict[str, str]) -> dict[str, Any]:
    """The replicated job's `batch/v1` JobSpec: Indexed, one pod a node, no retry of its own (JobSet's)."""
    spec: dict[str, Any] = {
        "completionMode": "Indexed", "parallelism": job.nodes, "completions": job.nodes, "backoffLimit": 0,
        "template": pod_template(job, group, shape, labels),
    }
    if job.timeout_seconds:
        spec["activeDeadlineSeconds"] = job.timeout_seconds
    return spec


def pod_template(job: JobSetJob, group: NodeGroupConfig, shape: PodShape,
                 labels: dict[str, str]) -> dict[str, Any]:
    """One rank's pod: the group's nodes only, all their GPUs (and EFA), /dev/shm in memory."""
    resources = {GPU_RESOURCE: str(shape.gpus)}
    if shape.efa_interfaces:
        resources[EFA_RESOURCE] = str(shape.efa_interfaces)
    container: dict[str, Any] = {
        "name": CONTAINER, "image": job.image,
        "command": ["/bin/bash", "-c", job.command],
        "env": environment(job, shape),
        # Extended resources: the request must equal the limit (Kubernetes docs, "Resource Management").
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if job.workdir:
        container["workingDir"] = job.workdir
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {GROUP_LABEL: group.name},
            "tolerations": [{**GPU_TAINT, "operator": "Equal"}],
            "containers": [container],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def environment(job: JobSetJob, shape: PodShape) -> list[dict[str, Any]]:
    """torchrun's rendezvous (the names `gpucluster run` gives on every scheduler), NCCL_DEBUG and the
    group's EFA/NCCL settings; NODE_RANK from the pod's completion index."""
    plain = {
        "MASTER_ADDR": leader_host(job.name),
        "MASTER_PORT": str(job.master_port),
        "NNODES": str(job.nodes),
        "NPROC_PER_NODE": str(shape.gpus),
        "WORLD_SIZE": str(job.nodes * shape.gpus),
        "NCCL_DEBUG": NCCL_DEBUG,
        **shape.environment,
    }
    return [*({"name": k, "value": v} for k, v in plain.items()),
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}]


def pod_objects(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The JobSet's core parts as whole core objects (a `batch/v1` Job per replicated job, its pod as a
    `v1` Pod) so a Kubernetes schema validator can check them: JobSet's own fields are not in it."""
    meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}
    out: list[dict[str, Any]] = []
    for replicated in obj["spec"]["replicatedJobs"]:
        spec = replicated["template"]["spec"]
        out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec})
        out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, **spec["template"]["metadata"]},
                    "spec": spec["template"]["spec"]})
    return out
