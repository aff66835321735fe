"""The stack's dashboards provisioned into its Amazon Managed Grafana workspace by `pulumi up`.

It owns, when the stack creates a Grafana workspace: a Grafana service account of the workspace
(`aws.grafana.WorkspaceServiceAccount`, role ADMIN: adding a data source takes a Grafana admin, Grafana
docs "Data source HTTP API"), a token for it (`aws.grafana.WorkspaceServiceAccountToken`, valid one day,
made anew whenever what is provisioned changes: it is used only by the `pulumi up` that makes it), and a
Pulumi dynamic resource that puts the stack's Prometheus data source and every dashboard of
`gpucluster.dashboards` into the workspace over Grafana's HTTP API (`gpucluster.dashboards.provision`).
No new dependency: dynamic providers are part of the Pulumi SDK. Deleting the resource leaves the
dashboards in Grafana (a workspace deleted with them takes them; one kept keeps what its users may have
built on them); nothing here touches AWS data.
"""

import hashlib
import json
from typing import Any

import pulumi
import pulumi_aws as aws
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from gpucluster.dashboards import from_spec, rendered
from gpucluster.dashboards.provision import Grafana, amp_datasource, amp_query_url, provision
from gpucluster.spec import StackSpec

TOKEN_SECONDS = 86_400
"""A day: the token is used by the `pulumi up` that creates it (AMG API reference,
CreateWorkspaceServiceAccountToken: secondsToLive up to 30 days)."""
SERVICE_ACCOUNT = "gpucluster-dashboards"
COMPARED = ("grafana_url", "digest")
"""What makes the provisioning run again: another workspace, or other dashboards or data source."""


def provisioned_digest(datasource: dict[str, Any], dashboards: str) -> str:
    """What is provisioned, hashed: the token and the dynamic resource change with it."""
    return hashlib.sha256(json.dumps([datasource, dashboards], sort_keys=True).encode()).hexdigest()


class DashboardsProvider(ResourceProvider):
    """Creates and updates by provisioning (idempotent); deletes nothing (see the module docstring)."""

    def _provision(self, props: dict[str, Any]) -> dict[str, Any]:
        grafana = Grafana(props["grafana_url"], props["token"])
        urls = provision(grafana, props["datasource"], json.loads(props["dashboards"]), props["message"])
        return {k: v for k, v in props.items() if k != "token"} | {"urls": urls}

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=f"{props['grafana_url']}#{props['digest'][:16]}", outs=self._provision(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=any(olds.get(k) != news.get(k) for k in COMPARED))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._provision(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class GrafanaDashboards(pulumi.dynamic.Resource):
    """The stack's data source and dashboards in a Grafana workspace (a Pulumi dynamic resource)."""

    urls: pulumi.Output[list[str]]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(DashboardsProvider(), name, {**props, "urls": None}, opts)


def provision_dashboards(name: str, spec: StackSpec, workspace: aws.grafana.Workspace,
                         remote_write_url: pulumi.Input[str], grafana_url: pulumi.Output[str],
                         opts: pulumi.ResourceOptions) -> GrafanaDashboards:
    """The service account, its token and the provisioning of `spec`'s dashboards into `workspace`."""
    dashboards = json.dumps(rendered(from_spec(spec)), sort_keys=True)
    datasource = pulumi.Output.from_input(remote_write_url).apply(
        lambda url: amp_datasource(f"gpucluster {spec.identity}", amp_query_url(url), spec.region))
    digest = datasource.apply(lambda d: provisioned_digest(d, dashboards))
    account = aws.grafana.WorkspaceServiceAccount(
        f"{name}-dashboards-account", workspace_id=workspace.id, grafana_role="ADMIN", name=SERVICE_ACCOUNT,
        opts=opts)
    token = aws.grafana.WorkspaceServiceAccountToken(
        f"{name}-dashboards-token", workspace_id=workspace.id, service_account_id=account.service_account_id,
        seconds_to_live=TOKEN_SECONDS, name=digest.apply(lambda d: f"{SERVICE_ACCOUNT}-{d[:16]}"), opts=opts)
    return GrafanaDashboards(f"{name}-dashboards", {
        "grafana_url": grafana_url, "token": pulumi.Output.secret(token.key), "datasource": datasource,
        "dashboards": dashboards, "digest": digest, "message": f"gpucluster {spec.identity}: pulumi up"},
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["token"])))
