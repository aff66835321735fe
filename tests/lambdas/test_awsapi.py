"""The AWS helpers shared by the handlers and ops."""

from __future__ import annotations

from gpucluster.fleet import awsapi


def test_batches_keep_the_order_and_the_per_call_limit() -> None:
    assert awsapi.batches(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert awsapi.batches(["a", "b"], 100) == [["a", "b"]]
    assert awsapi.batches([], 50) == []
