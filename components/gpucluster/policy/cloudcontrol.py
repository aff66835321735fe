"""Cloud Control resources as the rules read them: the CloudFormation document as the aws-native resource.

A Slurm stack's AWS PCS cluster is an `aws.cloudcontrol.Resource` of `AWS::PCS::Cluster` (aws/pcs.py
says why: pulumi-aws-native's type for it lacks accounting and idle scale-down). The rules judge what
AWS is given, whichever provider carries it, so a Cloud Control resource is read as the aws-native
resource of its type: token `aws-native:<service>:<Type>`, the document's property names camelCased as
aws-native names them (a `Tags` map's keys, the user's own, kept as they are), its id and ARN from the
model Cloud Control returns (`properties`). A document not known yet (a preview before the security
group exists) reads UNKNOWN at every property. Pure: records in, records out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource

CLOUD_CONTROL = "aws:cloudcontrol/resource:Resource"


class _AllUnknown(Mapping[str, Any]):
    """Props of a document not known yet: every property is UNKNOWN."""

    def __getitem__(self, key: str) -> Any:
        return UNKNOWN

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _camel_keys(value: Any, key: str = "") -> Any:
    """CloudFormation's PascalCase property names as aws-native's camelCase, at every depth."""
    if isinstance(value, Mapping):
        if key == "Tags":
            return dict(value)
        return {_camel(k): _camel_keys(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(v, key) for v in value]
    return value


def _model(text: Any) -> Mapping[str, Any]:
    """A JSON document or model as a mapping; {} when it is not (yet) one."""
    if not isinstance(text, str):
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, Mapping) else {}


def model_ids(properties: Any) -> tuple[str, ...]:
    """The Id and Arn in the model Cloud Control returns: what other resources use to name this one."""
    model = _model(properties)
    return tuple(v for v in (model.get("Id"), model.get("Arn")) if isinstance(v, str))


def native_view(resource: Resource) -> Resource:
    """`resource` as the rules read it: a Cloud Control resource as the aws-native one, else unchanged."""
    type_name = resource.props.get("typeName")
    if resource.type != CLOUD_CONTROL or not isinstance(type_name, str) or type_name.count("::") != 2:
        return resource
    _, service, kind = type_name.split("::")
    document = resource.props.get("desiredState")
    props: Mapping[str, Any] = (_AllUnknown() if not isinstance(document, str)
                                else _camel_keys(_model(document)))
    carried = resource.deps.get("desiredState", ())
    deps = {**resource.deps, **{key: carried for key in props}} if carried else resource.deps
    ids = tuple(dict.fromkeys((*resource.ids, *model_ids(resource.props.get("properties")))))
    return replace(resource, type=f"aws-native:{service.lower()}:{kind}", props=props, deps=deps, ids=ids)
