"""Jinja filters of the lustre_client role.

Pure functions (no Ansible imports), so that tests/unit can call them directly.
"""

import re

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
        return {function.__name__: function for function in (lustre_client_module_kernels,)}
