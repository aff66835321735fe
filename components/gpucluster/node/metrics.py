"""What a node needs to send GPU metrics to Amazon Managed Prometheus: the settings (`NodeMetrics`) and
the dcgm-exporter counters file. Pure: no Pulumi, no AWS. The shell is metrics.sh next to this module;
`gpucluster.node.userdata.metrics_files` writes both onto the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.spec import ObservabilityConfig

PROMETHEUS_UNIT = "gpucluster-prometheus.service"
METRICS_UNIT = "gpucluster-metrics.service"
PROMETHEUS_DATA = "/var/lib/gpucluster-prometheus"
# Samples wait here while AMP does not answer: a short local buffer, never a second store.
PROMETHEUS_RETENTION = "2h"

# The fields dcgm-exporter reads (its `-f` collectors file, lines `DCGM field, Prometheus type, help`):
# NVIDIA/dcgm-exporter etc/default-counters.csv, plus its dcp-metrics-included.csv's SM activity and
# the ECC, retired-page and NVLink error counters the dashboards and alert rules read. metrics.sh
# writes the file from `dcgm_fields` (the help is the field's name: user data is 16 KiB).
DCGM_FIELDS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter"),
)


def dcgm_fields() -> str:
    """The fields as metrics.sh takes them: `g:<field>` for a gauge, `c:<field>` for a counter."""
    return " ".join(f"{kind[0]}:{name}" for name, kind in DCGM_FIELDS)


@dataclass(frozen=True)
class NodeMetrics:
    """Where and how often a node writes its metrics (plain values: the URL resolved)."""

    remote_write_url: str
    region: str
    dcgm_exporter_image: str
    scrape_interval_seconds: int = 30
    prometheus_image: str | None = None
    """With node_exporter_image: Prometheus and the node exporter run as these containers (pinned by
    digest) instead of the OS's packages; None: the packages (Ubuntu's archive)."""
    node_exporter_image: str | None = None

    @property
    def containers(self) -> bool:
        """The collector runs as containers (both images set: the stack file's check keeps them paired)."""
        return self.prometheus_image is not None and self.node_exporter_image is not None


# The URL a workspace of the stack will have: same length as the real one (a workspace id is a
# fixed-length UUID form), for the user-data size check before the workspace exists.
UNKNOWN_WORKSPACE = "ws-00000000-0000-0000-0000-000000000000"


def remote_write_url_of(region: str, workspace_id: str) -> str:
    """AMP's remote-write URL (AMP user guide, "Ingest Prometheus metrics to the workspace")."""
    suffix = ".cn" if region.startswith("cn-") else ""
    return f"https://aps-workspaces.{region}.amazonaws.com{suffix}/workspaces/{workspace_id}/api/v1/remote_write"


def group_metrics(o: ObservabilityConfig, region: str,
                  remote_write_url: str | None = None) -> NodeMetrics | None:
    """The node side of `observability.prometheus` (None when off). The stack's own workspace is in the
    stack's region and its URL is known once it exists: pass it resolved (None: a stand-in of its
    length, for sizing only)."""
    p = o.prometheus
    if not p.active or p.dcgm_exporter_image is None:
        return None
    url = p.remote_write_url or remote_write_url or remote_write_url_of(region, UNKNOWN_WORKSPACE)
    return NodeMetrics(url, p.region or region, p.dcgm_exporter_image, p.scrape_interval_seconds,
                       prometheus_image=p.prometheus_image, node_exporter_image=p.node_exporter_image)
