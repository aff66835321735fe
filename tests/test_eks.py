"""An EKS stack (`scheduler: {type: eks}`): the control plane from raw `aws.eks.*`, its add-ons, system node
group and access entries, the GPU node groups as self-managed node groups (the EKS AL2023 NVIDIA AMI, the
nodeadm NodeConfig part ahead of the bootstrap, the autoscaler's tags, the drain hook), the Kubernetes
version's checks, the cost of the control plane and the system nodes, and the EKS policy rules.

The Kubernetes variant of prod is built here from stacks/Pulumi.prod.yaml as tests/test_pcs.py builds the
Slurm one: scheduler eks and a second availability zone (an EKS control plane needs two; the EFA group stays
in the first).
"""

from __future__ import annotations

import base64
import datetime as dt
import email
import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pytest
import yaml
from typer.testing import CliRunner

import fresh_plans
from base_config import base, plan_config
from gpucluster.aws import eks as eks_component
from gpucluster.catalog import eks as eks_catalog
from gpucluster.cli import app
from gpucluster.eks.naming import eks_cluster_name
from gpucluster.node.multipart import (
    BOUNDARY,
    EKS_NODE_CONFIG_BYTES,
    NODE_CONFIG_API_VERSION,
    NODE_CONFIG_CONTENT_TYPE,
    PAYLOAD_END,
    multipart_document,
    node_config,
)
from gpucluster.plan import Plan, PlannedResource
from gpucluster.policy.offline import check_plan, plan_records
from gpucluster.policy.records import Resource, Stack
from gpucluster.policy.rules import eks as eks_rules
from gpucluster.policy.rules.capacity import environment_limits
from gpucluster.preflight import parse_stack_config
from gpucluster.pricing import HOURS_PER_MONTH, PricingError, price_stack
from gpucluster.spec import SpecError
from gpucluster.spec.scheduler import eks_version_findings
from shipped import planned_config

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "aws:eks/cluster:Cluster"
ADDON = "aws:eks/addon:Addon"
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ASG = "aws:autoscaling/group:Group"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
K8S_PROVIDER = "pulumi:providers:kubernetes"
DAY = dt.date(2026, 11, 29)


def prod_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "stacks" / "Pulumi.prod.yaml").read_text())["config"]


def eks_prod() -> dict[str, Any]:
    """prod on Kubernetes: scheduler eks, a second zone for the control plane."""
    config = prod_config()
    config["gpucluster:network"]["availability_zones"] = ["us-east-1d", "us-east-1a"]
    config["gpucluster:scheduler"] = {"type": "eks", "teams": ["research", "eval"]}
    return config


@pytest.fixture(scope="module")
def plan() -> Plan:
    return planned_config(eks_prod(), stack="prod")


def one(plan: Plan, typ: str) -> PlannedResource:
    [found] = plan.of_type(typ)
    return found


def by_name(plan: Plan, typ: str, suffix: str) -> PlannedResource:
    [found] = [r for r in plan.of_type(typ) if r.name.endswith(suffix)]
    return found


# ------------------------------------------------------------------------------- control plane


def test_the_cluster_is_private_api_authenticated_encrypted_and_logs_everything(plan: Plan) -> None:
    cluster = one(plan, CLUSTER)
    spec = plan.spec
    inputs = cluster.inputs
    assert inputs["name"] == eks_cluster_name("gpu-prod", spec.identity)
    assert inputs["version"] == eks_catalog.default_version(eks_catalog.today()).version
    assert inputs["vpcConfig"]["endpointPrivateAccess"] is True
    assert inputs["vpcConfig"]["endpointPublicAccess"] is False
    assert len(inputs["vpcConfig"]["subnetIds"]) == 2  # the private subnet of each zone
    assert inputs["accessConfig"] == {"authenticationMode": "API",
                                      "bootstrapClusterCreatorAdminPermissions": True}
    [key] = [r for r in plan.of_type("aws:kms/key:Key") if r.name.endswith("-eks-secrets-key")]
    assert key.inputs["enableKeyRotation"] is True
    account = inputs["roleArn"].split(":")[4]
    assert inputs["encryptionConfig"] == {"resources": ["secrets"], "provider": {
        "keyArn": f"arn:aws:kms:us-east-1:{account}:{key.name}"}}
    assert inputs["enabledClusterLogTypes"] == ["api", "audit", "authenticator", "controllerManager",
                                                "scheduler"]
    assert inputs["bootstrapSelfManagedAddons"] is False
    # The log group EKS writes to exists first, with a retention.
    [logs] = [r for r in plan.of_type("aws:cloudwatch/logGroup:LogGroup") if r.name.endswith("-eks-logs")]
    assert logs.inputs["name"] == f"/aws/eks/{inputs['name']}/cluster" and logs.inputs["retentionInDays"] > 0
    assert plan.depends_on(cluster, logs)


