"""Filters of role azure_sku."""

from __future__ import annotations


def azure_sku_profile(profile: dict, topology_dir: str) -> dict:
    """A profile of azure_sku_profiles as the boot program reads it: the topology file, the per-size
    link to it (<dir>/<name>/topo.xml, as Azure's HPC images lay it out) and NCCL_TOPO_FILE pointing there."""
    name = profile["name"]
    link = f"{topology_dir}/{name}/topo.xml"
    nccl = {key: str(value) for key, value in dict(profile.get("nccl") or {}).items()}
    nccl["NCCL_TOPO_FILE"] = link
    return {
        "name": name,
        "match": [pattern.lower() for pattern in profile["match"]],
        "topology_file": f"{topology_dir}/{profile['topology']}-topo.xml",
        "topology_link": link,
        "nccl": nccl,
        "fabricmanager": bool(profile.get("fabricmanager", False)),
        "peermem": bool(profile.get("peermem", False)),
        "infiniband": bool(profile.get("infiniband", False)),
    }


class FilterModule:
    def filters(self):
        return {"azure_sku_profile": azure_sku_profile}
