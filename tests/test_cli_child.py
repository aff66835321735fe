"""The command child (`cli_child.py`) answers as a fresh `python -m gpucluster.cli` process does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from cli_child import REPO, CliChild


def fresh(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def answer(done: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return done.returncode, done.stdout, done.stderr


def test_a_usage_error_is_the_same_status_streams_and_program_name(cli_child: CliChild) -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    child = cli_child.run(["plna", "dev"], env=env)
    assert child.returncode == 2 and "Usage: python -m gpucluster.cli" in child.stderr, answer(child)
    assert answer(child) == answer(fresh(["plna", "dev"], env))


def test_each_command_has_its_own_environment_and_aws_session(cli_child: CliChild) -> None:
    """The session of a command that had credentials (boto3 keeps them) is not the next command's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {**os.environ, "AWS_ENDPOINT_URL": closed, "AWS_MAX_ATTEMPTS": "1", "NO_COLOR": "1",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing"}
    env.pop("AWS_PROFILE", None)
    env.pop("AWS_SESSION_TOKEN", None)
    reached = cli_child.run(["status", "dev"], env=env)
    assert reached.returncode == 2 and reached.stderr.startswith(f"status: cannot reach AWS at {closed}/")
    bare = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    none = cli_child.run(["status", "dev"], env=bare)
    assert none.returncode == 2 and "no AWS credentials found" in none.stderr, answer(none)
    assert answer(none) == answer(fresh(["status", "dev"], bare))


def test_a_command_in_another_directory(cli_child: CliChild, tmp_path: Path) -> None:
    """Its own working directory: no project there, so no stack dev."""
    env = {**os.environ, "NO_COLOR": "1"}
    outside = cli_child.run(["cost", "dev"], env=env, cwd=tmp_path)
    inside = cli_child.run(["cost", "dev"], env=env)
    assert outside.returncode == 2 and "no such stack file" in outside.stderr, answer(outside)
    assert inside.returncode == 0, answer(inside)
