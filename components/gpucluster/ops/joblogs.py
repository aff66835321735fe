"""Follow a detached job's output in CloudWatch Logs until it has ended on every node.

This backs `gpucluster logs STACK JOB --follow`. On each node the job's output is
the file /var/log/gpucluster/jobs/<job>.log (node/job.sh), which the CloudWatch
agent ships to the stack's run log group, one stream per node and file
(`job_log_stream`). The unit writes a start line and, when it stops, an end line
(`gpucluster-job: <job> ended: result ..., exit status ...`): the follower stops
waiting for a node when its end line arrives, or when the node is no longer
running (a reclaimed spot node writes no end line).

Polling: FilterLogEvents from a little before the newest event seen (events reach
CloudWatch Logs late, in batches: `LOOKBACK_MS`), never printing an event id twice;
the interval doubles from `MIN_POLL_SECONDS` to `MAX_POLL_SECONDS` while nothing new
arrives, and drops back when something does. Read-only: it never changes anything.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpucluster.fleet.awsapi import AWS_ERRORS, batches, error_code
from gpucluster.fleet.jobnames import job_log_stream

__all__ = ["job_log_stream"]  # named in lambdas.jobnames: the restart handler reads it too
MIN_POLL_SECONDS = 2.0
MAX_POLL_SECONDS = 15.0
LOOKBACK_MS = 60_000
"""How far before the newest event each poll reaches back: the agent sends batches every 5 s
(force_flush_interval), so an event can land after a later one was already read."""
ALIVE_CHECK_SECONDS = 60.0
MAX_STREAMS_PER_CALL = 100  # FilterLogEvents logStreamNames: 1-100 names (API reference)
START = re.compile(r"^gpucluster-job: (?P<name>[a-z0-9-]+) started\b")
END = re.compile(r"^gpucluster-job: (?P<name>[a-z0-9-]+) ended: result (?P<result>[^,\s]+), "
                 r"exit status (?P<status>\S+)")


@dataclass(frozen=True)
class Ending:
    """How the job ended on one node (its end line), or why we stopped waiting for it."""

    result: str
    """systemd's result (success, exit-code, signal, timeout...), or `node gone`."""
    status: str
    """The exit status (a number, or a signal name), `-` when unknown."""

    @property
    def ok(self) -> bool:
        return self.result == "success" and self.status == "0"

    def describe(self) -> str:
        if self.result == "node gone":
            return "node gone (no longer running; it wrote no end line)"
        return f"ended: result {self.result}, exit status {self.status}"


@dataclass(frozen=True)
class LogLine:
    stream: str
    timestamp: int
    message: str


@dataclass
class JobFollower:
    """The state of one `logs --follow`: what was printed, and which nodes it still waits for."""

    logs: Any
    log_group: str
    job: str
    streams: Mapping[str, str]
    """Stream name -> the node it belongs to (its instance id)."""
    start_ms: int
    waiting: set[str]
    """Streams whose node still runs the job: the follower ends when this is empty."""
    endings: dict[str, Ending] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)
    _newest: int = 0

    def poll(self) -> list[LogLine]:
        """New events of the job's streams since the last poll, oldest first; end lines noted."""
        since = max(self.start_ms, self._newest - LOOKBACK_MS)
        events = []
        names = sorted(self.streams)
        for batch in batches(names, MAX_STREAMS_PER_CALL):
            events += self._filter(batch, since)
        fresh = []
        for event in sorted(events, key=lambda e: (e["timestamp"], e.get("ingestionTime", 0), e["eventId"])):
            if event["eventId"] in self._seen:
                continue
            self._seen[event["eventId"]] = event["timestamp"]
            self._newest = max(self._newest, event["timestamp"])
            line = LogLine(event["logStreamName"], event["timestamp"], event["message"].rstrip("\n"))
            self._note(line)
            fresh.append(line)
        # Forget ids older than any later poll can return.
        horizon = self._newest - 2 * LOOKBACK_MS
        self._seen = {i: t for i, t in self._seen.items() if t >= horizon}
        return fresh

    def _filter(self, names: list[str], since: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"logGroupName": self.log_group, "logStreamNames": names, "startTime": since}
        while True:
            try:
                page = self.logs.filter_log_events(**kwargs)
            except AWS_ERRORS as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    return found  # no stream yet: the agent creates it with the first line
                raise
            found += page.get("events", [])
            token = page.get("nextToken")
            if not token or token == kwargs.get("nextToken"):
                return found
            kwargs["nextToken"] = token

    def _note(self, line: LogLine) -> None:
        end = END.match(line.message)
        if end and end["name"] == self.job:
            self.endings[line.stream] = Ending(end["result"], end["status"])
            self.waiting.discard(line.stream)
            return
        start = START.match(line.message)
        if start and start["name"] == self.job and line.stream in self.endings:
            # Started again on that node (a restart) after the end we saw: wait for the new end.
            del self.endings[line.stream]
            self.waiting.add(line.stream)

    def gone(self, instance_ids: Iterable[str]) -> None:
        """Stop waiting for nodes that are no longer running."""
        for stream, instance in self.streams.items():
            if instance in instance_ids and stream in self.waiting:
                self.waiting.discard(stream)
                self.endings[stream] = Ending("node gone", "-")

    @property
    def done(self) -> bool:
        return not self.waiting


def follow(follower: JobFollower, on_line: Callable[[LogLine], None], *,
           running: Callable[[Iterable[str]], set[str]] | None = None,
           sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
           min_poll: float = MIN_POLL_SECONDS, max_poll: float = MAX_POLL_SECONDS) -> JobFollower:
    """Poll until the job has ended on every node followed (Ctrl-C: KeyboardInterrupt reaches the caller).

    `running(instance_ids)` answers which of those instances still run; it is asked at most every
    ALIVE_CHECK_SECONDS, for the nodes still waited for.
    """
    interval = min_poll
    checked = clock()
    while True:
        fresh = follower.poll()
        for line in fresh:
            on_line(line)
        if follower.done:
            return follower
        if running is not None and clock() - checked >= ALIVE_CHECK_SECONDS:
            checked = clock()
            waited = {follower.streams[s] for s in follower.waiting}
            follower.gone(waited - running(waited))
            if follower.done:
                return follower
        interval = min_poll if fresh else interval
        sleep(interval)
        if not fresh:
            interval = min(interval * 2, max_poll)


def parse_started(text: str) -> datetime | None:
    """`gpucluster-job status`'s start time (`Mon_2025-06-02_10:00:00_UTC`, spaces as '_'), or None."""
    try:
        return datetime.strptime(text.replace("_", " "), "%a %Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
    except ValueError:
        return None
