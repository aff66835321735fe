"""CrossGuard entry point (`pulumi preview --policy-pack policies`): builds the PolicyPack, nothing else.

Pulumi runs this file from the `policies/` directory with the project's
`.venv` (PulumiPolicy.yaml), where the `gpucluster` package is installed: the
rules and the instance catalog are the installed package's.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

from gpucluster.policy.pack import PACK_DESCRIPTION, PACK_NAME, build_policies

PolicyPack(
    name=PACK_NAME,
    description=PACK_DESCRIPTION,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=build_policies(),
)
