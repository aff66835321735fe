"""One `OpsError` base: every error an operation raises on purpose is one line and exit 2 in every command.

The classes are found, not listed: a new `*Error` in `gpucluster.ops` that does not derive from
`OpsError` fails here, and `cli.common.ops_call` turns each of them into `command: message`, exit 2.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import typer

import gpucluster.ops as ops
from gpucluster.cli import common, render
from gpucluster.ops import OpsError
from gpucluster.ops.awserrors import NotAnAwsAnswer
from gpucluster.ops.capacity import CapacityError

# An answer that is not AWS's (an HTML page from a proxy) is an AWS error like botocore's own
# (`awserrors.AWS_ERRORS`, caught by `aws_call`), not a request the stack cannot answer.
AWS_ANSWER_ERRORS = {NotAnAwsAnswer}
# Errors whose constructor takes more than the message.
MADE = {CapacityError: lambda message: CapacityError("--days", message)}


def ops_error_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of `gpucluster.ops`."""
    found = []
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"gpucluster.ops.{info.name}")
        found += [value for value in vars(module).values()
                  if isinstance(value, type) and issubclass(value, BaseException)
                  and value.__module__ == module.__name__]
    return sorted(found, key=lambda cls: cls.__qualname__)


def test_the_ops_errors_are_found() -> None:
    names = {cls.__name__ for cls in ops_error_classes()}
    assert {"NodesError", "RunError", "ScaleError", "NoPcsCluster", "SlurmReleaseError", "SpendError",
            "CapacityError", "DoctorError", "NoNodeGroups"} <= names


@pytest.mark.parametrize("error", [c for c in ops_error_classes() if c not in AWS_ANSWER_ERRORS],
                         ids=lambda cls: cls.__name__)
def test_every_ops_error_derives_from_ops_error_and_is_one_line_exit_2(
        error: type[BaseException], capsys: pytest.CaptureFixture[str]) -> None:
    assert issubclass(error, OpsError)
    render.use_json(False)

    raised = MADE.get(error, error)("the stack cannot answer this")

    def fails() -> None:
        raise raised

    with pytest.raises(typer.Exit) as exited:
        common.ops_call("scale", fails, doing=None)
    assert exited.value.exit_code == 2
    assert capsys.readouterr().err == f"scale: {raised}\n"
    assert "the stack cannot answer this" in str(raised)
