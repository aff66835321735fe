"""pulumi_aws, loaded one resource module at a time instead of a whole service package at once.

Each service package of pulumi_aws (`pulumi_aws.ec2`, `.s3`, ...) imports every
resource module it has in its `__init__`: `aws.ec2.LaunchTemplate` loads 182
modules of ec2 alone, and the program needs 44 classes of 468 modules loaded
(most of a plan's import time). Importing `pulumi_aws.ec2.launch_template`
directly does not help: Python runs the package's `__init__` first.

`load_on_demand()` keeps the package objects pulumi_aws already created (lazy,
not yet loaded) and gives each a module `__getattr__` (PEP 562) that imports only
the module defining the name asked for (`LaunchTemplate` -> `launch_template`,
`get_parameter_output` -> `get_parameter`, input types -> `_inputs`, enums ->
`_enums`), binding that module's `__all__` on the package as its `__init__`'s
`from .x import *` would. Any name it cannot place (and `__all__`, `dir()`)
loads the package in full, so `aws.<service>.<anything>` means what it always
meant, for this program and any other code in the process. It never changes a
package that is already loaded, and never touches pulumi_aws's files.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from typing import Any

import pulumi_aws

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STAR_IMPORT = re.compile(r"^from \.(\w+) import \*$", re.MULTILINE)
_SHARED = ("_enums", "_inputs")  # star-imported by a package's __init__ besides its resource modules


def _module_names(name: str) -> list[str]:
    """Modules of a service package that may define `name`, most likely first."""
    snake = _CAMEL.sub("_", name).lower()
    return list(dict.fromkeys([name, name.removesuffix("_output"), snake,
                               _CAMEL.sub("_", name.removesuffix("Args")).lower()]))


class _ServicePackage(types.ModuleType):
    """A pulumi_aws service package whose modules load when one of their names is first used."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("__"):
            exported = self._star_imported()
            for module_name in (*_module_names(name), *_SHARED):
                star = module_name in exported
                if not star and module_name != name:
                    continue
                module = self._load(module_name, bind=star)
                if module is None:
                    continue
                if star and name in getattr(module, "__all__", ()):
                    return getattr(module, name)
                if module_name == name:  # the submodule itself (`from . import outputs`)
                    return module
        return self._load_all(name)

    def __dir__(self) -> list[str]:
        self._load_all(None)
        return dir(self)

    def _spec(self) -> importlib.machinery.ModuleSpec:
        """The package's import spec: every imported package has one."""
        if self.__spec__ is None:
            raise ImportError(f"{self.__name__} was not imported from a file")
        return self.__spec__

    def _star_imported(self) -> frozenset[str]:
        """The submodules whose names the package's `__init__` binds (`from .x import *`)."""
        found = self.__dict__.get("_gpucluster_star_imported")
        if found is None:
            with open(self._spec().origin or "", encoding="utf-8") as init:
                found = frozenset(_STAR_IMPORT.findall(init.read()))
            self.__dict__["_gpucluster_star_imported"] = found
        return found

    def _load(self, module_name: str, bind: bool) -> types.ModuleType | None:
        """Import one submodule (None if there is none of that name); `bind`: its exports too."""
        full = f"{self.__name__}.{module_name}"
        module = sys.modules.get(full)
        if module is None:
            if importlib.util.find_spec(full) is None:
                return None
            __import__(full)  # the import statement's path: -X importtime sees it, unlike import_module
            module = sys.modules[full]
        if bind:
            for exported in getattr(module, "__all__", ()):
                self.__dict__[exported] = getattr(module, exported)
        return module

    def _load_all(self, name: str | None) -> Any:
        """Run the package's own `__init__` in this module object (what an eager import does)."""
        loader = self._spec().loader
        if loader is None:
            raise ImportError(f"{self.__name__} has no loader to run its __init__ with")
        # Back to a plain module object, which the package's own __init__ then fills.
        self.__class__ = types.ModuleType  # type: ignore[assignment]
        loader.exec_module(self)
        return None if name is None else getattr(self, name)


def _lazy_module_types() -> tuple[type, ...]:
    """The lazy module classes pulumi_aws's `_utilities.lazy_import` may have used."""
    kinds: list[type] = []
    try:
        from pulumi._utils import _LazyModule as PulumiLazyModule
    except ImportError:  # an SDK without its own copy uses importlib's
        pass
    else:
        kinds.append(PulumiLazyModule)
    stdlib = getattr(importlib.util, "_LazyModule", None)
    if isinstance(stdlib, type):
        kinds.append(stdlib)
    return tuple(kinds)


def load_on_demand() -> int:
    """Make every not-yet-loaded service package of pulumi_aws load by name; how many it changed."""
    lazy = _lazy_module_types()
    prefix = f"{pulumi_aws.__name__}."
    changed = 0
    for key, module in list(sys.modules.items()):
        if key.startswith(prefix) and key.count(".") == 1 and type(module) in lazy:
            module.__class__ = _ServicePackage
            changed += 1
    return changed
