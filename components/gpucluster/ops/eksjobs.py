"""Jobs on an EKS stack: JobSets submitted through Kueue, listed, read and deleted on its Kubernetes API.

`gpucluster run --detach` renders the job (`eks.jobset`) and creates it in the stack's namespace (its
first team's, else `default`), where Kueue's LocalQueue `default` admits it when the ClusterQueue has
quota for all of its pods at once; `jobs` lists gpucluster's JobSets with their state and Kueue's
admission (the Workload Kueue keeps for each, found by its owner reference); `logs` reads the leader
pod's (rank 0) output; `cancel` deletes the JobSet (its Jobs and pods go with it) and reads it again,
saying only what it saw. Every call goes through the API client `eksapi.connect` makes; the API's
errors become one line (`eksapi.api_error`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from gpucluster.eks.jobset import (
    API_VERSION,
    COMPLETION_INDEX,
    CONTAINER,
    GROUP_LABEL,
    JOB_LABEL,
    MANAGED_BY,
    JobSetError,
    JobSetJob,
    jobset,
    pod_shape,
)
from gpucluster.ops import OpsError
from gpucluster.ops.eksapi import api_error

if TYPE_CHECKING:
    from gpucluster.spec import StackSpec

JOBSET_GROUP, JOBSET_VERSION = API_VERSION.split("/")
JOBSETS = "jobsets"
KUEUE_GROUP, KUEUE_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta1", "workloads"
"""Kueue's Workload API (ledger: kueue-workload-api)."""
SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
INDEX_ANNOTATION = COMPLETION_INDEX.split("'")[1]


class EksJobError(OpsError):
    """A job request the EKS stack cannot answer (no such job, no image, a JobSet that cannot run)."""


def job_namespace(spec: StackSpec) -> str:
    """Where gpucluster's jobs go: the first team's namespace, else `default`."""
    return spec.scheduler.teams[0] if spec.scheduler.teams else "default"


@dataclass
class Submitted:
    """`run --detach` on an EKS stack: the JobSet as created (or, `sent` False, as it would be)."""

    group: str
    job_name: str
    namespace: str
    nodes: int
    gpus_per_node: int
    efa_interfaces: int
    manifest: dict[str, Any]
    sent: bool = False
    cluster: str | None = None


@dataclass(frozen=True)
class EksJob:
    """One of gpucluster's JobSets as `jobs` shows it."""

    job: str
    namespace: str
    node_group: str
    nodes: int
    state: str
    """The JobSet's: Queued (suspended, Kueue has not admitted it), Running, Completed or Failed."""
    admission: str
    """Kueue's Workload: pending (with Kueue's reason), quota reserved, admitted, evicted, finished."""
    created: str

    @property
    def active(self) -> bool:
        return self.state in ("Queued", "Running")


@dataclass
class EksQueue:
    cluster: str
    group: str | None
    jobs: list[EksJob] = field(default_factory=list)


@dataclass
class LeaderLog:
    """`logs`: the leader pod's latest output (None: no pod yet, Kueue has not admitted the job)."""

    job: EksJob
    pod: str | None
    text: str


@dataclass
class EksFollowed:
    """`logs --follow`: the leader pod's output was streamed until it ended; the job's state then."""

    job: EksJob
    pod: str | None


@dataclass
class EksCancel:
    """`cancel`: what the API confirmed: the delete accepted, and the JobSet gone or going."""

    job: str
    namespace: str
    deleted: bool
    state: str
    """After the delete, as read again: gone, deleting (its pods terminating), or as before (not deleted)."""
    message: str = ""


