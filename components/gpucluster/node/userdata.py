"""Node bootstrap: the user data every GPU node boots with, rendered per node group.

It owns what runs on a node: the MIG partitions of its GPUs, the NVMe RAID0
scratch volume, the EFA/NCCL environment, the CloudWatch agent publishing GPU
metrics (auto-stop alarms on utilisation, the dashboard shows the rest), the GPU
health checks (at launch, under the group's lifecycle hook, and on a timer), the
spot-interruption watcher and hook, the dataset mounts, the checkpoint hook, and
the node group's own files, setup and container image. The
shell lives in the `*.sh` files next to this module; this module only renders
settings into them (values shell-quoted) and packs them into one script. With a
`ScriptsSource` (what GpuCluster gives every group), the shipped scripts are not in
it: its loader fetches the node scripts bundle (`gpucluster.node.bundle`), checks its
sha256 and installs them from it, so the user data keeps to settings and units. It is
pure: no Pulumi import and no AWS call, so the output can be linted (`bash -n`,
shellcheck) and inspected offline. Values that are Pulumi Outputs (bucket or
FSx names of created resources) must be resolved by the caller first.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources

from gpucluster import catalog
from gpucluster.catalog import family_of
from gpucluster.fleet.nodepaths import INTERRUPTION_HOOK, JOB_LOG_DIR, JOB_TOOL
from gpucluster.node.metrics import (
    METRICS_UNIT,
    PROMETHEUS_DATA,
    PROMETHEUS_RETENTION,
    PROMETHEUS_UNIT,
    NodeMetrics,
    dcgm_fields,
    group_metrics,
)
from gpucluster.noderole import gpu_metric_namespace, run_log_group_name
from gpucluster.parts import DataMount
from gpucluster.spec import (
    AutoStopConfig,
    NodeGroupConfig,
    SpotConfig,
    StackSpec,
    launches_baked,
    read_project_file,
)

# --- the contract with auto-stop (guardrails): where GPU utilisation is published.
# CloudWatch user guide, "Collect NVIDIA GPU metrics": the agent's nvidia_gpu plugin
# publishes `nvidia_smi_<measurement>` in the agent's namespace: the cluster's own
# (`gpu_metric_namespace`), the only one the node role may publish into, so no node feeds
# another cluster's idle alarms.
GPU_UTILIZATION_METRIC = "nvidia_smi_utilization_gpu"
GPU_METRIC_DIMENSION = "AutoScalingGroupName"
# `gpucluster-report activity` (report.sh): 1 while a GPU process or a gpucluster job runs, by Stack
# and NodeGroup, every minute; the idle alarm's first signal.
ACTIVITY_METRIC = "NodeActive"
# On a Slurm stack, `gpucluster-report activity` also publishes the busiest GPU's utilisation while a
# process holds a GPU, by Stack and NodeGroup (no Auto Scaling group there): the idle fallback's metric.
SLURM_GPU_METRIC = "GpuUtilizationMax"
"""The agent also publishes an aggregate carrying only this dimension (one series per group)."""
GPU_METRIC_PERIOD_SECONDS = 60
# Every nvidia_gpu measurement the agent publishes (`nvidia_smi_<name>`), per GPU and per group:
# what auto-stop, the stuck-job alarm and the dashboard may read, and nothing they do not.
GPU_MEASUREMENTS = ("utilization_gpu", "utilization_memory", "memory_used", "memory_total",
                    "temperature_gpu", "power_draw")

# --- the contract with the node group (lifecycle hook, IAM) and the dashboard: GPU health checks.
HEALTH_CHECK = "/usr/local/sbin/gpucluster-health-check"
LAUNCH_HOOK_NAME = "gpucluster-launch-check"
"""The launch lifecycle hook the node completes (CONTINUE or ABANDON) after its launch check."""
HEALTH_METRICS = ("HealthFindings", "LaunchAbandons", "HealthReplacements")
"""What health-check.sh counts, +1 per event, by AutoScalingGroupName, in the cluster's own namespace
(noderole.gpu_metric_namespace: the GPU metrics', the one its nodes may publish into)."""


NODE_ENV = "/etc/gpucluster/node.env"
# --- the node group's own setup (gpucluster-setup.service) and the checkpoint contract's hook.
USER_SETUP = "/etc/gpucluster/user-setup.sh"
CHECKPOINT_HOOK = "/usr/local/sbin/gpucluster-checkpoint"
# --- MIG (node group `mig`): gpucluster-mig applies the layout at boot and runs a job's local rank on
# its MIG device (`gpucluster-mig exec CMD`); the devices, one UUID a line, in local rank order.
MIG_TOOL = "/usr/local/sbin/gpucluster-mig"
MIG_DEVICES = "/run/gpucluster/mig-devices"

MAX_USER_DATA_BYTES = 16384
"""EC2 limit on user data before base64 (EC2 user guide, "Run commands at launch").

The script is gzipped (cloud-init unpacks gzip user data: cloud-init docs, "User data
formats"), so this bounds the compressed size."""

# EFA supports RDMA (GPUDirect) on these families (EC2 user guide, "Elastic Fabric
# Adapter", supported instance types: RDMA read/write).
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})

_SBIN = "/usr/local/sbin"
_UNITS = "/etc/systemd/system"
_EOF = "GPUCLUSTER_FILE_EOF"
FETCH_TOOL = f"{_SBIN}/gpucluster-fetch-scripts"
OS_TOOL = f"{_SBIN}/gpucluster-os"
"""Prints the node's operating system (ubuntu, al2023); refuses any other (os.sh)."""
SCRIPTS_DIR = "/usr/local/lib/gpucluster/scripts"
"""Where a node unpacks the verified bundle; each script is installed from there to its path."""
UNGATED_HEALTH_CHECK = "health-check-ungated.sh"
"""The bundle's name for health-check.sh without its ready-gate blocks (`without_ready_gate`)."""
BUNDLE_SCRIPTS = ("agent.sh", "baked-install.sh", "checkpoint.sh", "data.sh", "eks-activity.sh",
                  "health-check.sh", "install.sh", "interruption-hook.sh", "job.sh", "metrics.sh", "mig.sh",
                  "os.sh", "ready.sh", "report.sh", "scratch.sh", "setup.sh", "spot-watcher.sh")
