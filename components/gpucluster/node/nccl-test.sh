#!/bin/bash
# gpucluster NCCL smoke test (`gpucluster run STACK --group G --nccl-test`), one phase per SSM command.
# Not installed at boot: `run` sends this text with the phase in GPUCLUSTER_NCCL_PHASE.
# nccl-tests' all_reduce_perf ships with the Deep Learning AMI: "NCCL Tests Location:
# /usr/local/cuda-xx.x/efa/test-cuda-xx.x/" (AWS Deep Learning AMI release notes); the AWS Deep
# Learning Containers and many custom AMIs put it at /opt/nccl-tests/build. Nothing is built here.
# Multi-node nccl-tests runs under MPI, and Open MPI starts the remote ranks over SSH (nccl-tests
# README, "NCCL tests rely on MPI to work on multiple processes, hence multiple nodes"), so the test
# opens SSH inside the group for its own duration only:
#   key        rank 0 makes a fresh key pair in /run (tmpfs) and prints the public key
#   authorize  every node lets that one key in, as root, from the group's addresses only
#   run        rank 0 runs mpirun over the hosts with that key; prints the result table
#   revoke     every node removes the key (always run, also after a failed run)
# The security group already allows all traffic within a multi-node group (NCCL's own ports).
set -euo pipefail
PHASE="${GPUCLUSTER_NCCL_PHASE:?}"
RUN="${GPUCLUSTER_NCCL_RUN:?}"
[[ "$RUN" =~ ^[a-z0-9-]{1,40}$ ]] || { echo "bad run id '$RUN'" >&2; exit 2; }
DIR="${GPUCLUSTER_NCCL_DIR:-/run/gpucluster/nccl-test}/$RUN"
SSH_DIR="${GPUCLUSTER_SSH_DIR:-/root/.ssh}"
MPIRUN="${GPUCLUSTER_MPIRUN:-/opt/amazon/openmpi/bin/mpirun}"
MARK="gpucluster-nccl-test-$RUN"

# The first all_reduce_perf found: the default CUDA's, any CUDA's (newest), then /opt/nccl-tests.
find_test() {
  local cuda candidate others
  cuda=$(readlink -f "${GPUCLUSTER_CUDA_HOME:-/usr/local/cuda}" 2>/dev/null || true)
  mapfile -t others < <(printf '%s\n' "${GPUCLUSTER_CUDA_ROOT:-/usr/local}"/cuda-*/efa/test-cuda-*/all_reduce_perf | sort -rV)
  for candidate in "$cuda"/efa/test-cuda-*/all_reduce_perf "${others[@]}" \
      "${GPUCLUSTER_NCCL_TESTS:-/opt/nccl-tests/build}/all_reduce_perf"; do
    [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  return 1
}

case "$PHASE" in
  key)
    install -d -m 0700 "$DIR"
    ssh-keygen -q -t ed25519 -N '' -C "$MARK" -f "$DIR/key"
    cat "$DIR/key.pub"
    ;;
  authorize)
    key="${GPUCLUSTER_NCCL_PUBKEY:?}"
    [[ "$key" =~ ^ssh-ed25519\ [A-Za-z0-9+/=]+\ $MARK$ ]] || { echo "not this run's key: $key" >&2; exit 2; }
    from=$(tr ' ' ',' <<<"${GPUCLUSTER_NODE_IPS:?}")
    install -d -m 0700 "$SSH_DIR"
    echo "from=\"$from\",no-agent-forwarding,no-port-forwarding,no-X11-forwarding $key" >> "$SSH_DIR/authorized_keys"
    chmod 0600 "$SSH_DIR/authorized_keys"
    echo "authorized $MARK from $from"
    ;;
  run)
    test=$(find_test) || {
      echo "all_reduce_perf not found: the Deep Learning AMI ships it under /usr/local/cuda-*/efa/test-cuda-*/;" \
           "elsewhere install nccl-tests built with MPI=1 at /opt/nccl-tests/build" >&2
      exit 3
    }
    cuda_dir="${test%%/efa/*}"
    libs=""
    for lib in "$cuda_dir/lib" "$cuda_dir/lib64" "$cuda_dir/efa/lib" /opt/amazon/ofi-nccl/lib /opt/amazon/efa/lib \
        /opt/amazon/openmpi/lib /opt/amazon/openmpi/lib64; do
      [ -d "$lib" ] && libs="$libs${libs:+:}$lib"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for ip in $GPUCLUSTER_NODE_IPS; do echo "$ip slots=$NPROC_PER_NODE"; done > "$DIR/hosts"
    forward=(-x PATH -x LD_LIBRARY_PATH)
    while IFS= read -r var; do forward+=(-x "$var"); done < <(compgen -e | grep -E '^(FI|NCCL)_' || true)
    echo "# $test on $NNODES node(s) x $NPROC_PER_NODE GPU(s)"
    set +e
    # Options as the EC2 user guide's NCCL test ("Get started with EFA and NCCL"): TCP for MPI's
    # own traffic, NCCL over EFA through the aws-ofi-nccl plugin.
    "$MPIRUN" --allow-run-as-root --hostfile "$DIR/hosts" -n "$((NNODES * NPROC_PER_NODE))" -N "$NPROC_PER_NODE" \
      --bind-to none --map-by slot --mca pml ^cm --mca btl tcp,self --mca btl_tcp_if_exclude lo,docker0 \
      --mca plm_rsh_agent ssh \
      --mca plm_rsh_args "-i $DIR/key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR" \
      "${forward[@]}" "$test" -b "${GPUCLUSTER_NCCL_MIN_BYTES:-8}" -e "${GPUCLUSTER_NCCL_MAX_BYTES:-4G}" -f 2 -g 1 \
      > "$DIR/output" 2>&1
    status=$?
    set -e
    mkdir -p /var/log/gpucluster && cp "$DIR/output" "/var/log/gpucluster/nccl-test-$RUN.log"
    # SSM returns the first 24,000 characters: the table and its summary, not one line per rank.
    grep -vE '^#  *Rank |NCCL INFO' "$DIR/output" || true
    exit "$status"
    ;;
  revoke)
    if [ -f "$SSH_DIR/authorized_keys" ]; then
      grep -v " $MARK\$" "$SSH_DIR/authorized_keys" > "$SSH_DIR/authorized_keys.new" || true
      chmod 0600 "$SSH_DIR/authorized_keys.new"
      mv "$SSH_DIR/authorized_keys.new" "$SSH_DIR/authorized_keys"
    fi
    rm -rf "$DIR"
    echo "revoked $MARK"
    ;;
  *) echo "unknown phase '$PHASE'" >&2; exit 2 ;;
esac
