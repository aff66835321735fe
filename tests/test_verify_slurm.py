"""`verify` on a Slurm stack, through its login node (#34 item 9): compute instances registered with
Slurm (`sinfo`) and Slurm's ports (`scontrol show config`) allowed by the stack's security groups.

EC2 (instances, security groups and their rules) is moto's; the login node's Slurm is SSM answered
by a Stubber (tests/test_verify.py's `ssm_answering`), faults included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

import test_verify
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.ops import Clients
from gpucluster.ops.verify import plan_checks
from gpucluster.ops.verifyslurm import REGISTER_GRACE, check_nodes_registered, check_slurm_ports
from gpucluster.slurm.ports import DEFAULT_PORTS, SlurmPorts, parse_config, ports_of, slurm_rules
from gpucluster.slurm.remote import decoded
from test_verify import (
    HERE,
    REGION,
    assert_unknown,
    client_error,
    inject,
    login_node,
    run_with,
    slurm_spec,
    ssm_answering,
)

# tests/test_verify.py's fixtures: its moto account with the stack deployed, and the stack.
account, spec = test_verify.account, test_verify.spec

LATER = datetime.now(UTC) + timedelta(hours=1)  # moto launches now: every instance past the grace

CONFIG = """Configuration data as of 2026-11-29T12:00:00
AccountingStorageHost   = pcs-controller
AccountingStoragePort   = 6819
ClusterName             = lab
SlurmctldPort           = 6817
SlurmdPort              = 6818
SrunPortRange           = 60001-63000
SlurmctldHost[0]        = slurmctld-primary
"""


def compute_node(identity: str, group: str = "gpu") -> dict[str, Any]:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    return ec2.run_instances(
        ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1, SubnetId=subnet,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": STACK_TAG, "Value": identity}, {"Key": NODE_GROUP_TAG, "Value": group}]}],
    )["Instances"][0]


def sinfo(*ips: str) -> str:
    return "".join(f"gpu-dy-g5-{n}|gpu|idle|{ip}|ip-{ip.replace('.', '-')}|none\n"
                   for n, ip in enumerate(ips, 1))


def security_groups(identity: str, label: str = "test", *, skip: tuple[str, ...] = (),
                    ports: SlurmPorts = DEFAULT_PORTS) -> dict[str, str]:
    """The controller's and the nodes' groups as aws.pcs creates them, with every rule but `skip`."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    groups = {}
    for role, name in (("cluster", f"{label}-slurm-controller"), ("nodes", f"{label}-slurm-nodes")):
        groups[role] = ec2.create_security_group(
            GroupName=f"{name}-{identity.replace('/', '-')}", Description=name, VpcId=vpc,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                {"Key": STACK_TAG, "Value": identity}, {"Key": "Name", "Value": name}]}])["GroupId"]
    for rule in slurm_rules(True, ports):
        if rule.name in skip:
            continue
        permission = [{"IpProtocol": "tcp", "FromPort": rule.from_port, "ToPort": rule.to_port,
                       "UserIdGroupPairs": [{"GroupId": groups[rule.peer]}]}]
        if rule.direction == "in":
            ec2.authorize_security_group_ingress(GroupId=groups[rule.group], IpPermissions=permission)
        else:
            ec2.authorize_security_group_egress(GroupId=groups[rule.group], IpPermissions=permission)
    return groups


# ----------------------------------------------------------------------------- the ports, pure


def test_the_ports_come_from_scontrol_show_config() -> None:
    config = parse_config(CONFIG)
    assert config["SrunPortRange"] == "60001-63000" and config["SlurmctldHost[0]"] == "slurmctld-primary"
    assert ports_of(config, accounting=True) == SlurmPorts(6817, 6818, 6819, (60001, 63000))
    other = parse_config(CONFIG.replace("60001-63000", "50000-50100").replace("6819", "7031"))
    assert ports_of(other, accounting=True) == SlurmPorts(6817, 6818, 7031, (50000, 50100))
    assert ports_of(other, accounting=False).slurmdbd == 6819  # not read without accounting


