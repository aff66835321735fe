"""Benchmark the boot budget: from EC2 `running` (billing starts) to "ready for a job", modelled.

For every node group of the shipped stacks, and of a baked variant of prod (`images.bake: true`, each
group pinned to its image), it prints the steps a node takes, which of them are on the critical path
to ready, what each downloads, and a modelled time per step. The steps come from what the group's
rendered bootstrap does (`gpucluster.node.userdata.node_bootstrap`: baked or not, its container
image, its datasets' access, its health checks and MIG layout), so a change that adds boot work to a
group shows up here; the times come from the FIGURES table below, each with where it comes from.
The node measures the same steps for real (gpucluster-ready publishes when each milestone was reached,
BootStepAtSeconds, and TimeToReadySeconds; gpucluster-report its first job's start,
TimeToFirstJobSeconds; `gpucluster nodes --json` reads them back per group as `boot_times`). When a
published table of those measurements exists (MEASUREMENTS, or --measurements PATH: the medians of
`nodes --json` per stack and group, with where and when they were measured), each milestone is printed
measured beside modelled; without one every figure printed is modelled, and the script says so.

Ready means what the launch hook waits for on a gated group: the health check passed, the mounted
datasets are there, the container image is present, the CloudWatch agent runs. Copies to scratch
continue in the background (a job waits for them, not `ready`). Unbaked groups without a warm pool
are still counted InService when the health check answers: `InService at` shows how much earlier
than ready that is (the gap `run` could hit before this issue).

    .venv/bin/python benchmarks/boot_time.py [--json] [--measurements PATH]

Target (issue 26): baked prod's h100-train ready in under 4 minutes (exit 1 if the model says not).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from gpucluster.node.bundle import bundle_bytes
from gpucluster.node.userdata import NodeBootstrap, node_bootstrap
from gpucluster.parts import DataMount
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec, baked_image, dataset_path

REPO = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 240
# The published table of measured boots (absent today: no node of a baked group has reported yet).
MEASUREMENTS = REPO / "benchmarks" / "boot_measurements.yaml"
# The milestones a node publishes (gpucluster.ops.boottimes.STEPS), in boot order.
MILESTONES = ("userdata", "bundle", "nvidia", "health", "mounts", "image", "ready")

# (seconds or size, source). "assumed" marks a figure no AWS or NVIDIA page states: the node's own
# BootStepSeconds are the measurement to replace it with.
FIGURES: dict[str, tuple[float, str]] = {
    "os_boot_s": (135, "modelled: EC2 running to cloud-init running the user data on a p5 from a fresh "
                       "AMI, 90-180 s (issue 38's estimate: 2 TiB of memory, 32 network interfaces, 8 "
                       "GPUs, the DLAMI's cloud-init modules, and a root volume whose blocks are fetched "
                       "from S3 on first read, EBS user guide 'Initialize Amazon EBS volumes'); the "
                       "midpoint. The node measures it: BootStepAtSeconds, Step=userdata"),
    "lazy_read_mb_per_s": (33, "modelled: reading blocks of a volume restored from a snapshot that are not "
                               "yet initialized, ~10 GB of image layers in 1-10 minutes (issue 38's "
                               "estimate; EBS user guide, 'Initialize Amazon EBS volumes': such reads "
                               "see higher latency); about 5 minutes"),
    "container_start_s": (10, "assumed: `docker run` of an image whose layers are read, to the job's "
                              "process (the node measures it: TimeToFirstJobSeconds)"),
    "nvidia_ready_s": (30, "assumed: nvidia-persistenced and, on NVSwitch systems (p4d, p5), "
                           "nvidia-fabricmanager up before the health check may count GPUs"),
    "checks_s": (5, "health-check.sh: nvidia-smi queries, the kernel log, fi_info"),
    "dcgm_r1_s": (45, "DCGM user guide, 'Diagnostics': run level 1 is the quick (seconds to about a "
                      "minute) deployment check"),
    "mig_apply_s": (90, "assumed: MIG mode on resets each GPU (nvidia-smi -mig 1), then the layout"),
    "dpkg_lock_before_s": (450, "issue 26: first-boot package updates hold the dpkg lock, '15-20 "
                                "minutes' to ready instead of 7-10; the midpoint of that difference"),
    "cwa_mb": (110, "assumed: amazon-cloudwatch-agent.deb and its signature from the regional bucket"),
    "cwa_install_s": (15, "assumed: gpg verify + dpkg -i of the agent"),
    "agent_start_s": (5, "assumed: amazon-cloudwatch-agent-ctl fetch-config and status"),
    "apt_update_s": (40, "assumed: apt-get update of the AMI's sources plus the FSx Lustre repository"),
    "lustre_install_s": (25, "assumed: lustre-client-modules-$(uname -r) download and dkms-free install "
                             "(the FSx for Lustre user guide's prebuilt kernel packages)"),
    "lustre_mb": (15, "assumed: lustre-client-modules and lustre-client-utils .debs"),
    "mountpoint_mb": (12, "assumed: the mount-s3 .deb and its signature"),
    "mountpoint_install_s": (8, "assumed: gpg verify + apt-get install of the .deb"),
    "mount_s": (5, "assumed: mount -t lustre / mount-s3 once the client is installed"),
    "s3_mb_per_s": (100, "assumed: a single-stream HTTPS download from the region's S3 endpoint"),
    "pull_mb_per_s": (35, "issue 26: about 10 GB of nvcr.io/nvidia/pytorch:24.12-py3 through the NAT "
                          "gateway in 4-6 minutes (~35 MB/s with layer decompression)"),
    # The node scripts bundle (gpucluster.node.bundle): one GetObject of ~80 KB (its size is measured
    # below, at the S3 rate above) and the sha256 check; what dominates is the AWS CLI's own start
    # and the request's round trip.
    "cli_request_s": (1.5, "assumed: AWS CLI v2 start-up plus one S3 GetObject round trip from the VPC's "
                           "gateway endpoint (no published figure; the boot log's 'node scripts ... "
                           "verified' line, next to 'bootstrap: start', measures it)"),
    "hook_s": (5, "assumed: CompleteLifecycleAction to InService (EC2 Auto Scaling user guide, "
                  "'Amazon EC2 Auto Scaling lifecycle hooks')"),
}
# Compressed sizes of the container images the shipped stacks name (MB).
IMAGE_MB: dict[str, tuple[float, str]] = {
    "nvcr.io/nvidia/pytorch:24.12-py3": (10_000, "issue 26: 'about 10 GB'"),
}
UNKNOWN_IMAGE_MB = (5_000, "assumed for an image not in IMAGE_MB")


def figure(name: str) -> float:
    return FIGURES[name][0]


@dataclass(frozen=True)
class Step:
    name: str
    branch: str
    """Steps of a branch run one after another; branches run side by side after the user data."""
    seconds: float
    downloads: str
    source: str


@dataclass(frozen=True)
class Boot:
    stack: str
    group: str
    baked: bool
    steps: tuple[Step, ...]

    def branch_seconds(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for s in self.steps:
            if s.branch != "start":
                total[s.branch] = total.get(s.branch, 0.0) + s.seconds
        return total

    @property
    def start_seconds(self) -> float:
        return sum(s.seconds for s in self.steps if s.branch == "start")

    @property
    def critical_branch(self) -> str:
        branches = self.branch_seconds()
        return max(branches, key=branches.__getitem__)

    @property
    def ready_seconds(self) -> float:
        return self.start_seconds + max(self.branch_seconds().values()) + figure("hook_s")

    @property
    def first_job_seconds(self) -> float:
        """Ready, then the first container started (its layers read on a baked node)."""
        return self.ready_seconds + figure("container_start_s")

    def milestones(self) -> dict[str, float]:
        """When each milestone the node publishes is reached in this model (seconds after `running`)."""
        start = figure("os_boot_s")
        at = {"userdata": start}
        bundle = next((s for s in self.steps if s.name.startswith("fetch + verify")), None)
        at["bundle"] = start + (bundle.seconds if bundle else 0)
        head = self.start_seconds
        nvidia = next((s for s in self.steps if s.name == "NVIDIA driver services"), None)
        if nvidia:
            at["nvidia"] = head + nvidia.seconds
        branches = self.branch_seconds()
        if "health" in branches:
            at["health"] = head + branches["health"]
        if "data" in branches:
            at["mounts"] = head + branches["data"]
        if "image" in branches:
            at["image"] = head + branches["image"]
        at["ready"] = self.ready_seconds
        return at

    @property
    def in_service_seconds(self) -> float:
        """When Auto Scaling counts it InService: at ready on gated (baked, warm pool) groups, else
        when the health check answers."""
        return self.ready_seconds if self.gated else (self.start_seconds + self.branch_seconds()["health"]
                                                      + figure("hook_s"))

    gated: bool = False


def layer_read_rate(volume_mibps: float) -> tuple[float, str]:
    """MB/s at which a baked node reads its image's layers, and the figure's basis: the provisioned
    volume initialization rate when the launch template sets one, else lazy loading from S3."""
    if volume_mibps:
        return volume_mibps * 1.048576, (f"modelled: the launch template's volume initialization rate, "
                                         f"{volume_mibps:g} MiB/s (botocore ec2 model, "
                                         "VolumeInitializationRate)")
    return figure("lazy_read_mb_per_s"), "lazy_read_mb_per_s"


def boot_steps(stack: str, b: NodeBootstrap, *, unattended_stopped: bool = True,
               volume_mibps: float = 0) -> Boot:
    """What a node of this bootstrap does from `running` to ready, and for how long (modelled).

    `volume_mibps`: the root volume's provisioned initialization rate (a baked group's launch
    template; 0: lazily loaded), at which a baked node's ready gate reads the image's layers."""
    kb = len(bundle_bytes()) / 1000
    steps = [Step("OS boot, cloud-init", "start", figure("os_boot_s"), "-", "os_boot_s"),
             # every node, baked or not: the shipped scripts are not in the user data (nor the image)
             Step("fetch + verify the node scripts bundle", "start",
                  figure("cli_request_s") + kb / 1000 / figure("s3_mb_per_s"), f"{kb:.0f} KB",
                  "cli_request_s, s3_mb_per_s"),
             Step("user data writes files, daemon-reload", "start", 2, "-", "assumed: 2 s")]
    health = [Step("NVIDIA driver services", "health", figure("nvidia_ready_s"), "-",
                   "nvidia_ready_s")]
    if b.mig_layouts:
        health.append(Step("MIG layout", "health", figure("mig_apply_s"), "-", "mig_apply_s"))
    if b.health is not None:
        health.append(Step("health checks", "health", figure("checks_s"), "-", "checks_s"))
        if b.health.dcgm_diag:
            health.append(Step("dcgmi diag -r 1", "health", figure("dcgm_r1_s"), "-", "dcgm_r1_s"))
    steps += health
    lock = 0.0 if b.baked or unattended_stopped else figure("dpkg_lock_before_s")
    if lock:
        steps.append(Step("wait for the dpkg lock", "agent", lock, "-", "dpkg_lock_before_s"))
    if not b.baked:
        mb = figure("cwa_mb")
        steps += [Step("download CloudWatch agent", "agent", mb / figure("s3_mb_per_s"), f"{mb:g} MB",
                       "cwa_mb"),
                  Step("install CloudWatch agent", "agent", figure("cwa_install_s"), "-",
                       "cwa_install_s")]
    steps.append(Step("start CloudWatch agent", "agent", figure("agent_start_s"), "-",
                      "agent_start_s"))
    kinds = {m.access for m in b.data_mounts}
    if "fsx" in kinds:
        if not b.baked:
            steps += [Step("apt-get update (Lustre repository)", "data", figure("apt_update_s"),
                           "package lists", "apt_update_s"),
                      Step("install the Lustre client", "data", figure("lustre_install_s"),
                           f"{figure('lustre_mb'):g} MB", "lustre_install_s")]
        steps.append(Step("mount FSx for Lustre", "data", figure("mount_s"), "-", "mount_s"))
    if "mount" in kinds:
        if not b.baked:
            mb = figure("mountpoint_mb")
            steps.append(Step("download + install Mountpoint for S3", "data",
                              mb / figure("s3_mb_per_s") + figure("mountpoint_install_s"), f"{mb:g} MB",
                              "mountpoint_install_s"))
        steps.append(Step("mount-s3", "data", figure("mount_s"), "-", "mount_s"))
    image = b.container_image
    if image:
        mb, source = IMAGE_MB.get(image, UNKNOWN_IMAGE_MB)
        if b.baked:
            steps.append(Step(f"check {image} is present", "image", 1, "-", "docker image inspect"))
            rate, basis = layer_read_rate(volume_mibps)
            steps.append(Step("read its layers (docker save > /dev/null)", "image", mb / rate, "-",
                              f"{basis}; size: {source}"))
        else:
            steps.append(Step(f"docker pull {image}", "image", mb / figure("pull_mb_per_s"), f"{mb:g} MB",
                              f"pull_mb_per_s; size: {source}"))
    return Boot(stack, b.node_group, b.baked, tuple(steps), gated=b.ready_gate)


def stack_config(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / f"stacks/Pulumi.{name}.yaml").read_text())["config"]


def mounts(spec: StackSpec) -> list[DataMount]:
    """The stack's datasets as nodes mount them (names made up: only the access kinds matter here)."""
    return [DataMount(name=d.name, access=d.access, bucket_name="bucket", prefix=d.prefix,
                      path=dataset_path(spec, d), fsx_dns_name="fs.example" if d.access == "fsx" else None,
                      fsx_mount_name="m" if d.access == "fsx" else None) for d in spec.datasets]


