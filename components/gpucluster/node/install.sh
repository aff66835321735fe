#!/bin/bash
# gpucluster-install: what a node downloads at boot, each at a pinned version and verified before
# anything is installed; what does not verify is refused (exit 1) and nothing is installed. Each goes
# through the node's own package manager (gpucluster-os: apt/dpkg on Ubuntu, dnf on Amazon Linux 2023).
#   cloudwatch-agent  Ubuntu: the Amazon CloudWatch agent .deb and its detached .sig, from the region's
#                     bucket (works through the VPC's S3 gateway endpoint); signer fingerprint pinned
#                     (CloudWatch user guide, "Verifying the signature of the CloudWatch agent package").
#                     Amazon Linux 2023: the amazon-cloudwatch-agent package of the distribution's own
#                     repository, which dnf checks against Amazon Linux's key (ledger: al2023-node-packages).
#   mount-s3          Mountpoint for Amazon S3 .deb (Ubuntu) or .rpm (Amazon Linux 2023) and its detached
#                     .asc; signer fingerprints pinned (Amazon S3 user guide, "Installing Mountpoint":
#                     "Verifying the signature of the Mountpoint for Amazon S3 package"; the older key
#                     still signs older releases; the .rpm's name: ledger: al2023-node-packages).
#   lustre-client     Ubuntu: the Lustre client modules for the running kernel from AWS's apt repository
#                     (FSx for Lustre user guide, "Installing the Lustre client", Ubuntu): apt checks
#                     the repository's signatures against that repository's key only (signed-by).
#                     The guide publishes no fingerprint for that key: with the stack's
#                     fsx.client_key_fingerprints (GPUCLUSTER_LUSTRE_KEY_FINGERPRINTS) every key in the
#                     downloaded file must be pinned or nothing is installed; without, the key is used
#                     as fetched over TLS and its fingerprints are logged for pinning.
#                     Amazon Linux 2023: the lustre-client package of the distribution's own repository
#                     (the same guide, Amazon Linux 2023; ledger: al2023-node-packages); no key to pin.
#   container-runtime Docker where the AMI has none (the Deep Learning AMIs have it): Ubuntu's docker.io
#                     or Amazon Linux 2023's docker (ledger: al2023-node-packages), enabled and started.
#                     GPUs in containers need NVIDIA's container toolkit, which only the AMI brings.
# Every dpkg/apt-get waits for the package lock first, at most GPUCLUSTER_LOCK_TIMEOUT_SECONDS: the
# Deep Learning AMI can hold it during first boot (unattended-upgrades, its own setup; SkyPilot
# issue #4237). A failed step is tried GPUCLUSTER_INSTALL_ATTEMPTS times in all, then exits 1: the
# calling unit (gpucluster-agent, gpucluster-data) retries and reports it, never skips it. dnf waits
# for its own lock; a failed dnf command is tried again the same way.
set -euo pipefail
# shellcheck source=/dev/null
. "${GPUCLUSTER_NODE_ENV:-/etc/gpucluster/node.env}"
export DEBIAN_FRONTEND=noninteractive
# ubuntu or al2023; an unsupported system stops here (gpucluster-os says which, exit 1).
OS=$("${GPUCLUSTER_OS_TOOL:-/usr/local/sbin/gpucluster-os}")

LOCK_TIMEOUT="${GPUCLUSTER_LOCK_TIMEOUT_SECONDS:-600}"
LOCK_POLL="${GPUCLUSTER_LOCK_POLL_SECONDS:-5}"
ATTEMPTS="${GPUCLUSTER_INSTALL_ATTEMPTS:-3}"
RETRY_PAUSE="${GPUCLUSTER_RETRY_SECONDS:-20}"
# dpkg's and apt's locks (what `apt-get` itself takes, lock-frontend first).
DPKG_LOCKS=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock)
# apt >= 1.9.11 (Ubuntu 20.04 and later) can wait for the lock itself; dpkg cannot.
APT=(apt-get -o "DPkg::Lock::Timeout=$LOCK_TIMEOUT")

CWA_VERSION=1.300072.0b1766
CWA_SIGNERS="937616F3450B7D806CBD9725D58167303B789C72"
MOUNTPOINT_VERSION=1.18.0
MOUNTPOINT_SIGNERS="8AEFE705EBE329C0948C75A66F1C3B3AEF4B030B 673FE4061506BB469A0EF857BE397A52B086DA5A"

log() { echo "gpucluster-install: $*"; logger -t gpucluster-install -- "$*" || true; }

# Wait until no process holds the dpkg/apt locks (fuser, psmisc), at most LOCK_TIMEOUT seconds.
# Ubuntu only: dnf waits for its own lock.
wait_for_dpkg() {
  local deadline=$((SECONDS + LOCK_TIMEOUT)) said=""
  [ "$OS" = ubuntu ] || return 0
  while fuser "${DPKG_LOCKS[@]}" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "the dpkg lock is still held after ${LOCK_TIMEOUT}s"
      return 1
    fi
    if [ -z "$said" ]; then
      log "waiting for the dpkg lock (another package manager is running)"
      said=1
    fi
    sleep "$LOCK_POLL"
  done
}

