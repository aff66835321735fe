"""What one part of a cluster hands to another: plain records, no resources.

Datasets hand node IAM the S3 grants and the node bootstrap the data mounts;
keeping these records here lets each part be built and tested on its own.
Values typed `Any` may be plain strings or Pulumi Outputs (bucket names of
created buckets are only known at deploy time). No Pulumi import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

DataAccess = Literal["copy_to_scratch", "mount", "fsx"]


@dataclass(frozen=True)
class S3Grant:
    """Node access to one bucket: read the bucket (or `prefix`), or write under `prefix`."""

    bucket_name: Any
    """str or Output[str]."""
    prefix: str = ""
    """"" means the whole bucket; otherwise a folder-like prefix ending in '/'."""
    write: bool = False
    expected_bucket_owner: Any = None
    """The account that must own the bucket (12 digits); None: the deploying account."""


@dataclass(frozen=True)
class DataMount:
    """How the node bootstrap brings one dataset to the GPUs."""

    name: str
    access: DataAccess
    bucket_name: Any
    """str or Output[str]."""
    prefix: str
    path: str
    """Where the data appears on the node (scratch sub-folder, mount point, or FSx mount path)."""
    fsx_dns_name: Any = None
    """access == "fsx": Output[str] of the file system's DNS name."""
    fsx_mount_name: Any = None
    """access == "fsx": Output[str] of the file system's Lustre mount name."""
    fsx_client_key_fingerprints: tuple[str, ...] = ()
    """access == "fsx": the pinned fingerprints of AWS's Lustre client apt key (none: not pinned)."""
    expected_bucket_owner: Any = None
    """str or Output[str]: the account that must own the bucket (12 digits); None: none named."""
