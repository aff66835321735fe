"""`doctor`: offerings and EFA limits from moto, reservations, quotas and tags through Stubber.

moto 5.2 implements DescribeInstanceTypeOfferings and DescribeInstanceTypes but not
DescribeCapacityReservations, EC2 service quotas or ListCostAllocationTags, so those
answers are stubbed with botocore's Stubber (which checks them against the API model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from gpucluster.ops import Clients
from gpucluster.ops.doctor import (
    IAM_ACTIONS,
    DoctorError,
    check_cost_tags,
    check_efa,
    check_iam_names,
    check_identity,
    check_quotas,
    check_reservations,
    fetch_spot_prices,
    has_blocker,
    identity_groups,
    own_group_names,
    run_checks,
    vcpus_needed,
)
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
CR = "cr-0123456789abcdef0"
AMI = "ami-0123456789abcdef0"


def training_stack(base_config: dict[str, Any], instance_type: str = "p5.48xlarge", zone: str = "us-east-1a",
                   **capacity: Any) -> StackSpec:
    """One p5-like EFA group: 4-node base, 100 % spot above, desired 8, max 16."""
    base_config["gpucluster:network"]["availability_zones"] = [zone]
    base_config["gpucluster:node_groups"] = [{
        "name": "train", "instance_types": [instance_type], "min_nodes": 0, "desired_nodes": 8,
        "max_nodes": 16, "capacity": {"on_demand_base": 4, "spot_percent": 100, **capacity}}]
    return parse_stack_config(base_config, stack="t")


def quota(code: str, value: float) -> dict[str, Any]:
    return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}}


def tags(**status: str) -> dict[str, Any]:
    return {"CostAllocationTags": [{"TagKey": k.replace("__", ":"), "Type": "UserDefined", "Status": s}
                                   for k, s in status.items()]}


@pytest.fixture(scope="module")
def moto_ec2() -> Iterator[Any]:
    """One moto EC2 for the module: the checks only read, and moto's first request is slow."""
    with mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


@pytest.fixture
def stubbed() -> Iterator[tuple[Stubber, Stubber, Stubber]]:
    """Stubbers for ec2, service-quotas and ce clients, asserted empty at the end."""
    clients = [boto3.client(s, region_name="us-east-1") for s in ("ec2", "service-quotas", "ce")]
    stubbers = [Stubber(c) for c in clients]
    for s in stubbers:
        s.activate()
    yield tuple(stubbers)  # type: ignore[misc]
    for s in stubbers:
        s.assert_no_pending_responses()


DOCTOR_SERVICES = {"ec2": "ec2", "quotas": "service-quotas", "ce": "ce", "autoscaling": "autoscaling",
                   "iam": "iam", "sts": "sts"}


def doctor_clients(**given: Any) -> Clients:
    """The stack's clients as doctor asks for them: these (ec2=..., quotas=...), None for the others."""
    by_service = {DOCTOR_SERVICES[name]: client for name, client in given.items()}
    return Clients("us-east-1", make=by_service.get)


def clients_of(ec2: Any, stubbed: tuple[Stubber, Stubber, Stubber]) -> Clients:
    """Stubbed quotas and Cost Explorer; Auto Scaling from moto (the caller runs inside `moto_ec2`)."""
    return doctor_clients(ec2=ec2, quotas=stubbed[1].client, ce=stubbed[2].client,
                          autoscaling=boto3.client("autoscaling", region_name="us-east-1"))


