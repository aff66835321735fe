"""The node group's own setup: spec keys, rendering, and the node scripts run for real under bash.

gpucluster-setup (container pull, the group's setup once per instance) and
gpucluster-checkpoint (the checkpoint contract's hook) run here with docker,
aws and nvidia-smi replaced by stubs on PATH that log their arguments.
"""

from __future__ import annotations

import base64
import gzip
import os
import random
import re
import string
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from base_config import plan_config
from fake_node import logged_calls, run_script, write_stubs
from gpucluster.node import userdata
from gpucluster.node.userdata import (
    CHECKPOINT_HOOK,
    USER_SETUP,
    NodeBootstrap,
    node_bootstrap,
    node_env,
    node_files,
    render_user_data,
    script,
)
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError
from shipped import shipped_plan
from test_bootstrap import lint, settings


def plain_group(**changes: Any) -> NodeBootstrap:
    """test_bootstrap's settings for a group without EFA, spot or datasets."""
    return settings(node_group="train", efa=False, gpudirect_rdma=False, watch_spot=False,
                    interruption_command=None, data_mounts=(), **changes)


class Node:
    """A fake node: stub commands on PATH logging their calls, a node.env, paths under tmp."""

    def __init__(self, root: Path, *, image: str = "", stubs: dict[str, str] | None = None) -> None:
        self.root, self.bin, self.log = root, root / "bin", root / "calls.log"
        write_stubs(self.bin, self.log, {"docker": "true", "aws": "echo token", "logger": "true",
                                         "nvidia-smi": "true", "cloud-init": "true", "fuser": "exit 1",
                                         **(stubs or {})})
        self.env_file = root / "node.env"
        self.env_file.write_text(node_env(plain_group(container_image=image or None)))
        self.setup = root / "user-setup.sh"
        self.env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "GPUCLUSTER_NODE_ENV": str(self.env_file),
                    "GPUCLUSTER_USER_SETUP": str(self.setup), "GPUCLUSTER_SETUP_STATE": str(root / "state"),
                    "GPUCLUSTER_SETUP_LOG": str(root / "setup.log"), "GPUCLUSTER_RETRY_SECONDS": "0",
                    "GPUCLUSTER_CHECKPOINT_REQUEST": str(root / "run" / "checkpoint-request"),
                    "GPUCLUSTER_CHECKPOINT_DONE": str(root / "run" / "checkpoint-done"),
                    "GPUCLUSTER_POLL_SECONDS": "1"}

    def run(self, name: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return run_script(self.root, name, *args, env=self.env, timeout=timeout)

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)


@pytest.mark.parametrize("name", ["setup.sh", "checkpoint.sh"])
def test_scripts_lint_clean(name: str) -> None:
    lint(Path(userdata.__file__).parent / name)


# ------------------------------------------------------------------ gpucluster-setup


def test_setup_pulls_the_image_then_runs_the_groups_setup_once(tmp_path: Path) -> None:
    node = Node(tmp_path, image="nvcr.io/nvidia/pytorch:24.12-py3")
    out = tmp_path / "ran"
    node.setup.write_text(f'#!/bin/bash\necho "$GPUCLUSTER_NODE_GROUP $GPUCLUSTER_STACK" >> {out}\n')
    node.setup.chmod(0o700)

    first = node.run("setup.sh")

    assert first.returncode == 0, first.stdout + first.stderr
    assert node.calls("docker") == ["info", "pull --quiet nvcr.io/nvidia/pytorch:24.12-py3"]
    assert node.calls("aws") == []  # not an ECR image: no login
    assert out.read_text() == "train t\n"  # node.env exported to the setup
    assert (tmp_path / "state" / "setup.done").exists()
    assert "setup done" in (tmp_path / "setup.log").read_text()

    second = node.run("setup.sh")  # a reboot
    assert second.returncode == 0
    assert out.read_text() == "train t\n"  # not run twice
    assert "setup already done on this instance" in second.stdout


def test_a_failed_setup_fails_the_unit_and_runs_again_at_the_next_boot(tmp_path: Path) -> None:
    node = Node(tmp_path)
    runs = tmp_path / "runs"
    node.setup.write_text(f"echo run >> {runs}\nexit 3\n")  # no shebang: run with bash

    result = node.run("setup.sh")

    assert result.returncode == 1
    assert "setup failed with exit 3; it runs again at the next boot" in result.stdout
    assert not (tmp_path / "state" / "setup.done").exists()
    assert node.run("setup.sh").returncode == 1
    assert runs.read_text() == "run\nrun\n"


