"""First-job time and boot milestones, measured on the node (issue 38): report.sh, job.sh, ready.sh and
the bootstrap run for real under bash with fake systemctl, docker and aws on PATH.

- `gpucluster-report first-job UNIT` publishes, once in a node's life, when the unit's process
  started (systemd's monotonic timestamp, seconds since boot) as TimeToFirstJobSeconds;
  `gpucluster-job start` calls it after the unit started and never fails the job for it.
- gpucluster-ready reads the image's layers through (`docker save` to /dev/null) before it lets the
  node in, and publishes each milestone's moment (BootStepAtSeconds) beside TimeToReadySeconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_bootstrap import Sandbox
from test_detached_jobs import Node as JobNode
from test_node_ready import IMAGE, ReadyNode
from test_node_steps import stub

STARTED_US = 312_400_000  # the job unit's ExecMainStartTimestampMonotonic: 312.4 s after boot


def first_job_box(tmp_path: Path) -> Sandbox:
    box = Sandbox(tmp_path, GPUCLUSTER_FIRST_JOB_FILE=str(tmp_path / "lib" / "first-job"))
    asked = "show -p ExecMainStartTimestampMonotonic --value gpucluster-job-a.service"
    stub(box, "systemctl", f'[ "$*" = "{asked}" ] && echo {STARTED_US}')
    return box


def test_the_first_job_is_published_once_in_seconds_since_boot(tmp_path: Path) -> None:
    box = first_job_box(tmp_path)
    run = box.run("report.sh", "first-job", "gpucluster-job-a.service")
    assert run.returncode == 0, run.stdout + run.stderr
    [put] = box.calls("aws")
    assert "--metric-name TimeToFirstJobSeconds --unit Seconds --value 312 " in put
    assert put.endswith("--dimensions Stack=t,NodeGroup=g")
    assert (tmp_path / "lib" / "first-job").read_text().split() == ["312", "gpucluster-job-a.service"]
    # the second job (or the same node started again from a warm pool) publishes nothing
    assert box.run("report.sh", "first-job", "gpucluster-job-a.service").returncode == 0
    assert len(box.calls("aws")) == 1


def test_a_failed_publish_is_tried_again_by_the_next_job_and_never_fails(tmp_path: Path) -> None:
    box = first_job_box(tmp_path)
    stub(box, "aws", "exit 255")
    run = box.run("report.sh", "first-job", "gpucluster-job-a.service")
    assert run.returncode == 0 and "could not publish TimeToFirstJobSeconds" in run.stdout
    assert not (tmp_path / "lib" / "first-job").exists()
    stub(box, "aws", "true")
    box.run("report.sh", "first-job", "gpucluster-job-a.service")
    assert (tmp_path / "lib" / "first-job").exists()


def test_no_start_time_publishes_nothing(tmp_path: Path) -> None:
    box = first_job_box(tmp_path)
    run = box.run("report.sh", "first-job", "gpucluster-job-other.service")
    assert run.returncode == 0 and box.calls("aws") == [] and "no start time" in run.stdout


def test_job_start_reports_its_unit_after_starting_it_and_a_failing_report_does_not_fail_it(
        tmp_path: Path) -> None:
    node = JobNode(tmp_path)
    report = tmp_path / "report"
    report.write_text(f'#!/bin/bash\necho "report $*" >> {node.log}\nexit 1\n')
    report.chmod(0o755)
    result = node.run("start", "train", "/", "true", GPUCLUSTER_REPORT_TOOL=str(report))
    assert result.returncode == 0, result.stderr
    calls = node.log.read_text().splitlines()
    started = next(i for i, c in enumerate(calls) if c.startswith("systemd-run "))
    assert calls[started + 1:] == ["report first-job gpucluster-job-train.service"]
    # the tool's own setting is not handed on to the job
    assert not any("REPORT_TOOL" in a for a in node.args())


def test_the_bootstrap_notes_when_the_user_data_started_and_the_node_scripts_are_in_place() -> None:
    text = (Path(__file__).parent.parent / "components/gpucluster/node/bootstrap.sh").read_text()
    userdata = text.index('echo "userdata $(cut -d. -f1 /proc/uptime)" >> /run/gpucluster/boot-steps')
    bundle = text.index('echo "bundle $(cut -d. -f1 /proc/uptime)" >> /run/gpucluster/boot-steps')
    assert text.index("install -d -m 0755 /run/gpucluster") < userdata < text.index("@@SCRIPTS@@")
    assert text.index("@@FILES@@") < text.index(". /etc/gpucluster/node.env") < bundle


# ---------------------------------------------------------------- the gate reads the layers


def layered_node(tmp_path: Path, readable: bool = True) -> ReadyNode:
    """A ReadyNode whose fake docker `save` streams the image's layer files (FAKE_LAYERS) and notes
    every byte count it wrote; unreadable layers fail `save` as a missing blob would."""
    node = ReadyNode(tmp_path)
    layers = tmp_path / "layers"
    layers.mkdir()
    for i, size in enumerate((3000, 5000)):
        (layers / f"layer{i}.tar").write_bytes(bytes([i]) * size)
    (node.bin / "docker").write_text(f"""#!/bin/bash
