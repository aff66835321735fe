"""MIG on the node: gpucluster-mig under bash with a fake nvidia-smi, and the bootstrap around it.

The fake keeps a GPU's state in files (MIG mode current/pending, its GPU instances as
"<profile> <start>") and answers the nvidia-smi calls the script makes, in nvidia-smi's own
formats (`-L`, `mig -lgi`, `--query-gpu ... --format=csv,noheader`); every call is logged. A
"reboot" clears what a reboot clears (the instances, /run) and turns a pending mode on.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpucluster.node.userdata import (
    MIG_DEVICES,
    MIG_TOOL,
    NodeBootstrap,
    NodeFile,
    mig_plans,
    node_bootstrap,
    node_env,
    node_files,
    render_user_data,
)
from gpucluster.preflight import parse_stack_config
from test_bootstrap import Sandbox, lint, settings

H100_PLAN = "3g.40gb:4,2g.20gb:0,1g.10gb:2,1g.10gb:3"

FAKE_SMI = r"""#!/bin/bash
# A fake nvidia-smi over the state in $FAKE_SMI (one directory per GPU: mode, gi).
echo "nvidia-smi $*" >> "$CALLS"
if [ "${FAKE_NO_DRIVER:-}" = 1 ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9
fi
S="$FAKE_SMI"
mode() { cat "$S/$1/mode"; }  # "<current> <pending>"
case "$*" in
  "--query-gpu=index --format=csv,noheader")
    for g in $(ls "$S" | sort -n); do echo "$g"; done ;;
  "--query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader")
    for g in $(ls "$S" | sort -n); do read -r c p < "$S/$g/mode"; echo "$g, $c, $p"; done ;;
  "-i "*" -mig 1")
    g=$2
    case "${FAKE_ENABLE:-now}" in
      now) echo "Enabled Enabled" > "$S/$g/mode"; echo "Enabled MIG Mode for GPU $g" ;;
      pending) echo "Disabled Enabled" > "$S/$g/mode"
               echo "Warning: MIG mode is in pending enable state for GPU $g:Not Supported" ;;
      refuse) echo "Unable to enable MIG Mode for GPU $g: In use by another client"; exit 1 ;;
    esac ;;
  "--gpu-reset -i "*)
    g=$3
    if [ "${FAKE_RESET:-refuse}" = ok ]; then read -r c p < "$S/$g/mode"; echo "$p $p" > "$S/$g/mode"
    else echo "Resetting GPU $g is not supported."; exit 3; fi ;;
  "mig -i "*" -lgi")
    g=$3
    [ -s "$S/$g/gi" ] || { echo "No GPU instances found: Not Found"; exit 6; }
    echo "+----------------------------------------------------+"
    echo "| GPU instances:                                     |"
    echo "| GPU   Name          Profile  Instance   Placement  |"
    echo "|                       ID       ID       Start:Size |"
    echo "|====================================================|"
    n=0; while read -r prof start; do n=$((n + 1))
      printf '|   %s  MIG %-9s %5s %8s %10s:1     |\n' "$g" "$prof" 9 "$n" "$start"
    done < "$S/$g/gi" ;;
  "mig -i "*" -dci")
    [ -s "$S/$3/gi" ] || exit 6; [ "${FAKE_BUSY:-}" = 1 ] && exit 19; echo "destroyed CIs" ;;
  "mig -i "*" -dgi")
    [ "${FAKE_BUSY:-}" = 1 ] && { echo "In use by another client"; exit 19; }; : > "$S/$3/gi" ;;
  "mig -i "*" -cgi "*" -C")
    g=$3
    [ "$(mode "$g")" = "Enabled Enabled" ] || { echo "MIG mode is not enabled"; exit 3; }
    [ "${FAKE_CGI:-ok}" = fail ] && { echo "Failed to create GPU instances: Insufficient Resources"; exit 2; }
    IFS=, read -ra tuples <<<"$5"
    for t in "${tuples[@]}"; do echo "${t%%:*} ${t#*:}" >> "$S/$g/gi"; done ;;
  "-L")
    for g in $(ls "$S" | sort -n); do
      echo "GPU $g: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$g-aaaa-bbbb-cccc-dddddddddddd)"
      i=0; while read -r prof start; do
        [ "${FAKE_NO_CI:-}" = 1 ] && break
        echo "  MIG $prof     Device  $i: (UUID: MIG-$g$i$(cat "$S/boot")-1111-2222-3333-444444444444)"
        i=$((i + 1)); done < "$S/$g/gi"
    done ;;
  *) echo "fake nvidia-smi: unexpected $*" >&2; exit 99 ;;
