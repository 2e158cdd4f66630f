"""The EC2 twin's control socket sets and clears injected faults and capacity codes (the daemon's
requests; moto_ext applies them: tests/aws/test_resilience.py and test_elastic_provision.py)."""

from __future__ import annotations

import json
from http import HTTPStatus

from clusterbake.twins.aws.daemon import Twin


class ControlOnly(Twin):
    """The daemon's control requests without its moto server and nodes."""

    def __init__(self, root):
        self.root = root


def test_faults_are_set_shown_and_cleared_through_the_control_socket(tmp_path, monkeypatch):
    monkeypatch.delenv("MOTO_FAULTS_FILE", raising=False)
    twin = ControlOnly(tmp_path)
    faults = {"RunInstances": {"fault": "drop", "times": 2}, "*": {"fault": "InternalError", "times": 1}}
    assert twin.control("PUT", "/faults", faults) == (HTTPStatus.OK, faults)
    assert json.loads((tmp_path / "faults.json").read_text()) == faults
    assert twin.control("GET", "/faults", None) == (HTTPStatus.OK, faults)
    status, answer = twin.control("PUT", "/faults", {"RunInstances": {"fault": "Explode", "times": 1}})
    assert status == HTTPStatus.BAD_REQUEST and "faults.RunInstances" in answer["error"]
    assert twin.control("DELETE", "/faults", None) == (HTTPStatus.OK, {})
    assert not (tmp_path / "faults.json").exists()


def test_capacity_takes_a_code_and_refuses_one_ec2_does_not_have(tmp_path, monkeypatch):
    monkeypatch.delenv("MOTO_CAPACITY_FILE", raising=False)
    twin = ControlOnly(tmp_path)
    limits = {"c7a.large": {"count": 0, "code": "VcpuLimitExceeded"}, "m7a.large": 1}
    assert twin.control("PUT", "/capacity", limits)[0] == HTTPStatus.OK
    assert twin.control("GET", "/capacity", None) == (HTTPStatus.OK, limits)
    status, answer = twin.control("PUT", "/capacity", {"c7a.large": {"count": 0, "code": "NoSuchCode"}})
    assert status == HTTPStatus.BAD_REQUEST and "VcpuLimitExceeded" in answer["error"]
