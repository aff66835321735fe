"""The admission rules of an EKS stack as ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1,
CEL; Kubernetes docs, "Validating Admission Policy"), with their bindings, as plain dicts.

- No GPU without the queue: a Pod, batch Job or JobSet asking for an `nvidia.com/*` resource (a GPU or
  a MIG instance) must carry `kueue.x-k8s.io/queue-name`, unless a controller it belongs to is checked
  instead: a Job's pods by their Job, a JobSet's Jobs by their JobSet (whether Kueue copies the label
  down to them is not relied on). A queued Job or JobSet carries a maximum run time no longer than
  the stack's `max_run_minutes` (`kueue.x-k8s.io/max-exec-time-seconds`; `gpucluster run` sets it).
- No silent TCP: a pod bound to an EFA group (its nodeSelector, or a required node affinity, on
  `gpucluster.io/group`) must request `vpc.amazonaws.com/efa`; without it NCCL falls back to sockets.

System namespaces (where the GPU Operator's validators request a GPU) are not matched. The tests
evaluate the expressions with cel-python; that the API server's own CEL type-checks and costs them
the same is not verified here (ledger: eks-admission-cel).
"""

from __future__ import annotations

from typing import Any

from gpucluster.eks import charts, queues
from gpucluster.eks.labels import EFA_RESOURCE, GROUP_LABEL, MAX_EXEC_TIME_LABEL, QUEUE_LABEL
from gpucluster.spec import StackSpec

API = "admissionregistration.k8s.io/v1"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "gpu-operator", "kueue-system",
                     "jobset-system", charts.MONITORING)
POD_POLICY = "gpucluster-gpu-pods"
JOB_POLICY = "gpucluster-gpu-jobs"
JOBSET_POLICY = "gpucluster-gpu-jobsets"


def _cel_list(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _requests(containers: str, resource_test: str) -> str:
    """CEL: some container of `containers` has a request or limit whose name passes `resource_test`
    (a CEL predicate over `k`)."""
    return (f"{containers}.exists(c, has(c.resources) && "
            f"((has(c.resources.limits) && c.resources.limits.exists(k, {resource_test})) || "
            f"(has(c.resources.requests) && c.resources.requests.exists(k, {resource_test}))))")


def _all_containers(pod_spec: str) -> str:
    return f"({pod_spec}.containers + (has({pod_spec}.initContainers) ? {pod_spec}.initContainers : []))"


GPU_KEY = "k.startsWith('nvidia.com/')"
QUEUED = f"(has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels)"


def _owned_by(kind: str) -> str:
    return (f"(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, "
            f"o.kind == '{kind}' && has(o.controller) && o.controller))")


def _max_run(spec: StackSpec) -> str:
    seconds = queues.max_exec_seconds(spec)
    label = f"object.metadata.labels['{MAX_EXEC_TIME_LABEL}']"
    return (f"!{QUEUED} || ('{MAX_EXEC_TIME_LABEL}' in object.metadata.labels && "
            f"{label}.matches('^[0-9]{{1,9}}$') && int({label}) <= {seconds})")


def _efa_group(efa_groups: list[str]) -> str:
    groups = _cel_list(efa_groups)
    selector = (f"has(object.spec.nodeSelector) && '{GROUP_LABEL}' in object.spec.nodeSelector && "
                f"object.spec.nodeSelector['{GROUP_LABEL}'] in {groups}")
    required = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = ("has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
                f"has({required}) && {required}.nodeSelectorTerms.exists(t, has(t.matchExpressions) && "
                f"t.matchExpressions.exists(e, e.key == '{GROUP_LABEL}' && e.operator == 'In' && "
                f"has(e.values) && e.values.exists(v, v in {groups})))")
    return f"({selector}) || ({affinity})"


def _rules(group: str, resource: str) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
             "resources": [resource]}]


def _policy(name: str, rules: list[dict[str, Any]], variables: list[dict[str, str]],
            validations: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": rules, "namespaceSelector": {"matchExpressions": [
                         {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                          "values": list(SYSTEM_NAMESPACES)}]}},
                     "variables": variables, "validations": validations}}


def _binding(policy: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]}}


def pod_policy(spec: StackSpec) -> dict[str, Any]:
    efa_groups = [g.name for g in spec.node_groups if g.efa_enabled]
    variables = [{"name": "containers", "expression": _all_containers("object.spec")},
                 {"name": "gpu", "expression": _requests("variables.containers", GPU_KEY)}]
    validations = [{"expression": f"!variables.gpu || {QUEUED} || {_owned_by('Job')}", "reason": "Forbidden",
                    "message": f"a pod asking for GPUs must be queued: label it {QUEUE_LABEL}=<LocalQueue> "
                               "(or submit it as a Job or JobSet through Kueue)"}]
    if efa_groups:
        variables += [
            {"name": "efaGroup", "expression": _efa_group(efa_groups)},
            {"name": "efa", "expression": _requests("variables.containers", f"k == '{EFA_RESOURCE}'")}]
        validations.append({
            "expression": "!variables.efaGroup || variables.efa", "reason": "Forbidden",
            "message": f"a pod on an EFA node group must request {EFA_RESOURCE} (without it NCCL falls "
                       "back to TCP sockets)"})
    return _policy(POD_POLICY, _rules("", "pods"), variables, validations)


def job_policy(spec: StackSpec) -> dict[str, Any]:
    gpu = _requests(_all_containers("object.spec.template.spec"), GPU_KEY)
    variables = [{"name": "gpu", "expression": gpu}]
    return _policy(JOB_POLICY, _rules("batch", "jobs"), variables, [
        {"expression": f"!variables.gpu || {QUEUED} || {_owned_by('JobSet')}", "reason": "Forbidden",
         "message": f"a Job asking for GPUs must be queued: label it {QUEUE_LABEL}=<LocalQueue>"},
        {"expression": f"{_owned_by('JobSet')} || {_max_run(spec)}", "reason": "Forbidden",
         "message": f"a queued Job needs {MAX_EXEC_TIME_LABEL} of at most {queues.max_exec_seconds(spec)}"}])


def jobset_policy(spec: StackSpec) -> dict[str, Any]:
    pods = "object.spec.replicatedJobs.map(r, r.template.spec.template.spec)"
    gpu = (f"{pods}.exists(s, " + _requests(_all_containers("s"), GPU_KEY) + ")")
    variables = [{"name": "gpu", "expression": gpu}]
    return _policy(JOBSET_POLICY, _rules("jobset.x-k8s.io", "jobsets"), variables, [
        {"expression": f"!variables.gpu || {QUEUED}", "reason": "Forbidden",
         "message": f"a JobSet asking for GPUs must be queued: label it {QUEUE_LABEL}=<LocalQueue>"},
        {"expression": _max_run(spec), "reason": "Forbidden",
         "message": f"a queued JobSet needs {MAX_EXEC_TIME_LABEL} of at most "
                    f"{queues.max_exec_seconds(spec)}"}])


def objects(spec: StackSpec) -> list[dict[str, Any]]:
    """Each policy, then its binding."""
    policies = [pod_policy(spec), job_policy(spec), jobset_policy(spec)]
    return [*policies, *(_binding(p["metadata"]["name"]) for p in policies)]
