#!/bin/bash
# gpucluster-metrics: GPU metrics to Amazon Managed Prometheus, beside (never instead of) the CloudWatch
# agent. `start`: run NVIDIA's dcgm-exporter (the image pinned by digest in the stack file; its counters
# file written from GPUCLUSTER_DCGM_FIELDS; Docker installed first where the AMI has none,
# gpucluster-install container-runtime), the node exporter and a Prometheus that scrapes both every
# GPUCLUSTER_METRICS_SCRAPE_SECONDS and remote-writes with SigV4 as the node role (Prometheus docs,
# "remote_write" sigv4; AMP user guide, "Ingest metrics ... using remote write"). Its config is rendered
# here: every series labelled with the stack identity, node group, instance id and instance type
# (IMDSv2), which the dashboards and rules select on.
# Where they come from, on any OS (gpucluster-os):
#   - observability.prometheus.prometheus_image and node_exporter_image set (GPUCLUSTER_PROMETHEUS_IMAGE,
#     GPUCLUSTER_NODE_EXPORTER_IMAGE): both run as those containers, pinned by digest (docker checks
#     what it pulls against the digest). Host network: they listen on 127.0.0.1 only, and Prometheus
#     reaches IMDSv2 for the node role's credentials as a host process does (a bridged container is one
#     hop further: the nodes' launch templates allow 2, gpucluster.aws.nodes.IMDS_HOP_LIMIT, host
#     networking needs 1). The rendered config is mounted read-only; gpucluster-prometheus runs
#     `gpucluster-metrics serve`, Prometheus in the foreground as the unit's own process.
#   - unset, Ubuntu: the archive's prometheus and prometheus-node-exporter (apt checks them).
#   - unset, Amazon Linux 2023: no Prometheus package there (ledger: al2023-node-packages), so `start`
#     says so in one line naming the two keys and exits 1 (NodeStepFailed, Step=metrics) without
#     installing anything from elsewhere; `gpucluster doctor` warns before deploy.
# `check`: after a start, is Prometheus writing? Says so in the boot log either way and exits 1 when
# not (gpucluster-report then publishes NodeStepFailed for step metrics).
# Metrics never block a job: this unit is ordered after nothing a job needs, and nothing requires it;
# the health check and the launch lifecycle hook do not look at it.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
# shellcheck source=/dev/null
. "${GPUCLUSTER_METRICS_ENV:-/etc/gpucluster/metrics.env}"
CONFIG="${GPUCLUSTER_PROMETHEUS_CONFIG:-/etc/gpucluster/prometheus.yml}"
COUNTERS="${GPUCLUSTER_DCGM_COUNTERS:-/etc/gpucluster/dcgm-counters.csv}"
IMDS="${GPUCLUSTER_IMDS:-http://169.254.169.254}"
DCGM_PORT="${GPUCLUSTER_DCGM_PORT:-9400}"
NODE_PORT="${GPUCLUSTER_NODE_EXPORTER_PORT:-9100}"
PROM_PORT="${GPUCLUSTER_PROMETHEUS_PORT:-9090}"
CHECK_SECONDS="${GPUCLUSTER_METRICS_CHECK_SECONDS:-180}"
BINARIES="${GPUCLUSTER_METRICS_BINARIES:-/usr/bin/prometheus /usr/bin/prometheus-node-exporter}"
INSTALL="${GPUCLUSTER_INSTALL:-/usr/local/sbin/gpucluster-install}"
OS_TOOL="${GPUCLUSTER_OS_TOOL:-/usr/local/sbin/gpucluster-os}"
PROMETHEUS_IMAGE="${GPUCLUSTER_PROMETHEUS_IMAGE:-}"
NODE_EXPORTER_IMAGE="${GPUCLUSTER_NODE_EXPORTER_IMAGE:-}"
# The containers' entrypoints are the binaries (/bin/prometheus, /bin/promtool beside it,
# /bin/node_exporter: the projects' Dockerfiles; ledger: prometheus-container-images). Prometheus runs
# as nobody, given here rather than taken from the image, and owns its data directory.
NOBODY=65534
IN_CONFIG=/etc/prometheus/prometheus.yml

