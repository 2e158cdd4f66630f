"""The `--list` / `--host` protocol of Ansible dynamic inventory scripts."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.providers import get_provider


def main(provider_name: str, argv: list[str], default_config: Path, dump: Callable[..., str]) -> int:
    parser = argparse.ArgumentParser(description=f"clusterbake {provider_name} inventory")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--list", action="store_true")
    group.add_argument("--host")
    args = parser.parse_args(argv)
    config_path = Path(os.environ.get("CLUSTERBAKE_CONFIG", default_config))
    try:
        config = load_config(config_path)
        if config.provider != provider_name:
            raise ClusterbakeError(f"{config_path}: provider is {config.provider}, not {provider_name}")
        inventory = get_provider(config).inventory()
    except ClusterbakeError as exc:
        print(f"clusterbake inventory: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print(dump(inventory, indent=2, sort_keys=True))
    else:
        print(dump(inventory["_meta"]["hostvars"].get(args.host, {}), indent=2, sort_keys=True))
    return 0