def baked_prod_config() -> dict[str, Any]:
    config = copy.deepcopy(stack_config("prod"))
    config["gpucluster:images"] = {"bake": True, "groups": {
        g["name"]: {"ami_id": "ami-0123456789abcdef0"} for g in config["gpucluster:node_groups"]}}
    return config


def boots() -> list[Boot]:
    cases = [(name, stack_config(name)) for name in ("dev", "staging", "prod")]
    cases.append(("prod (baked)", baked_prod_config()))
    found = []
    for label, config in cases:
        spec = parse_stack_config(config, stack=label.split()[0])
        for group in spec.node_groups:
            image = baked_image(spec.images, group)
            rate = image.volume_initialization_mibps if image is not None and image.ami_id else 0
            found.append(boot_steps(label, node_bootstrap(spec, group, data_mounts=mounts(spec)),
                                    volume_mibps=rate))
    # prod as it was before this issue: unattended upgrades holding the dpkg lock at first boot
    spec = parse_stack_config(stack_config("prod"), stack="prod")
    found.append(boot_steps("prod (before: dpkg lock held)",
                            node_bootstrap(spec, spec.node_groups[0], data_mounts=mounts(spec)),
                            unattended_stopped=False))
    return found


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def measurements(path: Path = MEASUREMENTS) -> dict[tuple[str, str], dict[str, Any]]:
    """The published table: (stack, group) -> its measured medians (seconds since boot) and source;
    empty when the file is absent or lists nothing.

    The file: `source:` (where and when, e.g. "measured in an account on 2026-12-01") and `boots:`, a
    list of {stack, group, steps: {milestone: median seconds}, first_job: median seconds, nodes: n}:
    what `gpucluster nodes STACK --json` prints per group under boot_times."""
    if not path.is_file():
        return {}
    raw = yaml.safe_load(path.read_text()) or {}
    source = str(raw.get("source", "no source given"))
    return {(str(b["stack"]), str(b["group"])): {**b, "source": source} for b in raw.get("boots") or []}


