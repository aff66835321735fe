"""Node bootstrap: rendered user data lints clean, and its scripts do the right thing.

The scripts run here for real under bash, with the system commands they drive
(lsblk, mdadm, mkfs, mount, curl, aws ...) replaced by stubs on PATH that log
their arguments, so RAID0, the IMDS watcher and the hook are checked by behaviour.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fake_node import logged_calls, os_env, run_script, write_stubs
from gpucluster.node import userdata as bootstrap
from gpucluster.node.userdata import (
    GPU_METRIC_DIMENSION,
    GPU_UTILIZATION_METRIC,
    NodeBootstrap,
    cloudwatch_agent_config,
    data_mounts_table,
    efa_environment,
    encode_user_data,
    node_bootstrap,
    node_env,
    node_files,
    render_user_data,
    script,
)
from gpucluster.parts import DataMount
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config

SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
SCRIPTS = ["bootstrap.sh", "scratch.sh", "data.sh", "spot-watcher.sh", "interruption-hook.sh", "agent.sh",
           "report.sh"]
MOUNTS = (
    DataMount(name="corpus", access="copy_to_scratch", bucket_name="acme-corpus", prefix="v3/", path=""),
    DataMount(name="models", access="mount", bucket_name="acme-models", prefix="", path="/data/models"),
    DataMount(name="train", access="fsx", bucket_name="acme-train", prefix="", path="/fsx",
              fsx_dns_name="fs-0123.fsx.us-east-1.amazonaws.com", fsx_mount_name="abcdefgh"),
)
TYPES = {"p5.48xlarge": "on", "p4d.24xlarge": "on", "g6e.48xlarge": "on", "g5.xlarge": "off"}


def lint(path: Path) -> None:
    """`bash -n` and shellcheck (all severities) must both pass."""
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def settings(**changes: Any) -> NodeBootstrap:
    base = NodeBootstrap(stack="t", cluster="c", node_group="g", region="us-east-1", scratch_mount="/scratch",
                         efa=True, gpudirect_rdma=True, watch_spot=True, interruption_command="echo hi",
                         interruption_timeout_seconds=90, handle_rebalance=True, data_mounts=MOUNTS)
    return NodeBootstrap(**{**base.__dict__, **changes})


def group_config(base: dict[str, Any], instance_type: str, efa: str) -> dict[str, Any]:
    base["gpucluster:node_groups"] = [{"name": "gpus", "instance_types": [instance_type], "max_nodes": 4,
                                       "efa": efa, "capacity": {"spot_percent": 50}}]
    base["gpucluster:spot"] = {"interruption_command": "/opt/hooks/ckpt.sh --reason \"$REASON\" 'x'"}
    return base


# ------------------------------------------------------------------------- lint


@pytest.mark.parametrize("name", SCRIPTS)
def test_shipped_scripts_lint_clean(name: str) -> None:
    lint(Path(bootstrap.__file__).parent / name)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_rendered_user_data_lints_for_every_stack(stack: str, tmp_path: Path) -> None:
    _, _, spec = load_stack(stack)
    for group in spec.node_groups:
        path = tmp_path / f"{group.name}.sh"
        path.write_text(render_user_data(node_bootstrap(spec, group, MOUNTS)))
        lint(path)


@pytest.mark.parametrize(("instance_type", "efa"), TYPES.items())
def test_rendered_user_data_lints_for_every_type(instance_type: str, efa: str, base_config: dict[str, Any],
                                                 tmp_path: Path) -> None:
    spec = parse_stack_config(group_config(base_config, instance_type, efa), stack="t")
    path = tmp_path / "user-data.sh"
    text = render_user_data(node_bootstrap(spec, spec.node_groups[0], MOUNTS))
    path.write_text(text)
    lint(path)
    assert ("/etc/gpucluster/efa.env" in text) == (efa == "on")


def test_user_data_writes_every_file_verbatim(tmp_path: Path) -> None:
    """Run the file-writing part of the user data with paths moved under tmp_path."""
    b = settings()
    text = render_user_data(b)
    files_part = text.split("/opt/aws/amazon-cloudwatch-agent/etc\n", 1)[1].split(
        "# shellcheck source=/dev/null\n. /etc/gpucluster/node.env\n")[0]
    files_part = re.sub(r"^(cat > |chmod \d+ )/", rf"\g<1>{tmp_path}/", files_part, flags=re.M)
    for f in node_files(b):
        (tmp_path / f.path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", "-euc", files_part], check=True)
    for f in node_files(b):
        written = tmp_path / f.path.lstrip("/")
        assert written.read_text() == f.content, f.path
        assert oct(written.stat().st_mode & 0o777) == oct(int(f.mode, 8)), f.path


def run_files_part(text: str, root: Path) -> None:
    """Run the file-writing part of rendered user data with every path moved under `root`."""
    files_part = text.split("/opt/aws/amazon-cloudwatch-agent/etc\n", 1)[1].split(
        "# shellcheck source=/dev/null\n. /etc/gpucluster/node.env\n")[0]
    files_part = re.sub(r"^(cat > |chmod \d+ )/", rf"\g<1>{root}/", files_part, flags=re.M)
    for d in ("etc/gpucluster", "usr/local/sbin", "etc/systemd/system", "etc/profile.d",
              "opt/aws/amazon-cloudwatch-agent/etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", "-euc", files_part], check=True, cwd=root)


# Commands that would break a naive renderer: placeholders, the heredoc delimiter on a line
# of its own (and the next one the renderer would pick), quotes and expansions, CR/LF.
HOSTILE_COMMANDS = {
    "placeholders": "echo @@FILES@@ @@LABEL@@ @@ @@X@@",
    "delimiter": ("echo a\nGPUCLUSTER_FILE_EOF\ntouch {marker}-1\nGPUCLUSTER_FILE_EOF_1\n"
                  "touch {marker}-2\necho b"),
    "quotes": "echo 'a' \"b\" `touch {marker}-3` $(touch {marker}-4) ${{HOME}} \\ '\"'\"' ; exit 3",
    "newlines": "\n\n  touch {marker}-5\r\n\t\nEOF\n'",
    "unicode": "echo ünïcødé ✓ \u202e \u2028 \u0085 done",
}


@pytest.mark.parametrize("name", HOSTILE_COMMANDS)
def test_hook_commands_are_stored_byte_for_byte_and_never_run(name: str, tmp_path: Path) -> None:
    """The user data writes the command into node.env exactly; writing and sourcing runs none of it."""
    marker = tmp_path / "ran"
    command = HOSTILE_COMMANDS[name].format(marker=marker)
    b = settings(interruption_command=command)
    text = render_user_data(b)
    script_path = tmp_path / "user-data.sh"
    script_path.write_text(text)
    lint(script_path)
    root = tmp_path / "root"
    run_files_part(text, root)
    for f in node_files(b):
        assert (root / f.path.lstrip("/")).read_bytes() == f.content.encode(), f.path
    stored = subprocess.run(["bash", "-c", f'. {root}/etc/gpucluster/node.env; '
                             'printf %s "$GPUCLUSTER_INTERRUPTION_COMMAND"'],
                            capture_output=True, check=True).stdout
    assert stored == command.encode()
    assert not list(tmp_path.glob("ran*")), "rendering, writing or sourcing ran part of the command"


def test_heredoc_delimiter_never_matches_a_line_of_the_content() -> None:
    assert bootstrap.heredoc_delimiter("echo\n") == "GPUCLUSTER_FILE_EOF"
    taken = "GPUCLUSTER_FILE_EOF\nGPUCLUSTER_FILE_EOF_1\n"
    assert bootstrap.heredoc_delimiter(taken) == "GPUCLUSTER_FILE_EOF_2"
    assert bootstrap.heredoc_delimiter("x GPUCLUSTER_FILE_EOF\n") == "GPUCLUSTER_FILE_EOF"  # only whole lines


def test_watcher_and_metrics_start_before_disks_and_data() -> None:
    """A node whose disks or datasets fail must still honour spot notices and be seen idle."""
    text = render_user_data(settings())
    order = [text.index(step) for step in (
        "enable --now gpucluster-spot-watcher.service", "start --no-block gpucluster-agent.service",
        "enable --now gpucluster-scratch.service", "start --no-block gpucluster-data.service")]
    assert order == sorted(order)


# ----------------------------------------------------------------- rendered values


def test_node_env_round_trips_through_bash(tmp_path: Path) -> None:
    command = "/opt/hooks/ckpt.sh --reason \"$REASON\" 'a b' ; echo $(date) `id` \\ done"
    env_file = tmp_path / "node.env"
    env_file.write_text(node_env(settings(interruption_command=command, scratch_mount="/mnt/fast")))
    out = subprocess.run(["bash", "-c", f'. {env_file}; printf "%s\\n%s\\n%s" '
                          '"$GPUCLUSTER_INTERRUPTION_COMMAND" "$GPUCLUSTER_SCRATCH_MOUNT" '
                          '"$GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS"'],
                         capture_output=True, text=True, check=True).stdout
    assert out.split("\n") == [command, "/mnt/fast", "90"]


def test_settings_follow_the_spec(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(group_config(base_config, "p5.48xlarge", "on"), stack="t")
    b = node_bootstrap(spec, spec.node_groups[0])
    assert (b.efa, b.gpudirect_rdma, b.watch_spot, b.interruption_timeout_seconds) == (True, True, True, 90)
    base_config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 0}
    spec = parse_stack_config(base_config, stack="t")
    assert not node_bootstrap(spec, spec.node_groups[0]).watch_spot  # no spot nodes, no watcher


def test_efa_environment_only_for_efa_groups_and_rdma_only_where_supported() -> None:
    assert efa_environment(settings(efa=False)) == {}
    env = efa_environment(settings(gpudirect_rdma=True))
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_USE_DEVICE_RDMA" not in efa_environment(settings(gpudirect_rdma=False))


def test_g6e_gets_efa_without_gpudirect_rdma(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(group_config(base_config, "g6e.48xlarge", "on"), stack="t")
    b = node_bootstrap(spec, spec.node_groups[0])
    assert b.efa and not b.gpudirect_rdma


def test_user_data_is_gzip_base64_within_the_ec2_limit() -> None:
    text = render_user_data(settings())
    packed = base64.b64decode(encode_user_data(text))
    assert packed[:2] == b"\x1f\x8b" and len(packed) <= bootstrap.MAX_USER_DATA_BYTES
    assert gzip.decompress(packed).decode() == text
    assert encode_user_data(text) == encode_user_data(text)  # stable bytes: no spurious diffs


def test_cloudwatch_agent_publishes_gpu_utilisation_per_auto_scaling_group() -> None:
    config = cloudwatch_agent_config("c")
    metrics: Any = config["metrics"]
    assert metrics["namespace"] == "gpucluster/c"  # the cluster's own: its node role's only namespace
    assert "logs" not in config  # no run log group, no logs (the node role writes to that one only)
    assert "utilization_gpu" in metrics["metrics_collected"]["nvidia_gpu"]["measurement"]
    assert GPU_UTILIZATION_METRIC == "nvidia_smi_utilization_gpu"
    assert metrics["append_dimensions"][GPU_METRIC_DIMENSION] == "${aws:AutoScalingGroupName}"
    assert [GPU_METRIC_DIMENSION] in metrics["aggregation_dimensions"]
    written = next(f for f in node_files(settings()) if f.path.endswith("gpucluster.json"))
    shipped = json.loads(written.content)
    assert {k: v for k, v in shipped.items() if k != "logs"} == config  # plus job output (test_job_logs)


def test_data_mounts_table_rows() -> None:
    mounts = (*MOUNTS, DataMount("shared", "mount", "team-data", "", "/data/shared",
                                 expected_bucket_owner="210987654321"))
    rows = [line.split("\t") for line in data_mounts_table(settings(data_mounts=mounts)).splitlines()]
    assert rows == [
        ["copy_to_scratch", "corpus", "acme-corpus", "v3/", "-", "-", "-", "-"],
        ["mount", "models", "acme-models", "-", "/data/models", "-", "-", "-"],
        ["fsx", "train", "acme-train", "-", "/fsx", "fs-0123.fsx.us-east-1.amazonaws.com", "abcdefgh", "-"],
        ["mount", "shared", "team-data", "-", "/data/shared", "-", "-", "210987654321"],
    ]
    assert data_mounts_table(settings(data_mounts=())) == ""


def test_unresolved_or_broken_mounts_are_refused() -> None:
    with pytest.raises(TypeError, match="resolve Outputs"):
        data_mounts_table(settings(data_mounts=(DataMount("x", "mount", object(), "", "/d"),)))
    with pytest.raises(ValueError, match="fsx needs the DNS and mount name"):
        data_mounts_table(settings(data_mounts=(DataMount("x", "fsx", "b", "", "/fsx"),)))


# ------------------------------------------------------------- scripts, for real


class Sandbox:
    """A PATH of stub commands that log their arguments, and a node.env to source."""

    STUBS: ClassVar[dict[str, str]] = {
        "lsblk": """case "$*" in
  *NAME,MODEL*) [ -n "${FAKE_DISKS:-}" ] && printf '%s Amazon EC2 NVMe Instance Storage\\n' $FAKE_DISKS
                printf '/dev/nvme0n1 Amazon Elastic Block Store\\n' ;;
  *MOUNTPOINT*) [ -n "${FAKE_MOUNTED:-}" ] && echo "$FAKE_MOUNTED"; echo "" ;;
  *NAME,TYPE*)  for d in $FAKE_DISKS; do echo "$d disk"; done
                [ -n "${FAKE_RAID:-}" ] && echo "$FAKE_RAID raid0" ;;
