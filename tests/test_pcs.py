"""A Slurm stack (`scheduler: {type: slurm}`) as AWS PCS: the cluster, a compute node group per node group on
that group's own launch template, a queue per group, the login group, the Slurm security group rules, node
roles under /aws-pcs/, and no Auto Scaling group; a `type: none` stack never loads pulumi-aws-native.

The Slurm variant of prod is built here from stacks/Pulumi.prod.yaml: scheduler slurm with an AMI, health
checks on as in prod (AWS PCS takes the user data as a MIME multi-part document, a third larger than the
gzipped script: it fits because the node scripts come from the stack's bucket, not the user data).
"""

from __future__ import annotations

import base64
import email
import gzip
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import fresh_plans
from base_config import base, plan_config
from gpucluster.aws.children import pcs_purchase_option
from gpucluster.aws.pcs import cluster_slurm_configuration, pcs_cluster_name
from gpucluster.cli import app
from gpucluster.node.multipart import (
    BOUNDARY,
    PAYLOAD_END,
    PCS_USER_DATA_BYTES,
    encode_multipart_user_data,
    multipart_document,
    multipart_size,
    self_extracting,
)
from gpucluster.noderole import PCS_REGISTER_ACTION, health_policy_document
from gpucluster.plan import Plan, PlannedResource
from gpucluster.preflight import parse_stack_config
from gpucluster.slurm.ports import SLURMCTLD_PORT, SLURMD_PORT, SLURMDBD_PORT, SRUN_PORTS, slurm_rules
from gpucluster.spec import SpecError
from shipped import planned_config

REPO = Path(__file__).resolve().parent.parent
AMI = "ami-0123456789abcdef0"
CLOUD_CONTROL = "aws:cloudcontrol/resource:Resource"
NODE_GROUP = "aws-native:pcs:ComputeNodeGroup"
QUEUE = "aws-native:pcs:Queue"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def prod_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "stacks" / "Pulumi.prod.yaml").read_text())["config"]


def slurm_prod() -> dict[str, Any]:
    config = prod_config()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AMI}
    return config


@pytest.fixture(scope="module")
def plan() -> Plan:
    return planned_config(slurm_prod(), stack="prod")


def cluster_of(plan: Plan) -> tuple[PlannedResource, dict[str, Any]]:
    """The one AWS::PCS::Cluster and the document Cloud Control is given."""
    [cluster] = [r for r in plan.of_type(CLOUD_CONTROL) if r.inputs["typeName"] == "AWS::PCS::Cluster"]
    return cluster, json.loads(cluster.inputs["desiredState"])


def one(plan: Plan, typ: str, name: str) -> PlannedResource:
    [found] = [r for r in plan.of_type(typ) if r.name == name]
    return found


def mock_id(r: PlannedResource) -> str:
    return f"{r.name}-id"  # what the plan's mocks give a resource as its id


def decode_user_data(encoded: str) -> email.message.Message:
    document = base64.b64decode(encoded).decode()
    message = email.message_from_string(document)
    assert message.is_multipart() and message.get_content_type() == "multipart/mixed"
    return message


def script_of(message: email.message.Message) -> str:
    """The bootstrap the document's one part carries: read out of the self-extracting wrapper as bash
    would (the quoted here-document between the markers, base64, gunzip)."""
    [part] = [p for p in message.walk() if not p.is_multipart()]
    assert part.get_content_type() == "text/x-shellscript"  # a type the PCS guide documents; no gzip part
    wrapper: str = part.get_payload(decode=True).decode()
    assert wrapper.startswith("#!/bin/bash\n") and wrapper.endswith('exec bash "$bootstrap"\n')
    lines = wrapper.splitlines()
    opening = f"<<'{PAYLOAD_END}' | gunzip > \"$bootstrap\""
    start = lines.index(next(line for line in lines if line.endswith(opening)))
    payload = "".join(lines[start + 1:lines.index(PAYLOAD_END)])
    return gzip.decompress(base64.b64decode(payload)).decode()


