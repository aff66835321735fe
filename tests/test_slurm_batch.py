"""The sbatch script and the squeue/sacct/scancel lines, without Slurm (issue 28).

The script is checked line by line, and run under bash with stub `scontrol` and `srun` on PATH
(tests/fake_node.py) so the environment each task sees is asserted, not just the text.
tests/test_slurm_real.py submits the same scripts to a real Slurm.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from base_config import base
from fake_node import write_stubs
from gpucluster.node.userdata import efa_environment, group_bootstrap
from gpucluster.preflight import parse_stack_config
from gpucluster.slurm.batch import (
    BatchError,
    BatchJob,
    SlurmGroup,
    queue_name,
    sbatch_script,
    slurm_group,
    slurm_time,
)
from gpucluster.slurm.queue import (
    QueueError,
    merged,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
    sacct_command,
    scancel_command,
    shell,
    squeue_command,
)


def spec_of(groups: list[dict[str, Any]]) -> Any:
    config = base()
    config["gpucluster:node_groups"] = groups
    return parse_stack_config(config, stack="t")


def group_of(group: dict[str, Any]) -> SlurmGroup:
    spec = spec_of([group])
    return slurm_group(spec.node_groups[0], stack=spec.identity, cluster=spec.cluster.name,
                       region=spec.region, spot=spec.spot)


P5 = {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4}
"""On demand, EFA (auto: every type has it and max_nodes > 1), 8 H100s a node."""
G5_SPOT = {"name": "gpu", "instance_types": ["g5.xlarge", "g6.xlarge"], "max_nodes": 2,
           "capacity": {"spot_percent": 100}}


def header(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


# ------------------------------------------------------------------------- the group


def test_an_efa_group_gets_its_queue_gpus_and_the_nodes_own_efa_environment() -> None:
    spec = spec_of([P5])
    g = spec.node_groups[0]
    sg = slurm_group(g, stack=spec.identity, cluster=spec.cluster.name, region=spec.region, spot=spec.spot)
    assert (sg.queue, sg.max_nodes, sg.gpus_per_node, sg.procs_per_node, sg.can_run_spot) == \
        ("train", 4, 8, 8, False)
    nodes_env = efa_environment(group_bootstrap(g, stack=spec.identity, cluster=spec.cluster.name,
                                                region=spec.region, spot=spec.spot))
    assert dict(sg.environment) == nodes_env
    assert sg.environment["FI_PROVIDER"] == "efa" and sg.environment["FI_EFA_USE_DEVICE_RDMA"] == "1"


def test_a_spot_group_of_mixed_types_takes_the_smaller_gpu_count_and_no_efa() -> None:
    sg = group_of(G5_SPOT)
    assert (sg.gpus_per_node, sg.procs_per_node, sg.can_run_spot, dict(sg.environment)) == (1, 1, True, {})


def test_a_mig_group_runs_one_process_per_mig_device() -> None:
    sg = group_of({**P5, "mig": {"profile": "1g.10gb", "count": 7}})
    assert (sg.gpus_per_node, sg.procs_per_node) == (8, 56)
    assert sg.environment["GPUCLUSTER_MIG_LAYOUT"] == ",".join(["1g.10gb"] * 7)


def test_the_queue_of_a_group_is_its_name() -> None:
    assert queue_name("train-h100") == "train-h100"


# ------------------------------------------------------------------------- the script


def test_the_header_asks_for_whole_nodes_one_task_each_with_the_groups_gpus() -> None:
    script = sbatch_script(BatchJob(name="llama", command="python train.py", nodes=2), group_of(P5))
    assert script.startswith("#!/bin/bash\n")
    assert header(script) == ["--job-name=llama", "--partition=train", "--nodes=2", "--ntasks-per-node=1",
                              "--gpus-per-node=8", "--exclusive", "--output=gpucluster-%x-%j.out"]


def test_requeue_on_a_spot_group_or_when_the_job_asks_and_time_when_given() -> None:
    spot = header(sbatch_script(BatchJob(name="a", command="true", nodes=1), group_of(G5_SPOT)))
    assert "--requeue" in spot
    on_demand = header(sbatch_script(BatchJob(name="a", command="true", nodes=1), group_of(P5)))
    assert "--requeue" not in on_demand and not any(h.startswith("--time") for h in on_demand)
    asked = header(sbatch_script(BatchJob(name="a", command="true", nodes=1, restart_on_replace=True,
                                          timeout_seconds=90 * 60 + 1, output="/fsx/logs/%j.out",
                                          workdir="/fsx/run"), group_of(P5)))
    assert asked[-4:] == ["--output=/fsx/logs/%j.out", "--chdir=/fsx/run", "--requeue", "--time=0-01:31:00"]


def test_a_group_without_gpus_asks_for_none_and_runs_one_process_a_node() -> None:
    # The catalog holds GPU types only; a CPU group (a login or CPU partition) is built directly.
    cpu = SlurmGroup(name="cpu", queue="cpu", max_nodes=1, gpus_per_node=0, procs_per_node=1,
                     can_run_spot=False)
    script = sbatch_script(BatchJob(name="a", command="true", nodes=1), cpu)
    assert not any(h.startswith("--gpus") for h in header(script))
    assert "NPROC_PER_NODE=1" in script.splitlines()


@pytest.mark.parametrize(("seconds", "expected"), [(1, "0-00:01:00"), (60, "0-00:01:00"),
                                                   (3600, "0-01:00:00"), (86400 + 61, "1-00:02:00")])
def test_slurm_time_rounds_up_to_the_minute(seconds: int, expected: str) -> None:
    assert slurm_time(seconds) == expected


@pytest.mark.parametrize(("job", "option"), [
    (BatchJob(name="a", command="  ", nodes=1), "command:"),
    (BatchJob(name="my job", command="true", nodes=1), "--name:"),
    (BatchJob(name="", command="true", nodes=1), "--name:"),
    (BatchJob(name="a\nb", command="true", nodes=1), "--name:"),
    (BatchJob(name="a", command="true", nodes=5), "--nodes: 5 is more than node group train's max_nodes (4)"),
    (BatchJob(name="a", command="true", nodes=0), "--nodes:"),
    (BatchJob(name="a", command="true", nodes=1, timeout_seconds=0), "--timeout:"),
    (BatchJob(name="a", command="true", nodes=1, master_port=80), "--master-port:"),
    (BatchJob(name="a", command="true", nodes=1, output="my out.txt"), "--output:"),
    (BatchJob(name="a", command="true", nodes=1, workdir="/a'b"), "--workdir:"),
])
def test_bad_input_is_refused_naming_the_option(job: BatchJob, option: str) -> None:
    with pytest.raises(BatchError) as e:
        sbatch_script(job, group_of(P5))
    assert str(e.value).startswith(option)
    assert "\n" not in str(e.value)


HOSTILE = "echo \"it's $HOME\" 'a b' ; echo done > /dev/null && printf '%s\\n' \"$NODE_RANK\""


def run_stub(tmp_path: Path, script: str, nodes: list[str],
             hostnames: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `script` under bash with stub scontrol/srun: srun runs its command once per node with
    SLURM_NODEID set, as Slurm does; scontrol prints `hostnames` (default: the nodes)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    write_stubs(bin_dir, log, {
        "scontrol": hostnames if hostnames is not None else 'printf "%s\\n" ' + " ".join(nodes),
        "srun": ('while [ "${1#--}" != "$1" ]; do shift; done\n'
                 f'for i in $(seq 0 $(({len(nodes)} - 1))); do SLURM_NODEID=$i "$@" || exit $?; done'),
    })
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_NNODES": str(len(nodes)), "OUT": str(tmp_path), "HOME": "/home/u"}
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=20)


def run_with_stub_slurm(tmp_path: Path, script: str, nodes: list[str]) -> list[dict[str, str]]:
    """Each task's environment, as it dumped it to task<N>.env."""
    done = run_stub(tmp_path, script, nodes)
    assert done.returncode == 0, done.stderr
    tasks = []
    for i in range(len(nodes)):
        lines = (tmp_path / f"task{i}.env").read_text().splitlines()
        tasks.append(dict(line.split("=", 1) for line in lines if "=" in line))
    return tasks