esac; true""",
        "blkid": '[ -n "${FAKE_FS:-}" ] && echo "$FAKE_FS"',
        "mountpoint": "exit 1",
        "df": "printf 'Size\\n 30T\\n'",
        "logger": "true",
        "modinfo": "true",
        "curl": 'exec "$FAKE_CURL" "$@"',
        # The dpkg lock is held for the first FAKE_LOCK_HELD checks ("forever": every check).
        "fuser": """n=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$0.count"
[ "${FAKE_LOCK_HELD:-0}" = forever ] || [ "$n" -le "${FAKE_LOCK_HELD:-0}" ]""",
    }

    def __init__(self, root: Path, **env: str) -> None:
        self.root, self.bin, self.log = root, root / "bin", root / "calls.log"
        write_stubs(self.bin, self.log, {**dict.fromkeys(("mdadm", "mkfs.xfs", "mount", "aws", "mount-s3",
                                                          "apt-get"), "true"), **self.STUBS})
        self.node_env = root / "node.env"
        self.node_env.write_text(node_env(settings(scratch_mount=str(root / "scratch"))))
        self.env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "GPUCLUSTER_NODE_ENV": str(self.node_env),
                    "GPUCLUSTER_STATE_DIR": str(root / "run"), **os_env(root / "os"), **env}

    def run(self, name: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        return run_script(self.root, name, *args, env=self.env, timeout=timeout)

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)


P5_DISKS = " ".join(f"/dev/nvme{i}n1" for i in range(1, 9))


def test_scratch_builds_raid0_of_all_instance_store_disks(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_DISKS=P5_DISKS)
    result = box.run("scratch.sh")
    assert result.returncode == 0, result.stderr + result.stdout
    assert box.calls("mdadm") == [f"--create /dev/md0 --level=0 --raid-devices=8 --run --force {P5_DISKS}"]
    assert box.calls("mkfs.xfs") == ["-f -K /dev/md0"]
    assert box.calls("mount") == [f"-o noatime /dev/md0 {tmp_path / 'scratch'}"]
    assert "/dev/nvme0n1" not in " ".join(box.calls("mdadm"))  # the EBS root volume is never touched


def test_scratch_formats_a_single_disk_directly(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_DISKS="/dev/nvme1n1")
    assert box.run("scratch.sh").returncode == 0
    assert box.calls("mdadm") == []
    assert box.calls("mkfs.xfs") == ["-f -K /dev/nvme1n1"]


def test_scratch_without_instance_store_is_a_clean_no_op(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_DISKS="")
    result = box.run("scratch.sh")
    assert result.returncode == 0 and "no NVMe instance store" in result.stdout
    assert box.calls("mdadm") == box.calls("mkfs.xfs") == box.calls("mount") == []
    assert (tmp_path / "scratch").is_dir()


def test_scratch_reuses_an_array_after_reboot(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_DISKS=P5_DISKS, FAKE_RAID="/dev/md127", FAKE_FS="xfs")
    assert box.run("scratch.sh").returncode == 0
    assert box.calls("mdadm") == box.calls("mkfs.xfs") == []  # keeps the data of a reboot
    assert box.calls("mount") == [f"-o noatime /dev/md127 {tmp_path / 'scratch'}"]


def test_scratch_binds_instance_store_the_ami_already_mounted(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_DISKS=P5_DISKS, FAKE_MOUNTED="/opt/dlami/nvme")
    assert box.run("scratch.sh").returncode == 0
    assert box.calls("mount") == [f"--bind /opt/dlami/nvme {tmp_path / 'scratch'}"]
    assert box.calls("mdadm") == []


def test_data_copies_mounts_and_attaches_fsx_from_buckets_of_the_expected_owner(tmp_path: Path) -> None:
    mounts = (replace(MOUNTS[0], expected_bucket_owner="123456789012"),
              DataMount("models", "mount", "acme-models", "m/", str(tmp_path / "models"),
                        expected_bucket_owner="123456789012"),
              DataMount("shared", "mount", "team-data", "", str(tmp_path / "shared"),
                        expected_bucket_owner="210987654321"),
              DataMount("train", "fsx", "acme-train", "", str(tmp_path / "fsx"), "fs-1.fsx.aws", "mnt1"))
    table = tmp_path / "mounts.tsv"
    table.write_text(data_mounts_table(settings(data_mounts=mounts)))
    box = Sandbox(tmp_path, GPUCLUSTER_DATA_MOUNTS=str(table))
    result = box.run("data.sh")
    assert result.returncode == 0, result.stderr + result.stdout
    scratch = tmp_path / "scratch"
    # the owner check comes first: `aws s3 sync` itself cannot name one
    assert box.calls("aws") == [
        "s3api list-objects-v2 --region us-east-1 --bucket acme-corpus --prefix v3/ "
        "--expected-bucket-owner 123456789012 --max-items 1",
        f"s3 sync --only-show-errors --region us-east-1 s3://acme-corpus/v3/ {scratch}/corpus"]
    assert box.calls("mount-s3") == [
        "--read-only --allow-other --region us-east-1 --expected-bucket-owner 123456789012 --prefix m/ "
        f"acme-models {tmp_path}/models",
        f"--read-only --allow-other --region us-east-1 --expected-bucket-owner 210987654321 team-data "
        f"{tmp_path}/shared"]
    assert box.calls("mount") == [f"-t lustre -o relatime,flock fs-1.fsx.aws@tcp:/mnt1 {tmp_path}/fsx"]


def test_data_of_an_owner_mismatch_stops_before_copying(tmp_path: Path) -> None:
    """S3 answers 403 to a request naming another owner: nothing is copied, the unit fails."""
    table = tmp_path / "mounts.tsv"
    table.write_text(data_mounts_table(settings(data_mounts=(
        replace(MOUNTS[0], expected_bucket_owner="123456789012"),))))
    box = Sandbox(tmp_path, GPUCLUSTER_DATA_MOUNTS=str(table))
    (box.bin / "aws").write_text(f'#!/bin/bash\necho "aws $*" >> {box.log}\n'
                                 '[[ "$*" == *"--expected-bucket-owner"* ]] && exit 254\ntrue\n')
    result = box.run("data.sh")
    assert result.returncode != 0
    assert [c.split()[0] for c in box.calls("aws")] == ["s3api"]  # no sync after the refusal


def imds(tmp_path: Path, action_after: int, rebalance: bool) -> Path:
    """A fake curl answering IMDSv2: token, then 404 for instance-action `action_after` times."""
    count = tmp_path / "polls"
    rebalance_answer = "echo '{\"noticeTime\":\"2026-11-21T11:50:00Z\"}'" if rebalance else "exit 22"
    fake = tmp_path / "fake-curl"
    fake.write_text(f"""#!/bin/bash
