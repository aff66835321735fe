"""The Kubernetes side of an EKS stack (issue 36 items 3 and 4): charts, Kueue objects, admission rules.

No API server runs here, so each object is held to what the API server would hold it to: built-in
kinds to kubernetes-validate's strict OpenAPI schemas of the cluster's version, Kueue's (and
JobSet's) kinds to the pinned schemas in gpucluster/eks/schemas (with jsonschema, and with the
conformance validator `plan` uses), the admission policies' CEL evaluated with cel-python against
fixture pods, jobs and JobSets. The renderers are tested as plain functions; tests/test_eks_software.py
registers them under the mock engine.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from base_config import base
from gpucluster import catalog, ledger
from gpucluster.conformance.cfnschema import Validator
from gpucluster.conformance.findings import Computed
from gpucluster.eks import admission, charts, crds, queues
from gpucluster.eks.labels import EFA_RESOURCE, GPU_RESOURCE, GROUP_LABEL, MAX_EXEC_TIME_LABEL, QUEUE_LABEL
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec

KUBERNETES = "1.33"
"""The cluster version the tests render for; kubernetes-validate 1.37.0 ships v1.33.0 schemas (exact)."""
DIGEST = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
REMOTE_WRITE = ("https://aps-workspaces.us-east-1.amazonaws.com/workspaces/"
                "ws-12345678-1234-1234-1234-123456789012/api/v1/remote_write")


def eks_config(*, mig: Any = None, teams: tuple[str, ...] = ("ml", "research"),
               observability: bool = True) -> dict[str, Any]:
    """Three groups, one per purchase tier: EFA p5 on-demand, a reserved p4d, spot g5."""
    config = base()
    zones = sorted(set(catalog.offered_zones("p5.48xlarge", "us-east-1") or [])
                   & set(catalog.offered_zones("p4d.24xlarge", "us-east-1") or [])
                   & set(catalog.offered_zones("g5.xlarge", "us-east-1") or []))
    # EKS's control plane needs two zones (spec/scheduler.py); the EFA group stays in the first
    config["gpucluster:network"]["availability_zones"] = zones[:2]
    reserved: dict[str, Any] = {"name": "reserved", "instance_types": ["p4d.24xlarge"], "max_nodes": 2,
                                "efa": "off", "availability_zones": zones[:1],
                                "capacity": {"capacity_reservation_id": "cr-0123456789abcdef0"}}
    if mig is not None:
        reserved["mig"] = mig
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4},
        reserved,
        {"name": "spot", "instance_types": ["g5.xlarge"], "max_nodes": 3, "capacity": {"spot_percent": 100}}]
    config["gpucluster:scheduler"] = {"type": "eks", "teams": list(teams), "max_run_minutes": 600}
    if observability:
        config["gpucluster:observability"] = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}
    return config


def eks_spec(**kwargs: Any) -> StackSpec:
    return parse_stack_config(eks_config(**kwargs), stack="t")


SPEC = eks_spec()
ASGS = {"train": "gpucluster-t-train-1a2b3c4", "reserved": "gpucluster-t-reserved-5d6e7f8",
        "spot": "gpucluster-t-spot-9a0b1c2"}
CTX = charts.Context("gpucluster-t", KUBERNETES, "https://sqs.us-east-1.amazonaws.com/123456789012/q",
                     ASGS, REMOTE_WRITE)


def by_release(spec: StackSpec, ctx: charts.Context = CTX) -> dict[str, charts.Chart]:
    return {c.release: c for c in charts.charts(spec, ctx)}


# ------------------------------------------------------------------ the proof: schemas


def strict(obj: dict[str, Any], version: str = KUBERNETES) -> None:
    """kubernetes-validate --strict for `version` (raises on an unknown field or a wrong type)."""
    used = kubernetes_validate.validate(copy.deepcopy(obj), f"{version}.0", strict=True)
    assert used == version  # the schemas of that very version, not an older nearest one


def pinned(obj: dict[str, Any]) -> list[str]:
    """The pinned schema's verdict twice: jsonschema (Draft 2020-12) and plan's conformance validator."""
    root = crds.schema(obj["apiVersion"], obj["kind"])
    assert root is not None, f"no pinned schema of {obj['apiVersion']} {obj['kind']}"
    errors = [e.message for e in jsonschema.Draft202012Validator(root).iter_errors(obj)]
    check = Validator(root, Computed([]), engine_names=False)
    check.check(obj, root, "", "#")
    assert bool(errors) == bool(check.found), (errors, check.found)
    return errors


def all_objects(spec: StackSpec) -> list[dict[str, Any]]:
    return [*queues.objects(spec), *admission.objects(spec)]


@pytest.mark.parametrize("variant", ["prod-like", "mig-single", "mig-mixed", "no-teams"])
def test_every_object_passes_its_schema(variant: str) -> None:
    spec = {"prod-like": SPEC, "mig-single": eks_spec(mig={"profile": "1g.10gb"}),
            "mig-mixed": eks_spec(mig={"profiles": ["3g.20gb", "2g.10gb", "1g.5gb"]}),
            "no-teams": eks_spec(teams=())}[variant]
    for obj in all_objects(spec):
        if crds.schema(obj["apiVersion"], obj["kind"]) is not None:
            assert pinned(obj) == [], obj
        else:
            strict(obj)
    assert pinned(queues.kueue_configuration(spec)) == []


def test_kubernetes_validate_ships_the_version_the_tests_use() -> None:
    assert f"{KUBERNETES}.0" in kubernetes_validate.utils.all_versions()


def test_the_schemas_catch_what_an_api_server_would_refuse() -> None:
    policy = admission.pod_policy(SPEC)
    bad = copy.deepcopy(policy)
    bad["spec"]["validations"][0]["expresion"] = bad["spec"]["validations"][0].pop("expression")
    with pytest.raises(kubernetes_validate.ValidationError):
        strict(bad)
    queue = queues.cluster_queue(SPEC)
    typo = copy.deepcopy(queue)
    typo["spec"]["queueingStrategy"] = "FIFO"
    typo["spec"]["resourceGroups"][0]["flavors"][0]["resource"] = []
    assert len(pinned(typo)) >= 2
    config = queues.kueue_configuration(SPEC)
    config["waitForPodsReady"]["timeout"] = "ten minutes"
    assert pinned(config)


def test_the_pinned_schemas_name_their_source_and_ledger_entry() -> None:
    ids = {e.id for e in ledger.load_ledger()}
    kinds = crds.pinned_kinds()
    assert {("kueue.x-k8s.io/v1beta1", "ClusterQueue"), ("jobset.x-k8s.io/v1alpha2", "JobSet")} <= set(kinds)
    for api_version, kind in kinds:
        root = crds.schema(api_version, kind)
        assert root is not None and root["x-gpucluster-ledger"] in ids
        assert "kubernetes-sigs/" in root["description"]
        jsonschema.Draft202012Validator.check_schema(root)


def jobset(gpus: int = 8, efa: int = 32, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The two-node torchrun JobSet of the guide's shape (what the job backend submits)."""
    container = {"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
                 "command": ["torchrun", "--nnodes=2", "train.py"],
                 "resources": {"limits": {GPU_RESOURCE: gpus, EFA_RESOURCE: efa}},
                 "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    pod = {"containers": [container], "restartPolicy": "Never",
           "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ml", "labels": labels if labels is not None else {
                QUEUE_LABEL: queues.LOCAL_QUEUE, MAX_EXEC_TIME_LABEL: "3600"}},
            "spec": {"replicatedJobs": [{"name": "worker", "replicas": 1, "template": {"spec": {
                "parallelism": 2, "completions": 2, "backoffLimit": 0, "completionMode": "Indexed",
                "template": {"spec": pod}}}}],
                "network": {"enableDNSHostnames": True},
                "successPolicy": {"operator": "All"}, "failurePolicy": {"maxRestarts": 0}}}


