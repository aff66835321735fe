"""Handler settings and notifications: bad values fall back, failures are swallowed."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpucluster.fleet import runtime


def test_a_failed_notification_raises_so_the_invocation_fails() -> None:
    class DownSNS:
        def publish(self, **kwargs: Any) -> None:
            raise ClientError({"Error": {"Code": "NotFound", "Message": "gone"}}, "Publish")

    with pytest.raises(runtime.NotifyError, match="NotFound"):
        runtime.notify(DownSNS(), "arn:aws:sns:us-east-1:1:t", "s\nubject", {})
    assert runtime.notify(DownSNS(), None, "s", {}) is False  # no topic configured: nothing to fail


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 300.0), ("", 300.0), ("45", 45.0), ("x", 300.0), ("-3", 300.0)]
)
def test_env_number_falls_back_on_bad_values(monkeypatch, raw, expected) -> None:
    if raw is not None:
        monkeypatch.setenv("PRE_STOP_TIMEOUT_SECONDS", raw)

    assert runtime.env_number("PRE_STOP_TIMEOUT_SECONDS", 300.0) == expected


def test_bounded_timeout_keeps_a_reserve() -> None:
    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 20_000

    assert runtime.bounded_timeout(300, Context()) == 5.0
    assert runtime.bounded_timeout(300, None) == 300
    assert runtime.bounded_timeout(3, Context()) == 3
