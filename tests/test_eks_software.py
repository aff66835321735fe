"""ClusterSoftware under the mock engine (issue 36 items 3 and 4): every Release, Kueue object,
admission policy, queue, rule, role and Pod Identity association it registers, standalone with a real
`pulumi_kubernetes.Provider`. The inputs are what `plan` shows: Release values equal the renderers'
output with the resolved names, the objects dumped from the mocks pass kubernetes-validate --strict
and the pinned schemas, and the whole registration passes the provider-conformance check (pulumi
-kubernetes' input types included).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pulumi_kubernetes as k8s
import pytest

from gpucluster.aws.eks_software import ClusterSoftware
from gpucluster.conformance import check_resources
from gpucluster.eks import admission, charts, crds, queues, rbac
from gpucluster.plan import PlannedResource, record_resources
from gpucluster.spec import STACK_TAG, StackSpec
from test_eks_objects import ASGS, KUBERNETES, REMOTE_WRITE, SPEC, eks_spec, pinned, strict

RELEASE = "kubernetes:helm.sh/v3:Release"
CUSTOM = "kubernetes:kueue.x-k8s.io/v1beta1:"
ACCOUNT = "123456789012"
ASG_ARNS = {g: f"arn:aws:autoscaling:us-east-1:{ACCOUNT}:autoScalingGroup:0000:autoScalingGroupName/{n}"
            for g, n in ASGS.items()}
WORKSPACE_ARN = f"arn:aws:aps:us-east-1:{ACCOUNT}:workspace/ws-12345678-1234-1234-1234-123456789012"


def build(spec: StackSpec, **extra: Any) -> ClusterSoftware:
    provider = k8s.Provider("eks", kubeconfig=json.dumps({"apiVersion": "v1", "kind": "Config"}))
    args: dict[str, Any] = {"remote_write_url": REMOTE_WRITE, "workspace_arn": WORKSPACE_ARN, **extra}
    return ClusterSoftware("sw", spec, provider, cluster_name="gpucluster-t", kubernetes_version=KUBERNETES,
                           asg_names=ASGS, asg_arns=ASG_ARNS, **args)


@cache
def registered(variant: str = "prod-like") -> tuple[PlannedResource, ...]:
    spec = {"prod-like": SPEC, "mig": eks_spec(mig={"profile": "1g.10gb"}),
            "bare": eks_spec(teams=(), observability=False)}[variant]
    resources, _ = record_resources(lambda: build(spec))
    return tuple(resources)


def of_type(token: str, variant: str = "prod-like") -> list[PlannedResource]:
    return [r for r in registered(variant) if r.type == token]


def one(token: str, name: str, variant: str = "prod-like") -> PlannedResource:
    found = [r for r in of_type(token, variant) if r.name == name]
    assert len(found) == 1, [r.name for r in of_type(token, variant)]
    return found[0]


@pytest.mark.parametrize("variant", ["prod-like", "mig", "bare"])
def test_everything_registered_conforms_to_its_provider_sdk_and_schemas(variant: str) -> None:
    resources = registered(variant)
    assert any(r.type == RELEASE for r in resources)
    assert check_resources(resources, "us-east-1") == []


def test_each_chart_is_a_release_with_its_pin_and_the_rendered_values() -> None:
    queue_url = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/sw-nth"
    expected = {c.release: c for c in charts.charts(SPEC, charts.Context(
        "gpucluster-t", KUBERNETES, queue_url, ASGS, REMOTE_WRITE))}
    releases = {r.inputs["name"]: r for r in of_type(RELEASE)}
    assert sorted(releases) == sorted(expected)
    for name, chart in expected.items():
        inputs = releases[name].inputs
        assert inputs["version"] == chart.version and inputs["namespace"] == chart.namespace
        if chart.oci:
            assert inputs["chart"] == f"{chart.repo}/{chart.chart}" and "repositoryOpts" not in inputs
        else:
            assert inputs["chart"] == chart.chart and inputs["repositoryOpts"] == {"repo": chart.repo}
        assert inputs["values"] == json.loads(json.dumps(chart.values)), name
        provider = releases[name].provider
        assert provider is not None and "pulumi:providers:kubernetes" in provider


def test_kueue_objects_come_after_kueue_and_local_queues_after_their_namespace() -> None:
    kueue = one(RELEASE, "sw-kueue")
    jobset = one(RELEASE, "sw-jobset")
    assert jobset.urn in kueue.dependency_urns
    queue = one(CUSTOM + "ClusterQueue", "sw-clusterqueue-gpu")
    assert kueue.urn in queue.dependency_urns
    namespace = one("kubernetes:core/v1:Namespace", "sw-namespace-ml")
    local = one(CUSTOM + "LocalQueue", "sw-localqueue-ml-gpu")
    assert {namespace.urn, queue.urn, kueue.urn} <= set(local.dependency_urns)
    policy = one("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
                 "sw-validatingadmissionpolicy-gpucluster-gpu-pods")
    binding = one("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
                  "sw-validatingadmissionpolicybinding-gpucluster-gpu-pods")
    assert policy.urn in binding.dependency_urns and jobset.urn in policy.dependency_urns


def _integral(value: Any) -> Any:
    """The engine carries numbers as floats; the provider sends 768.0 as JSON 768 (Go's float64)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def dumped(variant: str = "prod-like") -> list[dict[str, Any]]:
    """Every Kubernetes object the mocks saw, as the API server would get it."""
    return [_integral(dict(r.inputs)) for r in registered(variant)
            if r.type.startswith("kubernetes:") and r.type != RELEASE and r.custom]


@pytest.mark.parametrize("variant", ["prod-like", "mig", "bare"])
def test_every_object_from_the_mocks_is_valid_for_the_cluster_version(variant: str) -> None:
    objects = dumped(variant)
    kinds = {o["kind"] for o in objects}
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds
    for obj in objects:
        if crds.schema(obj["apiVersion"], obj["kind"]) is not None:
            assert pinned(obj) == [], obj
        else:
            strict(obj)


def test_the_objects_are_the_renderers_own() -> None:
    rendered = [*queues.objects(SPEC), *admission.objects(SPEC), *rbac.objects()]
    assert sorted(json.dumps(o, sort_keys=True) for o in dumped()) == \
        sorted(json.dumps(o, sort_keys=True) for o in rendered)


def policy_of(role: str) -> dict[str, Any]:
    return json.loads(one("aws:iam/rolePolicy:RolePolicy", f"sw-{role}").inputs["policy"])


def test_the_autoscaler_scales_only_the_stack_s_tagged_groups() -> None:
    scale = policy_of("autoscaler")["Statement"][0]
    assert scale["Action"] == ["autoscaling:SetDesiredCapacity",
                               "autoscaling:TerminateInstanceInAutoScalingGroup"]
    assert scale["Resource"] == sorted(ASG_ARNS.values())
    assert scale["Condition"] == {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": SPEC.identity}}
    describe = policy_of("autoscaler")["Statement"][1]
    assert all(a.split(":")[1].startswith(("Describe", "GetInstanceTypes")) for a in describe["Action"])


def test_the_termination_handler_reads_only_its_queue_and_completes_only_own_hooks() -> None:
    queue = one("aws:sqs/queue:Queue", "sw-nth")
    statements = policy_of("termination-handler")["Statement"]
    assert statements[0]["Resource"] == [f"arn:aws:sqs:us-east-1:{ACCOUNT}:sw-nth"]
    assert statements[1]["Action"] == ["autoscaling:CompleteLifecycleAction"]
    assert statements[1]["Condition"]["StringEquals"] == {f"aws:ResourceTag/{STACK_TAG}": SPEC.identity}
    assert queue.inputs["sqsManagedSseEnabled"] is True


def test_the_queue_takes_messages_only_from_the_stack_s_rules() -> None:
    rules = {r.name: r for r in of_type("aws:cloudwatch/eventRule:EventRule")}
    assert set(rules) == {f"sw-nth-{k}" for k in ("spot-interruption", "rebalance", "instance-state",
                                                  "scheduled-change", "asg-lifecycle")}
    lifecycle = json.loads(rules["sw-nth-asg-lifecycle"].inputs["eventPattern"])
    assert lifecycle["detail"] == {"AutoScalingGroupName": sorted(ASGS.values())}
    targets = of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert len(targets) == len(rules) and all(t.inputs["arn"].endswith(":sw-nth") for t in targets)
    policy = json.loads(one("aws:sqs/queuePolicy:QueuePolicy", "sw-nth").inputs["policy"])
    allow = policy["Statement"][0]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    assert allow["Condition"]["ArnEquals"]["aws:SourceArn"] == sorted(
        f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:{name}" for name in rules)


def test_each_aws_calling_pod_gets_its_role_by_pod_identity() -> None:
    found = {(r.inputs["namespace"], r.inputs["serviceAccount"]): r
             for r in of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    assert set(found) == {charts.AUTOSCALER_SA, charts.TERMINATION_HANDLER_SA, charts.METRICS_AGENT_SA}
    assert all(r.inputs["clusterName"] == "gpucluster-t" for r in found.values())
    cluster = f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/gpucluster-t"
    trusted = set()
    for role in of_type("aws:iam/role:Role"):
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert trust["Action"] == ["sts:AssumeRole", "sts:TagSession"]
        # the session tags EKS Pod Identity sends (EKS user guide): this cluster, one service account
        tags = trust["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/eks-cluster-arn"] == cluster
        trusted.add((tags["aws:RequestTag/kubernetes-namespace"],
                     tags["aws:RequestTag/kubernetes-service-account"]))
    assert trusted == set(found)  # each role trusts only the service account its association names
    write = policy_of("metrics-agent")["Statement"][0]
    assert write["Action"] == ["aps:RemoteWrite"] and write["Resource"] == [WORKSPACE_ARN]
    releases = {r.inputs["name"]: r for r in of_type(RELEASE)}
    association = found[charts.AUTOSCALER_SA]
    assert association.urn in releases["cluster-autoscaler"].dependency_urns


def test_without_observability_no_metrics_role_or_charts() -> None:
    names = {r.inputs["name"] for r in of_type(RELEASE, "bare")}
    assert not {"dcgm-exporter", "prometheus-agent"} & names
    assert len(of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation", "bare")) == 2
    assert [r.inputs["metadata"]["namespace"] for r in of_type(CUSTOM + "LocalQueue", "bare")] == ["default"]


def test_metrics_need_both_the_remote_write_url_and_the_workspace() -> None:
    resources, _ = record_resources(lambda: build(SPEC, remote_write_url=None, workspace_arn=None))
    names = {r.inputs["name"] for r in resources if r.type == RELEASE}
    assert "cluster-autoscaler" in names and not {"dcgm-exporter", "prometheus-agent"} & names
    with pytest.raises(ValueError, match="come together"):
        build(SPEC, workspace_arn=None)


def test_a_chart_whose_pods_call_aws_waits_for_their_pod_identity() -> None:
    associations = {(r.inputs["namespace"], r.inputs["serviceAccount"]): r.urn
                    for r in of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    releases = {r.inputs["name"]: r for r in of_type(RELEASE)}
    for chart in charts.charts(SPEC, charts.Context("c", KUBERNETES, "q", ASGS, REMOTE_WRITE)):
        if chart.service_account is not None:
            assert associations[chart.service_account] in releases[chart.release].dependency_urns
    assert {c.service_account for c in charts.charts(SPEC, charts.Context("c", KUBERNETES, "q", ASGS,
                                                                           REMOTE_WRITE))} - {None} == \
        set(associations)
