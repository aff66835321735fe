"""`python -m gpucluster.cli ...` commands answered by one child process: the commands a module runs
against a moto server (`AWS_ENDPOINT_URL`), each as a fresh process would run it.

A command in a fresh interpreter costs 0.55 CPU-s to start (Python, typer, pydantic, boto3, the
spec models) before its own 0.3 s of work, and a module of such tests ran a dozen. One plain child
(no pytest, none of conftest's patches of botocore and moto) runs them one after another, each as
`python -m gpucluster.cli` would in a process of its own (`runpy`, as `-m` does): its own arguments,
environment (replaced whole), working directory, stdout and stderr (warnings and logging's last-resort
lines included, a warning once per command), the exit status `sys.exit` gives, an uncaught exception's
traceback on stderr with status 1, and a fresh boto3 default session (a process's first: it caches the
credentials it found). What stays from one command to the next is what the suite's in-process
(CliRunner) tests share too: imported modules and their caches.

`CliChild.run` answers like `subprocess.run(..., capture_output=True, text=True)`. The child runs
`serve` (this file as a script); a request and its answer are one JSON line each, on the child's
stdin and on a copy of its stdout (the command's file descriptor 1 is the child's stderr).
"""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent


class CliChild:
    """One child that runs `gpucluster` commands on request; started on the first, again if it died."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def run(self, args: list[str], *, env: dict[str, str], cwd: Path = REPO,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """`python -m gpucluster.cli *args` with `env` in `cwd`, as one fresh process would answer."""
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps({"args": args, "env": env, "cwd": str(cwd)}) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(["gpucluster", *args], timeout)
        line = process.stdout.readline()
        if not line:  # the child itself ended: its stderr says why
            self._process = None
            process.wait()
            raise RuntimeError(f"the command child ended on {args}")
        answer = json.loads(line)
        return subprocess.CompletedProcess(["gpucluster", *args], answer["returncode"], answer["stdout"],
                                           answer["stderr"])

    def close(self) -> None:
        """End the child and reap it (its CPU time is counted for this process from then on)."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen([sys.executable, __file__], cwd=REPO, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
        return self._process


# ----------------------------------------------------------------------------------- the child's side


def _stream() -> io.TextIOWrapper:
    """A command's stdout or stderr: text over bytes, encoded as this process's own stdout (a pipe)."""
    return io.TextIOWrapper(io.BytesIO(), encoding=sys.__stdout__.encoding, errors=sys.__stdout__.errors)


def _text(stream: io.TextIOWrapper) -> str:
    """What `subprocess.run(text=True)` reads from the stream: decoded, universal newlines."""
    stream.flush()
    raw = stream.buffer.getvalue()  # type: ignore[attr-defined]
    text = raw.decode(sys.__stdout__.encoding, sys.__stdout__.errors)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _exit_status(code: Any, stderr: IO[str]) -> int:
    """The status the interpreter exits with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)
    return 1


def run_command(args: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
    """One `python -m gpucluster.cli *args`, as a process of its own would run it."""
    import runpy
    import warnings

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    boto3 = sys.modules.get("boto3")
    if boto3 is not None:
        boto3.DEFAULT_SESSION = None  # type: ignore[attr-defined]
    stdout, stderr = _stream(), _stream()
    argv, hook = sys.argv, sys.excepthook
    sys.stdout, sys.stderr, sys.argv = stdout, stderr, ["-m", *args]  # runpy sets argv[0] to the file
    try:
        with warnings.catch_warnings():  # entering resets which warnings were already shown
            runpy.run_module("gpucluster.cli", run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as done:
        status = _exit_status(done.code, stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    finally:
        sys.stdout, sys.stderr, sys.argv, sys.excepthook = sys.__stdout__, sys.__stderr__, argv, hook
    return {"returncode": status, "stdout": _text(stdout), "stderr": _text(stderr)}


def serve() -> None:
    """Answer requests (one JSON line each on stdin) until stdin ends."""
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first, not this file's folder
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what a command writes to fd 1 itself (sys.__stdout__ too) goes to stderr, not the answers
    for line in sys.stdin:
        request = json.loads(line)
        answers.write(json.dumps(run_command(request["args"], request["env"], request["cwd"])) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
