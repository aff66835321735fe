"""`doctor` and `verify` on an EKS stack: each check's pass, fail and unknown (or ok, warning, blocker),
with a stubbed EKS client (botocore's Stubber) and the fake Kubernetes API (`fake_kube`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from fake_kube import FakeKube, fake_kube
from gpucluster.ops import Clients, doctor
from gpucluster.ops.eksapi import EksCluster, NoEksCluster, kube_client
from gpucluster.ops.verify import JobRefused, run_check, verify
from gpucluster.ops.verifycheck import Deployed, Outcome, Unknown
from gpucluster.ops.verifyeks import (
    EKS_ADDONS,
    check_eks_addons,
    check_eks_cluster,
    check_eks_controllers,
    check_eks_job,
    check_eks_nodes,
    eks_checks,
)
from gpucluster.ops.verifyiam import Account
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec
from test_eks_jobs import eks_config


@pytest.fixture(scope="module")
def spec() -> StackSpec:
    return parse_stack_config(eks_config(), "k8s")


def stubbed() -> tuple[Any, Stubber]:
    client = boto3.client("eks", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    return client, Stubber(client)


def cluster_answers(stub: Stubber, tag: str, status: str = "ACTIVE") -> None:
    stub.add_response("list_clusters", {"clusters": ["gpu-k8s"]})
    stub.add_response(
        "describe_cluster",
        {
            "cluster": {
                "name": "gpu-k8s",
                "status": status,
                "version": "1.33",
                "tags": {"gpucluster:stack": tag},
            }
        },
        {"name": "gpu-k8s"},
    )


# ----------------------------------------------------------------------------------------- doctor


@pytest.mark.parametrize(
    "status,level", [("STANDARD_SUPPORT", "ok"), ("EXTENDED_SUPPORT", "warning"), (None, "blocker")]
)
def test_doctor_reads_the_versions_support(status: str | None, level: str) -> None:
    # 1.32: one the catalog still accepts (an ended one is refused before doctor runs), which AWS's own
    # answer may still call extended, or no longer offer in the region
    spec = parse_stack_config(eks_config_with_version("1.32"), "k8s")
    eks, stub = stubbed()
    versions = [] if status is None else [{"clusterVersion": "1.32", "versionStatus": status}]
    stub.add_response(
        "describe_cluster_versions", {"clusterVersions": versions}, {"clusterVersions": ["1.32"]}
    )
    stub.add_client_error("describe_cluster", "ResourceNotFoundException", http_status_code=404)
    with stub:
        found = list(doctor.check_eks(spec, eks))
    assert [(f.level, f.check) for f in found] == [(level, "eks-version"), ("ok", "eks-access")]
    if level == "blocker":
        assert "EKS does not offer Kubernetes 1.32 in us-east-1" in found[0].message


def eks_config_with_version(version: str) -> dict[str, Any]:
    config = eks_config()
    config["gpucluster:scheduler"]["kubernetes_version"] = version
    return config


@pytest.mark.parametrize(
    "code,level,words",
    [
        ("AccessDeniedException", "warning", "may not call eks:DescribeCluster"),
        ("ThrottlingException", "warning", "could not check (ThrottlingException"),
    ],
)
def test_doctor_says_when_the_caller_may_not_describe_the_cluster(
    spec: StackSpec, code: str, level: str, words: str
) -> None:
    eks, stub = stubbed()
    stub.add_client_error("describe_cluster", code, "no", http_status_code=400)
    with stub:
        found = list(doctor.check_eks(spec, eks))
    assert found[0].level == "ok" and found[0].subject == "default"  # no version given: the catalog's
    assert found[1].level == level and words in found[1].message


def test_doctor_asks_for_the_cluster_by_the_name_the_stack_gives_it(spec: StackSpec) -> None:
    """The probe names the stack's own EKS cluster (`eks_cluster_name`: the cluster name and the identity's
    hash), the one ARN the deploy role's DescribeCluster grant covers, not the bare cluster name."""
    from gpucluster.eks.naming import eks_cluster_name

    name = eks_cluster_name(spec.cluster.name, spec.identity)
    assert name != spec.cluster.name
    eks, stub = stubbed()
    stub.add_client_error("describe_cluster", "ResourceNotFoundException", http_status_code=404,
                          expected_params={"name": name})
    with stub:
        found = list(doctor.check_eks(spec, eks))
    assert (found[1].check, found[1].subject, found[1].level) == ("eks-access", name, "ok")
    stub.assert_no_pending_responses()


def test_the_operator_policy_allows_what_finding_an_eks_cluster_and_verifying_it_call() -> None:
    from gpucluster.ops.permissions import allowed_actions, operator_policy

    assert {"eks:ListClusters", "eks:DescribeCluster", "eks:ListAddons", "eks:DescribeAddon"} <= (
        allowed_actions(operator_policy("k8s")))