def test_a_jobset_passes_the_pinned_schema_and_its_job_template_the_api_s() -> None:
    js = jobset()
    assert pinned(js) == []
    template = js["spec"]["replicatedJobs"][0]["template"]
    strict({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w"}, **template})
    js["spec"]["successPolicy"]["operator"] = "Some"
    assert pinned(js)


# ------------------------------------------------------------------ charts


def test_every_chart_is_pinned_from_a_named_repository_with_its_ledger_entry() -> None:
    ids = {e.id: e for e in ledger.load_ledger()}
    for spec in (SPEC, eks_spec(mig={"profile": "1g.10gb"})):
        for c in charts.charts(spec, CTX):
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", c.version), c  # one version, never a range
            assert c.repo.startswith(("https://", "oci://")), c
            assert c.ledger_id in ids and ids[c.ledger_id].status == "unverified"
            assert c.version in ids[c.ledger_id].says
            json.dumps(c.values)  # plain data: what plan shows


def test_without_mig_the_device_plugin_runs_on_our_groups_tolerating_the_taint() -> None:
    found = by_release(SPEC)
    assert "gpu-operator" not in found
    plugin = found["nvidia-device-plugin"].values
    assert plugin["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    terms = plugin["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": GROUP_LABEL, "operator": "In", "values": ["reserved", "spot", "train"]}]


@pytest.mark.parametrize(("mig", "strategy", "devices"), [
    ({"profile": "1g.10gb"}, "single", {"1g.10gb": 4}),
    ({"profiles": ["3g.20gb", "2g.10gb", "1g.5gb"]}, "mixed", {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}),
])
def test_with_mig_the_gpu_operator_feeds_mig_manager_our_layout(
        mig: Any, strategy: str, devices: dict[str, int]) -> None:
    spec = eks_spec(mig=mig)
    found = by_release(spec)
    assert "nvidia-device-plugin" not in found
    values = found["gpu-operator"].values
    assert values["driver"] == {"enabled": False} and values["toolkit"] == {"enabled": False}
    assert values["mig"] == {"strategy": strategy}
    config = values["migManager"]["config"]
    assert config["default"] == charts.MIG_DISABLED and config["create"] is True
    parted = yaml.safe_load(config["data"]["config.yaml"])
    assert parted["mig-configs"]["gpucluster-reserved"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": devices}]
    assert set(parted["mig-configs"]) == {"all-disabled", "gpucluster-reserved"}
    group = next(g for g in spec.node_groups if g.name == "reserved")
    assert charts.mig_node_labels(group) == {"nvidia.com/mig.config": "gpucluster-reserved"}
    assert charts.mig_node_labels(spec.node_groups[0]) == {}


def test_the_efa_plugin_runs_only_on_efa_groups_and_only_where_there_is_one() -> None:
    values = by_release(SPEC)["aws-efa-k8s-device-plugin"].values
    assert values["supportedInstanceLabels"] == {"keys": [GROUP_LABEL], "values": ["train"]}
    assert values["tolerations"][0]["key"] == "nvidia.com/gpu"
    config = eks_config()
    config["gpucluster:node_groups"][0]["efa"] = "off"
    assert "aws-efa-k8s-device-plugin" not in by_release(parse_stack_config(config, stack="t"))


def test_the_autoscaler_tries_reserved_then_on_demand_then_spot_by_asg_name() -> None:
    values = by_release(SPEC)["cluster-autoscaler"].values
    assert values["extraArgs"]["expander"] == "priority"
    assert values["autoDiscovery"] == {"clusterName": "gpucluster-t",
                                       "tags": ["kubernetes.io/cluster/gpucluster-t"]}
    assert values["image"] == {"tag": "v1.33.0"} and values["awsRegion"] == "us-east-1"
    tiers = yaml.safe_load(values["expanderPriorities"])
    assert list(tiers) == [30, 20, 10]
    assert tiers == {30: ["^gpucluster-t-reserved-5d6e7f8$"], 20: ["^gpucluster-t-train-1a2b3c4$"],
                     10: ["^gpucluster-t-spot-9a0b1c2$"]}
    assert values["extraArgs"]["max-node-provision-time"] == f"{SPEC.node_groups[0].launch_timeout_minutes}m"
    assert values["rbac"]["serviceAccount"]["name"] == charts.AUTOSCALER_SA[1]


def test_an_asg_name_is_matched_literally() -> None:
    assert re.fullmatch(f"^{charts._regex('a.b+c')}$", "a.b+c")
    assert not re.fullmatch(f"^{charts._regex('a.b+c')}$", "axbbc")


def test_the_termination_handler_reads_its_queue() -> None:
    values = by_release(SPEC)["aws-node-termination-handler"].values
    assert values["enableSqsTerminationDraining"] is True and values["queueURL"] == CTX.termination_queue_url
    assert values["serviceAccount"]["name"] == charts.TERMINATION_HANDLER_SA[1]


def test_kueue_s_configuration_is_all_or_nothing_and_waits_for_the_slowest_launch() -> None:
    values = by_release(SPEC)["kueue"].values
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config == queues.kueue_configuration(SPEC)
    wait = config["waitForPodsReady"]
    assert wait["enable"] is True and wait["blockAdmission"] is True
    assert wait["timeout"] == f"{max(g.launch_timeout_minutes for g in SPEC.node_groups) + 5}m"
    assert "jobset.x-k8s.io/jobset" in config["integrations"]["frameworks"]
    assert list(by_release(SPEC)).index("jobset") < list(by_release(SPEC)).index("kueue")


PORT = "registry.example.com:5000/team/dcgm-exporter"


@pytest.mark.parametrize(("image", "repository", "tag"), [
    (DIGEST, "nvcr.io/nvidia/k8s/dcgm-exporter", "3.3.9-3.6.1-ubuntu22.04@" + DIGEST.partition("@")[2]),
    (f"{PORT}:4.1.1@sha256:" + "cd" * 32, PORT, "4.1.1@sha256:" + "cd" * 32),
    (f"{PORT}@sha256:" + "ef" * 32, PORT, "latest@sha256:" + "ef" * 32)])
def test_the_exporter_image_is_the_stack_file_s_digest_as_the_chart_joins_it(
        image: str, repository: str, tag: str) -> None:
    assert charts.image_values(image) == {"repository": repository, "tag": tag}


def test_the_eks_schemas_are_package_data() -> None:
    from pathlib import Path
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    assert '"gpucluster.eks" = ["schemas/*.json"]' in pyproject.read_text()


def test_metrics_only_with_observability_and_remote_written_to_the_stack_s_amp() -> None:
    found = by_release(SPEC)
    dcgm = found["dcgm-exporter"].values
    assert dcgm["kubernetes"]["enablePodLabels"] is True
    assert f'{dcgm["image"]["repository"]}:{dcgm["image"]["tag"]}' == DIGEST
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge" in dcgm["customMetrics"]
    agent = found["prometheus-agent"].values
    assert agent["server"]["agentMode"] is True
    assert agent["server"]["remoteWrite"][0]["url"] == REMOTE_WRITE
    assert agent["server"]["remoteWrite"][0]["sigv4"] == {"region": "us-east-1"}
    assert agent["serviceAccounts"]["server"]["name"] == charts.METRICS_AGENT_SA[1]
    assert not {"dcgm-exporter", "prometheus-agent"} & set(by_release(eks_spec(observability=False)))


# ------------------------------------------------------------------ queues


def test_a_flavor_per_group_selecting_its_nodes_and_tolerating_the_taint() -> None:
    flavors = [o for o in queues.objects(SPEC) if o["kind"] == "ResourceFlavor"]
    assert [f["metadata"]["name"] for f in flavors] == ["train", "reserved", "spot"]
    assert flavors[0]["spec"] == {"nodeLabels": {GROUP_LABEL: "train"}, "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}


def quotas(spec: StackSpec) -> dict[str, dict[str, Any]]:
    group = queues.cluster_queue(spec)["spec"]["resourceGroups"][0]
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}


def test_the_cluster_queue_s_quota_is_what_the_groups_hold_at_max_size() -> None:
    found = quotas(SPEC)
    p5, p4d, g5 = (catalog.get(t) for t in ("p5.48xlarge", "p4d.24xlarge", "g5.xlarge"))
    assert p5 and p4d and g5
    assert found["train"] == {"cpu": p5.vcpus * 4, "memory": f"{p5.memory_mib * 4}Mi",
                              GPU_RESOURCE: p5.gpus * 4, EFA_RESOURCE: p5.efa_interface_count * 4}
    assert found["reserved"][GPU_RESOURCE] == p4d.gpus * 2 and found["reserved"][EFA_RESOURCE] == 0
    assert found["spot"][GPU_RESOURCE] == g5.gpus * 3
    assert found["train"][GPU_RESOURCE] == 32  # 8 H100s x 4 nodes


def test_mig_quota_counts_instances() -> None:
    single = quotas(eks_spec(mig={"profile": "1g.10gb"}))
    assert single["reserved"][GPU_RESOURCE] == 8 * 4 * 2
    mixed = quotas(eks_spec(mig={"profiles": ["3g.20gb", "2g.10gb", "1g.5gb"]}))
    assert mixed["reserved"][GPU_RESOURCE] == 0
    assert mixed["reserved"]["nvidia.com/mig-3g.20gb"] == 8 * 2
    assert mixed["train"]["nvidia.com/mig-1g.5gb"] == 0


def test_a_namespace_and_local_queue_per_team_and_default_without_teams() -> None:
    objs = queues.objects(SPEC)
    assert [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs[4:]] == [
        ("Namespace", None, "ml"), ("Namespace", None, "research"),
        ("LocalQueue", "ml", "gpu"), ("LocalQueue", "research", "gpu")]
    assert queues.cluster_queue(SPEC)["spec"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "gpucluster.io/team", "operator": "Exists"}]}
    bare = eks_spec(teams=())
    assert [(o["kind"], o["metadata"].get("namespace")) for o in queues.objects(bare)[4:]] == [
        ("LocalQueue", "default")]
    assert queues.cluster_queue(bare)["spec"]["namespaceSelector"] == {}
    assert queues.max_exec_seconds(SPEC) == 600 * 60


# ------------------------------------------------------------------ admission: CEL evaluated


def evaluate(policy: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """The messages of the validations `obj` fails, as the API server would evaluate the policy."""
    env = celpy.Environment()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(obj)}
    variables = celpy.celtypes.MapType({})
    for var in policy["spec"]["variables"]:
        activation["variables"] = variables
        value = env.program(env.compile(var["expression"])).evaluate(activation)
        variables[celpy.celtypes.StringType(var["name"])] = value
    activation["variables"] = variables
    failed = []
    for v in policy["spec"]["validations"]:
        try:
            result = env.program(env.compile(v["expression"])).evaluate(activation)
        except celpy.CELEvalError:  # an evaluation error under failurePolicy Fail refuses too
            result = celpy.celtypes.BoolType(False)
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            failed.append(v["message"])
    return failed


def pod(*, limits: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        node_selector: dict[str, str] | None = None, affinity_group: str | None = None,
        owner: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                           "spec": {"containers": [container]}}
    if labels is not None:
        obj["metadata"]["labels"] = labels
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner, "name": "j",
                                               "uid": "u", "controller": True}]
    if node_selector is not None:
        obj["spec"]["nodeSelector"] = node_selector
    if affinity_group is not None:
        obj["spec"]["affinity"] = charts.on_groups([affinity_group])
    strict(obj)  # every fixture is a pod the API would take
    return obj


