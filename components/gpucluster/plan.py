"""Offline plans: run the real Pulumi program in-process under Pulumi's mock engine.

It owns reading a stack file, handing its config to the program, and recording
every resource registration (type, name, parent, inputs as the engine gets
them, and the options that matter for safety: protect, retain_on_delete,
ignore_changes). It never talks to AWS or the Pulumi CLI.
"""

from __future__ import annotations

import base64
import hashlib
import json
import runpy
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.proto import source_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from gpucluster import names

# Reading stack files needs no Pulumi: it lives in gpucluster.project (so `cost` never imports
# Pulumi); these names stay importable from here.
from gpucluster.project import (  # noqa: F401
    StackFileError,
    load_stack,
    read_stack_config,
    stack_file,
    stack_name,
)
from gpucluster.spec import PROJECT, StackSpec

MOCK_ACCOUNT = "123456789012"
MOCK_AMI = "ami-0123456789abcdef0"


@dataclass(frozen=True)
class PlannedResource:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict[str, Any]
    protect: bool = False
    retain_on_delete: bool = False
    ignore_changes: tuple[str, ...] = ()
    dependency_urns: tuple[str, ...] = ()
    """Every resource the engine must create first: `depends_on` and those its inputs come from."""
    property_dependencies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Input name -> URNs of the resources that input's value comes from (the engine's view)."""
    provider: str | None = None
    """URN of the explicit provider the resource is created with (None: the stack's default)."""

    @property
    def dependencies(self) -> list[str]:
        """Names of the resources this one depends on, sorted (URN tail after the last `::`)."""
        return sorted({urn.rsplit("::", 1)[-1] for urn in self.dependency_urns})

    def as_json(self) -> dict[str, Any]:
        return {
            "urn": self.urn, "type": self.type, "name": self.name, "parent": self.parent,
            "custom": self.custom, "inputs": self.inputs, "protect": self.protect,
            "retain_on_delete": self.retain_on_delete, "ignore_changes": list(self.ignore_changes),
            "dependencies": self.dependencies,
            "dependency_urns": sorted(self.dependency_urns),
        }


@dataclass
class Plan:
    stack: str
    spec: StackSpec
    resources: list[PlannedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_token]

    def depends_on(self, resource: PlannedResource, other: PlannedResource) -> bool:
        """True when the engine creates `other` before `resource` (directly or through others)."""
        by_urn = {r.urn: r for r in self.resources}
        seen: set[str] = set()
        todo = list(resource.dependency_urns)
        while todo:
            urn = todo.pop()
            if urn == other.urn:
                return True
            if urn not in seen and urn in by_urn:
                seen.add(urn)
                todo.extend(by_urn[urn].dependency_urns)
        return False

    def as_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "region": self.spec.region,
            "resources": [r.as_json() for r in self.resources],
            "outputs": self.outputs,
        }


# ------------------------------------------------------------------------ mocks


class PlanMocks(pulumi.runtime.Mocks):
    """Mock provider: echoes inputs and adds the ids/ARNs real resources would get."""

    def __init__(self, region: str) -> None:
        self.region = region

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        if not args.custom:
            return None, {}
        service = args.typ.split(":")[1].split("/")[0] if ":" in args.typ else "mock"
        arn = f"arn:aws:{service}:{self.region}:{MOCK_ACCOUNT}:{args.name}"
        state = {"arn": arn, "name": args.name, **args.inputs}
        state.setdefault("id", f"{args.name}-id")
        # Names the provider fills in (`<logical>-<7 hex>`), so names built from them (an alarm named
        # after its Auto Scaling group) are as long in the plan as in AWS.
        state.update(names.generated_state(args.typ, args.name, args.inputs))
        state.update(_provider_computed(args.typ, args.name, args.inputs, self.region))
        return state["id"], state

    # pulumi's runtime takes a plain dict (mocks.py: `isinstance(tup, dict)`); Mocks.call's annotation
    # names only the (result, failures) tuple.
    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:  # type: ignore[override]
        token = args.token
        if token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args.get("name"), "value": MOCK_AMI, "type": "String",
                    "arn": f"arn:aws:ssm:{self.region}::parameter{args.args.get('name')}"}
        if token == "aws:ec2/getAmi:getAmi":  # the launch templates' root device (aws.amis): the DLAMI's
            return {"id": MOCK_AMI, "imageId": MOCK_AMI, "rootDeviceName": "/dev/sda1"}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": MOCK_ACCOUNT, "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/plan",
                    "userId": "PLAN"}
        if token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region, "id": self.region}
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"}
        return dict(args.args)


