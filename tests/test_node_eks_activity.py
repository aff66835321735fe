"""`gpucluster-report activity` on an EKS node: busy only while a Running pod holds nvidia.com/gpu (the
kubelet's pod list, fixture JSON from a fake curl) AND the busiest GPU's utilisation over the samples
reaches the threshold (fake nvidia-smi, a sample a call). Under bash with fake aws, curl, nvidia-smi and
logger on PATH, as the other node-script tests."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from base_config import base
from fake_node import logged_calls, run_script, script, write_stubs
from gpucluster.node.userdata import ACTIVITY_METRIC, NodeBootstrap, node_bootstrap, node_env
from gpucluster.preflight import parse_stack_config
from test_node_activity import NODE

EKS_NODE = replace(NODE, eks_cluster="gpu-dev-eks", gpu_busy_percent=5)


def pod(
    name: str,
    phase: str = "Running",
    gpus: int | None = 1,
    *,
    requests_only: bool = False,
    init_gpus: int = 0,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        key = "requests" if requests_only else "limits"
        resources = {key: {"nvidia.com/gpu": str(gpus), "cpu": "4"}}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    if init_gpus:
        spec["initContainers"] = [
            {"name": "init", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}
        ]
    return {"metadata": {"name": name, "namespace": "team-a"}, "spec": spec, "status": {"phase": phase}}


def pod_list(*pods: dict[str, Any]) -> str:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)})


def run(
    tmp_path: Path,
    *,
    pods: str | None,
    samples: list[str],
    node: NodeBootstrap = EKS_NODE,
    token_fails: bool = False,
    smi_fails: bool = False,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`samples`: what each nvidia-smi call prints, one GPU's utilisation per space-separated number."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "calls.log"
    env_file = tmp_path / "node.env"
    env_file.write_text(node_env(node))
    (tmp_path / "pods.json").write_text(pods or "")
    (tmp_path / "samples.txt").write_text("".join(f"{s}\n" for s in samples))
    (tmp_path / "count").write_text("1")
    smi = (
        f"n=$(cat {tmp_path}/count); echo $((n + 1)) > {tmp_path}/count; "
        f'sed -n "${{n}}p" {tmp_path}/samples.txt | tr " " "\\n"'
    )
    write_stubs(
        tmp_path / "bin",
        log,
        {
            "aws": (
                'case "$1 $2" in "eks get-token") '
                + ("exit 254" if token_fails else "echo k8s-aws-v1.abc")
                + ";; esac; exit 0"
            ),
            "curl": "exit 7" if pods is None else f"cat {tmp_path}/pods.json",
            "nvidia-smi": "exit 9" if smi_fails else smi,
            "logger": "exit 0",
        },
    )
    (tmp_path / "eks-activity.sh").write_text(script("eks-activity.sh"))
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "GPUCLUSTER_NODE_ENV": str(env_file),
        "GPUCLUSTER_EKS_ACTIVITY": str(tmp_path / "eks-activity.sh"),
        "GPUCLUSTER_BUSY_INTERVAL_SECONDS": "0",
        "GPUCLUSTER_BUSY_SAMPLES": "3",
    }
    return run_script(tmp_path, "report.sh", "activity", env=env, timeout=30), log


def published(log: Path) -> list[str]:
    return [c for c in logged_calls(log, "aws") if c.startswith("cloudwatch put-metric-data")]


def value(log: Path) -> str:
    [call] = published(log)
    assert f"--metric-name {ACTIVITY_METRIC}" in call
    assert "--dimensions Stack=organization/gpucluster/dev/gpu-dev,NodeGroup=dev-a10" in call
    return call.split("--value ", 1)[1].split()[0]


def test_a_gpu_pod_whose_gpus_work_is_busy(tmp_path: Path) -> None:
    result, log = run(
        tmp_path, pods=pod_list(pod("train-0", gpus=8)), samples=["0 97 95", "3 99 90", "0 98 96"]
    )
    assert result.returncode == 0, result.stderr
    assert value(log) == "1"
    [token] = [c for c in logged_calls(log, "aws") if c.startswith("eks get-token")]
    assert "--cluster-name gpu-dev-eks" in token and "--region us-east-1" in token
    [curl] = logged_calls(log, "curl")
    assert curl.endswith("https://127.0.0.1:10250/pods") and "Authorization: Bearer k8s-aws-v1.abc" in curl
    assert len(logged_calls(log, "nvidia-smi")) == 3  # the window: every sample taken


def test_a_gpu_pod_holding_idle_gpus_is_idle(tmp_path: Path) -> None:
    """The allocation Karpenter and the cluster-autoscaler count as busy: here it is idle."""
    result, log = run(tmp_path, pods=pod_list(pod("notebook", gpus=1)), samples=["0 1", "2 0", "0 0"])
    assert result.returncode == 0, result.stderr
    assert value(log) == "0"
    assert "the busiest GPU at 1 % (under 5 %): idle" in result.stdout


def test_the_window_is_a_mean_not_one_sample(tmp_path: Path) -> None:
    """One busy sample among idle ones (a data-loader burst) stays under 5 %; a steady 6 % does not."""
    _, log = run(tmp_path / "burst", pods=pod_list(pod("p")), samples=["12", "0", "0"])
    assert value(log) == "0"  # mean 4 %
    _, log = run(tmp_path / "steady", pods=pod_list(pod("p")), samples=["6", "5", "7"])
    assert value(log) == "1"


def test_the_threshold_is_the_stacks(tmp_path: Path) -> None:
    node = replace(EKS_NODE, gpu_busy_percent=40)
    _, log = run(tmp_path, pods=pod_list(pod("p")), samples=["30", "35", "38"], node=node)
    assert value(log) == "0"


@pytest.mark.parametrize(
    "pods",
    [
        pod_list(),  # empty node
        pod_list(pod("cpu-only", gpus=None), pod("dns", gpus=None)),  # CPU-only pods
        pod_list(
            pod("done", phase="Succeeded", gpus=8), pod("queued", phase="Pending", gpus=8)
        ),  # not running
        pod_list(pod("init-only", gpus=None, init_gpus=1)),  # an init container's GPU has been given back
    ],
    ids=["empty", "cpu-only", "not-running", "init-only"],
)
def test_no_running_gpu_pod_is_idle_whatever_the_gpus_do(tmp_path: Path, pods: str) -> None:
    result, log = run(tmp_path, pods=pods, samples=["100", "100", "100"])
    assert result.returncode == 0, result.stderr
    assert value(log) == "0"
    assert logged_calls(log, "nvidia-smi") == []  # nothing holds a GPU: utilisation is not asked


def test_a_request_without_a_limit_still_holds_a_gpu(tmp_path: Path) -> None:
    _, log = run(tmp_path, pods=pod_list(pod("p", requests_only=True)), samples=["80", "80", "80"])
    assert value(log) == "1"


@pytest.mark.parametrize("how", ["kubelet", "token", "garbage"])
def test_an_unanswered_pod_list_publishes_nothing(tmp_path: Path, how: str) -> None:
    """Missing data is never idle: the group's alarm waits."""
    pods = {"kubelet": None, "token": pod_list(pod("p")), "garbage": "<html>401</html>"}[how]
    result, log = run(tmp_path, pods=pods, samples=["0", "0", "0"], token_fails=how == "token")
    assert result.returncode == 0, result.stderr
    assert published(log) == []
    if how == "token":
        assert logged_calls(log, "curl") == []


