"""The Pulumi ComponentResources of a GPU cluster, each with its own typed *Args."""
