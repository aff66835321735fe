"""botocore's and moto's per-client and per-request work with the same result every time, done once a process.

A third of the suite's CPU went to building boto3 clients and answering them in moto (measured with a
per-test CPU plugin: `tests/test_verify.py` alone made 1,572 clients and 4,946 calls for 58 CPU-seconds).
Three pieces of that work are pure functions of inputs that never change in a test process; `install()`
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
"""

from __future__ import annotations

import functools
import types
from typing import Any

import botocore.client
import moto.core.responses
import moto.kms.utils


def install() -> None:
    """Patch the three places above, once per process."""
    if getattr(botocore.client.ClientCreator, "_gpucluster_methods_kept", False):
        return
    _keep_client_methods()
    moto.core.responses.method_names_from_class = functools.cache(moto.core.responses.method_names_from_class)
    moto.kms.utils.rsa = _LazyRsa(moto.kms.utils.rsa)  # type: ignore[attr-defined]


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
