"""Idle on a Slurm stack: PCS's idle scale-down stops idle nodes; only the GPU-utilisation fallback is ours.

The node side (`gpucluster-report activity`, its Slurm block) under bash with fakes; the alarm under
the mock engine (`Guardrails(..., pcs=PcsGuard)`); the autostop handler reading the alarm's NodeGroup
dimension and stopping that PCS group is in tests/lambdas/test_pcs.py (its fakes, moto DynamoDB).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

from fake_node import logged_calls, write_stubs
from gpucluster.node.userdata import SLURM_GPU_METRIC, bundle_member, node_env
from test_guardrails import spec_of
from test_guardrails_pcs import build_pcs
from test_node_activity import NODE

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
COMPOSITE = "aws:cloudwatch/compositeAlarm:CompositeAlarm"
RULE = "aws:cloudwatch/eventRule:EventRule"


def report(tmp_path: Path, *, apps: str, utilisation: str, slurm: bool = True) -> tuple[int, list[str]]:
    log = tmp_path / "calls.log"
    env_file = tmp_path / "node.env"
    env_file.write_text(node_env(dataclasses.replace(NODE, slurm=slurm)))
    (tmp_path / "apps.txt").write_text(apps)
    (tmp_path / "util.txt").write_text(utilisation)
    write_stubs(
        tmp_path / "bin",
        log,
        {
            "nvidia-smi": f'case "$*" in *compute-apps*) cat {tmp_path}/apps.txt;; '
            f"*) cat {tmp_path}/util.txt;; esac",
            "systemctl": "exit 0",
            "aws": "exit 0",
            "logger": "exit 0",
        },
    )
    path = tmp_path / "report.sh"
    path.write_text(bundle_member("report.sh"))  # as every group ships it (the bundle)
    done = subprocess.run(
        ["bash", str(path), "activity"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(env_file)},
    )
    return done.returncode, logged_calls(log, "aws")


def test_a_slurm_node_with_a_gpu_process_publishes_its_busiest_gpu(tmp_path: Path) -> None:
    rc, calls = report(tmp_path, apps="4242\n", utilisation="3\n 17\n0\n")
    assert rc == 0
    assert len(calls) == 2 and "--metric-name NodeActive" in calls[0]
    busiest = calls[1]
    assert f"--metric-name {SLURM_GPU_METRIC}" in busiest and "--value 17" in busiest
    assert "--unit Percent" in busiest and "--namespace gpucluster/gpu-dev" in busiest
    assert "--dimensions Stack=organization/gpucluster/dev/gpu-dev,NodeGroup=dev-a10" in busiest


def test_a_slurm_node_with_nothing_on_its_gpus_publishes_no_utilisation(tmp_path: Path) -> None:
    rc, calls = report(tmp_path, apps="", utilisation="0\n")
    assert rc == 0 and len(calls) == 1 and "NodeActive --unit Count --value 0" in calls[0]


def test_a_stack_without_slurm_publishes_activity_only(tmp_path: Path) -> None:
    rc, calls = report(tmp_path, apps="4242\n", utilisation="17\n", slurm=False)
    assert rc == 0 and len(calls) == 1 and "NodeActive" in calls[0]  # the Slurm lines stay idle


def test_a_failed_utilisation_publish_fails_the_run(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    rc, _ = report(tmp_path, apps="4242\n", utilisation="17\n")
    assert rc == 0
    write_stubs(tmp_path / "bin", log, {"aws": 'case "$*" in *GpuUtilizationMax*) exit 255;; esac'})
    env_file = tmp_path / "node.env"
    done = subprocess.run(
        ["bash", str(tmp_path / "report.sh"), "activity"],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(env_file)},
        timeout=30,
    )
    assert done.returncode == 1


def autostop_spec(base_config: dict[str, Any]) -> Any:
    return spec_of(
        base_config, autostop={"enabled": True, "idle_minutes": 30, "gpu_utilization_threshold_percent": 5}
    )


def test_on_a_slurm_stack_only_the_utilisation_fallback_is_built_and_routed(
    base_config: dict[str, Any],
) -> None:
    built = build_pcs(autostop_spec(base_config))
    assert built.all(COMPOSITE) == []  # no NodeActive alarm: PCS's scale-down is the idle stop
    alarms = [a for a in built.all(ALARM) if a.inputs.get("metricName") == SLURM_GPU_METRIC]
    assert len(alarms) == len(built.spec.node_groups)
    group = built.spec.node_groups[0].name
    inputs = alarms[0].inputs
    assert inputs["dimensions"] == {"Stack": built.spec.identity, "NodeGroup": group}
    assert "AutoScalingGroupName" not in str(inputs["dimensions"])
    assert (inputs["statistic"], inputs["comparisonOperator"], inputs["threshold"]) == (
        "Maximum",
        "LessThanThreshold",
        5,
    )
    assert inputs["treatMissingData"] == "missing" and "insufficientDataActions" not in inputs
    assert inputs["name"] == f"{built.spec.cluster.name}-{group}-gpu-idle"
    rule = next(r for r in built.all(RULE) if r.name.endswith("-idle-rule"))
    assert '"ALARM"' in rule.inputs["eventPattern"] and "metricAlarm" not in rule.inputs["eventPattern"]