def _provider_computed(typ: str, name: str, inputs: dict[str, Any], region: str) -> dict[str, Any]:
    """Values AWS computes that plans show as outputs: bucket names and ARNs, FSx DNS/mount names."""
    digest = hashlib.sha256(name.encode()).hexdigest()
    if typ == "aws:s3/bucket:Bucket":
        # S3 bucket id == its name; a bucket_prefix gets a 26-character unique suffix.
        found = names.physical_name(typ, name, inputs)
        bucket = found.name if found else name
        return {"id": bucket, "bucket": bucket, "arn": f"arn:aws:s3:::{bucket}"}
    if typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
        fs_id = f"fs-{digest[:17]}"
        return {"id": fs_id, "dnsName": f"{fs_id}.fsx.{region}.amazonaws.com", "mountName": digest[17:25],
                "arn": f"arn:aws:fsx:{region}:{MOCK_ACCOUNT}:file-system/{fs_id}"}
    if typ == "aws:ec2/vpcEndpoint:VpcEndpoint" and inputs.get("vpcEndpointType") == "Gateway":
        return {"prefixListId": "pl-63a5400a"}  # the shape of a real S3 prefix list id
    if typ == "aws:kms/key:Key":
        return {"keyId": f"{name}-id"}  # a key's id (what an alias's targetKeyId takes from key.key_id)
    if typ == "aws:grafana/workspaceServiceAccount:WorkspaceServiceAccount":
        return {"serviceAccountId": f"{name}-id"}  # what its token's serviceAccountId takes
    if typ == "aws:ec2/launchTemplate:LaunchTemplate":
        return {"latestVersion": 1}  # a new template's first version
    if typ == "aws:sqs/queue:Queue":  # a queue's URL: https://sqs.<region>.amazonaws.com/<account>/<name>
        return {"url": f"https://sqs.{region}.amazonaws.com/{MOCK_ACCOUNT}/{inputs.get('name') or name}"}
    if typ == "aws:eks/cluster:Cluster":
        # What EKS computes: the endpoint, the CA (base64 of a PEM certificate: placeholder bytes of about
        # its length), the service CIDR it picks, the security group it makes for the cluster.
        ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n" + digest.encode() * 16
                              + b"\n-----END CERTIFICATE-----\n").decode()
        return {"endpoint": f"https://{digest[:32].upper()}.gr7.{region}.eks.amazonaws.com",
                "certificateAuthority": {"data": ca},
                "kubernetesNetworkConfig": {**(inputs.get("kubernetesNetworkConfig") or {}),
                                            "serviceIpv4Cidr": "172.20.0.0/16"},
                "vpcConfig": {**(inputs.get("vpcConfig") or {}),
                              "clusterSecurityGroupId": f"sg-{digest[:17]}"}}
    if typ == "aws:cloudcontrol/resource:Resource" and str(inputs.get("typeName")).startswith("AWS::PCS::"):
        # Cloud Control's id is the type's primary identifier (AWS::PCS::Cluster: its Arn) and `properties`
        # the whole model, the document and the read-only properties (Id, Arn).
        kind = str(inputs["typeName"]).rsplit("::", 1)[1]
        pcs = _provider_computed(f"aws-native:pcs:{kind}", name, inputs, region)
        model = {**json.loads(inputs.get("desiredState") or "{}"), "Id": pcs["awsId"], "Arn": pcs["arn"]}
        return {"id": pcs["arn"], "properties": json.dumps(model, sort_keys=True)}
    if typ.startswith("aws-native:pcs:"):
        # AWS PCS ids are `pcs_` and 10 characters (why names may not start with `pcs_`).
        kind = typ.rsplit(":", 1)[1].lower()
        return {"awsId": f"pcs_{digest[:10]}",
                "arn": f"arn:aws:pcs:{region}:{MOCK_ACCOUNT}:{kind}/pcs_{digest[:10]}"}
    return {}