"""Every shipped script a node may run (with UNGATED_HEALTH_CHECK: the bundle's members)."""


@dataclass(frozen=True)
class NodeFile:
    """One file the bootstrap writes on the node."""

    path: str
    content: str
    mode: str = "0644"
    make_parent: bool = False
    """Create the file's directory first (the group's own files go anywhere)."""
    member: str | None = None
    """A shipped script: its name in the node scripts bundle (`bundle_members`), which a node
    given a `ScriptsSource` copies it from instead of reading it from the user data."""


@dataclass(frozen=True)
class ScriptsSource:
    """Where a node fetches the node scripts bundle from, and the digest it must have (plain values).

    The bundle (`gpucluster.node.bundle`) holds every shipped script; the user data then carries
    only the loader (fetch-scripts.sh), the node's settings and units, and the group's own files.
    """

    bucket: str
    key: str
    sha256: str
    owner: str
    """The 12-digit account that must own the bucket (the fetch names it: --expected-bucket-owner)."""


@dataclass(frozen=True)
class NodeHealth:
    """A group's health-check settings as the node script reads them (plain values)."""

    interval_minutes: int
    launch_timeout_seconds: int
    xid_window_minutes: int
    ignored_xids: tuple[int, ...]
    fatal: tuple[str, ...]
    on_failure: str
    dcgm_diag: bool
    expected_gpus: tuple[tuple[str, int], ...]
    """Instance type -> GPUs the driver must see (the catalog's count)."""
    expected_efa: int
    """EFA devices the launch template gives each node (0: not checked)."""
    hook_command: str | None
    """Run before a running node is replaced: the pre-stop hook, else the spot interruption hook."""
    hook_timeout_seconds: int


def node_health(group: NodeGroupConfig, autostop: AutoStopConfig | None,
                spot: SpotConfig) -> NodeHealth | None:
    """The node side of `group.health_checks` (None when turned off)."""
    h = group.health_checks
    if not h.enabled:
        return None
    hook: str | None
    if autostop is not None and autostop.pre_stop_command:
        hook, timeout = autostop.pre_stop_command, autostop.pre_stop_timeout_seconds
    else:
        hook, timeout = spot.interruption_command, spot.interruption_timeout_seconds
    types = [t for name in group.instance_types if (t := catalog.get(name))]
    return NodeHealth(
        interval_minutes=h.interval_minutes, launch_timeout_seconds=group.launch_timeout_minutes * 60,
        xid_window_minutes=h.xid_window_minutes, ignored_xids=tuple(h.ignored_xids),
        # Not on MIG GPUs: how DCGM's diagnostic behaves there is unknown (ledger: dcgm-diag-mig).
        fatal=tuple(h.fatal), on_failure=h.on_failure, dcgm_diag=h.dcgm_diag and group.mig is None,
        expected_gpus=tuple((t.name, t.gpus) for t in types),
        # One EFA device per interface of the launch template (gpucluster.aws.nics), which every
        # type of an EFA group shares.
        expected_efa=types[0].efa_interface_count if group.efa_enabled and types else 0,
        hook_command=hook, hook_timeout_seconds=timeout)


@dataclass(frozen=True)
class NodeBootstrap:
    """Everything a node group's user data depends on (plain values only)."""

    stack: str
    cluster: str
    node_group: str
    region: str
    scratch_mount: str
    efa: bool
    gpudirect_rdma: bool
    watch_spot: bool
    """Run the IMDS watcher: the group can hold spot nodes and a hook is configured."""
    interruption_command: str | None
    interruption_timeout_seconds: int
    handle_rebalance: bool
    data_mounts: tuple[DataMount, ...] = field(default=())
    """Resolved: bucket and FSx names are strings here, never Outputs."""
    user_files: tuple[NodeFile, ...] = field(default=())
    """The group's `files`, their `source`s read."""
    user_setup: str | None = None
    """The script gpucluster-setup runs: the group's `setup` commands, or its `setup_script`."""
    container_image: str | None = None
    """Pulled by gpucluster-setup at boot."""
    health: NodeHealth | None = None
    """GPU health checks (None: off)."""
    notify_topic_arn: str = ""
    """Where health findings are published (resolved; empty: nowhere but the node's journal)."""
    mig_layouts: tuple[tuple[str, str], ...] = ()
    """(instance type, or "*" for all, "<profile>:<start>,..."): every GPU's MIG instances (empty: off)."""
    metrics: NodeMetrics | None = None
    """dcgm-exporter, node exporter and Prometheus remote-writing to AMP (None: off)."""
    baked: bool = False
    """Launched from a baked image: nothing installed or pulled at boot, only checked (launch_path)."""
    ready_gate: bool = False
    """gpucluster-ready completes the launch hook once data and image are ready (ready_gate_files)."""
    slurm: bool = False
    """A Slurm stack's group (AWS PCS launches it): the health check drains its Slurm node."""
    eks_cluster: str = ""
    """An EKS stack's group: the EKS cluster's name (the node's `aws eks get-token` for its kubelet's pod
    list: `gpucluster-report activity` counts it busy by what its GPU pods do); empty elsewhere."""
    gpu_busy_percent: float = 5
    """EKS: a GPU pod's node is busy only while its busiest GPU reaches this (autostop's threshold)."""