def test_the_self_extracting_part_runs_the_bootstrap_with_its_exit_status(tmp_path: Path) -> None:
    """The wrapper under bash: the carried script runs (from a file it writes), its output and status are
    the script's. /run is swapped for a temporary folder (mktemp's template) so nothing outside is touched."""
    script = "#!/bin/bash\necho \"bootstrap ran: $0\"\nexit 3\n"
    wrapper = self_extracting(script).replace("/run/gpucluster-bootstrap", f"{tmp_path}/gpucluster-bootstrap")
    ran = subprocess.run(["bash", "-c", wrapper], capture_output=True, text=True, check=False)
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout.startswith(f"bootstrap ran: {tmp_path}/gpucluster-bootstrap.")


# ------------------------------------------------------------------------------ pure parts


def test_slurm_rules_open_only_slurms_ports_between_the_controller_and_the_nodes() -> None:
    rules = {(r.group, r.direction, r.from_port, r.to_port, r.peer) for r in slurm_rules(accounting=True)}
    lo, hi = SRUN_PORTS
    assert rules == {
        ("cluster", "in", 6817, 6817, "nodes"), ("nodes", "out", 6817, 6817, "cluster"),
        ("cluster", "out", 6818, 6818, "nodes"), ("nodes", "in", 6818, 6818, "cluster"),
        ("cluster", "out", lo, hi, "nodes"), ("nodes", "in", lo, hi, "cluster"),
        ("nodes", "in", 6818, 6818, "nodes"), ("nodes", "out", 6818, 6818, "nodes"),
        ("nodes", "in", lo, hi, "nodes"), ("nodes", "out", lo, hi, "nodes"),
        ("cluster", "in", 6819, 6819, "nodes"), ("nodes", "out", 6819, 6819, "cluster"),
    }
    assert (SLURMCTLD_PORT, SLURMD_PORT, SLURMDBD_PORT, SRUN_PORTS) == (6817, 6818, 6819, (60001, 63000))
    without = slurm_rules(accounting=False)
    assert len(without) == 10 and SLURMDBD_PORT not in {r.from_port for r in without}


def test_cluster_slurm_configuration_names_cloudformations_keys() -> None:
    assert cluster_slurm_configuration(120, True) == {
        "Accounting": {"Mode": "STANDARD"}, "ScaleDownIdleTimeInSeconds": 7200}
    # No autostop: PCS's own idle time (no key at all); accounting off is said, not left out.
    assert cluster_slurm_configuration(None, False) == {"Accounting": {"Mode": "NONE"}}


@pytest.mark.parametrize(("market", "spot", "option"), [
    ("mixed", 0, "ONDEMAND"), ("mixed", 100, "SPOT"), ("capacity_block", 0, "CAPACITY_BLOCK")])
def test_purchase_option(market: str, spot: float, option: str) -> None:
    assert pcs_purchase_option(market, spot) == option


@pytest.mark.parametrize("script", ["#!/bin/bash\necho hi\n", "#!/bin/bash\n" + "x" * 14_000 + "\n",
                                    "".join(chr(32 + i % 90) for i in range(14_000)) + "\n"])
def test_multipart_document_is_mime_cloud_init_reads_and_its_size_is_known_in_advance(script: str) -> None:
    document = multipart_document(script)
    assert len(document.encode()) == multipart_size(script)
    # The PCS guide's shape: a text/x-shellscript part, a blank line before the closing boundary.
    assert document.endswith(f"\n\n--{BOUNDARY}--\n") and "application/x-gzip" not in document
    assert script_of(email.message_from_string(document)) == script
    assert multipart_document(script) == document  # the same bytes every time
    encoded = encode_multipart_user_data(script, 16384)
    assert script_of(decode_user_data(encoded)) == script


def test_multipart_user_data_past_the_limit_is_refused() -> None:
    big = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(1500))  # gzips to half
    with pytest.raises(ValueError, match="MIME multi-part"):
        encode_multipart_user_data(big, 16384 - PCS_USER_DATA_BYTES)
    # Carried gzipped: a script over the limit as text fits when it compresses (as the Auto Scaling path's).
    fits_gzipped = "#!/bin/bash\n" + "echo 0123456789\n" * 1000
    assert len(fits_gzipped) > 16384 - PCS_USER_DATA_BYTES > multipart_size(fits_gzipped)
    encoded = encode_multipart_user_data(fits_gzipped, 16384 - PCS_USER_DATA_BYTES)
    assert script_of(decode_user_data(encoded)) == fits_gzipped


