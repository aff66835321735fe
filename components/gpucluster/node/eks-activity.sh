#!/bin/bash
# gpucluster-eks-activity: sourced by `gpucluster-report activity` (report.sh) on an EKS node only, so
# the other nodes' user data does not carry it (16 KiB gzipped). Defines eks_activity, which sets
# `value` (NodeActive) and uses report.sh's `log`.
# EKS stacks only (node.env sets GPUCLUSTER_SCHEDULER=eks): idle by what the GPUs do, not by what pods
# hold. Busy (NodeActive 1) only while a Running pod on this node holds nvidia.com/gpu, read from the
# kubelet's own pod list (GET /pods on its authenticated port, a bearer token from `aws eks get-token`
# as the node's identity: the read-only port is off by default and would show every pod's spec to
# anything that reaches the node; ledger: eks-kubelet-pods), AND the busiest GPU's utilisation, the mean
# of GPUCLUSTER_BUSY_SAMPLES samples, reaches GPUCLUSTER_GPU_BUSY_PERCENT. A pod holding a GPU at 0 %
# is idle; the group's alarm stops it after idle_minutes of that, as for any group. The kubelet not
# answering: nothing published (missing data is never idle). A GPU pod whose utilisation cannot be
# read (MIG, nvidia-smi failing) counts as busy.
# shellcheck disable=SC2016 # python, not shell
GPU_PODS='import json, sys
def gpus(c):
    r = c.get("resources") or {}
    return int((r.get("limits") or {}).get("nvidia.com/gpu") or (r.get("requests") or {}).get("nvidia.com/gpu") or 0)
print(sum(gpus(c) for p in json.load(sys.stdin).get("items") or [] if (p.get("status") or {}).get("phase") == "Running"
          for c in (p.get("spec") or {}).get("containers") or []))'
eks_activity() {
  local token pods held total=0 n=0 i busiest
  token=$(aws eks get-token --cluster-name "$GPUCLUSTER_EKS_CLUSTER" --region "$GPUCLUSTER_REGION" \
    --query status.token --output text) || { log "no EKS token: activity unknown"; return 1; }
  # -k: loopback to this node's own kubelet, whose certificate names the node (ledger: eks-kubelet-pods)
  pods=$(curl -sS -f -k --max-time 10 -H "Authorization: Bearer $token" \
    "${GPUCLUSTER_KUBELET_URL:-https://127.0.0.1:10250}/pods") || { log "the kubelet's pod list did not answer"; return 1; }
  held=$(python3 -c "$GPU_PODS" <<<"$pods") || { log "the kubelet's pod list did not parse"; return 1; }
  if ! [ "$held" -gt 0 ] 2>/dev/null; then value=0; return 0; fi
  for ((i = 0; i < ${GPUCLUSTER_BUSY_SAMPLES:-6}; i++)); do
    if [ "$i" -gt 0 ]; then sleep "${GPUCLUSTER_BUSY_INTERVAL_SECONDS:-5}"; fi
    busiest=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | sort -n | tail -n 1)
    busiest="${busiest//[[:space:]]/}"
    if [[ $busiest =~ ^[0-9]+$ ]]; then total=$((total + busiest)); n=$((n + 1)); fi
  done
  value=1
  if [ "$n" -gt 0 ] && ! awk -v t="$total" -v n="$n" -v p="$GPUCLUSTER_GPU_BUSY_PERCENT" 'BEGIN { exit !(t / n >= p) }'; then
    value=0
    log "$held GPU(s) held by running pods, the busiest GPU at $((total / n)) % (under $GPUCLUSTER_GPU_BUSY_PERCENT %): idle"
  fi
}

