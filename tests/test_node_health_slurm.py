"""health-check.sh on a Slurm stack's node (AWS PCS launches it): the finding drains the node in Slurm.

Under bash with test_node_health's fake node (nvidia-smi, the kernel log, IMDS, aws on PATH) plus a
fake `scontrol` printing two nodes the way `scontrol --oneliner show node` does; the node env is
rendered from a `scheduler: {type: slurm}` stack. tests/test_slurm_guard_real.py drains a node of the
real Slurm with the same script. The type-none rendering is checked to be the script as before.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gpucluster.node import userdata
from gpucluster.node.userdata import UNGATED_HEALTH_CHECK, bundle_member, node_bootstrap, node_env, node_files
from gpucluster.preflight import parse_stack_config
from test_node_health import INSTANCE, SHELLCHECK, TOPIC, Node, counted, health_config, published

SHOW_NODES = (
    "NodeName=train-1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.1.17 NodeHostName=ip-10-0-1-17 State=IDLE\n"
    "NodeName=train-2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.1.42 NodeHostName=ip-10-0-1-42 State=MIXED\n"
)
SCONTROL = f"""
case "$*" in
  "--oneliner show node") printf '%s' '{SHOW_NODES}' ;;
  update*)
    if [ -n "${{FAKE_SCONTROL_REFUSALS:-}}" ]; then
      n=$(( $(cat "$FAKE_SCONTROL_REFUSALS" 2>/dev/null || echo 0) + 1 ))
      echo "$n" > "$FAKE_SCONTROL_REFUSALS"
      [ "$n" -gt 2 ] || {{ echo "slurm_update error: Unable to contact slurm controller"; exit 1; }}
    fi ;;
esac"""
CURL = r"""
case "$*" in
  *"-X PUT"*api/token*) echo token-1 ;;
  *token-1*meta-data/instance-id) echo "${FAKE_INSTANCE:-i-0123456789abcdef0}" ;;
  *token-1*meta-data/instance-type) echo "${FAKE_TYPE:-p4d.24xlarge}" ;;
  *token-1*meta-data/local-ipv4) echo "${FAKE_IP:-10.0.1.42}" ;;
  *) exit 22 ;;