def test_a_script_holding_the_boundary_is_refused() -> None:
    with pytest.raises(ValueError, match="MIME boundary"):
        multipart_document(f"#!/bin/bash\necho '--{BOUNDARY}'\n")


def test_health_policy_without_an_auto_scaling_group_names_no_group() -> None:
    kept = dict(identity="org/p/s/c", group="g", namespace="gpucluster/c", region="us-east-1", replace=True,
                topic_arn="arn:aws:sns:us-east-1:111122223333:t")
    sids = [s["Sid"] for s in health_policy_document(asg_arn="", **kept)["Statement"]]
    assert sids == ["CountHealthEvents", "NotifyStackTopic"]
    asg = "arn:aws:autoscaling:us-east-1:111122223333:autoScalingGroup:x:autoScalingGroupName/g"
    assert [s["Sid"] for s in health_policy_document(asg_arn=asg, **kept)["Statement"]] == [
        "FindOwnGroup", "ReportOwnHealth", "CountHealthEvents", "NotifyStackTopic"]


# ------------------------------------------------------------------------ spec: PCS limits


def slurm_base() -> dict[str, Any]:
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AMI}
    return config


def test_a_group_name_too_short_for_pcs_is_refused_on_a_slurm_stack_only() -> None:
    config = slurm_base()
    config["gpucluster:node_groups"][0]["name"] = "gp"
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    [finding] = err.value.findings
    assert finding.path == "node_groups[0].name" and "at least 3" in finding.message
    del config["gpucluster:scheduler"]
    assert parse_stack_config(config, stack="t").node_groups[0].name == "gp"


def test_a_spot_strategy_pcs_lacks_is_refused() -> None:
    config = slurm_base()
    capacity = config["gpucluster:node_groups"][0]["capacity"]
    capacity["spot_allocation_strategy"] = "capacity-optimized-prioritized"
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    [finding] = err.value.findings
    assert finding.path == "node_groups[0].capacity.spot_allocation_strategy"


def test_prod_with_health_checks_fits_as_a_mime_document() -> None:
    """The node scripts come from the stack's bucket (issue 27): the user data PCS takes, a MIME
    multi-part document with room left for the part PCS adds, fits with prod's health checks on."""
    from gpucluster.preflight import user_data_size
    assert list(user_data_size(parse_stack_config(slurm_prod(), stack="prod"))) == []


# --------------------------------------------------------------- the Slurm variant of prod


def test_one_pcs_cluster_with_the_scheduler_section(plan: Plan) -> None:
    cluster, inputs = cluster_of(plan)
    assert cluster.name == "gpu-prod-pcs"  # the logical name, as the aws-native cluster had
    assert inputs["Scheduler"] == {"Type": "SLURM", "Version": "25.05"}
    assert inputs["Size"] == "SMALL"
    assert inputs["SlurmConfiguration"] == {"Accounting": {"Mode": "STANDARD"},
                                            "ScaleDownIdleTimeInSeconds": 1800}  # prod: idle_minutes 30
    controller = one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-prod-pcs-controller")
    subnet = one(plan, "aws:ec2/subnet:Subnet", "gpu-prod-network-private-us-east-1d")
    assert inputs["Networking"] == {"NetworkType": "IPV4", "SecurityGroupIds": [mock_id(controller)],
                                    "SubnetIds": [mock_id(subnet)]}
    assert inputs["Tags"]["gpucluster:stack"] == plan.spec.identity
    assert inputs["Tags"]["owner"] == "ml-training"
    assert inputs["Name"] == pcs_cluster_name("gpu-prod-pcs", plan.spec.identity)
    assert re.fullmatch(r"gpu-prod-pcs-[0-9a-f]{8}", inputs["Name"])  # two stacks named alike stay apart
    assert plan.outputs["pcs_cluster_id"].startswith("pcs_")


