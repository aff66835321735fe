"""The Pulumi ComponentResources of a GPU cluster, each with its own typed *Args.

Importing it makes pulumi_aws load resource modules by name (`gpucluster.aws.sdk`):
a plan loads the modules it uses, not every module of every service it touches.
"""

from gpucluster.aws.sdk import load_on_demand

load_on_demand()