log() { echo "gpucluster-metrics: $*"; logger -t gpucluster-metrics -- "$*" || true; }

imds() {
  local token
  token=$(curl -fsS -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$IMDS/latest/api/token")
  curl -fsS -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

# A YAML double-quoted scalar: backslashes and quotes escaped (the identity is free text).
quoted() { local v=${1//\\/\\\\}; printf '"%s"' "${v//\"/\\\"}"; }

# The node exporter's series are kept to a few families (load, memory, disk, network): a GPU node's
# hundreds of CPU series would multiply AMP's bill (pricing.NODE_EXPORTER_SERIES counts these).
render_config() {
  local instance_id=$1 instance_type=$2 labels
  labels="        labels:
          gpucluster_stack: $(quoted "$GPUCLUSTER_STACK")
          node_group: $(quoted "$GPUCLUSTER_NODE_GROUP")
          instance_id: $(quoted "$instance_id")
          instance_type: $(quoted "$instance_type")"
  cat > "$CONFIG.tmp" <<EOF
global:
  scrape_interval: ${GPUCLUSTER_METRICS_SCRAPE_SECONDS}s
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
      - targets: ["127.0.0.1:$DCGM_PORT"]
$labels
  - job_name: node-exporter
    static_configs:
      - targets: ["127.0.0.1:$NODE_PORT"]
$labels
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: node_(load1|memory_Mem(Available|Total)_bytes|filesystem_(avail|size)_bytes|network_(receive|transmit)_bytes_total)
        action: keep
remote_write:
  - url: $(quoted "$GPUCLUSTER_REMOTE_WRITE_URL")
    sigv4:
      region: $(quoted "$GPUCLUSTER_REMOTE_WRITE_REGION")
    queue_config:
      max_samples_per_send: 1000
      max_shards: 20
EOF
  mv "$CONFIG.tmp" "$CONFIG"
}

start_dcgm_exporter() {
  local f
  for f in $GPUCLUSTER_DCGM_FIELDS; do
    if [ "${f%%:*}" = c ]; then echo "${f#*:}, counter, ${f#*:}"; else echo "${f#*:}, gauge, ${f#*:}"; fi
  done > "$COUNTERS"
  docker rm -f gpucluster-dcgm-exporter >/dev/null 2>&1 || true
  # The exporter reads the GPUs through DCGM in the container; profiling counters need SYS_ADMIN
  # (dcgm-exporter README, "Quickstart": docker run --gpus all --cap-add SYS_ADMIN).
  docker run -d --name gpucluster-dcgm-exporter --restart unless-stopped --gpus all --cap-add SYS_ADMIN \
    -p "127.0.0.1:$DCGM_PORT:9400" -v "$COUNTERS:/etc/dcgm-exporter/gpucluster.csv:ro" \
    "$GPUCLUSTER_DCGM_EXPORTER_IMAGE" -f /etc/dcgm-exporter/gpucluster.csv >/dev/null
}

# The collector from the OS's packages: Ubuntu's archive, verified by apt against the distribution's
# key; apt >= 1.9.11 waits for the dpkg lock itself (the Deep Learning AMI may hold it at first boot).
start_packages() {
  local binaries os
  read -ra binaries <<<"$BINARIES"
  if ! ls "${binaries[@]}" >/dev/null 2>&1; then
    os=$("$OS_TOOL")
    if [ "$os" != ubuntu ]; then
      log "NOT STARTED: no Prometheus package for this OS ($os): set" \
          "observability.prometheus.prometheus_image and observability.prometheus.node_exporter_image" \
          "(pinned by digest: run as containers), or use an Ubuntu AMI or one with ${binaries[*]};" \
          "jobs are not affected"
      return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
      prometheus prometheus-node-exporter
    # The package's own server (its default config) is not ours: gpucluster-prometheus runs instead.
    systemctl disable --now prometheus || true
  fi
  promtool check config "$CONFIG" >/dev/null
  command -v docker >/dev/null || "$INSTALL" container-runtime
  start_dcgm_exporter
  systemctl enable --now prometheus-node-exporter
  systemctl enable --now gpucluster-prometheus
}

# The collector as the pinned containers (any OS): the config checked by the image's own promtool
# before anything starts, then the exporters, then gpucluster-prometheus (`serve`).
start_containers() {
  command -v docker >/dev/null || "$INSTALL" container-runtime
  docker run --rm --network none --entrypoint /bin/promtool -v "$CONFIG:$IN_CONFIG:ro" \
    "$PROMETHEUS_IMAGE" check config "$IN_CONFIG" >/dev/null
  start_dcgm_exporter
  docker rm -f gpucluster-node-exporter >/dev/null 2>&1 || true
  # The host's own view (node_exporter README, "Docker": host network and PID namespace, / read-only).
  docker run -d --name gpucluster-node-exporter --restart unless-stopped --network host --pid host \
    -v /:/host:ro,rslave "$NODE_EXPORTER_IMAGE" --path.rootfs=/host \
    "--web.listen-address=127.0.0.1:$NODE_PORT" >/dev/null
  systemctl enable --now gpucluster-prometheus
}

start() {
  local instance_id instance_type
  instance_id=$(imds instance-id)
  instance_type=$(imds instance-type)
  render_config "$instance_id" "$instance_type"
  if [ -n "$PROMETHEUS_IMAGE" ] && [ -n "$NODE_EXPORTER_IMAGE" ]; then
    start_containers
  else
    start_packages
  fi
}

# gpucluster-prometheus's process with the pinned image: Prometheus in the foreground (docker run
# without -d: systemd's stop reaches it through docker's signal proxy; --rm leaves no container behind).
serve() {
  local data=$1 retention=$2
  [ -n "$PROMETHEUS_IMAGE" ] || { echo "gpucluster-metrics: serve: no GPUCLUSTER_PROMETHEUS_IMAGE" >&2; exit 2; }
  install -d -m 0750 -o "$NOBODY" -g "$NOBODY" "$data"
  docker rm -f gpucluster-prometheus >/dev/null 2>&1 || true
  exec docker run --rm --name gpucluster-prometheus --network host --user "$NOBODY:$NOBODY" \
    -v "$CONFIG:$IN_CONFIG:ro" -v "$data:/prometheus" "$PROMETHEUS_IMAGE" \
    "--config.file=$IN_CONFIG" --storage.tsdb.path=/prometheus "--storage.tsdb.retention.time=$retention" \
    "--web.listen-address=127.0.0.1:$PROM_PORT"
}

# One sample of Prometheus's own counters: written and failed samples (remote storage metrics,
# prometheus_remote_storage_samples_total since 2.26, ..._succeeded_... before).
counter() {
  { curl -fsS "http://127.0.0.1:$PROM_PORT/metrics" 2>/dev/null || true; } \
    | awk -v re="^$1(\\{|[[:space:]])" '$0 ~ re { sum += $NF; found = 1 } END { if (found) print sum; else print 0 }'
}

check() {
  local waited=0 sent failed
  while :; do
    sent=$(counter 'prometheus_remote_storage_(samples|succeeded_samples)_total')
    failed=$(counter 'prometheus_remote_storage_(samples_failed|failed_samples)_total')
    if awk -v s="$sent" 'BEGIN { exit !(s > 0) }'; then
      log "writing to $GPUCLUSTER_REMOTE_WRITE_URL ($sent samples sent, $failed failed)"
      return 0
    fi
    [ "$waited" -lt "$CHECK_SECONDS" ] || break
    sleep 10
    waited=$((waited + 10))
  done
  # AccessDenied: the node role's aps:RemoteWrite; no route: the VPC's egress or an aps-workspaces endpoint.
  log "NOT WRITING to $GPUCLUSTER_REMOTE_WRITE_URL after ${waited}s ($failed samples failed): journalctl -u" \
      "gpucluster-prometheus; jobs are not affected"
  return 1
}

case "${1:-}" in
  start) start ;;
  check) check ;;
  render) render_config "${2:?instance id}" "${3:?instance type}" ;;
  serve) serve "${2:?data directory}" "${3:?retention}" ;;
  *) echo "usage: gpucluster-metrics start|check|render ID TYPE|serve DATA RETENTION" >&2; exit 2 ;;
esac
