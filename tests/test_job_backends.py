"""The job backend is chosen once (ops.jobbackends): the registry picks it from the scheduler type, and
a third backend registered there runs `run --detach`, `jobs` and `cancel` through the real CLI with no
change to the CLI (issue 32, "A job backend, chosen once")."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.cli.jobs import run_exit
from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.jobbackends import BACKENDS, Batch, JobBackend, Queue, RunRequest, job_backend
from gpucluster.ops.jobbackends.launcher import LauncherJobs
from gpucluster.ops.jobbackends.slurm import SlurmJobs
from gpucluster.ops.launch import Launched, RestartRecord, RunOutcome, RunPlan
from gpucluster.ops.nodes import Node, ranked
from gpucluster.ops.run import JobResult, NodeResult, RunError, plan_job
from gpucluster.ops.slurmjobs import CancelOutcome, LoginNode
from gpucluster.project import load_stack
from gpucluster.slurm.queue import SlurmJob
from gpucluster.spec import StackSpec
from test_slurm_ops import slurm_config

runner = CliRunner()


class QueueJobs:
    """A third scheduler, kept in memory: what a Kubernetes backend would be to the CLI."""

    queued: ClassVar[dict[str, SlurmJob]] = {}
    """The queue's jobs, kept across the commands of one test (each builds its own backend)."""

    def __init__(self, spec: StackSpec, clients: Clients) -> None:
        self.spec = spec

    def refusal(self, what: str) -> str | None:
        return "hostfile: the queue places its jobs itself" if what == "hostfile" else None

    def job_id(self, job: str, *, group: str | None, node: str | None = None) -> str:
        if not job.startswith("q-"):
            raise RunError(f"job: a queue job id (q-N), got {job!r}")
        return job

    def run(self, request: RunRequest, *, progress: Spinner = no_spinner,
            on_start: Callable[[Any], None] = lambda _: None,
            on_change: Callable[..., None] = lambda *_: None) -> Batch:
        batch = Batch("queue", request.group, request.name or "job", 2, 1000,
                      f"#!/bin/sh\n{request.command}\n", "submit")
        if request.dry_run:
            return batch
        on_start(batch)
        batch.job_id = f"q-{len(self.queued) + 1}"
        batch.sent, batch.submitted_on = True, "queue-controller"
        self.queued[batch.job_id] = SlurmJob(batch.job_id, batch.job_name, "RUNNING", 2,
                                             partition=request.group)
        return batch

    def jobs(self, group: str | None, *, progress: Spinner = no_spinner) -> Queue:
        return Queue("queue", group, True, list(self.queued.values()))

    def cancel_question(self, job: str, *, group: str | None) -> str:
        return f"Cancel queue job {job}?"

    def cancel(self, job: str, *, group: str | None, progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] = lambda: None) -> CancelOutcome:
        found = self.queued.pop(job, None)
        if found is None:
            return CancelOutcome(job, False, "the queue has no such job", None)
        return CancelOutcome(job, True, "", "CANCELLED")

    def logs(self, job: str, *, group: str | None, node: str | None, lines: int,
             progress: Spinner = no_spinner) -> Any:
        raise RunError("logs: not kept by the queue")

    def follow(self, job: str, *, group: str | None, node: str | None, on_output: Callable[[Any], None],
               on_start: Callable[[Any], None] = lambda _: None, progress: Spinner = no_spinner) -> Any:
        raise RunError("logs: not kept by the queue")

    def nodes(self, group: str | None, *, progress: Spinner = no_spinner) -> Any:
        raise RunError("nodes: the queue has none of its own")

    def login_target(self, *, progress: Spinner = no_spinner) -> LoginNode:
        return LoginNode("i-queue", "10.0.0.9", None)


@pytest.fixture
def queue_stack(write_stack: Any, base_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    """A `type: none` stack whose jobs the registry sends to `QueueJobs`, with no AWS client to ask."""
    module = types.ModuleType("queuejobs")
    module.backend = QueueJobs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "queuejobs", module)
    monkeypatch.setitem(BACKENDS, "none", "queuejobs")
    monkeypatch.setattr(QueueJobs, "queued", {})

    def no_aws(spec: StackSpec, service: str) -> Any:
        raise AssertionError(f"the queue backend asked AWS for {service}")

    monkeypatch.setattr(common, "client", no_aws)
    return str(write_stack(base_config, "queued"))


def test_the_registry_picks_the_backend_from_the_scheduler_type(write_stack: Any,
                                                                base_config: dict[str, Any]) -> None:
    launcher = load_stack(str(write_stack(base_config, "plain")))[2]
    slurm = load_stack(str(write_stack(slurm_config(), "slurmy")))[2]
    assert set(BACKENDS) == {"none", "slurm", "eks"}
    assert isinstance(job_backend(launcher, lambda service: None), LauncherJobs)
    assert isinstance(job_backend(slurm, lambda service: None), SlurmJobs)
    both: list[JobBackend] = [job_backend(launcher, lambda s: None), job_backend(slurm, lambda s: None)]
    assert [b.refusal("login") is None for b in both] == [False, True]
    assert [b.refusal("hostfile") is None for b in both] == [True, False]