def node_bootstrap(spec: StackSpec, group: NodeGroupConfig, data_mounts: Sequence[DataMount] = (),
                   notify_topic_arn: str = "", eks_cluster: str = "") -> NodeBootstrap:
    """The bootstrap settings of `group` in `spec`, with already-resolved data mounts (`eks_cluster`:
    an EKS stack's cluster name)."""
    return group_bootstrap(group, stack=spec.identity, cluster=spec.cluster.name, region=spec.region,
                           spot=spec.spot, data_mounts=data_mounts, autostop=spec.autostop,
                           notify_topic_arn=notify_topic_arn,
                           # on EKS the cluster's charts collect (spec/observability.py)
                           metrics=None if spec.scheduler.eks else group_metrics(spec.observability,
                                                                                 spec.region),
                           baked=launches_baked(spec.images, group), slurm=spec.scheduler.slurm,
                           eks_cluster=eks_cluster if spec.scheduler.eks else "")


def group_bootstrap(group: NodeGroupConfig, *, stack: str, cluster: str, region: str, spot: SpotConfig,
                    data_mounts: Sequence[DataMount] = (), autostop: AutoStopConfig | None = None,
                    notify_topic_arn: str = "", metrics: NodeMetrics | None = None,
                    baked: bool = False, slurm: bool = False, eks_cluster: str = "") -> NodeBootstrap:
    """The bootstrap settings of one group outside any stack spec (a GpuNodeGroup's own args).

    `baked`: the group launches from its pinned baked image. The ready gate is on where the launch
    hook exists (health checks) and the group is baked or keeps a warm pool (a warming node must
    finish its installs before the hook lets it be stopped).
    """
    cap = group.capacity
    can_be_spot = cap.market == "mixed" and cap.spot_percent > 0
    return NodeBootstrap(
        stack=stack, cluster=cluster, node_group=group.name, region=region,
        scratch_mount=group.scratch_mount, efa=group.efa_enabled,
        gpudirect_rdma=group.efa_enabled and all(family_of(t) in RDMA_FAMILIES
                                                 for t in group.instance_types),
        watch_spot=can_be_spot and spot.interruption_command is not None,
        interruption_command=spot.interruption_command,
        interruption_timeout_seconds=spot.interruption_timeout_seconds,
        handle_rebalance=spot.handle_rebalance,
        data_mounts=tuple(data_mounts),
        user_files=tuple(NodeFile(f.path,
                                  read_project_file(f.source) if f.source is not None else f.content or "",
                                  f.mode, make_parent=True) for f in group.files),
        user_setup=user_setup_script(group),
        container_image=group.container_image,
        health=node_health(group, autostop, spot),
        notify_topic_arn=notify_topic_arn,
        mig_layouts=mig_plans(group),
        metrics=metrics,
        baked=baked,
        ready_gate=group.health_checks.enabled and (baked or group.warm_pool is not None),
        slurm=slurm,
        eks_cluster=eks_cluster,
        gpu_busy_percent=autostop.gpu_utilization_threshold_percent if autostop is not None else 5,
    )


def mig_plans(group: NodeGroupConfig) -> tuple[tuple[str, str], ...]:
    """Each instance type's MIG plan for `nvidia-smi mig -cgi`: `<profile>:<start>,...`, largest first.

    The starts are the catalog's placements (the same profile name can take another number of
    memory slices on another GPU, e.g. 1g.10gb on an A100 40GB or 80GB), so a node creates exactly
    the layout the spec validated. One entry "*" when every type's plan is the same.
    """
    layout = group.mig_layout
    if not layout:
        return ()
    plans: dict[str, str] = {}
    for name in group.instance_types:
        gpu = catalog.mig_gpu(name)
        placed = gpu.place(layout) if gpu else None
        if placed is None:
            raise ValueError(f"node group {group.name!r}: the MIG layout {', '.join(layout)} does not fit "
                             f"{name} (validate the spec first)")
        plans[name] = ",".join(f"{profile}:{start}" for profile, start in placed)
    if len(set(plans.values())) == 1:
        return (("*", next(iter(plans.values()))),)
    return tuple(plans.items())


def user_setup_script(group: NodeGroupConfig) -> str | None:
    """The script gpucluster-setup runs: `setup_script`'s text, or the `setup` commands in order.

    Commands run under `set -euo pipefail`: the first one that fails stops the setup
    (and fails the unit, so `systemctl status gpucluster-setup` shows it).
    """
    if group.setup_script:
        return read_project_file(group.setup_script)
    if not group.setup:
        return None
    return ("#!/bin/bash\n"
            f"# node group {group.name}: the stack file's setup commands, in order\n"
            "set -euo pipefail\n" + "".join(f"{command}\n" for command in group.setup))


# ------------------------------------------------------------------ rendered parts