def test_the_cluster_role_trusts_eks_and_may_use_the_secrets_key_only(plan: Plan) -> None:
    role = by_name(plan, "aws:iam/role:Role", "-eks-role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"},
                                   "Action": ["sts:AssumeRole", "sts:TagSession"]}]
    assert role.inputs["permissionsBoundary"].endswith(":policy/gpucluster-workload-boundary")
    policy = json.loads(by_name(plan, "aws:iam/rolePolicy:RolePolicy", "-eks-secrets").inputs["policy"])
    [statement] = policy["Statement"]
    assert statement["Resource"].endswith("-eks-secrets-key") and "kms:Decrypt" in statement["Action"]
    attached = {r.inputs["policyArn"].rsplit("/", 1)[1] for r in plan.of_type(
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment") if r.name.endswith("-eks-cluster")}
    assert attached == {"AmazonEKSClusterPolicy"}


def test_the_addons_and_their_order(plan: Plan) -> None:
    addons = {r.inputs["addonName"]: r for r in plan.of_type(ADDON)}
    assert set(addons) == {"vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent",
                           "eks-node-monitoring-agent"}
    cluster_name = one(plan, CLUSTER).inputs["name"]
    for addon in addons.values():
        assert addon.inputs["clusterName"] == cluster_name
        assert addon.inputs["resolveConflictsOnCreate"] == "OVERWRITE"
    assert json.loads(addons["vpc-cni"].inputs["configurationValues"]) == {
        "env": {"MINIMUM_IP_TARGET": "10", "WARM_IP_TARGET": "5"}}
    assert all("configurationValues" not in a.inputs for n, a in addons.items() if n != "vpc-cni")
    system = one(plan, NODE_GROUP)
    for name in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
        assert plan.depends_on(system, addons[name])  # nodes need a CNI to become Ready
    for name in ("coredns", "eks-node-monitoring-agent"):
        assert plan.depends_on(addons[name], system)  # their pods need nodes


def test_the_system_node_group_is_small_on_demand_and_without_gpus(plan: Plan) -> None:
    system = one(plan, NODE_GROUP).inputs
    assert system["instanceTypes"] == ["m7i.large"]
    assert system["capacityType"] == "ON_DEMAND"
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert system["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    assert system["labels"] == {"gpucluster.io/role": "system"}
    role = by_name(plan, "aws:iam/role:Role", "-eks-system-role")
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "ec2.amazonaws.com"}


def test_every_gpu_node_role_has_an_ec2_linux_access_entry(plan: Plan) -> None:
    entries = {r.name.rsplit("-", 2)[-2]: r.inputs for r in plan.of_type(ACCESS_ENTRY)}
    assert set(entries) == {"train", "eval"}  # h100-train -> "...-h100-train-nodes"
    roles = {r.name: r for r in plan.of_type("aws:iam/role:Role")}
    for entry in entries.values():
        assert entry["type"] == "EC2_LINUX"
        assert entry["clusterName"] == one(plan, CLUSTER).inputs["name"]
        assert any(entry["principalArn"].endswith(f":{name}") for name in roles)


def test_gpu_node_roles_may_join_the_cluster(plan: Plan) -> None:
    # NodeIdentity names its attachments <identity>-eks-worker/-eks-ecr/-eks-cni (aws/iam.py)
    attached = [r.inputs["policyArn"].rsplit("/", 1)[1]
                for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.name.endswith(("-eks-worker", "-eks-ecr", "-eks-cni"))
                and not r.name.startswith("gpu-prod-eks-system-")]
    assert sorted(attached) == sorted(2 * ["AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly",
                                           "AmazonEKS_CNI_Policy"])  # both GPU groups' roles


def test_the_kubernetes_provider_runs_aws_eks_get_token(plan: Plan) -> None:
    provider = one(plan, K8S_PROVIDER)
    config = json.loads(provider.inputs["kubeconfig"])
    name = one(plan, CLUSTER).inputs["name"]
    [user] = config["users"]
    assert user["user"]["exec"]["command"] == "aws"
    assert user["user"]["exec"]["args"] == ["eks", "get-token", "--cluster-name", name,
                                            "--region", "us-east-1", "--output", "json"]
    [cluster] = config["clusters"]
    assert cluster["cluster"]["server"].startswith("https://")
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]).startswith(b"-----BEGIN")
    assert set(user["user"]) == {"exec"}  # the token is made when used, never stored (no token key)


