"""MIG and the GPU health checks together (issues 13 and 14).

The launch check runs after the MIG layout is applied and survives the one reboot MIG mode may
need at first boot (its units are enabled before it, its hook's timeout covers it); the node's
`mig` finding; no DCGM diagnostic on MIG GPUs; a stuck-job alarm that does not need the
utilisation MIG GPUs do not report.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest

from base_config import plan_config
from gpucluster.names import autoname
from gpucluster.node.userdata import node_bootstrap, node_env, node_files
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import LAUNCH_TIMEOUT_MINUTES, MIG_LAUNCH_TIMEOUT_MINUTES, SpecError
from test_node_mig import run_bootstrap_after_files, verify_units

HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
ASG = "aws:autoscaling/group:Group"
UNITS = "/etc/systemd/system"


def two_groups(base_config: dict[str, Any], **health: Any) -> dict[str, Any]:
    """`serve`: 2 x p4d.24xlarge split 7 x 1g.5gb per GPU; `plain`: the same type without MIG."""
    config = copy.deepcopy(base_config)
    config["gpucluster:network"]["availability_zones"] = ["us-east-1c"]  # offers p4d
    serve = {"name": "serve", "instance_types": ["p4d.24xlarge"], "max_nodes": 2, "efa": "off",
             "capacity": {"spot_percent": 0}, "mig": {"profile": "1g.5gb"}, "health_checks": health}
    plain = {**copy.deepcopy(serve), "name": "plain"}
    del plain["mig"]
    config["gpucluster:node_groups"] = [serve, plain]
    config["gpucluster:budget"] = {"monthly_limit_usd": 50000}
    return config


# ------------------------------------------------------------------ launch check after MIG


def test_the_launch_check_of_a_mig_group_waits_for_the_layout(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(two_groups(base_config), stack="t")
    serve, plain = (
        {f.path: f.content for f in node_files(node_bootstrap(spec, g))} for g in spec.node_groups)
    unit = serve[f"{UNITS}/gpucluster-health-launch.service"]
    after = unit.split("\nAfter=")[1].split("\n")[0].split()
    wants = unit.split("\nWants=")[1].split("\n")[0].split()
    # Wants, not Requires: a failed apply is still checked, and the node abandoned with its finding.
    assert "gpucluster-mig.service" in after and "gpucluster-mig.service" in wants
    assert "Requires=" not in unit
    assert "gpucluster-mig.service" not in plain[f"{UNITS}/gpucluster-health-launch.service"]
    # The periodic check waits for the launch check (and so for MIG) after every boot.
    assert "After=gpucluster-health-launch.service" in serve[f"{UNITS}/gpucluster-health-check.service"]


@pytest.mark.parametrize("outcome", ["applied", "reboot", "failed"])
def test_the_bootstrap_enables_the_health_check_before_a_mig_reboot(outcome: str, base_config: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    spec = parse_stack_config(two_groups(base_config), stack="t")
    result, calls = run_bootstrap_after_files(node_bootstrap(spec, spec.node_groups[0]), outcome, tmp_path)
    mig = calls.index("start gpucluster-mig.service")
    enabled = " ".join(c for c in calls[:mig] if c.startswith("enable")).split()
    # Enabled before MIG can reboot the node: after the reboot systemd starts the check itself.
    assert {"gpucluster-health-launch.service", "gpucluster-health-check.timer"} <= set(enabled)
    assert not [c for c in calls[:mig] if c.startswith("start")]  # nothing checks the GPUs before MIG
    launch = "start --no-block gpucluster-health-launch.service"
    if outcome == "reboot":
        assert calls[mig + 1:] == ["reboot"] and result.returncode == 0  # no check of a half-made node
    else:
        # Applied: the check answers the hook. Failed: it answers too (ABANDON, finding `mig`),
        # rather than leaving the node to the hook's timeout.
        assert calls.index(launch) > mig, calls
        assert result.returncode == (0 if outcome == "applied" else 1), result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_health_units_ordered_after_mig(base_config: dict[str, Any],
                                                           tmp_path: Path) -> None:
    spec = parse_stack_config(two_groups(base_config), stack="t")
    verify_units(node_files(node_bootstrap(spec, spec.node_groups[0])),
                 ("gpucluster-mig.service", "gpucluster-health-launch.service",
                  "gpucluster-health-check.service", "gpucluster-health-check.timer"), tmp_path)


# ---------------------------------------------------------- the hook's timeout covers the reboot


def test_a_mig_groups_launch_hook_waits_through_a_reboot_by_default(base_config: dict[str, Any]) -> None:
    config = two_groups(base_config)
    spec = parse_stack_config(config, stack="t")
    assert [g.launch_timeout_minutes for g in spec.node_groups] == [MIG_LAUNCH_TIMEOUT_MINUTES,
                                                                   LAUNCH_TIMEOUT_MINUTES]
    assert (MIG_LAUNCH_TIMEOUT_MINUTES, LAUNCH_TIMEOUT_MINUTES) == (40, 15)
    plan = plan_config(config)
    for group, seconds in (("serve", 2400), ("plain", 900)):
        [hook] = [r for r in plan.of_type(HOOK) if r.name.endswith(f"-{group}-launch-check")]
        [asg] = [r for r in plan.of_type(ASG) if r.name.endswith(f"-{group}-asg")]
        assert hook.inputs["heartbeatTimeout"] == seconds
        assert hook.inputs["autoscalingGroupName"] == autoname(asg.name)
        assert asg.inputs["initialLifecycleHooks"][0]["heartbeatTimeout"] == seconds
        spec_group = next(g for g in spec.node_groups if g.name == group)
        # The node gives up its AWS retries within the same time.
        assert f"GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS={seconds}\n" in node_env(
            node_bootstrap(spec, spec_group))


def test_a_set_timeout_is_kept(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(two_groups(base_config, launch_timeout_minutes=55), stack="t")
    assert [g.launch_timeout_minutes for g in spec.node_groups] == [55, 55]


@pytest.mark.parametrize("minutes", [15, 29])
def test_a_mig_group_refuses_a_timeout_shorter_than_a_reboot(base_config: dict[str, Any],
                                                             minutes: int) -> None:
    with pytest.raises(SpecError) as err:
        parse_stack_config(two_groups(base_config, launch_timeout_minutes=minutes), stack="t")
    [finding] = err.value.findings  # the MIG group only: the plain group may answer in 15
    assert finding.path == "node_groups[0].health_checks.launch_timeout_minutes"
    assert finding.message.startswith("must be at least 30 in a MIG group")
    assert finding.message.endswith(f"got {minutes}")
    parse_stack_config(two_groups(base_config, launch_timeout_minutes=minutes, enabled=False), stack="t")
    parse_stack_config(two_groups(base_config, launch_timeout_minutes=30), stack="t")


# ------------------------------------------------------------------------- the `mig` finding

# nvidia-smi of a p4d.24xlarge in MIG mode: FAKE_MIG_OFF lists GPUs whose mode is off (and so have no
# MIG device), FAKE_MIG_DEVICES the MIG devices per GPU (default: the layout's 7 x 1g.5gb).
MIG_SMI = r"""
case "$*" in
  *--query-gpu=index,ecc*) for ((i = 0; i < 8; i++)); do echo "$i, 0, [N/A], No, No"; done ;;
  *--query-gpu=index,mig.mode.current*)
    for ((i = 0; i < 8; i++)); do
      if [[ " ${FAKE_MIG_OFF:-} " == *" $i "* ]]; then echo "$i, Disabled"; else echo "$i, Enabled"; fi
    done ;;
  *--query-gpu=index*) for ((i = 0; i < 8; i++)); do echo "$i"; done ;;
  -L)
    read -ra per <<<"${FAKE_MIG_DEVICES:-7 7 7 7 7 7 7 7}"
    for ((i = 0; i < 8; i++)); do
      echo "GPU $i: NVIDIA A100-SXM4-40GB (UUID: GPU-$i-aaaa-bbbb-cccc-dddddddddddd)"
      [[ " ${FAKE_MIG_OFF:-} " == *" $i "* ]] && continue
      for ((d = 0; d < ${per[$i]}; d++)); do
        echo "  MIG 1g.5gb      Device  $d: (UUID: MIG-$i$d-1111-2222-3333-444444444444)"
      done
    done ;;
  *) echo "fake nvidia-smi: unexpected $*" >&2; exit 99 ;;