def test_each_node_group_is_a_compute_node_group_on_its_own_launch_template(plan: Plan) -> None:
    groups = {r.inputs["name"]: r for r in plan.of_type(NODE_GROUP)}
    assert set(groups) == {"h100-train", "eval", "login"}
    subnet = mock_id(one(plan, "aws:ec2/subnet:Subnet", "gpu-prod-network-private-us-east-1d"))
    expected = {"h100-train": ("ONDEMAND", 4, 16, ["p5.48xlarge"], "gpu-prod-node-identity"),
                "eval": ("SPOT", 0, 4, ["g6e.12xlarge"], "gpu-prod-eval-node")}
    for name, (option, low, high, types, identity) in expected.items():
        inputs = groups[name].inputs
        template = one(plan, TEMPLATE, f"gpu-prod-{name}-lt")
        assert inputs["customLaunchTemplate"] == {"templateId": mock_id(template), "version": "1"}
        assert groups[name].property_dependencies["customLaunchTemplate"] == (template.urn,)
        profile = one(plan, "aws:iam/instanceProfile:InstanceProfile", f"{identity}-profile")
        assert inputs["iamInstanceProfileArn"] == f"arn:aws:iam:us-east-1:123456789012:{profile.name}"
        assert profile.inputs["path"] == "/aws-pcs/"
        role = one(plan, "aws:iam/role:Role", f"{identity}-role")
        assert role.inputs["path"] == "/aws-pcs/"
        policy = json.loads(one(plan, "aws:iam/rolePolicy:RolePolicy", f"{identity}-pcs").inputs["policy"])
        assert [s["Action"] for s in policy["Statement"]] == [[PCS_REGISTER_ACTION]]
        assert inputs["purchaseOption"] == option
        assert inputs["scalingConfiguration"] == {"minInstanceCount": low, "maxInstanceCount": high}
        assert inputs["instanceConfigs"] == [{"instanceType": t} for t in types]
        assert inputs["subnetIds"] == [subnet]
        assert inputs["amiId"] == AMI
        assert inputs["clusterId"] == plan.outputs["pcs_cluster_id"]
        assert inputs["tags"]["gpucluster:node-group"] == name
        assert plan.outputs["node_groups"][name]["pcs_compute_node_group_id"].startswith("pcs_")
        assert "asg_name" not in plan.outputs["node_groups"][name]
        assert groups[name].ignore_changes == ("scalingConfiguration",)  # the guardrails' after creation
    assert groups["login"].ignore_changes == ()
    assert groups["eval"].inputs["spotOptions"] == {"allocationStrategy": "price-capacity-optimized"}
    assert "spotOptions" not in groups["h100-train"].inputs


