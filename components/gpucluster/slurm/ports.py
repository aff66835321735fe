"""The TCP flows Slurm needs between an AWS PCS controller and its nodes, and the ports a running Slurm
says it uses (`scontrol show config`), so the security groups `aws.pcs` declares and the ones
`verify` reads in the account are checked against the same list. Pure: no Pulumi, no AWS client.

Sources: "Security groups in AWS PCS" (https://docs.aws.amazon.com/pcs/latest/userguide/
working-with_networking_sg.html): slurmctld on 6817 from the instances, slurmd on 6818 from the
controller. slurmdbd on 6819 with accounting (ledger: slurm-dbd-port) and srun's ports between nodes
(ledger: pcs-srun-port-range: as AWS PCS sets it); `verify` reads the real ones on the login node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SLURMCTLD_PORT = 6817  # "Security groups in AWS PCS"
SLURMD_PORT = 6818  # "Security groups in AWS PCS"
SLURMDBD_PORT = 6819  # with accounting (Slurm's default DbdPort; ledger: slurm-dbd-port)
SRUN_PORTS = (60001, 63000)  # srun's ports between nodes (PCS's SrunPortRange; ledger: pcs-srun-port-range)


@dataclass(frozen=True)
class SlurmPorts:
    """The ports one Slurm uses: slurmctld's, slurmd's, slurmdbd's and srun's range (inclusive)."""

    slurmctld: int = SLURMCTLD_PORT
    slurmd: int = SLURMD_PORT
    slurmdbd: int = SLURMDBD_PORT
    srun: tuple[int, int] = SRUN_PORTS


@dataclass(frozen=True)
class SlurmRule:
    """One security group rule between the controller ("cluster") and the Slurm nodes ("nodes")."""

    name: str
    group: str
    direction: str
    from_port: int
    to_port: int
    peer: str
    why: str


DEFAULT_PORTS = SlurmPorts()
"""The ports the stack's security groups are declared with (`aws.pcs`)."""


def slurm_rules(accounting: bool, ports: SlurmPorts = DEFAULT_PORTS) -> list[SlurmRule]:
    """The rules Slurm needs, both ends, TCP: the controller's security group and the nodes' (every
    compute node and login node carries it on each interface). Both groups allow no egress of their own
    (our security groups are declared without AWS's allow-all), so each flow is an egress and an ingress.
    """
    lo, hi = ports.srun
    ctld, slurmd, dbd = ports.slurmctld, ports.slurmd, ports.slurmdbd
    rules = [
        SlurmRule("ctld-in", "cluster", "in", ctld, ctld, "nodes", "slurmctld from Slurm nodes"),
        SlurmRule("ctld-out", "nodes", "out", ctld, ctld, "cluster", "to slurmctld"),
        SlurmRule("slurmd-out", "cluster", "out", slurmd, slurmd, "nodes", "to slurmd and sackd"),
        SlurmRule("slurmd-in", "nodes", "in", slurmd, slurmd, "cluster", "slurmd from slurmctld"),
        SlurmRule("srun-out", "cluster", "out", lo, hi, "nodes", "to srun (job steps)"),
        SlurmRule("srun-in", "nodes", "in", lo, hi, "cluster", "srun from slurmctld"),
        # Between Slurm nodes: slurmd's message fan-out, srun on a login or batch node to slurmd, and
        # the steps' connections back to srun.
        SlurmRule("peer-slurmd-in", "nodes", "in", slurmd, slurmd, "nodes", "slurmd from Slurm nodes"),
        SlurmRule("peer-slurmd-out", "nodes", "out", slurmd, slurmd, "nodes", "to slurmd"),
        SlurmRule("peer-srun-in", "nodes", "in", lo, hi, "nodes", "srun from Slurm nodes"),
        SlurmRule("peer-srun-out", "nodes", "out", lo, hi, "nodes", "to srun"),
    ]
    if accounting:
        rules += [SlurmRule("dbd-in", "cluster", "in", dbd, dbd, "nodes",
                            "slurmdbd (sacct) from Slurm nodes"),
                  SlurmRule("dbd-out", "nodes", "out", dbd, dbd, "cluster", "to slurmdbd")]
    return rules


CONFIG_SCRIPT = "scontrol show config"
"""What the login node runs for `parse_config` (after `slurm.remote.SLURM_PATH`)."""

_LINE = re.compile(r"^([\w\[\]]+)\s*=\s*(.*?)\s*$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class ConfigError(ValueError):
    """`scontrol show config` output without a port it must name, or with one that is not a port."""


def parse_config(output: str) -> dict[str, str]:
    """`scontrol show config`'s `Key = Value` lines as a mapping (other lines are skipped)."""
    return {m[1]: m[2] for line in output.splitlines() if (m := _LINE.match(line.strip()))}


def _range(config: dict[str, str], key: str) -> tuple[int, int] | None:
    value = config.get(key)
    if value is None:
        return None
    found = _RANGE.match(value)
    if found is None:
        raise ConfigError(f"{key} = {value!r} is not a port or a port range")
    lo = int(found[1])
    return lo, int(found[2] or lo)


def ports_of(config: dict[str, str], *, accounting: bool) -> SlurmPorts:
    """The ports a Slurm's config says it uses. SlurmctldPort may be a range (slurm.conf(5)): every port
    of it must pass, so its first stands for it here only when the range is one port (else ConfigError);
    SrunPortRange `0-0` (or none) means any ephemeral port, which no rule of ours allows (ConfigError).
    AccountingStoragePort is read with accounting; otherwise slurmdbd's default stands."""
    ctld, slurmd, srun = (_range(config, k) for k in ("SlurmctldPort", "SlurmdPort", "SrunPortRange"))
    if ctld is None or slurmd is None:
        raise ConfigError("no SlurmctldPort or SlurmdPort in `scontrol show config`")
    if ctld[0] != ctld[1]:
        raise ConfigError(f"SlurmctldPort is a range ({ctld[0]}-{ctld[1]}): gpucluster's rules allow "
                          "one port")
    if srun is None or srun == (0, 0):
        raise ConfigError("SrunPortRange is not set (0-0): srun listens on any ephemeral port, which the "
                          "security groups do not allow between nodes")
    dbd = _range(config, "AccountingStoragePort") if accounting else None
    return SlurmPorts(ctld[0], slurmd[0], dbd[0] if dbd and dbd[0] else SLURMDBD_PORT, srun)