@pytest.mark.parametrize(("change", "says"), [
    (("60001-63000", "0-0"), "SrunPortRange is not set"),
    (("SrunPortRange           = 60001-63000\n", ""), "SrunPortRange is not set"),
    (("SlurmctldPort           = 6817", "SlurmctldPort = 6817-6820"), "SlurmctldPort is a range"),
    (("SlurmdPort              = 6818\n", ""), "no SlurmctldPort or SlurmdPort"),
    (("6818", "slurmd"), "is not a port"),
])
def test_a_config_gpuclusters_rules_cannot_cover_is_named(change: tuple[str, str], says: str) -> None:
    from gpucluster.slurm.ports import ConfigError

    with pytest.raises(ConfigError, match=says):
        ports_of(parse_config(CONFIG.replace(*change)), accounting=True)


def test_the_stacks_rules_are_the_default_ports() -> None:
    assert {(r.from_port, r.to_port) for r in slurm_rules(True)} == {
        (6817, 6817), (6818, 6818), (6819, 6819), (60001, 63000)}


# ----------------------------------------------------------------------------- planned


def test_both_checks_are_planned_on_a_slurm_stack_only(base_config: dict[str, Any]) -> None:
    from gpucluster.preflight import parse_stack_config

    ids = [c.id for c in plan_checks(slurm_spec(base_config), Clients(REGION), HERE)]
    assert ids[-2:] == ["slurm-nodes", "slurm-ports"]
    base_config.pop("gpucluster:scheduler")
    plain = parse_stack_config(base_config, stack="test")
    assert not {"slurm-nodes", "slurm-ports"} & {c.id for c in plan_checks(plain, Clients(REGION), HERE)}


# ----------------------------------------------------------------------------- nodes registered


def nodes_check(account: dict[str, Any], slurm: Any, ssm: Any = None, now: datetime = LATER) -> Any:
    made = {"ssm": ssm} if ssm is not None else {}
    return run_with(account, slurm, lambda d: check_nodes_registered(d, now=now), **made)