def test_each_task_gets_its_rank_and_the_shared_rendezvous_from_slurms_variables(tmp_path: Path) -> None:
    command = 'env > "$OUT/task$NODE_RANK.env"; { ' + HOSTILE + '; } > "$OUT/hostile$NODE_RANK.txt"'
    script = sbatch_script(BatchJob(name="a", command=command, nodes=2, master_port=29600), group_of(P5))
    tasks = run_with_stub_slurm(tmp_path, script, ["ip-10-0-1-5", "ip-10-0-1-9"])
    assert [t["NODE_RANK"] for t in tasks] == ["0", "1"]
    for t in tasks:
        assert (t["MASTER_ADDR"], t["MASTER_PORT"], t["NNODES"], t["NPROC_PER_NODE"], t["WORLD_SIZE"]) == \
            ("ip-10-0-1-5", "29600", "2", "8", "16")
        assert (t["FI_PROVIDER"], t["FI_EFA_FORK_SAFE"], t["NCCL_SOCKET_IFNAME"]) == \
            ("efa", "1", "^docker,lo,veth")
    # The user's command reached bash intact: quotes, $ and ; as the user wrote them.
    assert (tmp_path / "hostile1.txt").read_text() == "it's /home/u a b\n1\n"


def test_a_host_list_longer_than_the_pipe_is_no_failure_and_an_empty_one_is(tmp_path: Path) -> None:
    # head -n1 closes the pipe after the first host: scontrol then dies of SIGPIPE, which with
    # pipefail would end the job (exit 141) on a large allocation. Here deterministically: 200,000 hosts.
    script = sbatch_script(BatchJob(name="a", command='echo "$MASTER_ADDR $NODE_RANK"', nodes=2),
                           group_of(P5))
    many = run_stub(tmp_path / "many", script, ["n1", "n2"],
                    hostnames='for i in $(seq 200000); do echo "ip-$i"; done')
    assert (many.returncode, many.stdout) == (0, "ip-1 0\nip-1 1\n"), many.stderr
    none = run_stub(tmp_path / "none", script, ["n1", "n2"], hostnames="true")
    assert none.returncode == 1 and "no first host in SLURM_JOB_NODELIST=node[1-2]" in none.stderr
    assert none.stdout == ""  # srun never ran