def compared(all_boots: list[Boot], measured: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Each boot's milestones, modelled beside measured (None where nothing was measured)."""
    rows = []
    for boot in all_boots:
        found = measured.get((boot.stack, boot.group), {})
        steps = found.get("steps") or {}
        model = {**boot.milestones(), "first_job": boot.first_job_seconds}
        for name in (*MILESTONES, "first_job"):
            if name not in model and name not in steps:
                continue
            value = found.get("first_job") if name == "first_job" else steps.get(name)
            rows.append({"stack": boot.stack, "group": boot.group, "milestone": name,
                         "modelled_seconds": model.get(name),
                         "measured_seconds": None if value is None else float(value),
                         "source": found.get("source") if value is not None else None})
    return rows


def comparison_lines(rows: list[dict[str, Any]], path: Path) -> list[str]:
    if not any(r["measured_seconds"] is not None for r in rows):
        return ["", f"measured: none ({path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
                    "absent or empty: no published measurements yet); every figure above is modelled"]
    lines = ["", "measured (seconds since the node's boot, a few seconds after `running`; not corrected) "
                 "vs modelled (after `running`):"]
    for r in rows:
        if r["measured_seconds"] is None:
            continue
        lines.append(f"  {r['stack']} / {r['group']:<14} {r['milestone']:<9} measured "
                     f"{minutes(r['measured_seconds'])}  modelled "
                     f"{'-' if r['modelled_seconds'] is None else minutes(r['modelled_seconds'])}  "
                     f"({r['source']})")
    modelled_only = sorted({f"{r['stack']} / {r['group']}" for r in rows if r["measured_seconds"] is None})
    if modelled_only:
        lines.append("  still modelled only: " + ", ".join(modelled_only))
    return lines


def report(all_boots: list[Boot]) -> list[str]:
    lines = []
    for boot in all_boots:
        branches = boot.branch_seconds()
        lines += ["", f"{boot.stack} / {boot.group}: ready {minutes(boot.ready_seconds)} after `running`"
                  f", first job {minutes(boot.first_job_seconds)}"
                  f" (InService at {minutes(boot.in_service_seconds)}; critical path: {boot.critical_branch}"
                  f"{', baked' if boot.baked else ''})"]
        for s in boot.steps:
            critical = s.branch in ("start", boot.critical_branch)
            lines.append(f"  {'*' if critical else ' '} {s.branch:<7} {s.name:<48} {s.seconds:7.1f} s  "
                         f"{s.downloads:<14} {s.source}")
        lines.append("    branches: " + ", ".join(f"{k} {v:.0f} s" for k, v in branches.items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measurements", type=Path, default=MEASUREMENTS,
                        help="the published table of measured boots (default: %(default)s)")
    args = parser.parse_args(argv)
    all_boots = boots()
    baked = next(b for b in all_boots if b.stack == "prod (baked)" and b.group == "h100-train")
    rows = compared(all_boots, measurements(args.measurements))
    if args.json:
        print(json.dumps({"figures": {k: {"value": v, "source": src} for k, (v, src) in FIGURES.items()},
                          "boots": [{**asdict(b), "ready_seconds": b.ready_seconds,
                                     "first_job_seconds": b.first_job_seconds,
                                     "in_service_seconds": b.in_service_seconds} for b in all_boots],
                          "measured_vs_modelled": rows}, indent=2))
    else:
        print("* on the critical path; the last column names the figure used (sources below)")
        print("\n".join(report(all_boots)))
        print("\n".join(comparison_lines(rows, args.measurements)))
        print("\nfigures:")
        for key, (value, source) in FIGURES.items():
            print(f"  {key} = {value:g}: {source}")
        print(f"\nbaked prod h100-train: ready in {minutes(baked.ready_seconds)} "
              f"(target: under {minutes(TARGET_SECONDS)})")
    return 0 if baked.ready_seconds < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
