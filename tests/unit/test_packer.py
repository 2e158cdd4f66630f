"""The packer wrapper's reading of -machine-readable output."""

from clusterbake.images.packer import parse_machine_readable


def test_ui_line_with_escaped_commas():
    line = "1700000000,,ui,say,==> null.local: Provisioning with Ansible%!(PACKER_COMMA) please wait"
    parsed = parse_machine_readable(line)
    assert parsed.kind == "ui"
    assert parsed.data == ["say", "==> null.local: Provisioning with Ansible, please wait"]


def test_artifact_line():
    parsed = parse_machine_readable("1700000000,null.local,artifact,0,id,ami-0123")
    assert (parsed.target, parsed.kind, parsed.data) == ("null.local", "artifact", ["0", "id", "ami-0123"])


def test_non_machine_readable_line_is_ignored():
    assert parse_machine_readable("Build 'null.local' finished.") is None
