"""Node scripts under bash on this machine: stub commands that log their calls, and that log read back.

Each stub is an executable on a PATH directory of the test's own that appends one line,
`<name> <arguments>`, to a call log, then runs its body; the tests read the calls back
with `logged_calls`.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpucluster.node.userdata import SCRIPTS_DIR, bundle_members, script


def write_stubs(bin_dir: Path, log: Path, bodies: Mapping[str, str]) -> None:
    """One executable per name in `bin_dir` (made if missing): logs its call to `log`, then runs its body."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in bodies.items():
        stub = bin_dir / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> {log}\n{body}\n')
        stub.chmod(0o755)


def logged_calls(log: Path, command: str) -> list[str]:
    """The arguments of each logged call of `command`, in order ("" for a call without any)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split(" ", 1)[1] if " " in line else "" for line in lines
            if line.split(" ", 1)[0] == command]


def run_script(root: Path, name: str, *args: str, env: Mapping[str, str],
               timeout: float) -> subprocess.CompletedProcess[str]:
    """The node script `name` as gpucluster ships it, written under `root` and run by bash."""
    path = root / name
    path.write_text(script(name))
    return subprocess.run(["bash", str(path), *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout)


def with_bundled_scripts(user_data: str) -> str:
    """Rendered user data with each script it installs from the node scripts bundle written out in
    full, as the node ends up with it (the bundle's text in place of `install -m MODE <bundle>/NAME PATH`)."""
    members = bundle_members()
    return re.sub(rf"^install -m \d+ {re.escape(SCRIPTS_DIR)}/(\S+) (\S+)$",
                  lambda m: f"cat > {m[2]} <<'BUNDLED'\n{members[m[1]]}BUNDLED", user_data, flags=re.M)


OS_RELEASES = {
    "ubuntu-22.04": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
                    'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nVERSION_CODENAME=jammy\n',
    "ubuntu-24.04": 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
                    'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nVERSION_CODENAME=noble\n',
    "al2023": 'NAME="Amazon Linux"\nVERSION="2023"\nID="amzn"\nID_LIKE="fedora"\nVERSION_ID="2023"\n'
              'PLATFORM_ID="platform:al2023"\nPRETTY_NAME="Amazon Linux 2023.6.20241212"\n',
    "al2": 'NAME="Amazon Linux"\nVERSION="2"\nID="amzn"\nID_LIKE="centos rhel fedora"\nVERSION_ID="2"\n'
           'PRETTY_NAME="Amazon Linux 2"\n',
    "ubuntu-20.04": 'NAME="Ubuntu"\nVERSION_ID="20.04"\nID=ubuntu\nPRETTY_NAME="Ubuntu 20.04.6 LTS"\n',
    "rocky-9": 'NAME="Rocky Linux"\nVERSION_ID="9.4"\nID="rocky"\n'
               'PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\n',
}
"""os-release(5) files as those systems ship them (the fields gpucluster-os reads, and a few more)."""


def os_env(root: Path, system: str = "ubuntu-22.04") -> dict[str, str]:
    """The environment that makes the node scripts see `system` (an OS_RELEASES key): the shipped
    gpucluster-os written under `root`, reading a fake /etc/os-release there."""
    root.mkdir(parents=True, exist_ok=True)
    release, tool = root / "os-release", root / "gpucluster-os"
    release.write_text(OS_RELEASES[system])
    tool.write_text(script("os.sh"))
    tool.chmod(0o755)
    return {"GPUCLUSTER_OS_TOOL": str(tool), "GPUCLUSTER_OS_RELEASE": str(release)}
