"""EksCluster: an EKS stack's control plane, its add-ons, its system node group and the nodes' access.

It owns what Amazon EKS is given on a `scheduler: {type: eks}` stack: the cluster (a Kubernetes version EKS
supports, from `catalog/data/eks_versions.yaml`; access entries only, `authentication_mode` API; the private
endpoint, public only with `endpoint_public`; Kubernetes secrets envelope-encrypted with a KMS key of its
own; every control-plane log type, into a log group declared here with the guardrail logs' retention; its
interfaces in the stack's private subnets), the cluster's IAM role, the managed add-ons (vpc-cni with
warm-IP settings for EFA instances, kube-proxy, the pod identity agent, CoreDNS, the node monitoring agent),
a small managed on-demand node group for the controllers (no GPUs), and an `EC2_LINUX` access entry for
each GPU node group's role (`add_node_role`): the GPU nodes themselves are gpucluster's own Auto Scaling
groups (`GpuNodeGroup` with `scheduler: eks`), joined through `nodeadm` (`node/multipart.py`).

Built from raw `aws.eks.*` resources with their SDK `*Args` classes, never pulumi-eks: a multi-language
component is one opaque resource under Pulumi's mock engine (pulumi/pulumi#15731), so `plan` could not
show, price or check it. The Kubernetes provider (`k8s_provider`) is built from the cluster's endpoint and
CA with an `aws eks get-token` exec kubeconfig, so no token is ever stored in the state; the cluster
software (charts, Kueue objects) goes through it. No OIDC provider: workloads that need AWS use EKS Pod
Identity (its agent is an add-on here).

Order, so that nothing waits on what comes after it: the cluster, then the add-ons a node needs to become
Ready (vpc-cni, kube-proxy, the pod identity agent), then the system node group, then the add-ons that run
as Deployments on nodes (CoreDNS, the node monitoring agent): an add-on is created ACTIVE only once its pods
run, and the managed node group's nodes are Ready only with a CNI.

Sources: Amazon EKS user guide ("Create an Amazon EKS cluster", "Grant IAM users access to Kubernetes with
EKS access entries", "Encrypt Kubernetes secrets with KMS on existing clusters", "Send control plane logs to
CloudWatch Logs", "Amazon EKS cluster IAM role", "Amazon EKS node IAM role", "Amazon EKS add-ons"), and
pulumi-aws 7's `eks` module for every property name. Facts this module relies on that no test here can see
are in the ledger: eks-cluster-role-policies, eks-addon-names, eks-vpc-cni-warm-ip,
eks-access-entry-ec2-linux, eks-control-plane-log-group.
"""

import json
from typing import NotRequired, TypedDict

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from gpucluster.aws.args import component_options, owned_tags, type_token
from gpucluster.aws.guardrail_lambda import LOG_RETENTION_DAYS
from gpucluster.aws.iam import EKS_NODE_POLICIES
from gpucluster.eks.naming import eks_cluster_name

OLD_TYPE = "gpucluster:eks:EksCluster"
# Every control-plane log type EKS has (the EKS user guide, "Send control plane logs to CloudWatch Logs";
# pulumi-aws 7 ClusterArgs.enabled_cluster_log_types lists the same five).
LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# The add-ons a node needs before it is Ready, and those that run as pods on Ready nodes
# (ledger: eks-addon-names).
NODE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
POD_ADDONS = ("coredns", "eks-node-monitoring-agent")
# vpc-cni on instances with many network cards (p5: 32): by default ipamd keeps a whole spare ENI of
# addresses per node (WARM_ENI_TARGET=1), 49 IPs of a p5's subnet each; a few warm IPs and a floor instead
# leave the subnet for the nodes (EKS best practices guide, "Amazon VPC CNI", WARM_IP_TARGET /
# MINIMUM_IP_TARGET; the values are ours; ledger: eks-vpc-cni-warm-ip). EFA-only interfaces carry no IP.
VPC_CNI_CONFIGURATION = {"env": {"WARM_IP_TARGET": "5", "MINIMUM_IP_TARGET": "10"}}
# AWS managed policies: the cluster's role (EKS user guide, "Amazon EKS cluster IAM role") and the system
# nodes' (a GPU node's, aws/iam.py, and SSM); ledger: eks-cluster-role-policies.
CLUSTER_POLICIES = {"cluster": "AmazonEKSClusterPolicy"}
SYSTEM_POLICIES = {**EKS_NODE_POLICIES, "ssm": "AmazonSSMManagedInstanceCore"}
SYSTEM_LABEL = ("gpucluster.io/role", "system")
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"  # pulumi-aws 7 NodeGroupArgs.ami_type (EKS's AMI types)
ACCESS_ENTRY_EC2_LINUX = "EC2_LINUX"  # self-managed Linux nodes (ledger: eks-access-entry-ec2-linux)
TOKEN_API = "client.authentication.k8s.io/v1beta1"  # what `aws eks get-token` prints


