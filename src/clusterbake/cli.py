"""The `clusterbake` command line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from clusterbake import cluster
from clusterbake.config import DEFAULT_CONFIG, ClusterConfig, extra_ca_files, load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.progress import say
from clusterbake.providers import get_provider
from clusterbake.state import StateDir


def _config_path(args: argparse.Namespace) -> Path:
    return Path(args.config or os.environ.get("CLUSTERBAKE_CONFIG") or DEFAULT_CONFIG)


def _load(args: argparse.Namespace) -> ClusterConfig:
    return load_config(_config_path(args))


def cmd_validate(args: argparse.Namespace) -> int:
    config = _load(args)
    static = sum(g.static_count for g in config.node_groups)
    elastic = sum(g.max_nodes - g.static_count for g in config.node_groups)
    extra = f" + up to {elastic} elastic" if elastic else ""
    shape = f"1 head, {static} compute{extra}"
    print(f"{_config_path(args)}: valid ({config.provider} cluster {config.cluster_name}: {shape})")
    return 0


def cmd_image_build(args: argparse.Namespace) -> int:
    from clusterbake.images.base import get_builder

    config = _load(args)
    extra_ca_files(config)  # bad paths are input errors: fail before building anything
    get_builder(config.provider).build(config, StateDir.for_config(config), force=args.force)
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    summary = cluster.up(
        _load(args), _config_path(args), provision_only=args.provision_only, reconfigure=args.reconfigure
    )
    if "changed" in summary:
        states = summary["slurm"].values()
        down = sum(1 for state in states if state.endswith("~"))
        powered_down = f", {down} powered down until jobs need them" if down else ""
        print(
            f"cluster {summary['cluster']} is up: {len(states) - down} compute nodes idle{powered_down}, "
            f"{summary['changed']} changed tasks" + ("" if summary["played"] else " (nothing to configure)")
        )
    else:
        print(f"cluster {summary['cluster']}: {summary['nodes']} nodes provisioned (--provision-only: not configured)")
    return 0


def cmd_cluster_status(args: argparse.Namespace) -> int:
    report = cluster.status(_load(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"cluster {report['cluster']} ({report['provider']}), image {report['image'] or '-'}")
    print(f"{'NODE':<12} {'ROLE':<8} {'GROUP':<10} {'ADDRESS':<15} {'STATE':<9} SLURM")
    for node in report["nodes"]:
        print(
            f"{node['name']:<12} {node['role']:<8} {node['nodegroup']:<10} {node['address'] or '-':<15} "
            f"{node['state']:<9} {node['slurm_state'] or '-'}"
        )
    if report["slurm_error"]:
        print(f"slurm: {report['slurm_error']}", file=sys.stderr)
    counts = report["summary"]
    shown = ("running", "stopped", "absent", "powered_down")
    others = [f"{n} {state}" for state, n in counts.items() if state not in shown]
    print(
        f"nodes: {counts['running']} running, {counts['stopped']} stopped, {counts['absent']} absent"
        + (f" ({counts['powered_down']} powered down in Slurm)" if counts["powered_down"] else "")
        + "".join(f", {o}" for o in others)
    )
    if report["cost"] is not None:
        for line in cost_lines(report["cost"]):
            print(line)
    return 0


def usd(amount: float) -> str:
    """$55.04, $0.4032, $0.00001: two decimals, or as many as a small price needs."""
    if amount == 0 or amount >= 1:
        return f"${amount:,.2f}"
    return "$" + f"{amount:.6f}".rstrip("0").rstrip(".")


def cost_lines(cost: dict) -> list[str]:
    """`cluster status`'s cost summary from the report's `cost` (CostEstimate.to_json)."""
    machines = cost["machines"]
    unpriced = [m for m in machines if m["per_hour"] is None]
    if cost["per_hour"] is None:
        total = f"unknown ({len(unpriced)} running instance(s), none priced)"
    elif unpriced:
        total = f"at least {usd(cost['per_hour'])} ({len(unpriced)} of {len(machines)} running instance(s) not priced)"
    else:
        total = usd(cost["per_hour"]) + ("" if machines or cost["note"] else " (nothing running)")
    lines = [f"cost per hour of what runs now (estimate): {total}" + (f"; {cost['note']}" if cost["note"] else "")]
    groups: dict[tuple, int] = {}
    for m in machines:
        key = (m["instance_type"], m["market"], m["per_hour"], m["source"])
        groups[key] = groups.get(key, 0) + 1
    for (instance_type, market, per_hour, source), count in groups.items():
        price = f"{usd(per_hour)}/h each" if per_hour is not None else "price unknown"
        lines.append(f"  {count} x {instance_type} {market}: {price} ({source.removeprefix('unknown: ')})")
    if cost["not_included"]:
        lines.append(f"  not included: {', '.join(cost['not_included'])}")
    return lines


def cmd_cluster_down(args: argparse.Namespace) -> int:
    _, check = cluster.down(_load(args))
    if check is None:
        return 0
    for what in check.unchecked:
        print(f"not checked: {what}")
    for item in sorted(check.leftovers, key=lambda item: not item.kept):  # what should not be there last
        print(f"still billing{', kept on purpose' if item.kept else ''}: {item.what}")
    if check.unexpected:
        return 1
    if check.leftovers:
        print("nothing else left billing")
    elif check.unchecked:
        print("nothing left billing among what could be checked")
    else:
        print("nothing left billing" + (f" ({check.note})" if check.note else ""))
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    from clusterbake import remote

    provider = get_provider(_load(args))
    words = args.extra or args.command
    # As with ssh: the words are joined into one shell command line (`-- 'squeue | wc -l'` works).
    return remote.interactive(provider.endpoint(args.node), " ".join(words) if words else None)


def cmd_node(args: argparse.Namespace) -> int:
    provider = get_provider(_load(args))
    if args.action == "stop":
        provider.stop_node(args.name)
    else:
        provider.start_node(args.name)
    print(f"node {args.name}: {'stopped' if args.action == 'stop' else 'running'}")
    return 0


def cmd_job_submit(args: argparse.Namespace) -> int:
    from clusterbake import jobs

    config = _load(args)
    extra = args.extra
    head, job_id, output = jobs.submit(
        config,
        args.template,
        nodes=args.nodes,
        partition=args.partition,
        user=args.user,
        job_name=args.job_name,
        upload_dir=Path(args.upload) if args.upload else None,
        args=extra,
        gpus=args.gpus_per_node,
    )
    print(f"submitted job {job_id} (output: {output})", flush=True)
    if not args.wait:
        return 0
    final = jobs.follow(head, job_id, output)
    _, text, mismatch = jobs.report(head, job_id)
    print(f"--- job {job_id}: {final.state}, exit status {final.exit_code}")
    print(text)
    return final.exit_code or mismatch


def cmd_job_report(args: argparse.Namespace) -> int:
    from clusterbake import jobs

    head = jobs.Head(get_provider(_load(args)))
    data, text, status = jobs.report(head, args.job_id)
    print(json.dumps(data, indent=2) if args.json else text)
    return status


def cmd_twin(args: argparse.Namespace) -> int:
    if args.cloud == "azure":
        from clusterbake.twins.azure import control
    else:
        from clusterbake.twins.aws import control

    state = StateDir.for_config(_load(args))
    if args.twin_command == "up":
        for key, value in control.up(_load(args), state).items():
            print(f"export {key}={shlex.quote(value)}")
        say(
            f'    use it: eval "$(clusterbake twin up {args.cloud})" (prints the lines above), '
            "then any clusterbake command"
        )
    elif args.twin_command == "status":
        print(json.dumps(control.status(state), indent=2))
    else:
        removed = control.down(state)
        for item in removed:
            say(f"    removed {item}")
        if not removed:
            say("    nothing to remove")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clusterbake", description=__doc__)
    parser.add_argument(
        "-c", "--config", help=f"cluster config file (default: $CLUSTERBAKE_CONFIG or {DEFAULT_CONFIG})"
    )
    sub = parser.add_subparsers(dest="command_name", required=True)

    sub.add_parser("validate", help="check the config file and exit").set_defaults(func=cmd_validate)

    image = sub.add_parser("image", help="node images").add_subparsers(dest="image_command", required=True)
    build = image.add_parser("build", help="bake the node image with packer (reused when inputs are unchanged)")
    build.add_argument("--force", action="store_true", help="rebuild even if an image for these inputs exists")
    build.set_defaults(func=cmd_image_build)

    clus = sub.add_parser("cluster", help="cluster lifecycle").add_subparsers(dest="cluster_command", required=True)
    up = clus.add_parser("up", help="create or update the cluster; idempotent")
    up.add_argument("--provision-only", action="store_true", help="create the nodes, skip configuration")
    up.add_argument(
        "--reconfigure",
        action="store_true",
        help="run the configure play even when nothing changed since the last one (no drift found)",
    )
    up.set_defaults(func=cmd_cluster_up)
    st = clus.add_parser("status", help="nodes and their Slurm state")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_cluster_status)
    clus.add_parser(
        "down", help="remove every node and all cluster state, then say what still bills (exit 1: something does)"
    ).set_defaults(func=cmd_cluster_down)

    ssh = sub.add_parser("ssh", help="run a command on a node (head answers to `head`)")
    ssh.add_argument("node")
    ssh.add_argument("command", nargs="*", help="the command (after --)")
    ssh.set_defaults(func=cmd_ssh)

    job = sub.add_parser("job", help="submit job templates and report on jobs").add_subparsers(
        dest="job_command", required=True
    )
    submit = job.add_parser("submit", help="copy a job template to the cluster and sbatch it")
    submit.add_argument("template", help="a file, or a name from scripts/jobs (deepspeed, hello-distributed, ...)")
    submit.add_argument("--nodes", help="node count or `all` (default: all nodes of the partition)")
    submit.add_argument("--partition", help="default: the default partition")
    submit.add_argument("--user", help="run as this cluster user (default: the config's first user)")
    submit.add_argument("--job-name", help="default: the template's name; names the checkpoint directory")
    submit.add_argument("--upload", metavar="DIR", help="copy DIR to /shared/<its name> first")
    submit.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="GPUs asked per node (default: all of the partition's smallest node, as Slurm knows them; 0: none)",
    )
    submit.add_argument("--wait", action="store_true", help="stream the output; exit with the job's status")
    submit.epilog = "Arguments after -- go to the template (e.g. the training script and its flags)."
    submit.set_defaults(func=cmd_job_submit)
    rep = job.add_parser("report", help="training summary and the transport the job really used")
    rep.add_argument("job_id")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_job_report)

    twin = sub.add_parser(
        "twin",
        help="a local emulator of a cloud whose instances boot as local nodes (aws: EC2 on moto; azure: an ARM fake)",
    ).add_subparsers(dest="twin_command", required=True)
    for name, text in (
        ("up", "start it (builds its node image first); prints the environment that points the SDK at it"),
        ("status", "the twin's endpoint, ids and instances (JSON)"),
        ("down", "stop it: every node, namespace, the bridge and its state go"),
    ):
        command = twin.add_parser(name, help=text)
        command.add_argument("cloud", choices=["aws", "azure"])
        command.set_defaults(func=cmd_twin)

    node = sub.add_parser("node", help="stop or start one node")
    node.add_argument("action", choices=["start", "stop"])
    node.add_argument("name")
    node.set_defaults(func=cmd_node)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` belongs to the remote command or template.
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.extra = extra
    try:
        return args.func(args)
    except ClusterbakeError as exc:
        print(f"clusterbake: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clusterbake: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