esac"""


def slurm_config() -> dict[str, Any]:
    return {**health_config(), "gpucluster:scheduler": {"type": "slurm", "ami_id": "ami-0123456789abcdef0"}}


class SlurmNode(Node):
    """test_node_health's fake node, rendered for a Slurm stack, with scontrol and the node's IP."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        for name, body in (("scontrol", SCONTROL), ("curl", CURL)):
            stub = self.bin / name
            stub.write_text(f"#!/bin/bash\nprintf '%s\\n' \"{name} $*\" >> {self.log}\n{body}\n")
            stub.chmod(0o755)
        spec = parse_stack_config(slurm_config(), stack="t")
        env = node_env(node_bootstrap(spec, spec.node_groups[0], notify_topic_arn=TOPIC))
        (root / "node.env").write_text(env.replace("HOOK_LOG", str(self.hook_log)))
        self.env["HOSTNAME"] = "ignored"

    def run(self, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
        path = self.root / "health-check.sh"
        path.write_text(bundle_member(UNGATED_HEALTH_CHECK))  # what every group ships (the bundle)
        return subprocess.run(
            ["bash", str(path), mode], env={**self.env, **env}, capture_output=True, text=True, timeout=60
        )


def test_an_xid_drains_this_instances_slurm_node_found_by_its_address(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.launched()
    node.xid(79, minutes_ago=3)
    result = node.run("periodic")
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.calls("scontrol")[-1] == (
        "update NodeName=train-2 State=DRAIN "
        "Reason=gpucluster: xid: Xid 79 on PCI:0000:10:1c, 1 time(s) in the last 15 min"
    )
    assert "drained in Slurm (train-2)" in published(node) and INSTANCE in published(node)
    assert counted(node) == ["HealthReplacements"]
    metric = node.aws("put-metric-data")[0]
    assert (
        "--dimensions Stack=" in metric
        and "NodeGroup=train" in metric
        and "AutoScalingGroupName" not in metric
    )
    # No Auto Scaling on a Slurm stack: no group lookup, no instance health, no lifecycle call.
    assert [c for c in node.calls("aws") if c.startswith("autoscaling")] == []
    assert node.hook_log.exists() is False  # the job is Slurm's to checkpoint: the drain lets it finish
    # The next tick sees the node already drained and does nothing again.
    node.log.unlink()
    node.run("periodic")
    assert node.calls("scontrol") == [] and node.aws("publish") == []


def test_slurmd_nodename_names_the_node_when_slurmd_runs_the_check(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.launched()
    node.xid(79, minutes_ago=3)
    node.run("periodic", SLURMD_NODENAME="train-1")
    assert node.calls("scontrol")[-1].startswith("update NodeName=train-1 State=DRAIN")


def test_a_fatal_finding_at_launch_drains_too_there_is_no_launch_hook_to_abandon(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.xid(79, minutes_ago=1)
    result = node.run("launch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.calls("scontrol")[-1].startswith("update NodeName=train-2 State=DRAIN Reason=gpucluster: xid")
    assert node.aws("complete-lifecycle-action") == [] and node.aws("set-instance-health") == []


def test_an_instance_slurm_does_not_know_is_reported_and_fails(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.launched()
    node.xid(79, minutes_ago=3)
    result = node.run("periodic", FAKE_IP="10.0.9.9")
    assert result.returncode == 1
    assert [c for c in node.calls("scontrol") if c.startswith("update")] == []
    assert "not drained" in published(node)


def test_a_drain_the_controller_refuses_is_retried_until_it_lands(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.launched()
    node.xid(79, minutes_ago=3)
    result = node.run("periodic", FAKE_SCONTROL_REFUSALS=str(tmp_path / "refusals"))
    assert result.returncode == 0, result.stdout + result.stderr
    updates = [c for c in node.calls("scontrol") if c.startswith("update")]
    assert len(updates) == 3 and len(set(updates)) == 1
    assert (tmp_path / "run" / "health-replacing").exists()


def test_healthy_slurm_node_touches_nothing(tmp_path: Path) -> None:
    node = SlurmNode(tmp_path)
    node.launched()
    assert node.run("periodic").returncode == 0
    assert node.calls("scontrol") == [] and node.calls("aws") == []


def test_a_node_without_slurm_never_runs_the_slurm_lines(tmp_path: Path) -> None:
    """Every stack's nodes get the same bundle: the Slurm lines run only where node.env says slurm."""
    node = SlurmNode(tmp_path)
    env = node.root / "node.env"
    env.write_text("".join(line for line in env.read_text().splitlines(keepends=True)
                           if not line.startswith("GPUCLUSTER_SCHEDULER=")))
    node.launched()
    node.xid(79, minutes_ago=3)
    node.run("periodic")
    assert node.calls("scontrol") == []  # the Auto Scaling path instead (test_node_health's)
    assert "scontrol update NodeName" in bundle_member("health-check.sh")


def test_only_a_slurm_groups_node_env_and_files_carry_slurm() -> None:
    plain = parse_stack_config(health_config(), stack="t")
    slurm = parse_stack_config(slurm_config(), stack="t")
    assert "GPUCLUSTER_SCHEDULER" not in node_env(node_bootstrap(plain, plain.node_groups[0]))
    assert "GPUCLUSTER_SCHEDULER=slurm" in node_env(node_bootstrap(slurm, slurm.node_groups[0]))
    script = {f.path: f.content for f in node_files(node_bootstrap(slurm, slurm.node_groups[0]))}
    assert "scontrol update NodeName" in script[userdata.HEALTH_CHECK]  # the bundle's, as every stack's


def test_the_slurm_rendering_lints_clean(tmp_path: Path) -> None:
    path = tmp_path / "health-check.sh"
    path.write_text(bundle_member("health-check.sh"))
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
