"""ClusterSoftware: what runs on an EKS stack's cluster besides the nodes, and the AWS pieces it needs.

Third-party charts as `kubernetes.helm.v3.Release` (inputs, values included, visible to the mock
engine and to `plan`; `gpucluster.eks.charts`), the objects gpucluster owns as typed pulumi-kubernetes
resources (team Namespaces, ValidatingAdmissionPolicies and bindings; `gpucluster.eks.admission`) or
`apiextensions.CustomResource` (Kueue's flavors and queues, after the Kueue release;
`gpucluster.eks.queues`). On the AWS side: the termination handler's SQS queue and EventBridge
rules, and one IAM role per pod that calls AWS (autoscaler, termination handler, metrics agent), each
bound by an `aws.eks.PodIdentityAssociation` (`gpucluster.eks.policies`). The control plane and
the node groups are another component's: their names come in as arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from gpucluster.aws.args import owned_tags, type_token
from gpucluster.aws.iam import boundary_arn
from gpucluster.eks import admission, charts, policies, queues, rbac
from gpucluster.eks.charts import Chart, Context
from gpucluster.noderole import metrics_write_policy_document
from gpucluster.spec import StackSpec

QUEUE_RETENTION_SECONDS = 300
"""An interruption notice is worth acting on for its two minutes; older messages are dropped."""


class ClusterSoftware(pulumi.ComponentResource):
    """Charts, Kueue objects, admission policies, the termination queue and the pods' IAM roles.

    From the control plane and node groups: `provider` (the cluster's `pulumi_kubernetes.Provider`),
    `cluster_name`, `kubernetes_version` (the cluster's, e.g. "1.33"), `asg_names` and `asg_arns` by
    node group name (each group tagged `kubernetes.io/cluster/<cluster>` for the autoscaler's discovery
    and with the stack tag its IAM conditions read); from MetricsWorkspace, where metrics are on,
    `remote_write_url` and `workspace_arn` together (`workspace_owned`: False for an existing workspace,
    which does not carry the stack tag).

    Python users get `releases` (release name -> `helm.v3.Release`), `queue` (`aws.sqs.Queue`),
    `roles` (service account -> `aws.iam.Role`) and `objects` (object name -> resource).
    """

    def __init__(self, name: str, spec: StackSpec, provider: k8s.Provider, *,
                 cluster_name: pulumi.Input[str], kubernetes_version: str,
                 asg_names: Mapping[str, pulumi.Input[str]], asg_arns: Mapping[str, pulumi.Input[str]],
                 remote_write_url: pulumi.Input[str] | None = None,
                 workspace_arn: pulumi.Input[str] | None = None, workspace_owned: bool = True,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        if (remote_write_url is None) != (workspace_arn is None):
            raise ValueError("ClusterSoftware: remote_write_url and workspace_arn come together "
                             "(MetricsWorkspace's), or neither")
        super().__init__(type_token("ClusterSoftware"), name, None, opts)
        self.spec, self.base_name = spec, name
        self.tags = owned_tags(spec.tags, spec.identity, spec.cluster.name)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        self.partition = aws.get_partition_output(opts=invoke).partition
        self.account = aws.get_caller_identity_output(opts=invoke).account_id
        self.cluster_name = pulumi.Output.from_input(cluster_name)
        self.cluster_arn = pulumi.Output.concat("arn:", self.partition, ":eks:", spec.region, ":",
                                                self.account, ":cluster/", self.cluster_name)
        groups = [g.name for g in spec.node_groups]
        arns = pulumi.Output.all(*[asg_arns[g] for g in groups])
        names = pulumi.Output.all(*[asg_names[g] for g in groups])

        self.queue = self._termination_queue(names, child)
        self.roles: dict[str, aws.iam.Role] = {}
        bound = {
            charts.AUTOSCALER_SA: self._pod_role("autoscaler", charts.AUTOSCALER_SA, arns.apply(
                lambda a: json.dumps(policies.autoscaler_policy(a, spec.identity))), child),
            charts.TERMINATION_HANDLER_SA: self._pod_role(
                "termination-handler", charts.TERMINATION_HANDLER_SA,
                pulumi.Output.all(self.queue.arn, arns).apply(lambda v: json.dumps(
                    policies.termination_handler_policy(v[0], v[1], spec.identity))), child)}
        metrics = spec.observability.prometheus.active and workspace_arn is not None
        if metrics and workspace_arn is not None:
            identity = spec.identity if workspace_owned else None
            bound[charts.METRICS_AGENT_SA] = self._pod_role(
                "metrics-agent", charts.METRICS_AGENT_SA, pulumi.Output.from_input(workspace_arn).apply(
                    lambda arn: json.dumps(metrics_write_policy_document(arn, identity))), child)

        # The chart list and static fields are known now; values that name other resources are
        # rendered once those resolve.
        shape = charts.charts(spec, Context.placeholder(spec, kubernetes_version, metrics))
        values = pulumi.Output.all(self.cluster_name, self.queue.url, names,
                                   remote_write_url if metrics else None).apply(
            lambda v: {c.release: c.values for c in charts.charts(spec, Context(
                v[0], kubernetes_version, v[1], dict(zip(groups, v[2], strict=True)), v[3]))})
        k8s_child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.releases: dict[str, k8s.helm.v3.Release] = {}
        for chart in shape:
            needs: list[pulumi.Resource] = [bound[chart.service_account]] if chart.service_account else []
            if chart.release == "kueue" and "jobset" in self.releases:
                needs.append(self.releases["jobset"])  # Kueue's JobSet integration needs JobSet's CRD
            self.releases[chart.release] = self._release(chart, values, k8s_child, needs)
        self.objects: dict[str, pulumi.CustomResource] = {}
        self._kueue_objects(k8s_child)
        self._admission(k8s_child)
        self._node_grants(k8s_child)
        outputs = {"termination_queue_url": self.queue.url}
        self.register_outputs(outputs)

    # ------------------------------------------------------------------ AWS

    def _termination_queue(self, asg_names: pulumi.Output[list[Any]],
                           child: pulumi.ResourceOptions) -> aws.sqs.Queue:
        name = self.base_name
        queue = aws.sqs.Queue(f"{name}-nth", message_retention_seconds=QUEUE_RETENTION_SECONDS,
                              sqs_managed_sse_enabled=True, tags=self.tags, opts=child)
        patterns = asg_names.apply(lambda n: policies.event_patterns(n))
        rules = []
        for rule in policies.event_patterns(["-"]):
            r = aws.cloudwatch.EventRule(
                f"{name}-nth-{rule}", description=f"gpucluster {self.spec.identity}: {rule} to the "
                "node termination handler", event_pattern=patterns.apply(_json_of(rule)),
                tags=self.tags, opts=child)
            aws.cloudwatch.EventTarget(f"{name}-nth-{rule}", rule=r.name, arn=queue.arn, opts=child)
            rules.append(r)
        aws.sqs.QueuePolicy(f"{name}-nth", queue_url=queue.url, policy=pulumi.Output.all(
            queue.arn, *[r.arn for r in rules]).apply(
                lambda v: json.dumps(policies.queue_policy(v[0], v[1:]))),
            opts=child)
        return queue

    def _pod_role(self, part: str, account: tuple[str, str], policy: pulumi.Output[str],
                  child: pulumi.ResourceOptions) -> aws.eks.PodIdentityAssociation:
        name, boundary = f"{self.base_name}-{part}", self.spec.cluster.permissions_boundary
        trust = self.cluster_arn.apply(
            lambda arn: json.dumps(policies.pod_identity_trust(arn, account[0], account[1])))
        role = aws.iam.Role(
            name, assume_role_policy=trust, description=f"gpucluster {self.spec.identity}: {part} pods "
            "(EKS Pod Identity)", tags=self.tags, opts=child,
            permissions_boundary=boundary_arn(self.partition, self.account, boundary) if boundary else None)
        aws.iam.RolePolicy(name, role=role.id, policy=policy, opts=child)
        self.roles[account[1]] = role
        return aws.eks.PodIdentityAssociation(
            name, cluster_name=self.cluster_name, namespace=account[0], service_account=account[1],
            role_arn=role.arn, tags=self.tags, opts=child)

    # ------------------------------------------------------------------ Kubernetes

    def _release(self, chart: Chart, values: pulumi.Output[dict[str, Any]], opts: pulumi.ResourceOptions,
                 needs: list[pulumi.Resource]) -> k8s.helm.v3.Release:
        # An OCI chart is named by its full reference; a repository's by name, with the repository.
        args = k8s.helm.v3.ReleaseArgs(
            chart=f"{chart.repo}/{chart.chart}" if chart.oci else chart.chart,
            repository_opts=None if chart.oci else k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo),
            version=chart.version, name=chart.release, namespace=chart.namespace,
            create_namespace=True, atomic=True, cleanup_on_fail=True,
            values=values.apply(_item(chart.release)))
        return k8s.helm.v3.Release(f"{self.base_name}-{chart.release}", args,
                                   opts=pulumi.ResourceOptions.merge(
                                       opts, pulumi.ResourceOptions(depends_on=needs)))

    def _kueue_objects(self, opts: pulumi.ResourceOptions) -> None:
        """In creation order: flavors and the ClusterQueue after Kueue's CRDs, namespaces before their
        LocalQueues."""
        after: list[pulumi.Resource] = [self.releases["kueue"]]
        for obj in queues.objects(self.spec):
            o = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(after)))
            meta, key = obj["metadata"], _key(obj)
            made: pulumi.CustomResource
            if obj["kind"] == "Namespace":
                made = k8s.core.v1.Namespace(f"{self.base_name}-{key}", metadata=meta, opts=o)
            else:
                made = k8s.apiextensions.CustomResource(
                    f"{self.base_name}-{key}", api_version=obj["apiVersion"], kind=obj["kind"], metadata=meta,
                    spec=obj["spec"], opts=o)
            self.objects[key] = made
            if obj["kind"] in ("ClusterQueue", "Namespace"):
                after.append(made)

    def _admission(self, opts: pulumi.ResourceOptions) -> None:
        after = [self.releases[r] for r in ("jobset", "kueue") if r in self.releases]
        o = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=after))
        for obj in admission.objects(self.spec):
            key = _key(obj)
            if obj["kind"] == "ValidatingAdmissionPolicy":
                self.objects[key] = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                    f"{self.base_name}-{key}", metadata=obj["metadata"], spec=obj["spec"], opts=o)
            else:
                policy = self.objects[f"validatingadmissionpolicy-{obj['spec']['policyName']}"]
                self.objects[key] = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                    f"{self.base_name}-{key}", metadata=obj["metadata"], spec=obj["spec"],
                    opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[policy])))


    def _node_grants(self, opts: pulumi.ResourceOptions) -> None:
        """The nodes' `get nodes/pods` (`gpucluster.eks.rbac`): the node agent's idle signal."""
        role, binding = rbac.objects()
        made = self.objects[_key(role)] = k8s.rbac.v1.ClusterRole(
            f"{self.base_name}-{_key(role)}", metadata=role["metadata"], rules=role["rules"], opts=opts)
        self.objects[_key(binding)] = k8s.rbac.v1.ClusterRoleBinding(
            f"{self.base_name}-{_key(binding)}", metadata=binding["metadata"], role_ref=binding["roleRef"],
            subjects=binding["subjects"],
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[made])))


def _item(key: str) -> Callable[[Mapping[str, Any]], Any]:
    """`m[key]`, for an `apply` inside a loop (binds `key` now)."""
    return lambda m: m[key]


def _json_of(key: str) -> Callable[[Mapping[str, Any]], str]:
    """`m[key]` as JSON, for an `apply` inside a loop."""
    return lambda m: json.dumps(m[key])


def _key(obj: Mapping[str, Any]) -> str:
    """`<kind>-<namespace>-<name>` in lower case: unique among the stack's objects."""
    meta = obj["metadata"]
    return "-".join(p for p in (obj["kind"].lower(), meta.get("namespace"), meta["name"]) if p)

