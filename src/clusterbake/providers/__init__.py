"""Providers behind one interface (providers.base.Provider)."""

from __future__ import annotations

from clusterbake.config import ClusterConfig
from clusterbake.providers.base import Provider
from clusterbake.state import StateDir


def get_provider(config: ClusterConfig, state: StateDir | None = None) -> Provider:
    state = state or StateDir.for_config(config)
    if config.provider == "local":
        from clusterbake.providers.local.provider import LocalProvider

        return LocalProvider(config, state)
    if config.provider == "aws":
        from clusterbake.providers.aws.provider import AwsProvider

        return AwsProvider(config, state)
    if config.provider == "azure":
        from clusterbake.providers.azure.provider import AzureProvider

        return AzureProvider(config, state)
    raise NotImplementedError(f"provider {config.provider}")