def stub_p_quotas(quotas: Stubber, on_demand: float = 768, spot: float = 2304) -> None:
    # checks run in sorted (class, market) order: P on-demand, then P spot
    quotas.add_response("get_service_quota", quota("L-417A185B", on_demand),
                        {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"})
    quotas.add_response("get_service_quota", quota("L-7212CCBC", spot),
                        {"ServiceCode": "ec2", "QuotaCode": "L-7212CCBC"})


def healthy_quotas_and_tags(stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    stub_p_quotas(stubbed[1])
    stubbed[2].add_response("list_cost_allocation_tags",
                            tags(gpucluster__stack="Active", cost_center="Active"),
                            {"TagKeys": ["gpucluster:stack", "cost_center"], "Type": "UserDefined"})


def test_healthy_account(base_config: dict[str, Any], stubbed: tuple[Stubber, Stubber, Stubber],
                         moto_ec2: Any) -> None:
    spec = training_stack(base_config)
    healthy_quotas_and_tags(stubbed)
    findings = run_checks(spec, clients_of(moto_ec2, stubbed))
    assert [(f.level, f.check, f.subject) for f in findings] == [
        ("ok", "offering", "train us-east-1a"),
        ("ok", "efa", "p5.48xlarge"),
        ("ok", "quota", "Running On-Demand P instances (L-417A185B)"),
        ("ok", "quota", "All P Spot Instance Requests (L-7212CCBC)"),
        ("ok", "ami", "train"),
        ("ok", "identity", "organization/gpucluster/t/test"),
        ("ok", "cost tag", "gpucluster:stack"),
        ("ok", "cost tag", "cost_center"),
    ]
    assert not has_blocker(findings)


def unchecked(config: dict[str, Any]) -> StackSpec:
    """The spec without the cross-field checks: the offline offerings check would reject it first.

    doctor asks the account, whose zone names may map to other physical zones than the shipped
    offerings assume, so it must still find what the account does not offer.
    """
    values = {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("gpucluster:")}
    return StackSpec.model_validate({**values, "stack": "t", "region": config["aws:region"]})


def test_missing_offering_blocks(base_config: dict[str, Any], stubbed: tuple[Stubber, Stubber, Stubber],
                                 moto_ec2: Any) -> None:
    training_stack(base_config)
    base_config["gpucluster:node_groups"][0]["instance_types"] = ["p4de.24xlarge"]  # moto: us-east-1b/1c
    spec = unchecked(base_config)
    healthy_quotas_and_tags(stubbed)  # p4de has 96 vCPUs: 384 on-demand, 1152 spot needed
    findings = run_checks(spec, clients_of(moto_ec2, stubbed))
    blockers = [f for f in findings if f.level == "blocker"]
    assert [(f.check, f.subject) for f in blockers] == [("offering", "train us-east-1a")]
    assert "p4de.24xlarge not offered in us-east-1a" in blockers[0].message
    assert has_blocker(findings)


def test_missing_fallback_offering_only_warns(base_config: dict[str, Any], moto_ec2: Any) -> None:
    from gpucluster.ops.doctor import check_offerings

    training_stack(base_config)  # fills base_config; then add a fallback moto does not offer there
    base_config["gpucluster:node_groups"][0]["instance_types"] = ["p5.48xlarge", "p5e.48xlarge"]
    spec = parse_stack_config(base_config, stack="t")
    findings = list(check_offerings(spec, moto_ec2))
    assert [(f.level, f.message) for f in findings] == [
        ("warning", "fallback p5e.48xlarge not offered in us-east-1a; the group launches the other "
                    "types only")]


def reservation(**fields: Any) -> dict[str, Any]:
    cr = {"CapacityReservationId": CR, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
          "State": "active", "TotalInstanceCount": 4, "AvailableInstanceCount": 4,
          "StartDate": NOW - timedelta(days=30), "EndDate": NOW + timedelta(days=60),
          "ReservationType": "default", **fields}
    return {"CapacityReservations": [{k: v for k, v in cr.items() if v is not None}]}


BLOCK = {"market": "capacity_block", "on_demand_base": 0, "spot_percent": 0}


@pytest.mark.parametrize(("fields", "capacity", "expected"), [
    ({}, {}, [("ok", "active, p5.48xlarge x 4 in us-east-1a, until 2027-01-20")]),
    ({"EndDate": NOW - timedelta(hours=1), "State": "expired"}, {},
     [("blocker", "expired at 2026-11-21 11:00 UTC")]),
    ({"EndDate": NOW - timedelta(hours=1)}, {}, [("blocker", "expired at 2026-11-21 11:00 UTC")]),
    ({"State": "cancelled"}, {}, [("blocker", "state is cancelled, not active")]),
    ({"EndDate": NOW + timedelta(days=2)}, {}, [("warning", "ends at 2026-11-23 12:00 UTC, within 7 days")]),
    ({"EndDate": None}, {}, [("ok", "active, p5.48xlarge x 4 in us-east-1a")]),
    ({"AvailabilityZone": "us-east-1b", "InstanceType": "p5e.48xlarge"}, {}, [
        ("blocker", "is in us-east-1b, the group runs in us-east-1a"),
        ("blocker", "is for p5e.48xlarge, the group launches p5.48xlarge")]),
    ({"TotalInstanceCount": 2}, {}, [("warning", "holds 2 instances, the group wants 4 from it")]),
    ({"ReservationType": "capacity-block"}, {},
     [("blocker", "is a capacity block, but capacity.market is mixed")]),
    ({"ReservationType": "capacity-block", "State": "scheduled", "StartDate": NOW + timedelta(days=3),
      "TotalInstanceCount": 16}, BLOCK,
     [("warning", "a capacity block that has not started: it starts at 2026-11-24 12:00 UTC, in 3 days 0 h; "
                  "nodes launch from then")]),
    # issue 15: not started (just bought), ended, ends within the next day
    ({"ReservationType": "capacity-block", "State": "payment-pending", "StartDate": NOW + timedelta(hours=5),
      "TotalInstanceCount": 16}, BLOCK,
     [("warning", "a capacity block that has not started (payment pending): it starts at 2026-11-21 17:00 "
                  "UTC, in 5 h 0 min; nodes launch from then")]),
    ({"ReservationType": "capacity-block", "State": "expired", "EndDate": NOW - timedelta(minutes=30),
      "TotalInstanceCount": 16}, BLOCK, [("blocker", "expired at 2026-11-21 11:30 UTC")]),
    ({"ReservationType": "capacity-block", "EndDate": NOW + timedelta(hours=20, minutes=15),
      "TotalInstanceCount": 16}, BLOCK,
     [("warning", "ends at 2026-11-22 08:15 UTC, in 20 h 15 min: the block-expiry guardrail runs the "
                  "pre-stop hook and scales the group to zero 40 minutes before; EC2 terminates the "
                  "instances from 30 minutes before")]),
    ({"ReservationType": "capacity-block", "EndDate": NOW + timedelta(days=2), "TotalInstanceCount": 16},
     BLOCK, [("ok", "active, p5.48xlarge x 16 in us-east-1a, until 2026-11-23")]),  # a block's 2 days: fine
    ({"State": "scheduled", "StartDate": NOW + timedelta(days=10)}, {},
     [("warning", "a reservation that has not started: it starts at 2026-12-01 12:00 UTC, in 10 days 0 h; "
                  "nodes launch from then")]),
])
def test_reservation_findings(base_config: dict[str, Any], stubbed: tuple[Stubber, Stubber, Stubber],
                              fields: dict[str, Any], capacity: dict[str, Any],
                              expected: list[tuple[str, str]]) -> None:
    spec = training_stack(base_config, capacity_reservation_id=CR, **capacity)
    ec2 = stubbed[0]
    ec2.add_response("describe_capacity_reservations", reservation(**fields),
                     {"CapacityReservationIds": [CR]})
    findings = list(check_reservations(spec, ec2.client, now=NOW))
    assert [(f.level, f.message) for f in findings] == expected
    assert {f.subject for f in findings} == {f"train {CR}"}


def test_unknown_reservation_blocks(base_config: dict[str, Any],
                                    stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    spec = training_stack(base_config, capacity_reservation_id=CR)
    stubbed[0].add_client_error("describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                                f"The capacity reservation ID '{CR}' does not exist")
    findings = list(check_reservations(spec, stubbed[0].client, now=NOW))
    assert [(f.level, f.message) for f in findings] == [
        ("blocker", "no such capacity reservation in us-east-1 for this account")]


def test_expired_reservation_through_run_checks(base_config: dict[str, Any],
                                                stubbed: tuple[Stubber, Stubber, Stubber],
                                                moto_ec2: Any) -> None:
    """The whole doctor with EC2 answered by moto's real data, replayed through a Stubber."""
    training_stack(base_config, capacity_reservation_id=CR)
    base_config["gpucluster:node_groups"][0]["ami_id"] = AMI  # so DescribeImages is asked too
    spec = parse_stack_config(base_config, stack="t")
    offerings = moto_ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["p5.48xlarge"]},
                 {"Name": "location", "Values": ["us-east-1a"]}])
    described = moto_ec2.describe_instance_types(InstanceTypes=["p5.48xlarge"])
    ec2 = stubbed[0]
    for answer in (offerings, described):
        answer.pop("ResponseMetadata")
    ec2.add_response("describe_instance_type_offerings", offerings)
    ec2.add_response("describe_instance_types", described)
    ec2.add_response("describe_capacity_reservations",
                     reservation(State="expired", EndDate=NOW - timedelta(days=1)))
    ec2.add_response("describe_images", {"Images": [{
        "ImageId": AMI, "Name": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20241115",
        "PlatformDetails": "Linux/UNIX", "RootDeviceName": "/dev/sda1"}]}, {"ImageIds": [AMI]})
    healthy_quotas_and_tags(stubbed)
    clients = clients_of(ec2.client, stubbed)
    called: set[str] = set()
    for client in filter(None, map(clients, DOCTOR_SERVICES.values())):  # every call, as its IAM action
        prefix = client.meta.service_model.signing_name.replace("service-quotas", "servicequotas")
        client.meta.events.register("before-parameter-build", lambda model, prefix=prefix, **_: called.add(
            f"{prefix}:{model.name}"))
    findings = run_checks(spec, clients, now=NOW)
    assert [(f.level, f.check) for f in findings if f.level != "ok"] == [("blocker", "reservation")]
    assert has_blocker(findings)
    assert called <= set(IAM_ACTIONS) and len(called) == len(IAM_ACTIONS) - 1  # no default quota asked


def test_short_quota_blocks(base_config: dict[str, Any], stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    spec = training_stack(base_config)
    # max 16 = 4 on-demand + 12 spot p5.48xlarge (192 vCPUs): 768 and 2304 vCPUs
    assert vcpus_needed(spec) == {("P", "on-demand"): 768, ("P", "spot"): 2304}
    stub_p_quotas(stubbed[1], spot=1152)
    findings = list(check_quotas(spec, stubbed[1].client))
    assert [(f.level, f.subject, f.message) for f in findings] == [
        ("ok", "Running On-Demand P instances (L-417A185B)", "768 vCPUs cover the 768 max nodes need"),
        ("blocker", "All P Spot Instance Requests (L-7212CCBC)",
         "1152 vCPUs, max nodes need 2304; request an increase in Service Quotas before deploying"),
    ]


def test_quota_falls_back_to_the_aws_default(base_config: dict[str, Any],
                                             stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    base_config["gpucluster:node_groups"][0]["capacity"] = {"on_demand_base": 2}   # 2 x g5.xlarge on-demand
    spec = parse_stack_config(base_config, stack="t")
    assert vcpus_needed(spec) == {("G", "on-demand"): 2 * 4}
    quotas = stubbed[1]
    quotas.add_client_error("get_service_quota", "NoSuchResourceException", "not applied")
    quotas.add_response("get_aws_default_service_quota", quota("L-DB2E81BA", 0),
                        {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"})
    findings = list(check_quotas(spec, quotas.client))
    assert [(f.level, f.message) for f in findings] == [
        ("blocker", "0 vCPUs, max nodes need 8; request an increase in Service Quotas before deploying")]


def test_capacity_blocks_are_left_out_of_quotas(base_config: dict[str, Any]) -> None:
    spec = training_stack(base_config, market="capacity_block", on_demand_base=0, spot_percent=0,
                          capacity_reservation_id=CR)
    assert vcpus_needed(spec) == {}


def test_vcpus_needed_for_the_shipped_stacks() -> None:
    # h100-train: 16 on-demand p5.48xlarge x 192 vCPUs; eval: 4 spot g6e.12xlarge x 48
    assert vcpus_needed(load_stack("prod")[2]) == {("P", "on-demand"): 3072, ("G", "spot"): 192}
    # staging max 6 = 1 base + 2 on-demand + 3 spot, 48-vCPU types
    assert vcpus_needed(load_stack("staging")[2]) == {("G", "on-demand"): 144, ("G", "spot"): 144}


@pytest.mark.parametrize(("status", "budget", "deployed", "levels"), [
    ({"gpucluster__stack": "Active", "cost_center": "Active"}, True, True, ["ok", "ok"]),
    # the budget filters on gpucluster:stack: inactive, it sees $0 and never stops anything
    ({"gpucluster__stack": "Inactive", "cost_center": "Active"}, True, False, ["blocker", "ok"]),
    ({"gpucluster__stack": "Active", "cost_center": "Inactive"}, True, True, ["ok", "warning"]),
    ({}, True, True, ["blocker", "warning"]),  # deployed, and AWS still lists no such tag
    ({}, True, False, ["warning", "warning"]),  # first deploy: AWS lists a tag only after resources carry it
    ({"gpucluster__stack": "Inactive", "cost_center": "Inactive"}, False, True, ["warning", "warning"]),
])
def test_cost_tags(base_config: dict[str, Any], stubbed: tuple[Stubber, Stubber, Stubber],
                   status: dict[str, str], budget: bool, deployed: bool, levels: list[str]) -> None:
    if budget:
        base_config["gpucluster:budget"] = {"monthly_limit_usd": 500, "action_threshold_percent": 100}
    stubbed[2].add_response("list_cost_allocation_tags", tags(**status))
    findings = list(check_cost_tags(parse_stack_config(base_config, stack="t"), stubbed[2].client, deployed))
    assert [(f.subject, f.level) for f in findings] == list(zip(["gpucluster:stack", "cost_center"], levels,
                                                                strict=True))
    if levels[0] == "blocker":
        assert "the budget sees $0 of this stack's spend and its scale-to-zero never fires" in \
            findings[0].message
        assert "TagKey=gpucluster:stack,Status=Active" in findings[0].message


def test_efa_mismatch_blocks_an_efa_group(base_config: dict[str, Any],
                                          stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    spec = training_stack(base_config)
    stubbed[0].add_response("describe_instance_types", {"InstanceTypes": [{
        "InstanceType": "p5.48xlarge",
        "NetworkInfo": {"EfaSupported": True, "MaximumNetworkCards": 16,
                        "EfaInfo": {"MaximumEfaInterfaces": 16}}}]})
    findings = list(check_efa(spec, stubbed[0].client))
    assert [(f.level, f.message) for f in findings] == [
        ("blocker", "AWS reports 16 EFA interfaces / 16 network cards, the catalog 32 / 32; update "
                    "components/gpucluster/catalog/data/instance_types.yaml")]


def test_access_denied_is_a_warning_not_a_crash(base_config: dict[str, Any],
                                               stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    stubbed[2].add_client_error("list_cost_allocation_tags", "AccessDeniedException", "not allowed")
    findings = list(check_cost_tags(parse_stack_config(base_config, stack="t"), stubbed[2].client))
    assert [(f.level, f.message) for f in findings] == [
        ("warning", "could not check (AccessDeniedException: not allowed)")]


def test_no_credentials_is_a_doctor_error(base_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Any) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never the real AWS, should it try
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a session from an earlier test caches keys
    with pytest.raises(DoctorError, match="no AWS credentials found"):
        run_checks(parse_stack_config(base_config, stack="t"))


def test_fetch_spot_prices_takes_the_latest_per_zone(stubbed: tuple[Stubber, Stubber, Stubber]) -> None:
    spec = load_stack("staging")[2]    # g6e.12xlarge over us-west-2a/b/c
    ec2 = boto3.client("ec2", region_name="us-west-2")
    with Stubber(ec2) as stub:
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
            {"AvailabilityZone": "us-west-2a", "InstanceType": "g6e.12xlarge", "SpotPrice": "4.10",
             "Timestamp": NOW - timedelta(hours=1)},
            {"AvailabilityZone": "us-west-2a", "InstanceType": "g6e.12xlarge", "SpotPrice": "9.99",
             "Timestamp": NOW - timedelta(days=2)},
            {"AvailabilityZone": "us-west-2b", "InstanceType": "g6e.12xlarge", "SpotPrice": "4.50",
             "Timestamp": NOW - timedelta(hours=3)},
        ]}, {"InstanceTypes": ["g6e.12xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW,
             "Filters": [{"Name": "availability-zone",
                          "Values": ["us-west-2a", "us-west-2b", "us-west-2c"]}]})
        rates = fetch_spot_prices(spec, ec2, now=NOW)
    rate = rates["l40s-4x"]
    assert rate.usd_per_hour == pytest.approx((4.10 + 4.50) / 2)
    assert rate.basis == "spot, live: mean of the latest price in us-west-2a, us-west-2b"
    assert rate.as_of == "2026-11-21 11:00 UTC"


# ------------------------------------------------------------------ identity


def identity_group(autoscaling: Any, name: str, identity: str, node_group: str | None = "gpu") -> None:
    tags = {"gpucluster:stack": identity, **({"gpucluster:node-group": node_group} if node_group else {})}
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=2, DesiredCapacity=0, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateName": "doctor-nodes", "Version": "$Latest"},
        Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
               "PropagateAtLaunch": True} for k, v in tags.items()])


@pytest.fixture
def asgs(moto_ec2: Any) -> Iterator[Any]:
    """Auto Scaling in the module's moto account; the groups a test creates are removed after it."""
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    if not moto_ec2.describe_launch_templates()["LaunchTemplates"]:
        moto_ec2.create_launch_template(LaunchTemplateName="doctor-nodes",
                                        LaunchTemplateData={"ImageId": "ami-12c6146b"})
    yield autoscaling
    for g in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=g["AutoScalingGroupName"],
                                              ForceDelete=True)


def identity_findings(spec: StackSpec, autoscaling: Any,
                      own: set[str] | None = None) -> list[tuple[str, str]]:
    return [(f.level, f.subject) for f in check_identity(spec, identity_groups(spec, autoscaling), own)]


def test_a_group_of_another_deployment_with_this_identity_blocks(base_config: dict[str, Any],
                                                                 asgs: Any) -> None:
    spec = parse_stack_config(base_config, stack="dev")
    identity_group(asgs, "test-gpu-asg-1111111", spec.identity)  # this stack's
    identity_group(asgs, "test-gpu-asg-2222222", spec.identity)  # a second deployment's, same identity
    identity_group(asgs, "other-team-dev", "acme/gpucluster/dev/test")  # another org's dev: never counted

    assert identity_findings(spec, asgs, own={"test-gpu-asg-1111111"}) == [
        ("blocker", "test-gpu-asg-2222222")]
    # without the stack's outputs both claim node group gpu: neither can be told to be this stack's
    assert identity_findings(spec, asgs) == [("blocker", "test-gpu-asg-1111111"),
                                             ("blocker", "test-gpu-asg-2222222")]
    [finding] = check_identity(spec, identity_groups(spec, asgs), {"test-gpu-asg-1111111"})
    assert finding.message.startswith("carries gpucluster:stack=organization/gpucluster/dev/test but is not "
                                      "one of this stack's groups (its outputs): another deployment")
    assert "give this cluster another cluster.name" in finding.message


def test_before_the_first_deploy_every_group_with_the_identity_is_foreign(base_config: dict[str, Any],
                                                                         asgs: Any) -> None:
    spec = parse_stack_config(base_config, stack="dev")
    identity_group(asgs, "left-behind", spec.identity)
    assert identity_findings(spec, asgs, own=set()) == [("blocker", "left-behind")]
    assert identity_findings(spec, asgs) == [("ok", spec.identity)]  # tags alone cannot tell


def test_groups_of_no_node_group_of_the_stack_file_block(base_config: dict[str, Any], asgs: Any) -> None:
    spec = parse_stack_config(base_config, stack="dev")
    identity_group(asgs, "untagged", spec.identity, node_group=None)
    identity_group(asgs, "old-group", spec.identity, node_group="a100")
    findings = {f.subject: f.message for f in check_identity(spec, identity_groups(spec, asgs))}
    assert "has no gpucluster:node-group tag" in findings["untagged"]
    assert "its node group 'a100' is not in the stack file" in findings["old-group"]
    assert "run doctor with --outputs" in findings["old-group"]


def test_own_groups_come_from_the_stack_outputs() -> None:
    outputs = {"cluster_name": "gpu-dev", "node_groups": {
        "dev-a10": {"asg_name": "gpu-dev-dev-a10-asg-8f3a2b1", "efa": False}}}
    assert own_group_names(outputs) == {"gpu-dev-dev-a10-asg-8f3a2b1"}
    assert own_group_names({}) == set()
    with pytest.raises(ValueError, match=r"node_groups\.x\.asg_name is missing"):
        own_group_names({"node_groups": {"x": {}}})


def test_doctor_cli_blocks_on_the_inactive_budget_tag_and_a_foreign_group(
        base_config: dict[str, Any], asgs: Any, moto_ec2: Any, write_stack: Any, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpucluster doctor` is the deploy gate: exit 1 on a blocker, 0 once the account is right."""
    from typer.testing import CliRunner

    from gpucluster.cli import app

    base_config["gpucluster:budget"] = {"monthly_limit_usd": 500, "action_threshold_percent": 100}
    path = write_stack(base_config, "dev")
    spec = parse_stack_config(base_config, stack="dev")
    identity_group(asgs, "mine", spec.identity)
    identity_group(asgs, "theirs", spec.identity)
    outputs = tmp_path / "outputs.json"
    outputs.write_text('{"node_groups": {"gpu": {"asg_name": "mine"}}}')

    def clients(status: str) -> Callable[[Any, Any], Clients]:
        quotas, ce = boto3.client("service-quotas", region_name="us-east-1"), boto3.client("ce")
        q, c = Stubber(quotas), Stubber(ce)
        q.add_response("get_service_quota", quota("L-3819A6DF", 64))  # G spot: 2 x g5.xlarge
        c.add_response("list_cost_allocation_tags", tags(gpucluster__stack=status, cost_center="Active"))
        q.activate()
        c.activate()
        return lambda cls, spec: doctor_clients(ec2=moto_ec2, quotas=quotas, ce=ce, autoscaling=asgs)

    monkeypatch.setattr(Clients, "of", classmethod(clients("Inactive")))
    result = CliRunner().invoke(app, ["doctor", str(path), "--outputs", str(outputs)])
    assert result.exit_code == 1, result.output
    assert "gpucluster:stack=organization/gpucluster/dev/test" in result.output.splitlines()[0]
    blockers = [line.split()[1:3] for line in result.output.splitlines() if line.split()[:1] == ["blocker"]]
    assert blockers == [["identity", "theirs"], ["cost", "tag"]]

    asgs.delete_auto_scaling_group(AutoScalingGroupName="theirs", ForceDelete=True)
    monkeypatch.setattr(Clients, "of", classmethod(clients("Active")))
    result = CliRunner().invoke(app, ["doctor", str(path), "--outputs", str(outputs)])
    assert result.exit_code == 0, result.output
    assert "0 blocker(s)" in result.output


def test_doctor_cli_rejects_unreadable_outputs(base_config: dict[str, Any], write_stack: Any,
                                               tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from gpucluster.cli import app

    bad = tmp_path / "outputs.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(app, ["doctor", str(write_stack(base_config, "dev")), "--outputs", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip() == f"doctor --outputs: {bad}: not a JSON object of stack outputs"


@pytest.mark.parametrize(("own", "level"), [(set(), "warning"), ({"mine"}, "blocker")])
def test_an_unlisted_budget_tag_blocks_once_the_stack_itself_is_deployed(
        base_config: dict[str, Any], asgs: Any, moto_ec2: Any, own: set[str], level: str) -> None:
    """A foreign group with this identity does not make this stack deployed: its outputs do."""
    base_config["gpucluster:budget"] = {"monthly_limit_usd": 500, "action_threshold_percent": 100}
    spec = parse_stack_config(base_config, stack="dev")
    identity_group(asgs, "theirs", spec.identity)
    quotas, ce = boto3.client("service-quotas", region_name="us-east-1"), boto3.client("ce")
    with Stubber(quotas) as q, Stubber(ce) as c:
        q.add_response("get_service_quota", quota("L-3819A6DF", 64))
        c.add_response("list_cost_allocation_tags", tags(cost_center="Active"))  # gpucluster:stack unlisted
        clients = doctor_clients(ec2=moto_ec2, quotas=quotas, ce=ce, autoscaling=asgs)
        findings = run_checks(spec, clients, own_groups=own)
    [tag] = [f for f in findings if f.subject == "gpucluster:stack"]
    assert tag.level == level


# ------------------------------------------- the boundary and break-glass role the stack names


def iam_stack(base_config: dict[str, Any], **cluster: Any) -> StackSpec:
    config = dict(base_config)
    config["gpucluster:cluster"] = {**base_config["gpucluster:cluster"], **cluster}
    return parse_stack_config(config, stack="t")


def test_a_missing_boundary_blocks_and_a_missing_break_glass_role_warns(base_config: dict[str, Any]) -> None:
    with mock_aws():
        iam, sts = boto3.client("iam", region_name="us-east-1"), boto3.client("sts", region_name="us-east-1")
        spec = iam_stack(base_config, permissions_boundary="gpucluster-workload-boundary",
                         break_glass_role="acme-break-glass")
        findings = list(check_iam_names(spec, iam, sts))
        assert [(f.level, f.check, f.subject) for f in findings] == [
            ("blocker", "boundary", "gpucluster-workload-boundary"),
            ("warning", "break-glass", "acme-break-glass")]
        account = sts.get_caller_identity()["Account"]
        assert findings[0].message.startswith(
            f"gpucluster:cluster.permissions_boundary: arn:aws:iam::{account}:policy/"
            "gpucluster-workload-boundary does not exist, so IAM refuses every role the stack creates")
        assert "bootstrap_state.py" in findings[0].message and "--hardened" in findings[0].message
        assert findings[1].message.startswith("gpucluster:cluster.break_glass_role: no role acme-break-glass")

        # once both exist (as the bootstrap script and the administrators make them): ok
        iam.create_policy(PolicyName="gpucluster-workload-boundary", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        iam.create_role(RoleName="acme-break-glass", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"AWS": f"arn:aws:iam::{account}:root"}}]}))
        assert [(f.level, f.check) for f in check_iam_names(spec, iam, sts)] == [
            ("ok", "boundary"), ("ok", "break-glass")]


def test_a_stack_without_them_asks_iam_nothing(base_config: dict[str, Any]) -> None:
    spec = iam_stack(base_config)
    assert spec.cluster.permissions_boundary is None
    assert list(check_iam_names(spec, None, None)) == []  # None clients: any call would raise


def test_iam_access_denied_is_a_warning(base_config: dict[str, Any]) -> None:
    iam, sts = boto3.client("iam", region_name="us-east-1"), boto3.client("sts", region_name="us-east-1")
    with Stubber(iam) as iam_stub, Stubber(sts) as sts_stub:
        sts_stub.add_response("get_caller_identity", {"Account": "123456789012", "UserId": "AIDA",
                                                      "Arn": "arn:aws:iam::123456789012:user/ci"})
        iam_stub.add_client_error("get_policy", "AccessDenied", "not allowed")
        iam_stub.add_client_error("get_role", "AccessDenied", "not allowed")
        spec = iam_stack(base_config, permissions_boundary="b", break_glass_role="r")
        assert [(f.level, f.message) for f in check_iam_names(spec, iam, sts)] == [
            ("warning", "could not check (AccessDenied: not allowed)"),
            ("warning", "could not check (AccessDenied: not allowed)")]


def test_run_checks_includes_the_iam_names(base_config: dict[str, Any],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """run_checks asks IAM for what the stack names (here: a break-glass role that is missing)."""
    from gpucluster.ops import doctor

    for name in ("check_offerings", "check_efa", "check_reservations", "check_quotas", "check_cost_tags"):
        monkeypatch.setattr(doctor, name, lambda *a, **k: [])
    monkeypatch.setattr(doctor, "identity_groups", lambda *a, **k: [])
    spec = iam_stack(base_config, break_glass_role="nobody-here")
    with mock_aws():
        clients = doctor_clients(iam=boto3.client("iam", region_name="us-east-1"))
        findings = run_checks(spec, clients, now=NOW, own_groups=set())
    assert [(f.level, f.check, f.subject) for f in findings if f.check == "break-glass"] == [
        ("warning", "break-glass", "nobody-here")]
