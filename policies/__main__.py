"""CrossGuard entry point (`pulumi preview --policy-pack policies`): builds the PolicyPack, nothing else.

Pulumi runs this file from the `policies/` directory with the project's
`.venv` (PulumiPolicy.yaml); the repository root goes first on sys.path so the
rules and the instance catalog import from this checkout, installed or not.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policies.pack import PACK_DESCRIPTION, PACK_NAME, build_policies

PolicyPack(
    name=PACK_NAME,
    description=PACK_DESCRIPTION,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=build_policies(),
)