def test_a_slurm_stacks_launch_templates_carry_what_pcs_needs(plan: Plan) -> None:
    nodes_sg = mock_id(one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-prod-pcs-nodes"))
    placement = one(plan, "aws:ec2/placementGroup:PlacementGroup", "gpu-prod-network-h100-train-placement")
    for name in ("h100-train", "eval"):
        inputs = one(plan, TEMPLATE, f"gpu-prod-{name}-lt").inputs
        own = mock_id(one(plan, "aws:ec2/securityGroup:SecurityGroup", f"gpu-prod-network-{name}-nodes"))
        # PCS passes the instance profile and the type itself; groups go on every interface.
        assert "iamInstanceProfile" not in inputs and "instanceType" not in inputs
        assert all(nic["securityGroups"] == [own, nodes_sg] for nic in inputs["networkInterfaces"])
        assert all(nic["associatePublicIpAddress"] == "false" for nic in inputs["networkInterfaces"])
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["imageId"] == AMI
        assert script_of(decode_user_data(inputs["userData"])).startswith("#!")
    h100 = one(plan, TEMPLATE, "gpu-prod-h100-train-lt").inputs
    assert len(h100["networkInterfaces"]) == 32  # p5.48xlarge: its EFA interfaces stay
    assert h100["placement"]["groupName"].startswith(placement.name)  # its physical (generated) name
    depends = one(plan, TEMPLATE, "gpu-prod-h100-train-lt").property_dependencies
    assert depends["placement"] == (placement.urn,)
    assert "placement" not in one(plan, TEMPLATE, "gpu-prod-eval-lt").inputs


def test_one_queue_per_node_group_on_its_compute_node_group(plan: Plan) -> None:
    queues = {r.inputs["name"]: r for r in plan.of_type(QUEUE)}
    assert set(queues) == {"h100-train", "eval"}  # the login group has none
    for name, queue in queues.items():
        group_id = plan.outputs["node_groups"][name]["pcs_compute_node_group_id"]
        assert queue.inputs["computeNodeGroupConfigurations"] == [{"computeNodeGroupId": group_id}]
        assert queue.inputs["clusterId"] == plan.outputs["pcs_cluster_id"]
        assert queue.inputs["tags"]["gpucluster:stack"] == plan.spec.identity


def test_the_login_group_has_no_gpus_no_queue_no_ssh_and_no_public_address(plan: Plan) -> None:
    login = next(r for r in plan.of_type(NODE_GROUP) if r.inputs["name"] == "login")
    assert login.inputs["instanceConfigs"] == [{"instanceType": "m7i.large"}]
    assert login.inputs["scalingConfiguration"] == {"minInstanceCount": 1, "maxInstanceCount": 1}
    assert login.inputs["purchaseOption"] == "ONDEMAND"
    template = one(plan, TEMPLATE, "gpu-prod-pcs-login-lt")
    assert login.inputs["customLaunchTemplate"] == {"templateId": mock_id(template), "version": "1"}
    inputs = template.inputs
    assert inputs["metadataOptions"]["httpTokens"] == "required"
    assert "keyName" not in inputs and "instanceType" not in inputs
    [nic] = inputs["networkInterfaces"]
    assert nic["associatePublicIpAddress"] == "false"
    assert inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    assert inputs["tagSpecifications"][0]["tags"]["gpucluster:node-group"] == "login"
    script = script_of(decode_user_data(inputs["userData"]))
    assert "amazon-ssm-agent" in script and "disable --now ssh" in script
    login_sg = one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-prod-pcs-login")
    assert not [r for r in plan.of_type(INGRESS) if r.inputs["securityGroupId"] == mock_id(login_sg)]
    assert {r.inputs["fromPort"] for r in plan.of_type(EGRESS)
            if r.inputs["securityGroupId"] == mock_id(login_sg)} == {443, 80}
    role = one(plan, "aws:iam/role:Role", "gpu-prod-pcs-login-role")
    assert role.inputs["path"] == "/aws-pcs/"


def test_no_auto_scaling_group_and_nothing_that_needs_one(plan: Plan) -> None:
    kinds = {r.type for r in plan.resources}
    assert not {k for k in kinds if k.startswith("aws:autoscaling/")}
    assert not [r for r in plan.resources if r.type == "pulumi:providers:aws" and "asg-provider" in r.name]
    assert plan.of_type(TEMPLATE) and plan.of_type("aws:ec2/placementGroup:PlacementGroup")


def test_the_slurm_security_group_rules(plan: Plan) -> None:
    sg = {name: mock_id(one(plan, "aws:ec2/securityGroup:SecurityGroup", f"gpu-prod-pcs-{name}"))
          for name in ("controller", "nodes")}
    by_id = {v: k for k, v in sg.items()}
    rules = {(r.type == INGRESS, by_id[r.inputs["securityGroupId"]], r.inputs["fromPort"], r.inputs["toPort"],
              by_id[r.inputs["referencedSecurityGroupId"]], r.inputs["ipProtocol"])
             for r in [*plan.of_type(INGRESS), *plan.of_type(EGRESS)]
             if r.inputs.get("securityGroupId") in by_id}
    ctl, nodes = "controller", "nodes"
    assert rules == {
        (True, ctl, 6817, 6817, nodes, "tcp"), (False, nodes, 6817, 6817, ctl, "tcp"),
        (False, ctl, 6818, 6818, nodes, "tcp"), (True, nodes, 6818, 6818, ctl, "tcp"),
        (False, ctl, 60001, 63000, nodes, "tcp"), (True, nodes, 60001, 63000, ctl, "tcp"),
        (True, nodes, 6818, 6818, nodes, "tcp"), (False, nodes, 6818, 6818, nodes, "tcp"),
        (True, nodes, 60001, 63000, nodes, "tcp"), (False, nodes, 60001, 63000, nodes, "tcp"),
        (True, ctl, 6819, 6819, nodes, "tcp"), (False, nodes, 6819, 6819, ctl, "tcp"),
    }
    # Nothing reaches the controller or the Slurm nodes from an address range.
    assert not [r for r in plan.of_type(INGRESS) if r.inputs.get("securityGroupId") in by_id
                and "cidrIpv4" in r.inputs]
    # EFA's all-traffic-within-the-group stays on the group's own security group.
    own = mock_id(one(plan, "aws:ec2/securityGroup:SecurityGroup", "gpu-prod-network-h100-train-nodes"))
    assert [r.inputs["ipProtocol"] for r in plan.of_type(INGRESS) if r.inputs["securityGroupId"] == own
            and r.inputs.get("referencedSecurityGroupId") == own] == ["-1"]


def test_the_cluster_waits_for_its_rules(plan: Plan) -> None:
    cluster, _ = cluster_of(plan)
    rules = {r.urn for r in [*plan.of_type(INGRESS), *plan.of_type(EGRESS)]
             if r.name.startswith("gpu-prod-pcs-") and "-login-" not in r.name}
    assert len(rules) == 12 and rules <= set(cluster.dependency_urns)


def test_guardrails_and_dashboard_still_plan_on_a_slurm_stack(plan: Plan) -> None:
    # Until the guardrails have a PCS backend (issue 28 item 4) they are handed the compute node groups.
    assert plan.outputs["function_names"]
    assert "job_restart" not in plan.outputs["function_names"]  # no Auto Scaling group to watch


def test_accounting_off_and_autostop_off() -> None:
    config = slurm_base()
    config["gpucluster:scheduler"] |= {"accounting": False, "size": "medium", "slurm_version": "24.11",
                                       "login": {"count": 2}}
    result = plan_config(config)
    _, document = cluster_of(result)
    assert document["SlurmConfiguration"] == {"Accounting": {"Mode": "NONE"}}
    assert (document["Size"], document["Scheduler"]["Version"]) == ("MEDIUM", "24.11")
    login = next(r for r in result.of_type(NODE_GROUP) if r.inputs["name"] == "login")
    assert login.inputs["scalingConfiguration"] == {"minInstanceCount": 2, "maxInstanceCount": 2}
    assert login.inputs["instanceConfigs"] == [{"instanceType": "m7i.large"}]
    assert login.inputs["amiId"] == AMI  # scheduler.ami_id: the login group's only image with the PCS agent
    ports = {r.inputs.get("fromPort") for r in [*result.of_type(INGRESS), *result.of_type(EGRESS)]}
    assert 6819 not in ports
    [gpu] = [r for r in result.of_type(NODE_GROUP) if r.inputs["name"] == "gpu"]
    # base: two zones, the group in both; the controller in the first.
    assert len(gpu.inputs["subnetIds"]) == 2
    assert len(document["Networking"]["SubnetIds"]) == 1


def test_a_capacity_block_group_launches_into_its_block() -> None:
    config = slurm_base()
    config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    config["gpucluster:node_groups"][0] |= {
        "instance_types": ["p5.48xlarge"], "min_nodes": 2, "desired_nodes": 2, "max_nodes": 2, "efa": "on",
        "capacity": {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                     "duration_hours": 24, "instance_count": 2}}
    result = plan_config(config)
    [gpu] = [r for r in result.of_type(NODE_GROUP) if r.inputs["name"] == "gpu"]
    assert gpu.inputs["purchaseOption"] == "CAPACITY_BLOCK"
    assert gpu.inputs["scalingConfiguration"] == {"minInstanceCount": 2, "maxInstanceCount": 2}
    template = one(result, TEMPLATE, "test-gpu-lt").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert "placement" not in template  # a block is placed already


def test_an_on_demand_group_with_a_reservation_targets_it_from_its_template() -> None:
    config = slurm_base()
    config["gpucluster:node_groups"][0] |= {"availability_zones": ["us-east-1a"], "capacity": {
        "capacity_reservation_id": "cr-0123456789abcdef0", "on_demand_base": 1}}
    result = plan_config(config)
    template = one(result, TEMPLATE, "test-gpu-lt").inputs
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}