def node_env(b: NodeBootstrap) -> str:
    """/etc/gpucluster/node.env: shell assignments every gpucluster-* script sources."""
    values = {
        "GPUCLUSTER_STACK": b.stack,
        "GPUCLUSTER_CLUSTER": b.cluster,
        # The one namespace the node role may publish into (noderole.gpu_metric_namespace).
        "GPUCLUSTER_METRIC_NAMESPACE": gpu_metric_namespace(b.cluster),
        "GPUCLUSTER_NODE_GROUP": b.node_group,
        "GPUCLUSTER_REGION": b.region,
        "GPUCLUSTER_SCRATCH_MOUNT": b.scratch_mount,
        "GPUCLUSTER_WATCH_SPOT": _bool(b.watch_spot),
        "GPUCLUSTER_HANDLE_REBALANCE": _bool(b.handle_rebalance),
        "GPUCLUSTER_INTERRUPTION_COMMAND": b.interruption_command or "",
        "GPUCLUSTER_INTERRUPTION_TIMEOUT_SECONDS": str(b.interruption_timeout_seconds),
        "GPUCLUSTER_CONTAINER_IMAGE": b.container_image or "",
        # gpucluster-install lustre-client: the keys AWS's Lustre apt repository may be signed by.
        "GPUCLUSTER_LUSTRE_KEY_FINGERPRINTS": " ".join(sorted({
            fpr for m in b.data_mounts for fpr in m.fsx_client_key_fingerprints})),
        "GPUCLUSTER_HEALTH_CHECKS": _bool(b.health is not None),
        "GPUCLUSTER_MIG_LAYOUTS": " ".join(f"{t}={plan}" for t, plan in b.mig_layouts),
    }
    if b.health is not None:
        h = b.health
        values |= {
            "GPUCLUSTER_NOTIFY_TOPIC_ARN": b.notify_topic_arn,
            "GPUCLUSTER_HEALTH_LAUNCH_HOOK": LAUNCH_HOOK_NAME,
            "GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS": str(h.launch_timeout_seconds),
            "GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES": str(h.xid_window_minutes),
            "GPUCLUSTER_HEALTH_IGNORED_XIDS": " ".join(str(x) for x in h.ignored_xids),
            "GPUCLUSTER_HEALTH_FATAL": " ".join(h.fatal),
            "GPUCLUSTER_HEALTH_ON_FAILURE": h.on_failure,
            "GPUCLUSTER_HEALTH_DCGM_DIAG": _bool(h.dcgm_diag),
            "GPUCLUSTER_HEALTH_EXPECTED_GPUS": " ".join(f"{t}={n}" for t, n in h.expected_gpus),
            "GPUCLUSTER_HEALTH_EXPECTED_EFA": str(h.expected_efa),
            "GPUCLUSTER_HEALTH_HOOK_COMMAND": h.hook_command or "",
            "GPUCLUSTER_HEALTH_HOOK_TIMEOUT_SECONDS": str(h.hook_timeout_seconds),
        }
    if b.slurm:
        values["GPUCLUSTER_SCHEDULER"] = "slurm"  # health-check.sh drains the node in Slurm
    if b.eks_cluster:  # gpucluster-report activity: idle by what the GPU pods do (report.sh)
        values |= {"GPUCLUSTER_SCHEDULER": "eks", "GPUCLUSTER_EKS_CLUSTER": b.eks_cluster,
                   "GPUCLUSTER_GPU_BUSY_PERCENT": f"{b.gpu_busy_percent:g}"}
    values |= launch_path_env(b)
    if any("\0" in value for value in values.values()):
        raise ValueError("node settings cannot hold NUL characters (bash variables cannot)")
    lines = ["# gpucluster node settings (rendered; sourced by the gpucluster-* scripts)"]
    # shlex.quote: one single-quoted word, newlines and all, exactly as given.
    lines += [f"{key}={shlex.quote(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------- the launch path of baked / ready-gated groups

READY_TOOL = "/usr/local/sbin/gpucluster-ready"
READY_MARGIN_SECONDS = 120
"""gpucluster-ready gives up this long before the hook's own timeout, so its ABANDON (with the
reason) lands before the hook's silent default ABANDON would."""


def launch_path_env(b: NodeBootstrap) -> dict[str, str]:
    """node.env keys of the baked launch path and the ready gate (none for other groups: their
    user data stays as it was).

    A baked node pulls nothing: GPUCLUSTER_CONTAINER_IMAGE is emptied (gpucluster-setup pulls only
    that) and the image is only checked, as GPUCLUSTER_READY_IMAGE.
    """
    values: dict[str, str] = {}
    if b.baked:
        values |= {"GPUCLUSTER_BAKED": "true", "GPUCLUSTER_CONTAINER_IMAGE": ""}
    if b.ready_gate and b.health is not None:
        values |= {
            "GPUCLUSTER_READY_GATE": "true",
            "GPUCLUSTER_READY_IMAGE": b.container_image or "",
            "GPUCLUSTER_READY_GATE_SECONDS": str(max(
                60, b.health.launch_timeout_seconds - READY_MARGIN_SECONDS)),
        }
    return values


def launch_path_files(b: NodeBootstrap, files: list[NodeFile]) -> list[NodeFile]:
    """`files` with a baked node's gpucluster-install swapped for one that refuses (nothing is
    installed on its launch path: a unit that asks for a package found the image lacking it, and
    fails loudly), plus gpucluster-ready when the ready gate is on."""
    if b.baked:
        files = [shipped(f.path, "baked-install.sh", f.mode)
                 if f.path == f"{_SBIN}/gpucluster-install" else f for f in files]
    if b.ready_gate and b.health is not None:
        files.append(shipped(READY_TOOL, "ready.sh"))
        # Pulled in by the launch health check's unit (Wants=), at every boot: a warm pool's node is
        # held again when it is started into service. It polls by itself: no After= on the steps.
        files.append(NodeFile(f"{_UNITS}/gpucluster-ready.service", _unit(
            "ready for work: completes the launch lifecycle hook (data, image, health)",
            f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=0\nExecStart={READY_TOOL}",
            after="network-online.target", extra="Wants=network-online.target\n")))
    return files


def efa_environment(b: NodeBootstrap) -> dict[str, str]:
    """Libfabric/NCCL settings for jobs on EFA nodes (empty for non-EFA groups).

    EC2 user guide, "Get started with EFA and NCCL for ML workloads"; the aws-ofi-nccl
    plugin on the Deep Learning AMI picks the EFA provider up from these.
    """
    if not b.efa:
        return {}
    env = {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",  # data loaders fork after libfabric registered memory
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",  # NCCL bootstrap over the ENA interface only
    }
    if b.gpudirect_rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def cloudwatch_agent_config(cluster: str, run_log_group: str | None = None) -> dict[str, object]:
    """CloudWatch agent config: GPU metrics per instance, aggregated per Auto Scaling group, and
    detached jobs' output files into the stack's run log group (`gpucluster logs --follow`).

    `append_dimensions` adds the group name from the instance's aws:autoscaling:groupName
    tag; `aggregation_dimensions` makes the one-dimension series auto-stop alarms on.
    """
    config = {
        "agent": {"metrics_collection_interval": GPU_METRIC_PERIOD_SECONDS, "run_as_user": "root"},
        "metrics": {
            "namespace": gpu_metric_namespace(cluster),
            "append_dimensions": {
                "AutoScalingGroupName": "${aws:AutoScalingGroupName}",
                "InstanceId": "${aws:InstanceId}",
                "InstanceType": "${aws:InstanceType}",
            },
            "aggregation_dimensions": [[GPU_METRIC_DIMENSION]],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": list(GPU_MEASUREMENTS),
                    "metrics_collection_interval": GPU_METRIC_PERIOD_SECONDS,
                },
            },
        },
    }
    if run_log_group:
        # One stream per job file, <instance id>_<path with '_' for '/'> (publish_multi_logs; see
        # gpucluster.ops.joblogs.job_log_stream), each read from its first line (from_beginning:
        # the agent's default; a file created after the agent started is otherwise read from its end).
        config["logs"] = {"force_flush_interval": 5, "logs_collected": {"files": {"collect_list": [{
            "file_path": f"{JOB_LOG_DIR}/*.log", "log_group_name": run_log_group,
            "log_stream_name": "{instance_id}", "publish_multi_logs": True, "from_beginning": True}]}}}
    return config


