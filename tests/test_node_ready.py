"""In service means ready: health-check.sh and ready.sh run for real under bash on a fake node.

The launch lifecycle hook holds a new node in Pending:Wait. On a baked (or warm-pool) group the
health check hands a healthy verdict to gpucluster-ready, which completes the hook with CONTINUE only
once the datasets are mounted and the container image is present, and abandons the node with the
reason when they never are, or at once when the baked image lacks what it must carry. systemctl,
mountpoint, docker, modinfo, dcgmi, nvidia-smi, fi_info, IMDS (curl) and the AWS CLI are stubs
that log their calls; the tests assert on the lifecycle calls made and when.
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
from gpucluster.node.userdata import data_mounts_table, node_bootstrap, node_env, node_files, script
from gpucluster.parts import DataMount
from gpucluster.preflight import parse_stack_config
from test_node_health import STUBS as HEALTH_STUBS

SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
ASG = "test-train-asg-1a2b3c4"
IMAGE = "nvcr.io/nvidia/pytorch:24.12-py3"
TOPIC = "arn:aws:sns:us-east-1:123456789012:test-guardrails"

STUBS = {
    **{k: v for k, v in HEALTH_STUBS.items() if k not in ("aws",)},
    "aws": r"""
if [ -n "${FAKE_AWS_DENIALS:-}" ] && [[ "$*" == *complete-lifecycle-action* ]]; then
  n=$(( $(cat "$FAKE_AWS_DENIALS" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_AWS_DENIALS"
  [ "$n" -gt 2 ] || { echo "An error occurred (Throttling) when calling the operation" >&2; exit 254; }
fi
case "$*" in
  *describe-auto-scaling-instances*) printf '%s\t%s\n' "$FAKE_ASG" "${FAKE_LIFECYCLE:-Pending:Wait}" ;;
esac""",
    # Units are active when a marker file says so; `show` gives monotonic timestamps (microseconds).
    "systemctl": r"""
case "$1" in
  is-active) unit="${@: -1}"; [ -e "$FAKE_ACTIVE/$unit" ] ;;
  show)
    unit="${@: -1}"
    case "$*" in
      *InactiveExitTimestampMonotonic*) [ -e "$FAKE_ACTIVE/$unit" ] && echo 20000000 || echo 0 ;;
      *ActiveEnterTimestampMonotonic*) [ -e "$FAKE_ACTIVE/$unit" ] && echo 65000000 || echo 0 ;;
    esac ;;