def test_doctor_cannot_ask_for_the_version_is_a_warning() -> None:
    spec = parse_stack_config(eks_config_with_version("1.33"), "k8s")
    eks, stub = stubbed()
    stub.add_client_error(
        "describe_cluster_versions", "AccessDeniedException", "denied", http_status_code=403
    )
    stub.add_response("describe_cluster", {"cluster": {"name": "x"}})
    with stub:
        found = list(doctor.check_eks(spec, eks))
    assert [(f.level, f.check) for f in found] == [("warning", "eks-version"), ("ok", "eks-access")]
    assert "could not check (AccessDeniedException" in found[0].message


def test_doctor_runs_the_eks_checks_only_on_an_eks_stack(
    spec: StackSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "check_offerings",
        "check_efa",
        "check_reservations",
        "check_quotas",
        "check_identity",
        "check_cost_tags",
        "check_iam_names",
    ):
        monkeypatch.setattr(doctor, name, lambda *a, **k: [])
    monkeypatch.setattr(doctor, "identity_groups", lambda *a: [])
    asked: list[str] = []
    monkeypatch.setattr(doctor, "check_eks", lambda s, eks: asked.append(eks) or [])
    doctor.run_checks(spec, Clients("us-east-1", make=lambda service: service))
    plain = parse_stack_config({**eks_config(), "gpucluster:scheduler": {"type": "none"}}, "plain")
    doctor.run_checks(plain, Clients("us-east-1", make=lambda service: service))
    assert asked == ["eks"]


# ----------------------------------------------------------------------------------------- verify


