#!/bin/bash
# gpucluster-install: what a node downloads at boot, each at a pinned version and verified before
# anything is installed; what does not verify is refused (exit 1) and nothing is installed.
#   cloudwatch-agent  Amazon CloudWatch agent .deb and its detached .sig, from the region's bucket
#                     (works through the VPC's S3 gateway endpoint); signer fingerprint pinned
#                     (CloudWatch user guide, "Verifying the signature of the CloudWatch agent package").
#   mount-s3          Mountpoint for Amazon S3 .deb and its detached .asc; signer fingerprints pinned
#                     (Amazon S3 user guide, "Installing Mountpoint": "Verifying the signature of the
#                     Mountpoint for Amazon S3 package"; the older key still signs older releases).
#   lustre-client     the Lustre client modules for the running kernel from AWS's apt repository
#                     (FSx for Lustre user guide, "Installing the Lustre client", Ubuntu): apt checks
#                     the repository's signatures against that repository's key only (signed-by).
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"

CWA_VERSION=1.300072.0b1766
CWA_SIGNERS="937616F3450B7D806CBD9725D58167303B789C72"
MOUNTPOINT_VERSION=1.18.0
MOUNTPOINT_SIGNERS="8AEFE705EBE329C0948C75A66F1C3B3AEF4B030B 673FE4061506BB469A0EF857BE397A52B086DA5A"

log() { echo "gpucluster-install: $*"; logger -t gpucluster-install -- "$*" || true; }

# verified_download URL SIGNATURE_URL KEY_URL "PINNED_FINGERPRINTS" OUT
# The signature must be good and made by a key whose primary fingerprint is pinned (gpg's VALIDSIG
# status line ends with it), whatever else the downloaded key file holds.
verified_download() {
  local url=$1 sig_url=$2 key_url=$3 signers=$4 out=$5 work status signer
  work=$(mktemp -d)
  curl -fsSL --retry 5 -o "$work/key" "$key_url"
  curl -fsSL --retry 5 -o "$work/sig" "$sig_url"
  curl -fsSL --retry 5 -o "$out" "$url"
  install -d -m 0700 "$work/gnupg"
  GNUPGHOME="$work/gnupg" gpg --batch --quiet --import "$work/key"
  status=$(GNUPGHOME="$work/gnupg" gpg --batch --status-fd 1 --verify "$work/sig" "$out" 2>/dev/null) || true
  signer=$(awk '$2 == "VALIDSIG" { print $NF; exit }' <<<"$status")
  rm -rf "$work"
  if [ -z "$signer" ] || [[ " $signers " != *" $signer "* ]]; then
    rm -f "$out"
    log "refusing $url: no good signature by a pinned key (signer: ${signer:-none})"
    return 1
  fi
  log "verified $url (signed by $signer)"
}

install_cloudwatch_agent() {
  local base="https://amazoncloudwatch-agent-${GPUCLUSTER_REGION}.s3.${GPUCLUSTER_REGION}.amazonaws.com"
  local deb
  deb=$(mktemp --suffix=.deb)
  verified_download "$base/ubuntu/amd64/$CWA_VERSION/amazon-cloudwatch-agent.deb" \
    "$base/ubuntu/amd64/$CWA_VERSION/amazon-cloudwatch-agent.deb.sig" \
    "$base/assets/amazon-cloudwatch-agent.gpg" "$CWA_SIGNERS" "$deb"
  dpkg -i -E "$deb"
  rm -f "$deb"
}

install_mount_s3() {
  local base=https://s3.amazonaws.com/mountpoint-s3-release deb
  deb="$(mktemp -d)/mount-s3-$MOUNTPOINT_VERSION-x86_64.deb"
  verified_download "$base/$MOUNTPOINT_VERSION/x86_64/mount-s3-$MOUNTPOINT_VERSION-x86_64.deb" \
    "$base/$MOUNTPOINT_VERSION/x86_64/mount-s3-$MOUNTPOINT_VERSION-x86_64.deb.asc" \
    "$base/public_keys/KEYS" "$MOUNTPOINT_SIGNERS" "$deb"
  DEBIAN_FRONTEND=noninteractive apt-get install -y "$deb"
  rm -rf "$(dirname "$deb")"
}

install_lustre_client() {
  local codename keyring=/usr/share/keyrings/fsx-ubuntu-public-key.gpg
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  curl -fsSL --retry 5 https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc \
    | gpg --batch --dearmor --yes -o "$keyring"
  echo "deb [signed-by=$keyring] https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu $codename main" \
    > /etc/apt/sources.list.d/fsxlustreclientrepo.list
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "lustre-client-modules-$(uname -r)"
}

case "${1:-}" in
  cloudwatch-agent) install_cloudwatch_agent ;;
  mount-s3) install_mount_s3 ;;
  lustre-client) install_lustre_client ;;
  *) echo "usage: gpucluster-install cloudwatch-agent|mount-s3|lustre-client" >&2; exit 2 ;;
esac
