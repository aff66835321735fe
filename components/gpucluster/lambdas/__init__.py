"""Guardrail Lambda handlers: thin entry points that read their event and environment, then call the core.

The deploy zips this directory as the package ``lambdas`` beside ``gpucluster/fleet/`` (the core
they call, imported absolutely as ``gpucluster.fleet``), so the handlers are
``lambdas.<module>.handler`` (see ``gpucluster.fleet.deployment.HANDLERS``). A module here holds
one handler: event parsing, the environment it reads, and the calls into the core; what a stop, a
start or a spend decision means lives in ``gpucluster.fleet``. They import nothing else of
gpucluster and never Pulumi.
"""