def test_the_stack_exports_the_cluster_and_the_kubeconfig_command(plan: Plan) -> None:
    name = one(plan, CLUSTER).inputs["name"]
    assert plan.outputs["eks_cluster_name"] == name
    assert plan.outputs["kubeconfig_command"] == f"aws eks update-kubeconfig --name {name} --region us-east-1"


def test_the_component_exposes_what_the_cluster_software_needs() -> None:
    names = eks_component.EksCluster.__annotations__
    assert {"cluster_name", "node_role_arn", "endpoint", "certificate_authority"} <= set(names)
    # k8s_provider is an attribute set in __init__ (a provider resource, not an output).
    source = Path(eks_component.__file__).read_text()
    assert "self.k8s_provider = k8s.Provider(" in source and "pulumi_eks" not in source


@pytest.mark.parametrize("cls", ["ClusterArgs", "ClusterVpcConfigArgs", "ClusterAccessConfigArgs",
                                 "ClusterEncryptionConfigArgs", "AddonArgs", "NodeGroupArgs",
                                 "NodeGroupScalingConfigArgs", "AccessEntryArgs"])
def test_the_component_builds_its_inputs_with_the_sdk_args_classes(cls: str) -> None:
    assert f"aws.eks.{cls}(" in Path(eks_component.__file__).read_text()
    assert hasattr(aws.eks, cls)


# ------------------------------------------------------------------------------- GPU node groups


def user_data_parts(template: PlannedResource) -> list[email.message.Message]:
    document = base64.b64decode(template.inputs["userData"]).decode()
    message = email.message_from_string(document)
    assert message.is_multipart()
    return list(message.get_payload())


def test_the_node_config_part_comes_first_and_names_the_cluster(plan: Plan) -> None:
    cluster = one(plan, CLUSTER).inputs
    for suffix, purchase in (("h100-train-lt", "on-demand"), ("eval-lt", "spot")):
        parts = user_data_parts(by_name(plan, TEMPLATE, suffix))
        assert [p.get_content_type() for p in parts] == [NODE_CONFIG_CONTENT_TYPE, "text/x-shellscript"]
        config = yaml.safe_load(parts[0].get_payload())
        assert config["apiVersion"] == NODE_CONFIG_API_VERSION == "node.eks.aws/v1alpha1"
        assert config["kind"] == "NodeConfig"
        spec = config["spec"]["cluster"]
        assert spec["name"] == cluster["name"]
        assert spec["apiServerEndpoint"].startswith("https://") and spec["cidr"] == "172.20.0.0/16"
        assert base64.b64decode(spec["certificateAuthority"]).startswith(b"-----BEGIN CERTIFICATE-----")
        group = suffix.removesuffix("-lt")
        assert config["spec"]["kubelet"]["flags"] == [
            f"--node-labels=gpucluster.io/group={group},gpucluster.io/purchase={purchase}",
            "--register-with-taints=nvidia.com/gpu=true:NoSchedule"]
        # our bundle's loader still runs, after nodeadm's part
        script = parts[1].get_payload()
        assert script.startswith("#!/bin/bash") and PAYLOAD_END in script