esac"""


def mig_node(root: Path, **health: Any) -> Any:
    """test_node_health's fake node, as a node of a p4d group split 7 x 1g.5gb per GPU."""
    from test_node_health import TOPIC, Node, health_config

    node = Node(root, **health)
    config = health_config(**health)
    config["gpucluster:network"]["availability_zones"] = ["us-east-1c"]
    config["gpucluster:node_groups"][0]["mig"] = {"profile": "1g.5gb"}
    spec = parse_stack_config(config, stack="t")
    env = node_env(node_bootstrap(spec, spec.node_groups[0], notify_topic_arn=TOPIC))
    assert "GPUCLUSTER_MIG_LAYOUTS='*=1g.5gb:0,1g.5gb:1,1g.5gb:2,1g.5gb:3,1g.5gb:4,1g.5gb:5,1g.5gb:6'" in env
    (root / "node.env").write_text(env.replace("HOOK_LOG", str(node.hook_log)))
    smi = node.bin / "nvidia-smi"
    shebang, log_call = smi.read_text().split("\n")[:2]  # the stub's own call log stays
    smi.write_text(f"{shebang}\n{log_call}{MIG_SMI}\n")
    return node


def test_a_healthy_mig_node_continues_without_dcgm(tmp_path: Path) -> None:
    from test_node_health import counted, lifecycle_results

    node = mig_node(tmp_path)
    result = node.run("launch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert lifecycle_results(node) == ["CONTINUE"] and node.aws("publish") == [] and counted(node) == []
    assert "--query-gpu=index,mig.mode.current --format=csv,noheader" in node.calls("nvidia-smi")
    assert "-L" in node.calls("nvidia-smi")
    assert node.calls("dcgmi") == []  # not on MIG GPUs
    assert "finding" not in result.stdout


MIG_FAULTS = {
    "MIG mode off": ({"FAKE_MIG_OFF": "3"},
                     ["mig: GPU 3: MIG mode not enabled",
                      "mig: MIG devices: GPU 3: 0 of 7 (1g.5gb:0,1g.5gb:1,"]),
    "fewer MIG devices": ({"FAKE_MIG_DEVICES": "7 7 7 7 7 5 7 8"},
                          ["mig: MIG devices: GPU 5: 5 of 7, GPU 7: 8 of 7 (1g.5gb:0,"]),
}


@pytest.mark.parametrize("fault", MIG_FAULTS)
def test_a_mig_node_without_its_layout_is_abandoned_at_launch(tmp_path: Path, fault: str) -> None:
    from test_node_health import counted, lifecycle_results, published

    node = mig_node(tmp_path)
    env, expected = MIG_FAULTS[fault]
    result = node.run("launch", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lifecycle_results(node) == ["ABANDON"] and counted(node) == ["LaunchAbandons"]
    for text in expected:
        assert text in published(node), published(node)
    assert "abandoned at launch" in published(node)
    assert node.aws("set-instance-health") == []


@pytest.mark.parametrize("fault", MIG_FAULTS)
def test_a_running_mig_node_that_loses_its_layout_is_replaced(tmp_path: Path, fault: str) -> None:
    from test_node_health import INSTANCE, counted, published

    node = mig_node(tmp_path)
    node.launched()
    env, expected = MIG_FAULTS[fault]
    result = node.run("periodic", FAKE_LIFECYCLE="InService", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.hook_log.read_text() == "checkpoint health\n"
    assert expected[0] in published(node) and "marked Unhealthy" in published(node)
    assert counted(node) == ["HealthReplacements"]
    assert node.aws("set-instance-health") == [
        f"autoscaling set-instance-health --region us-east-1 --instance-id {INSTANCE} "
        "--health-status Unhealthy --no-should-respect-grace-period"]


def test_the_mig_finding_is_fatal_by_default_and_can_be_made_a_report(tmp_path: Path) -> None:
    from test_node_health import lifecycle_results, published

    node = mig_node(tmp_path, fatal=["gpu_count", "ecc"])
    node.run("launch", FAKE_MIG_OFF="0 1")
    assert lifecycle_results(node) == ["CONTINUE"]
    assert "mig: GPU 0,1: MIG mode not enabled" in published(node)
    assert "node kept in service (not fatal)" in published(node)


def test_a_node_of_a_type_without_a_plan_is_a_finding(tmp_path: Path) -> None:
    from test_node_health import lifecycle_results, published

    node = mig_node(tmp_path)
    env = tmp_path / "node.env"
    env.write_text(env.read_text().replace("_MIG_LAYOUTS='*=", "_MIG_LAYOUTS='p5.48xlarge="))
    node.run("launch")
    assert lifecycle_results(node) == ["ABANDON"] and "mig: no MIG layout for p4d.24xlarge" in published(node)


def test_groups_without_mig_never_ask_for_mig_state(tmp_path: Path) -> None:
    from test_node_health import Node

    node = Node(tmp_path)
    node.run("launch")
    assert not [c for c in node.calls("nvidia-smi") if "mig" in c or c == "-L"]


def test_dcgm_is_off_on_mig_groups_and_an_explicit_ask_warns(base_config: dict[str, Any]) -> None:
    from gpucluster.spec import stack_warnings

    spec = parse_stack_config(two_groups(base_config), stack="t")
    envs = [node_env(node_bootstrap(spec, g)) for g in spec.node_groups]
    assert "GPUCLUSTER_HEALTH_DCGM_DIAG=false" in envs[0] and "GPUCLUSTER_HEALTH_DCGM_DIAG=true" in envs[1]
    assert not [f for f in stack_warnings(spec) if f.path.endswith("dcgm_diag")]
    asked = parse_stack_config(two_groups(base_config, dcgm_diag=True), stack="t")
    [warning] = [f for f in stack_warnings(asked) if f.path.endswith("dcgm_diag")]
    assert warning.path == "node_groups[0].health_checks.dcgm_diag"
    assert "not run on a MIG group" in warning.message


# ------------------------------------------------------------------------ the stuck-job alarm

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
# What the agent cannot read on a GPU in MIG mode, and so never publishes (docs/guides/mig.md:
# NVML reports no utilisation there).
MIG_UNREPORTED = {"nvidia_smi_utilization_gpu", "nvidia_smi_utilization_memory"}


def test_a_mig_groups_stuck_alarm_watches_for_silence_not_utilisation(base_config: dict[str, Any]) -> None:
    from test_observability import published, read

    plan = plan_config(two_groups(base_config, stuck_alarm_minutes=20))
    alarms = {a.name.rsplit("-stuck-", 1)[1]: a.inputs for a in plan.of_type(ALARM) if "-stuck-" in a.name}
    assert set(alarms) == {"serve", "plain"}

    def queries(group: str) -> dict[str, Any]:
        return {q["id"]: q for q in alarms[group]["metricQueries"]}

    serve, plain = queries("serve"), queries("plain")
    # The MIG group: nodes in service and no GPU temperature, nothing about utilisation.
    assert set(serve) == {"samples", "inservice", "silent"}
    assert [k for k, q in serve.items() if q.get("returnData")] == ["silent"]
    assert serve["samples"]["metric"]["metricName"] == "nvidia_smi_temperature_gpu"
    assert serve["silent"]["expression"] == "IF(inservice > 0 AND FILL(samples, 0) == 0, 1, 0)"
    assert "busy" not in alarms["serve"]["alarmDescription"]
    assert (alarms["serve"]["evaluationPeriods"], alarms["serve"]["treatMissingData"]) == (20, "notBreaching")
    # Whole GPUs keep busy-but-flat too, with silence read the same way.
    assert [k for k, q in plain.items() if q.get("returnData")] == ["stuck"]
    assert plain["stuck"]["expression"] == "MAX([busyflat, silent])"
    assert plain["samples"]["metric"]["metricName"] == "nvidia_smi_temperature_gpu"
    # What the MIG alarm reads, a MIG node publishes (a missing series would be silence forever:
    # with treat_missing_data notBreaching it would never fire, nor ever alarm wrongly).
    read_by_serve = {q["metric"]["metricName"] for q in serve.values() if "metric" in q}
    assert not read_by_serve & MIG_UNREPORTED
    assert [r for r in read(plan) if r not in published(plan)] == []


def test_every_finding_is_checked_on_the_node_and_documented() -> None:
    """The names `fatal` takes are the ones health-check.sh reports and its guide's table explains."""
    from gpucluster.spec import HEALTH_FINDINGS

    script = (Path(__file__).parent.parent / "components/gpucluster/node/health-check.sh").read_text()
    readme = (Path(__file__).parent.parent / "docs" / "guides" / "health-checks.md").read_text()
    assert "mig" in HEALTH_FINDINGS
    for name in HEALTH_FINDINGS:
        assert f"finding {name} " in script, name
        assert f"\n| `{name}` | " in readme, name


# ------------------------------------------------------------------------------- user data


def test_a_mig_p4d_group_with_health_checks_fits_ec2s_user_data(base_config: dict[str, Any]) -> None:
    """MIG, health checks, hooks, a dataset, setup and a file: what a serving group typically has.

    The spec's user_data_size check accepts it, the launch template holds it within EC2's 16 KiB,
    and room is left for the group's own files (measured: 3,796 bytes gzipped of the 16,256 the spec allows,
    14,275 when the shipped scripts were in the user data).
    """
    import base64
    import gzip

    from gpucluster.node.userdata import MAX_USER_DATA_BYTES
    from gpucluster.preflight import USER_DATA_MARGIN_BYTES

    config = two_groups(base_config, stuck_alarm_minutes=30)
    config["gpucluster:node_groups"] = config["gpucluster:node_groups"][:1]
    config["gpucluster:node_groups"][0].update({
        "efa": "on", "setup": ["pip install vllm==0.6.3", "systemctl enable --now model-server"],
        "files": [{"path": "/etc/model-server.env", "content": "MODEL=llama-3-8b\nPORT=8000\n"}]})
    hook = "/usr/local/sbin/gpucluster-checkpoint"
    config["gpucluster:autostop"] = {"idle_minutes": 30, "pre_stop_command": hook}
    config["gpucluster:spot"] = {"interruption_command": hook}
    config["gpucluster:datasets"] = [{"name": "models", "prefix": "models/", "checkpoint_prefix": "ckpt/",
                                      "access": "mount"}]
    plan = plan_config(config)  # validates first: user_data_size among the checks
    [template] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    packed = base64.b64decode(template.inputs["userData"])
    # 1,500 bytes left for the group's own files in this heaviest case, at least: the shipped scripts
    # come from the node scripts bundle (gpucluster.node.bundle), so far more is left (measured below).
    assert len(packed) <= MAX_USER_DATA_BYTES - USER_DATA_MARGIN_BYTES - 1500, len(packed)
    assert len(packed) < 4000, len(packed)  # measured 3,796 bytes (14,275 with the scripts inline)
    text = gzip.decompress(packed).decode()
    assert "GPUCLUSTER_MIG_LAYOUTS='*=1g.5gb:0," in text and "GPUCLUSTER_HEALTH_CHECKS=true" in text
    assert "GPUCLUSTER_HEALTH_EXPECTED_EFA=4" in text
