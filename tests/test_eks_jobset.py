"""The JobSet `run --detach` submits on an EKS stack (`eks.jobset`): its structure, and its core parts
(the `batch/v1` Job and `v1` Pod templates) valid under `kubernetes-validate --strict` for the cluster's
version."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from base_config import base
from gpucluster import catalog
from gpucluster.eks.jobset import (
    GPU_TAINT,
    JobSetError,
    JobSetJob,
    jobset,
    leader_host,
    pod_objects,
    pod_shape,
)
from gpucluster.node.userdata import efa_environment, group_bootstrap
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import NodeGroupConfig, StackSpec

KUBERNETES = "1.33"


def eks_stack_config(*groups: dict[str, Any]) -> dict[str, Any]:
    """An EKS stack of `groups`, in a zone of us-east-1 or us-west-2 that offers all of their types."""
    types = [t for g in groups for t in g["instance_types"]]
    region = next(r for r in ("us-east-1", "us-west-2") if all(catalog.offered_zones(t, r) for t in types))
    zones = sorted(set.intersection(*(set(catalog.offered_zones(t, region) or []) for t in types)))
    config = base()
    config["aws:region"] = region
    config["gpucluster:network"]["availability_zones"] = zones[:2]
    config["gpucluster:node_groups"] = list(groups)
    config["gpucluster:scheduler"] = {"type": "eks", "teams": ["ml"]}
    return config


def stack(*groups: dict[str, Any]) -> StackSpec:
    return parse_stack_config(eks_stack_config(*groups), "k8s")


P5 = {"name": "train", "instance_types": ["p5.48xlarge"], "min_nodes": 0, "max_nodes": 4}
G5 = {"name": "small", "instance_types": ["g5.12xlarge"], "min_nodes": 0, "max_nodes": 1}


def render(group: NodeGroupConfig, spec: StackSpec, **job: Any) -> dict[str, Any]:
    env = efa_environment(
        group_bootstrap(
            group, stack=spec.identity, cluster=spec.cluster.name, region=spec.region, spot=spec.spot
        )
    )
    values = {
        "name": "llm",
        "namespace": "ml",
        "command": "torchrun train.py",
        "image": "img:1",
        "nodes": 2,
        **job,
    }
    return jobset(JobSetJob(**values), group, pod_shape(group, env))


@pytest.fixture(scope="module")
def efa() -> tuple[NodeGroupConfig, dict[str, Any]]:
    spec = stack(P5)
    return spec.node_groups[0], render(spec.node_groups[0], spec, timeout_seconds=3600, workdir="/work")


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod_spec(obj)["containers"][0]["env"]}


def test_a_two_node_torchrun_jobset_through_kueue(efa: tuple[NodeGroupConfig, dict[str, Any]]) -> None:
    _, obj = efa
    assert (obj["apiVersion"], obj["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    assert obj["metadata"]["namespace"] == "ml"
    [replicated] = obj["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert replicated["replicas"] == 1
    assert (job["completionMode"], job["parallelism"], job["completions"], job["backoffLimit"]) == (
        "Indexed",
        2,
        2,
        0,
    )
    assert job["activeDeadlineSeconds"] == 3600
    assert obj["spec"]["network"] == {"enableDNSHostnames": True}
    assert obj["spec"]["failurePolicy"] == {"maxRestarts": 0}


def test_each_pod_takes_a_whole_node_of_its_group_with_efa_and_shm(
    efa: tuple[NodeGroupConfig, dict[str, Any]],
) -> None:
    _, obj = efa
    pod = pod_spec(obj)
    assert pod["nodeSelector"] == {"gpucluster.io/group": "train"}
    assert pod["tolerations"] == [{**GPU_TAINT, "operator": "Equal"}]
    assert pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    # p5.48xlarge: 8 GPUs and 32 EFA interfaces (the catalog), limits = requests (extended resources)
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert container["command"] == ["/bin/bash", "-c", "torchrun train.py"]
    assert container["workingDir"] == "/work"


def test_the_rendezvous_and_nccl_efa_settings(efa: tuple[NodeGroupConfig, dict[str, Any]]) -> None:
    _, obj = efa
    env = env_of(obj)
    assert env["MASTER_ADDR"] == leader_host("llm") == "llm-node-0-0.llm"
    assert (env["MASTER_PORT"], env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == (
        "29500",
        "2",
        "8",
        "16",
    )
    assert env["NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"  # p5: GPUDirect RDMA
    assert env["NCCL_DEBUG"] == "INFO"


def test_a_group_without_efa_asks_for_none_and_sets_no_efa_provider() -> None:
    spec = stack(G5)
    obj = render(spec.node_groups[0], spec, nodes=1)
    assert pod_spec(obj)["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    env = env_of(obj)
    assert "FI_PROVIDER" not in env and "FI_EFA_USE_DEVICE_RDMA" not in env and env["NCCL_DEBUG"] == "INFO"
    assert "activeDeadlineSeconds" not in obj["spec"]["replicatedJobs"][0]["template"]["spec"]


@pytest.mark.parametrize(
    "job,message",
    [
        ({"name": "Bad_Name"}, "--name: 'Bad_Name' must be 1-40 lower-case"),
        ({"name": "x" * 41}, "--name"),
        ({"nodes": 5}, "--nodes: must be 1..4 (node group train's max_nodes), got 5"),
        ({"nodes": 0}, "--nodes: must be 1..4"),
        ({"command": "  "}, "command: is empty"),
        ({"master_port": 0}, "--master-port: must be 1..65535"),
    ],
)
def test_what_cannot_run_is_one_line(
    efa: tuple[NodeGroupConfig, dict[str, Any]], job: dict[str, Any], message: str
) -> None:
    group, _ = efa
    with pytest.raises(JobSetError) as err:
        render(group, stack(P5), **job)
    assert message in str(err.value)


def test_a_mig_group_is_refused() -> None:
    spec = stack(
        {
            "name": "mig",
            "instance_types": ["p5.48xlarge"],
            "min_nodes": 0,
            "max_nodes": 1,
            "efa": "off",
            "mig": {"profile": "3g.40gb"},
        }
    )
    with pytest.raises(JobSetError, match="MIG devices"):
        render(spec.node_groups[0], spec, nodes=1)


@pytest.mark.parametrize("name", ["efa", "plain"])
def test_the_job_and_pod_templates_are_valid_kubernetes(
    efa: tuple[NodeGroupConfig, dict[str, Any]], name: str
) -> None:
    if name == "efa":
        obj = efa[1]
    else:
        spec = stack(G5)
        obj = render(spec.node_groups[0], spec, nodes=1)
    parts = pod_objects(obj)
    assert [p["kind"] for p in parts] == ["Job", "Pod"]
    for part in parts:
        kubernetes_validate.validate(part, KUBERNETES, strict=True)


def test_the_validator_does_refuse_a_wrong_field(efa: tuple[NodeGroupConfig, dict[str, Any]]) -> None:
    """The check above can fail: a misspelt key under the pod is refused."""
    import copy

    obj = copy.deepcopy(efa[1])
    pod_spec(obj)["nodeSelektor"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod_objects(obj)[1], KUBERNETES, strict=True)
