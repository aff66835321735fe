"""GPU health checks on the node: health-check.sh run for real under bash.

nvidia-smi, dcgmi, fi_info, the kernel log (journalctl, dmesg), IMDS (curl) and the
AWS CLI are stubs first on PATH; each logs its arguments, so the tests assert on
what the script asked AWS to do: CONTINUE or ABANDON the launch, mark the instance
Unhealthy, publish the findings, count them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fake_node import logged_calls
from gpucluster.node.userdata import (
    HEALTH_METRICS,
    LAUNCH_HOOK_NAME,
    node_bootstrap,
    node_env,
    node_files,
    script,
)
from gpucluster.preflight import parse_stack_config

SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
TOPIC = "arn:aws:sns:us-east-1:123456789012:test-guardrails"
INSTANCE = "i-0123456789abcdef0"
ASG = "test-train-asg-1a2b3c4"

STUBS = {
    # Two queries: the GPU list, and the memory-error fields (index, uncorrected volatile ECC,
    # retired pages pending, row remap pending, row remap failed).
    "nvidia-smi": r"""
[ -n "${FAKE_NVSMI_FAIL:-}" ] && { echo "$FAKE_NVSMI_FAIL"; exit 15; }
case "$*" in
  *--query-gpu=index,ecc*)
    for ((i = 0; i < ${FAKE_GPUS:-8}; i++)); do
      if [ "$i" = 0 ] && [ -n "${FAKE_GPU0_MEMORY:-}" ]; then echo "$FAKE_GPU0_MEMORY"
      else echo "$i, 0, [N/A], No, No"; fi
    done ;;
  *--query-gpu=index*) for ((i = 0; i < ${FAKE_GPUS:-8}; i++)); do echo "$i"; done ;;
esac""",
    "fi_info": r"""
n=${FAKE_EFA:-4}
[ "$n" -gt 0 ] || { echo "fi_getinfo: -61 (No data available)"; exit 1; }
for ((i = 0; i < n; i++)); do
  printf 'provider: efa\n    fabric: efa\n    domain: rdmap%ss27-rdm\n' "$i"
  printf '    version: 122.0\n    type: FI_EP_RDM\n'
done""",
    "dcgmi": r"""
case "${FAKE_DCGM:-pass}" in
  pass) printf '| Denylist                  | Pass |\n| NVML Library              | Pass |\n'; exit 0 ;;
  fail) printf '| Denylist                  | Pass |\n| Page Retirement/Row Remap | Fail |\n'
        printf '| Warning | GPU 3 has pending retired pages |\n'; exit 226 ;;
  down) echo "Error: unable to establish a connection to the specified host: localhost"; exit 255 ;;
esac""",
    # The script filters by time itself: the stub hands out the whole boot whatever --since says.
    "journalctl": r"""
[ -n "${FAKE_NO_JOURNAL:-}" ] && { echo "No journal files were found." >&2; exit 1; }
cat "${FAKE_KERNEL_LOG:-/dev/null}" """,
    "dmesg": r'cat "${FAKE_DMESG:-/dev/null}"',
    "curl": r"""
case "$*" in
  *"-X PUT"*api/token*) echo token-1 ;;
  *token-1*meta-data/instance-id) echo "${FAKE_INSTANCE:-i-0123456789abcdef0}" ;;
  *token-1*meta-data/instance-type) echo "${FAKE_TYPE:-p4d.24xlarge}" ;;
  *) exit 22 ;;
esac""",
    "aws": r"""