def test_the_srun_line_quotes_the_command_as_one_word() -> None:
    script = sbatch_script(BatchJob(name="a", command=HOSTILE, nodes=1), group_of(P5))
    words = shlex.split(script[script.index("\nsrun "):])  # the last command, quoted over lines
    assert words[-3:-1] == ["bash", "-c"]
    assert words[-1] == 'export NODE_RANK="$SLURM_NODEID"\n' + HOSTILE


# ------------------------------------------------------------------------- queue


def test_squeue_and_sacct_lines_ask_for_delimited_headerless_output() -> None:
    assert squeue_command(partition="train", job_ids=["12", "13_2"]) == [
        "squeue", "--noheader", "--format=%i|%j|%T|%D|%N|%P|%r", "--partition=train", "--jobs=12,13_2"]
    assert sacct_command(job_ids=["12"]) == [
        "sacct", "--noheader", "--parsable2", "--allocations",
        "--format=JobID,JobName,State,NNodes,ExitCode,NodeList,Partition", "--jobs=12"]


def test_scancel_is_built_from_checked_ids_and_signals() -> None:
    assert scancel_command(["7", "8"]) == ["scancel", "7", "8"]
    assert shell(scancel_command(["7"], signal="USR1", batch_only=True)) == "scancel --signal=USR1 --batch 7"
    for bad in (["7; rm -rf /"], [], ["-1"]):
        with pytest.raises(QueueError, match="job id"):
            scancel_command(bad)
    with pytest.raises(QueueError, match="--signal"):
        scancel_command(["7"], signal="USR1;reboot")


def test_squeue_output_parses_into_records_even_with_a_delimiter_in_a_name() -> None:
    out = ("41|llama|RUNNING|2|node[1-2]|train|None\n"
           "42|a|b|PENDING|2||train|Resources\n\n")
    jobs = parse_squeue(out)
    assert [(j.job_id, j.name, j.state, j.nodes, j.node_list, j.reason, j.active) for j in jobs] == [
        ("41", "llama", "RUNNING", 2, "node[1-2]", "", True),
        ("42", "a|b", "PENDING", 2, "", "Resources", True)]


def test_sacct_output_gives_exit_codes_and_signals_and_drops_steps() -> None:
    out = ("50|ok|COMPLETED|2|0:0|node[1-2]|train\n"
           "50.batch|batch|COMPLETED|1|0:0|node1|\n"
           "51|bad|FAILED|1|3:0|node1|train\n"
           "52|gone|CANCELLED by 0|2|0:15|node[1-2]|train\n")
    jobs = parse_sacct(out)
    assert [(j.job_id, j.state, j.exit_code, j.signal, j.active) for j in jobs] == [
        ("50", "COMPLETED", 0, 0, False), ("51", "FAILED", 3, 0, False), ("52", "CANCELLED", 0, 15, False)]


def test_output_that_is_not_ours_is_refused_with_the_line() -> None:
    with pytest.raises(QueueError, match="squeue: expected 7"):
        parse_squeue("JOBID PARTITION NAME\n")
    with pytest.raises(QueueError, match="exit code"):
        parse_sacct("50|ok|COMPLETED|2|zero|node1|train\n")


def test_scontrol_show_job_oneliner_parses_like_a_record() -> None:
    out = ("JobId=60 JobName=my run UserId=root(0) GroupId=root(0) JobState=COMPLETED Reason=None "
           "Dependency=(null) Requeue=1 Restarts=1 ExitCode=0:0 NumNodes=2 NumCPUs=4 "
           "Partition=train NodeList=node[1-2] Command=/tmp/job.sbatch\n")
    job = parse_scontrol_job(out)
    assert (job.job_id, job.name, job.state, job.nodes, job.exit_code, job.partition, job.node_list) == \
        ("60", "my run", "COMPLETED", 2, 0, "train", "node[1-2]")
    pending = parse_scontrol_job("JobId=61 JobName=x JobState=PENDING Reason=Resources ExitCode=0:0 "
                                 "NumNodes=2-2 Partition=train NodeList=(null)")
    assert (pending.nodes, pending.exit_code, pending.reason, pending.node_list) == (2, None, "Resources", "")
    with pytest.raises(QueueError, match="no JobState"):
        parse_scontrol_job("JobId=62 JobName=x NumNodes=1")


def test_merged_prefers_the_live_view_and_orders_by_id() -> None:
    live = parse_squeue("10|a|RUNNING|1|node1|train|None\n")
    history = parse_sacct("10|a|PENDING|1|0:0||train\n9|b|COMPLETED|1|0:0|node2|train\n")
    assert [(j.job_id, j.state) for j in merged(live, history)] == [("9", "COMPLETED"), ("10", "RUNNING")]
