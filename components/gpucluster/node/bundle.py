"""The node scripts bundle: every shipped node script in one tar, addressed by its sha256.

EC2 user data holds 16 KiB (EC2 user guide, "Run commands when you launch an EC2 instance with user
data"); the scripts alone took most of it, so a MIG group with the metrics collector no longer fit.
They now ship as one S3 object of the stack (`gpucluster.aws.nodescripts.NodeScripts`) under
`node-scripts/<sha256>.tar`, and the user data names that digest: the node's loader
(fetch-scripts.sh) refuses a bundle with any other. The bundle depends on the package alone, not
on a stack or a group, so one object serves every group of a stack, and a change to any script
changes the digest, hence the key and every launch template.

The tar is byte-for-byte reproducible (sorted members, fixed mode, owner and time, POSIX ustar, no
compression: a compressor's version would change the bytes), so `plan`, `pulumi up` and a later
`pulumi up` on another machine compute the same digest. Pure: no Pulumi import, no AWS call.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Mapping
from functools import cache

from gpucluster.node.userdata import ScriptsSource, bundle_members
from gpucluster.noderole import NODE_SCRIPTS_PREFIX

BUNDLE_PREFIX = NODE_SCRIPTS_PREFIX
"""The only prefix nodes may read in the stack's node-scripts bucket (noderole.scripts_policy_document)."""
BUNDLE_CONTENT_TYPE = "application/x-tar"


@cache
def bundle_bytes() -> bytes:
    """The bundle: every member of `bundle_members` (`pack`)."""
    return pack(bundle_members())


def pack(members: Mapping[str, str]) -> bytes:
    """A reproducible tar of `members`: by name, regular files, mode 0644, owned by root, time 0."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@cache
def bundle_sha256() -> str:
    """The bundle's sha256 (hex): what every user data names and the loader checks."""
    return hashlib.sha256(bundle_bytes()).hexdigest()


def bundle_key(sha256: str | None = None) -> str:
    """The object key of a bundle: `node-scripts/<sha256>.tar` (this package's by default)."""
    return f"{BUNDLE_PREFIX}{sha256 or bundle_sha256()}.tar"


def scripts_source(bucket: str, owner: str) -> ScriptsSource:
    """This package's bundle in `bucket` of account `owner`: what a node group's user data fetches."""
    return ScriptsSource(bucket=bucket, key=bundle_key(), sha256=bundle_sha256(), owner=owner)