class _SeenInputs(pulumi.runtime.Mocks):
    """The mocks, keeping the inputs the monitor already deserialized for them (per thread)."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        self.mocks, self.seen = mocks, threading.local()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        self.seen.inputs = args.inputs
        return self.mocks.new_resource(args)

    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
        return self.mocks.call(args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mocks, name)


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """MockMonitor that keeps every registration with its parent and resource options."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        self._seen = _SeenInputs(mocks)
        super().__init__(self._seen)
        self.registered: list[PlannedResource] = []

    def RegisterResource(self, request: Any) -> Any:
        self._seen.seen.inputs = None
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            # The inputs MockMonitor handed the mocks (deserializing them again costs 1 % of a plan).
            inputs = self._seen.seen.inputs
            if inputs is None:
                inputs = pulumi.runtime.rpc.deserialize_properties(request.object)
            self.registered.append(PlannedResource(
                urn=response.urn, type=request.type, name=request.name,
                parent=request.parent or None, custom=bool(request.custom),
                inputs=_plain(inputs), protect=bool(request.protect),
                retain_on_delete=bool(request.retainOnDelete),
                ignore_changes=tuple(request.ignoreChanges),
                dependency_urns=tuple(dict.fromkeys(
                    [*request.dependencies,
                     *(u for deps in request.propertyDependencies.values() for u in deps.urns)])),
                property_dependencies={key: tuple(deps.urns)
                                       for key, deps in sorted(request.propertyDependencies.items())
                                       if deps.urns},
                provider=request.provider.rsplit("::", 1)[0] if request.provider else None,  # urn::id
            ))
        return response


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _content(value: pulumi.Asset | pulumi.Archive) -> dict[str, Any]:
    """An asset or archive by content: each file's SHA-256 and one over them all (what a diff sees).

    A directory archive lists every file under it, build noise included, as the engine would zip it.
    """
    files: dict[str, str] = {}
    if isinstance(value, pulumi.FileAsset):
        return {"sha256": _sha256(Path(value.path).read_bytes())}
    if isinstance(value, pulumi.StringAsset):
        return {"sha256": _sha256(value.text.encode())}
    if isinstance(value, pulumi.AssetArchive):
        for name, part in sorted(value.assets.items()):
            inner = _content(part)
            files.update({f"{name}/{k}": v for k, v in inner.get("files", {}).items()} if "files" in inner
                         else {name: inner["sha256"]})
    elif isinstance(value, pulumi.FileArchive):
        root = Path(value.path)
        files = {str(p.relative_to(root)): _sha256(p.read_bytes())
                 for p in sorted(root.rglob("*")) if p.is_file()}
    else:
        return {"sha256": None, "what": type(value).__name__}
    return {"sha256": _sha256(json.dumps(files, sort_keys=True).encode()), "files": files}


