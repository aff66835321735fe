"""Offline plans: run the real Pulumi program in-process under Pulumi's mock engine.

It owns reading a stack file, handing its config to the program, and recording
every resource registration (type, name, parent, inputs as the engine gets
them, and the options that matter for safety: protect, retain_on_delete,
ignore_changes). It never talks to AWS or the Pulumi CLI.
"""

from __future__ import annotations

import hashlib
import json
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from gpucluster.project import missing_stack_message, stacks_dir
from gpucluster.spec import (
    MAX_INPUT_BYTES,
    PROJECT,
    Finding,
    SpecError,
    StackSpec,
    clip,
    parse_stack_config,
)
from gpucluster.stackfile import load_yaml

MOCK_ACCOUNT = "123456789012"
MOCK_AMI = "ami-0123456789abcdef0"


class StackFileError(ValueError):
    """The stack file cannot be found or read (not a config problem inside it)."""


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


# ------------------------------------------------------------------ stack files


def stack_file(stack: str) -> Path:
    """`dev` -> <stacks dir>/Pulumi.dev.yaml (see `project.stacks_dir`); a / or .yaml makes it a path."""
    if "/" in stack or stack.endswith((".yaml", ".yml")):
        return Path(stack)
    return stacks_dir() / f"Pulumi.{stack}.yaml"


def stack_name(path: Path) -> str:
    """Pulumi.<name>.yaml -> <name>; any other file -> its stem."""
    name = path.name
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name.removeprefix("Pulumi.")


def read_stack_config(path: Path) -> dict[str, Any]:
    """The `config:` map of a stack file, keys namespaced (`gpucluster:` by default).

    StackFileError when the file cannot be read; SpecError (naming the key path and
    line) when its YAML is not a plain, bounded stack file (see `gpucluster.stackfile`).
    """
    where = clip(str(path), 120)
    try:
        if not path.exists():
            raise StackFileError(missing_stack_message(path, by_name=path.parent == stacks_dir()))
        if not path.is_file():  # a directory, FIFO or device would fail late or never end
            raise StackFileError(f"{where}: not a regular file")
        with path.open("rb") as stream:
            data = stream.read(MAX_INPUT_BYTES + 1)
    except OSError as err:  # unreadable, or a name too long for the file system
        raise StackFileError(f"{where}: cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise StackFileError(f"{where}: larger than {MAX_INPUT_BYTES // 1024} KiB; not a stack file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise StackFileError(f"{where}: not UTF-8 text (byte {err.start})") from None
    raw = load_yaml(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
        raise StackFileError(f"{where}: a stack file needs a top-level `config:` mapping")
    config: dict[str, Any] = {}
    for key, value in raw["config"].items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if full in config:  # `cluster` and `gpucluster:cluster` name one key
            raise SpecError([Finding(full, f"set twice in config (as {key!r} too); Pulumi rejects it")])
        config[full] = value
    return config


def load_stack(stack: str) -> tuple[str, dict[str, Any], StackSpec]:
    """Read and validate a stack by name or path: (stack name, config map, spec)."""
    path = stack_file(stack)
    config = read_stack_config(path)
    name = stack_name(path)
    return name, config, parse_stack_config(config, stack=name)


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
        state.update(_provider_computed(args.typ, args.name, args.inputs, self.region))
        return state["id"], state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        token = args.token
        if token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args.get("name"), "value": MOCK_AMI, "type": "String",
                    "arn": f"arn:aws:ssm:{self.region}::parameter{args.args.get('name')}"}
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
        bucket = inputs.get("bucket") or inputs.get("bucketPrefix", "") + str(int(digest, 16))[:26]
        return {"id": bucket, "bucket": bucket, "arn": f"arn:aws:s3:::{bucket}"}
    if typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
        fs_id = f"fs-{digest[:17]}"
        return {"id": fs_id, "dnsName": f"{fs_id}.fsx.{region}.amazonaws.com", "mountName": digest[17:25],
                "arn": f"arn:aws:fsx:{region}:{MOCK_ACCOUNT}:file-system/{fs_id}"}
    if typ == "aws:ec2/vpcEndpoint:VpcEndpoint" and inputs.get("vpcEndpointType") == "Gateway":
        return {"prefixListId": "pl-63a5400a"}  # the shape of a real S3 prefix list id
    return {}


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """MockMonitor that keeps every registration with its parent and resource options."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.registered: list[PlannedResource] = []

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
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
            ))
        return response


def _plain(value: Any) -> Any:
    """Engine values -> JSON-able Python (resource references become their URN)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, pulumi.Resource):
        return f"<resource {type(value).__name__}>"
    return str(value)


def run_plan(stack: str) -> Plan:
    """Validate `stack` (SpecError/StackFileError on bad input) and run the program mocked."""
    name, config, spec = load_stack(stack)
    return run_program(name, config, spec)


def run_program(name: str, config: dict[str, Any], spec: StackSpec) -> Plan:
    """Run gpucluster.program.run() under the mock engine with `config` as the stack's config."""
    from gpucluster import program  # imported late: loading it pulls in pulumi_aws modules

    set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    resources, outputs = record_resources(program.run, stack=name, region=spec.region)
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
                     project: str = PROJECT) -> tuple[list[PlannedResource], dict[str, Any]]:
    """Run `build` (a program, or a test constructing one component) under recording mocks.

    Returns every registered resource and the stack's exported outputs, resolved.
    """
    mocks = PlanMocks(region)
    monitor = RecordingMonitor(mocks)
    pulumi_settings.ROOT.set(None)  # a fresh root Stack for every run in this process
    pulumi_mocks.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    pulumi_settings.SETTINGS.rpc_manager.clear()
    _sync_await(run_pulumi_func(build))
    root = pulumi_settings.get_root_resource()
    exported = getattr(root, "outputs", {})
    outputs = _sync_await(pulumi.Output.from_input(exported).future()) or {}
    return list(monitor.registered), _plain(outputs)