class FakeDeployed(Deployed):
    """The account's lookups answered by the test: EKS through `eks`, the groups, the API."""

    def __init__(
        self,
        spec: StackSpec,
        eks: Any = None,
        kube: FakeKube | None = None,
        groups: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(
            spec,
            Clients("us-east-1", make=lambda service: eks),
            Account("aws", "us-east-1", "111122223333", "arn:aws:iam::111122223333:user/dev"),
        )
        self._kube, self._groups = kube, groups or []

    def groups(self) -> list[dict[str, Any]]:
        return self._groups

    def eks(self) -> tuple[Any, Any]:
        if self._kube is None:
            raise NoEksCluster("no EKS cluster in us-east-1 is tagged gpucluster:stack=x")
        return (
            EksCluster("gpu-k8s", self._kube.url, "", "ACTIVE", "1.33"),
            kube_client(EksCluster("gpu-k8s", self._kube.url, "", "ACTIVE", "1.33"), "k8s-aws-v1.t"),
        )


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with fake_kube() as state:
        yield state


@pytest.mark.parametrize("status,result", [("ACTIVE", "pass"), ("CREATING", "fail")])
def test_the_cluster_is_active(spec: StackSpec, status: str, result: str) -> None:
    eks, stub = stubbed()
    cluster_answers(stub, spec.identity, status)
    with stub:
        assert check_eks_cluster(FakeDeployed(spec, eks)).result == result


def test_no_cluster_fails(spec: StackSpec) -> None:
    eks, stub = stubbed()
    stub.add_response("list_clusters", {"clusters": []})
    with stub:
        outcome = check_eks_cluster(FakeDeployed(spec, eks))
    assert outcome.result == "fail" and "no EKS cluster in us-east-1" in outcome.detail


def addon(name: str, status: str = "ACTIVE", issues: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "addon": {
            "addonName": name,
            "clusterName": "gpu-k8s",
            "status": status,
            "health": {"issues": issues or []},
        }
    }


def test_every_addon_active_passes_and_a_degraded_or_missing_one_fails(spec: StackSpec) -> None:
    eks, stub = stubbed()
    cluster_answers(stub, spec.identity)
    stub.add_response("list_addons", {"addons": list(EKS_ADDONS)}, {"clusterName": "gpu-k8s"})
    for name in EKS_ADDONS:
        stub.add_response("describe_addon", addon(name), {"clusterName": "gpu-k8s", "addonName": name})
    with stub:
        assert check_eks_addons(FakeDeployed(spec, eks)).result == "pass"
    eks, stub = stubbed()
    cluster_answers(stub, spec.identity)
    present = [a for a in EKS_ADDONS if a != "eks-node-monitoring-agent"]
    stub.add_response("list_addons", {"addons": present}, {"clusterName": "gpu-k8s"})
    for name in present:
        degraded = name == "coredns"
        stub.add_response(
            "describe_addon",
            addon(
                name,
                "DEGRADED" if degraded else "ACTIVE",
                [{"code": "InsufficientNumberOfReplicas", "message": "0 of 2 ready"}] if degraded else None,
            ),
            {"clusterName": "gpu-k8s", "addonName": name},
        )
    with stub:
        outcome = check_eks_addons(FakeDeployed(spec, eks))
    assert outcome.result == "fail"
    assert outcome.detail == (
        "add-ons missing: eks-node-monitoring-agent; not ACTIVE: coredns (DEGRADED: "
        "InsufficientNumberOfReplicas: 0 of 2 ready)"
    )


def test_addons_without_a_cluster_are_unknown(spec: StackSpec) -> None:
    eks, stub = stubbed()
    stub.add_response("list_clusters", {"clusters": []})
    with stub, pytest.raises(Unknown):
        check_eks_addons(FakeDeployed(spec, eks))


def node(name: str, group: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpucluster.io/group": group}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def asg(group: str, in_service: int, pending: int = 0) -> dict[str, Any]:
    return {
        "AutoScalingGroupName": f"k8s-{group}",
        "Tags": [{"Key": "gpucluster:node-group", "Value": group}],
        "Instances": [{"InstanceId": f"i-{n}", "LifecycleState": "InService"} for n in range(in_service)]
        + [{"InstanceId": f"i-p{n}", "LifecycleState": "Pending"} for n in range(pending)],
    }


@pytest.mark.parametrize(
    "nodes,in_service,result",
    [
        ([node("a", "train"), node("b", "train")], 2, "pass"),
        ([node("a", "train"), node("b", "train", ready=False)], 2, "fail"),  # one not Ready
        ([node("a", "train")], 2, "fail"),  # one never joined
        ([], 0, "unknown"),  # at zero: nothing to see
    ],
)
def test_nodes_joined_is_ready_nodes_against_in_service(
    spec: StackSpec, kube: FakeKube, nodes: list[Any], in_service: int, result: str
) -> None:
    kube.lists["/api/v1/nodes"] = [*nodes, node("z", "small")]
    deployed = FakeDeployed(spec, kube=kube, groups=[asg("train", in_service, pending=1), asg("small", 1)])
    assert check_eks_nodes(deployed, "train").result == result
    [listed] = [r for r in kube.requests if r["path"] == "/api/v1/nodes"]
    assert listed["query"]["labelSelector"] == "gpucluster.io/group=train"


def test_nodes_when_the_api_refuses_or_no_cluster_are_unknown(spec: StackSpec, kube: FakeKube) -> None:
    kube.fail[("GET", "/api/v1/nodes")] = (403, 'nodes is forbidden: User "dev" cannot list resource "nodes"')
    check = run_check(plan("eks-nodes.train", FakeDeployed(spec, kube=kube, groups=[asg("train", 1)])))
    assert check.result == "unknown" and "403 Forbidden" in check.detail and "access entries" in check.detail
    check = run_check(plan("eks-nodes.train", FakeDeployed(spec, groups=[asg("train", 1)])))
    assert check.result == "unknown" and "no EKS cluster" in check.detail


def plan(id_: str, deployed: Deployed, job: bool = False) -> Any:
    from gpucluster.ops.verify import PlannedCheck

    [(i, name, subject, run)] = [c for c in eks_checks(deployed, job=job) if c[0] == id_]
    return PlannedCheck(i, name, subject, run)


def deployment(name: str, want: int, available: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "kueue-system",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
        },
        "spec": {"replicas": want, "selector": {}, "template": {}},
        "status": {"replicas": want, "availableReplicas": available},
    }


def daemonset(name: str, want: int, available: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
        },
        "spec": {"selector": {}, "template": {}},
        "status": {
            "desiredNumberScheduled": want,
            "numberAvailable": available,
            "currentNumberScheduled": want,
            "numberMisscheduled": 0,
            "numberReady": available,
        },
    }


@pytest.mark.parametrize(
    "deployments,daemonsets,result",
    [
        ([deployment("kueue-controller-manager", 1, 1)], [daemonset("nvidia-device-plugin", 2, 2)], "pass"),
        ([deployment("kueue-controller-manager", 1, 0)], [], "fail"),
        ([deployment("kueue-controller-manager", 1, 1)], [daemonset("efa-device-plugin", 2, 1)], "fail"),
        ([], [], "fail"),  # no chart installed
    ],
)
def test_the_charts_controllers_are_available(
    spec: StackSpec, kube: FakeKube, deployments: list[Any], daemonsets: list[Any], result: str
) -> None:
    kube.lists["/apis/apps/v1/deployments"] = deployments
    kube.lists["/apis/apps/v1/daemonsets"] = daemonsets
    outcome = check_eks_controllers(FakeDeployed(spec, kube=kube))
    assert outcome.result == result, outcome.detail
    if result == "fail" and deployments:
        assert "kueue-system/" in outcome.detail or "kube-system/efa-device-plugin (1/2)" in outcome.detail


