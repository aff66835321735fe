"""cfn-lint's bundled data, read as files: CloudFormation's resource schemas and its copy of the Service
Authorization Reference (each IAM action's resource types and condition keys).

The tests need only these files. Importing `cfnlint` runs its package `__init__`, which loads its rules
and, with them, sympy, networkx and mpmath: 0.75 s for each test process that does it, and 21 MB of
their bytecode to compile in a fresh checkout, whose test command installs without compiling. So the
package is located (`find_spec` runs nothing) and its files are read.
"""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any


def data_dir() -> Path:
    """cfn-lint's `data/` folder."""
    spec = importlib.util.find_spec("cfnlint")
    assert spec is not None and spec.origin, "cfn-lint (requirements-dev.lock) is not installed"
    return Path(spec.origin).parent / "data"


@cache
def _region_index(region: str) -> dict[str, str]:
    """Type name -> the name of its schema file, as `region` has it."""
    found: dict[str, str] = json.loads((data_dir() / "schemas" / "providers" / f"{region}.json").read_text())
    return found


def resource_schema_path(type_name: str, region: str = "us-east-1") -> Path:
    """The file of cfn-lint's schema of `type_name` (`AWS::PCS::Cluster`) as `region` has it."""
    return data_dir() / "schemas" / "resources" / f"{_region_index(region)[type_name]}.json"


def resource_schema(type_name: str, region: str = "us-east-1") -> dict[str, Any]:
    """cfn-lint's schema of `type_name` in `region`: what `cfnlint.schema.PROVIDER_SCHEMA_MANAGER` gives."""
    found: dict[str, Any] = json.loads(resource_schema_path(type_name, region).read_text())
    return found


@cache
def service_authorization() -> dict[str, Any]:
    """cfn-lint's `Policies.json`: service prefix -> its `Actions` (lower-case names), `Resources`, ..."""
    found: dict[str, Any] = json.loads((data_dir() / "AdditionalSpecs" / "Policies.json").read_text())
    return found