def test_gpucluster_pcs_is_none_without_slurm_and_the_contract_with_it() -> None:
    from gpucluster.aws.cluster import GpuCluster
    from gpucluster.plan import record_resources
    from gpucluster.stack import cluster_args

    def build(config: dict[str, Any]) -> None:
        import pulumi
        spec = parse_stack_config(config, stack="t")
        cluster = GpuCluster(spec.cluster.name, cluster_args(spec))
        pulumi.export("pcs", None if cluster.pcs is None else {
            "cluster_id": cluster.pcs.cluster_id, "cluster_arn": cluster.pcs.cluster_arn,
            "node_group_ids": cluster.pcs.node_group_ids})

    _, outputs = record_resources(lambda: build(base()), stack="t")
    assert outputs["pcs"] is None
    _, outputs = record_resources(lambda: build(slurm_base()), stack="t")
    pcs = outputs["pcs"]
    assert pcs["cluster_id"].startswith("pcs_") and pcs["cluster_arn"].startswith("arn:aws:pcs:")
    assert set(pcs["node_group_ids"]) == {"gpu", "login"}


# ------------------------------------------------------------------ the CLI, the import


def test_gpucluster_plan_prints_the_pcs_resources_and_no_policy_violation(write_stack: Any,
                                                                            cli_plans_once: None) -> None:
    path = write_stack(slurm_prod(), "prod")
    result = CliRunner().invoke(app, ["plan", str(path), "--tree"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "policies: no violations" in out
    assert ("slurm: AWS PCS cluster, Slurm 25.05, small, accounting on; queues eval, h100-train; login 1 x "
            "m7i.large (no queue)") in " ".join(out.split())
    for line in ("cloudcontrol.Resource  gpu-prod-pcs", "pcs.ComputeNodeGroup  gpu-prod-pcs-h100-train",
                 "pcs.ComputeNodeGroup  gpu-prod-pcs-login", "pcs.Queue  gpu-prod-pcs-eval-queue"):
        assert line in out
    assert "autoscaling.Group" not in out


@pytest.mark.parametrize(("slurm", "loaded"), [(False, "0"), (True, "1")])
def test_only_a_slurm_stack_loads_pulumi_aws_native(slurm: bool, loaded: str) -> None:
    """In a fresh process (one for every case of tests/fresh_plans.py, which plans them in turn)."""
    case = "slurm" if slurm else "plain"
    assert fresh_plans.CASES[case] == (slurm_base() if slurm else base())
    seen = fresh_plans.loaded(case)
    assert "pulumi_aws_native" not in seen.before  # what is loaded after the plan is what the plan loaded
    assert str(int("pulumi_aws_native" in seen.after)) == loaded


def test_the_guardrails_act_on_this_pcs_cluster_and_nothing_of_auto_scaling(plan: Plan) -> None:
    """GpuCluster hands its PCS cluster to the guardrails: the stopping Lambdas get PCS_CLUSTER_ID and
    pcs: statements on its compute node groups (never login), and no Auto Scaling write at all."""
    functions = {f.inputs["name"]: f.inputs["environment"]["variables"]
                 for f in plan.of_type("aws:lambda/function:Function")}
    stoppers = {n: env for n, env in functions.items()
                if n.endswith(("-budget-action", "-autostop", "-spend-guard"))}
    assert len(stoppers) == 3
    ids = {env["PCS_CLUSTER_ID"] for env in stoppers.values()}
    assert len(ids) == 1 and ids.pop().startswith("pcs_")
    for policy in plan.of_type("aws:iam/rolePolicy:RolePolicy"):
        if "guardrails" not in policy.name:
            continue
        statements = json.loads(policy.inputs["policy"])["Statement"]
        actions = [a for s in statements
                   for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
        writes = [a for a in actions
                  if a.startswith("autoscaling:") and not a.startswith("autoscaling:Describe")]
        assert writes == [], policy.name
        for s in statements:
            if s.get("Sid") == "PcsScaleThisClustersGroups":  # cluster + 2 GPU groups, no login
                assert len(s["Resource"]) == 3 and len(set(s["Resource"])) == 3