QUEUED_LABELS = {QUEUE_LABEL: "gpu"}
GPU = {GPU_RESOURCE: 8}
GPU_EFA = {GPU_RESOURCE: 8, EFA_RESOURCE: 32}


@pytest.mark.parametrize(("fixture", "refused"), [
    (pod(), []),                                                           # a CPU pod
    (pod(limits={"cpu": "1"}), []),
    (pod(limits=GPU, labels=QUEUED_LABELS), []),                           # GPU pod, queued
    (pod(limits=GPU), ["queued"]),                                          # GPU pod, no queue
    (pod(limits={"nvidia.com/mig-1g.10gb": 1}), ["queued"]),                # a MIG instance is a GPU
    (pod(limits=GPU, owner="Job"), []),                                     # judged at its Job
    (pod(limits=GPU, owner="ReplicaSet"), ["queued"]),                      # a Deployment's is not
    (pod(limits=GPU_EFA, labels=QUEUED_LABELS, node_selector={GROUP_LABEL: "train"}), []),
    (pod(limits=GPU, labels=QUEUED_LABELS, node_selector={GROUP_LABEL: "train"}), ["EFA"]),
    (pod(limits=GPU, labels=QUEUED_LABELS, affinity_group="train"), ["EFA"]),
    (pod(limits=GPU_EFA, labels=QUEUED_LABELS, affinity_group="train"), []),
    (pod(limits=GPU, labels=QUEUED_LABELS, node_selector={GROUP_LABEL: "spot"}), []),  # not an EFA group
    (pod(node_selector={GROUP_LABEL: "train"}), ["EFA"]),                   # no GPU, still on EFA nodes
    (pod(limits=GPU), ["queued"]),
], ids=lambda v: json.dumps(v)[:60] if isinstance(v, dict) else str(v))
def test_the_pod_policy(fixture: dict[str, Any], refused: list[str]) -> None:
    failed = evaluate(admission.pod_policy(SPEC), fixture)
    assert len(failed) == len(refused)
    for word, message in zip(refused, failed, strict=True):
        assert word in message


