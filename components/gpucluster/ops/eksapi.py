"""How the CLI reaches an EKS stack's Kubernetes API: its cluster by tag, an EKS token, a client.

The CLI has no Pulumi CLI to read the stack's outputs from, and the stack tags its EKS cluster with
`gpucluster:stack` as it tags every resource: so the cluster is found by tag (EKS ListClusters, then
DescribeCluster on each, which returns its tags, endpoint and certificate authority: botocore's eks
service model). The Kubernetes Python client is authenticated with an EKS token in the format
aws-iam-authenticator defines and `aws eks get-token` prints: `k8s-aws-v1.` and the base64url (no
padding) of a presigned STS GetCallerIdentity URL whose signature covers the header
`x-k8s-aws-id: <cluster name>` (aws-iam-authenticator README, "API Authorization from Outside a
Cluster"; ledger: eks-token-format), signed here with botocore's SigV4 presigner; EKS maps the
caller's IAM identity to a Kubernetes user through the cluster's access entries. Nothing here holds
a long-lived credential.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from typing import Any

from gpucluster.fleet.tags import STACK_TAG
from gpucluster.ops import OpsError

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
TOKEN_EXPIRES_SECONDS = 60
"""The presigned URL's X-Amz-Expires, as aws-iam-authenticator signs it (EKS accepts a token for 15
minutes whatever it says: aws-iam-authenticator README)."""


class NoEksCluster(OpsError):
    """The EKS stack has no cluster in its region (not deployed, or deployed elsewhere)."""


class KubeError(OpsError):
    """The Kubernetes API refused or failed a request: one line with its status and message."""


@dataclass(frozen=True)
class EksCluster:
    """What DescribeCluster says of the stack's cluster, as the CLI needs it."""

    name: str
    endpoint: str
    ca_data: str
    """Base64 PEM of the cluster's certificate authority (certificateAuthority.data)."""
    status: str
    version: str


def stack_eks_cluster(identity: str, eks_client: Any) -> EksCluster:
    """The EKS cluster tagged `gpucluster:stack=identity` (NoEksCluster when there is none or several)."""
    found = []
    for page in eks_client.get_paginator("list_clusters").paginate():
        for name in page.get("clusters", []):
            cluster = eks_client.describe_cluster(name=name)["cluster"]
            if cluster.get("tags", {}).get(STACK_TAG) == identity:
                found.append(cluster)
    if not found:
        raise NoEksCluster(f"no EKS cluster in {eks_client.meta.region_name} is tagged "
                           f"{STACK_TAG}={identity}: deploy the stack first (`pulumi up`)")
    if len(found) > 1:
        names = ", ".join(sorted(c["name"] for c in found))
        raise NoEksCluster(f"{len(found)} EKS clusters are tagged {STACK_TAG}={identity} ({names}): "
                           "remove the stale one")
    c = found[0]
    return EksCluster(name=c["name"], endpoint=c.get("endpoint", ""),
                      ca_data=c.get("certificateAuthority", {}).get("data", ""), status=c.get("status", ""),
                      version=c.get("version", ""))


def eks_token(cluster_name: str, region: str, credentials: Any) -> str:
    """An EKS bearer token for `cluster_name` (aws-iam-authenticator's format), from `credentials`
    (botocore credentials: the caller's own identity)."""
    from botocore.hooks import HierarchicalEmitter
    from botocore.model import ServiceId
    from botocore.signers import RequestSigner

    events = HierarchicalEmitter()  # the signer keeps only a weak reference to it
    signer = RequestSigner(ServiceId("STS"), region, "sts", "v4", credentials, events)
    request = {"method": "GET",
               "url": f"https://sts.{region}.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
               "body": {}, "headers": {CLUSTER_ID_HEADER: cluster_name}, "context": {}}
    url = signer.generate_presigned_url(request, region_name=region, expires_in=TOKEN_EXPIRES_SECONDS,
                                        operation_name="")
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kube_client(cluster: EksCluster, token: str) -> Any:
    """A `kubernetes.client.ApiClient` for the cluster's endpoint, verifying its CA, with the token."""
    from kubernetes import client

    config = client.Configuration()
    config.host = cluster.endpoint
    config.api_key = {"BearerToken": token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    if cluster.ca_data:
        with tempfile.NamedTemporaryFile("wb", prefix="gpucluster-eks-ca-", suffix=".pem",
                                         delete=False) as ca:
            ca.write(base64.b64decode(cluster.ca_data))
        config.ssl_ca_cert = ca.name
    return client.ApiClient(config)


def connect(identity: str, clients: Any, credentials: Any) -> tuple[EksCluster, Any]:
    """The stack's cluster and an API client authenticated as the caller."""
    eks = clients("eks")
    cluster = stack_eks_cluster(identity, eks)
    if cluster.status != "ACTIVE" or not cluster.endpoint:
        raise NoEksCluster(f"EKS cluster {cluster.name} is {cluster.status or 'without an endpoint'}, not "
                           "ACTIVE: wait for `pulumi up` to finish")
    return cluster, kube_client(cluster, eks_token(cluster.name, eks.meta.region_name, credentials))


def api_error(err: Any, what: str) -> KubeError:
    """A kubernetes ApiException as one line: what was asked, the status, the API's own message."""
    import json

    message = ""
    try:
        message = json.loads(err.body or "{}").get("message", "")
    except (TypeError, ValueError):
        message = str(err.body or "")[:200]
    status = getattr(err, "status", None)
    hint = (" (is your IAM identity given access to the cluster? EKS access entries)"
            if status in (401, 403) else "")
    return KubeError(f"{what}: the Kubernetes API answered {status} {err.reason or ''}".rstrip()
                     + (f": {message}" if message else "") + hint)
