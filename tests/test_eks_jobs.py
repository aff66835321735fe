"""`run --detach`, `jobs`, `logs` and `cancel` on an EKS stack: the EKS job backend against a fake Kubernetes
API (`fake_kube`, a local HTTP server answering as the API does, errors included), the cluster found with a
stubbed EKS client (botocore's Stubber), the token in aws-iam-authenticator's format."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from botocore.credentials import Credentials
from botocore.stub import Stubber
from typer.testing import CliRunner

from fake_kube import FakeKube, fake_kube
from gpucluster.cli import app, common
from gpucluster.ops import Clients
from gpucluster.ops.eksapi import KubeError, NoEksCluster, connect, eks_token, stack_eks_cluster
from gpucluster.ops.eksjobs import (
    EksJobError,
    admission,
    cancel,
    find_job,
    follow_log,
    leader_log,
    list_jobs,
    plan_submit,
    submit,
)
from gpucluster.ops.jobbackends import RunRequest, job_backend
from gpucluster.ops.jobbackends.eks import EksJobs
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec
from test_eks_jobset import eks_stack_config

runner = CliRunner()
IDENTITY = "organization/gpucluster/k8s"
CREDENTIALS = Credentials("AKIDEXAMPLE", "secret")


def eks_config() -> dict[str, Any]:
    """An EKS stack (team ml) with an EFA group that has an image and one that has none."""
    return eks_stack_config(
        {
            "name": "train",
            "instance_types": ["p5.48xlarge"],
            "min_nodes": 0,
            "desired_nodes": 0,
            "max_nodes": 4,
            "container_image": "public.ecr.aws/example/train:1",
        },
        {"name": "small", "instance_types": ["g5.xlarge"], "min_nodes": 0, "max_nodes": 2},
    )


@pytest.fixture(scope="module")
def spec() -> StackSpec:
    return parse_stack_config(eks_config(), "k8s")


def eks_client(
    endpoint: str,
    *,
    clusters: list[tuple[str, str]] | None = None,
    status: str = "ACTIVE",
    identity: str = IDENTITY,
) -> Any:
    """An EKS client whose ListClusters/DescribeCluster answer with `clusters` (name, stack tag; default: one
    cluster tagged `identity`)."""
    client = boto3.client("eks", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(client)
    clusters = [("gpu-k8s", identity)] if clusters is None else clusters
    stub.add_response("list_clusters", {"clusters": [n for n, _ in clusters]})
    for name, tag in clusters:
        stub.add_response(
            "describe_cluster",
            {
                "cluster": {
                    "name": name,
                    "endpoint": endpoint,
                    "status": status,
                    "version": "1.33",
                    "certificateAuthority": {
                        "data": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
                    },
                    "tags": {"gpucluster:stack": tag},
                }
            },
            {"name": name},
        )
    stub.activate()
    return client


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with fake_kube() as state:
        yield state


def api_of(kube: FakeKube) -> Any:
    from gpucluster.ops.eksapi import EksCluster, kube_client

    return kube_client(EksCluster("gpu-k8s", kube.url, "", "ACTIVE", "1.33"), "k8s-aws-v1.test")


# ------------------------------------------------------------------------------------ token and cluster


def test_the_token_is_a_presigned_get_caller_identity_bound_to_the_cluster() -> None:
    token = eks_token("gpu-k8s", "eu-west-1", CREDENTIALS)
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    body = token.removeprefix("k8s-aws-v1.")
    url = urlparse(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert (url.scheme, url.netloc, url.path) == ("https", "sts.eu-west-1.amazonaws.com", "/")
    assert query["Action"] == "GetCallerIdentity" and query["Version"] == "2011-06-15"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and query["X-Amz-Expires"] == "60"
    assert query["X-Amz-SignedHeaders"] == "host;x-k8s-aws-id"  # the cluster's name is signed in
    assert (
        query["X-Amz-Credential"].startswith("AKIDEXAMPLE/")
        and "/eu-west-1/sts/" in query["X-Amz-Credential"]
    )
    assert eks_token("other", "eu-west-1", CREDENTIALS) != token


def test_the_cluster_is_found_by_its_stack_tag() -> None:
    client = eks_client(
        "https://x.eks.amazonaws.com", clusters=[("a", "someone/else"), ("gpu-k8s", IDENTITY)]
    )
    found = stack_eks_cluster(IDENTITY, client)
    assert (found.name, found.endpoint, found.version) == ("gpu-k8s", "https://x.eks.amazonaws.com", "1.33")


@pytest.mark.parametrize(
    "clusters,message",
    [
        ([], "no EKS cluster in us-east-1 is tagged gpucluster:stack=organization/gpucluster/k8s"),
        (
            [("a", IDENTITY), ("b", IDENTITY)],
            "2 EKS clusters are tagged gpucluster:stack=organization/gpucluster/k8s "
            "(a, b): remove the stale one",
        ),
    ],
)
def test_no_cluster_or_two_is_one_line(clusters: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(NoEksCluster, match=message.replace("(", r"\(").replace(")", r"\)")):
        stack_eks_cluster(IDENTITY, eks_client("https://x", clusters=clusters))


def test_a_cluster_not_active_is_refused_before_any_kubernetes_call() -> None:
    clients = Clients("us-east-1", make=lambda s: eks_client("https://x", status="CREATING"))
    with pytest.raises(NoEksCluster, match="EKS cluster gpu-k8s is CREATING, not ACTIVE"):
        connect(IDENTITY, clients, CREDENTIALS)


# ------------------------------------------------------------------------------------ run --detach


def backend(spec: StackSpec, kube: FakeKube) -> EksJobs:
    """The registry's EKS backend whose cluster is the fake API (endpoint from a stubbed DescribeCluster)."""
    clients = Clients("us-east-1", make=lambda s: eks_client(kube.url, identity=spec.identity))
    jobs = job_backend(spec, clients)
    assert isinstance(jobs, EksJobs)
    return jobs