case "$*" in
  *"-X PUT"*api/token*) echo token-123 ;;
  *token-123*spot/instance-action*)
    n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo "$n" > {count}
    [ "$n" -gt {action_after} ] || exit 22
    echo '{{"action":"terminate","time":"2026-11-21T12:00:00Z"}}' ;;
  *token-123*recommendations/rebalance*) {rebalance_answer} ;;
  *) exit 22 ;;
esac
""")
    fake.chmod(0o755)
    return fake


def hook_recorder(tmp_path: Path) -> Path:
    hook = tmp_path / "hook"
    hook.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/hook.log\n')
    hook.chmod(0o755)
    return hook


def test_spot_watcher_runs_the_hook_on_the_interruption_notice(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_CURL=str(imds(tmp_path, action_after=2, rebalance=False)),
                  GPUCLUSTER_INTERRUPTION_HOOK=str(hook_recorder(tmp_path)),
                  GPUCLUSTER_SPOT_POLL_SECONDS="0.05")
    result = box.run("spot-watcher.sh")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "polls").read_text().strip() == "3"  # two 404s, then the notice
    assert (tmp_path / "hook.log").read_text() == (
        'spot interruption notice: {"action":"terminate","time":"2026-11-21T12:00:00Z"}\n')


def test_spot_watcher_acts_on_rebalance_only_when_asked(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, FAKE_CURL=str(imds(tmp_path, action_after=1, rebalance=True)),
                  GPUCLUSTER_INTERRUPTION_HOOK=str(hook_recorder(tmp_path)),
                  GPUCLUSTER_SPOT_POLL_SECONDS="0.05")
    box.run("spot-watcher.sh")
    lines = sorted((tmp_path / "hook.log").read_text().splitlines())
    assert [line.split(":")[0] for line in lines] == ["rebalance recommendation", "spot interruption notice"]
    (tmp_path / "hook.log").unlink()
    (tmp_path / "polls").unlink()
    box.node_env.write_text(node_env(settings(handle_rebalance=False)))
    box.run("spot-watcher.sh")
    assert (tmp_path / "hook.log").read_text().startswith("spot interruption notice: ")
    assert "rebalance" not in (tmp_path / "hook.log").read_text()


def wrapper(box: Sandbox) -> Path:
    """The shipped once-per-boot wrapper, installed in the sandbox."""
    path = box.root / "gpucluster-interruption-hook"
    path.write_text(script("interruption-hook.sh"))
    path.chmod(0o755)
    return path


def test_spot_watcher_keeps_watching_after_a_rebalance_and_the_hook_runs_once(tmp_path: Path) -> None:
    """Rebalance first, the two-minute notice three polls later: both seen, one checkpoint."""
    ran = tmp_path / "ran.log"
    box = Sandbox(tmp_path, FAKE_CURL=str(imds(tmp_path, action_after=3, rebalance=True)),
                  GPUCLUSTER_SPOT_POLL_SECONDS="0.05")
    box.env["GPUCLUSTER_INTERRUPTION_HOOK"] = str(wrapper(box))
    box.node_env.write_text(node_env(settings(
        handle_rebalance=True, interruption_command=f'echo "$GPUCLUSTER_EVENT" >> {ran}')))

    result = box.run("spot-watcher.sh")

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "polls").read_text().strip() == "4"  # still watching after the rebalance
    out = result.stdout
    assert 'spot interruption notice: {"action":"terminate","time":"2026-11-21T12:00:00Z"}' in out
    assert ran.read_text() == "rebalance-recommendation\n"  # one checkpoint, from the rebalance
    assert out.count("running the interruption hook for: rebalance recommendation") == 1
    assert "already ran on this boot (exit 0); ignoring (spot interruption notice: " in out
    assert "interruption hook for the notice exited with 0" in out


def test_spot_watcher_passes_the_event_to_the_hook(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.write_text('#!/bin/bash\n'
                    f'echo "$GPUCLUSTER_EVENT/$GPUCLUSTER_INSTANCE_ACTION" >> {tmp_path}/hook.log\n')
    hook.chmod(0o755)
    box = Sandbox(tmp_path, FAKE_CURL=str(imds(tmp_path, action_after=0, rebalance=False)),
                  GPUCLUSTER_INTERRUPTION_HOOK=str(hook), GPUCLUSTER_SPOT_POLL_SECONDS="0.05")
    assert box.run("spot-watcher.sh").returncode == 0
    assert (tmp_path / "hook.log").read_text() == "spot-interruption-warning/terminate\n"


def test_watcher_and_lambda_call_the_wrapper_the_bootstrap_installs() -> None:
    from gpucluster.lambdas import spot_interruption

    assert spot_interruption.INTERRUPTION_HOOK == bootstrap.INTERRUPTION_HOOK
    assert f'"${{GPUCLUSTER_INTERRUPTION_HOOK:-{bootstrap.INTERRUPTION_HOOK}}}"' in script("spot-watcher.sh")
    installed = {f.path: f for f in node_files(settings())}
    assert installed[bootstrap.INTERRUPTION_HOOK].content == script("interruption-hook.sh")
    assert installed[bootstrap.INTERRUPTION_HOOK].mode == "0755"


def test_interruption_hook_runs_once_and_is_bounded(tmp_path: Path) -> None:
    out = tmp_path / "ran"
    box = Sandbox(tmp_path)
    box.node_env.write_text(node_env(settings(interruption_command=f"echo \"$0 ran\" >> {out}")))
    first, second = box.run("interruption-hook.sh", "spot"), box.run("interruption-hook.sh", "ssm")
    assert first.returncode == second.returncode == 0
    assert out.read_text().count("ran") == 1 and "already ran" in second.stdout
    box.env["GPUCLUSTER_STATE_DIR"] = str(tmp_path / "run2")
    env = node_env(settings(interruption_command="sleep 30", interruption_timeout_seconds=1))
    box.node_env.write_text(env.replace("TIMEOUT_SECONDS=1\n", "TIMEOUT_SECONDS=0.2\n"))  # keep it quick
    slow = box.run("interruption-hook.sh", "spot", timeout=15)
    assert slow.returncode == 124  # timeout(1) stopped the hook


def test_a_second_caller_waits_for_the_run_and_reports_its_status(tmp_path: Path) -> None:
    """The SSM path arriving while the watcher's hook runs: it waits, then exits as that run did."""
    out = tmp_path / "ran"
    box = Sandbox(tmp_path)
    box.node_env.write_text(node_env(settings(
        interruption_command=f"echo ran >> {out}; sleep 0.5; exit 3")))
    hook = wrapper(box)
    first = subprocess.Popen(["bash", str(hook), "watcher"], env=box.env, stdout=subprocess.PIPE, text=True)
    for _ in range(100):  # until the first run holds the lock and has started the command
        if out.exists():
            break
        subprocess.run(["sleep", "0.02"], check=True)
    second = subprocess.run(["bash", str(hook), "ssm"], env=box.env, capture_output=True, text=True,
                            timeout=10)
    assert first.wait(timeout=10) == 3
    assert second.returncode == 3
    assert "already ran on this boot (exit 3); ignoring (ssm)" in second.stdout
    assert out.read_text() == "ran\n"