def test_a_third_backend_runs_lists_and_cancels_through_the_unchanged_cli(queue_stack: str) -> None:
    ran = runner.invoke(app, ["run", queue_stack, "-g", "gpu", "--detach", "--name", "train", "--",
                              "python", "train.py"])
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.splitlines()[-1] == "q-1"
    assert "submitted job q-1 (train, 2 node(s)) to partition gpu" in ran.stdout

    listed = runner.invoke(app, ["jobs", queue_stack, "--json"])
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.stdout)
    assert document["scheduler"] == "queue"
    assert [(j["job_id"], j["name"], j["state"], j["active"]) for j in document["jobs"]] == [
        ("q-1", "train", "RUNNING", True)]

    bad = runner.invoke(app, ["cancel", queue_stack, "17", "--yes"])
    assert bad.exit_code == 2
    assert "cancel: job: a queue job id (q-N), got '17'" in bad.output

    declined = runner.invoke(app, ["cancel", queue_stack, "q-1"], input="n\n")
    assert declined.exit_code == 1
    assert "Cancel queue job q-1?" in declined.output

    cancelled = runner.invoke(app, ["cancel", queue_stack, "q-1", "--yes", "--json"])
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["cancelled"] is True
    again = runner.invoke(app, ["cancel", queue_stack, "q-1", "--yes"])
    assert again.exit_code == 1
    assert "job q-1 not cancelled: the queue has no such job" in again.output

    empty = runner.invoke(app, ["jobs", queue_stack])
    assert empty.exit_code == 0
    assert "no Slurm jobs" in empty.output  # the scheduler outcome's renderer, unchanged


def test_a_third_backends_refusal_and_login_target_are_what_the_cli_prints(queue_stack: str) -> None:
    refused = runner.invoke(app, ["hostfile", queue_stack, "-g", "gpu"])
    assert refused.exit_code == 2
    assert refused.output.strip() == "hostfile: hostfile: the queue places its jobs itself"
    login = runner.invoke(app, ["login", queue_stack, "--json"])
    assert login.exit_code == 0, login.output
    assert json.loads(login.stdout)["instance_id"] == "i-queue"


def launched(job: JobResult, *, restart: RestartRecord | None = None, interrupted: bool = False,
             sent: bool = True) -> Launched:
    plan = plan_job(NODES, "true", log_group="/x", detach="train" if restart else None)
    return Launched(RunPlan("acme/x", "g", plan, None),
                    RunOutcome(job, restart, interrupted) if sent else None)


def node_result(rank: int, ok: bool = True) -> NodeResult:
    return NodeResult(rank, f"i-0{rank}", f"c{rank}", "Success" if ok else "Failed", 0 if ok else 1)


NODES = ranked([Node(f"i-0{n}", "g", "asg", "p5.48xlarge", "us-east-1a", f"10.0.0.{n + 5}", "on-demand",
                     "running", "InService", "Healthy", datetime(2025, 1, 1, n, tzinfo=UTC), "Online")
                for n in range(2)])
DONE = JobResult([node_result(0), node_result(1)])


@pytest.mark.parametrize(("outcome", "code"), [
    (launched(DONE, sent=False), 0),  # a dry run
    (launched(DONE), 0),
    (launched(JobResult([node_result(0), node_result(1, ok=False)])), 1),
    (launched(JobResult([node_result(0)], cancelled=True)), 1),
    (launched(JobResult([node_result(0), node_result(1, ok=False)]), interrupted=True), 130),
    (launched(DONE, restart=RestartRecord("/p", stored=True)), 0),
    (launched(DONE, restart=RestartRecord("/p", ok=False, message="not stored")), 1),
    (Batch("slurm", "train", "t", 2, 1000, "#!/bin/bash", "submit"), 0),
    (Batch("slurm", "train", "t", 2, 1000, "#!/bin/bash", "submit", True, "42", "i-login"), 0),
    (Batch("slurm", "train", "t", 2, 1000, "#!/bin/bash", "submit", True, None, "i-login", "sbatch: no"), 1),
])
def test_runs_exit_code_is_decided_from_its_outcome_alone(outcome: Any, code: int) -> None:
    assert run_exit(outcome) == code


def test_the_slurm_backend_takes_job_ids_and_refuses_what_names_more_than_one_job(write_stack: Any) -> None:
    jobs = job_backend(load_stack(str(write_stack(slurm_config(), "slurmy")))[2], lambda service: None)
    assert jobs.job_id("42", group=None) == "42"
    for job, group, node, says in [("train", None, None, r"a Slurm job id \(digits"),
                                   ("42", "train", None, "--group: a Slurm job id names one job"),
                                   ("42", None, "1", "--node: a Slurm job id names one job")]:
        with pytest.raises(RunError, match=says):
            jobs.job_id(job, group=group, node=node)
    with pytest.raises(RunError, match="add --detach"):
        jobs.run(RunRequest("train", "true"))
