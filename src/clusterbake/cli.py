"""The `clusterbake` command line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from clusterbake import cluster
from clusterbake.config import DEFAULT_CONFIG, ClusterConfig, extra_ca_files, load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.providers import get_provider
from clusterbake.state import StateDir


def _config_path(args: argparse.Namespace) -> Path:
    return Path(args.config or os.environ.get("CLUSTERBAKE_CONFIG") or DEFAULT_CONFIG)


def _load(args: argparse.Namespace) -> ClusterConfig:
    return load_config(_config_path(args))


def cmd_validate(args: argparse.Namespace) -> int:
    config = _load(args)
    nodes = sum(g.count for g in config.node_groups)
    print(f"{_config_path(args)}: valid ({config.provider} cluster {config.cluster_name}: 1 head, {nodes} compute)")
    return 0


def cmd_image_build(args: argparse.Namespace) -> int:
    from clusterbake.image import build_image

    config = _load(args)
    extra_ca_files(config)  # bad paths are input errors: fail before building anything
    if config.provider != "local":
        raise ClusterbakeError(f"image build for provider {config.provider} is not available yet")
    build_image(config, StateDir.for_config(config), force=args.force)
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    summary = cluster.up(_load(args), _config_path(args), provision_only=args.provision_only)
    if "changed" in summary:
        print(
            f"cluster {summary['cluster']} is up: {len(summary['slurm'])} compute nodes idle, "
            f"{summary['changed']} changed tasks"
        )
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
    return 0


def cmd_cluster_down(args: argparse.Namespace) -> int:
    cluster.down(_load(args))
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    provider = get_provider(_load(args))
    command = [c for c in args.command if c != "--"] if args.command[:1] == ["--"] else args.command
    argv = provider.ssh_argv(args.node, command, tty=sys.stdin.isatty() and not command)
    return subprocess.run(argv).returncode


def cmd_node(args: argparse.Namespace) -> int:
    provider = get_provider(_load(args))
    if args.action == "stop":
        provider.stop_node(args.name)
    else:
        provider.start_node(args.name)
    print(f"node {args.name}: {'stopped' if args.action == 'stop' else 'running'}")
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
    up.set_defaults(func=cmd_cluster_up)
    st = clus.add_parser("status", help="nodes and their Slurm state")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_cluster_status)
    clus.add_parser("down", help="remove every node and all cluster state").set_defaults(func=cmd_cluster_down)

    ssh = sub.add_parser("ssh", help="run a command on a node (head answers to `head`)")
    ssh.add_argument("node")
    ssh.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    ssh.set_defaults(func=cmd_ssh)

    node = sub.add_parser("node", help="stop or start one node")
    node.add_argument("action", choices=["start", "stop"])
    node.add_argument("name")
    node.set_defaults(func=cmd_node)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
