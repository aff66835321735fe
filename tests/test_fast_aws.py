"""fast_aws's kept results are the ones botocore and moto compute each time."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, ClassVar

import botocore.model
import botocore.session
import botocore.useragent
import moto.core.serialize
from moto.core.utils import get_service_model

import fast_aws

OPERATIONS = [("ec2", "DescribeInstances"), ("autoscaling", "DescribeAutoScalingGroups"),
              ("dynamodb", "DescribeTable"), ("dynamodb", "Query"), ("sns", "Publish")]


def _members(shape: Any, seen: set[str]) -> Iterator[tuple[Any, str]]:
    """Every structure member under `shape` (each named shape once), parent set as moto's serializer does."""
    if shape.name in seen:
        return
    seen.add(shape.name)
    if shape.type_name == "structure":
        for key, member in shape.members.items():
            member.parent = shape
            yield member, key
            yield from _members(member, seen)
    elif shape.type_name == "list":
        yield from _members(shape.member, seen)
    elif shape.type_name == "map":
        yield from _members(shape.value, seen)


class Instance:
    """Named like EC2's shape, so the class-prefix alias applies."""


class AutoScalingGroup:
    class Meta:
        serialization_aliases: ClassVar[dict[str, str]] = {
            "AutoScalingGroupName": "name", "Instances": "instance_list"}


def _objects() -> list[Any]:
    own_meta = Instance()
    own_meta.Meta = types.SimpleNamespace(serialization_aliases={"InstanceId": "id"})  # type: ignore[attr-defined]
    return [{}, Instance(), AutoScalingGroup(), own_meta, types.SimpleNamespace()]


def test_possible_keys_are_the_ones_moto_lists_each_time() -> None:
    fast_aws.install()
    picker = moto.core.serialize.XFormedAttributePicker()
    kept = type(picker).get_possible_keys
    original = kept.__wrapped__  # type: ignore[attr-defined]
    compared = 0
    for service, operation in OPERATIONS:
        operation_model = get_service_model(service).operation_model(operation)
        for shape, key in _members(operation_model.output_shape, set()):
            for obj in _objects():
                context = moto.core.serialize.AttributePickerContext(obj=obj, key=key, shape=shape)
                expected = list(original(picker, context))
                assert list(kept(picker, context)) == expected, (service, operation, key, type(obj))
                assert list(kept(picker, context)) == expected  # the second answer comes from the kept one
                compared += 1
    assert compared > 1000


def test_an_objects_own_meta_is_read_on_every_call() -> None:
    fast_aws.install()
    picker = moto.core.serialize.XFormedAttributePicker()
    shape = get_service_model("ec2").operation_model("DescribeInstances").output_shape
    obj = Instance()
    context = moto.core.serialize.AttributePickerContext(obj=obj, key="Reservations", shape=shape)
    before = list(picker.get_possible_keys(context))
    obj.Meta = types.SimpleNamespace(serialization_aliases={"Reservations": "reservation_list"})  # type: ignore[attr-defined]
    after = list(picker.get_possible_keys(context))
    assert after == ["reservation_list", "reservation_list", *before]
    assert picker(moto.core.serialize.AttributePickerContext(
        obj={"reservation_list": [1]}, key="Reservations", shape=shape)) is None
    obj.reservation_list = [1]  # type: ignore[attr-defined]
    assert picker(context) == [1]


def test_user_agent_components_are_sanitised_as_botocore_does() -> None:
    fast_aws.install()
    kept = botocore.useragent.sanitize_user_agent_string_component
    original = kept.__wrapped__  # type: ignore[attr-defined]
    for raw in ["Botocore", "linux#6.1", "a b/c#d", "é~|`", ""]:
        for allow_hash in (True, False):
            assert kept(raw, allow_hash) == original(raw, allow_hash)
            assert kept(raw, allow_hash) == original(raw, allow_hash)


def test_the_endpoint_discovery_operation_is_the_one_botocore_finds() -> None:
    fast_aws.install()
    loader = botocore.session.get_session().get_component("data_loader")
    kept = botocore.model.ServiceModel.__dict__["endpoint_discovery_operation"]._fget
    original = kept.__wrapped__
    found = []
    for service in ("ec2", "dynamodb", "timestream-query", "iam", "dynamodb"):
        description = loader.load_service_model(service, "service-2")
        expected = original(botocore.model.ServiceModel(description, service_name=service))
        model = botocore.model.ServiceModel(description, service_name=service)
        answer = model.endpoint_discovery_operation
        assert (answer and answer.name) == (expected and expected.name), service
        assert answer is None or answer is model.operation_model(answer.name)  # the client's own model's
        found.append(answer and answer.name)
    assert found == [None, "DescribeEndpoints", "DescribeEndpoints", None, "DescribeEndpoints"]
