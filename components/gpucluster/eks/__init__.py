"""Kubernetes on EKS, as pure rendering (`scheduler: {type: eks}`): the objects, chart values and
manifests gpucluster puts on an EKS cluster, as plain dicts; no Pulumi or AWS import here.

The Pulumi side that registers them lives under `gpucluster.aws`; the day-2 side under `gpucluster.ops`.
"""