def job(*, limits: dict[str, Any], labels: dict[str, str] | None, owner: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job",
                           "metadata": {"name": "j", "namespace": "ml"},
                           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                               {"name": "c", "image": "busybox", "resources": {"limits": limits}}]}}}}
    if labels is not None:
        obj["metadata"]["labels"] = labels
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": owner,
                                               "name": "js", "uid": "u", "controller": True}]
    strict(obj)
    return obj


LIMIT = str(600 * 60)


@pytest.mark.parametrize(("fixture", "refused"), [
    (job(limits={"cpu": "1"}, labels=None), []),
    (job(limits=GPU, labels=None), ["queued"]),
    (job(limits=GPU, labels={QUEUE_LABEL: "gpu", MAX_EXEC_TIME_LABEL: LIMIT}), []),
    (job(limits=GPU, labels={QUEUE_LABEL: "gpu"}), ["max-exec-time"]),
    (job(limits=GPU, labels={QUEUE_LABEL: "gpu", MAX_EXEC_TIME_LABEL: str(600 * 60 + 1)}), ["max-exec-time"]),
    (job(limits=GPU, labels={QUEUE_LABEL: "gpu", MAX_EXEC_TIME_LABEL: "1h"}), ["max-exec-time"]),
    (job(limits=GPU, labels=None, owner="JobSet"), []),
])
def test_the_job_policy(fixture: dict[str, Any], refused: list[str]) -> None:
    failed = evaluate(admission.job_policy(SPEC), fixture)
    assert [w for w, m in zip(refused, failed, strict=True) if w in m] == refused