def data_mounts_table(b: NodeBootstrap) -> str:
    """/etc/gpucluster/data-mounts.tsv, one dataset a line, as gpucluster-data reads it."""
    rows = []
    for m in b.data_mounts:
        fields = [m.access, m.name, m.bucket_name, m.prefix, m.path, m.fsx_dns_name, m.fsx_mount_name,
                  m.expected_bucket_owner]
        for value in fields:
            if value is not None and not isinstance(value, str):
                raise TypeError(f"data mount {m.name!r}: resolve Outputs before rendering, got "
                                f"{type(value).__name__}")
            if value and any(c in value for c in "\t\n"):
                raise ValueError(f"data mount {m.name!r}: tabs or newlines in {value!r}")
        if m.access == "fsx" and not (m.fsx_dns_name and m.fsx_mount_name):
            raise ValueError(f"data mount {m.name!r}: fsx needs the DNS and mount name")
        rows.append("\t".join(value or "-" for value in fields))
    return "".join(row + "\n" for row in rows)


def _unit(description: str, body: str, after: str = "local-fs.target", extra: str = "") -> str:
    return (f"[Unit]\nDescription=gpucluster: {description}\nAfter={after}\n{extra}"
            f"\n[Service]\n{body}\n\n[Install]\nWantedBy=multi-user.target\n")


# A node step that fails is run again by systemd, a bounded number of times, and reported after
# every run (gpucluster-report: the NodeStepFailed metric and the journal), never silently skipped.
# Restart=on-failure is the one Restart= a Type=oneshot unit takes (systemd.service(5); systemd >= 244,
# the Deep Learning AMI's Ubuntu 22.04 has 249). After STEP_BURST starts within STEP_INTERVAL the
# unit stays failed (its last report says so) until the next boot.
STEP_RESTART_SECONDS = 30
STEP_BURST = 5
STEP_INTERVAL = "2h"
NODE_STEP_METRIC = "NodeStepFailed"
"""1 after a failed run of a node step, 0 after a good one; by Stack, NodeGroup and Step, in the
cluster's own namespace (GPUCLUSTER_METRIC_NAMESPACE: the only one the node role may publish into)."""


def _step_unit(step: str, description: str, *, after: str, extra: str = "",
               timeout: str = "infinity") -> str:
    """A oneshot node step (gpucluster-<step>) that is retried on failure and reports every run."""
    report = f"{_SBIN}/gpucluster-report {step}"
    return _unit(description, (
        f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec={timeout}\n"
        f"ExecStart={_SBIN}/gpucluster-{step}\nExecStartPost={report}\nExecStopPost={report}\n"
        f"Restart=on-failure\nRestartSec={STEP_RESTART_SECONDS}"),
        after=after, extra=f"StartLimitIntervalSec={STEP_INTERVAL}\nStartLimitBurst={STEP_BURST}\n{extra}")


