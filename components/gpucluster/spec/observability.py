"""Named checks of the `observability` section: where metrics go, how Grafana signs users in, and that
the stack has GPUs to measure.

An AMP remote-write URL is `https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/api/v1/remote_write`
(Amazon Managed Service for Prometheus user guide, "Ingest Prometheus metrics to the workspace"; `.cn`
in the China partition). Amazon Managed Grafana needs an authentication provider, IAM Identity Center
or SAML (Amazon Managed Grafana user guide, "Authenticate users in Amazon Managed Grafana workspaces").
Small functions returning findings; never imports Pulumi or AWS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpucluster.spec.checks import check
from gpucluster.spec.fields import partition_of
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import ObservabilityConfig, StackSpec

PATH = "observability"
REMOTE_WRITE_URL = re.compile(
    r"https://aps-workspaces\.(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-\d)\.amazonaws\.com(?P<cn>\.cn)?"
    r"/workspaces/(?P<workspace>ws-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"/api/v1/remote_write")
# An image pinned by content: the same bytes on every node, whatever the tag points to later.
DIGEST = re.compile(r".+@sha256:[0-9a-f]{64}")


def remote_write_workspace(url: str) -> tuple[str, str] | None:
    """(region, workspace id) of an AMP remote-write URL, or None when it is not one."""
    m = REMOTE_WRITE_URL.fullmatch(url)
    if m is None or (m["cn"] is not None) != m["region"].startswith("cn-"):
        return None
    return m["region"], m["workspace"]


def has_gpus(spec: StackSpec) -> bool:
    return any(t.gpus > 0 for g in spec.node_groups for t in g.types)


@check
def observability_rules(spec: StackSpec) -> Iterable[Finding]:
    o = spec.observability
    if o.active and not has_gpus(spec):
        yield Finding(PATH, "no node group has GPUs to measure: remove observability or add a GPU node group")
    yield from prometheus_findings(o, spec.region, eks=spec.scheduler.eks)
    yield from grafana_findings(o)


def prometheus_findings(o: ObservabilityConfig, stack_region: str, eks: bool = False) -> Iterable[Finding]:
    p, path = o.prometheus, f"{PATH}.prometheus"
    if p.enabled and p.remote_write_url is not None:
        yield Finding(f"{path}.remote_write_url", "set either enabled (a workspace of this stack) or "
                      "remote_write_url (an existing workspace), not both")
    if p.remote_write_url is not None:
        found = remote_write_workspace(p.remote_write_url)
        if found is None:
            yield Finding(f"{path}.remote_write_url", "must be an Amazon Managed Prometheus remote-write URL "
                          "like https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-<id>/api/v1/"
                          "remote_write")
        elif partition_of(found[0]) != partition_of(stack_region):
            yield Finding(f"{path}.remote_write_url", f"is in partition {partition_of(found[0])}, the stack "
                          f"({stack_region}) in {partition_of(stack_region)}: the node role cannot sign for "
                          "another partition")
        elif p.region is not None and found[0] != p.region:
            yield Finding(f"{path}.region", f"is {p.region} but remote_write_url is in {found[0]}")
        if p.region is None:
            yield Finding(f"{path}.region", "required with remote_write_url: the region SigV4 signs for")
    elif p.region is not None:
        yield Finding(f"{path}.region", "only with remote_write_url (the stack's own workspace is in its "
                      "region)")
    if p.active:
        if p.dcgm_exporter_image is None:
            yield Finding(f"{path}.dcgm_exporter_image", "required: NVIDIA's dcgm-exporter pinned by digest, "
                          "e.g. nvcr.io/nvidia/k8s/dcgm-exporter:<tag>@sha256:<digest> (docker buildx "
                          "imagetools inspect prints it)")
        elif not DIGEST.fullmatch(p.dcgm_exporter_image):
            yield Finding(f"{path}.dcgm_exporter_image", "must be pinned by digest (...@sha256:<64 hex>), "
                          "so every node runs the same exporter")
        if eks:
            # An EKS stack's nodes run no collector of their own: the cluster's dcgm-exporter chart (on
            # dcgm_exporter_image) and Prometheus agent chart collect (aws/eks_software.py), and a second
            # exporter per node would double every GPU series. So the keys only that collector reads
            # have nothing to do there.
            for key in COLLECTOR_IMAGES:
                if getattr(p, key) is not None:
                    yield Finding(f"{path}.{key}", "not used on an EKS stack: the cluster's Prometheus agent "
                                  "chart collects there, not the nodes; remove it")
        else:
            yield from collector_image_findings(o)


# The collector as containers instead of the OS's packages (Amazon Linux 2023 has none): key -> what it runs.
COLLECTOR_IMAGES = {"prometheus_image": "Prometheus", "node_exporter_image": "node exporter"}


def collector_image_findings(o: ObservabilityConfig) -> Iterable[Finding]:
    """prometheus_image and node_exporter_image: both or neither, each pinned by digest as the
    dcgm-exporter's is (the node runs what the digest names, whatever its tag points to later)."""
    p, path = o.prometheus, f"{PATH}.prometheus"
    images = {key: getattr(p, key) for key in COLLECTOR_IMAGES}
    for key, image in images.items():
        if image is not None and not DIGEST.fullmatch(image):
            yield Finding(f"{path}.{key}", "must be pinned by digest (...@sha256:<64 hex>), so every node "
                          f"runs the same {COLLECTOR_IMAGES[key]}")
    missing = [key for key, image in images.items() if image is None]
    if len(missing) == 1:
        [other] = [key for key in images if key not in missing]
        yield Finding(f"{path}.{missing[0]}", f"required with {other}: Prometheus and the node exporter run "
                      "as containers together, in place of the OS's packages")


def grafana_findings(o: ObservabilityConfig) -> Iterable[Finding]:
    g, path = o.grafana, f"{PATH}.grafana"
    if not g.enabled:
        return
    if not g.authentication_providers:
        yield Finding(f"{path}.authentication_providers", "required with enabled: AWS_SSO (IAM Identity "
                      "Center) or SAML; Amazon Managed Grafana has no other sign-in")
    if not o.prometheus.active:
        yield Finding(f"{path}.enabled", "needs observability.prometheus (enabled or remote_write_url): the "
                      "dashboards read it")
    if "SAML" in g.authentication_providers:
        if g.saml_metadata_url is None:
            yield Finding(f"{path}.saml_metadata_url", "required with SAML: the identity provider's metadata")
        if not g.saml_editor_role_values:
            yield Finding(f"{path}.saml_editor_role_values", "required with SAML: who may edit dashboards")
    elif g.saml_metadata_url is not None or g.saml_editor_role_values:
        yield Finding(f"{path}.saml_metadata_url", "only with SAML in authentication_providers")
