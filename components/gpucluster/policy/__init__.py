"""gpucluster's CrossGuard policy pack and the same rules for `gpucluster plan`.

`rules/` holds the rules as pure functions over `records.Resource`, one module per concern;
`pack.py` wraps them for CrossGuard and `__main__.py` serves them as a
PolicyPack (`pulumi preview --policy-pack policies`); `offline.py` runs them
over an offline plan; `settings.py` reads Pulumi's policy config format.
"""
