"""botocore's and moto's per-client and per-request work with the same result every time, done once a process.

A third of the suite's CPU went to building boto3 clients and answering them in moto (measured with a
per-test CPU plugin: `tests/test_verify.py` alone made 1,572 clients and 4,946 calls for 58 CPU-seconds).
These pieces of that work are pure functions of inputs that never change in a test process; `install()`
makes each one compute once and hand out what it computed (nothing a test can change is shared):

- botocore builds a client class's methods, one closure and docstring object per operation (830 for
  EC2), for every client it creates: about 60 % of a client's creation. The methods depend only on
  the service's model, which the loader keeps once per process (conftest.py's `_loader_per_process`):
  they are kept per model and each client class still gets its own dict of them (the
  `creating-client-class` handlers add to that dict).
- moto lists a response class's method names with `inspect.getmembers` on every request, to see
  whether it implements the action: kept per class (no test changes a moto class).
- moto's KMS generates a 2048-bit RSA private key for every key it creates, symmetric ones included,
  where only Sign, Verify and GetPublicKey (asymmetric keys) ever read it: 50-90 ms a key. The key is
  generated the first time it is read, so each key still gets its own.
- moto's response serializer asks its attribute picker, for every member of every response shape, which
  names to try on the result object (3 to 10 alias providers each, 380,000 times in
  `tests/lambdas/test_guardstate.py`). Except the object's own `Meta.serialization_aliases`, which is
  still read on every call, the names depend only on the object's class, the shape, the shape's parent
  and the key: kept per those (the shapes are the service model's, one object each per process).
- botocore rebuilds and sanitises the User-Agent header on every request: the sanitising, a pure
  function of a string and a flag, is kept per (string, flag) (2 million generator steps a module).
- botocore looks through every operation of a client's service model (830 for EC2, each made into an
  `OperationModel`) for the endpoint-discovery one, for every client it creates: which operation that is
  depends only on the loader's service description, so its name is kept per description and each client's
  own model still makes and hands out its own `OperationModel`.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import botocore
import botocore.client
import botocore.model
import botocore.useragent
import botocore.utils
import moto.core.responses
import moto.core.serialize
import moto.kms.utils


def install() -> None:
    """Patch the places above, once per process."""
    if getattr(botocore.client.ClientCreator, "_gpucluster_methods_kept", False):
        return
    _keep_client_methods()
    moto.core.responses.method_names_from_class = functools.cache(moto.core.responses.method_names_from_class)
    moto.kms.utils.rsa = _LazyRsa(moto.kms.utils.rsa)  # type: ignore[attr-defined]
    _keep_possible_keys()
    _keep_discovery_operation()
    botocore.useragent.sanitize_user_agent_string_component = functools.lru_cache(maxsize=4096)(
        botocore.useragent.sanitize_user_agent_string_component)


def _keep_client_methods() -> None:
    creator = botocore.client.ClientCreator
    create_methods, create_name_mapping = creator._create_methods, creator._create_name_mapping
    kept: dict[tuple[str, str, int], tuple[Any, dict[str, Any], dict[str, str]]] = {}

    def key(service_model: Any) -> tuple[str, str, int]:
        # The loader's cached description, kept alive in `kept` so its id is never reused.
        return service_model.service_name, service_model.api_version, id(service_model._service_description)

    def methods(self: Any, service_model: Any) -> dict[str, Any]:
        k = key(service_model)
        if k not in kept:
            kept[k] = (service_model._service_description, create_methods(self, service_model),
                       create_name_mapping(self, service_model))
        return dict(kept[k][1])

    def name_mapping(self: Any, service_model: Any) -> dict[str, str]:
        k = key(service_model)
        return dict(kept[k][2]) if k in kept else create_name_mapping(self, service_model)

    creator._create_methods = methods  # type: ignore[method-assign]
    creator._create_name_mapping = name_mapping  # type: ignore[method-assign]
    creator._gpucluster_methods_kept = True  # type: ignore[attr-defined]


_EXPLICIT = object()  # where in a kept list of names the object's own Meta alias goes, read per call
_PURE_PROVIDERS = frozenset({
    moto.core.serialize.ShapeNameAlias, moto.core.serialize.NoAlias, moto.core.serialize.ShapePrefixAlias,
    moto.core.serialize.ClassPrefixAlias, moto.core.serialize.ModelAlias,
})  # each reads only the key, the shape (its name, type, serialization, parent) and the object's class


def _keep_possible_keys() -> None:
    picker = moto.core.serialize.XFormedAttributePicker
    original = picker.get_possible_keys
    explicit, xform_name = moto.core.serialize.ExplicitAlias, botocore.xform_name
    kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def plan(self: Any, context: Any, providers: tuple[Any, ...]) -> tuple[Any, ...] | None:
        names: list[Any] = []
        for provider in providers:
            if provider is explicit:
                names.append(_EXPLICIT)
            elif provider in _PURE_PROVIDERS:
                alias_provider = provider(context)
                if alias_provider.has_alias(context.key):
                    alias = alias_provider.get_alias(context.key)
                    names += [alias, xform_name(alias)]
            else:
                return None  # a provider this cache does not know: asked every time, as moto does
        return tuple(names)

    def get_possible_keys(self: Any, context: Any) -> Any:
        providers, shape = tuple(self.alias_providers), context.shape
        # The shape and its parent are keys by identity, and `kept` holds them, so no id is reused.
        k = (type(self), providers, context.obj.__class__, shape, getattr(shape, "parent", None), context.key)
        names = kept.get(k)
        if names is None:
            try:
                names = plan(self, context, providers)
            except Exception:  # moto's own generator raises it at the same point, lazily, below
                names = None
            if names is None:
                yield from original(self, context)
                return
            kept[k] = names
        for name in names:
            if name is _EXPLICIT:
                alias_provider = explicit(context)
                if alias_provider.has_alias(context.key):
                    alias = alias_provider.get_alias(context.key)
                    yield alias
                    yield xform_name(alias)
            else:
                yield name

    get_possible_keys.__wrapped__ = original  # type: ignore[attr-defined]  # for the test that compares them
    picker.get_possible_keys = get_possible_keys  # type: ignore[method-assign]


def _keep_discovery_operation() -> None:
    model = botocore.model.ServiceModel
    original = model.__dict__["endpoint_discovery_operation"]._fget
    kept: dict[int, tuple[Any, str | None]] = {}  # the description is kept alive, so its id is never reused

    def endpoint_discovery_operation(self: Any) -> Any:
        description = self._service_description
        found = kept.get(id(description))
        if found is None or found[0] is not description:
            operation = original(self)
            found = kept[id(description)] = (description, None if operation is None else operation.name)
        return None if found[1] is None else self.operation_model(found[1])

    endpoint_discovery_operation.__wrapped__ = original  # type: ignore[attr-defined]  # for the test
    model.endpoint_discovery_operation = botocore.utils.CachedProperty(  # type: ignore[method-assign]
        endpoint_discovery_operation)


class _LazyKey:
    """An RSA private key generated on its first use (`sign`, `public_key`, ...)."""

    def __init__(self, generate: Any, kwargs: dict[str, Any]) -> None:
        self._generate, self._kwargs, self._key = generate, kwargs, None

    def __getattr__(self, name: str) -> Any:
        if self._key is None:
            self._key = self._generate(**self._kwargs)
        return getattr(self._key, name)


class _LazyRsa(types.ModuleType):
    """cryptography's `rsa` module as moto's KMS sees it: keys generated when first used."""

    def __init__(self, rsa: types.ModuleType) -> None:
        super().__init__(rsa.__name__)
        self._rsa = rsa

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rsa, name)

    def generate_private_key(self, **kwargs: Any) -> _LazyKey:
        return _LazyKey(self._rsa.generate_private_key, kwargs)
