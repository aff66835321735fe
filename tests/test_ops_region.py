"""Operations act in the stack's region, whatever the caller's default region (a notebook's, a shell's).

The stack's clients come from one factory (`ops.Clients`, bound to the stack file's region): stop, start
and status called as a notebook calls them, with AWS_DEFAULT_REGION naming another region that holds a
group carrying the same identity, change and read only the stack region's groups.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpucluster.ops import CE_REGION, Clients
from gpucluster.ops.nodegroups import stack_fleet
from gpucluster.ops.status import stack_status
from gpucluster.ops.stopstart import apply_start, apply_stop, plan_start, plan_stop
from gpucluster.plan import load_stack
from moto_groups import create_stack_groups, tag_node_group

SPEC = load_stack("dev")[2]
ELSEWHERE = "eu-west-1"


def _groups(region: str, name: str) -> Any:
    """Auto Scaling in `region` with one group of the dev stack's identity (node group dev-a10)."""
    boto3.client("ec2", region_name=region).create_launch_template(
        LaunchTemplateName="a10-nodes",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    autoscaling = boto3.client("autoscaling", region_name=region)
    create_stack_groups(autoscaling, {name: (SPEC.identity, 1, 2, 3)}, launch_template="a10-nodes",
                        zone=f"{region}a")
    tag_node_group(autoscaling, name, "dev-a10")
    return autoscaling


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """(the stack region's Auto Scaling, the default region's), the default region not the stack's."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", ELSEWHERE)
    assert SPEC.region != ELSEWHERE
    with mock_aws():
        yield _groups(SPEC.region, "gpu-dev-a10"), _groups(ELSEWHERE, "decoy-a10")


def _capacity(autoscaling: Any, name: str) -> tuple[int, int]:
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return group["MinSize"], group["DesiredCapacity"]


def test_stop_start_and_status_act_in_the_stacks_region_not_the_default_one(regions: tuple[Any, Any]) -> None:
    home, elsewhere = regions
    assert boto3.client("autoscaling").meta.region_name == ELSEWHERE  # what a region-less client would use
    clients = Clients.of(SPEC)

    status = stack_status(stack_fleet(SPEC, clients))
    assert [(r.name, r.desired_capacity) for r in status] == [("gpu-dev-a10", 2)]

    plan = plan_stop(SPEC, clients)
    assert [c.group for c in plan.running] == ["gpu-dev-a10"]
    stopped = apply_stop(plan)
    assert stopped.report.changed == ["gpu-dev-a10"]
    assert [(r.name, r.stopped_by) for r in stopped.status] == [("gpu-dev-a10", "manual")]
    assert _capacity(home, "gpu-dev-a10") == (0, 0)
    assert _capacity(elsewhere, "decoy-a10") == (1, 2)  # the default region's group: untouched

    started = apply_start(plan_start(SPEC, clients))
    assert [(r.group, r.action) for r in started.results] == [("gpu-dev-a10", "resumed")]
    assert _capacity(home, "gpu-dev-a10") == (1, 2)
    assert _capacity(elsewhere, "decoy-a10") == (1, 2)


def test_every_client_of_the_factory_is_in_the_stacks_region_but_cost_explorers(
        regions: tuple[Any, Any]) -> None:
    clients = Clients.of(SPEC)
    for service in ("autoscaling", "ec2", "ssm", "dynamodb", "cloudwatch", "pcs"):
        assert clients(service).meta.region_name == SPEC.region
    assert clients("ssm") is clients("ssm")  # built once per stack
    abroad = Clients(ELSEWHERE)
    assert abroad("ec2").meta.region_name == ELSEWHERE
    # Cost Explorer has one endpoint region, whatever the stack's (ops.CE_REGION).
    assert abroad("ce").meta.endpoint_url == boto3.client("ce", region_name=CE_REGION).meta.endpoint_url


def test_no_boto3_client_is_built_outside_the_factory() -> None:
    """`ops.make_client` builds every client of `ops/` and `cli/`; the fleet core's own (`awsapi.make_client`)
    serves the Lambda handlers' runtime. Any other `boto3.client(` would be a client in some other region."""
    import gpucluster

    root = Path(gpucluster.__file__).parent
    found = sorted(str(path.relative_to(root)) for folder in ("ops", "cli", "fleet")
                   for path in (root / folder).rglob("*.py")
                   if re.search(r"\bboto3\.client\(", path.read_text()))
    assert found == ["fleet/awsapi.py", "ops/__init__.py"]