def plan_submit(spec: StackSpec, group_name: str, command: str, *, name: str, nodes: int | None,
                master_port: int, workdir: str | None, timeout: int | None,
                restart_on_replace: bool) -> Submitted:
    """The JobSet for a run on `group_name` (JobSetError naming the option when it cannot run)."""
    from gpucluster.node.userdata import efa_environment, group_bootstrap

    group = next((g for g in spec.node_groups if g.name == group_name), None)
    if group is None:
        raise EksJobError(f"--group: no node group {group_name!r} in stack {spec.stack} "
                          f"(have: {', '.join(g.name for g in spec.node_groups)})")
    if not group.container_image:
        raise EksJobError(f"--group: node group {group_name} has no container_image: on EKS a job runs in "
                          "the group's container image (set node_groups[].container_image)")
    count = nodes if nodes is not None else (group.desired_nodes or group.max_nodes)
    job = JobSetJob(name=name, namespace=job_namespace(spec), command=command, image=group.container_image,
                    nodes=count, master_port=master_port, workdir=workdir, timeout_seconds=timeout,
                    max_restarts=3 if restart_on_replace else 0)
    try:
        shape = pod_shape(group, efa_environment(group_bootstrap(
            group, stack=spec.identity, cluster=spec.cluster.name, region=spec.region, spot=spec.spot)))
        manifest = jobset(job, group, shape)
    except JobSetError as err:
        raise EksJobError(str(err)) from None
    return Submitted(group_name, name, job.namespace, count, shape.gpus, shape.efa_interfaces, manifest)


def submit(api: Any, sub: Submitted) -> Submitted:
    """Create the JobSet; Kueue admits it when the queue has room for all of its pods."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    try:
        CustomObjectsApi(api).create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, sub.namespace,
                                                              JOBSETS, sub.manifest)
    except ApiException as err:
        raise api_error(err, f"creating JobSet {sub.namespace}/{sub.job_name}") from None
    sub.sent = True
    return sub


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's condition of type `kind` when it is True."""
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def jobset_state(obj: dict[str, Any]) -> str:
    """Completed or Failed (JobSet's terminal conditions), Queued while suspended (Kueue holds a JobSet
    suspended until it admits it), else Running."""
    for kind in ("Completed", "Failed"):
        if condition(obj, kind):
            return kind
    return "Queued" if obj.get("spec", {}).get("suspend") else "Running"


def admission(workload: dict[str, Any] | None) -> str:
    """Kueue's word on the job, from its Workload's conditions."""
    if workload is None:
        return "no workload (not seen by Kueue: is there a LocalQueue `default` in its namespace?)"
    for kind, word in (("Finished", "finished"), ("Evicted", "evicted"), ("Admitted", "admitted"),
                       ("QuotaReserved", "quota reserved")):
        if (c := condition(workload, kind)) is not None:
            return f"{word}: {c['message']}" if kind == "Evicted" and c.get("message") else word
    pending = next((c for c in workload.get("status", {}).get("conditions") or []
                    if c.get("type") == "QuotaReserved"), None)
    return f"pending: {pending['message']}" if pending and pending.get("message") else "pending"


def list_jobs(api: Any, cluster: str, group: str | None, *, name: str | None = None) -> EksQueue:
    """gpucluster's JobSets in every namespace (of one node group, or one name), with Kueue's admission."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    selector = (SELECTOR + (f",{GROUP_LABEL}={group}" if group else "")
                + (f",{JOB_LABEL}={name}" if name else ""))
    objects = CustomObjectsApi(api)
    try:
        sets: list[dict[str, Any]] = cast(dict[str, Any], objects.list_cluster_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, JOBSETS, label_selector=selector))["items"]
        workloads: list[dict[str, Any]] = cast(dict[str, Any], objects.list_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, WORKLOADS))["items"] if sets else []
    except ApiException as err:
        raise api_error(err, "listing JobSets and Kueue workloads") from None
    owned = {(w["metadata"].get("namespace"), ref.get("name")): w for w in workloads
             for ref in w["metadata"].get("ownerReferences") or [] if ref.get("kind") == "JobSet"}
    jobs = []
    for s in sets:
        meta = s["metadata"]
        replicated = s["spec"]["replicatedJobs"][0]["template"]["spec"]
        jobs.append(EksJob(meta["name"], meta.get("namespace", ""),
                           meta.get("labels", {}).get(GROUP_LABEL, "-"),
                           int(replicated.get("parallelism", 1)), jobset_state(s),
                           admission(owned.get((meta.get("namespace"), meta["name"]))),
                           meta.get("creationTimestamp", "")))
    return EksQueue(cluster, group, sorted(jobs, key=lambda j: (j.created, j.job)))


def find_job(api: Any, cluster: str, name: str) -> EksJob:
    """gpucluster's JobSet `name` (in whichever namespace), or EksJobError."""
    found = list_jobs(api, cluster, None, name=name).jobs
    if not found:
        raise EksJobError(f"job: no gpucluster JobSet named {name!r} on EKS cluster {cluster} "
                          "(see `gpucluster jobs`)")
    return found[-1]


