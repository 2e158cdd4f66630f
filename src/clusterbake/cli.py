"""The `clusterbake` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from clusterbake import cluster
from clusterbake.config import (
    DEFAULT_CONFIG,
    ClusterConfig,
    check_accounting_files,
    check_directory_files,
    extra_ca_files,
    load_config,
)
from clusterbake.errors import ClusterbakeError, CommandFailed, ConfigError
from clusterbake.progress import say
from clusterbake.providers import get_provider
from clusterbake.state import StateDir


def _config_path(args: argparse.Namespace) -> Path:
    return Path(args.config or os.environ.get("CLUSTERBAKE_CONFIG") or DEFAULT_CONFIG)


def _load(args: argparse.Namespace) -> ClusterConfig:
    return load_config(_config_path(args))


def cmd_validate(args: argparse.Namespace) -> int:
    config = _load(args)
    check_accounting_files(config)
    check_directory_files(config)
    static = sum(g.static_count for g in config.node_groups)
    elastic = sum(g.max_nodes - g.static_count for g in config.node_groups)
    extra = f" + up to {elastic} elastic" if elastic else ""
    login = f"{config.login_nodes.count} login, " if config.login_nodes else ""
    shape = f"1 head, {login}{static} compute{extra}"
    print(f"{_config_path(args)}: valid ({config.provider} cluster {config.cluster_name}: {shape})")
    if config.provider == "local":
        from clusterbake.providers.local.provider import LocalProvider

        for line in LocalProvider(config, StateDir.for_config(config)).host_limit_report():
            print(f"  {line}")
    return 0


def cmd_image_use(args: argparse.Namespace) -> int:
    provider = get_provider(_load(args))
    image = provider.find_image()
    moved = provider.use_image(image)
    name = cluster.image_name(str(image))
    print(f"cluster image: {name}" + ("" if moved else " (already)") + "; running nodes keep theirs until replaced")
    return 0


def cmd_image_versions(args: argparse.Namespace) -> int:
    from clusterbake.images import matrix

    config = _load(args)
    rows = matrix.pairs(matrix.load(args.manifest), config.provider)
    print(f"GPU stack of {config.provider} images ({args.manifest or matrix.MANIFEST}):")
    for line in matrix.render(rows):
        print(f"  {line}")
    bad = matrix.failures(rows)
    if bad:
        sys.stdout.flush()
        print("incompatible:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0


def cmd_image_build(args: argparse.Namespace) -> int:
    from clusterbake.images import matrix
    from clusterbake.images.base import get_builder

    config = _load(args)
    extra_ca_files(config)  # bad paths are input errors: fail before building anything
    matrix.require_compatible(config.provider)  # a stack that cannot work is refused before any build or cloud call
    get_builder(config.provider).build(config, StateDir.for_config(config), force=args.force)
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from clusterbake import dry_run

    if args.json and not args.dry_run:
        raise ConfigError("--json: the plan of --dry-run only (cluster status --json for the cluster)")
    config = _load(args)
    summary = cluster.up(
        config,
        _config_path(args),
        provision_only=args.provision_only,
        reconfigure=args.reconfigure,
        dry_run=args.dry_run,
        max_cost_per_hour=args.max_cost_per_hour,
    )
    if "dry_run" in summary:
        plan = summary["dry_run"]
        print(json.dumps(plan.to_json(), indent=2) if args.json else dry_run.format_plan(plan, config.cluster_name,
                                                                                          config.provider))  # fmt: skip
        dry_run.check_cost_limit(plan, *summary["cost_limit"])
        return 0
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
    newest = report["newest_image"]
    moved = ""
    if newest != report["image"]:
        moved = f" (newest built: {newest}; `clusterbake ops image_update` moves the nodes)"
    print(f"cluster {report['cluster']} ({report['provider']}), image {report['image'] or '-'}{moved}")
    width = max([5, *(len(n["image"] or "-") for n in report["nodes"])])
    print(f"{'NODE':<12} {'ROLE':<8} {'GROUP':<10} {'ADDRESS':<15} {'STATE':<9} {'IMAGE':<{width}} SLURM")
    for node in report["nodes"]:
        print(
            f"{node['name']:<12} {node['role']:<8} {node['nodegroup']:<10} {node['address'] or '-':<15} "
            f"{node['state']:<9} {node['image'] or '-':<{width}} {node['slurm_state'] or '-'}"
        )
    for node in report["nodes"]:
        if node["state"] not in ("running", "stopped", "absent") and node.get("detail"):
            print(f"{node['name']}: {node['detail']}")
    if report["slurm_error"]:
        sys.stdout.flush()  # the table first, also when both streams go to one pipe
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


def cmd_cluster_publish(args: argparse.Namespace) -> int:
    changes = cluster.publish(_load(args))
    print("\n".join(changes) if changes else "no node's join bundle changed")
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    from clusterbake import remote

    provider = get_provider(_load(args))
    words = args.extra or args.command
    # As with ssh: the words are joined into one shell command line (`-- 'squeue | wc -l'` works).
    return remote.interactive(provider.endpoint(args.node), " ".join(words) if words else None)


def cmd_token(args: argparse.Namespace) -> int:
    from clusterbake import rest_api

    config = _load(args)
    token = rest_api.issue(config, get_provider(config), args.user, args.lifespan)
    print(f"SLURM_JWT={token.jwt}")
    print(
        f"a token for {token.user}, valid {token.lifespan} s: send it to {token.url}/slurm/{rest_api.API_VERSION}/... "
        f"from the cluster's network with headers X-SLURM-USER-NAME: {token.user} and X-SLURM-USER-TOKEN "
        "(docs/users.md)",
        file=sys.stderr,
    )
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    from clusterbake import fanout

    if not args.extra:
        raise ConfigError("exec: give the command after --, e.g. `clusterbake exec --group cpu -- uptime`")
    try:
        stdin = Path(args.stdin).read_bytes() if args.stdin else None
    except OSError as exc:
        raise ConfigError(f"exec --stdin: cannot read {args.stdin} ({exc.strerror})") from None
    provider = get_provider(_load(args))
    names = fanout.select(provider, args.group, args.nodes)
    log = provider.cluster.logs / f"exec-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    rows = fanout.run(provider, names, " ".join(args.extra), args.timeout, log, stdin=stdin)
    print(fanout.table(rows))
    tried = [r for r in rows if r.tried]
    bad = fanout.failed(rows)
    skipped = len(rows) - len(tried)
    print(
        f"{len(tried) - len(bad)} of {len(tried)} nodes exited 0"
        + (f"; {skipped} not running, not tried" if skipped else "")
        + f"; full output: {log}"
    )
    return 1 if bad else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from clusterbake import jobs, sweep

    config = _load(args)
    _, available = jobs.partition_nodes(config, args.partition)
    sizes = sweep.parse_sizes(args.nodes, available)
    logs = StateDir.for_config(config).cluster(config.cluster_name).logs
    out = Path(args.out) if args.out else logs / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    script = " ".join(args.extra) if args.extra else "examples/deepspeed/train.py"
    points = sweep.run(config, sizes, out, script_args=args.extra or None, partition=args.partition, steps=args.steps)
    print(sweep.write(points, out, config.provider, f"{config.cluster_name}: {script}"))
    print(f"written: {out}/sweep.txt, sweep.json and sweep.png")
    return 0 if all(p.tokens_per_s for p in points) else 1


_FATAL = re.compile(
    r"^(?:fatal: \[(?P<host>[^\]]+)\]: FAILED! => |failed: \[(?P<item_host>[^\]]+)\] \(item=.*?\) => )"
    r"(?P<result>\{.*\})$"
)


def failure_messages(lines: list[str]) -> list[str]:
    """The messages of the tasks that failed in an ansible-playbook output (`fatal: [head]: FAILED! =>
    {"msg": ...}`): an ops playbook says there why it stopped."""
    messages = []
    for line in lines:
        match = _FATAL.match(line)
        if not match:
            continue
        try:
            result = json.loads(match["result"])
        except ValueError:
            continue
        message = result.get("msg") or result.get("stderr") or "failed"
        messages.append(f"{match['host'] or match['item_host']}: {' '.join(str(message).split())}")
    return messages


def ops_playbooks() -> list[str]:
    from clusterbake.paths import repo_root

    return sorted(p.stem for p in (repo_root() / "ansible" / "ops").glob("*.yml"))


def cmd_ops(args: argparse.Namespace) -> int:
    from clusterbake.ansible import ansible_env, run_playbook
    from clusterbake.cluster import INVENTORY_SCRIPTS
    from clusterbake.paths import repo_root

    playbooks = ops_playbooks()
    if args.playbook not in playbooks:
        raise ConfigError(f"ops: no playbook {args.playbook!r}; there are: {', '.join(playbooks)}")
    config = _load(args)
    state = StateDir.for_config(config)
    log_file = state.cluster(config.cluster_name).logs / f"ops-{args.playbook}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    say(f"    log: {log_file}")
    variables = {}
    for pair in args.extra_vars:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"ops -e {pair!r}: give KEY=VALUE, e.g. -e nodes=cpu-[1-2]")
        variables[key] = value
    # One JSON document: a value keeps its spaces (`-e "reason=disk errors"`), which Ansible's own
    # key=value parsing would split.
    extra = ["-e", json.dumps(variables)] + (["--check", "--diff"] if args.check else [])
    try:
        result = run_playbook(
            f"ops/{args.playbook}.yml",
            repo_root() / "inventories" / INVENTORY_SCRIPTS[config.provider],
            log_file,
            ansible_env(_config_path(args), state.root),
            extra,
        )
    except CommandFailed as exc:
        reasons = failure_messages(log_file.read_text().splitlines())
        if not reasons:
            raise
        raise CommandFailed(f"ops {args.playbook}: {'; '.join(reasons)}\nfull log: {log_file}", exc.log_file) from None
    print(f"ops {args.playbook}: {result.ok} ok, {result.changed} changed" + (" (check mode)" if args.check else ""))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from clusterbake import doctor

    config = _load(args)
    findings = doctor.diagnose(config, get_provider(config))
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if f.status == doctor.FAIL]
    print(f"{len(failed)} problem(s) found" if failed else "no problem found")
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    from clusterbake import report
    from clusterbake.prometheus import Prometheus

    config = _load(args)
    if not config.monitoring.enabled:
        raise ConfigError(
            f"report: monitoring.enabled is false in {_config_path(args)}: the head runs no Prometheus; "
            "set it to true (the default) and run `clusterbake cluster up`"
        )
    provider = get_provider(config)
    logs = provider.cluster.logs
    out = Path(args.out) if args.out else logs / f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    text = report.report(
        Prometheus(provider.endpoint("head")),
        out,
        since=args.since,
        until=args.until,
        scrape_interval=config.monitoring.scrape_interval,
        cluster=config.cluster_name,
        provider=config.provider,
    )
    print(text)
    print(f"written: {out}/report.png, report.json and report.txt")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    provider = get_provider(_load(args))
    if args.action == "replace":
        from clusterbake.replace import replace

        image = replace(provider, args.names, newest=args.image == "newest", force=args.force)
        print(f"node {', '.join(args.names)}: replaced, on {cluster.image_name(image)}")
        return 0
    if len(args.names) != 1:
        raise ConfigError(f"node {args.action}: give one node, not {len(args.names)}")
    name = args.names[0]
    if args.action == "interrupt":
        provider.interrupt_node(name, args.seconds)
        print(f"node {name}: reclaimed")
        return 0
    if args.action == "stop":
        provider.stop_node(name)
    else:
        provider.start_node(name)
    print(f"node {name}: {'stopped' if args.action == 'stop' else 'running'}")
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
        container=args.container,
    )
    print(f"submitted job {job_id} (output: {output})", flush=True)
    if not args.wait:
        return 0
    final = jobs.follow(head, job_id, output, raw=args.raw)
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


def cmd_permissions(args: argparse.Namespace) -> int:
    config = _load(args)
    if config.provider == "local":
        print("provider local: nothing of a cloud; `make deps` needs root on this machine")
        return 0
    if config.provider == "azure":
        from clusterbake.providers.azure import permissions as azure_permissions

        print(json.dumps(azure_permissions.role_definition(config), indent=2))
        for grant in azure_permissions.chosen(config):
            say(f"    {grant.name}: {grant.why}")
        return 0
    from clusterbake.providers.aws import permissions

    commands = tuple(c.strip() for c in args.commands.split(","))
    unknown = sorted(set(commands) - {"cluster", "image"})
    if unknown:
        raise ConfigError(f"--commands: {', '.join(unknown)}: the commands are cluster and image")
    print(json.dumps(permissions.policy(config, account=args.account, commands=commands), indent=2))
    for grant in permissions.chosen(config, commands):
        say(f"    {grant.sid}: {grant.why}")
    return 0


def cmd_twin(args: argparse.Namespace) -> int:
    if args.cloud == "azure":
        from clusterbake.twins.azure import control
    else:
        from clusterbake.twins.aws import control

    state = StateDir.for_config(_load(args))
    if args.twin_command == "up":
        from clusterbake.twins import host

        env = control.up(_load(args), state)
        print("\n".join(host.shell_exports(env, control.SECRET_ENV, control.twin_dir(state))))
        say(
            f'    use it: eval "$(clusterbake twin up {args.cloud})" (prints the lines above), '
            "then any clusterbake command"
        )
    elif args.twin_command == "image":
        print(control.node_image(_load(args), state))
    elif args.twin_command == "status":
        print(json.dumps(control.status(state), indent=2))
    else:
        removed = control.down(state)
        for item in removed:
            say(f"    removed {item}")
        if not removed:
            say("    nothing to remove")
    return 0


CONFIG_HELP = f"cluster config file (default: $CLUSTERBAKE_CONFIG or {DEFAULT_CONFIG})"


def _config_after_subcommands(parser: argparse.ArgumentParser) -> None:
    """-c/--config accepted after any subcommand too (`clusterbake validate --config FILE`); given
    there, it wins over one given before the subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("-c", "--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
                _config_after_subcommands(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clusterbake", description=__doc__)
    parser.add_argument("-c", "--config", help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command_name", required=True)

    sub.add_parser("validate", help="check the config file and exit").set_defaults(func=cmd_validate)

    image = sub.add_parser("image", help="node images").add_subparsers(dest="image_command", required=True)
    build = image.add_parser("build", help="bake the node image with packer (reused when inputs are unchanged)")
    build.add_argument("--force", action="store_true", help="rebuild even if an image for these inputs exists")
    build.set_defaults(func=cmd_image_build)
    versions = image.add_parser(
        "versions",
        help="the GPU stack's versions checked against the vendors' compatibility rules (exit 1: a pair cannot work)",
    )
    versions.add_argument("--manifest", type=Path, help="a version manifest other than the repository's versions.yml")
    versions.set_defaults(func=cmd_image_versions)
    image.add_parser(
        "use",
        help="make the newest image built the cluster's: new, replaced and powered-up nodes boot it "
        "(running ones keep theirs; ops image_update moves them)",
    ).set_defaults(func=cmd_image_use)

    clus = sub.add_parser("cluster", help="cluster lifecycle").add_subparsers(dest="cluster_command", required=True)
    up = clus.add_parser("up", help="create or update the cluster; idempotent")
    up.add_argument("--provision-only", action="store_true", help="create the nodes, skip configuration")
    up.add_argument(
        "--reconfigure",
        action="store_true",
        help="run the configure play even when nothing changed since the last one (no drift found)",
    )
    up.add_argument(
        "--dry-run",
        action="store_true",
        help="run every read-only check (quota, capacity offered, subnet room, image), print what would be made "
        "node by node and its price per hour, create nothing",
    )
    up.add_argument(
        "--max-cost-per-hour",
        type=float,
        metavar="USD",
        help="refuse a plan over this price per hour with every elastic node up (overrides max_cost_per_hour)",
    )
    up.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    up.set_defaults(func=cmd_cluster_up)
    st = clus.add_parser("status", help="nodes and their Slurm state")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_cluster_status)
    clus.add_parser(
        "down", help="remove every node and all cluster state, then say what still bills (exit 1: something does)"
    ).set_defaults(func=cmd_cluster_down)
    clus.add_parser(
        "publish",
        help="after ansible/cluster.yml ran outside `cluster up` (ops playbooks): hand the join bundles to the "
        "nodes and record the configure as applied",
    ).set_defaults(func=cmd_cluster_publish)

    perms = sub.add_parser(
        "permissions",
        help="what the operator needs for this config: aws, an IAM policy document (--account, --commands); "
        "azure, a custom role (az role definition create --role-definition @file)",
    )
    perms.add_argument("--account", default="*", help="the account id in the resource ARNs (default: *)")
    perms.add_argument(
        "--commands", default="cluster,image", help="cluster (up, down, status, node, ops, job), image, or both"
    )
    perms.set_defaults(func=cmd_permissions)

    ssh = sub.add_parser("ssh", help="run a command on a node (head answers to `head`)")
    ssh.add_argument("node")
    ssh.add_argument("command", nargs="*", help="the command (after --)")
    ssh.set_defaults(func=cmd_ssh)

    token = sub.add_parser(
        "token", help="a JSON Web Token of a cluster user for Slurm's REST API (rest_api.enabled): SLURM_JWT=..."
    )
    token.add_argument("user", help="a user the head knows (the config's users, or the directory's)")
    token.add_argument("--lifespan", type=int, default=3600, help="seconds the token is valid (default 3600)")
    token.set_defaults(func=cmd_token)

    job = sub.add_parser("job", help="submit job templates and report on jobs").add_subparsers(
        dest="job_command", required=True
    )
    submit = job.add_parser("submit", help="copy a job template to the cluster and sbatch it")
    submit.add_argument("template", help="a file, or a name from scripts/jobs (deepspeed, hello-distributed, ...)")
    submit.add_argument("--nodes", help="node count or `all` (default: all nodes of the partition)")
    submit.add_argument("--partition", help="default: the default partition")
    submit.add_argument("--user", help="run as this cluster user (default: the config's first user)")
    submit.add_argument("--job-name", help="default: the template's name; names the checkpoint directory")
    submit.add_argument("--upload", metavar="DIR", help="copy DIR to /shared/jobs/<user>/<its name> first")
    submit.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="GPUs asked per node (default: all of the partition's smallest node, as Slurm knows them; 0: none)",
    )
    submit.add_argument(
        "--container",
        metavar="IMAGE",
        help="run the job's steps in this image: a directory from clusterbake-container import "
        "(srun --container), or with Pyxis an image reference or .sqsh file (docs/containers.md)",
    )
    submit.add_argument("--wait", action="store_true", help="stream the output; exit with the job's status")
    submit.add_argument(
        "--raw", action="store_true", help="with --wait: the training's event lines as JSON, not as progress lines"
    )
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
        ("image", "only build (or find) its node image, as `up` does first; prints the image's directory"),
        ("status", "the twin's endpoint, ids and instances (JSON)"),
        ("down", "stop it: every node, namespace, the bridge and its state go"),
    ):
        command = twin.add_parser(name, help=text)
        command.add_argument("cloud", choices=["aws", "azure"])
        command.set_defaults(func=cmd_twin)

    fan = sub.add_parser("exec", help="a command on many nodes at once: a table of exit status and first line")
    which = fan.add_mutually_exclusive_group()
    which.add_argument("--group", help="the nodes of this node group (`head`: the head); default: every node")
    which.add_argument("--nodes", metavar="HOSTLIST", help="these nodes, e.g. 'cpu-[1-4],head'")
    fan.add_argument("--timeout", type=float, default=120, help="seconds per node (default 120)")
    fan.add_argument(
        "--stdin", metavar="FILE", help="give every node's command FILE on its standard input (never logged)"
    )
    fan.epilog = "The command goes after -- (one shell command line, as with ssh)."
    fan.set_defaults(func=cmd_exec)

    sw = sub.add_parser("sweep", help="train at several node counts: tokens/s, efficiency (under 70%% flagged), a plot")
    sw.add_argument("--nodes", default="1,2,4,8", help="node counts, e.g. 1,2,4,8 (default)")
    sw.add_argument("--partition", help="default: the default partition")
    sw.add_argument("--steps", type=int, default=20, help="steps of the example at each size (default 20)")
    sw.add_argument("--out", help="directory for sweep.txt/.json/.png (default: the cluster's logs)")
    sw.epilog = "After --: the training script and its arguments, as for `job submit deepspeed` (default: the example)."
    sw.set_defaults(func=cmd_sweep)

    names = ", ".join(ops_playbooks())
    ops = sub.add_parser("ops", help=f"run an ops playbook of ansible/ops on the live cluster ({names})")
    ops.add_argument("playbook", help=f"its name: {names} (ansible/ops/README.md says what each does)")
    ops.add_argument("-e", dest="extra_vars", action="append", default=[], metavar="KEY=VALUE", help="its variables")
    ops.add_argument("--check", action="store_true", help="say what would change, change nothing")
    ops.set_defaults(func=cmd_ops)

    sub.add_parser(
        "doctor", help="host prerequisites, nodes, Slurm daemons, munge, mounts and fabric, each problem with a fix"
    ).set_defaults(func=cmd_doctor)

    rep = sub.add_parser("report", help="plots of nodes, jobs and utilisation over a period (the head's Prometheus)")
    rep.add_argument("--since", default="1h", help="start: a duration ago (30m, 6h, 7d) or a date/time (default 1h)")
    rep.add_argument("--until", default="now", help="end: `now` (default), a duration ago or a date/time")
    rep.add_argument("--out", help="directory for report.png, report.json, report.txt (default: the cluster's logs)")
    rep.set_defaults(func=cmd_report)

    node = sub.add_parser(
        "node", help="stop, start or replace nodes, or rehearse a spot reclaim (interrupt: a notice, then it goes)"
    )
    node.add_argument("action", choices=["start", "stop", "replace", "interrupt"])
    node.add_argument("names", nargs="+", metavar="NAME", help="the node (replace: one or more compute nodes)")
    node.add_argument(
        "--image",
        choices=["current", "newest"],
        default="current",
        help="replace: a new disk from the cluster's image (current) or the newest built (it becomes the cluster's)",
    )
    node.add_argument(
        "--force", action="store_true", help="replace: even when Slurm does not show the node drained and idle"
    )
    node.add_argument(
        "--in", dest="seconds", type=int, default=120, help="interrupt: seconds from the notice to the reclaim"
    )
    node.epilog = (
        "replace gives each node a new disk (an instance) and boots it; it joins by itself. It refuses a node "
        "that is not drained and idle in Slurm: `clusterbake ops replace -e node=NAME` drains it and waits first."
    )
    node.set_defaults(func=cmd_node)
    _config_after_subcommands(parser)
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
