"""`gpucluster run STACK --group G --nccl-test`: nccl-tests' all_reduce_perf across the group's nodes.

The parser reads real all_reduce_perf output; the node script runs under bash with fake ssh-keygen,
mpirun and all_reduce_perf; the CLI talks to a fake SSM that records every command it is sent.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.node import userdata
from gpucluster.ops import nccl
from gpucluster.ops.nccl import (
    Expectation,
    NcclOutcome,
    assess,
    expectation,
    human_bytes,
    parse_all_reduce,
    phase_plan,
    plan_nccl_test,
    run_nccl_test,
)
from gpucluster.ops.nodes import stack_nodes
from gpucluster.ops.run import JobPlan, JobResult, NodeResult
from test_jobs import PROD, _online, aws  # noqa: F401  (fixture)

runner = CliRunner()
SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
DATA = Path(__file__).parent / "data" / "nccl"

# nccl-tests 2.x, two nodes with one H100 each: the table rows as posted in NVIDIA/nccl-tests issue
# #232; header, device list and summary lines in all_reduce_perf's own format, with NCCL INFO noise.
MODERN = (DATA / "all_reduce_perf_2x1_h100.txt").read_text()

# Older nccl-tests (NCCL 2.6 era): no redop/root columns, `error` instead of `#wrong` (rows as posted
# in NVIDIA/nccl issue #340).
OLD = (DATA / "all_reduce_perf_old_columns.txt").read_text()


# ------------------------------------------------------------------------------------ parsing


def test_parse_modern_all_reduce_output() -> None:
    report = parse_all_reduce(MODERN)
    assert [r.size for r in report.rows] == [2097152, 4194304, 8388608, 16777216, 33554432]
    assert (report.rows[0].busbw_out_of_place, report.rows[0].busbw_in_place) == (18.53, 22.46)
    assert {r.dtype for r in report.rows} == {"float"} and not any(r.wrong for r in report.rows)
    assert report.peak is not None and (report.peak.size, report.peak.busbw) == (33554432, 41.52)
    assert report.avg_busbw == 33.127 and report.out_of_bounds_ok is True


def test_parse_old_column_set_and_wrong_values() -> None:
    report = parse_all_reduce(OLD)
    assert [(r.size, r.busbw) for r in report.rows] == [(65536, 2.37), (134217728, 21.86)]
    assert report.avg_busbw == 6.6972
    broken = MODERN.replace("41.52      0\n", "41.52      7\n").replace("0 OK", "7 FAILED")
    report = parse_all_reduce(broken)
    assert report.rows[-1].wrong == 7 and report.out_of_bounds_ok is False
    assert parse_all_reduce("mpirun: command not found\n").rows == []


def test_expected_bus_bandwidth_is_the_network_line_rate() -> None:
    from gpucluster.ops.nodes import Node

    def node(instance_type: str) -> Node:
        return Node("i-1", "g", "asg", instance_type, "z", "10.0.0.1", "on-demand", "running", "InService",
                    "Healthy", None, "Online")

    assert expectation([node("p5.48xlarge")] * 4) == Expectation("p5.48xlarge", 3200, False, 4)
    assert expectation([node("p5.48xlarge")] * 4).busbw == 400.0
    assert expectation([node("p4d.24xlarge"), node("p5.48xlarge")]).busbw == 50.0  # the slowest network
    assert expectation([node("p5.48xlarge")]).busbw is None  # one node: the network is not measured
    assert human_bytes(4 << 30) == "4 GiB" and human_bytes(2097152) == "2 MiB" and human_bytes(8) == "8 B"


def _ran(report_text: str) -> NcclOutcome:
    return NcclOutcome(report=parse_all_reduce(report_text), revoked=True)


def test_assess_compares_the_peak_with_the_network() -> None:
    ok, lines = assess(_ran(MODERN), Expectation("g6e.12xlarge", 100, False, 2))
    assert ok and lines == ["peak bus bandwidth 41.5 GB/s at 32 MiB; g6e.12xlarge's network gives 12 GB/s "
                            "(100 Gbps): 332%"]  # 2-node tree all-reduce can beat the link
    ok, lines = assess(_ran(MODERN), Expectation("p5.48xlarge", 3200, False, 2))
    assert not ok and lines[0].endswith("gives 400 GB/s (3200 Gbps): 10%")
    assert lines[1].startswith("below 50% of the network: is EFA in use")
    ok, lines = assess(_ran(MODERN), Expectation("p5.48xlarge", 3200, False, 1))
    assert ok and "one node" in lines[0]
    broken = parse_all_reduce(MODERN.replace("0 OK", "3 FAILED"))
    assert not assess(NcclOutcome(report=broken, revoked=True), Expectation("x", 100, False, 2))[0]
    ok, lines = assess(NcclOutcome(report=parse_all_reduce(MODERN), revoked=False),
                       Expectation("g6e.12xlarge", 100, False, 2))
    assert not ok and "SSH key was not removed" in lines[0]
    assert assess(NcclOutcome(failed_phase="authorize", revoked=True),
                  Expectation("x", 100, False, 2)) == (False, ["the authorize phase failed"])


# ------------------------------------------------------------------------ the node script


class Node:
    """The test script under bash: fake ssh-keygen, mpirun and an all_reduce_perf in a fake CUDA."""

    def __init__(self, root: Path, *, with_test: bool = True, mpirun_status: int = 0) -> None:
        self.root, self.bin, self.log = root, root / "bin", root / "calls.log"
        self.bin.mkdir()
        self.ssh = root / "ssh"
        self.cuda = root / "usr-local" / "cuda-12.9"
        if with_test:
            (self.cuda / "efa" / "test-cuda-12.9").mkdir(parents=True)
            (self.cuda / "lib").mkdir()
            test = self.cuda / "efa" / "test-cuda-12.9" / "all_reduce_perf"
            test.write_text("#!/bin/bash\n")
            test.chmod(0o755)
        (root / "sample").write_text(MODERN)
        stubs = {
            "ssh-keygen": ('f=""; c=""; while [ $# -gt 0 ]; do case "$1" in -f) f=$2; shift;; '
                           '-C) c=$2; shift;; esac; shift; done; echo private > "$f"; '
                           'echo "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK $c" > "$f.pub"'),
            "mpirun": f'cat {root / "sample"}; exit {mpirun_status}',
        }
        for name, body in stubs.items():
            stub = self.bin / name
            stub.write_text(f'#!/bin/bash\nprintf "%s\\0" "{name}" "$@" >> {self.log}\n'
                            f'printf "\\n" >> {self.log}\n{body}\n')
            stub.chmod(0o755)

    def run(self, phase: str, **env: str) -> subprocess.CompletedProcess[str]:
        base = {"PATH": f"{self.bin}:{os.environ['PATH']}", "GPUCLUSTER_NCCL_PHASE": phase,
                "GPUCLUSTER_NCCL_RUN": "nccl-1", "GPUCLUSTER_NCCL_DIR": str(self.root / "run"),
                "GPUCLUSTER_SSH_DIR": str(self.ssh), "GPUCLUSTER_MPIRUN": str(self.bin / "mpirun"),
                "GPUCLUSTER_CUDA_HOME": str(self.cuda), "GPUCLUSTER_CUDA_ROOT": str(self.root / "usr-local"),
                "GPUCLUSTER_NCCL_TESTS": str(self.root / "none"),
                "GPUCLUSTER_NODE_IPS": "10.0.0.11 10.0.0.12", "NNODES": "2", "NPROC_PER_NODE": "8",
                "FI_PROVIDER": "efa", "NCCL_SOCKET_IFNAME": "^docker,lo,veth"}
        return subprocess.run(["bash", "-c", nccl.NCCL_SCRIPT], env={**base, **env}, capture_output=True,
                              text=True, timeout=20)

    def mpirun_args(self) -> list[str]:
        calls = [line.split("\0")[:-1] for line in self.log.read_text().splitlines()
                 if line.startswith("mpirun")]
        return calls[-1][1:]


def test_nccl_script_lints_clean() -> None:
    path = Path(userdata.__file__).parent / "nccl-test.sh"
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_key_authorize_run_revoke_on_a_node(tmp_path: Path) -> None:
    node = Node(tmp_path)
    keys = node.ssh / "authorized_keys"
    node.ssh.mkdir()
    keys.write_text("ssh-ed25519 AAAAother admin@laptop\n")
    key = node.run("key")
    assert key.returncode == 0, key.stderr
    public = key.stdout.strip()
    assert public.startswith("ssh-ed25519 ") and public.endswith(" gpucluster-nccl-test-nccl-1")
    assert oct((tmp_path / "run" / "nccl-1").stat().st_mode & 0o777) == "0o700"

    bad = node.run("authorize", GPUCLUSTER_NCCL_PUBKEY="ssh-rsa AAAA gpucluster-nccl-test-nccl-1")
    assert bad.returncode == 2 and "not this run's key" in bad.stderr
    auth = node.run("authorize", GPUCLUSTER_NCCL_PUBKEY=public)
    assert auth.returncode == 0, auth.stderr
    assert keys.read_text().splitlines()[1] == (
        f'from="10.0.0.11,10.0.0.12",no-agent-forwarding,no-port-forwarding,no-X11-forwarding {public}')
    assert oct(keys.stat().st_mode & 0o777) == "0o600"

    ran = node.run("run", GPUCLUSTER_NCCL_MAX_BYTES="8G")
    assert ran.returncode == 0, ran.stderr
    assert "#  Rank" not in ran.stdout and "NCCL INFO" not in ran.stdout  # SSM's 24,000 characters
    assert parse_all_reduce(ran.stdout).rows == parse_all_reduce(MODERN).rows
    args = node.mpirun_args()
    test = str(node.cuda / "efa" / "test-cuda-12.9" / "all_reduce_perf")
    assert args[args.index(test):] == [test, "-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
    assert args[args.index("-n") + 1] == "16" and args[args.index("-N") + 1] == "8"
    hosts = Path(args[args.index("--hostfile") + 1]).read_text()
    assert hosts == "10.0.0.11 slots=8\n10.0.0.12 slots=8\n"
    rsh = args[args.index("plm_rsh_args") + 1]
    assert f"-i {tmp_path}/run/nccl-1/key" in rsh and "BatchMode=yes" in rsh
    forwarded = [args[i + 1] for i, a in enumerate(args) if a == "-x"]
    assert {"PATH", "LD_LIBRARY_PATH", "FI_PROVIDER", "NCCL_SOCKET_IFNAME"} <= set(forwarded)

    revoke = node.run("revoke")
    assert revoke.returncode == 0, revoke.stderr
    assert keys.read_text() == "ssh-ed25519 AAAAother admin@laptop\n"  # only this run's key is gone
    assert not (tmp_path / "run" / "nccl-1").exists()


def test_run_without_nccl_tests_says_where_it_should_be(tmp_path: Path) -> None:
    node = Node(tmp_path, with_test=False)
    (tmp_path / "run" / "nccl-1").mkdir(parents=True)
    ran = node.run("run")
    assert ran.returncode == 3
    assert "all_reduce_perf not found: the Deep Learning AMI ships it under /usr/local/cuda-*/efa/" \
        in ran.stderr


def test_a_failed_mpirun_is_the_phase_s_exit_status(tmp_path: Path) -> None:
    node = Node(tmp_path, mpirun_status=1)
    (tmp_path / "run" / "nccl-1").mkdir(parents=True)
    ran = node.run("run")
    assert ran.returncode == 1 and "Avg bus bandwidth" in ran.stdout


# ---------------------------------------------------------------------------- orchestration


def _nodes(account: dict[str, Any]) -> list[Any]:
    return stack_nodes(PROD, node_group="h100-train", autoscaling_client=account["autoscaling"],
                       ec2_client=account["ec2"],
                       ssm_client=boto3.client("ssm", region_name="us-east-1"))


class FakeRunner:
    """Each phase as sent; `fail` names a phase that fails on its last node."""

    def __init__(self, fail: str | None = None) -> None:
        self.plans: list[JobPlan] = []
        self.fail = fail

    def __call__(self, plan: JobPlan) -> JobResult:
        self.plans.append(plan)
        phase = plan.ranks[0].environment["GPUCLUSTER_NCCL_PHASE"]
        out = {"key": "ssh-ed25519 AAAAkey gpucluster-nccl-test-nccl-1\n", "run": MODERN}.get(phase, "ok\n")
        results = [NodeResult(r.rank, r.node.instance_id, "c", "Success", 0, out) for r in plan.ranks]
        if phase == self.fail:
            results[-1].status, results[-1].exit_code = "Failed", 1
        return JobResult(results)


def test_phases_run_in_order_on_the_right_ranks_and_always_revoke(aws: dict[str, Any],  # noqa: F811
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    base = plan_nccl_test(_nodes(aws), log_group="/g", group_environment={"FI_PROVIDER": "efa"})
    fake = FakeRunner()
    outcome = run_nccl_test(base, "nccl-1", fake)
    sent = [(p.ranks[0].environment["GPUCLUSTER_NCCL_PHASE"], [r.rank for r in p.ranks]) for p in fake.plans]
    assert sent == [("key", [0]), ("authorize", [0, 1, 2]), ("run", [0]), ("revoke", [0, 1, 2])]
    authorize = fake.plans[1]
    assert {r.environment["GPUCLUSTER_NCCL_PUBKEY"] for r in authorize.ranks} == {
        "ssh-ed25519 AAAAkey gpucluster-nccl-test-nccl-1"}
    run = fake.plans[2].ranks[0].environment
    assert (run["NNODES"], run["NPROC_PER_NODE"], run["GPUCLUSTER_NCCL_MAX_BYTES"]) == ("3", "8", "4G")
    assert len(run["GPUCLUSTER_NODE_IPS"].split()) == 3 and run["FI_PROVIDER"] == "efa"
    assert fake.plans[2].timeout_seconds == nccl.RUN_TIMEOUT_SECONDS
    assert outcome.report is not None and outcome.report.peak is not None and outcome.revoked

    failing = FakeRunner(fail="authorize")
    outcome = run_nccl_test(base, "nccl-1", failing)
    assert [p.ranks[0].environment["GPUCLUSTER_NCCL_PHASE"] for p in failing.plans] == [
        "key", "authorize", "revoke"]  # no benchmark on a half-authorised group, the key still revoked
    assert outcome.failed_phase == "authorize" and outcome.report is None
    with pytest.raises(Exception, match="--nccl-max-bytes"):
        plan_nccl_test(_nodes(aws), log_group="/g", max_bytes="lots")
    assert phase_plan(base, "revoke", "x").timeout_seconds == nccl.PHASE_TIMEOUT_SECONDS


class FakeSsm:
    """SendCommand / GetCommandInvocation: answers by the phase each command exports."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.ids = itertools.count()
        self.phase: dict[str, str] = {}

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        command_id = f"{next(self.ids):036d}"
        lines = kwargs["Parameters"]["commands"]
        self.phase[command_id] = next(line.split("=", 1)[1] for line in lines
                                      if line.startswith("export GPUCLUSTER_NCCL_PHASE="))
        return {"Command": {"CommandId": command_id}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:
        out = {"key": "ssh-ed25519 AAAAkey gpucluster-nccl-test-nccl-x\n", "run": MODERN}.get(
            self.phase[CommandId], "")
        return {"Status": "Success", "ResponseCode": 0, "StandardOutputContent": out,
                "StandardErrorContent": ""}


def test_cli_nccl_test_sends_each_phase_and_prints_the_bandwidth(aws: dict[str, Any],  # noqa: F811
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = FakeSsm()
    real = common.client
    monkeypatch.setattr(common, "client",
                        lambda spec, service: ssm if service == "ssm" else real(spec, service))
    result = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--nccl-test"])
    assert result.exit_code == 1, result.output  # 41.5 GB/s is 10 % of p5's 400: a fabric problem
    phases = [ssm.phase[f"{i:036d}"] for i in range(len(ssm.sent))]
    assert phases == ["key"] + ["authorize"] * 3 + ["run"] + ["revoke"] * 3
    assert all(s["DocumentName"] == "AWS-RunShellScript" for s in ssm.sent)
    assert {s["CloudWatchOutputConfig"]["CloudWatchLogGroupName"] for s in ssm.sent} == {
        "/gpucluster/organization/gpucluster/prod/gpu-prod/run"}
    assert "32 MiB" in result.output and "41.52" in result.output
    assert "p5.48xlarge's network gives 400 GB/s (3200 Gbps): 10%" in result.output
    assert "nccl-test: failed" in result.output
    assert max(map(len, result.output.splitlines())) <= 100

    dry = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--nccl-test", "--dry-run"])
    assert dry.exit_code == 0 and dry.output.rstrip().endswith("dry run: nothing sent")
    assert "(p5.48xlarge, EFA on), 8 B to 4GB" in dry.output
    bad = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--nccl-test", "--", "true"])
    assert (bad.exit_code, bad.output) == (2, "run: --nccl-test runs its own benchmark: give no command, "
                                              "--detach, --name or --restart-on-replace\n")
    bad = runner.invoke(app, ["run", "prod", "-g", "h100-train", "--nccl-test", "--nccl-max-bytes", "9T"])
    assert bad.exit_code == 2 and "--nccl-max-bytes: a size like 512M or 4G" in bad.output
