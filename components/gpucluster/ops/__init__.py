"""Day-2 operations against AWS (boto3): one module a concern, clients passed in, no Pulumi import.

Each operation returns a result object and prints nothing, so the CLI, a notebook or a Lambda
can call it alike. What the flows share is here: `Clients` (the one place a boto3 client is
built: for one service, in the stack's region), `Spinner` (how an operation tells the caller
what it is waiting for: a spinner in the CLI, nothing by default), `OpsError` (the base of every
request the stack cannot answer: one line for the operator). `ops.nodegroups` is the one place
operations pick the node-group backend they act through.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucluster.spec import StackSpec

# Cost Explorer's API is served from us-east-1 for the commercial partition, whatever the
# stack's region (AWS General Reference, "AWS Cost Explorer endpoints and quotas").
CE_REGION = "us-east-1"
ENDPOINT_REGIONS = {"ce": CE_REGION}
"""Services with one endpoint region of their own: their clients are built there."""

Spinner = Callable[[str], AbstractContextManager[Any]]
"""Shows `what` while a block runs (a spinner in the CLI)."""


class OpsError(ValueError):
    """A request the stack cannot answer (an unknown node group, no PCS cluster...): one line.

    Every error an operation raises on purpose derives from it, so a caller (the CLI's `ops_call`)
    turns any of them into one line and exit 2; AWS's own errors stay botocore's."""


def make_client(service: str, region: str | None) -> Any:
    """A plain boto3 client for `service` in `region` (its own endpoint region for a global service).

    The one `boto3.client` of `ops/` and `cli/`: it honours AWS_ENDPOINT_URL (the tests' moto
    servers) as boto3 does. `region` None: the AWS configuration's (a command without a stack).
    """
    import boto3

    return boto3.client(service, region_name=ENDPOINT_REGIONS.get(service, region))


@dataclass(frozen=True)
class Clients:
    """The boto3 clients of one stack: `clients("ssm")` is an SSM client in `region`, never another.

    `make` (service -> client) replaces how they are built (the CLI's test seam, a notebook's own
    session); by default `make_client` in `region`. Each service's client is built once.
    """

    region: str
    make: Callable[[str], Any] | None = None
    _built: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, spec: StackSpec) -> Clients:
        """The clients of `spec`'s stack: in its region."""
        return cls(spec.region)

    def __call__(self, service: str) -> Any:
        if service not in self._built:
            self._built[service] = (self.make(service) if self.make is not None
                                    else make_client(service, self.region))
        return self._built[service]


def no_spinner(_what: str) -> AbstractContextManager[Any]:
    """The default `Spinner`: shows nothing (a notebook, a Lambda, a test)."""
    return nullcontext()