def test_a_run_that_never_finished_is_not_repeated_and_reports_failure(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "interruption-hook.done").write_text("started\n")  # killed mid-run
    result = box.run("interruption-hook.sh", "ssm")
    assert result.returncode == 1
    assert "did not finish; not running again" in result.stdout


def test_nodes_get_the_scripts_without_comments_and_every_heredoc_body_intact() -> None:
    """EC2 user data is 16 KiB gzipped: comments stay in the repository, not on the wire."""
    text = ("#!/bin/bash\n# a comment\n  # indented comment\n\n# shellcheck disable=SC1090\n"
            "cat > /etc/x <<'EOF'\n# kept: data\n\nEOF\necho hi  # trailing comment stays\n"
            "cat <<-END\n\t# kept too\n\tEND\n# gone\n# rendered for @@LABEL@@\n")
    assert bootstrap.compact_shell(text) == (
        "#!/bin/bash\n# shellcheck disable=SC1090\ncat > /etc/x <<'EOF'\n# kept: data\n\nEOF\n"
        "echo hi  # trailing comment stays\ncat <<-END\n\t# kept too\n\tEND\n# rendered for @@LABEL@@\n")
    for path in sorted(Path(bootstrap.__file__).parent.glob("*.sh")):
        compact = bootstrap.script(path.name)
        assert len(compact) < len(path.read_text())
        checked = subprocess.run(["bash", "-n"], input=compact, text=True, capture_output=True, check=False)
        assert checked.returncode == 0, (path.name, checked.stderr)