def test_every_running_compute_instance_is_in_sinfo(base_config: dict[str, Any],
                                                    account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login = login_node(slurm.identity)
    nodes = [compute_node(slurm.identity) for _ in range(2)]
    ssm, sent = ssm_answering(("Success", 0, sinfo(*(n["PrivateIpAddress"] for n in nodes))))
    found = nodes_check(account, slurm, ssm)
    assert found.result == "pass", found
    assert found.detail.startswith("2 running compute instance(s) registered")
    assert sent[0]["InstanceIds"] == [login]
    assert "sinfo --noheader --Node" in decoded(sent[0]["Parameters"]["commands"][0])


def test_an_instance_missing_from_sinfo_past_the_grace_fails(base_config: dict[str, Any],
                                                             account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    registered, lost = compute_node(slurm.identity), compute_node(slurm.identity, "infer")
    ssm, _ = ssm_answering(("Success", 0, sinfo(registered["PrivateIpAddress"])))
    found = nodes_check(account, slurm, ssm)
    assert found.result == "fail" and found.remedy and "PCS endpoint" in found.remedy
    assert f"{lost['InstanceId']} ({lost['PrivateIpAddress']}, infer, up " in found.detail
    assert registered["InstanceId"] not in found.detail


def test_an_instance_still_booting_is_counted_not_failed(base_config: dict[str, Any],
                                                         account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    compute_node(slurm.identity)
    ssm, _ = ssm_answering(("Success", 0, ""))
    found = nodes_check(account, slurm, ssm, now=datetime.now(UTC) + REGISTER_GRACE / 2)
    assert found.result == "pass" and "1 launched under 10 min ago, not yet" in found.detail


def test_no_compute_instance_asks_the_login_node_nothing(base_config: dict[str, Any],
                                                         account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)  # the login node is no Slurm node: never counted
    ssm, sent = ssm_answering()
    found = nodes_check(account, slurm, ssm)
    assert found.result == "pass" and "none to register" in found.detail and sent == []


@pytest.mark.parametrize("fault", ["AccessDenied"])
def test_a_login_node_that_cannot_be_asked_is_unknown(base_config: dict[str, Any], account: dict[str, Any],
                                                      fault: str) -> None:
    slurm = slurm_spec(base_config)
    compute_node(slurm.identity)
    assert nodes_check(account, slurm).result == "unknown"  # no login node at all
    login_node(slurm.identity)
    ssm, _ = ssm_answering(fault)
    assert_unknown(nodes_check(account, slurm, ssm), fault)
    ssm, _ = ssm_answering(("Failed", 1, ""))
    assert nodes_check(account, slurm, ssm).result == "unknown"
    ssm, _ = ssm_answering(("Success", 0, "not|sinfo\n"))
    assert_unknown(nodes_check(account, slurm, ssm), "sinfo's output")


# ----------------------------------------------------------------------------- ports


def ports_check(account: dict[str, Any], slurm: Any, ssm: Any) -> Any:
    return run_with(account, slurm, check_slurm_ports, ssm=ssm)


def test_slurms_ports_allowed_both_ways_pass(base_config: dict[str, Any],
                                             account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    security_groups(slurm.identity)
    ssm, sent = ssm_answering(("Success", 0, CONFIG))
    found = ports_check(account, slurm, ssm)
    assert found.result == "pass", found
    assert "slurmctld 6817, slurmd 6818, srun 60001-63000, slurmdbd 6819" in found.detail
    assert decoded(sent[0]["Parameters"]["commands"][0]).rstrip().endswith("scontrol show config")


@pytest.mark.parametrize(("skip", "missing"), [
    (("peer-srun-in",), "nodes in 60001-63000 (srun from Slurm nodes)"),
    (("ctld-out",), "nodes out 6817 (to slurmctld)"),
    (("dbd-in", "slurmd-in"), "cluster in 6819"),
])
def test_a_rule_missing_fails_naming_it(base_config: dict[str, Any], account: dict[str, Any],
                                        skip: tuple[str, ...], missing: str) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    security_groups(slurm.identity, skip=skip)
    ssm, _ = ssm_answering(("Success", 0, CONFIG))
    found = ports_check(account, slurm, ssm)
    assert found.result == "fail" and missing in found.detail and found.remedy, found


def test_a_slurm_on_other_ports_than_the_rules_fails(base_config: dict[str, Any],
                                                     account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    security_groups(slurm.identity)
    ssm, _ = ssm_answering(("Success", 0, CONFIG.replace("60001-63000", "40000-40100")))
    found = ports_check(account, slurm, ssm)
    assert found.result == "fail" and "srun 40000-40100" in found.detail
    assert "nodes in 40000-40100 (srun from Slurm nodes)" in found.detail
    ssm, _ = ssm_answering(("Success", 0, CONFIG.replace("60001-63000", "0-0")))
    found = ports_check(account, slurm, ssm)
    assert found.result == "fail" and "SrunPortRange is not set" in found.detail


def test_security_groups_not_found_once_are_unknown(base_config: dict[str, Any],
                                                    account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    ssm, _ = ssm_answering(("Success", 0, CONFIG))
    assert_unknown(ports_check(account, slurm, ssm), "0 security groups")


def test_a_refused_security_group_read_is_unknown(base_config: dict[str, Any],
                                                  account: dict[str, Any]) -> None:
    slurm = slurm_spec(base_config)
    login_node(slurm.identity)
    security_groups(slurm.identity)
    ssm, _ = ssm_answering(("Success", 0, CONFIG))
    ec2 = boto3.client("ec2", region_name=REGION)
    operation = "DescribeSecurityGroupRules"
    inject(ec2, operation, client_error("UnauthorizedOperation", operation))
    assert_unknown(run_with(account, slurm, check_slurm_ports, ssm=ssm, ec2=ec2), "UnauthorizedOperation")