if [ -n "${FAKE_AWS_DENIALS:-}" ]; then
  n=$(( $(cat "$FAKE_AWS_DENIALS" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_AWS_DENIALS"
  [ "$n" -gt 2 ] || { echo "An error occurred (AccessDenied) when calling the operation" >&2; exit 254; }
fi
case "$*" in
  *describe-auto-scaling-instances*) printf '%s\t%s\n' "$FAKE_ASG" "${FAKE_LIFECYCLE:-Pending:Wait}" ;;
esac""",
    "logger": "true",
}


def health_config(**health: Any) -> dict[str, Any]:
    """A one-group stack of p4d.24xlarge (8 GPUs, 4 EFA devices) with these health settings."""
    group: dict[str, Any] = {"name": "train", "instance_types": ["p4d.24xlarge"], "max_nodes": 4,
                             "efa": "on", "health_checks": health}
    return {
        "aws:region": "us-east-1",
        "gpucluster:cluster": {"name": "test", "tags": {"owner": "ml", "cost_center": "cc-1",
                                                        "environment": "dev"}},
        "gpucluster:network": {"availability_zones": ["us-east-1a"], "vpc_cidr": "10.0.0.0/16"},
        "gpucluster:node_groups": [group],
        "gpucluster:notifications": {"emails": ["ml@example.com"]},
        "gpucluster:autostop": {"pre_stop_command": "echo checkpoint $GPUCLUSTER_STOP_REASON >> HOOK_LOG",
                                "pre_stop_timeout_seconds": 30},
    }


class Node:
    """A fake GPU node: stubs on PATH, a rendered node.env, and the log of every stub call."""

    def __init__(self, root: Path, *, absent: tuple[str, ...] = (), **health: Any) -> None:
        self.root, self.bin, self.log = root, root / "bin", root / "calls.log"
        self.bin.mkdir(parents=True)
        for name, body in STUBS.items():
            if name in absent:
                continue
            stub = self.bin / name
            # One line per call: newlines inside arguments (an SNS message) are logged as \n.
            stub.write_text(f"#!/bin/bash\nprintf '%s\\n' \"{name} ${{*//$'\\n'/\\\\n}}\" >> {self.log}\n"
                            f"{body}\n")
            stub.chmod(0o755)
        spec = parse_stack_config(health_config(**health), stack="t")
        env = node_env(node_bootstrap(spec, spec.node_groups[0], notify_topic_arn=TOPIC))
        self.hook_log = root / "hook.log"
        (root / "node.env").write_text(env.replace("HOOK_LOG", str(self.hook_log)))
        self.kernel_log = root / "kernel.log"
        self.kernel_log.write_text("")
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(root),
            "GPUCLUSTER_NODE_ENV": str(root / "node.env"), "GPUCLUSTER_STATE_DIR": str(root / "run"),
            "GPUCLUSTER_HEALTH_RETRY_SLEEP": "0", "FAKE_ASG": ASG,
            "FAKE_KERNEL_LOG": str(self.kernel_log),
        }

    def xid(self, code: int, minutes_ago: float, device: str = "PCI:0000:10:1c") -> None:
        """A kernel log line as `journalctl -o short-unix` prints it."""
        stamp = time.time() - minutes_ago * 60
        with self.kernel_log.open("a") as f:
            f.write(f"{stamp:.6f} ip-10-0-0-5 kernel: NVRM: Xid ({device}): {code}, pid=4242, "
                    "name=python, GPU has fallen off the bus.\n")

    def run(self, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
        path = self.root / "health-check.sh"
        path.write_text(script("health-check.sh"))
        return subprocess.run(["bash", str(path), mode], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=60)

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)

    def aws(self, operation: str) -> list[str]:
        return [c for c in self.calls("aws") if f" {operation} " in f" {c} "]

    def launched(self) -> None:
        """The launch check has run on this boot (what the periodic check waits for)."""
        (self.root / "run").mkdir(exist_ok=True)
        (self.root / "run" / "health-launch.done").write_text("done\n")


def lifecycle_results(node: Node) -> list[str]:
    return [c.split("--lifecycle-action-result ")[1].split()[0]
            for c in node.aws("complete-lifecycle-action")]


def published(node: Node) -> str:
    return "\n".join(node.aws("publish"))


def counted(node: Node) -> list[str]:
    return [c.split("--metric-name ")[1].split()[0] for c in node.aws("put-metric-data")]


# ------------------------------------------------------------------------------ launch


def test_script_lints_clean() -> None:
    path = Path(__file__).parent.parent / "components/gpucluster/node/health-check.sh"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_healthy_node_continues_its_launch(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("launch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.aws("complete-lifecycle-action") == [
        f"autoscaling complete-lifecycle-action --region us-east-1 --lifecycle-hook-name {LAUNCH_HOOK_NAME} "
        f"--auto-scaling-group-name {ASG} --instance-id {INSTANCE} --lifecycle-action-result CONTINUE"]
    assert node.aws("publish") == [] and counted(node) == []
    assert node.calls("dcgmi") == ["diag -r 1"]
    assert node.calls("fi_info") == ["-p efa -t FI_EP_RDM"]
    assert (tmp_path / "run" / "health-launch.done").exists()


FAULTS = {
    "missing GPU": ({"FAKE_GPUS": "7"}, "gpu_count: 7 of 8 GPUs visible to the driver (p4d.24xlarge)"),
    "GPU off the bus": ({"FAKE_NVSMI_FAIL": "Unable to determine the device handle for GPU0000:10:1C.0"},
                        "gpu_count: nvidia-smi failed: Unable to determine the device handle"),
    "uncorrectable ECC": ({"FAKE_GPU0_MEMORY": "0, 2, [N/A], No, No"},
                          "ecc: GPU 0: 2 uncorrectable ECC errors since the driver loaded"),
    "row remap pending": ({"FAKE_GPU0_MEMORY": "0, 0, [N/A], Yes, No"},
                          "page_retirement: GPU 0: row remapping pending (needs a GPU reset)"),
    "missing EFA": ({"FAKE_EFA": "3"}, "efa: 3 of 4 EFA devices visible to libfabric"),
    "no EFA at all": ({"FAKE_EFA": "0"}, "efa: libfabric finds no EFA device: fi_getinfo: -61"),
    "DCGM diagnostic": ({"FAKE_DCGM": "fail"}, "dcgm: dcgmi diag -r 1 failed: Page Retirement/Row Remap"),
}


@pytest.mark.parametrize("fault", [*FAULTS, "XID since boot"])
def test_faulty_node_is_abandoned_at_launch(tmp_path: Path, fault: str) -> None:
    node = Node(tmp_path)
    if fault == "XID since boot":
        node.xid(79, minutes_ago=90)  # long before any window: at launch the whole boot counts
        env, expected = {}, "xid: Xid 79 on PCI:0000:10:1c, 1 time(s) since boot"
    else:
        env, expected = FAULTS[fault]
    result = node.run("launch", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lifecycle_results(node) == ["ABANDON"]
    message = published(node)
    assert f"--topic-arn {TOPIC}" in message and expected in message
    assert f"instance {INSTANCE} (p4d.24xlarge): abandoned at launch" in message
    assert f"Auto Scaling group {ASG}" in message and "node group train" in message
    assert counted(node) == ["LaunchAbandons"]
    assert node.aws("set-instance-health") == []
    assert not node.hook_log.exists()  # a node that never worked has nothing to checkpoint
    # The report goes out before the node is let go.
    calls = node.calls("aws")
    assert max(i for i, c in enumerate(calls) if " publish " in c) < \
        next(i for i, c in enumerate(calls) if "complete-lifecycle-action" in c)


def test_publish_and_count_use_the_clusters_namespace_and_group(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run("launch", FAKE_GPUS="4")
    [put] = node.aws("put-metric-data")
    assert put == ("cloudwatch put-metric-data --region us-east-1 --namespace gpucluster/test "
                   f"--metric-name LaunchAbandons --dimensions AutoScalingGroupName={ASG} --value 1 "
                   "--unit Count")
    [publish] = node.aws("publish")
    subject = publish.split("--subject ")[1].split(" --message")[0]
    assert subject == f"gpucluster test/train: new node {INSTANCE} failed its launch check"
    assert len(subject) <= 100


def test_findings_not_named_fatal_are_reported_but_the_node_joins(tmp_path: Path) -> None:
    node = Node(tmp_path, fatal=["gpu_count", "ecc"])
    node.xid(48, minutes_ago=1)
    node.run("launch")
    assert lifecycle_results(node) == ["CONTINUE"]
    assert "xid: Xid 48 on PCI:0000:10:1c" in published(node) and "node kept in service (not fatal)" \
        in published(node)
    assert counted(node) == ["HealthFindings"]


def test_notify_mode_never_abandons(tmp_path: Path) -> None:
    node = Node(tmp_path, on_failure="notify")
    node.run("launch", FAKE_GPUS="6")
    assert lifecycle_results(node) == ["CONTINUE"]
    assert "(on_failure is notify)" in published(node)


def test_a_rebooted_node_is_not_held_but_still_judged(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run("launch", FAKE_LIFECYCLE="InService", FAKE_GPUS="7")
    assert node.aws("complete-lifecycle-action") == []
    assert node.aws("set-instance-health") == [
        f"autoscaling set-instance-health --region us-east-1 --instance-id {INSTANCE} "
        "--health-status Unhealthy --no-should-respect-grace-period"]


def test_lifecycle_calls_retry_until_iam_catches_up(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("launch", FAKE_AWS_DENIALS=str(tmp_path / "denials"))
    assert result.returncode == 0, result.stdout
    assert lifecycle_results(node) == ["CONTINUE"]
    assert len(node.aws("describe-auto-scaling-instances")) == 3  # two AccessDenied, then the answer


def test_an_unanswerable_node_exits_non_zero_and_is_left_to_the_hook_timeout(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("launch", FAKE_ASG="None", GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS="61")
    assert result.returncode == 1
    assert node.aws("complete-lifecycle-action") == []


# ----------------------------------------------------------------------------- running


@pytest.mark.parametrize("fault", [*(f for f in FAULTS if f != "DCGM diagnostic"), "XID in the window"])
def test_faulty_running_node_checkpoints_reports_and_marks_itself_unhealthy(tmp_path: Path,
                                                                          fault: str) -> None:
    node = Node(tmp_path)
    node.launched()
    if fault == "XID in the window":
        node.xid(79, minutes_ago=3)
        env, expected = {}, "xid: Xid 79 on PCI:0000:10:1c, 1 time(s) in the last 15 min"
    else:
        env, expected = FAULTS[fault]
    result = node.run("periodic", FAKE_LIFECYCLE="InService", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.hook_log.read_text() == "checkpoint health\n"  # bounded pre-stop hook, reason given
    assert expected in published(node) and "marked Unhealthy" in published(node)
    assert counted(node) == ["HealthReplacements"]
    assert node.aws("set-instance-health") == [
        f"autoscaling set-instance-health --region us-east-1 --instance-id {INSTANCE} "
        "--health-status Unhealthy --no-should-respect-grace-period"]
    assert node.aws("complete-lifecycle-action") == []
    # The next tick sees the node already on its way out and does nothing again.
    node.log.unlink()
    node.run("periodic", **env)
    assert node.aws("set-instance-health") == [] and node.aws("publish") == []


def test_old_xid_outside_the_window_is_healthy(tmp_path: Path) -> None:
    node = Node(tmp_path, xid_window_minutes=15)
    node.launched()
    node.xid(79, minutes_ago=16)
    node.xid(48, minutes_ago=120)
    result = node.run("periodic")
    assert result.returncode == 0 and "healthy" in result.stdout
    assert node.aws("set-instance-health") == [] and node.aws("publish") == [] and counted(node) == []
    assert not node.hook_log.exists()


def test_application_xids_are_not_the_gpus_fault(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.launched()
    node.xid(13, minutes_ago=1)
    node.xid(31, minutes_ago=2)
    node.run("periodic")
    assert node.aws("set-instance-health") == []


def test_xids_are_counted_per_code_and_device_in_the_window(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.launched()
    for minutes in (1, 2, 30):
        node.xid(94, minutes_ago=minutes)
    node.xid(79, minutes_ago=4, device="PCI:0000:a0:1c")
    node.run("periodic")
    message = published(node)
    assert "Xid 94 on PCI:0000:10:1c, 2 time(s) in the last 15 min" in message
    assert "Xid 79 on PCI:0000:a0:1c, 1 time(s)" in message


def test_dmesg_stands_in_for_a_missing_journal(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.launched()
    uptime = tmp_path / "uptime"
    uptime.write_text("36000.00 1000.00\n")  # up 10 hours
    dmesg = tmp_path / "dmesg.log"
    dmesg.write_text("[ 1234.567890] NVRM: Xid (PCI:0000:10:1c): 79, pid=1, GPU has fallen off the bus.\n")
    old = node.run("periodic", FAKE_NO_JOURNAL="1", FAKE_DMESG=str(dmesg), GPUCLUSTER_UPTIME_FILE=str(uptime))
    assert "healthy" in old.stdout and node.aws("set-instance-health") == []  # ~9.7 hours ago
    dmesg.write_text("[35900.000000] NVRM: Xid (PCI:0000:10:1c): 79, pid=1, GPU has fallen off the bus.\n")
    node.run("periodic", FAKE_NO_JOURNAL="1", FAKE_DMESG=str(dmesg), GPUCLUSTER_UPTIME_FILE=str(uptime))
    assert len(node.aws("set-instance-health")) == 1 and "Xid 79" in published(node)


def test_notify_mode_reports_a_finding_once_until_it_changes(tmp_path: Path) -> None:
    node = Node(tmp_path, on_failure="notify")
    node.launched()
    node.run("periodic", FAKE_GPUS="7")
    node.run("periodic", FAKE_GPUS="7")
    assert len(node.aws("publish")) == 1 and counted(node) == ["HealthFindings"]
    node.run("periodic", FAKE_GPUS="6")
    assert len(node.aws("publish")) == 2
    assert node.aws("set-instance-health") == [] and not node.hook_log.exists()


def test_periodic_check_waits_for_the_launch_check(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("periodic", FAKE_GPUS="1")
    assert "launch check has not finished" in result.stdout
    assert node.calls("aws") == [] and node.calls("nvidia-smi") == []


def test_dcgm_runs_before_work_never_beside_a_job(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.launched()
    node.run("periodic", FAKE_DCGM="fail")
    assert node.calls("dcgmi") == [] and node.aws("set-instance-health") == []
    assert node.run("check", FAKE_DCGM="fail").returncode == 1  # an operator's check includes it


def test_a_dcgm_that_cannot_run_is_not_a_gpu_fault(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("launch", FAKE_DCGM="down")
    assert lifecycle_results(node) == ["CONTINUE"]
    assert "DCGM diagnostic did not run (exit 255)" in result.stdout


def test_without_dcgmi_the_rest_still_runs(tmp_path: Path) -> None:
    node = Node(tmp_path, absent=("dcgmi",))
    node.run("launch", FAKE_EFA="2")
    assert lifecycle_results(node) == ["ABANDON"]
    assert "efa: 2 of 4 EFA devices" in published(node)


def test_non_efa_groups_do_not_count_efa_devices(tmp_path: Path) -> None:
    node = Node(tmp_path)
    env = (tmp_path / "node.env").read_text().replace("GPUCLUSTER_HEALTH_EXPECTED_EFA=4",
                                                      "GPUCLUSTER_HEALTH_EXPECTED_EFA=0")
    (tmp_path / "node.env").write_text(env)
    node.run("launch", FAKE_EFA="0")
    assert node.calls("fi_info") == [] and lifecycle_results(node) == ["CONTINUE"]


def test_check_mode_prints_findings_and_fails_on_a_fatal_one(tmp_path: Path) -> None:
    node = Node(tmp_path)
    healthy = node.run("check")
    assert healthy.returncode == 0 and healthy.stdout.strip().endswith("healthy")
    sick = node.run("check", FAKE_GPU0_MEMORY="0, 5, [N/A], No, No")
    assert sick.returncode == 1
    assert "ecc: GPU 0: 5 uncorrectable ECC errors since the driver loaded" in sick.stdout
    assert node.calls("aws") == []  # an operator's check changes nothing


# --------------------------------------------------------------------------- rendering


def test_node_env_carries_the_health_settings() -> None:
    spec = parse_stack_config(health_config(interval_minutes=2, xid_window_minutes=10,
                                            fatal=["xid"], ignored_xids=[13]), stack="t")
    env = node_env(node_bootstrap(spec, spec.node_groups[0], notify_topic_arn=TOPIC))
    for line in ("GPUCLUSTER_HEALTH_CHECKS=true", f"GPUCLUSTER_NOTIFY_TOPIC_ARN={TOPIC}",
                 "GPUCLUSTER_METRIC_NAMESPACE=gpucluster/test", "GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES=10",
                 "GPUCLUSTER_HEALTH_FATAL=xid", "GPUCLUSTER_HEALTH_IGNORED_XIDS=13",
                 "GPUCLUSTER_HEALTH_EXPECTED_GPUS=p4d.24xlarge=8", "GPUCLUSTER_HEALTH_EXPECTED_EFA=4",
                 "GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS=900",
                 f"GPUCLUSTER_HEALTH_LAUNCH_HOOK={LAUNCH_HOOK_NAME}"):
        assert line in env.splitlines(), line
    files = {f.path: f.content for f in node_files(node_bootstrap(spec, spec.node_groups[0]))}
    timer = files["/etc/systemd/system/gpucluster-health-check.timer"]
    assert "OnBootSec=2min" in timer and "OnUnitActiveSec=2min" in timer
    assert "ExecStart=/usr/local/sbin/gpucluster-health-check launch" in \
        files["/etc/systemd/system/gpucluster-health-launch.service"]


def test_turned_off_nothing_is_installed() -> None:
    spec = parse_stack_config(health_config(enabled=False), stack="t")
    b = node_bootstrap(spec, spec.node_groups[0])
    assert "GPUCLUSTER_HEALTH_CHECKS=false" in node_env(b).splitlines()
    assert not any("health" in f.path for f in node_files(b))


def test_the_script_counts_only_the_metrics_the_dashboard_knows() -> None:
    text = script("health-check.sh")
    counted_names = {line.split("count ", 1)[1].split()[0] for line in text.splitlines()
                     if line.strip().startswith("count ") and "()" not in line}
    assert counted_names == set(HEALTH_METRICS)