def test_gpu_nodes_boot_the_eks_nvidia_ami_of_the_version_on_amazon_linux_s_root_device(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The EKS parameter's image, and its root device as EC2 describes it (aws/amis.py: /dev/xvda on
    Amazon Linux 2023), answered here as SSM and EC2 would for the EKS AMI."""
    from gpucluster.plan import PlanMocks

    al2023, original = "ami-0bbbbbbbbbbbbbbb2", PlanMocks.call

    def call(self: PlanMocks, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:ssm/getParameter:getParameter" and "/eks/" in str(args.args.get("name")):
            return {"name": args.args["name"], "value": al2023, "type": "String", "id": args.args["name"]}
        if args.token == "aws:ec2/getAmi:getAmi" and args.args["filters"][0]["values"] == [al2023]:
            return {"id": al2023, "imageId": al2023, "rootDeviceName": "/dev/xvda"}
        return original(self, args)

    monkeypatch.setattr(PlanMocks, "call", call)
    eks_plan = plan_config(eks_prod(), stack="prod")
    template = by_name(eks_plan, TEMPLATE, "h100-train-lt").inputs
    assert template["imageId"] == al2023
    assert template["blockDeviceMappings"][0]["deviceName"] == "/dev/xvda"
    version = one(plan, CLUSTER).inputs["version"]
    assert eks_catalog.ami_parameter(version) == (
        f"/aws/service/eks/optimized-ami/{version}/amazon-linux-2023/x86_64/nvidia/recommended/image_id")
    # every interface carries the cluster's security group beside the group's own
    for nic in template["networkInterfaces"]:
        assert len(nic["securityGroups"]) == 2 and nic["securityGroups"][1].startswith("sg-")


def test_a_pinned_ami_is_kept_on_eks() -> None:
    config = eks_prod()
    config["gpucluster:node_groups"][1]["ami_id"] = "ami-0123456789abcdef0"
    plan = plan_config(config, stack="prod")
    template = by_name(plan, TEMPLATE, "eval-lt").inputs
    assert template["imageId"] == "ami-0123456789abcdef0"
    assert template["blockDeviceMappings"][0]["deviceName"] == "/dev/sda1"


def asg_tags(asg: PlannedResource) -> dict[str, tuple[str, bool]]:
    return {t["key"]: (t["value"], t["propagateAtLaunch"]) for t in asg.inputs["tags"]}


def test_the_auto_scaling_groups_carry_the_cluster_and_autoscaler_tags(plan: Plan) -> None:
    name = one(plan, CLUSTER).inputs["name"]
    train = asg_tags(by_name(plan, ASG, "h100-train-asg"))
    template = "k8s.io/cluster-autoscaler/node-template"
    assert train[f"kubernetes.io/cluster/{name}"] == ("owned", True)
    assert train["k8s.io/cluster-autoscaler/enabled"] == ("true", False)
    assert train[f"k8s.io/cluster-autoscaler/{name}"] == ("owned", False)
    assert train[f"{template}/label/gpucluster.io/group"] == ("h100-train", False)
    assert train[f"{template}/label/gpucluster.io/purchase"] == ("on-demand", False)
    assert train[f"{template}/taint/nvidia.com/gpu"] == ("true:NoSchedule", False)
    assert train[f"{template}/resources/nvidia.com/gpu"] == ("8", False)
    assert train[f"{template}/resources/vpc.amazonaws.com/efa"] == ("32", False)
    evaluation = asg_tags(by_name(plan, ASG, "eval-asg"))
    assert evaluation[f"{template}/resources/nvidia.com/gpu"] == ("4", False)
    assert f"{template}/resources/vpc.amazonaws.com/efa" not in evaluation  # no EFA
    assert evaluation[f"{template}/label/gpucluster.io/purchase"] == ("spot", False)
    # the configured maximum a guard's stop zeroes and a start puts back (fleet/asg.py)
    for asg in plan.of_type(ASG):
        assert asg_tags(asg)["gpucluster:max-nodes"] == (str(int(asg.inputs["maxSize"])), False), asg.name


def test_pulumi_owns_an_eks_group_s_maximum_only_at_creation(plan: Plan) -> None:
    """A guard's stop zeroes MaxSize on EKS: an update (or `--refresh`) must not put it back, so maxSize is
    ignored like desired and min; the configured maximum travels in the gpucluster:max-nodes tag."""
    for asg in plan.of_type(ASG):
        assert asg.ignore_changes == ("desiredCapacity", "minSize", "initialLifecycleHooks", "maxSize")
        assert asg_tags(asg)["gpucluster:max-nodes"][0] == str(int(asg.inputs["maxSize"]))


def mig_prod(mig: dict[str, Any]) -> dict[str, Any]:
    config = eks_prod()
    config["gpucluster:node_groups"][0]["mig"] = mig
    return config


@pytest.mark.parametrize(("mig", "strategy"), [
    ({"profile": "1g.10gb"}, "single"), ({"profiles": ["3g.40gb", "2g.20gb", "1g.10gb"]}, "mixed")])
def test_a_mig_group_s_autoscaler_tags_name_what_its_nodes_advertise(mig: dict[str, Any],
                                                                   strategy: str) -> None:
    """Under the GPU Operator's single strategy a MIG group's node advertises one nvidia.com/gpu per MIG
    instance, under mixed one nvidia.com/mig-<profile> per instance and no nvidia.com/gpu (ledger:
    eks-mig-advertised-resources): the node template says the same, and Kueue's quota is it x max_nodes."""
    from gpucluster.eks import queues

    config = mig_prod(mig)
    spec = parse_stack_config(config, stack="prod")
    assert queues.mig_strategy(spec) == strategy
    planned = plan_config(config, stack="prod")
    train = asg_tags(by_name(planned, ASG, "h100-train-asg"))
    template = "k8s.io/cluster-autoscaler/node-template/resources/"
    advertised = {k.removeprefix(template): int(v) for k, (v, _) in train.items()
                  if k.startswith(template) and k != f"{template}vpc.amazonaws.com/efa"}
    group = spec.node_groups[0]
    if strategy == "single":
        assert advertised == {"nvidia.com/gpu": 8 * 7}  # 7 x 1g.10gb on each of 8 H100s
    else:
        assert advertised == {"nvidia.com/gpu": 0, "nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 8,
                              "nvidia.com/mig-1g.10gb": 8}
    quota = queues.group_quota(group, strategy)
    assert {r: quota[r] for r in advertised} == {r: n * group.max_nodes for r, n in advertised.items()}
    evaluation = asg_tags(by_name(planned, ASG, "eval-asg"))
    assert evaluation[f"{template}nvidia.com/gpu"][0] == "4"  # MIG off there: whole GPUs