def test_run_detach_creates_the_jobset_with_an_eks_token(
    spec: StackSpec, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    started: list[Any] = []
    done = backend(spec, kube).run(
        RunRequest("train", "torchrun train.py", detach=True, name="llm", nodes=2), on_start=started.append
    )
    assert done.sent and done.cluster == "gpu-k8s" and started == [done]
    [post] = kube.requests
    assert (post["method"], post["path"]) == ("POST", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets")
    assert post["authorization"].startswith("Bearer k8s-aws-v1.")
    assert post["body"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    pod = post["body"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }


def test_a_dry_run_sends_nothing_and_a_run_without_detach_is_refused(spec: StackSpec, kube: FakeKube) -> None:
    jobs = backend(spec, kube)
    dry = jobs.run(RunRequest("train", "python x.py", detach=True, dry_run=True, name="d"))
    assert not dry.sent and dry.nodes == 4  # desired 0: max_nodes
    with pytest.raises(EksJobError, match="add --detach"):
        jobs.run(RunRequest("train", "python x.py"))
    assert kube.requests == []


def test_a_group_without_an_image_or_unknown_is_one_line(spec: StackSpec) -> None:
    with pytest.raises(EksJobError, match="node group small has no container_image"):
        plan_submit(
            spec,
            "small",
            "x",
            name="a",
            nodes=1,
            master_port=1,
            workdir=None,
            timeout=None,
            restart_on_replace=False,
        )
    with pytest.raises(EksJobError, match="no node group 'nope'"):
        plan_submit(
            spec,
            "nope",
            "x",
            name="a",
            nodes=1,
            master_port=1,
            workdir=None,
            timeout=None,
            restart_on_replace=False,
        )


def test_a_refused_create_is_the_apis_message(spec: StackSpec, kube: FakeKube) -> None:
    sub = plan_submit(
        spec,
        "train",
        "x",
        name="dup",
        nodes=1,
        master_port=29500,
        workdir=None,
        timeout=None,
        restart_on_replace=True,
    )
    assert sub.manifest["spec"]["failurePolicy"] == {"maxRestarts": 3}
    submit(api_of(kube), sub)
    with pytest.raises(
        KubeError,
        match=re.escape('creating JobSet ml/dup: the Kubernetes API answered 409 Conflict: '
                        'jobsets.jobset.x-k8s.io "dup" already exists'),
    ):
        submit(
            api_of(kube),
            plan_submit(
                spec,
                "train",
                "x",
                name="dup",
                nodes=1,
                master_port=29500,
                workdir=None,
                timeout=None,
                restart_on_replace=False,
            ),
        )


# ------------------------------------------------------------------------------------ jobs


def workload(owner: str, *conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"jobset-{owner}-1",
            "namespace": "ml",
            "ownerReferences": [
                {"kind": "JobSet", "name": owner, "apiVersion": "jobset.x-k8s.io/v1alpha2", "uid": "u"}
            ],
        },
        "status": {"conditions": [{"type": t, "status": s, "message": m} for t, s, m in conditions]},
    }


def seed(spec: StackSpec, kube: FakeKube, *names: str) -> None:
    for name in names:
        submit(
            api_of(kube),
            plan_submit(
                spec,
                "train",
                "python t.py",
                name=name,
                nodes=2,
                master_port=29500,
                workdir=None,
                timeout=None,
                restart_on_replace=False,
            ),
        )


def test_jobs_lists_gpuclusters_jobsets_with_kueues_admission(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "queued", "running", "done", "evicted")
    kube.jobsets[("ml", "running")]["spec"]["suspend"] = False
    kube.jobsets[("ml", "done")]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    kube.jobsets[("ml", "other")] = {
        "metadata": {"name": "other", "namespace": "ml", "labels": {}},
        "spec": {},
    }
    kube.workloads = [
        workload(
            "queued",
            (
                "QuotaReserved",
                "False",
                "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu",
            ),
        ),
        workload("running", ("QuotaReserved", "True", ""), ("Admitted", "True", "")),
        workload("done", ("Admitted", "True", ""), ("Finished", "True", "")),
        workload("evicted", ("Evicted", "True", "preempted by a higher priority workload")),
    ]
    found = {j.job: j for j in list_jobs(api_of(kube), "gpu-k8s", None).jobs}
    assert set(found) == {"queued", "running", "done", "evicted"}  # not the JobSet gpucluster did not make
    assert (found["queued"].state, found["queued"].admission) == (
        "Queued",
        "pending: couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu",
    )
    assert (found["running"].state, found["running"].admission) == ("Running", "admitted")
    assert (found["done"].state, found["done"].admission, found["done"].active) == (
        "Completed",
        "finished",
        False,
    )
    assert found["evicted"].admission == "evicted: preempted by a higher priority workload"
    assert found["running"].nodes == 2 and found["running"].node_group == "train"
    [query] = {
        r["query"].get("labelSelector")
        for r in kube.requests
        if r["path"].endswith("/jobsets") and r["method"] == "GET"
    }
    assert query == "app.kubernetes.io/managed-by=gpucluster"
    assert admission(None).startswith("no workload")


def test_an_unauthorised_caller_is_told_about_access_entries(kube: FakeKube) -> None:
    kube.fail[("GET", "/apis/jobset.x-k8s.io")] = (401, "Unauthorized")
    with pytest.raises(
        KubeError,
        match=r"answered 401 Unauthorized: Unauthorized \(is your IAM identity given "
        r"access to the cluster\? EKS access entries\)",
    ):
        list_jobs(api_of(kube), "gpu-k8s", "train")


# ------------------------------------------------------------------------------------ logs


def leader(name: str, index: str, created: str, job: str = "llm") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "creationTimestamp": created,
            "labels": {"gpucluster.io/job": job},
            "annotations": {"batch.kubernetes.io/job-completion-index": index},
        },
        "spec": {"containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    }


def test_logs_read_the_live_leader_pod(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "llm")
    kube.pods = [
        leader("llm-node-0-0-old", "0", "2026-11-29T07:01:00Z"),
        leader("llm-node-0-0-new", "0", "2026-11-29T07:09:00Z"),
        leader("llm-node-0-1-x", "1", "2026-11-29T07:10:00Z"),
    ]
    kube.logs = {"llm-node-0-0-new": "a\nb\nNET/OFI Selected Provider is efa\n", "llm-node-0-1-x": "worker\n"}
    out = leader_log(api_of(kube), "gpu-k8s", "llm", 2)
    assert out.pod == "llm-node-0-0-new"
    assert out.text == "b\nNET/OFI Selected Provider is efa\n"
    [read] = [r for r in kube.requests if r["path"].endswith("/log")]
    assert read["query"] == {"container": "main", "tailLines": "2"}


def test_logs_of_a_queued_job_say_no_pod_and_of_no_job_say_so(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "llm")
    assert leader_log(api_of(kube), "gpu-k8s", "llm", 10).pod is None
    with pytest.raises(EksJobError, match="no gpucluster JobSet named 'nope' on EKS cluster gpu-k8s"):
        leader_log(api_of(kube), "gpu-k8s", "nope", 10)


def test_follow_waits_for_the_leader_then_streams_until_it_ends(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "llm")
    api, got, waits = api_of(kube), [], []

    def wait() -> None:  # Kueue admits it while we wait; the pod runs and finishes
        waits.append(1)
        kube.jobsets[("ml", "llm")]["spec"]["suspend"] = False
        kube.pods = [leader("llm-node-0-0-a", "0", "2026-11-29T07:01:00Z")]
        kube.logs = {"llm-node-0-0-a": "step 1\nstep 2\n"}
        kube.jobsets[("ml", "llm")]["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}

    ended = follow_log(api, "gpu-k8s", "llm", got.append, wait=wait)
    assert waits == [1] and "".join(got) == "step 1\nstep 2\n"
    assert ended.pod == "llm-node-0-0-a" and ended.job.state == "Completed"
    assert any(r["query"].get("follow") == "true" for r in kube.requests if r["path"].endswith("/log"))


# ------------------------------------------------------------------------------------ cancel


@pytest.mark.parametrize(
    "keep,deleted,state", [(None, True, "gone"), ("mark", True, "deleting"), ("ignore", False, "Queued")]
)
def test_cancel_reports_only_what_it_read_back(
    spec: StackSpec, kube: FakeKube, keep: str | None, deleted: bool, state: str
) -> None:
    seed(spec, kube, "llm")
    kube.keep_on_delete = keep
    done = cancel(api_of(kube), "gpu-k8s", "llm")
    assert (done.deleted, done.state) == (deleted, state)
    [delete] = [r for r in kube.requests if r["method"] == "DELETE"]
    assert delete["path"] == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/llm"
    assert delete["query"]["propagationPolicy"] == "Foreground"


def test_a_forbidden_delete_is_not_a_cancel(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "llm")
    kube.fail[("DELETE", "/apis/jobset.x-k8s.io")] = (
        403,
        'jobsets "llm" is forbidden: User "dev" cannot delete',
    )
    done = cancel(api_of(kube), "gpu-k8s", "llm")
    assert not done.deleted and done.state == "Queued" and "403 Forbidden" in done.message
    assert ("ml", "llm") in kube.jobsets


def test_a_job_name_names_one_job_so_no_group(spec: StackSpec) -> None:
    jobs = EksJobs(spec, Clients("us-east-1"))
    with pytest.raises(EksJobError, match="--group: a JobSet name names one job"):
        jobs.job_id("llm", group="train")
    assert jobs.refusal("login") is not None and jobs.refusal("hostfile") is not None
    assert jobs.refusal("nodes") is None  # --nodes is how many pods


# ------------------------------------------------------------------------------------ through the CLI


@pytest.fixture
def eks_stack(write_stack: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(common, "client", lambda spec, service: eks_client(kube.url, identity=spec.identity))
    return str(write_stack(eks_config(), "k8s"))


def test_the_cli_runs_lists_reads_and_cancels_an_eks_job(eks_stack: str, kube: FakeKube) -> None:
    dry = runner.invoke(
        app,
        [
            "run",
            eks_stack,
            "-g",
            "train",
            "--detach",
            "--dry-run",
            "--name",
            "llm",
            "--nodes",
            "2",
            "--",
            "torchrun",
            "train.py",
        ],
    )
    assert dry.exit_code == 0, dry.output
    assert (
        "would create this JobSet in namespace ml (2 pod(s), one a node, each 8 GPU(s) and 32 EFA"
        in dry.output
    )
    assert "kind: JobSet" in dry.stdout and kube.requests == []
    ran = runner.invoke(
        app,
        [
            "run",
            eks_stack,
            "-g",
            "train",
            "--detach",
            "--name",
            "llm",
            "--nodes",
            "2",
            "--json",
            "--",
            "torchrun",
            "train.py",
        ],
    )
    assert ran.exit_code == 0, ran.output
    document = json.loads(ran.stdout)
    assert (document["scheduler"], document["job_name"], document["cluster"]) == ("eks", "llm", "gpu-k8s")
    listed = runner.invoke(app, ["jobs", eks_stack])
    assert listed.exit_code == 0, listed.output
    assert "llm" in listed.output and "Queued" in listed.output and "no workload" in listed.output
    logs = runner.invoke(app, ["logs", eks_stack, "llm"])
    assert logs.exit_code == 0 and "no pod yet" in logs.output
    cancelled = runner.invoke(app, ["cancel", eks_stack, "llm", "--yes", "--json"])
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["deleted"] is True
    again = runner.invoke(app, ["cancel", eks_stack, "llm", "--yes"])
    assert again.exit_code == 2 and "no gpucluster JobSet named 'llm'" in again.output
    assert runner.invoke(app, ["login", eks_stack]).exit_code == 2


def test_find_job_picks_the_named_one(spec: StackSpec, kube: FakeKube) -> None:
    seed(spec, kube, "a", "b")
    assert find_job(api_of(kube), "gpu-k8s", "b").job == "b"


@pytest.mark.parametrize(
    "args,line",
    [
        (["--nodes", "9"], "run: --nodes: must be 1..4 (node group train's max_nodes), got 9"),
        (["--name", "Bad_Name"], "run: --name: 'Bad_Name' must be 1-40 lower-case letters"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(eks_stack: str, kube: FakeKube, args: list[str], line: str) -> None:
    ran = runner.invoke(app, ["run", eks_stack, "-g", "train", "--detach", *args, "--", "python", "t.py"])
    assert ran.exit_code == 2, ran.output
    assert line in ran.output and "Traceback" not in ran.output
    assert kube.requests == []
    refused = runner.invoke(app, ["run", eks_stack, "-g", "train", "--", "python", "t.py"])
    assert refused.exit_code == 2 and "add --detach" in refused.output
