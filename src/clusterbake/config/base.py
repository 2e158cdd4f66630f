"""What every part of the schema shares: the strict model base, the name and Azure id patterns, the default file."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

DEFAULT_CONFIG = "clusterbake.yaml"

# Names end up in hostnames, Slurm node names and network device names.
NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=24)]
# Azure's identifiers, used by the azure: section and the Azure image's settings.
GUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
RESOURCE_GROUP_PATTERN = r"^[-\w.()]{0,89}[-\w()]$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_cidrs(values: list[str]) -> list[str]:
    """An ssh_cidrs validator: each a CIDR block."""
    for value in values:
        try:
            ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"'{value}' is not a CIDR block ({exc})") from None
    return values