esac
"""


class Node:
    """A node with `gpus` GPUs (MIG mode `mode`), gpucluster-mig and a fake nvidia-smi."""

    def __init__(self, root: Path, plans: str = f"*={H100_PLAN}", gpus: int = 2,
                 mode: str = "Disabled Disabled", **env: str) -> None:
        self.box = Sandbox(root, **env)
        self.box.node_env.write_text(node_env(settings(mig_layouts=tuple(
            tuple(p.split("=", 1)) for p in plans.split()))))  # type: ignore[misc]
        self.smi = root / "smi"
        for g in range(gpus):
            (self.smi / str(g)).mkdir(parents=True)
            (self.smi / str(g) / "mode").write_text(mode + "\n")
            (self.smi / str(g) / "gi").write_text("")
        (root / "smi-boot").write_text("0")
        fake = self.box.bin / "nvidia-smi"
        fake.write_text(FAKE_SMI.replace('cat "$S/boot"', f'cat {root}/smi-boot'))
        fake.chmod(0o755)
        (self.box.bin / "systemctl").write_text(
            f'#!/bin/bash\necho "systemctl $*" >> {self.box.log}\n'
            '[ "$1 $2" = "is-active --quiet" ] && [[ " ${FAKE_ACTIVE:-} " == *" $3 "* ]] && exit 0\n'
            '[ "$1" = is-active ] && exit 3\ntrue\n')
        (self.box.bin / "systemctl").chmod(0o755)
        self.persist = root / "persist"
        self.box.env |= {"FAKE_SMI": str(self.smi), "CALLS": str(self.box.log),
                         "GPUCLUSTER_PERSIST_DIR": str(self.persist)}
        self.state = Path(self.box.env["GPUCLUSTER_STATE_DIR"])

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        self.box.env |= env
        return self.box.run("mig.sh", *args)

    def smi_calls(self, start: str = "") -> list[str]:
        return [c for c in self.box.calls("nvidia-smi") if c.startswith(start)]

    def layout(self, gpu: int) -> list[str]:
        return (self.smi / str(gpu) / "gi").read_text().split("\n")[:-1]

    def reboot(self, hopper: bool = False) -> None:
        """What a reboot does: MIG instances and /run are gone; on an A100 a pending mode takes effect
        (InfoROM), on Hopper and later the mode is off again (MIG user guide, "Enable MIG Mode")."""
        for gpu in self.smi.iterdir():
            pending = "Disabled" if hopper else (gpu / "mode").read_text().split()[1]
            (gpu / "mode").write_text(f"{pending} {pending}\n")
            (gpu / "gi").write_text("")
        boot = self.box.root / "smi-boot"
        boot.write_text(str(int(boot.read_text()) + 1))
        for f in self.state.glob("*"):
            f.unlink()
        self.box.log.unlink(missing_ok=True)


def test_mig_script_lints_clean() -> None:
    from gpucluster.node import userdata

    lint(Path(userdata.__file__).parent / "mig.sh")


def test_apply_turns_mig_on_and_creates_the_layout_on_every_gpu(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("apply")
    assert result.returncode == 0, result.stderr
    assert node.smi_calls("-i ") == ["-i 0 -mig 1", "-i 1 -mig 1"]
    assert node.smi_calls("mig -i 0 -cgi") == [f"mig -i 0 -cgi {H100_PLAN} -C"]
    assert node.smi_calls("mig -i 1 -cgi") == [f"mig -i 1 -cgi {H100_PLAN} -C"]
    assert node.layout(0) == node.layout(1) == ["3g.40gb 4", "2g.20gb 0", "1g.10gb 2", "1g.10gb 3"]
    assert not node.smi_calls("--gpu-reset")  # the driver reset the GPUs itself
    devices = (node.state / "mig-devices").read_text().splitlines()
    assert [d[:6] for d in devices] == ["MIG-00", "MIG-01", "MIG-02", "MIG-03", "MIG-10", "MIG-11",
                                        "MIG-12", "MIG-13"]  # GPU 0's four, then GPU 1's
    assert "8 MIG devices: 4 per GPU" in result.stderr


def test_apply_is_a_no_op_when_the_layout_is_already_there(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.run("apply").returncode == 0
    node.box.log.unlink()
    before = (node.state / "mig-devices").read_text()

    result = node.run("apply")  # e.g. the unit restarted

    assert result.returncode == 0, result.stderr
    assert node.smi_calls("mig -i 0 -cgi") == [] and node.smi_calls("mig -i 0 -d") == []
    assert node.smi_calls("-i ") == []  # MIG mode already on: no mode change, no reset
    assert "GPU 0: layout 3g.40gb:4" in result.stderr and "already in place" in result.stderr
    assert (node.state / "mig-devices").read_text() == before


@pytest.mark.parametrize("hopper", [False, True])
def test_after_a_reboot_the_layout_is_made_again(tmp_path: Path, hopper: bool) -> None:
    node = Node(tmp_path)
    assert node.run("apply").returncode == 0
    node.reboot(hopper=hopper)  # the instances are gone; on an H100 MIG mode too

    result = node.run("apply")

    assert result.returncode == 0, result.stderr
    assert node.smi_calls("-i ") == (["-i 0 -mig 1", "-i 1 -mig 1"] if hopper else [])
    assert len(node.smi_calls("mig -i 0 -cgi")) == 1 and len(node.smi_calls("mig -i 1 -cgi")) == 1
    assert (node.state / "mig-devices").read_text().splitlines()[0].startswith("MIG-001")  # new UUIDs


def test_a_different_layout_is_replaced(tmp_path: Path) -> None:
    node = Node(tmp_path, mode="Enabled Enabled")
    (node.smi / "0" / "gi").write_text("7g.80gb 0\n")
    result = node.run("apply")
    assert result.returncode == 0, result.stderr
    assert node.smi_calls("mig -i 0") == ["mig -i 0 -lgi", "mig -i 0 -dci", "mig -i 0 -dgi",
                                          f"mig -i 0 -cgi {H100_PLAN} -C", "mig -i 0 -lgi"]
    assert "GPU 0: replacing its MIG instances (7g.80gb:0)" in result.stderr
    assert node.layout(0) == node.layout(1) == ["3g.40gb 4", "2g.20gb 0", "1g.10gb 2", "1g.10gb 3"]


def test_instances_in_use_fail_loudly_and_nothing_is_created(tmp_path: Path) -> None:
    node = Node(tmp_path, mode="Enabled Enabled", FAKE_BUSY="1")
    (node.smi / "0" / "gi").write_text("7g.80gb 0\n")
    result = node.run("apply")
    assert result.returncode == 1
    assert "FAILED: GPU 0: its MIG instances cannot be removed (in use?)" in result.stderr
    assert node.smi_calls("mig -i 0 -cgi") == [] and not (node.state / "mig-devices").exists()


def test_a_failed_create_fails_the_step(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_CGI="fail")
    result = node.run("apply")
    assert result.returncode == 1
    assert f"FAILED: GPU 0: nvidia-smi mig -cgi {H100_PLAN} -C failed" in result.stderr
    assert not (node.state / "mig-devices").exists()


def test_gpu_instances_without_compute_instances_are_not_taken_for_the_layout(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_NO_CI="1")  # -cgi made GPU instances but no MIG device shows
    result = node.run("apply")
    assert result.returncode == 1
    assert f"FAILED: GPU 0: the MIG layout is not {H100_PLAN} after creating it" in result.stderr


def test_gpu_clients_are_stopped_for_the_mode_change_and_started_again(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_ACTIVE="nvidia-dcgm.service nvidia-persistenced.service")
    assert node.run("apply").returncode == 0
    calls = node.box.calls("systemctl")
    assert [c for c in calls if not c.startswith("is-active")] == [
        "stop nvidia-dcgm.service", "stop nvidia-persistenced.service",
        "start nvidia-dcgm.service", "start nvidia-persistenced.service"]
    log = node.box.log.read_text().splitlines()
    assert log.index("systemctl stop nvidia-dcgm.service") < log.index("nvidia-smi -i 0 -mig 1") \
        < log.index("systemctl start nvidia-dcgm.service")


def test_a_pending_mode_is_reset(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_ENABLE="pending", FAKE_RESET="ok")
    result = node.run("apply")
    assert result.returncode == 0, result.stderr
    assert node.smi_calls("--gpu-reset") == ["--gpu-reset -i 0", "--gpu-reset -i 1"]
    assert not (node.state / "mig-reboot").exists()


def test_a_mode_no_reset_turns_on_asks_for_one_reboot_then_applies(tmp_path: Path) -> None:
    """An A100 passed through to a VM: the enable stays pending and the GPU cannot be reset."""
    node = Node(tmp_path, FAKE_ENABLE="pending", FAKE_RESET="refuse")

    first = node.run("apply")

    assert first.returncode == 1
    assert "MIG mode pending on GPU(s) 0,1 until the node reboots" in first.stderr
    assert (node.state / "mig-reboot").exists() and (node.persist / "mig-rebooted").exists()
    assert node.smi_calls("mig -i 0 -cgi") == []  # nothing created on a GPU not in MIG mode
    node.reboot()

    second = node.run("apply")

    assert second.returncode == 0, second.stderr
    assert node.layout(1) == ["3g.40gb 4", "2g.20gb 0", "1g.10gb 2", "1g.10gb 3"]
    assert not (node.state / "mig-reboot").exists()


def test_a_mode_still_pending_after_the_reboot_fails_without_asking_again(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_ENABLE="pending", FAKE_RESET="refuse")
    node.persist.mkdir()
    (node.persist / "mig-rebooted").write_text("2026-11-21T10:00:00+00:00\n")
    result = node.run("apply")
    assert result.returncode == 1
    assert "FAILED: MIG mode still pending on GPU(s) 0,1 after a reboot" in result.stderr
    assert not (node.state / "mig-reboot").exists()


def test_a_refused_mode_change_fails_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_ENABLE="refuse")
    result = node.run("apply")
    assert result.returncode == 1
    assert "FAILED: MIG mode could not be turned on for GPU(s) 0,1" in result.stderr
    assert not (node.state / "mig-reboot").exists() and not node.smi_calls("--gpu-reset")


def test_no_driver_fails_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path, FAKE_NO_DRIVER="1")
    result = node.run("apply")
    assert result.returncode == 1
    assert "FAILED: nvidia-smi lists no GPU: NVIDIA-SMI has failed because it couldn't communicate" \
        in result.stderr
    assert node.smi_calls("-i ") == [] and node.smi_calls("mig") == []


def imds_curl(root: Path, instance_type: str) -> Path:
    fake = root / "fake-curl"
    fake.write_text(f"""#!/bin/bash
