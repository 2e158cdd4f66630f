"""Environ: this process's environment pointed at a twin, for in-process SDK calls (the Azure SDK
reads the environment when a client is made). Shared by tests/azure and tests/twin (pythonpath tests)."""

from __future__ import annotations

import os


class Environ:
    """Context: os.environ updated with `env`, restored on exit."""

    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, {}

    def __enter__(self):
        for key, value in self.env.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