def node_files(b: NodeBootstrap) -> list[NodeFile]:
    """Every file the bootstrap writes, in the order it writes them."""
    files = [
        NodeFile(NODE_ENV, node_env(b)),
        NodeFile("/etc/gpucluster/data-mounts.tsv", data_mounts_table(b)),
        shipped(f"{_SBIN}/gpucluster-scratch", "scratch.sh"),
        shipped(f"{_SBIN}/gpucluster-data", "data.sh"),
        shipped(OS_TOOL, "os.sh"),
        shipped(f"{_SBIN}/gpucluster-install", "install.sh"),
        shipped(f"{_SBIN}/gpucluster-agent", "agent.sh"),
        shipped(f"{_SBIN}/gpucluster-report", "report.sh"),
        *([shipped(f"{_SBIN}/gpucluster-eks-activity", "eks-activity.sh")] if b.eks_cluster else []),
        shipped(INTERRUPTION_HOOK, "interruption-hook.sh"),
        NodeFile(f"{_UNITS}/gpucluster-scratch.service", _unit(
            "NVMe instance-store scratch (RAID0)",
            f"Type=oneshot\nRemainAfterExit=yes\nExecStart={_SBIN}/gpucluster-scratch\n"
            f"ExecStartPost={_SBIN}/gpucluster-report scratch\n"
            f"ExecStopPost={_SBIN}/gpucluster-report scratch",
            extra="Before=gpucluster-data.service\n")),
        # Installs wait for the dpkg lock (up to 10 min, 3 attempts): room for all of it.
        NodeFile(f"{_UNITS}/gpucluster-agent.service", _step_unit(
            "agent", "CloudWatch agent (GPU utilisation for the idle stop)",
            after="network-online.target", extra="Wants=network-online.target\n", timeout="40min")),
        NodeFile(f"{_UNITS}/gpucluster-data.service", _step_unit(
            "data", "datasets (copy to scratch, Mountpoint for S3, FSx for Lustre)",
            after="gpucluster-scratch.service network-online.target",
            extra="Wants=network-online.target\nRequires=gpucluster-scratch.service\n")),
        NodeFile("/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json",
                 # no indentation: user data is 16 KiB gzipped
                 json.dumps(cloudwatch_agent_config(b.cluster, run_log_group_name(b.stack)),
                            separators=(",", ":"))
                 + "\n"),
        # Minimal units (user data is 16 KiB gzipped): a service runs to its end whatever its Type;
        # a datapoint a minute: systemd fires it at the same offset into every minute (AccuracySec's
        # default window, a per-host fixed offset: systemd.timer(5)).
        NodeFile(f"{_UNITS}/gpucluster-activity.service",
                 f"[Service]\nExecStart={_SBIN}/gpucluster-report activity\n"),
        NodeFile(f"{_UNITS}/gpucluster-activity.timer",
                 "[Timer]\nOnCalendar=minutely\n[Install]\nWantedBy=timers.target\n"),
        shipped(CHECKPOINT_HOOK, "checkpoint.sh"),
        shipped(JOB_TOOL, "job.sh"),
        shipped(f"{_SBIN}/gpucluster-setup", "setup.sh"),
        NodeFile(f"{_UNITS}/gpucluster-setup.service", _unit(
            "node group setup (container image, the group's setup commands)",
            f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=0\nExecStart={_SBIN}/gpucluster-setup",
            after="gpucluster-scratch.service network-online.target docker.service"
                  + (" gpucluster-mig.service" if b.mig_layouts else ""),
            # Never on GPUs whose MIG layout is not in place: the group's servers would take whole GPUs.
            extra="Wants=network-online.target\n"
                  + ("Requires=gpucluster-mig.service\n" if b.mig_layouts else ""))),
    ]
    if b.watch_spot:  # only groups that can hold spot nodes and have a hook (user data is 16 KiB)
        files += [
            shipped(f"{_SBIN}/gpucluster-spot-watcher", "spot-watcher.sh"),
            NodeFile(f"{_UNITS}/gpucluster-spot-watcher.service", _unit(
                "spot interruption watcher (IMDSv2)",
                f"Type=simple\nRestart=on-failure\nRestartSec=5\nExecStart={_SBIN}/gpucluster-spot-watcher",
                after="network-online.target", extra="Wants=network-online.target\n"))]
    if b.mig_layouts:
        files += mig_files()
    if b.user_setup is not None:
        files.append(NodeFile(USER_SETUP, b.user_setup, "0700"))
    files += b.user_files
    if b.health is not None:
        files += health_files(b.health, mig=bool(b.mig_layouts), ready=b.ready_gate, slurm=b.slurm)
    if b.metrics is not None:
        files += metrics_files(b.metrics)
    files = launch_path_files(b, files)
    env = efa_environment(b)
    if env:
        files.append(NodeFile("/etc/profile.d/gpucluster-efa.sh",
                              "# EFA/NCCL settings for jobs (gpucluster)\n"
                              + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())))
        files.append(NodeFile("/etc/gpucluster/efa.env",  # for `docker run --env-file`, systemd
                              "".join(f"{k}={v}\n" for k, v in env.items())))
    return files


READY_GATE_BLOCK = re.compile(r"^[ \t]*# >>> ready gate.*?^[ \t]*# <<< ready gate[^\n]*\n", re.M | re.S)


@cache
def without_ready_gate(name: str) -> str:
    """A shipped script less its `# >>> ready gate` ... `# <<< ready gate` blocks, as groups without
    the gate get it: user data is 16 KiB gzipped, and those lines would never run there."""
    raw = resources.files(__package__).joinpath(name).read_text()
    return compact_shell(READY_GATE_BLOCK.sub("", raw))


def health_files(h: NodeHealth, mig: bool = False, ready: bool = False,
                 slurm: bool = False) -> list[NodeFile]:
    """The health-check script, its launch unit (every boot, pulling in gpucluster-ready when
    `ready`) and its timer."""
    # After the driver's own services, so the GPUs and NVSwitches are up when counted, and in a MIG
    # group after the layout is applied (its `mig` finding checks it; Wants: not Requires, so a
    # failed apply is still checked, and the node abandoned with the finding, not left to time out).
    after = "network-online.target nvidia-persistenced.service nvidia-fabricmanager.service"
    wants = "network-online.target"
    if mig:
        after, wants = f"{after} gpucluster-mig.service", f"{wants} gpucluster-mig.service"
    if ready:
        wants = f"{wants} gpucluster-ready.service"
    return [
        shipped(HEALTH_CHECK, "health-check.sh") if ready else shipped(HEALTH_CHECK, UNGATED_HEALTH_CHECK),
        NodeFile(f"{_UNITS}/gpucluster-health-launch.service", _unit(
            "GPU health check at boot (completes the launch lifecycle hook)",
            # No start timeout: the script bounds its own retries by the hook's timeout.
            f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=0\nExecStart={HEALTH_CHECK} launch",
            after=after, extra=f"Wants={wants}\n")),
        NodeFile(f"{_UNITS}/gpucluster-health-check.service", _unit(
            "periodic GPU health check",
            f"Type=oneshot\nExecStart={HEALTH_CHECK} periodic",
            after="gpucluster-health-launch.service")),
        NodeFile(f"{_UNITS}/gpucluster-health-check.timer",
                 f"[Unit]\nDescription=gpucluster: GPU health check every {h.interval_minutes} min\n"
                 f"\n[Timer]\nOnBootSec={h.interval_minutes}min\nOnUnitActiveSec={h.interval_minutes}min\n"
                 "AccuracySec=30s\n\n[Install]\nWantedBy=timers.target\n"),
    ]


