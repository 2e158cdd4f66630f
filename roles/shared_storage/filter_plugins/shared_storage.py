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


def shared_storage_amlfs_mounts(entries, endpoints):
    """The amlfs storage entries as amlfs_client_mounts ({mgs_address, fs_name, path})."""
    return [
        {
            "mgs_address": endpoints[entry["name"]]["mgs_address"],
            "fs_name": endpoints[entry["name"]].get("fs_name", "lustrefs"),
            "path": entry["mount_point"],
        }
        for entry in entries
        if entry.get("type") == "amlfs"
    ]


def shared_storage_blob_mounts(entries, endpoints):
    """The azure_blob storage entries as blobfuse2_mounts ({account, container, path, read_only, cache_size_mb,
    endpoint})."""
    return [
        {
            "account": endpoints[entry["name"]]["account"],
            "container": endpoints[entry["name"]]["container"],
            "endpoint": endpoints[entry["name"]]["endpoint"],
            "path": entry["mount_point"],
            "read_only": bool(entry.get("read_only", False)),
            "cache_size_mb": int(entry.get("cache_size_mb", 10240)),
        }
        for entry in entries
        if entry.get("type") == "azure_blob"
    ]


class FilterModule:
    """Ansible entry point: exposes the filters above by their function names."""

    def filters(self):
        return {
            function.__name__: function
            for function in (
                shared_storage_lustre_mounts,
                shared_storage_amlfs_mounts,
                shared_storage_blob_mounts,
            )
        }