@pytest.mark.parametrize(("fixture", "refused"), [
    (jobset(), []),
    (jobset(labels={}), ["queued"]),
    (jobset(labels={QUEUE_LABEL: "gpu"}), ["max-exec-time"]),
    (jobset(labels={QUEUE_LABEL: "gpu", MAX_EXEC_TIME_LABEL: LIMIT}), []),
])
def test_the_jobset_policy(fixture: dict[str, Any], refused: list[str]) -> None:
    failed = evaluate(admission.jobset_policy(SPEC), fixture)
    assert [w for w, m in zip(refused, failed, strict=True) if w in m] == refused


def test_without_an_efa_group_the_pod_policy_has_no_efa_rule() -> None:
    config = eks_config()
    config["gpucluster:node_groups"][0]["efa"] = "off"
    policy = admission.pod_policy(parse_stack_config(config, stack="t"))
    assert len(policy["spec"]["validations"]) == 1
    assert evaluate(policy, pod(limits=GPU, labels=QUEUED_LABELS, node_selector={GROUP_LABEL: "train"})) == []


def test_system_namespaces_are_not_matched_and_every_policy_is_bound_to_deny() -> None:
    objs = admission.objects(SPEC)
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == {p["metadata"]["name"] for p in policies}
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    for p in policies:
        selector = p["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
        assert selector["operator"] == "NotIn" and "kube-system" in selector["values"]
        assert p["spec"]["failurePolicy"] == "Fail"