def metrics_files(m: NodeMetrics) -> list[NodeFile]:
    """The Prometheus path (observability.prometheus): settings, counters, script and two units.

    gpucluster-metrics renders the collector's config and starts the exporters, then checks that
    samples are written; it is ordered after the MIG layout (dcgm-exporter lists MIG instances when
    it starts) and nothing waits for it: metrics never hold up a job, the health check or the hook.
    """
    report = f"{_SBIN}/gpucluster-report metrics"
    env = {"GPUCLUSTER_REMOTE_WRITE_URL": m.remote_write_url, "GPUCLUSTER_REMOTE_WRITE_REGION": m.region,
           "GPUCLUSTER_DCGM_EXPORTER_IMAGE": m.dcgm_exporter_image,
           "GPUCLUSTER_METRICS_SCRAPE_SECONDS": str(m.scrape_interval_seconds),
           "GPUCLUSTER_DCGM_FIELDS": dcgm_fields()}
    if m.containers:  # only then: a stack without them keeps its user data byte for byte
        env |= {"GPUCLUSTER_PROMETHEUS_IMAGE": m.prometheus_image or "",
                "GPUCLUSTER_NODE_EXPORTER_IMAGE": m.node_exporter_image or ""}
    return [
        NodeFile("/etc/gpucluster/metrics.env", "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())),
        shipped(f"{_SBIN}/gpucluster-metrics", "metrics.sh"),
        NodeFile(f"{_UNITS}/{METRICS_UNIT}", _unit(
            "GPU metrics to Prometheus",
            f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=20min\n"
            f"ExecStart={_SBIN}/gpucluster-metrics start\nExecStart={_SBIN}/gpucluster-metrics check\n"
            f"ExecStartPost={report}\nExecStopPost={report}\nRestart=on-failure\n"
            f"RestartSec={STEP_RESTART_SECONDS}",
            after="network-online.target docker.service gpucluster-mig.service",
            extra=f"Wants=network-online.target\nStartLimitIntervalSec={STEP_INTERVAL}\n"
                  f"StartLimitBurst={STEP_BURST}\n")),
        # Started with the CloudWatch agent's unit, which every node starts at every boot (bootstrap.sh):
        # a drop-in's Wants= pulls this one in without a line of its own in the bootstrap.
        NodeFile(f"{_UNITS}/gpucluster-agent.service.d/metrics.conf",
                 f"[Unit]\nWants={METRICS_UNIT}\n", make_parent=True),
        NodeFile(f"{_UNITS}/{PROMETHEUS_UNIT}", prometheus_unit(m.containers)),
    ]


def prometheus_unit(containers: bool) -> str:
    """gpucluster-prometheus: the OS package's binary, or (prometheus_image) `gpucluster-metrics serve`,
    which runs the pinned image in the foreground (docker run, host network: the unit's own process,
    so systemd restarts and stops it the same way)."""
    if containers:
        return _unit("Prometheus remote-writing GPU metrics (container)",
                     "Type=simple\nRestart=always\nRestartSec=10\n"
                     f"ExecStart={_SBIN}/gpucluster-metrics serve {PROMETHEUS_DATA} {PROMETHEUS_RETENTION}",
                     after="network-online.target docker.service", extra="Requires=docker.service\n")
    return _unit(
        "Prometheus remote-writing GPU metrics",
        f"Type=simple\nRestart=always\nRestartSec=10\n"
        f"ExecStart=/usr/bin/prometheus --config.file=/etc/gpucluster/prometheus.yml "
        f"--storage.tsdb.path={PROMETHEUS_DATA} --storage.tsdb.retention.time={PROMETHEUS_RETENTION} "
        "--web.listen-address=127.0.0.1:9090",
        after="network-online.target")


def mig_files() -> list[NodeFile]:
    """gpucluster-mig and its unit: the layout at every boot, before setup (MIG groups only)."""
    report = f"{_SBIN}/gpucluster-report mig"
    return [
        shipped(MIG_TOOL, "mig.sh"),
        # Turning MIG mode on resets each GPU (a minute or so); no retries: apply is all or nothing.
        NodeFile(f"{_UNITS}/gpucluster-mig.service", _unit(
            "MIG partitions of the GPUs (before setup and jobs)",
            f"Type=oneshot\nRemainAfterExit=yes\nTimeoutStartSec=20min\nExecStart={MIG_TOOL} apply\n"
            f"ExecStartPost={report}\nExecStopPost={report}",
            after="nvidia-persistenced.service nvidia-fabricmanager.service",
            extra="Before=gpucluster-setup.service\n")),
    ]


def bundle_member(name: str) -> str:
    """One member of the node scripts bundle, as the node runs it (compacted; the ungated health check)."""
    if name == UNGATED_HEALTH_CHECK:
        return without_ready_gate("health-check.sh")
    if name not in BUNDLE_SCRIPTS:
        raise ValueError(f"{name!r} is not a shipped node script (BUNDLE_SCRIPTS)")
    return script(name)


def bundle_members() -> dict[str, str]:
    """Every member of the node scripts bundle by name: whatever `node_files` may install from it."""
    return {name: bundle_member(name) for name in sorted((*BUNDLE_SCRIPTS, UNGATED_HEALTH_CHECK))}


def shipped(path: str, name: str, mode: str = "0755") -> NodeFile:
    """A shipped script at `path`: in the user data itself, or installed from the verified bundle."""
    return NodeFile(path, bundle_member(name), mode, member=name)


@cache
def script(name: str) -> str:
    """One shell file shipped next to this module, as nodes get it: without its comments.

    EC2 user data is 16 KiB gzipped (EC2 user guide, "Run commands when you launch an EC2
    instance with user data"): the files keep their comments in the repository, the nodes (and
    the behaviour tests, which run this same text) get `compact_shell` of them. Read and
    compacted once per process: a plan renders each group's user data four times (the spec's
    size check in the CLI, the program and the component, then the launch template).
    """
    return compact_shell(resources.files(__package__).joinpath(name).read_text())


_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def compact_shell(text: str) -> str:
    """`text` less its blank and comment-only lines, heredoc bodies untouched.

    Kept: the shebang, `# shellcheck` directives and lines with a `@@NAME@@` placeholder.
    A line whose first non-blank character is `#` is a comment to bash outside a heredoc
    (bash manual, "Comments"); inside one it is data, so the body of every `<<WORD` /
    `<<-WORD` (quoted or not) is copied as is.
    """
    out: list[str] = []
    end: str | None = None
    dash = False
    for i, line in enumerate(text.splitlines()):
        if end is not None:
            out.append(line)
            if (line.lstrip("\t") if dash else line) == end:
                end = None
            continue
        stripped = line.strip()
        kept = stripped.startswith(("#!", "# shellcheck")) or "@@" in stripped  # directives, placeholders
        if i > 0 and (not stripped or (stripped.startswith("#") and not kept)):
            continue
        out.append(line)
        if "<<<" not in line and (heredoc := _HEREDOC.search(line)):
            end, dash = heredoc.group(3), bool(heredoc.group(1))
    return "\n".join(out) + "\n"


def heredoc_delimiter(content: str) -> str:
    """GPUCLUSTER_FILE_EOF, or the first GPUCLUSTER_FILE_EOF_<n> that is no line of `content`.

    Every file is written through a quoted heredoc (no expansion); only a line equal to
    its delimiter could end it early, so a content's own lines never become the delimiter.
    """
    lines = set(content.splitlines())
    delimiter, n = _EOF, 0
    while delimiter in lines:
        n += 1
        delimiter = f"{_EOF}_{n}"
    return delimiter


def _write(f: NodeFile, bundled: bool = False) -> str:
    if bundled and f.member is not None:  # unpacked and verified by the loader, before any file
        return f"install -m {f.mode} {SCRIPTS_DIR}/{f.member} {f.path}\n"
    end = heredoc_delimiter(f.content)
    body = f.content if f.content.endswith("\n") or not f.content else f.content + "\n"
    parent = f"install -d -m 0755 {f.path.rsplit('/', 1)[0] or '/'}\n" if f.make_parent else ""
    return (f"{parent}cat > {f.path} <<'{end}'\n{body}{end}\n"
            f"chmod {f.mode} {f.path}\n")


def scripts_loader(b: NodeBootstrap, source: ScriptsSource) -> str:
    """The user data's first step with a `source`: write the loader, fetch the bundle, verify its
    sha256 against the one rendered here, unpack it into SCRIPTS_DIR (fetch-scripts.sh); `set -e`
    ends the boot when it fails."""
    loader = NodeFile(FETCH_TOOL, script("fetch-scripts.sh"), "0755")
    args = " ".join(shlex.quote(v) for v in (b.region, source.bucket, source.key, source.owner,
                                             source.sha256, SCRIPTS_DIR))
    return f"{_write(loader)}{FETCH_TOOL} {args}\n"


def render_user_data(b: NodeBootstrap, source: ScriptsSource | None = None) -> str:
    """The node's user data: one bash script that writes every file and starts the units.

    With a `source`, the shipped scripts are not in it: the loader fetches and verifies the bundle
    first, and each script is installed from it; without, every file is written from the user data
    itself (GpuNodeGroup given no node_scripts). The placeholders of bootstrap.sh are filled in one
    pass, so text inside the values (a hook command holding `@@FILES@@`) is never read as a placeholder.
    """
    template = script("bootstrap.sh")
    label = re.sub(r"[^\w./() -]", "?", f"{b.cluster}/{b.node_group} (stack {b.stack})")  # a comment
    bundled = source is not None
    values = {"@@LABEL@@": label,
              "@@SCRIPTS@@\n": scripts_loader(b, source) if source is not None else "",
              "@@FILES@@\n": "".join(_write(f, bundled) for f in node_files(b))}
    found = re.findall(r"@@\w+@@\n?", template)
    if sorted(found) != sorted(values):
        raise ValueError(f"bootstrap.sh has placeholders {found}, the renderer fills {list(values)}")
    return re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], template)


@lru_cache(maxsize=256)
def gzipped_size(b: NodeBootstrap, source: ScriptsSource | None = None) -> int:
    """Bytes of `b`'s user data gzipped, as EC2 counts them against its 16 KiB.

    Memoised (a NodeBootstrap is frozen, plain values): the spec's size check runs on every
    parse of a stack, and one `plan` parses it in the CLI and in the program, then checks it for
    warnings and as the component's args: four renders and gzips of each group's user data,
    now one (a sixth of a 20-group plan's own time).
    """
    return len(gzip.compress(render_user_data(b, source).encode(), mtime=0))


def encode_user_data(text: str) -> str:
    """Gzip (mtime 0, so the same script always gives the same bytes), then base64.

    Raises ValueError past EC2's 16 KiB user-data limit.
    """
    packed = gzip.compress(text.encode(), mtime=0)
    if len(packed) > MAX_USER_DATA_BYTES:
        raise ValueError(f"user data is {len(packed)} bytes gzipped; EC2 allows {MAX_USER_DATA_BYTES}")
    return base64.b64encode(packed).decode()


def _bool(value: bool) -> str:
    return "true" if value else "false"