def test_setup_logs_in_to_ecr_before_pulling(tmp_path: Path) -> None:
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/trainer:v7"
    node = Node(tmp_path, image=image, stubs={"docker": 'if [ "$1" = login ]; then cat > /dev/null; fi'})

    result = node.run("setup.sh")

    assert result.returncode == 0, result.stdout + result.stderr
    assert node.calls("aws") == ["ecr get-login-password --region eu-west-1"]
    assert node.calls("docker") == [
        "info", "login --username AWS --password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        f"pull --quiet {image}"]
    assert "no setup for node group train" in result.stdout


def test_a_failed_pull_is_retried_and_reported_but_setup_still_runs(tmp_path: Path) -> None:
    node = Node(tmp_path, image="nvcr.io/nvidia/pytorch:24.12-py3",
                stubs={"docker": '[ "$1" = info ] && exit 0; exit 1'})
    node.setup.write_text("#!/bin/bash\ntrue\n")
    node.setup.chmod(0o700)

    result = node.run("setup.sh")

    assert result.returncode == 1
    assert len([c for c in node.calls("docker") if c.startswith("pull")]) == 3
    assert "could not pull nvcr.io/nvidia/pytorch:24.12-py3" in result.stdout
    assert (tmp_path / "state" / "setup.done").exists()


def test_setup_waits_for_cloud_init_and_the_dpkg_lock(tmp_path: Path) -> None:
    count = tmp_path / "fuser-count"
    # the lock is held on the first two looks, then free
    node = Node(tmp_path, stubs={"fuser": f'echo x >> {count}; [ "$(wc -l < {count})" -le 2 ]'})
    node.setup.write_text(f"#!/bin/bash\necho ran >> {tmp_path / 'ran'}\n")
    node.setup.chmod(0o700)

    result = node.run("setup.sh")

    assert result.returncode == 0, result.stdout + result.stderr
    assert node.calls("cloud-init") == ["status --wait"]
    assert node.calls("fuser") == ["/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock"] * 3
    assert result.stdout.count("dpkg is locked by another process") == 2
    assert (tmp_path / "ran").read_text() == "ran\n"


def test_setup_with_nothing_to_do_succeeds(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.run("setup.sh")
    assert result.returncode == 0 and node.calls("docker") == []


# ------------------------------------------------------------- gpucluster-checkpoint


GPU_BUSY = {"nvidia-smi": 'echo "4242"'}


def test_checkpoint_with_no_process_on_a_gpu_returns_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    started = time.monotonic()
    result = node.run("checkpoint.sh", "30")
    assert result.returncode == 0 and "nothing to checkpoint" in result.stdout
    assert time.monotonic() - started < 5
    assert not (tmp_path / "run" / "checkpoint-request").exists()


def test_checkpoint_requests_and_waits_for_the_job(tmp_path: Path) -> None:
    node = Node(tmp_path, stubs=GPU_BUSY)
    request, done = tmp_path / "run" / "checkpoint-request", tmp_path / "run" / "checkpoint-done"
    seen: list[str] = []

    def job() -> None:  # the training loop's side of the contract
        for _ in range(100):
            if request.exists():
                seen.append(request.read_text())
                done.touch()
                return
            time.sleep(0.1)

    worker = threading.Thread(target=job)
    worker.start()
    node.env["GPUCLUSTER_STOP_REASON"] = "manual"
    result = node.run("checkpoint.sh", "20")
    worker.join()

    assert result.returncode == 0, result.stdout + result.stderr
    assert seen and seen[0].startswith("manual ")
    assert "checkpoint saved after" in result.stdout
    assert not request.exists()  # cleared, so the job does not checkpoint again


def test_checkpoint_not_confirmed_in_time_fails(tmp_path: Path) -> None:
    node = Node(tmp_path, stubs=GPU_BUSY)
    result = node.run("checkpoint.sh", "1")
    assert result.returncode == 1 and "no checkpoint confirmed within 1s" in result.stdout
    assert node.run("checkpoint.sh", "soon").returncode == 2


# ------------------------------------------------------------------------ rendering


def _group_config(base_config: dict[str, Any], **group: Any) -> dict[str, Any]:
    base_config["gpucluster:node_groups"] = [{"name": "train", "instance_types": ["g5.xlarge"],
                                              "max_nodes": 2, **group}]
    return base_config


def test_files_and_setup_are_written_by_the_user_data(base_config: dict[str, Any], tmp_path: Path) -> None:
    config = _group_config(base_config, setup=["echo one", "touch /tmp/two"],
                           files=[{"path": "/opt/team/hooks/save.sh", "content": "#!/bin/bash\necho $1\n",
                                   "mode": "0750"}],
                           container_image="nvcr.io/nvidia/pytorch:24.12-py3")
    spec = parse_stack_config(config, stack="t")
    b = node_bootstrap(spec, spec.node_groups[0])
    text = render_user_data(b)
    # run only the file-writing part, with every path moved under tmp_path
    part = text.split("/opt/aws/amazon-cloudwatch-agent/etc\n", 1)[1].split(
        "# shellcheck source=/dev/null\n. /etc/gpucluster/node.env\n")[0]
    part = re.sub(r"^(cat > |chmod \d+ |install -d -m 0755 )/", rf"\g<1>{tmp_path}/", part, flags=re.M)
    for f in node_files(b):
        if not f.make_parent:
            (tmp_path / f.path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", "-euc", part], check=True)
    hook = tmp_path / "opt/team/hooks/save.sh"
    assert hook.read_text() == "#!/bin/bash\necho $1\n" and oct(hook.stat().st_mode & 0o777) == "0o750"
    setup = tmp_path / USER_SETUP.lstrip("/")
    assert setup.read_text() == ("#!/bin/bash\n# node group train: the stack file's setup commands, in "
                                 "order\nset -euo pipefail\necho one\ntouch /tmp/two\n")
    assert oct(setup.stat().st_mode & 0o777) == "0o700"
    env = (tmp_path / "etc/gpucluster/node.env").read_text()
    assert "GPUCLUSTER_CONTAINER_IMAGE=nvcr.io/nvidia/pytorch:24.12-py3" in env
    unit = (tmp_path / "etc/systemd/system/gpucluster-setup.service").read_text()
    assert "ExecStart=/usr/local/sbin/gpucluster-setup" in unit and "docker.service" in unit
    # the bootstrap starts the unit, without holding up cloud-init
    assert ("systemctl enable gpucluster-setup.service && systemctl start --no-block "
            "gpucluster-setup.service") in text


def test_setup_script_is_read_from_the_project(base_config: dict[str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: python\n")
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "setup.sh").write_text("#!/bin/bash\necho from the repo\n")
    (tmp_path / "node" / "hook.sh").write_text("#!/bin/bash\nexit 0\n")
    monkeypatch.chdir(tmp_path / "node")  # the project root is found upward
    spec = parse_stack_config(_group_config(
        base_config, setup_script="node/setup.sh",
        files=[{"path": "/opt/hooks/hook.sh", "source": "node/hook.sh", "mode": "0755"}]), stack="t")
    b = node_bootstrap(spec, spec.node_groups[0])
    assert b.user_setup == "#!/bin/bash\necho from the repo\n"
    assert [(f.path, f.content, f.mode) for f in b.user_files] == [
        ("/opt/hooks/hook.sh", "#!/bin/bash\nexit 0\n", "0755")]


@pytest.mark.parametrize(("group", "path", "message"), [
    ({"setup": ["true"], "setup_script": "Pulumi.yaml"}, "node_groups[0].setup_script",
     "set setup (commands) or setup_script (a file), not both"),
    ({"setup_script": "missing/setup.sh"}, "node_groups[0].setup_script", "no such file"),
    ({"files": [{"path": "/opt/a"}]}, "node_groups[0].files[0]", "set exactly one of content or source"),
    ({"files": [{"path": "/etc/gpucluster/node.env", "content": "x"}]}, "node_groups[0].files[0].path",
     "is where gpucluster's own node files go"),
    ({"files": [{"path": "/opt/a", "content": "x"}, {"path": "/opt/a", "content": "y"}]},
     "node_groups[0].files[1].path", "/opt/a is written twice"),
    ({"files": [{"path": "/opt/big", "content": os.urandom(6000).hex()}]}, "node_groups[0].files",
     "keep large files in S3"),
    ({"files": [{"path": "/opt/a", "content": "x", "mode": "rwx"}]}, "node_groups[0].files[0].mode",
     "must be octal permissions"),
    ({"setup_script": "/etc/passwd"}, "node_groups[0].setup_script",
     "must be a path relative to the project"),
    ({"container_image": "bad image"}, "node_groups[0].container_image", "must be an image reference"),
])
def test_bad_setup_is_one_finding_at_its_key_path(base_config: dict[str, Any], group: dict[str, Any],
                                                  path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_stack_config(_group_config(base_config, **group), stack="t")
    assert [(f.path, message in f.message) for f in err.value.findings] == [(path, True)], err.value


def test_what_the_spec_accepts_fits_ec2s_user_data_limit_when_planned(
        base_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole user data is checked as rendered (health checks, hooks, datasets included): the
    largest file the spec accepts still deploys, and a little more is one finding at the group."""
    rng = random.Random(14)

    def noise(n: int) -> str:  # incompressible, as a packed binary or key would be
        return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))

    config = _group_config(base_config, health_checks={"stuck_alarm_minutes": 30})
    config["gpucluster:budget"] = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}
    config["gpucluster:datasets"] = [{"name": "corpus", "prefix": "data/", "checkpoint_prefix": "ckpt/"}]
    content = noise(20000)

    def hooks(n: int) -> None:
        config["gpucluster:spot"] = {"interruption_command": f"echo {noise(n)}"}
        config["gpucluster:autostop"] = {"idle_minutes": 30, "pre_stop_command": f"echo {noise(n)}"}

    def with_file(n: int) -> dict[str, Any]:
        config["gpucluster:node_groups"][0]["files"] = [{"path": "/opt/blob", "content": content[:n]}]
        return config

    def findings(n: int) -> list[tuple[str, str]]:
        try:
            parse_stack_config(with_file(n), stack="t")
        except SpecError as err:
            return [(f.path, f.message) for f in err.findings]
        return []

    def largest_accepted() -> int:
        low, high = 0, len(content)  # accepted at low, refused at high
        assert findings(low) == [] and findings(high) != []
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if findings(mid) == [] else (low, mid)
        return low

    hooks(1500)
    low = largest_accepted()
    # room is left for the group's own files, even beside two 1500-byte incompressible hook commands
    # (500 bytes when the scripts were in the user data; since they ship in the node scripts bundle,
    # the files' own 4 KiB gzipped budget is what stops them here, not the whole user data: measured
    # 5,410 characters of noise)
    assert low > 500
    assert [path for path, _ in findings(low + 1)] == ["node_groups[0].files"]
    # With that budget out of the way (hooks are at most 2 KiB each), the whole user data is the
    # limit again: the check that must bind, as rendered, for what stays inline.
    monkeypatch.setattr("gpucluster.spec.node_groups.NODE_SETUP_MAX_GZIP_BYTES", 64 * 1024)
    hooks(2000)
    low = largest_accepted()
    assert low > 5000  # measured 12,320 characters of noise beside two 2,000-byte hooks
    [(path, message)] = findings(low + 1)  # one character more: one finding, at the group
    assert path == "node_groups[0]" and message.startswith("node user data would be")
    plan = plan_config(with_file(low))  # the launch template's user data is rendered (and packed) here
    [template] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    packed = base64.b64decode(template.inputs["userData"])
    assert len(packed) <= userdata.MAX_USER_DATA_BYTES
    assert "GPUCLUSTER_HEALTH_CHECKS=true" in gzip.decompress(packed).decode()


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_stacks_user_data_fits_with_health_checks_on(stack: str) -> None:
    plan = shipped_plan(stack)
    templates = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == len(plan.spec.node_groups)
    for template in templates:
        packed = base64.b64decode(template.inputs["userData"])
        assert len(packed) <= userdata.MAX_USER_DATA_BYTES, template.name
        assert "GPUCLUSTER_HEALTH_CHECKS=true" in gzip.decompress(packed).decode()


# ------------------------------------------------------------------ shipped stacks


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_hooks_name_executables_every_node_gets(stack: str) -> None:
    """pre_stop_command and interruption_command point at a file the bootstrap writes, executable."""
    spec = load_stack(stack)[2]
    commands = [c for c in (spec.autostop.pre_stop_command, spec.spot.interruption_command) if c]
    assert commands
    for group in spec.node_groups:
        files = {f.path: f for f in node_files(node_bootstrap(spec, group))}
        for command in commands:
            program = command.split()[0]
            assert program in files, (stack, group.name, program)
            assert int(files[program].mode, 8) & 0o100, program
    if stack != "staging":
        assert all(c.split()[0] == CHECKPOINT_HOOK for c in commands)


def test_run_exports_the_paths_the_checkpoint_hook_uses() -> None:
    from gpucluster.fleet.nodepaths import CHECKPOINT_DONE, CHECKPOINT_REQUEST

    text = script("checkpoint.sh")
    assert f'REQUEST="${{GPUCLUSTER_CHECKPOINT_REQUEST:-{CHECKPOINT_REQUEST}}}"' in text
    assert f'DONE="${{GPUCLUSTER_CHECKPOINT_DONE:-{CHECKPOINT_DONE}}}"' in text
