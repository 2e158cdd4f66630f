"""Filters of role doca_ofed: `dkms status` and `ibstat` output as data."""

from __future__ import annotations

import re

# dkms 3.x: "mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1, 6.8.0-1021-azure, x86_64: installed"
# dkms 2.x: "mlnx-ofed-kernel, 5.8, 5.15.0-1029-azure, x86_64: installed (original_module exists)"
# A module added or built but not installed for any kernel: "knem/1.1.4.90mlnx3: added".
_DKMS_V3 = re.compile(
    r"^(?P<module>[^/,\s]+)/(?P<version>[^,]+)(?:,\s*(?P<kernel>[^,]+),\s*(?P<arch>[^:]+))?:\s*(?P<status>.*)$"
)
_DKMS_V2 = re.compile(
    r"^(?P<module>[^/,\s]+),\s*(?P<version>[^,]+)(?:,\s*(?P<kernel>[^,]+),\s*(?P<arch>[^:]+))?:\s*(?P<status>.*)$"
)


def doca_ofed_dkms_status(lines: list[str]) -> list[dict[str, str]]:
    """Parse `dkms status` lines into {module, version, kernel, arch, status}; unknown lines are skipped."""
    entries = []
    for line in lines:
        line = line.strip()
        match = _DKMS_V3.match(line) or _DKMS_V2.match(line)
        if not match:
            continue
        entry = {key: (value or "").strip() for key, value in match.groupdict().items()}
        entries.append(entry)
    return entries


def doca_ofed_ibstat_ports(text: str) -> list[dict[str, str]]:
    """Parse `ibstat` into one {ca, port, state, physical_state, rate, link_layer} per port."""
    ports: list[dict[str, str]] = []
    ca = ""
    port: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if raw.startswith("CA '"):
            ca = raw.split("'")[1]
            port = None
        elif line.startswith("Port ") and line.endswith(":"):
            port = {"ca": ca, "port": line[5:-1], "state": "", "physical_state": "", "rate": "", "link_layer": ""}
            ports.append(port)
        elif port is not None and ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            field = {"State": "state", "Physical state": "physical_state", "Rate": "rate", "Link layer": "link_layer"}
            if key in field:
                port[field[key]] = value
    return ports


class FilterModule:
    def filters(self):
        return {"doca_ofed_dkms_status": doca_ofed_dkms_status, "doca_ofed_ibstat_ports": doca_ofed_ibstat_ports}
