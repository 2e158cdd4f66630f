"""What every part of the schema shares: the strict model base, the name pattern, the default file."""

from __future__ import annotations

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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
