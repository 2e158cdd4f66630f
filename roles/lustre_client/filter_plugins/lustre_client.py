"""Jinja filters of the lustre_client role.

Pure functions (no Ansible imports), so that tests/unit can call them directly.
"""

import re


def lustre_client_systemd_escape_path(path):
    """The name `systemd-escape --path` gives a path: /fsx/my-data -> fsx-my\\x2ddata.

    systemd.unit(5), "String Escaping for Inclusion in Unit Names": slashes
    are trimmed and collapsed, "/" becomes "-", every byte other than ASCII
    letters, digits, ":", "_" and "." (and a leading ".") becomes "\\xNN".
    """
    trimmed = "/".join(part for part in str(path).split("/") if part)
    if not trimmed:
        return "-"
    escaped = []
    for index, char in enumerate(trimmed):
        if char == "/":
            escaped.append("-")
        elif char.isascii() and (char.isalnum() or char in ":_.") and not (index == 0 and char == "."):
            escaped.append(char)
        else:
            escaped.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(escaped)


def lustre_client_mount_unit(path):
    """The .mount unit systemd requires for a mount point: /fsx -> fsx.mount."""
    return lustre_client_systemd_escape_path(path) + ".mount"


_PACKAGE = re.compile(r"^lustre-client-modules-(\d\S*)")


def lustre_client_module_kernels(search_lines, flavour=None):
    """Kernels with a lustre-client-modules-<kernel> package in `apt-cache search`
    output, oldest first (natural order), optionally only one flavour (aws)."""
    kernels = {m.group(1) for m in map(_PACKAGE.match, search_lines) if m}
    if flavour:
        kernels = {k for k in kernels if k.endswith("-" + flavour)}
    return sorted(kernels, key=lambda k: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", k)])


class FilterModule:
    """Ansible entry point: exposes the filters above by their function names."""

    def filters(self):
        return {
            function.__name__: function
            for function in (
                lustre_client_systemd_escape_path,
                lustre_client_mount_unit,
                lustre_client_module_kernels,
            )
        }
