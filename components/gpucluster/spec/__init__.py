"""The stack-file language: every key a stack file may hold, and every rule on it that needs no rendering.

A stack file (`stacks/Pulumi.<env>.yaml`) holds `aws:region` and the keys `gpucluster:cluster`,
`network`, `node_groups`, `datasets`, `budget`, `autostop`, `spot` and `images`.
`parse_stack_config` turns that
mapping into a frozen `StackSpec` or raises `SpecError` listing every problem at once, each as
`<key path>: <message>`. By concern: `findings` (the finding type and its wording), `fields` (field
types and validators), `models` (the pydantic models), `checks` (the registry of named checks) with
one module per section (`network`, `node_groups`, `datasets`, `budget`, `autostop`), and `decode`
(Pulumi config -> StackSpec). It must never import Pulumi, call AWS, or import anything of gpucluster
above it (`aws`, `node`, `names`, `project`, `stack`, `preflight`, `ops`, `cli`): checks that need
rendered artefacts live in `gpucluster.preflight`. The names below are re-exported for the code,
examples and users that import them from `gpucluster.spec`.
"""

from __future__ import annotations

# The section modules register their checks on import, in the order findings are reported: first,
# whatever module of the package a caller imports (no section module imports another).
# isort: off
from gpucluster.spec import network, node_groups, datasets, budget, autostop, images  # noqa: F401
# isort: on
from gpucluster.lambdas.tags import STACK_TAG
from gpucluster.spec.autostop import autostop_findings
from gpucluster.spec.budget import budget_findings
from gpucluster.spec.checks import (
    CHECKS,
    GROUP_CHECKS,
    Check,
    GroupCheck,
    check,
    group_check,
    node_group_findings,
    unique_name_findings,
)
from gpucluster.spec.datasets import data_path_findings, dataset_findings, dataset_path
from gpucluster.spec.decode import parse_stack_config, plain_value_problem, stack_warnings
from gpucluster.spec.fields import (
    CRON_FIELDS,
    DIY_ORGANIZATION,
    IDENTITY_MAX,
    IDENTITY_TAG_KEYS,
    ORGANIZATION_KEY,
    PROJECT,
    AbsolutePath,
    AccountId,
    AvailabilityZone,
    BucketName,
    ContainerImage,
    Name,
    PolicyName,
    Region,
    RoleName,
    S3Prefix,
    TagValue,
    _matches,
    generated_bucket_prefix,
    stack_identity,
    tag_key,
)
from gpucluster.spec.files import read_project_file
from gpucluster.spec.findings import (
    MAX_FINDINGS,
    MAX_INPUT_BYTES,
    MAX_LINE_CHARS,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    MAX_VALUES,
    SHOWN_CHARS,
    Finding,
    SpecError,
    clip,
    format_path,
    model_in,
    shown,
    validation_findings,
)
from gpucluster.spec.models import (
    HEALTH_FINDINGS,
    LAUNCH_TIMEOUT_MINUTES,
    MIG_LAUNCH_TIMEOUT_MINUTES,
    AutoStopConfig,
    BudgetConfig,
    CapacityConfig,
    ClusterConfig,
    CostTags,
    DatasetConfig,
    FsxConfig,
    HealthCheckConfig,
    ImageGroupConfig,
    ImagesConfig,
    MigConfig,
    NetworkConfig,
    NodeGroupConfig,
    SpotConfig,
    StackConfig,
    StackSpec,
    StrictModel,
    WarmPoolConfig,
    baked_image,
    can_run_spot,
    field_docs,
    launches_baked,
)
from gpucluster.spec.network import network_findings, zone_region_findings
from gpucluster.spec.node_groups import CAPACITY_BLOCK_PLACEMENT, group_zone_findings, single_zone_findings

__all__ = [
    "CAPACITY_BLOCK_PLACEMENT",
    "CHECKS",
    "CRON_FIELDS",
    "DIY_ORGANIZATION",
    "GROUP_CHECKS",
    "HEALTH_FINDINGS",
    "IDENTITY_MAX",
    "IDENTITY_TAG_KEYS",
    "LAUNCH_TIMEOUT_MINUTES",
    "MAX_FINDINGS",
    "MAX_INPUT_BYTES",
    "MAX_LINE_CHARS",
    "MAX_NESTING",
    "MAX_NUMBER_CHARS",
    "MAX_VALUES",
    "MIG_LAUNCH_TIMEOUT_MINUTES",
    "ORGANIZATION_KEY",
    "PROJECT",
    "SHOWN_CHARS",
    "STACK_TAG",
    "AbsolutePath",
    "AccountId",
    "AutoStopConfig",
    "AvailabilityZone",
    "BucketName",
    "BudgetConfig",
    "CapacityConfig",
    "Check",
    "ClusterConfig",
    "ContainerImage",
    "CostTags",
    "DatasetConfig",
    "Finding",
    "FsxConfig",
    "GroupCheck",
    "HealthCheckConfig",
    "ImageGroupConfig",
    "ImagesConfig",
    "MigConfig",
    "Name",
    "NetworkConfig",
    "NodeGroupConfig",
    "PolicyName",
    "Region",
    "RoleName",
    "S3Prefix",
    "SpecError",
    "SpotConfig",
    "StackConfig",
    "StackSpec",
    "StrictModel",
    "TagValue",
    "WarmPoolConfig",
    "_matches",
    "autostop_findings",
    "baked_image",
    "budget_findings",
    "can_run_spot",
    "check",
    "clip",
    "data_path_findings",
    "dataset_findings",
    "dataset_path",
    "field_docs",
    "format_path",
    "generated_bucket_prefix",
    "group_check",
    "group_zone_findings",
    "launches_baked",
    "model_in",
    "network_findings",
    "node_group_findings",
    "parse_stack_config",
    "plain_value_problem",
    "read_project_file",
    "shown",
    "single_zone_findings",
    "stack_identity",
    "stack_warnings",
    "tag_key",
    "unique_name_findings",
    "validation_findings",
    "zone_region_findings",
]