case "$*" in
  *"-X PUT"*api/token*) echo tok ;;
  *tok*meta-data/instance-type*) echo {instance_type} ;;
  *) exit 22 ;;
esac
""")
    fake.chmod(0o755)
    return fake


def test_the_plan_of_the_nodes_instance_type_is_used(tmp_path: Path) -> None:
    """1g.10gb takes two memory slices on an A100 40GB, one on an 80GB: each type its own starts."""
    plans = "p4d.24xlarge=1g.10gb:0,1g.10gb:2 p4de.24xlarge=1g.10gb:0,1g.10gb:1"
    node = Node(tmp_path, plans=plans, gpus=1, FAKE_CURL=str(imds_curl(tmp_path, "p4de.24xlarge")))
    result = node.run("apply")
    assert result.returncode == 0, result.stderr
    assert node.smi_calls("mig -i 0 -cgi") == ["mig -i 0 -cgi 1g.10gb:0,1g.10gb:1 -C"]


def test_a_type_without_a_plan_fails(tmp_path: Path) -> None:
    node = Node(tmp_path, plans="p4d.24xlarge=1g.10gb:0", gpus=1,
                FAKE_CURL=str(imds_curl(tmp_path, "p5.48xlarge")))
    result = node.run("apply")
    assert result.returncode == 1 and "no MIG layout for instance type p5.48xlarge" in result.stderr
    assert node.smi_calls("-i ") == []


# ------------------------------------------------------------------- one device per rank


def test_exec_gives_each_local_rank_its_own_mig_device(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.run("apply").returncode == 0
    devices = (node.state / "mig-devices").read_text().splitlines()
    seen = []
    for rank in range(len(devices)):
        out = node.run("exec", "bash", "-c", 'echo "$CUDA_VISIBLE_DEVICES $0"', "arg",
                       LOCAL_RANK=str(rank))
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout.split())
    assert seen == [[d, "arg"] for d in devices]
    assert node.run("devices").stdout.splitlines() == devices


def test_exec_takes_mpiruns_local_rank_too(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.run("apply").returncode == 0
    node.box.env.pop("LOCAL_RANK", None)
    out = node.run("exec", "printenv", "CUDA_VISIBLE_DEVICES", OMPI_COMM_WORLD_LOCAL_RANK="5")
    assert out.stdout.strip() == (node.state / "mig-devices").read_text().splitlines()[5]


@pytest.mark.parametrize(("rank", "message"), [
    ("8", "local rank 8, but this node has 8 MIG devices"),
    ("", "no local rank (LOCAL_RANK from torchrun"),
])
def test_exec_refuses_a_rank_without_a_device(tmp_path: Path, rank: str, message: str) -> None:
    node = Node(tmp_path)
    assert node.run("apply").returncode == 0
    out = node.run("exec", "true", LOCAL_RANK=rank)
    assert out.returncode == 2 and message in out.stderr


def test_exec_before_apply_says_why(tmp_path: Path) -> None:
    out = Node(tmp_path).run("exec", "true", LOCAL_RANK="0")
    assert out.returncode == 1 and "no MIG devices (see journalctl -u gpucluster-mig)" in out.stderr


# -------------------------------------------------------------------- rendered and bootstrap


def mig_config(base_config: dict[str, Any], types: list[str], mig: dict[str, Any]) -> dict[str, Any]:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1c"]
    base_config["gpucluster:node_groups"][0].update({"instance_types": types, "mig": mig, "efa": "off"})
    return base_config


def test_plans_carry_the_catalogs_placements(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(mig_config(base_config, ["p5.48xlarge"],
                                         {"profiles": ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]}), "t")
    assert mig_plans(spec.node_groups[0]) == (("*", H100_PLAN),)
    spec = parse_stack_config(mig_config(base_config, ["p4d.24xlarge", "p4de.24xlarge"],
                                         {"profile": "1g.10gb", "count": 4}), "t")
    assert mig_plans(spec.node_groups[0]) == (
        ("p4d.24xlarge", "1g.10gb:0,1g.10gb:2,1g.10gb:4,1g.10gb:6"),
        ("p4de.24xlarge", "1g.10gb:0,1g.10gb:1,1g.10gb:2,1g.10gb:3"))


def test_groups_without_mig_carry_nothing_of_it(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(base_config, "t")
    b = node_bootstrap(spec, spec.node_groups[0])
    assert b.mig_layouts == ()
    paths = [f.path for f in node_files(b)]
    assert MIG_TOOL not in paths and "/etc/systemd/system/gpucluster-mig.service" not in paths
    assert "GPUCLUSTER_MIG_LAYOUTS=''" in node_env(b)


def test_a_mig_group_gets_the_tool_and_a_unit_setup_waits_for(base_config: dict[str, Any],
                                                              tmp_path: Path) -> None:
    spec = parse_stack_config(mig_config(base_config, ["p5.48xlarge"], {"profile": "1g.10gb"}), "t")
    b = node_bootstrap(spec, spec.node_groups[0])
    files = {f.path: f for f in node_files(b)}
    assert files[MIG_TOOL].mode == "0755"
    unit = files["/etc/systemd/system/gpucluster-mig.service"].content
    assert f"ExecStart={MIG_TOOL} apply\n" in unit and "Before=gpucluster-setup.service" in unit
    assert "ExecStopPost=/usr/local/sbin/gpucluster-report mig" in unit  # NodeStepFailed, Step=mig
    setup = files["/etc/systemd/system/gpucluster-setup.service"].content
    assert "Requires=gpucluster-mig.service" in setup and "gpucluster-mig.service" in setup.split("After=")[1]
    env = node_env(b)
    assert "GPUCLUSTER_MIG_LAYOUTS='*=1g.10gb:0,1g.10gb:1,1g.10gb:2,1g.10gb:3,1g.10gb:4,1g.10gb:5," \
           "1g.10gb:6'" in env
    assert MIG_DEVICES == "/run/gpucluster/mig-devices"
    path = tmp_path / "user-data.sh"
    path.write_text(render_user_data(b))
    lint(path)


def bootstrap_tail(text: str, root: Path, node_env_file: Path) -> str:
    """The part of rendered user data after its files are written, with paths moved under `root` (the
    OS tool to the Sandbox's, which reads a fake Ubuntu os-release)."""
    tail = text.split("# shellcheck source=/dev/null\n. /etc/gpucluster/node.env\n")[1]
    return ("#!/bin/bash\nset -euo pipefail\n" + f". {node_env_file}\n" + tail).replace(
        "/run/gpucluster/", f"{root}/run/").replace("/usr/local/sbin/gpucluster-os",
                                                   f"{root}/os/gpucluster-os")


def run_bootstrap_after_files(b: NodeBootstrap, outcome: str, tmp_path: Path,
                              ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the user data after its files are written, with `systemctl start gpucluster-mig` ending
    as `outcome` (applied, reboot: asks for the one reboot, failed); the result and systemctl calls."""
    box = Sandbox(tmp_path)
    box.node_env.write_text(node_env(b))
    (tmp_path / "run").mkdir()
    request = tmp_path / "run" / "mig-reboot"
    start_mig = {"applied": "exit 0", "reboot": f"touch {request}; exit 1", "failed": "exit 1"}[outcome]
    (box.bin / "systemctl").write_text(
        f'#!/bin/bash\necho "systemctl $*" >> {box.log}\n'
        f'[ "$*" = "start gpucluster-mig.service" ] && {{ {start_mig}; }}\ntrue\n')
    (box.bin / "systemctl").chmod(0o755)
    script = tmp_path / "tail.sh"
    script.write_text(bootstrap_tail(render_user_data(b), tmp_path, box.node_env))
    result = subprocess.run(["bash", str(script)], env=box.env, capture_output=True, text=True, timeout=20)
    return result, box.calls("systemctl")


@pytest.mark.parametrize("outcome", ["applied", "reboot", "failed"])
def test_the_bootstrap_applies_mig_before_anything_else(outcome: str, base_config: dict[str, Any],
                                                        tmp_path: Path) -> None:
    base_config["gpucluster:spot"] = {"interruption_command": "echo hi"}
    spec = parse_stack_config(mig_config(base_config, ["p5.48xlarge"], {"profile": "3g.40gb"}), "t")
    result, calls = run_bootstrap_after_files(node_bootstrap(spec, spec.node_groups[0]), outcome, tmp_path)
    first_start = next(i for i, c in enumerate(calls) if c.startswith("start"))
    assert calls[first_start] == "start gpucluster-mig.service"
    enabled = " ".join(c for c in calls[:first_start] if c.startswith("enable"))
    for unit in ("gpucluster-mig", "gpucluster-agent", "gpucluster-scratch", "gpucluster-data",
                 "gpucluster-setup", "gpucluster-spot-watcher"):
        assert f"{unit}.service" in enabled, unit  # all enabled before: a reboot starts them
    if outcome == "reboot":
        assert result.returncode == 0 and calls[first_start + 1:] == ["reboot"]
        assert "rebooting (once)" in result.stdout
    elif outcome == "failed":
        assert result.returncode == 1
        assert "MIG layout NOT applied" in result.stdout
        assert "FAILED: the GPUs have no MIG layout" in result.stdout
        assert "reboot" not in calls
        assert "start --no-block gpucluster-agent.service" in calls  # still seen (and stoppable)
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "reboot" not in calls and "gpucluster bootstrap: done" in result.stdout
        assert calls.index("start gpucluster-mig.service") < calls.index(
            "start --no-block gpucluster-setup.service")


MIG_USER_DATA_BYTES = 2200
"""What MIG may add to a group's user data, gzipped: gpucluster-mig, its unit, the plans (2102 measured)."""


def test_mig_adds_little_to_the_user_data(base_config: dict[str, Any]) -> None:
    import base64

    from gpucluster.node.userdata import MAX_USER_DATA_BYTES, encode_user_data

    def size(mig: dict[str, Any] | None) -> int:
        config = mig_config(copy.deepcopy(base_config), ["p4d.24xlarge", "p4de.24xlarge"], mig or {})
        if mig is None:
            del config["gpucluster:node_groups"][0]["mig"]
        spec = parse_stack_config(config, "t")
        text = render_user_data(node_bootstrap(spec, spec.node_groups[0]))
        return len(base64.b64decode(encode_user_data(text)))

    with_mig, without = size({"profile": "1g.10gb", "count": 4}), size(None)
    assert with_mig <= MAX_USER_DATA_BYTES
    assert 0 < with_mig - without <= MIG_USER_DATA_BYTES, with_mig - without


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_mig_unit_and_setups_dependency_on_it(tmp_path: Path) -> None:
    verify_units(node_files(settings(mig_layouts=(("*", H100_PLAN),))),
                 ("gpucluster-mig.service", "gpucluster-setup.service"), tmp_path)


def verify_units(files: list[NodeFile], names: tuple[str, ...], tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the units `names` of `files`, their scripts in place."""
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for f in files:
        if f.path.startswith("/usr/local/sbin/"):
            (sbin / Path(f.path).name).write_text(f.content)
            (sbin / Path(f.path).name).chmod(0o755)
    paths = []
    for f in files:
        if Path(f.path).name in names:
            path = tmp_path / Path(f.path).name
            path.write_text(f.content.replace("/usr/local/sbin/", f"{sbin}/"))
            paths.append(str(path))
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True,
                            cwd=tmp_path)
    problems = [line for line in result.stderr.splitlines() if "gpucluster" in line]
    assert len(paths) == len(names) and result.returncode == 0 and problems == [], result.stderr
