"""A hint to add an optional extra says the install command for how gpucluster was installed (issue 37)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucluster import installed
from gpucluster.cli import app

VERSION = installed.metadata.version("gpucluster")


@pytest.mark.parametrize(("info", "cwd", "command"), [
    ({"url": "file:///home/me/gpucluster", "dir_info": {"editable": True}}, Path("/home/me/gpucluster"),
     "pip install -e '.[chart]'"),
    ({"url": "file:///home/me/gpucluster", "dir_info": {"editable": True}}, Path("/tmp"),
     "pip install -e '/home/me/gpucluster[chart]'"),
    ({"url": "file:///home/me/gpucluster", "dir_info": {}}, Path("/tmp"),
     "pip install '/home/me/gpucluster[chart]'"),
    ({"url": "file:///tmp/dist/gpucluster-0.1.0-py3-none-any.whl", "archive_info": {}}, Path("/tmp/dist"),
     "pip install '/tmp/dist/gpucluster-0.1.0-py3-none-any.whl[chart]'"),
    ({"url": "https://bot:pw@git.example.com/acme/gpucluster.git",
      "vcs_info": {"vcs": "git", "commit_id": "0123abc"}}, None,
     "pip install 'gpucluster[chart] @ git+https://git.example.com/acme/gpucluster.git@0123abc'"),
    ({"url": "https://files.example.com/gpucluster-0.1.0.tar.gz", "archive_info": {}}, None,
     "pip install 'gpucluster[chart] @ https://files.example.com/gpucluster-0.1.0.tar.gz'"),
    (None, None, f"pip install 'gpucluster[chart]=={VERSION}'"),
])
def test_the_extra_is_installed_from_where_gpucluster_came_from(info: dict | None, cwd: Path | None,
                                                                 command: str) -> None:
    assert installed.extra_install_command("chart", info, cwd) == command


def test_a_wheel_install_is_not_told_to_install_a_checkout(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = {"url": "file:///tmp/dist/gpucluster-0.1.0-py3-none-any.whl", "archive_info": {}}
    monkeypatch.setattr(installed, "direct_url", lambda: wheel)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = CliRunner().invoke(app, ["cost", "prod", "--chart", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert result.output.strip() == ("cost: --chart needs matplotlib: "
                                     "pip install '/tmp/dist/gpucluster-0.1.0-py3-none-any.whl[chart]'")
