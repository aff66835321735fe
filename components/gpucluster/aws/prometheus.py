"""MetricsWorkspace: where a stack's GPU metrics go and who may write and read them.

It owns, for `observability`: the Amazon Managed Service for Prometheus workspace of the stack
(encrypted with a customer managed KMS key of its own, tagged with the stack) and its rule groups
namespace (the recording and alert rules of `gpucluster.dashboards.promql`), or the ARN of an existing
workspace; each node role's one permission on it (`aps:RemoteWrite`,
`noderole.metrics_write_policy_document`);
and, when asked, an Amazon Managed Grafana workspace with its authentication provider (IAM Identity
Center or SAML, never none: the spec refuses it), a service role that may only query this workspace,
the SAML configuration, and the stack's dashboards provisioned into that workspace
(`gpucluster.aws.grafana_dashboards`). It never deletes data and creates nothing when observability is off
(`GpuCluster` does not build it). Facts: AMP user guide ("Encryption at rest": customer managed keys),
AMG user guide ("Service-managed permissions", "Customer-managed permissions"; data source IAM
policies as AmazonPrometheusQueryAccess lists them).
"""

import json
import re
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml

from gpucluster.aws.args import owned_tags, type_token
from gpucluster.aws.grafana_dashboards import GrafanaDashboards, provision_dashboards
from gpucluster.aws.iam import boundary_arn
from gpucluster.dashboards.grafana import GRAFANA_VERSION
from gpucluster.dashboards.promql import from_spec, rules_document
from gpucluster.node.metrics import remote_write_url_of
from gpucluster.noderole import metrics_write_policy_document, workspace_arn
from gpucluster.spec import StackSpec
from gpucluster.spec.observability import remote_write_workspace

RULES_NAMESPACE = "gpucluster"
# What the Grafana data source needs to query a workspace, and nothing else (the actions of the
# AWS managed policy AmazonPrometheusQueryAccess).
QUERY_ACTIONS = ["aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics"]
KMS_DELETION_WINDOW_DAYS = 30


def workspace_alias(identity: str) -> str:
    """A readable alias: AMP allows 1-100 characters; the identity with anything odd as '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"gpucluster-{identity}")[:100]


def grafana_trust_policy(partition: str, region: str, account: str) -> str:
    """Only Amazon Managed Grafana of this account and region may assume the role (confused deputy:
    aws:SourceAccount and aws:SourceArn, AMG user guide "Cross-service confused deputy prevention")."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "grafana.amazonaws.com"}, "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"aws:SourceAccount": account},
                      "StringLike": {"aws:SourceArn":
                                     f"arn:{partition}:grafana:{region}:{account}:/workspaces/*"}},
    }]})


def grafana_query_policy(workspace: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "QueryStackWorkspaceOnly", "Effect": "Allow", "Action": list(QUERY_ACTIONS),
         "Resource": [workspace]},
        # The data source's workspace picker lists workspaces: no resource-level permission for a list.
        {"Sid": "ListWorkspaces", "Effect": "Allow", "Action": ["aps:ListWorkspaces"], "Resource": "*"}]})