def leader_pod(api: Any, job: EksJob) -> str | None:
    """The newest pod of rank 0 (completion index 0): after a JobSet restart, the live one."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        pods = CoreV1Api(api).list_namespaced_pod(job.namespace,
                                                  label_selector=f"{JOB_LABEL}={job.job}").items
    except ApiException as err:
        raise api_error(err, f"listing the pods of job {job.job}") from None
    leaders = [p.metadata for p in pods
               if p.metadata is not None and (p.metadata.annotations or {}).get(INDEX_ANNOTATION) == "0"]
    leaders.sort(key=lambda m: (str(m.creation_timestamp or ""), m.name or ""))
    return leaders[-1].name if leaders else None


def leader_log(api: Any, cluster: str, name: str, lines: int) -> LeaderLog:
    """The leader pod's last `lines` lines of output (none yet while Kueue holds the job)."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    job = find_job(api, cluster, name)
    pod = leader_pod(api, job)
    if pod is None:
        return LeaderLog(job, None, "")
    try:
        text = CoreV1Api(api).read_namespaced_pod_log(pod, job.namespace, container=CONTAINER,
                                                      tail_lines=lines)
    except ApiException as err:
        raise api_error(err, f"reading pod {job.namespace}/{pod}'s log") from None
    return LeaderLog(job, pod, text)


def follow_log(api: Any, cluster: str, name: str, on_text: Callable[[str], None], *,
               wait: Callable[[], None]) -> EksFollowed:
    """Stream the leader pod's output until it ends (waiting, with `wait` between looks, while the job is
    queued and its leader has no pod yet); the job as it is then."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    job = find_job(api, cluster, name)
    pod = leader_pod(api, job)
    while pod is None and job.active:
        wait()
        job = find_job(api, cluster, name)
        pod = leader_pod(api, job)
    if pod is not None:
        try:
            # Unread (`_preload_content=False`): the urllib3 response, streamed as it comes.
            stream: Any = CoreV1Api(api).read_namespaced_pod_log(pod, job.namespace, container=CONTAINER,
                                                                 follow=True, _preload_content=False)
            for chunk in stream.stream():
                on_text(chunk.decode(errors="replace"))
        except ApiException as err:
            raise api_error(err, f"following pod {job.namespace}/{pod}'s log") from None
    return EksFollowed(find_job(api, cluster, name), pod)


def cancel(api: Any, cluster: str, name: str) -> EksCancel:
    """Delete the JobSet (foreground: its Jobs and pods first) and read it again: what is confirmed."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    job = find_job(api, cluster, name)
    objects = CustomObjectsApi(api)
    try:
        objects.delete_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, job.namespace, JOBSETS, name,
                                                propagation_policy="Foreground")
    except ApiException as err:
        if err.status == 404:
            return EksCancel(name, job.namespace, False, "gone", "it was already gone")
        return EksCancel(name, job.namespace, False, job.state,
                         str(api_error(err, f"deleting JobSet {job.namespace}/{name}")))
    try:
        after = cast(dict[str, Any], objects.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, job.namespace, JOBSETS, name))
    except ApiException as err:
        if err.status == 404:
            return EksCancel(name, job.namespace, True, "gone")
        return EksCancel(name, job.namespace, True, "unknown",
                         str(api_error(err, f"reading JobSet {job.namespace}/{name} after the delete")))
    if after.get("metadata", {}).get("deletionTimestamp"):
        return EksCancel(name, job.namespace, True, "deleting")
    return EksCancel(name, job.namespace, False, jobset_state(after),
                     "the API accepted the delete but the JobSet is still there without a deletion mark")
