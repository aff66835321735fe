"""Named checks of the `datasets` section: names, buckets, FSx, checkpoints, and where each dataset
appears on a node.

Each check is a small function returning findings; never imports Pulumi, AWS or the renderers (the
node role's policy size is checked by `gpucluster.preflight`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpucluster.spec.checks import check
from gpucluster.spec.fields import BUCKET_RESERVED_PREFIXES, generated_bucket_prefix
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import DatasetConfig, StackSpec


@check
def datasets(spec: StackSpec) -> Iterable[Finding]:
    names: set[str] = set()
    buckets: set[str] = set()
    for i, d in enumerate(spec.datasets):
        path = f"datasets[{i}]"
        if d.name in names:
            yield Finding(f"{path}.name", f"duplicate dataset name {d.name!r}")
        names.add(d.name)
        if d.bucket_name:
            if d.bucket_name in buckets:
                yield Finding(f"{path}.bucket_name", f"bucket {d.bucket_name!r} is used twice")
            buckets.add(d.bucket_name)
        yield from dataset_findings(d, spec.cluster.name, spec.node_group_zones, path)


def dataset_findings(d: DatasetConfig, cluster_name: str, node_group_zones: set[str] | None,
                     path: str = "dataset") -> Iterable[Finding]:
    """Every rule on one dataset alone; `node_group_zones` None where the node groups are not known."""
    if d.existing and not d.bucket_name:
        yield Finding(f"{path}.bucket_name", "required for an existing bucket")
    if not d.existing and not d.bucket_name:
        generated = generated_bucket_prefix(cluster_name, d.name)
        if generated.startswith(BUCKET_RESERVED_PREFIXES):
            yield Finding(f"{path}.bucket_name", f"the generated bucket name would start with "
                          f"{generated!r}, a prefix S3 reserves; set a bucket_name")
    if d.access == "fsx" and d.fsx is None:
        yield Finding(f"{path}.fsx", "required when access is fsx")
    if d.fsx is not None:
        if d.access != "fsx":
            yield Finding(f"{path}.fsx", f"only used with access: fsx, got access: {d.access}")
        yield from _fsx_rules(d, node_group_zones, path)
    if d.mount_path and d.access != "mount":
        yield Finding(f"{path}.mount_path", f"only used with access: mount, got {d.access}")
    if d.expected_bucket_owner and not d.existing:
        yield Finding(f"{path}.expected_bucket_owner", "only used with existing: true (a bucket the "
                      "stack creates belongs to the deploying account)")
    yield from _checkpoint_rules(d, path)


def _checkpoint_rules(d: DatasetConfig, path: str) -> Iterable[Finding]:
    if d.checkpoint_prefix == "":
        yield Finding(f"{path}.checkpoint_prefix", "must be a folder-like prefix such as "
                      "'checkpoints/', not the whole bucket (nodes get write access to it)")
    elif d.checkpoint_prefix is not None and d.prefix and (
            d.checkpoint_prefix.startswith(d.prefix) or d.prefix.startswith(d.checkpoint_prefix)):
        yield Finding(f"{path}.checkpoint_prefix", "must not overlap the read-only data "
                      f"prefix {d.prefix!r}, got {d.checkpoint_prefix!r}")
    for key in ("noncurrent_version_expiration_days", "newer_noncurrent_versions"):
        if key not in d.model_fields_set:
            continue
        if d.existing:
            yield Finding(f"{path}.{key}", "only applies to buckets this stack creates; an existing "
                          "bucket's lifecycle is never changed")
        elif d.checkpoint_prefix is None:
            yield Finding(f"{path}.{key}",
                          "only used with a checkpoint_prefix (the lifecycle rule covers it alone)")


def _fsx_rules(d: DatasetConfig, node_group_zones: set[str] | None, dataset: str) -> Iterable[Finding]:
    fsx, path = d.fsx, f"{dataset}.fsx"
    if fsx is None:
        return
    size = fsx.storage_capacity_gib
    # FSx API reference, CreateFileSystem StorageCapacity: SCRATCH_2 and PERSISTENT_2 (SSD)
    # take 1200 GiB, 2400 GiB and increments of 2400 GiB.
    if size != 1200 and size % 2400:
        yield Finding(f"{path}.storage_capacity_gib",
                      f"FSx for Lustre takes 1200 or a multiple of 2400 GiB, got {size}")
    if fsx.deployment_type == "PERSISTENT_2" and fsx.throughput_per_unit_mib is None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "required for PERSISTENT_2 (125, 250, 500 or 1000)")
    if fsx.deployment_type == "SCRATCH_2" and fsx.throughput_per_unit_mib is not None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "SCRATCH_2 has a fixed throughput; only PERSISTENT_2 takes this")
    if fsx.deployment_type == "SCRATCH_2" and "automatic_backup_retention_days" in fsx.model_fields_set:
        yield Finding(f"{path}.automatic_backup_retention_days",
                      "SCRATCH_2 file systems have no backups; only PERSISTENT_2 takes this")
    if fsx.deployment_type == "PERSISTENT_2" and fsx.automatic_backup_retention_days == 0:
        yield Finding(f"{path}.automatic_backup_retention_days",
                      "a PERSISTENT_2 file system keeps automatic backups: 1-90 days, got 0")
    if fsx.availability_zone and node_group_zones is not None \
            and fsx.availability_zone not in node_group_zones:
        yield Finding(f"{path}.availability_zone", f"no node group runs in "
                      f"{fsx.availability_zone!r} (node groups use "
                      f"{', '.join(sorted(node_group_zones))})")
    if not fsx.client_key_fingerprints:
        yield Finding(f"{path}.client_key_fingerprints",
                      "not set: where the AMI lacks the Lustre client, nodes trust the apt key AWS serves "
                      "over TLS unchecked; pin it (docs: guides/datasets.md, Lustre client key)",
                      level="warning")
    if d.checkpoint_prefix and not d.prefix:
        # The data association would link the whole bucket, checkpoints included: what the
        # checkpoint association exports would come back as a second copy under /data.
        yield Finding(f"{dataset}.prefix",
                      "an FSx dataset with a checkpoint_prefix needs a data prefix of its own "
                      "(e.g. 'data/'), so the two data repository associations do not overlap")


@check
def dataset_paths(spec: StackSpec) -> Iterable[Finding]:
    """Where datasets appear on a node: one place each, never inside the NVMe scratch mount."""
    scratch = {g.scratch_mount.rstrip("/") for g in spec.node_groups}
    seen: dict[str, str] = {}
    for i, d in enumerate(spec.datasets):
        key = {"mount": "mount_path", "fsx": "fsx.mount_path"}.get(d.access)
        if key is None:
            if len(scratch) > 1:
                yield Finding(f"datasets[{i}].access", "copy_to_scratch needs one scratch_mount "
                              f"for every node group, got {', '.join(sorted(scratch))}")
            continue
        where = dataset_path(spec, d)
        yield from data_path_findings(where, f"datasets[{i}].{key}", scratch, seen)
        seen[d.name] = where


def data_path_findings(where: str, path: str, scratch_mounts: Iterable[str],
                       others: Mapping[str, str]) -> Iterable[Finding]:
    """A dataset's place on the node overlaps neither NVMe scratch nor another dataset (name -> path)."""
    for mount in sorted(scratch_mounts):
        if _nested(where, mount):
            yield Finding(path, f"{where} overlaps the NVMe scratch mount "
                          f"{mount}, which is erased and reformatted at boot")
    for other, other_path in others.items():
        if _nested(where, other_path):
            yield Finding(path, f"{where} overlaps {other_path} of dataset {other!r}")


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def dataset_path(spec: StackSpec, d: DatasetConfig) -> str:
    """Where a dataset appears on every node (copy: under scratch; mount; FSx mount path)."""
    if d.access == "fsx" and d.fsx is not None:
        return d.fsx.mount_path
    if d.access == "mount":
        return d.mount_path or f"/data/{d.name}"
    return f"{spec.node_groups[0].scratch_mount.rstrip('/')}/{d.name}"