def kubeconfig_command(name: str, region: str) -> str:
    """What a user runs to reach the cluster with kubectl (exported as `kubeconfig_command`)."""
    return f"aws eks update-kubeconfig --name {name} --region {region}"


def kubeconfig(name: str, region: str, endpoint: str, certificate_authority: str) -> str:
    """A kubeconfig whose user runs `aws eks get-token`: the token is made when used, never stored."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": {"server": endpoint,
                                                "certificate-authority-data": certificate_authority}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": TOKEN_API, "command": "aws", "interactiveMode": "Never",
            "args": ["eks", "get-token", "--cluster-name", name, "--region", region, "--output", "json"]}}}],
    }, sort_keys=True)


def trust_policy(service: str) -> str:
    """Only `service` may take the role (EKS's cluster role also tags its sessions)."""
    actions = ["sts:AssumeRole", "sts:TagSession"] if service == "eks.amazonaws.com" else "sts:AssumeRole"
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": service}, "Action": actions}]}, sort_keys=True)


def secrets_key_policy(key_arn: str) -> str:
    """The cluster role's use of the secrets key (EKS user guide, "Encrypt Kubernetes secrets with KMS":
    Encrypt, Decrypt, DescribeKey and grants; ledger: eks-cluster-role-policies), on that key only."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "EnvelopeEncryptSecrets", "Effect": "Allow",
        "Action": ["kms:Encrypt", "kms:Decrypt", "kms:DescribeKey", "kms:ListGrants", "kms:CreateGrant"],
        "Resource": key_arn}]}, sort_keys=True)


class EksClusterArgs(TypedDict):
    """An EKS control plane in a stack's private subnets, with its system node group."""

    cluster_name: str
    """The stack's cluster name (descriptions, the EKS cluster's name with the identity's hash)."""
    identity: str
    """The gpucluster:stack tag value."""
    region: str
    """AWS region."""
    tags: NotRequired[dict[str, str]]
    """The stack's tags (identity tags added)."""
    kubernetes_version: str
    """The Kubernetes version (one EKS supports: spec/scheduler.py checks it)."""
    endpoint_public: bool
    """Also expose the API endpoint publicly (the private one is always on)."""
    subnet_ids: pulumi.Input[list[pulumi.Input[str]]]
    """The stack's private subnets (the control plane's interfaces, the system nodes): two zones at least."""
    system_instance_type: str
    """The system nodes' instance type (no GPUs)."""
    system_count: int
    """System nodes, always running."""
    permissions_boundary: NotRequired[str]
    """The boundary every role of the stack carries."""


class EksCluster(pulumi.ComponentResource):
    """An EKS cluster, its add-ons, its system node group, and an access entry per GPU node role
    (`add_node_role`, then `finish`).

    Python users also get `cluster` (`aws.eks.Cluster`), `role`, `secrets_key`, `log_group`, `addons`
    (name -> `aws.eks.Addon`), `system_role`, `system_nodes` (`aws.eks.NodeGroup`), `access_entries`
    (node group -> `aws.eks.AccessEntry`) and `k8s_provider` (`pulumi_kubernetes.Provider`).
    """

    cluster_name: pulumi.Output[str]
    """The EKS cluster's name (what `aws eks` and the nodes' NodeConfig name)."""
    cluster_arn: pulumi.Output[str]
    """The EKS cluster's ARN."""
    endpoint: pulumi.Output[str]
    """The API server's endpoint."""
    certificate_authority: pulumi.Output[str]
    """The cluster CA, base64 (as the kubeconfig and NodeConfig take it)."""
    service_cidr: pulumi.Output[str]
    """The cluster's service CIDR (the nodes' NodeConfig `cidr`: kubelet's cluster DNS address)."""
    cluster_security_group_id: pulumi.Output[str]
    """The security group EKS made for the cluster: GPU nodes carry it to reach the control plane."""
    node_role_arn: pulumi.Output[str]
    """The system node group's role (`node_role_arns`: each GPU node group's, as `add_node_role` got it)."""
    kubeconfig_command: pulumi.Output[str]
    """`aws eks update-kubeconfig ...` for this cluster."""

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("EksCluster"), name, None, component_options(opts, OLD_TYPE))
        self._name, self._args = name, args
        tags = self._tags = owned_tags(args.get("tags", {}), args["identity"], args["cluster_name"])
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        account = aws.get_caller_identity_output(opts=invoke).account_id
        boundary = (pulumi.Output.concat("arn:", partition, ":iam::", account, ":policy/",
                                         args["permissions_boundary"])
                    if args.get("permissions_boundary") else None)
        self._partition, self._boundary = partition, boundary
        label, eks_name = args["cluster_name"], eks_cluster_name(args["cluster_name"], args["identity"])
        self.secrets_key = aws.kms.Key(
            f"{name}-secrets-key", description=f"gpucluster {label}: EKS secrets envelope encryption",
            enable_key_rotation=True, deletion_window_in_days=30,
            tags={**tags, "Name": f"{label}-eks-secrets"},
            opts=child)
        # EKS writes control-plane logs to /aws/eks/<cluster>/cluster and creates it without expiry when
        # absent (ledger: eks-control-plane-log-group): declared first, with the guardrail logs' retention.
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", aws.cloudwatch.LogGroupArgs(
                name=f"/aws/eks/{eks_name}/cluster", retention_in_days=LOG_RETENTION_DAYS, tags=tags),
            opts=child)
        self.role = aws.iam.Role(
            f"{name}-role", aws.iam.RoleArgs(
                assume_role_policy=trust_policy("eks.amazonaws.com"), permissions_boundary=boundary,
                description=f"gpucluster {label}: the EKS control plane", tags=tags),
            opts=child)
        grants: list[pulumi.Resource] = [self._managed(f"{name}-{part}", self.role, policy)
                                         for part, policy in CLUSTER_POLICIES.items()]
        grants.append(aws.iam.RolePolicy(
            f"{name}-secrets", aws.iam.RolePolicyArgs(
                role=self.role.id, policy=self.secrets_key.arn.apply(secrets_key_policy)), opts=child))
        self.cluster = aws.eks.Cluster(
            f"{name}-cluster", aws.eks.ClusterArgs(
                name=eks_name, version=args["kubernetes_version"], role_arn=self.role.arn,
                vpc_config=aws.eks.ClusterVpcConfigArgs(
                    subnet_ids=args["subnet_ids"], endpoint_private_access=True,
                    endpoint_public_access=args["endpoint_public"]),
                access_config=aws.eks.ClusterAccessConfigArgs(
                    authentication_mode="API",
                    # Whoever runs `pulumi up` administers the cluster, so the charts install.
                    bootstrap_cluster_creator_admin_permissions=True),
                encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                    resources=["secrets"],
                    provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=self.secrets_key.arn)),
                enabled_cluster_log_types=list(LOG_TYPES),
                # The add-ons below are EKS-managed from the start, not self-managed copies to take over.
                bootstrap_self_managed_addons=False,
                tags={**tags, "Name": eks_name}),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group, *grants]))
        self.addons: dict[str, aws.eks.Addon] = {}
        for addon in NODE_ADDONS:
            self.addons[addon] = self._addon(addon, [])
        self.system_role = aws.iam.Role(
            f"{name}-system-role", aws.iam.RoleArgs(
                assume_role_policy=trust_policy("ec2.amazonaws.com"), permissions_boundary=boundary,
                description=f"gpucluster {label}: EKS system nodes (controllers, no GPUs)", tags=tags),
            opts=child)
        attachments = [self._managed(f"{name}-system-{part}", self.system_role, policy)
                       for part, policy in SYSTEM_POLICIES.items()]
        count = args["system_count"]
        # A managed node group gets its access entry from EKS itself.
        self.system_nodes = aws.eks.NodeGroup(
            f"{name}-system", aws.eks.NodeGroupArgs(
                cluster_name=self.cluster.name, node_role_arn=self.system_role.arn,
                subnet_ids=args["subnet_ids"], instance_types=[args["system_instance_type"]],
                capacity_type="ON_DEMAND", ami_type=SYSTEM_AMI_TYPE,
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    desired_size=count, min_size=count, max_size=count),
                update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
                labels=dict([SYSTEM_LABEL]), tags={**tags, "Name": f"{label}-eks-system"}),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*attachments, *self.addons.values()]))
        for addon in POD_ADDONS:
            self.addons[addon] = self._addon(addon, [self.system_nodes])
        self.access_entries: dict[str, aws.eks.AccessEntry] = {}
        self.node_role_arns: dict[str, pulumi.Input[str]] = {}
        self.cluster_name = self.cluster.name
        self.cluster_arn = self.cluster.arn
        self.endpoint = self.cluster.endpoint
        self.certificate_authority = self.cluster.certificate_authority.apply(lambda ca: ca.data or "")
        self.service_cidr = self.cluster.kubernetes_network_config.apply(
            lambda c: c.service_ipv4_cidr or "")
        self.cluster_security_group_id = self.cluster.vpc_config.apply(
            lambda c: c.cluster_security_group_id or "")
        self.node_role_arn = self.system_role.arn
        region = args["region"]
        self.kubeconfig_command = self.cluster.name.apply(lambda n: kubeconfig_command(n, region))
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s", k8s.ProviderArgs(kubeconfig=pulumi.Output.all(
                self.cluster.name, self.endpoint, self.certificate_authority).apply(
                lambda v: kubeconfig(v[0], region, v[1], v[2]))),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.system_nodes]))

    def _managed(self, name: str, role: aws.iam.Role, policy: str) -> aws.iam.RolePolicyAttachment:
        return aws.iam.RolePolicyAttachment(
            name, aws.iam.RolePolicyAttachmentArgs(
                role=role.name,
                policy_arn=pulumi.Output.concat("arn:", self._partition, f":iam::aws:policy/{policy}")),
            opts=pulumi.ResourceOptions(parent=self))

    def _addon(self, addon: str, after: list[pulumi.Resource]) -> aws.eks.Addon:
        """An EKS-managed add-on at EKS's default version for the cluster's Kubernetes version."""
        return aws.eks.Addon(
            f"{self._name}-{addon}", aws.eks.AddonArgs(
                cluster_name=self.cluster.name, addon_name=addon,
                configuration_values=json.dumps(VPC_CNI_CONFIGURATION, sort_keys=True)
                if addon == "vpc-cni" else None,
                resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
                tags=self._tags),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after))

    def add_node_role(self, group: str, role_arn: pulumi.Input[str]) -> aws.eks.AccessEntry:
        """A GPU node group's role may join its nodes: an `EC2_LINUX` access entry (EKS gives it the
        nodes' Kubernetes group itself)."""
        self.node_role_arns[group] = role_arn
        entry = self.access_entries[group] = aws.eks.AccessEntry(
            f"{self._name}-{group}-nodes", aws.eks.AccessEntryArgs(
                cluster_name=self.cluster.name, principal_arn=role_arn, type=ACCESS_ENTRY_EC2_LINUX,
                tags=self._tags),
            opts=pulumi.ResourceOptions(parent=self))
        return entry

    def finish(self) -> None:
        """Every node group's role is in: the outputs."""
        self.register_outputs({"cluster_name": self.cluster_name, "cluster_arn": self.cluster_arn,
                               "endpoint": self.endpoint, "node_role_arn": self.node_role_arn,
                               "kubeconfig_command": self.kubeconfig_command})