# package COMMAND...: a dpkg or apt-get command, run once the lock is free and tried again when it
# fails (the lock taken again between the wait and the command, a mirror that did not answer).
package() {
  local attempt
  for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
    if wait_for_dpkg && "$@"; then
      return 0
    fi
    log "attempt $attempt of $ATTEMPTS failed: $*"
    if [ "$attempt" -lt "$ATTEMPTS" ]; then
      sleep "$RETRY_PAUSE"
    fi
  done
  log "giving up after $ATTEMPTS attempts: $*"
  return 1
}

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
  if [ "$OS" = al2023 ]; then
    package dnf install -y amazon-cloudwatch-agent
    return
  fi
  deb=$(mktemp --suffix=.deb)
  verified_download "$base/ubuntu/amd64/$CWA_VERSION/amazon-cloudwatch-agent.deb" \
    "$base/ubuntu/amd64/$CWA_VERSION/amazon-cloudwatch-agent.deb.sig" \
    "$base/assets/amazon-cloudwatch-agent.gpg" "$CWA_SIGNERS" "$deb"
  package dpkg -i -E "$deb"
  rm -f "$deb"
}

install_mount_s3() {
  local base=https://s3.amazonaws.com/mountpoint-s3-release kind=deb file
  [ "$OS" = al2023 ] && kind=rpm
  file="$(mktemp -d)/mount-s3-$MOUNTPOINT_VERSION-x86_64.$kind"
  verified_download "$base/$MOUNTPOINT_VERSION/x86_64/mount-s3-$MOUNTPOINT_VERSION-x86_64.$kind" \
    "$base/$MOUNTPOINT_VERSION/x86_64/mount-s3-$MOUNTPOINT_VERSION-x86_64.$kind.asc" \
    "$base/public_keys/KEYS" "$MOUNTPOINT_SIGNERS" "$file"
  if [ "$OS" = al2023 ]; then
    package dnf install -y "$file"
  else
    package "${APT[@]}" install -y "$file"
  fi
  rm -rf "$(dirname "$file")"
}

# key_fingerprints FILE: the primary key fingerprints in an OpenPGP key file, one a line
# (`--with-colons`: an fpr record follows each pub record; subkeys' follow sub records).
key_fingerprints() {
  gpg --batch --with-colons --show-keys "$1" 2>/dev/null \
    | awk -F: '$1 == "pub" { want = 1; next } $1 == "fpr" && want { print $10; want = 0 }'
}

install_lustre_client() {
  local codename key found fpr
  local keyring="${GPUCLUSTER_KEYRING_DIR:-/usr/share/keyrings}/fsx-ubuntu-public-key.gpg"
  local sources="${GPUCLUSTER_APT_SOURCES_DIR:-/etc/apt/sources.list.d}/fsxlustreclientrepo.list"
  local pinned="${GPUCLUSTER_LUSTRE_KEY_FINGERPRINTS:-}"
  if [ "$OS" = al2023 ]; then
    [ -z "$pinned" ] || log "fsx.client_key_fingerprints not used: on Amazon Linux 2023 the Lustre client" \
      "comes from the distribution's repository, checked by dnf against Amazon Linux's key"
    package dnf install -y lustre-client
    return
  fi
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  key=$(mktemp)
  curl -fsSL --retry 5 -o "$key" https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc
  found=$(key_fingerprints "$key")
  if [ -z "$found" ]; then
    rm -f "$key"
    log "refusing the Lustre client repository: its key file holds no key"
    return 1
  fi
  for fpr in $found; do
    if [ -z "$pinned" ]; then
      log "Lustre client repository key $fpr is not pinned (fsx.client_key_fingerprints)"
    elif [[ " $pinned " != *" $fpr "* ]]; then
      rm -f "$key"
      log "refusing the Lustre client repository: key $fpr is not pinned (pinned: $pinned)"
      return 1
    fi
  done
  gpg --batch --dearmor --yes -o "$keyring" "$key"
  rm -f "$key"
  echo "deb [signed-by=$keyring] https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu $codename main" \
    > "$sources"
  package "${APT[@]}" update
  package "${APT[@]}" install -y "lustre-client-modules-$(uname -r)"
}

install_container_runtime() {
  if command -v docker >/dev/null; then
    log "the AMI has Docker: nothing to install"
  elif [ "$OS" = al2023 ]; then
    package dnf install -y docker
  else
    package "${APT[@]}" install -y --no-install-recommends docker.io
  fi
  systemctl enable --now docker
}

case "${1:-}" in
  cloudwatch-agent) install_cloudwatch_agent ;;
  mount-s3) install_mount_s3 ;;
  lustre-client) install_lustre_client ;;
  container-runtime) install_container_runtime ;;
  *) echo "usage: gpucluster-install cloudwatch-agent|mount-s3|lustre-client|container-runtime" >&2; exit 2 ;;
esac