def _plain(value: Any) -> Any:
    """Engine values -> JSON-able Python, the same run after run (keys sorted, assets by content)."""
    if isinstance(value, pulumi.Asset | pulumi.Archive):
        return _content(value)
    if isinstance(value, dict):
        return {k: _plain(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, pulumi.Resource):
        return f"<resource {type(value).__name__}>"
    return str(value)


def _tree_order(resources: list[PlannedResource]) -> list[PlannedResource]:
    """Parents before children, siblings by type and name: one order however the engine interleaved them.

    Under the mock engine resources register as their inputs resolve, which varies from run to
    run; a plan must not (CI diffs two plans).
    """
    children: dict[str | None, list[PlannedResource]] = {}
    urns = {r.urn for r in resources}
    for r in resources:
        children.setdefault(r.parent if r.parent in urns else None, []).append(r)
    ordered: list[PlannedResource] = []
    todo = sorted(children.get(None, []), key=lambda r: (r.type, r.name, r.urn), reverse=True)
    while todo:
        r = todo.pop()
        ordered.append(r)
        todo.extend(sorted(children.get(r.urn, []), key=lambda c: (c.type, c.name, c.urn), reverse=True))
    return ordered


def run_plan(stack: str) -> Plan:
    """Validate `stack` (SpecError/StackFileError on bad input) and run the program mocked."""
    name, config, spec = load_stack(stack)
    return run_program(name, config, spec)


def run_program(name: str, config: dict[str, Any], spec: StackSpec) -> Plan:
    """Run gpucluster.program.run() under the mock engine with `config` as the stack's config."""
    from gpucluster import program  # imported late: loading it pulls in pulumi_aws modules

    set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    resources, outputs = record_resources(program.run, stack=name, region=spec.region, project=spec.project,
                                          organization=spec.organization)
    return Plan(stack=name, spec=spec, resources=resources, outputs=outputs)


def run_program_file(path: Path, config: Mapping[str, Any], *, project: str, stack: str = "dev",
                     region: str = "us-east-1") -> tuple[list[PlannedResource], dict[str, Any]]:
    """Plan any Pulumi Python program (a `__main__.py` that imports gpucluster) offline.

    `config` is the stack file's `config:` map (`namespace:key` -> value), as `pulumi up` would
    hand it to the program; keys without a namespace belong to `project`.
    """
    values = {(k if ":" in k else f"{project}:{k}"): v for k, v in config.items()}
    set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()})
    return record_resources(lambda: runpy.run_path(str(path), run_name="__main__"), stack=stack,
                            region=region, project=project)


def record_resources(build: Callable[[], Any], stack: str = "test", region: str = "us-east-1",
                     project: str = PROJECT,
                     organization: str | None = None) -> tuple[list[PlannedResource], dict[str, Any]]:
    """Run `build` (a program, or a test constructing one component) under recording mocks.

    `organization`, `project` and `stack` are what `pulumi.get_organization()` & co. return
    (the deployment's identity is made of them). Returns every registered resource and the
    stack's exported outputs, resolved.
    """
    mocks = PlanMocks(region)
    monitor = RecordingMonitor(mocks)
    pulumi_settings.ROOT.set(None)  # a fresh root Stack for every run in this process
    pulumi_mocks.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor,
                           organization=organization)
    pulumi_settings.SETTINGS.rpc_manager.clear()
    with _no_source_positions():
        _sync_await(run_pulumi_func(build))
        root = pulumi_settings.get_root_resource()
        exported = getattr(root, "outputs", {})
        outputs = _sync_await(pulumi.Output.from_input(exported).future()) or {}
    return _tree_order(monitor.registered), _plain(outputs)


@contextmanager
def _no_source_positions() -> Iterator[None]:
    """Skip the Python stack trace Pulumi's SDK takes for every resource it registers.

    The engine uses it only to point its diagnostics at the line that declared a resource
    (`sourcePosition`, `stackTrace` of RegisterResourceRequest); the mock monitor and a plan
    never read it, and walking the stack (source lines included) costs about a fifth of the
    mock run. Restored afterwards; an SDK without the hook is left as it is.
    """
    hook = getattr(pulumi_resource, "_get_stack_trace", None)
    if hook is None:  # another SDK version: keep its behaviour
        yield
        return
    blank = source_pb2.StackTrace()
    pulumi_resource._get_stack_trace = lambda: blank
    try:
        yield
    finally:
        pulumi_resource._get_stack_trace = hook