printf '%s\\n' "docker $*" >> {node.log}
case "$1 $2" in
  "image inspect") grep -qxF "$3" "$FAKE_IMAGES" ;;
  "save "*) grep -qxF "$2" "$FAKE_IMAGES" || exit 1
            [ -z "${{FAKE_UNREADABLE:-}}" ] || {{ echo "Error: blob sha256:ab unexpected EOF" >&2; exit 1; }}
            for f in {layers}/*; do
              cat "$f"; echo "read $(basename "$f") $(wc -c <"$f")" >> {tmp_path}/read.log
            done ;;
  *) exit 1 ;;
esac
""")
    if not readable:
        node.env["FAKE_UNREADABLE"] = "1"
    return node


def test_ready_reads_every_layer_of_the_image_before_it_lets_the_node_in(tmp_path: Path) -> None:
    node = layered_node(tmp_path)
    node.health_launch()
    node.everything()
    (node.root / "run" / "boot-steps").write_text("userdata 41\nbundle 43\n")
    done = node.ready()
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "read.log").read_text().splitlines() == ["read layer0.tar 3000",
                                                                "read layer1.tar 5000"]
    calls = node.log.read_text().splitlines()
    saved = calls.index(f"docker save {IMAGE}")
    completed = next(i for i, c in enumerate(calls) if "complete-lifecycle-action" in c)
    assert saved < completed and node.results() == ["CONTINUE"]
    assert sum(c.startswith("docker save") for c in calls) == 1  # once: the blocks are fetched now
    assert f"read the layers of {IMAGE}" in done.stderr  # its log, beside the answer on stdout
    [put] = node.aws("put-metric-data")
    data = json.loads(re.search(r"--metric-data (\[.*\])", put).group(1))  # type: ignore[union-attr]
    at = {d["Dimensions"][2]["Value"]: d["Value"] for d in data if d["MetricName"] == "BootStepAtSeconds"}
    # the bootstrap's two, then what the gate saw: health, mounts, the layers read, ready (uptime 95 s)
    assert at == {"userdata": 41, "bundle": 43, "health": 95, "mounts": 95, "image": 95, "ready": 95}
    assert list(at) == ["userdata", "bundle", "health", "mounts", "image", "ready"]  # boot order
    assert all(d["Unit"] == "Seconds" for d in data)


def test_layers_that_cannot_be_read_keep_the_node_out_and_say_why(tmp_path: Path) -> None:
    node = layered_node(tmp_path, readable=False)
    node.health_launch()
    node.everything()
    env = node.root / "node.env"
    env.write_text(env.read_text().replace("GPUCLUSTER_READY_GATE_SECONDS=780",
                                           "GPUCLUSTER_READY_GATE_SECONDS=1"))
    done = node.ready()
    assert done.returncode == 1
    assert node.results() == ["ABANDON"]
    assert f"still waiting for the layers of {IMAGE} read" in done.stdout
    assert "unexpected EOF" in done.stdout + done.stderr
    assert not (tmp_path / "read.log").exists()
