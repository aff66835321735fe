"""Day-2 operations against AWS (boto3): one module a concern, clients passed in, no Pulumi import.

Each operation returns a result object and prints nothing, so the CLI, a notebook or a Lambda
can call it alike. What the flows share is here: `Clients` (how an operation gets a boto3
client for a service, in the stack's region) and `Spinner` (how it tells the caller what it
is waiting for: a spinner in the CLI, nothing by default).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

Clients = Callable[[str], Any]
"""A service name -> a boto3 client in the stack's region."""
Spinner = Callable[[str], AbstractContextManager[Any]]
"""Shows `what` while a block runs (a spinner in the CLI)."""


def no_spinner(_what: str) -> AbstractContextManager[Any]:
    """The default `Spinner`: shows nothing (a notebook, a Lambda, a test)."""
    return nullcontext()
