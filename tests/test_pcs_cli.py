"""`stop`, `start`, `resume` and `status` on a Slurm stack act on its AWS PCS cluster, found by the
stack's tag (ops.pcsclusters; PCS answered by botocore's Stubber: moto has no PCS)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.ops.pcsclusters import NoPcsCluster, stack_pcs_cluster
from gpucluster.project import load_stack
from test_slurm_ops import slurm_config

runner = CliRunner()
ARN = "arn:aws:pcs:us-east-1:123456789012:cluster/{}"


def clusters(stub: Stubber, tagged: dict[str, str]) -> None:
    """ListClusters answers the ids of `tagged` (id -> its gpucluster:stack tag); one tag read each."""
    stub.add_response("list_clusters", {"clusters": [
        {"name": f"c-{cid}", "id": cid, "arn": ARN.format(cid), "createdAt": "2026-11-01T00:00:00Z",
         "modifiedAt": "2026-11-01T00:00:00Z", "status": "ACTIVE"} for cid in tagged]})
    for cid, owner in tagged.items():
        stub.add_response("list_tags_for_resource", {"tags": {STACK_TAG: owner}},
                          {"resourceArn": ARN.format(cid)})


def test_the_stacks_cluster_is_the_one_with_its_tag() -> None:
    pcs = boto3.client("pcs", region_name="us-east-1")
    with Stubber(pcs) as stub:
        clusters(stub, {"pcs_other1234": "someone-else", "pcs_mine56789": "acme/gpucluster/dev/lab"})
        assert stack_pcs_cluster("acme/gpucluster/dev/lab", pcs) == "pcs_mine56789"
        stub.assert_no_pending_responses()


@pytest.mark.parametrize("tagged, says", [
    ({"pcs_other1234": "someone-else"}, "no AWS PCS cluster in us-east-1 is tagged"),
    ({"pcs_a12345678": "me", "pcs_b12345678": "me"}, "2 AWS PCS clusters are tagged"),
])
def test_none_or_two_clusters_is_one_clear_error(tagged: dict[str, str], says: str) -> None:
    pcs = boto3.client("pcs", region_name="us-east-1")
    with Stubber(pcs) as stub:
        clusters(stub, tagged)
        with pytest.raises(NoPcsCluster, match=says):
            stack_pcs_cluster("me", pcs)


@pytest.mark.parametrize("command", [["stop", "--dry-run"], ["start", "--dry-run"], ["resume", "--dry-run"],
                                     ["status"]])
def test_a_slurm_stack_not_deployed_says_so_in_one_line(command: list[str], write_stack: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stack = str(write_stack(slurm_config(), "slurmy"))
    identity = load_stack(stack)[2].identity
    pcs = boto3.client("pcs", region_name="us-east-1")
    stub = Stubber(pcs)
    clusters(stub, {"pcs_other1234": "someone-else"})
    stub.activate()
    silent: dict[str, Any] = {}

    def client(spec: Any, service: str) -> Any:
        if service == "pcs":
            return pcs
        if service not in silent:  # a client that fails any call: nothing else is asked
            silent[service] = boto3.client(service, region_name="us-east-1")
            Stubber(silent[service]).activate()
        return silent[service]

    monkeypatch.setattr(common, "client", client)
    result = runner.invoke(app, [command[0], stack, *command[1:]])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line == (f"{command[0]}: no AWS PCS cluster in us-east-1 is tagged {STACK_TAG}={identity}: "
                    "deploy the stack first (`pulumi up`)")
    stub.assert_no_pending_responses()


def test_stop_says_what_a_stopped_slurm_stack_still_costs(write_stack: Any) -> None:
    """The PCS controller, accounting and the login nodes run through any stop: `stop` says so with the
    cost model's figures (pricing.stopped_slurm_costs); a type-none stack's plan says nothing of it."""
    from gpucluster.cli.fleet import nothing_to_stop_lines, still_billed_lines, stop_plan_lines
    from gpucluster.ops.stopstart import StopPlan
    from gpucluster.pricing import stopped_slurm_costs

    spec = load_stack(str(write_stack(slurm_config(), "slurmy")))[2]
    costs = stopped_slurm_costs(spec)
    assert [c.name for c in costs] == ["AWS PCS Slurm controller (small)", "AWS PCS node management",
                                       "AWS PCS Slurm accounting", "AWS PCS login nodes"]
    # Node management of the login nodes only: the compute groups are stopped.
    assert costs[1].desired_usd_per_month == costs[1].max_usd_per_month == pytest.approx(730 * 0.0285)
    text = " ".join(" ".join(still_billed_lines(spec)).split())
    total = sum(c.desired_usd_per_month for c in costs)
    assert text.startswith(f"still billed while stopped: about ${total:,.0f} a month (Slurm controller "
                           "(small) $416, node management $21, Slurm accounting $36, login nodes $74;")
    plan = StopPlan(fleet=None, group=None, candidates=[])  # type: ignore[arg-type]
    assert " ".join(still_billed_lines(spec)) in " ".join(stop_plan_lines(spec, plan))
    assert " ".join(still_billed_lines(spec)) in " ".join(nothing_to_stop_lines(spec, plan))
    plain = load_stack(str(write_stack({k: v for k, v in slurm_config().items()
                                        if k != "gpucluster:scheduler"}, "plain")))[2]
    assert still_billed_lines(plain) == [] and stopped_slurm_costs(plain) == []
    assert not any("still billed" in line for line in stop_plan_lines(plain, plan))


def test_status_says_what_a_stopped_slurm_stack_still_costs(write_stack: Any) -> None:
    """`status` (text and --json) repeats `stop`'s still-billed figure once every compute group is stopped;
    nothing while one runs, and nothing at all on a type-none stack (its --json keeps its keys)."""
    from gpucluster.cli.fleet import status_json, status_lines, still_billed_lines
    from gpucluster.ops.overview import StackOverview
    from gpucluster.ops.status import GroupStatus
    from gpucluster.pricing import stopped_slurm_costs

    spec = load_stack(str(write_stack(slurm_config(), "slurmy")))[2]
    compute = spec.node_groups[0].name

    def overview(desired: int) -> StackOverview:
        by = "manual" if not desired else None
        rows = [GroupStatus(compute, 0, desired, 4, desired, by, None, compute),
                GroupStatus("login", 1, 1, 1, 1, None, None, "login")]
        return StackOverview(rows, "https://dashboard", None)

    stopped, running = overview(0), overview(2)
    billed = still_billed_lines(spec)
    assert billed and " ".join(billed) in " ".join(status_lines("slurmy", spec, stopped))
    assert not any("still billed" in line for line in status_lines("slurmy", spec, running))
    total = round(sum(c.desired_usd_per_month for c in stopped_slurm_costs(spec)), 2)
    assert status_json(spec, stopped)["still_billed_usd_per_month"] == total
    assert status_json(spec, running)["still_billed_usd_per_month"] is None
    plain = load_stack(str(write_stack({k: v for k, v in slurm_config().items()
                                        if k != "gpucluster:scheduler"}, "plain")))[2]
    assert "still_billed_usd_per_month" not in status_json(plain, stopped)
    assert not any("still billed" in line for line in status_lines("plain", plain, stopped))
