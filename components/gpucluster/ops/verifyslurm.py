"""`verify`'s checks of a Slurm stack's nodes as Slurm itself sees them, through its login node.

It owns two checks `ops.verifyfeatures.feature_checks` plans on a Slurm stack:
- every running compute instance of the stack registered with Slurm: the stack's EC2 instances
  (its identity tag, not the login group's: login nodes run sackd and are no Slurm nodes) against
  `sinfo`'s node list (NodeAddr or an EC2 host name), by private IP. A node launched less than
  REGISTER_GRACE ago may still be booting and is only counted; an older one missing fails (it
  cannot reach the PCS endpoint, its AMI lacks the agent, ...).
- Slurm's ports allowed by the security groups the stack created: `scontrol show config` on the
  login node (SlurmctldPort, SlurmdPort, SrunPortRange, AccountingStoragePort) turned into the
  flows `slurm.ports.slurm_rules` lists, each looked for as an ingress and an egress rule of the
  controller's and the nodes' security groups (DescribeSecurityGroups by the stack's tag and their
  names, DescribeSecurityGroupRules).
Both run one script through the one SSM runner (`ops.slurmjobs.run_script`, over
`fleet.runcommand`); read-only. A check that cannot run raises `Unknown`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG
from gpucluster.ops.verifycheck import Deployed, Outcome, Unknown

REGISTER_GRACE = timedelta(minutes=10)
"""How long a compute node may take from launch to register (its boot and the PCS agent's start)."""
REMOTE_SECONDS = 120


def _on_login(deployed: Deployed, script: str, what: str) -> str:
    """`script` on the stack's login node: its output, or Unknown when it cannot run."""
    from gpucluster.ops.slurmjobs import SlurmError, find_login_node, run_script

    try:
        login = find_login_node(deployed.spec, clients=deployed.clients)
    except SlurmError as err:
        raise Unknown(str(err)) from None
    done = run_script(deployed.clients("ssm"), login.instance_id, script,
                      comment=f"gpucluster verify: {what}", timeout_seconds=REMOTE_SECONDS)
    if not done.ok:
        raise Unknown(f"{what} on the login node {login.instance_id}: {done.error_line()}")
    return done.stdout


def check_nodes_registered(deployed: Deployed, now: datetime | None = None) -> Outcome:
    """Every compute instance running longer than REGISTER_GRACE is in Slurm's node list."""
    from gpucluster.ops.slurmjobs import stack_instances
    from gpucluster.slurm.remote import RemoteError, nodes_script, parse_sinfo

    now = now or datetime.now(UTC)
    instances = stack_instances(deployed.clients("ec2"), deployed.spec.identity, states=("running",))
    running = [i for i in instances if _tag(i, NODE_GROUP_TAG) not in (None, SLURM_LOGIN_GROUP)]
    if not running:
        return Outcome("pass", "no compute instance runs (every group at zero): none to register")
    try:
        nodes = parse_sinfo(_on_login(deployed, nodes_script(), "sinfo"))
    except RemoteError as err:
        raise Unknown(f"sinfo's output: {err}") from None
    registered = {n.private_ip for n in nodes if n.private_ip}
    missing, booting = [], 0
    for instance in sorted(running, key=lambda i: str(i["InstanceId"])):
        if instance.get("PrivateIpAddress") in registered:
            continue
        launched = instance.get("LaunchTime")
        if launched is not None and now - launched < REGISTER_GRACE:
            booting += 1
            continue
        up = f", up {int((now - launched).total_seconds() // 60)} min" if launched is not None else ""
        missing.append(f"{instance['InstanceId']} ({instance.get('PrivateIpAddress')}, "
                       f"{_tag(instance, NODE_GROUP_TAG)}{up})")
    still = f"; {booting} launched under {int(REGISTER_GRACE.total_seconds() // 60)} min ago, not yet" \
        if booting else ""
    if missing:
        return Outcome("fail", f"not in Slurm's node list: {', '.join(missing)}{still}",
                       "read the instance's console output (`aws ec2 get-console-output`): a node that "
                       "cannot reach the PCS endpoint (no NAT and no pcs endpoint), or an AMI without the "
                       "PCS agent and Slurm, never registers and PCS replaces it")
    return Outcome("pass", f"{len(running) - booting} running compute instance(s) registered with Slurm "
                   f"({len(nodes)} node(s) in sinfo){still}")


def _tag(instance: dict[str, Any], key: str) -> str | None:
    return next((str(t["Value"]) for t in instance.get("Tags", []) if t.get("Key") == key), None)


def _security_groups(deployed: Deployed) -> dict[str, str]:
    """The controller's and the nodes' security group ids ("cluster", "nodes"), by the stack's tag and
    the names `aws.pcs.SlurmCluster` gives them; Unknown when either is not found once."""
    label = deployed.spec.cluster.name
    names = {f"{label}-slurm-controller": "cluster", f"{label}-slurm-nodes": "nodes"}
    pages = deployed.clients("ec2").get_paginator("describe_security_groups").paginate(
        Filters=[{"Name": f"tag:{STACK_TAG}", "Values": [deployed.spec.identity]},
                 {"Name": "tag:Name", "Values": sorted(names)}])
    found: dict[str, list[str]] = {"cluster": [], "nodes": []}
    for page in pages:
        for group in page["SecurityGroups"]:
            role = names.get(_tag(group, "Name") or "")
            if role is not None:
                found[role].append(str(group["GroupId"]))
    for role, ids in found.items():
        if len(ids) != 1:
            whose = "controller" if role == "cluster" else "nodes"
            raise Unknown(f"{len(ids)} security groups tagged {STACK_TAG}={deployed.spec.identity} are the "
                          f"Slurm {whose}' ({', '.join(ids) or 'none'})")
    return {role: ids[0] for role, ids in found.items()}


def _allows(rules: list[dict[str, Any]], group: str, egress: bool, ports: tuple[int, int], peer: str) -> bool:
    """Some rule of `group` in that direction lets TCP `ports` to/from security group `peer`."""
    for rule in rules:
        if rule.get("GroupId") != group or bool(rule.get("IsEgress")) != egress:
            continue
        if (rule.get("ReferencedGroupInfo") or {}).get("GroupId") != peer:
            continue
        protocol = str(rule.get("IpProtocol"))
        if protocol == "-1" or (protocol in ("tcp", "6") and int(rule.get("FromPort", -1)) <= ports[0]
                                and ports[1] <= int(rule.get("ToPort", -1))):
            return True
    return False


def check_slurm_ports(deployed: Deployed) -> Outcome:
    """The ports the running Slurm uses (`scontrol show config`) pass both security groups, both ways."""
    from gpucluster.slurm.ports import CONFIG_SCRIPT, ConfigError, parse_config, ports_of, slurm_rules
    from gpucluster.slurm.remote import SLURM_PATH

    accounting = deployed.spec.scheduler.accounting
    script = f"set -eu\n{SLURM_PATH}\n{CONFIG_SCRIPT}\n"
    config = parse_config(_on_login(deployed, script, "scontrol show config"))
    try:
        ports = ports_of(config, accounting=accounting)
    except ConfigError as err:
        return Outcome("fail", f"Slurm's config: {err}", "compare `scontrol show config` on the login node "
                       "with gpucluster's rules (slurm/ports.py) and the PCS cluster's settings")
    groups = _security_groups(deployed)
    ec2 = deployed.clients("ec2")
    pages = ec2.get_paginator("describe_security_group_rules").paginate(
        Filters=[{"Name": "group-id", "Values": sorted(groups.values())}])
    rules = [r for page in pages for r in page["SecurityGroupRules"]]
    missing = [f"{rule.group} {rule.direction} {rule.from_port}"
               + (f"-{rule.to_port}" if rule.to_port != rule.from_port else "") + f" ({rule.why})"
               for rule in slurm_rules(accounting, ports)
               if not _allows(rules, groups[rule.group], rule.direction == "out",
                              (rule.from_port, rule.to_port), groups[rule.peer])]
    said = (f"slurmctld {ports.slurmctld}, slurmd {ports.slurmd}, srun {ports.srun[0]}-{ports.srun[1]}"
            + (f", slurmdbd {ports.slurmdbd}" if accounting else ""))
    if missing:
        return Outcome("fail", f"Slurm uses {said}; the security groups do not allow: {'; '.join(missing)}",
                       "`pulumi up` puts the stack's rules back; if Slurm's ports differ from gpucluster's "
                       "(slurm/ports.py), file an issue with `scontrol show config`")
    return Outcome("pass", f"Slurm's ports ({said}) allowed both ways between the controller and the nodes")