esac""",
    "mountpoint": r'[ -e "$FAKE_MOUNTED/$(echo "${@: -1}" | tr / _)" ]',
    # `save` (the gate reads the layers through once) succeeds for a present image
    "docker": r"""case "$1 $2" in "image inspect") grep -qxF "$3" "$FAKE_IMAGES" ;;
  "save "*) grep -qxF "$2" "$FAKE_IMAGES" ;; *) exit 1 ;; esac""",
    "modinfo": r'[ -n "${FAKE_LUSTRE:-}" ]',
    "uname": "echo 6.8.0-1015-aws",
}


def ready_config(**extra: Any) -> dict[str, Any]:
    """One baked p4d.24xlarge group (8 GPUs, 4 EFA) with a container image and an FSx dataset."""
    group: dict[str, Any] = {"name": "train", "instance_types": ["p4d.24xlarge"], "max_nodes": 4,
                             "efa": "on", "container_image": IMAGE, **extra}
    return {
        "aws:region": "us-east-1",
        "gpucluster:cluster": {"name": "test", "tags": {"owner": "ml", "cost_center": "cc-1",
                                                        "environment": "dev"}},
        "gpucluster:network": {"availability_zones": ["us-east-1a"], "vpc_cidr": "10.0.0.0/16"},
        "gpucluster:node_groups": [group],
        "gpucluster:notifications": {"emails": ["ml@example.com"]},
        "gpucluster:images": {"bake": True, "groups": {"train": {"ami_id": "ami-0123456789abcdef0"}}},
    }


FSX = DataMount(name="corpus", access="fsx", bucket_name="corpus-bucket", prefix="", path="/fsx",
                fsx_dns_name="fs-1.fsx.us-east-1.amazonaws.com", fsx_mount_name="abcdef")


class ReadyNode:
    """A fake baked node: stubs on PATH, its rendered node.env and data-mounts table."""

    def __init__(self, root: Path, config: dict[str, Any] | None = None) -> None:
        self.root, self.bin, self.log = root, root / "bin", root / "calls.log"
        self.bin.mkdir(parents=True)
        for name, body in STUBS.items():
            stub = self.bin / name
            stub.write_text(f"#!/bin/bash\nprintf '%s\\n' \"{name} ${{*//$'\\n'/\\\\n}}\" >> {self.log}\n"
                            f"{body}\n")
            stub.chmod(0o755)
        spec = parse_stack_config(config or ready_config(), stack="t")
        self.bootstrap = node_bootstrap(spec, spec.node_groups[0], data_mounts=[FSX], notify_topic_arn=TOPIC)
        (root / "node.env").write_text(node_env(self.bootstrap))
        (root / "mounts.tsv").write_text(data_mounts_table(self.bootstrap))
        self.active, self.mounted, self.images = root / "active", root / "mounted", root / "images"
        self.active.mkdir()
        self.mounted.mkdir()
        self.images.write_text("")
        cwa = root / "cwa-ctl"
        cwa.write_text("#!/bin/bash\n")
        cwa.chmod(0o755)
        (self.bin / "dcgmi").write_text(f"#!/bin/bash\necho \"dcgmi $*\" >> {self.log}\necho Pass\n")
        (root / "uptime").write_text("95.40 180.00\n")
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(root),
            "GPUCLUSTER_NODE_ENV": str(root / "node.env"), "GPUCLUSTER_STATE_DIR": str(root / "run"),
            "GPUCLUSTER_DATA_MOUNTS": str(root / "mounts.tsv"), "GPUCLUSTER_CWA_CTL": str(cwa),
            "GPUCLUSTER_UPTIME_FILE": str(root / "uptime"), "GPUCLUSTER_READY_POLL_SECONDS": "0.2",
            "GPUCLUSTER_HEALTH_RETRY_SLEEP": "0", "FAKE_ASG": ASG, "FAKE_ACTIVE": str(self.active),
            "FAKE_MOUNTED": str(self.mounted), "FAKE_IMAGES": str(self.images), "FAKE_LUSTRE": "1",
        }

    # what the node has so far
    def agent_running(self) -> None:
        (self.active / "gpucluster-agent.service").touch()

    def data_mounted(self) -> None:
        (self.active / "gpucluster-data.service").touch()
        (self.mounted / "_fsx").touch()

    def image_present(self) -> None:
        self.images.write_text(IMAGE + "\n")

    def everything(self) -> None:
        self.agent_running()
        self.data_mounted()
        self.image_present()

    def health_launch(self, **env: str) -> subprocess.CompletedProcess[str]:
        return self._run("health-check.sh", "launch", **env)

    def ready(self, **env: str) -> subprocess.CompletedProcess[str]:
        return self._run("ready.sh", **env)

    def start_ready(self, **env: str) -> subprocess.Popen[str]:
        path = self.root / "ready.sh"
        path.write_text(script("ready.sh"))
        return subprocess.Popen(["bash", str(path)], env={**self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def _run(self, name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        path = self.root / name
        path.write_text(script(name))
        return subprocess.run(["bash", str(path), *args], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=60)

    def aws(self, operation: str) -> list[str]:
        return [c for c in logged_calls(self.log, "aws") if f" {operation} " in f" {c} "]

    def wait_rounds(self, rounds: int = 3, timeout: float = 30) -> None:
        """Until the gate has begun `rounds` more rounds of its wait loop than now (each checks the
        agent once), or has answered: what a test waits for before it asserts "no answer yet"."""

        def begun() -> int:
            return logged_calls(self.log, "systemctl").count("is-active --quiet gpucluster-agent.service")

        start, deadline = begun(), time.monotonic() + timeout
        while begun() < start + rounds and not self.results():
            assert time.monotonic() < deadline, "the gate's wait loop did not go round"
            time.sleep(0.05)

    def results(self) -> list[str]:
        return [c.split("--lifecycle-action-result ")[1].split()[0]
                for c in self.aws("complete-lifecycle-action")]


@pytest.fixture
def node(tmp_path: Path) -> ReadyNode:
    return ReadyNode(tmp_path)


def test_scripts_lint_clean() -> None:
    for name in ("ready.sh", "baked-install.sh"):
        path = Path(__file__).parent.parent / "components/gpucluster/node" / name
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout


def test_a_baked_node_renders_the_gate_and_refuses_installs(node: ReadyNode) -> None:
    env = (node.root / "node.env").read_text()
    assert "GPUCLUSTER_READY_GATE=true" in env and "GPUCLUSTER_BAKED=true" in env
    assert "GPUCLUSTER_CONTAINER_IMAGE=''" in env  # gpucluster-setup pulls nothing
    assert f"GPUCLUSTER_READY_IMAGE={IMAGE}" in env
    files = {f.path: f for f in node_files(node.bootstrap)}
    assert files["/usr/local/sbin/gpucluster-install"].content == script("baked-install.sh")
    assert "gpucluster-ready.service" in files["/etc/systemd/system/gpucluster-health-launch.service"].content
    refused = node._run("baked-install.sh", "lustre-client")
    assert refused.returncode == 1 and "refusing to install lustre-client" in refused.stderr


def test_the_health_check_hands_over_and_ready_completes_once_everything_is_there(node: ReadyNode) -> None:
    assert node.health_launch().returncode == 0
    assert node.results() == []  # healthy, but not answered: data and image are not known yet
    assert (node.root / "run" / "health-launch.ok").exists()
    node.everything()
    done = node.ready()
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.results() == ["CONTINUE"]
    assert f"--auto-scaling-group-name {ASG}" in node.aws("complete-lifecycle-action")[0]
    metrics = node.aws("put-metric-data")
    assert len(metrics) == 1
    assert '"MetricName":"BootStepSeconds"' in metrics[0] and '"Value":45' in metrics[0]  # 65 s - 20 s
    assert '"MetricName":"TimeToReadySeconds","Unit":"Seconds","Value":95' in metrics[0]
    assert "boot step agent: start 20s end 65s (45s)" in done.stdout


def test_the_hook_is_completed_only_after_the_data_is_mounted(node: ReadyNode) -> None:
    node.health_launch()
    node.agent_running()
    node.image_present()  # baked in
    proc = node.start_ready()
    try:
        node.wait_rounds()
        assert node.results() == [], "answered before the data was mounted"
        node.data_mounted()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert node.results() == ["CONTINUE"]
    assert "waiting for: dataset corpus at /fsx" in out


def test_an_unbaked_gated_node_waits_for_data_and_its_pulled_image(tmp_path: Path) -> None:
    config = ready_config(warm_pool={"min_size": 1})
    del config["gpucluster:images"]
    node = ReadyNode(tmp_path, config)
    node.health_launch()  # Pending:Wait: started from the pool into service
    node.agent_running()
    proc = node.start_ready()
    try:
        node.wait_rounds()
        assert node.results() == [], "answered before the data was mounted"
        node.data_mounted()
        node.wait_rounds()
        assert node.results() == [], "answered before the container image was pulled"
        node.image_present()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert node.results() == ["CONTINUE"]
    assert "waiting for: dataset corpus at /fsx,container image " + IMAGE in out
    assert "waiting for: container image " + IMAGE in out


def test_a_node_never_ready_is_abandoned_with_the_reason(node: ReadyNode) -> None:
    node.health_launch()
    node.agent_running()
    node.image_present()
    env = node.root / "node.env"  # the rendered bound is the hook's timeout less 120 s: 1 s here
    env.write_text(env.read_text().replace("GPUCLUSTER_READY_GATE_SECONDS=780",
                                           "GPUCLUSTER_READY_GATE_SECONDS=1"))
    done = node.ready()
    assert done.returncode == 1
    assert node.results() == ["ABANDON"]
    reason = "not ready after 1s: still waiting for dataset corpus at /fsx"
    assert reason in done.stdout
    published = node.aws("publish")
    assert len(published) == 1 and reason in published[0] and TOPIC in published[0]
    assert any("--metric-name LaunchAbandons" in c for c in node.aws("put-metric-data"))
    assert (node.root / "run" / "ready.abandoned").read_text().strip() == reason


def test_a_baked_image_missing_the_lustre_client_is_abandoned_at_once(node: ReadyNode) -> None:
    node.health_launch()
    node.everything()
    start = time.monotonic()
    done = node.ready(FAKE_LUSTRE="")
    assert done.returncode == 1
    assert time.monotonic() - start < 20  # not the full wait: it cannot appear later
    assert node.results() == ["ABANDON"]
    assert "the baked image lacks: Lustre client for kernel 6.8.0-1015-aws" in done.stdout


def test_a_fatal_health_finding_is_answered_once_by_the_health_check(node: ReadyNode) -> None:
    node.everything()
    node.health_launch(FAKE_GPUS="7")
    assert node.results() == ["ABANDON"]
    done = node.ready()
    assert done.returncode == 0
    assert node.results() == ["ABANDON"]  # ready.sh adds no CONTINUE after the health check's ABANDON


def test_a_warming_node_needs_its_image_not_its_mounts(node: ReadyNode) -> None:
    node.health_launch(FAKE_LIFECYCLE="Warmed:Pending:Wait")
    node.agent_running()
    node.image_present()  # no data: mounts do not survive the stop that follows
    done = node.ready()
    assert done.returncode == 0, done.stdout
    assert node.results() == ["CONTINUE"]


def test_throttled_completion_is_retried_and_lands_once(node: ReadyNode) -> None:
    node.health_launch()
    node.everything()
    done = node.ready(FAKE_AWS_DENIALS=str(node.root / "denials"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.results() == ["CONTINUE"] * 3  # two throttled tries, then the one that landed
    assert done.stdout.count("complete-lifecycle-action CONTINUE failed") == 2


def test_unbaked_groups_without_a_warm_pool_keep_todays_launch(tmp_path: Path) -> None:
    config = ready_config()
    del config["gpucluster:images"]
    node = ReadyNode(tmp_path, config)
    env = (node.root / "node.env").read_text()
    assert "READY_GATE" not in env and "BAKED" not in env
    assert f"GPUCLUSTER_CONTAINER_IMAGE={IMAGE}" in env
    node.health_launch()
    assert node.results() == ["CONTINUE"]  # the health check answers, as before


def test_a_warm_pool_group_gets_the_gate_without_being_baked(tmp_path: Path) -> None:
    config = ready_config(warm_pool={"min_size": 1})
    del config["gpucluster:images"]
    node = ReadyNode(tmp_path, config)
    env = (node.root / "node.env").read_text()
    assert "GPUCLUSTER_READY_GATE=true" in env and "BAKED" not in env
    assert f"GPUCLUSTER_CONTAINER_IMAGE={IMAGE}" in env  # pulled at boot, then waited for
