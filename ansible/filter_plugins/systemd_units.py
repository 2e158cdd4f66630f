"""Jinja filters for systemd unit names, shared by the roles that render .mount units.

Pure functions (no Ansible imports), so that tests/unit can call them directly.
Found through `filter_plugins` in ansible/ansible.cfg (and next to the playbooks).
"""


def systemd_escape_path(path):
    """The name `systemd-escape --path` gives a path: /shared/my-data -> shared-my\\x2ddata.

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


def systemd_mount_unit(path):
    """The .mount unit systemd requires for a mount point: /shared/data -> shared-data.mount."""
    return systemd_escape_path(path) + ".mount"


class FilterModule:
    def filters(self):
        return {
            "systemd_escape_path": systemd_escape_path,
            "systemd_mount_unit": systemd_mount_unit,
        }
