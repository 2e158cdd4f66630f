"""docs/config.md, generated from the schema so the reference cannot drift.

python -m clusterbake.config_reference > docs/config.md
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from clusterbake.config import (
    AmlfsStorage,
    AzureBlobStorage,
    AzureFilesStorage,
    ClusterConfig,
    EfsStorage,
    FsxLustreStorage,
    HostDirStorage,
    NfsStorage,
    StorageMount,
)

STORAGE_MODELS = {
    "hostdir": HostDirStorage,
    "nfs": NfsStorage,
    "efs": EfsStorage,
    "fsx_lustre": FsxLustreStorage,
    "azure_files": AzureFilesStorage,
    "amlfs": AmlfsStorage,
    "azure_blob": AzureBlobStorage,
}


def _type_name(annotation) -> str:
    if annotation is StorageMount or annotation == list[StorageMount] | None:
        return "list[storage entry, by type: " + " | ".join(STORAGE_MODELS) + "] | None"
    return _plain_type(annotation)


def _plain_type(annotation) -> str:
    """A type as the reader wants it: a model by its name (not its module), no Annotated constraints
    (patterns and validators are in the description's words)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _plain_type(args[0])
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(value) for value in args)}]"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_plain_type(arg) for arg in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_plain_type(arg) for arg in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", None) or re.sub(r"clusterbake\.config\.(\w+\.)?", "", str(annotation))


def _default(field) -> str:
    if field.default is not PydanticUndefined:
        return json.dumps(field.default) if not isinstance(field.default, BaseModel) else "(section)"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            return json.dumps([v.model_dump() for v in value])
        return json.dumps(value)
    return "required"


def _nested_models(annotation) -> list[tuple[str, type[BaseModel]]]:
    """(suffix of the section name, model) of the models a field holds, at any depth."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for tag, model in STORAGE_MODELS.items():
            if annotation is model:
                return [(f" (type: {tag})", model)]
        return [("", annotation)]
    found = []
    for arg in typing.get_args(annotation):
        for item in _nested_models(arg):
            if item not in found:
                found.append(item)
    return found


def render() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from `src/clusterbake/config/` by `python -m clusterbake.config_reference`;",
        "a unit test fails when it is out of date. Unknown keys are errors.",
        "",
    ]
    queue: list[tuple[str, type[BaseModel]]] = [("(top level)", ClusterConfig)]
    seen = set()
    while queue:
        path, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        lines += [f"## `{path}`", "", "| key | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            description = (field.description or "").replace("|", "\\|")
            type_name = _type_name(field.annotation).replace("|", "\\|")
            lines.append(f"| `{name}` | `{type_name}` | `{_default(field)}` | {description} |")
            for suffix, nested in _nested_models(field.annotation):
                prefix = "" if path == "(top level)" else f"{path}."
                queue.append((f"{prefix}{name}{suffix}", nested))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
