"""Amazon EKS rules: what an EKS control plane and its managed node groups keep to.

Owns `eks-private-endpoint` (the API endpoint is private unless the policy config lets an environment
open it), `eks-control-plane-logging` (every control-plane log type EKS has goes to CloudWatch Logs),
`eks-secrets-encrypted` (Kubernetes secrets envelope-encrypted with a KMS key) and `eks-system-nodes-no-gpu`
(an EKS managed node group buys no GPU: GPU nodes are the stack's own Auto Scaling groups, which the
budget, capacity and autostop rules already read as they read every other node group). A stack without
EKS resources passes every one. Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource, Stack, dig, effective_tags, items, truthy
from gpucluster.policy.rules.groups import is_gpu_type
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import EKS_CLUSTER, EKS_NODE_GROUP

# Amazon EKS user guide, "Send control plane logs to CloudWatch Logs": the five log types.
LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


def _environment(stack: Stack, resource: Resource) -> str | None:
    tags = effective_tags(resource)
    own = tags.get("environment") if isinstance(tags, Mapping) else None
    return own if isinstance(own, str) and own else stack.environment()


@rule("eks-private-endpoint",
      "EKS clusters keep their Kubernetes API endpoint private (vpcConfig.endpointPublicAccess false), "
      "unless the policy config lists the environment in allowed_environments (scheduler.endpoint_public "
      "is the stack's opt-in; this is the organisation's).",
      "stack",
      schema={"allowed_environments": {"type": "array", "items": {"type": "string"},
                                       "description": "Environments whose EKS clusters may expose a public "
                                                      "API endpoint."}},
      defaults={"allowed_environments": []})
def eks_private_endpoint(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for cluster in stack.of_type(EKS_CLUSTER):
        public = dig(cluster.props, "vpcConfig", "endpointPublicAccess")
        if public is UNKNOWN or not truthy(public):
            continue
        env = _environment(stack, cluster)
        if env is not None and env in config["allowed_environments"]:
            continue
        yield cluster, (f"{env or 'this'} EKS cluster exposes its API endpoint publicly: set "
                        "scheduler.endpoint_public: false, or allow the environment in the policy config "
                        "(eks-private-endpoint.allowed_environments)")


@rule("eks-control-plane-logging",
      "EKS clusters send every control-plane log type (api, audit, authenticator, controllerManager, "
      "scheduler) to CloudWatch Logs: who did what to the cluster is on record.",
      "stack")
def eks_control_plane_logging(stack: Stack,
                              config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for cluster in stack.of_type(EKS_CLUSTER):
        enabled = items(cluster.props.get("enabledClusterLogTypes"))
        if enabled is UNKNOWN:
            continue
        missing = [t for t in LOG_TYPES if t not in enabled]
        if missing:
            yield cluster, f"EKS control-plane logs off for {', '.join(missing)}: enable every log type"


@rule("eks-secrets-encrypted",
      "EKS clusters envelope-encrypt Kubernetes secrets with a KMS key (encryptionConfig resources "
      "include secrets, with a key ARN).",
      "stack")
def eks_secrets_encrypted(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for cluster in stack.of_type(EKS_CLUSTER):
        encryption = cluster.props.get("encryptionConfig")
        if encryption is UNKNOWN:
            continue
        resources = items(dig(encryption, "resources")) if encryption else []
        key = dig(encryption, "provider", "keyArn") if encryption else None
        if resources is UNKNOWN or ("secrets" in resources and key):
            continue
        yield cluster, "EKS cluster without KMS envelope encryption of secrets: set encryptionConfig"


@rule("eks-system-nodes-no-gpu",
      "EKS managed node groups (the system nodes) run no GPU type: GPU nodes are the stack's own node "
      "groups, under its budget, capacity limits and autostop.",
      "stack")
def eks_system_nodes_no_gpu(stack: Stack,
                            config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for group in stack.of_type(EKS_NODE_GROUP):
        types = items(group.props.get("instanceTypes"))
        for t in types if types is not UNKNOWN else []:
            if isinstance(t, str) and is_gpu_type(t):
                yield group, (f"the EKS managed node group runs {t}, a GPU type: GPU nodes belong in "
                              "node_groups; pick a CPU type for scheduler.system_nodes (m7i.large)")
