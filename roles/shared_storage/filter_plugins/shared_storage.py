"""Jinja filters of the shared_storage role.

Pure functions (no Ansible imports), so that tests/unit can call them directly.
"""


def shared_storage_lustre_mounts(entries, endpoints):
    """The fsx_lustre storage entries as lustre_client_mounts ({dns_name, mount_name, path})."""
    return [
        {
            "dns_name": endpoints[entry["name"]]["dns_name"],
            "mount_name": endpoints[entry["name"]]["mount_name"],
            "path": entry["mount_point"],
        }
        for entry in entries
        if entry.get("type") == "fsx_lustre"
    ]


class FilterModule:
    """Ansible entry point: exposes the filters above by their function names."""

    def filters(self):
        return {
            function.__name__: function
            for function in (
                shared_storage_lustre_mounts,
            )
        }
