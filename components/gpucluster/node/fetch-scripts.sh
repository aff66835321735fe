#!/bin/bash
# gpucluster-fetch-scripts REGION BUCKET KEY OWNER SHA256 DEST: the node scripts bundle, fetched from the
# stack's node-scripts bucket and verified before anything in it runs.
# The user data carries only this loader and the node's own settings: EC2 user data holds 16 KiB
# (EC2 user guide, "Run commands when you launch an EC2 instance with user data"), the scripts do not
# fit beside a MIG layout and the metrics collector. The bundle is a tar of the scripts, stored under a
# key holding its own sha256 (gpucluster.node.bundle); the SHA256 given here is the one the stack
# rendered into the user data, so a bundle that differs by one byte (replaced, truncated, another
# version) is refused: nothing of it is unpacked, the boot fails with one line saying so, and the
# launch health check (which never starts) lets the launch hook abandon the node, as any failed boot.
# A fetch that fails (S3 or the network not answering yet, credentials not there yet) is retried with
# a doubling wait; when every attempt fails the boot fails, with one line naming the object.
set -euo pipefail
if [ "$#" -ne 6 ]; then
  echo "usage: gpucluster-fetch-scripts REGION BUCKET KEY OWNER SHA256 DEST" >&2
  exit 2
fi
region=$1 bucket=$2 key=$3 owner=$4 want=$5 dest=$6
attempts=${GPUCLUSTER_FETCH_ATTEMPTS:-8}
delay=${GPUCLUSTER_FETCH_FIRST_WAIT_SECONDS:-2}
max_delay=${GPUCLUSTER_FETCH_MAX_WAIT_SECONDS:-60}
say() { echo "gpucluster bootstrap: $*"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for ((attempt = 1; ; attempt++)); do
  # --expected-bucket-owner: a bucket of that name in another account is never read. Bounded
  # connect and read timeouts: a connection that hangs is one failed attempt, not a hung boot.
  if err=$(aws s3api get-object --cli-connect-timeout 10 --cli-read-timeout 60 --region "$region" \
      --bucket "$bucket" --key "$key" --expected-bucket-owner "$owner" "$work/bundle.tar" 2>&1 >/dev/null); then
    break
  fi
  if [ "$attempt" -ge "$attempts" ]; then
    say "FAILED: node scripts s3://$bucket/$key not fetched after $attempt attempts (last: ${err:-no output}): the node does not start"
    exit 1
  fi
  say "node scripts s3://$bucket/$key: attempt $attempt failed (${err:-no output}); again in ${delay}s"
  sleep "$delay"
  delay=$((delay * 2 > max_delay ? max_delay : delay * 2))
done

got=$(sha256sum "$work/bundle.tar")
got=${got%% *}
if [ "$got" != "$want" ]; then
  say "FAILED: node scripts s3://$bucket/$key have sha256 $got, the stack expects $want: refusing to run them"
  exit 1
fi
if ! install -d -m 0755 "$dest" || ! tar -xf "$work/bundle.tar" -C "$dest" --no-same-owner \
    --no-same-permissions; then
  say "FAILED: node scripts $want verified but not unpacked into $dest (disk full?)"
  exit 1
fi
say "node scripts $want verified ($key)"
