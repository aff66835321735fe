"""Pulumi component provider for gpucluster: `pulumi package add` runs this to serve the components.

Pulumi's Python language host runs the plugin directory's `__main__.py`
(pulumi-language-python RunPlugin). The components live in the installed
`gpucluster` package, not in this directory, so they are listed explicitly
(`component_provider_host(components, name)`, Pulumi docs "Authoring a
Source-Based Plugin Package", explicit registration); their schema is inferred
from each constructor's `args` annotation. `name` is the package part of the
type tokens (`gpucluster:index:<Type>`).
"""

from importlib.metadata import version

from pulumi.provider.experimental import component_provider_host

from gpucluster import (
    ClusterDashboard,
    ClusterNetwork,
    DatasetBucket,
    GpuCluster,
    GpuNodeGroup,
    Guardrails,
    LustreFileSystem,
    NodeIdentity,
    NodeScripts,
)

COMPONENTS = [ClusterNetwork, GpuNodeGroup, NodeIdentity, DatasetBucket, LustreFileSystem, Guardrails,
              ClusterDashboard, GpuCluster, NodeScripts]

if __name__ == "__main__":
    component_provider_host(COMPONENTS, name="gpucluster", version=version("gpucluster"))