class MetricsWorkspace(pulumi.ComponentResource):
    """The stack's AMP workspace (or an existing one), its rules, node write grants and AMG workspace.

    Python users get `remote_write_url`, `workspace_arn`, `grafana_url` (None without Grafana),
    `workspace` (the aws.amp.Workspace, or None for an existing one) and `grafana`.
    """

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("MetricsWorkspace"), name, None, opts)
        self.spec, self.base_name = spec, name
        o = spec.observability
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOptions(parent=self)
        tags = owned_tags(spec.tags, spec.identity, spec.cluster.name)
        self.partition = aws.get_partition_output(opts=invoke).partition
        self.account = aws.get_caller_identity_output(opts=invoke).account_id
        self.workspace: aws.amp.Workspace | None = None
        self.key: aws.kms.Key | None = None
        self.rules: aws.amp.RuleGroupNamespace | None = None
        self.write_grants: dict[str, aws.iam.RolePolicy] = {}
        p = o.prometheus
        if p.enabled:
            self.key = aws.kms.Key(
                f"{name}-key", description=f"gpucluster {spec.identity}: Prometheus workspace",
                enable_key_rotation=True, deletion_window_in_days=KMS_DELETION_WINDOW_DAYS, tags=tags,
                opts=child)
            self.workspace = aws.amp.Workspace(
                f"{name}-amp", alias=workspace_alias(spec.identity), kms_key_arn=self.key.arn, tags=tags,
                opts=child)
            self.rules = aws.amp.RuleGroupNamespace(
                f"{name}-rules", workspace_id=self.workspace.id, name=RULES_NAMESPACE,
                data=yaml.safe_dump(rules_document(from_spec(spec)), sort_keys=False), opts=child)
            self.workspace_arn: pulumi.Output[str] = self.workspace.arn
            self.remote_write_url: pulumi.Output[str] = self.workspace.id.apply(
                lambda ws: remote_write_url_of(spec.region, ws))
            self._tag_identity: str | None = spec.identity
        else:
            url = p.remote_write_url or ""
            found = remote_write_workspace(url)
            if found is None:
                raise ValueError("observability.prometheus: no workspace to write to")
            region, ws = found
            self.workspace_arn = pulumi.Output.all(self.partition, self.account).apply(
                lambda v: workspace_arn(v[0], region, v[1], ws))
            self.remote_write_url = pulumi.Output.from_input(url)
            self._tag_identity = None
        self.grafana: aws.grafana.Workspace | None = None
        self.grafana_url: pulumi.Output[str] | None = None
        if o.grafana.enabled:
            self._grafana(name, spec, tags, child)
        outputs: dict[str, Any] = {"prometheus_remote_write_url": self.remote_write_url,
                                   "prometheus_workspace_arn": self.workspace_arn}
        if self.grafana_url is not None:
            outputs["grafana_url"] = self.grafana_url
        self.outputs = outputs
        self.register_outputs(outputs)

    def grant_write(self, group: str, role_name: pulumi.Input[str]) -> aws.iam.RolePolicy:
        """`aps:RemoteWrite` on this workspace only, for one node group's role."""
        identity = self._tag_identity
        policy = self.workspace_arn.apply(
            lambda arn: json.dumps(metrics_write_policy_document(arn, identity)))
        grant = self.write_grants[group] = aws.iam.RolePolicy(
            f"{self.base_name}-write-{group}", role=role_name, policy=policy,
            opts=pulumi.ResourceOptions(parent=self))
        return grant

    def _grafana(self, name: str, spec: StackSpec, tags: dict[str, str],
                 child: pulumi.ResourceOptions) -> None:
        g = spec.observability.grafana
        boundary = spec.cluster.permissions_boundary
        self.grafana_role = aws.iam.Role(
            f"{name}-grafana-role", description=f"gpucluster {spec.identity}: Grafana reads its Prometheus",
            assume_role_policy=pulumi.Output.all(self.partition, self.account).apply(
                lambda v: grafana_trust_policy(v[0], spec.region, v[1])),
            permissions_boundary=boundary_arn(self.partition, self.account, boundary) if boundary else None,
            tags=tags, opts=child)
        self.grafana_policy = aws.iam.RolePolicy(
            f"{name}-grafana-query", role=self.grafana_role.name,
            policy=self.workspace_arn.apply(grafana_query_policy), opts=child)
        self.grafana = aws.grafana.Workspace(
            f"{name}-grafana", account_access_type="CURRENT_ACCOUNT",
            authentication_providers=list(g.authentication_providers), permission_type="CUSTOMER_MANAGED",
            role_arn=self.grafana_role.arn, data_sources=["PROMETHEUS"], grafana_version=GRAFANA_VERSION,
            description=f"gpucluster {spec.identity}", tags=tags, opts=child)
        if "SAML" in g.authentication_providers:
            self.saml = aws.grafana.WorkspaceSamlConfiguration(
                f"{name}-grafana-saml", workspace_id=self.grafana.id, idp_metadata_url=g.saml_metadata_url,
                editor_role_values=list(g.saml_editor_role_values), opts=child)
        self.grafana_url = self.grafana.endpoint.apply(lambda host: f"https://{host}")
        # `pulumi up` puts the data source and the dashboards into it (aws/grafana_dashboards.py)
        self.dashboards: GrafanaDashboards = provision_dashboards(
            name, spec, self.grafana, self.remote_write_url, self.grafana_url, child)