def test_the_job_check_runs_one_gpu_pod_through_kueue_and_deletes_it(spec: StackSpec, kube: FakeKube) -> None:
    def admitted(_: float) -> None:  # Kueue admits, the pod runs nvidia-smi -L and completes
        [(key, obj)] = kube.jobsets.items()
        obj["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
        pod = f"{key[1]}-node-0-0-abc"
        kube.pods = [
            {
                "metadata": {
                    "name": pod,
                    "namespace": key[0],
                    "labels": {"gpucluster.io/job": key[1]},
                    "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
                },
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            }
        ]
        kube.logs = {pod: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"}

    outcome = check_eks_job(FakeDeployed(spec, kube=kube), "train", sleep=admitted)
    assert outcome.result == "pass" and "GPU 0: NVIDIA H100" in outcome.detail
    [post] = [r for r in kube.requests if r["method"] == "POST"]
    pod = post["body"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["/bin/bash", "-c", "nvidia-smi -L"]
    assert post["body"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 1
    assert kube.jobsets == {}  # deleted at the end


def test_a_job_kueue_never_admits_fails_with_kueues_reason_and_is_deleted(
    spec: StackSpec, kube: FakeKube
) -> None:
    ticks = iter(range(0, 10_000, 300))

    def pending(_: float) -> None:
        [(key, _obj)] = kube.jobsets.items()
        kube.workloads = [
            {
                "metadata": {
                    "name": "w",
                    "namespace": key[0],
                    "ownerReferences": [{"kind": "JobSet", "name": key[1]}],
                },
                "status": {
                    "conditions": [
                        {
                            "type": "QuotaReserved",
                            "status": "False",
                            "message": "insufficient quota for nvidia.com/gpu",
                        }
                    ]
                },
            }
        ]

    outcome = check_eks_job(FakeDeployed(spec, kube=kube), "train", sleep=pending, clock=lambda: next(ticks))
    assert outcome.result == "fail"
    assert (
        "still Queued after 900 s (Kueue: pending: insufficient quota for nvidia.com/gpu)" in outcome.detail
    )
    assert kube.jobsets == {}


def test_a_group_without_an_image_makes_the_job_check_unknown(spec: StackSpec, kube: FakeKube) -> None:
    check = run_check(plan("eks-job.small", FakeDeployed(spec, kube=kube), job=True))
    assert check.result == "unknown" and "no container_image" in check.detail
    assert kube.requests == []


def test_the_eks_checks_and_job_only_when_asked(spec: StackSpec) -> None:
    deployed = FakeDeployed(spec)
    assert [c[0] for c in eks_checks(deployed, job=False)] == [
        "eks-cluster",
        "eks-addons",
        "eks-nodes.train",
        "eks-nodes.small",
        "eks-controllers",
    ]
    assert [c[0] for c in eks_checks(deployed, job=True)][-2:] == ["eks-job.train", "eks-job.small"]


def test_verify_job_is_refused_only_off_slurm_and_eks(
    spec: StackSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpucluster.ops.verify as verify_module

    monkeypatch.setattr(
        verify_module,
        "account_of",
        lambda clients, region: Account("aws", region, "111122223333", "arn:aws:iam::111122223333:user/dev"),
    )
    monkeypatch.setattr(
        verify_module,
        "plan_checks",
        lambda *a, **k: [verify_module.PlannedCheck("x", "x", "x", lambda: Outcome("pass", "ok"))],
    )
    assert verify(spec, Clients("us-east-1"), job=True).checks[0].result == "pass"
    plain = parse_stack_config({**eks_config(), "gpucluster:scheduler": {"type": "none"}}, "plain")
    with pytest.raises(JobRefused, match="--job runs a Slurm job"):
        verify(plain, Clients("us-east-1"), job=True)


def test_a_job_check_the_api_refuses_is_unknown(spec: StackSpec, kube: FakeKube) -> None:
    kube.fail[("POST", "/apis/jobset.x-k8s.io")] = (403, 'jobsets is forbidden: User "dev" cannot create')
    check = run_check(plan("eks-job.train", FakeDeployed(spec, kube=kube), job=True))
    assert check.result == "unknown" and "creating JobSet" in check.detail and "403 Forbidden" in check.detail


def test_a_test_job_left_behind_is_said(spec: StackSpec, kube: FakeKube) -> None:
    kube.keep_on_delete = "ignore"

    def done(_: float) -> None:
        [(_key, obj)] = kube.jobsets.items()
        obj["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}

    from gpucluster.ops.verify import PlannedCheck

    deployed = FakeDeployed(spec, kube=kube)
    check = run_check(PlannedCheck("eks-job.train", "job", "train",
                                   lambda: check_eks_job(deployed, "train", sleep=done)))
    assert check.result == "unknown" and "was not deleted" in check.detail
