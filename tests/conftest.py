"""Test setup: fake AWS credentials and Pulumi mocks before any program import; shared plans.

Pulumi's mock engine must be configured before a module that declares
resources is imported (Pulumi unit-testing docs); `gpucluster.plan`
re-installs fresh mocks for every plan it runs.

Speed (docs/development.md, "Benchmarks"): the suite runs in pytest-xdist workers, each its own
process (the mock engine's state and moto's patches are per process), with the
cyclic garbage collector off after collection; each stack file is planned once
per worker for the tests that only read its plan (`shipped.py`: `shipped_plan`,
and `cli_plans_once` for CLI tests); pytest's assert rewrites are kept as bytecode.
"""

# ruff: noqa: E402
from __future__ import annotations

import copy
import datetime as dt
import gc
import os
import sys

# Bytecode is written for whatever the suite imports, even where PYTHONDONTWRITEBYTECODE is set (as on
# the machines this is built on), from before the imports below (hence E402) and in every process a
# test starts. The README's test command installs the dependencies without compiling them: pip's
# compile of every module of pulumi_aws, pulumi_aws_native and kubernetes was half of the install
# (2 minutes), mostly for modules no test imports. Each module the suite uses is compiled once, on its
# first import, instead of in every worker and child process again (a `gpucluster plan` that compiles
# what it imports takes 5.2 s instead of 2.8 s). pytest's assert rewrites of the test modules are kept
# the same way. Both go to `__pycache__` directories, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import botocore.loaders
import botocore.session
import pulumi
import pytest
import typer.main
import typer.testing
import yaml

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_SECURITY_TOKEN", "testing")
os.environ.setdefault("AWS_SESSION_TOKEN", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# moto builds ~1,000 public AMIs with random ids for every region at every mock start (a tenth of
# the suite's time); no test reads them (launch templates name an AMI moto does not check).
os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")

import fast_aws
import shipped
from base_config import BASE_CONFIG
from cli_child import CliChild
from gpucluster.catalog import eks as eks_catalog
from gpucluster.cli import common
from gpucluster.plan import PlanMocks

pulumi.runtime.set_mocks(PlanMocks("us-east-1"), project="gpucluster", stack="test", preview=False)

_BUILT: dict[int, tuple[Any, Any, Any]] = {}


def _command_built_once(typer_instance: typer.Typer) -> Any:
    """typer builds the whole click command tree (every command's parameters, from its signature)
    on each call: a tenth of the suite's time, a thousand CliRunner calls over the same app. Built
    once per app and process, again if a command is added."""
    key = id(typer_instance)
    shape = (len(typer_instance.registered_commands), len(typer_instance.registered_groups))
    if key not in _BUILT or _BUILT[key][0] != shape:
        _BUILT[key] = (shape, _build_command(typer_instance), typer_instance)  # the app kept: its id stays
    return _BUILT[key][1]


_build_command = typer.main.get_command
typer.main.get_command = _command_built_once  # Typer.__call__ (entry.main) looks it up here
typer.testing._get_command = _command_built_once  # CliRunner.invoke


_LOADERS: dict[str | None, botocore.loaders.Loader] = {}
_create_loader = botocore.loaders.create_loader


def _loader_per_process(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """One botocore Loader per process: moto starts a fresh boto3 session per test, and each new
    session's loader parsed the endpoint and service-model JSON again (botocore caches them per
    loader; several seconds of the suite)."""
    if search_path_string not in _LOADERS:
        _LOADERS[search_path_string] = _create_loader(search_path_string)
    return _LOADERS[search_path_string]


botocore.session.create_loader = _loader_per_process
fast_aws.install()  # client methods per service model, moto's action lookup per class, KMS keys when read

# The built wheel in a fresh venv (fixtures `wheel`, `venv`); one real Slurm per process (`slurm`, `quiet`).
pytest_plugins = ["wheel_venv", "real_slurm"]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per CPU this process may run on (xdist counts physical cores with psutil)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collector off from here on, everything imported so far frozen out of its sight.

    The tests allocate a lot and leave little cyclic garbage: with the collector on, its
    collections took a fifth of the suite's time (and re-walked every pulumi_aws class each
    time) to free almost nothing; a worker stays under 1 GB without them.
    """
    gc.freeze()
    gc.disable()


def pytest_runtest_setup(item: pytest.Item) -> None:
    gc.disable()  # a test that turned it on for itself does not turn it on for the rest


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Freeze what the tests left: pytest's last full collection (unraisable-exception check) then
    looks at nothing (it took seconds walking every object the session ever kept)."""
    gc.freeze()


# The day EKS support is judged on in every test (`gpucluster.catalog.eks.today`): the real date would
# fail the tests that plan an EKS stack at its default version, or price a version in extended
# support, the day a catalogued version's support ends (1.35's standard support: 2027-03-27), though
# nothing in gpucluster changed. Tests of a given day pass their own.
EKS_SUPPORT_DAY = dt.date(2026, 11, 29)


@pytest.fixture(autouse=True)
def eks_support_day(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eks_catalog, "today", lambda: EKS_SUPPORT_DAY)


@pytest.fixture
def cli_plans_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpucluster plan <stack>` (CliRunner) plans each stack file once per test process.

    For tests of what the command prints (its options, policy configs, colour): the program
    still runs, once per test process and stack file content (see `shipped.planned_once`).
    """
    monkeypatch.setattr(common, "run_plan", shipped.planned_once)


@pytest.fixture
def base_config() -> dict[str, Any]:
    """A minimal valid stack config (fresh copy per test)."""
    return copy.deepcopy(BASE_CONFIG)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[[dict[str, Any], str], Path]:
    """Write a stack file in the Pulumi.<name>.yaml format; returns its path."""

    def write(config: dict[str, Any], name: str = "case") -> Path:
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        return path

    return write




@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A moto server on a free local port, for a CLI run in a subprocess (`AWS_ENDPOINT_URL`)."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def cli_child() -> Iterator[CliChild]:
    """`gpucluster` commands for a module's tests, each run as its own process would, by one child."""
    child = CliChild()
    yield child
    child.close()