def test_each_gpu_group_has_a_drain_hook_before_scale_in(plan: Plan) -> None:
    hooks = [r for r in plan.of_type(HOOK) if r.name.endswith("-drain")]
    assert len(hooks) == 2
    for hook in hooks:
        assert hook.inputs["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
        assert hook.inputs["defaultResult"] == "CONTINUE" and hook.inputs["name"] == "gpucluster-drain"


def test_the_guardrails_act_on_the_same_auto_scaling_groups(plan: Plan) -> None:
    asgs = {r.urn for r in plan.of_type(ASG)}
    assert len(asgs) == 2  # no PCS, no managed GPU node group: the guards' seam is unchanged
    assert "restart" not in json.dumps(plan.outputs.get("function_names", {}))


def test_a_capacity_block_group_still_scales_to_zero_before_the_block_ends() -> None:
    config = eks_prod()
    config["gpucluster:node_groups"][0]["capacity"] = {
        "market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0", "instance_count": 4}
    config["gpucluster:node_groups"][0]["placement_group"] = False
    config["gpucluster:node_groups"][0]["min_nodes"] = 0
    config["gpucluster:node_groups"][0]["desired_nodes"] = 4
    config["gpucluster:node_groups"][0]["max_nodes"] = 4
    plan = plan_config(config, stack="prod")
    assert "capacity_block" in plan.outputs["function_names"]
    train = asg_tags(by_name(plan, ASG, "h100-train-asg"))
    assert train["k8s.io/cluster-autoscaler/node-template/label/gpucluster.io/purchase"] == (
        "capacity-block", False)


# --------------------------------------------------------------------------- the NodeConfig part, pure


def test_the_node_config_part_parses_back_and_the_bundle_follows() -> None:
    document = node_config(cluster_name="c-1", endpoint="https://x.eks.amazonaws.com",
                           certificate_authority="Q0E=", cidr="10.100.0.0/16",
                           labels={"gpucluster.io/group": "g", "gpucluster.io/purchase": "spot"})
    mime = multipart_document("#!/bin/bash\necho hi\n", document)
    assert mime.index(NODE_CONFIG_CONTENT_TYPE) < mime.index("text/x-shellscript")
    assert mime.endswith(f"\n--{BOUNDARY}--\n")
    parts = list(email.message_from_string(mime).get_payload())
    parsed = yaml.safe_load(parts[0].get_payload())
    assert parsed["spec"]["cluster"] == {"name": "c-1", "apiServerEndpoint": "https://x.eks.amazonaws.com",
                                         "certificateAuthority": "Q0E=", "cidr": "10.100.0.0/16"}
    # without a NodeConfig (AWS PCS) the document is the one part it always was
    assert multipart_document("#!/bin/bash\necho hi\n").count("Content-Type: text/") == 1


def test_the_room_kept_for_the_node_config_holds_a_long_ca() -> None:
    endpoint = "https://" + "A" * 32 + ".gr7.us-east-1.eks.amazonaws.com"
    labels = {"gpucluster.io/group": "g" * 24, "gpucluster.io/purchase": "capacity-block"}
    document = node_config(cluster_name="c" * 33, endpoint=endpoint, certificate_authority="Q" * 2000,
                           cidr="172.20.0.0/16", labels=labels)
    part = f"--{BOUNDARY}\nContent-Type: {NODE_CONFIG_CONTENT_TYPE}\n\n{document}\n"
    assert len(part.encode()) < EKS_NODE_CONFIG_BYTES


# ------------------------------------------------------------------------------- spec


def test_an_unknown_version_is_one_finding_naming_the_key() -> None:
    findings = list(eks_version_findings("1.19", "us-east-1", DAY))
    assert [(f.path, f.level) for f in findings] == [("scheduler.kubernetes_version", "error")]
    config = base()
    config["gpucluster:scheduler"] = {"type": "eks", "kubernetes_version": "1.19"}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert [f.path for f in err.value.findings] == ["scheduler.kubernetes_version"]


def test_an_ended_version_is_refused_and_an_extended_one_warns_with_its_price() -> None:
    [ended] = eks_version_findings("1.29", "us-east-1", DAY)
    assert ended.level == "error" and "ended on 2026-03-23" in ended.message
    [extended] = eks_version_findings("1.32", "us-east-1", DAY)
    assert extended.level == "warning" and extended.path == "scheduler.kubernetes_version"
    assert "$0.6/h instead of $0.1/h" in extended.message and "upgrade to 1.35" in extended.message
    assert list(eks_version_findings("1.34", "us-east-1", DAY)) == []
    [leaving] = eks_version_findings("1.34", "us-east-1", dt.date(2026, 12, 3))
    assert leaving.level == "warning" and "upgrade to 1.35" in leaving.message


def test_the_default_version_is_the_newest_in_standard_support() -> None:
    assert eks_catalog.default_version(DAY).version == "1.35"
    # 1.34 leaves standard support on 2026-12-02: a stack created after it gets 1.35, not a $0.60/h plane
    assert eks_catalog.default_version(dt.date(2026, 12, 3)).version == "1.35"
    # a stale file still names a version (the newest), which then warns as extended
    assert eks_catalog.default_version(dt.date(2027, 6, 1)).version == "1.35"
    assert [v.version for v in eks_catalog.versions()][:2] == ["1.35", "1.34"]


@pytest.mark.parametrize(("change", "path"), [
    ({"gpucluster:network": {"availability_zones": ["us-east-1a"], "vpc_cidr": "10.0.0.0/16"}},
     "network.availability_zones"),
    ({"gpucluster:node_groups": [{"name": "gpu", "instance_types": ["g5.xlarge"], "max_nodes": 2,
                                  "capacity": {"spot_percent": 50}}]},
     "node_groups[0].capacity.spot_percent"),
    ({"gpucluster:scheduler": {"type": "eks", "system_nodes": {"instance_type": "g5.xlarge"}}},
     "scheduler.system_nodes.instance_type"),
])
def test_what_an_eks_stack_refuses(change: dict[str, Any], path: str) -> None:
    config = {**base(), "gpucluster:scheduler": {"type": "eks"}, **change}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert path in [f.path for f in err.value.findings]


# ------------------------------------------------------------------------------- cost


def test_the_cost_has_the_control_plane_and_the_system_nodes(plan: Plan) -> None:
    cost = price_stack(plan.spec)
    lines = {c.name: c for c in cost.other if c.kind == "eks"}
    version = one(plan, CLUSTER).inputs["version"]
    plane = lines[f"EKS control plane (Kubernetes {version}, standard support)"]
    assert plane.desired_usd_per_month == pytest.approx(0.10 * 730)
    assert lines["EKS system nodes"].desired_usd_per_month == pytest.approx(2 * 0.1008 * 730)
    assert eks_catalog.HOURS_PER_MONTH == HOURS_PER_MONTH


def test_extended_support_is_priced_at_its_rate() -> None:
    config = {**base(), "gpucluster:scheduler": {"type": "eks", "kubernetes_version": "1.32"}}
    spec = parse_stack_config(config, stack="t")
    [plane, _] = eks_catalog.fees(spec.region, spec.scheduler, DAY)
    assert plane.name == "EKS control plane (Kubernetes 1.32, extended support)"
    assert plane.usd_per_month == pytest.approx(0.60 * 730)


def test_a_launcher_stack_pays_no_eks_fee() -> None:
    spec = parse_stack_config(base(), stack="t")
    assert eks_catalog.fees(spec.region, spec.scheduler, DAY) == []
    assert not [c for c in price_stack(spec).other if c.kind == "eks"]


def test_plan_shows_the_cluster_and_its_cost(tmp_path: Path, cli_plans_once: None) -> None:
    stack = tmp_path / "Pulumi.prod.yaml"
    stack.write_text(yaml.safe_dump({"config": eks_prod()}))
    result = CliRunner().invoke(app, ["plan", str(stack), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert any(r["type"] == CLUSTER for r in doc["resources"])
    names = [c["name"] for c in doc["cost"]["other"]]
    assert any(n.startswith("EKS control plane") for n in names) and "EKS system nodes" in names
    assert doc["violations"] == []  # no policy violation, no provider-conformance finding
    text = " ".join(CliRunner().invoke(app, ["plan", str(stack)]).output.split())
    name = one(planned_config(eks_prod(), stack="prod"), CLUSTER).inputs["name"]
    version = eks_catalog.default_version(eks_catalog.today()).version
    assert (f"eks: EKS cluster {name}, Kubernetes {version}, private endpoint; add-ons coredns, "
            "eks-node-monitoring-agent, eks-pod-identity-agent, kube-proxy, vpc-cni; system nodes 2 x "
            "m7i.large; $220/month (control plane and system nodes)") in text
    # the plan names the EKS facts still unchecked (the version calendar) and not a documented one (prices)
    unverified = {f["id"] if isinstance(f, dict) else f for f in doc["unverified_facts"]}
    assert "eks-kubernetes-versions" in unverified and "eks-prices" not in unverified


# ------------------------------------------------------------------------------- policy


def cluster_record(**props: Any) -> Resource:
    base_props = {"vpcConfig": {"endpointPublicAccess": False},
                  "enabledClusterLogTypes": list(eks_rules.LOG_TYPES),
                  "encryptionConfig": {"resources": ["secrets"], "provider": {"keyArn": "arn:aws:kms:k"}},
                  "tags": {"environment": "prod"}}
    return Resource(type=CLUSTER, name="c", urn="urn:c", props={**base_props, **props})


def findings(rule: Any, *resources: Resource, config: dict[str, Any] | None = None) -> list[str]:
    return [m for _, m in rule.stack_findings(Stack(list(resources)), rule.settings(config))]


def test_a_public_endpoint_is_a_violation_unless_the_environment_is_allowed() -> None:
    public = cluster_record(vpcConfig={"endpointPublicAccess": True})
    assert findings(eks_rules.eks_private_endpoint, cluster_record()) == []
    [message] = findings(eks_rules.eks_private_endpoint, public)
    assert "publicly" in message
    assert findings(eks_rules.eks_private_endpoint, public, config={"allowed_environments": ["prod"]}) == []


def test_control_plane_logging_and_secrets_encryption_are_required() -> None:
    assert findings(eks_rules.eks_control_plane_logging, cluster_record()) == []
    [message] = findings(eks_rules.eks_control_plane_logging, cluster_record(enabledClusterLogTypes=["api"]))
    assert "audit" in message
    assert findings(eks_rules.eks_secrets_encrypted, cluster_record()) == []
    assert findings(eks_rules.eks_secrets_encrypted, cluster_record(encryptionConfig=None))


def test_a_gpu_system_node_group_is_a_violation() -> None:
    group = Resource(type=NODE_GROUP, name="s", urn="urn:s", props={"instanceTypes": ["p5.48xlarge"]})
    assert findings(eks_rules.eks_system_nodes_no_gpu, group)
    cpu = Resource(type=NODE_GROUP, name="s", urn="urn:s", props={"instanceTypes": ["m7i.large"]})
    assert findings(eks_rules.eks_system_nodes_no_gpu, cpu) == []


def test_the_kubernetes_prod_passes_every_policy_and_gpu_limits_count_its_groups(plan: Plan) -> None:
    assert [(v.policy, v.message) for v in check_plan(plan) if v.level == "mandatory"] == []
    small = {"environments": {"prod": {"max_gpus": 8}}}
    [(_, message)] = list(environment_limits.stack_findings(
        Stack(plan_records(plan)), environment_limits.settings(small)))
    assert "16 x 8" in message


def test_a_system_type_without_a_price_is_a_pricing_error() -> None:
    scheduler = {"type": "eks", "system_nodes": {"instance_type": "r7i.large"}}
    config = {**base(), "gpucluster:scheduler": scheduler}
    with pytest.raises(PricingError, match=r"^scheduler.system_nodes.instance_type: no price for r7i.large"):
        price_stack(parse_stack_config(config, stack="t"))


@pytest.mark.parametrize(("scheduler", "loaded"), [("none", "0 0"), ("eks", "1 1")])
def test_only_an_eks_stack_loads_pulumi_kubernetes(scheduler: str, loaded: str) -> None:
    """In a fresh process (one for every case of tests/fresh_plans.py, which plans them in turn)."""
    case = {"none": "scheduler none", "eks": "eks"}[scheduler]
    assert fresh_plans.CASES[case] == {**base(), "gpucluster:scheduler": {"type": scheduler}}
    seen = fresh_plans.loaded(case)
    modules = ("pulumi_kubernetes", "gpucluster.aws.eks")
    assert not seen.before & set(modules)  # what is loaded after the plan is what the plan loaded
    assert " ".join(str(int(m in seen.after)) for m in modules) == loaded


ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


def test_an_eks_stack_without_nat_gets_the_private_cluster_endpoints_priced_and_a_warning() -> None:
    """Without NAT the VPC gets what a private EKS cluster's nodes and controllers reach (Amazon EKS user
    guide, "Deploy private clusters with limited internet access"; ledger: eks-private-cluster-endpoints),
    the cost model prices exactly those, and plan warns in one line about the charts' public images."""
    from gpucluster.pricing import interface_endpoints
    from gpucluster.spec import stack_warnings

    config = eks_prod()
    config["gpucluster:network"]["nat_gateway"] = False
    spec = parse_stack_config(config, stack="prod")
    [warning] = [f for f in stack_warnings(spec) if f.path == "network.nat_gateway"]
    assert warning.level == "warning" and "nvcr.io" in warning.message and "\n" not in str(warning)
    assert len(str(warning)) <= 200  # one line, as every finding (spec/findings.py MAX_LINE_CHARS)
    planned = {r.inputs["serviceName"].removeprefix("com.amazonaws.us-east-1."): r.inputs
               for r in planned_config(config, stack="prod").of_type(ENDPOINT)}
    eks_needs = {"ec2", "ecr.api", "ecr.dkr", "sts", "logs", "eks", "eks-auth", "autoscaling", "sqs"}
    assert eks_needs <= set(planned) and planned["s3"]["vpcEndpointType"] == "Gateway"
    for service in eks_needs:
        assert planned[service]["vpcEndpointType"] == "Interface" and planned[service]["privateDnsEnabled"]
    assert "elasticloadbalancing" not in planned  # no load balancer controller
    priced = interface_endpoints(spec)
    assert set(priced) == set(planned) - {"s3"} and len(priced) == len(set(priced))
    [line] = [o for o in price_stack(spec).other if o.kind == "endpoints"]
    assert f"{len(priced)} endpoints" in line.basis and "eks-auth" in line.basis
    assert "network.nat_gateway" not in {f.path for f in stack_warnings(parse_stack_config(
        eks_prod(), stack="prod"))}  # with NAT: no warning


# ------------------------------------------------------------------------------- GPU metrics on EKS

DCGM = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32


def test_eks_nodes_leave_gpu_metrics_to_the_cluster_s_charts() -> None:
    """One dcgm-exporter per GPU node: on EKS the cluster's chart and Prometheus agent collect, so the
    nodes run no collector of their own (it would double every GPU series in the workspace) and their
    roles get no aps:RemoteWrite; the same stack on the launcher keeps both."""
    from gpucluster.node.userdata import node_bootstrap
    observability = {"prometheus": {"enabled": True, "dcgm_exporter_image": DCGM}}
    eks, plain = eks_prod(), prod_config()
    eks["gpucluster:observability"] = plain["gpucluster:observability"] = observability
    eks_spec, plain_spec = parse_stack_config(eks, stack="prod"), parse_stack_config(plain, stack="prod")
    assert all(node_bootstrap(eks_spec, g).metrics is None for g in eks_spec.node_groups)
    assert all(node_bootstrap(plain_spec, g).metrics is not None for g in plain_spec.node_groups)
    writes = {"eks": planned_config(eks, stack="prod"), "plain": planned_config(plain, stack="prod")}
    grants = {k: [r.name for r in p.of_type("aws:iam/rolePolicy:RolePolicy") if "-metrics-write-" in r.name]
              for k, p in writes.items()}
    assert grants["eks"] == [] and len(grants["plain"]) == len(plain_spec.node_groups)
    releases = {r.inputs["name"] for r in writes["eks"].of_type("kubernetes:helm.sh/v3:Release")}
    assert {"dcgm-exporter", "prometheus-agent"} <= releases


def test_the_node_collector_s_images_are_refused_on_eks_in_one_line_each() -> None:
    config = eks_prod()
    config["gpucluster:observability"] = {"prometheus": {
        "enabled": True, "dcgm_exporter_image": DCGM,
        "prometheus_image": "quay.io/prometheus/prometheus:v3@sha256:" + "cd" * 32,
        "node_exporter_image": "quay.io/prometheus/node-exporter:v1@sha256:" + "ef" * 32}}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="prod")
    assert [f.path for f in err.value.findings] == ["observability.prometheus.prometheus_image",
                                                    "observability.prometheus.node_exporter_image"]
    assert all("not used on an EKS stack" in f.message for f in err.value.findings)