@pytest.mark.parametrize("smi", ["fails", "mig"])
def test_a_gpu_pod_whose_use_cannot_be_read_is_busy(tmp_path: Path, smi: str) -> None:
    """MIG GPUs report no utilisation ([N/A]); a broken nvidia-smi tells nothing: the pod counts."""
    result, log = run(
        tmp_path, pods=pod_list(pod("p")), samples=["[N/A] [N/A]"] * 3, smi_fails=smi == "fails"
    )
    assert result.returncode == 0, result.stderr
    assert value(log) == "1"


def test_the_launcher_path_is_unchanged_off_eks(tmp_path: Path) -> None:
    """Without an EKS cluster in node.env the script neither asks the kubelet nor for a token."""
    assert "GPUCLUSTER_EKS_CLUSTER" not in node_env(NODE) and "GPUCLUSTER_SCHEDULER" not in node_env(NODE)
    result, log = run(tmp_path, pods=pod_list(pod("p")), samples=["0"], node=NODE)
    assert result.returncode == 0, result.stderr
    assert logged_calls(log, "curl") == [] and not any(c.startswith("eks") for c in logged_calls(log, "aws"))


def test_node_env_of_an_eks_group() -> None:
    env = node_env(EKS_NODE)
    assert "GPUCLUSTER_SCHEDULER=eks" in env and "GPUCLUSTER_EKS_CLUSTER=gpu-dev-eks" in env
    assert "GPUCLUSTER_GPU_BUSY_PERCENT=5" in env
    config = base()
    plain = parse_stack_config(config, "t")
    config["gpucluster:scheduler"] = {"type": "eks"}
    config["gpucluster:autostop"] = {"idle_minutes": 30, "gpu_utilization_threshold_percent": 12.5}
    eks = parse_stack_config(config, "t")
    built = node_bootstrap(eks, eks.node_groups[0], eks_cluster="c")
    assert built.eks_cluster == "c" and built.gpu_busy_percent == 12.5
    assert "GPUCLUSTER_GPU_BUSY_PERCENT=12.5" in node_env(built)
    assert node_bootstrap(plain, plain.node_groups[0], eks_cluster="c").eks_cluster == ""  # not EKS


def guard_latency() -> Any:
    """benchmarks/guard_latency.py as a module (benchmarks is no package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "guard_latency.py"
    spec = importlib.util.spec_from_file_location("guard_latency", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["guard_latency"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("samples", [["0", "0", "20"], ["6", "5", "4"], ["4", "5", "6"], ["100", "0", "0"]])
def test_the_benchmarks_rule_is_the_scripts(tmp_path: Path, samples: list[str]) -> None:
    """The benchmark models the node with `node_busy`: it decides as report.sh does on the same samples."""
    _, log = run(tmp_path, pods=pod_list(pod("p")), samples=samples)
    modelled = guard_latency().node_busy(1, [float(s) for s in samples], 5.0)
    assert value(log) == ("1" if modelled else "0")


def test_a_group_idle_by_use_stops_within_idle_minutes_and_five() -> None:
    bench = guard_latency()
    for idle in (15, 30, 60):
        best, worst = bench.idle_by_use_minutes(idle)
        assert idle < best <= worst <= idle + 5
    assert bench.idle_by_use_rows(98.0)[-1].endswith("yes")
