"""Bad input exits non-zero with a clear message and creates nothing."""

from pathlib import Path

from localtest import cb, run


def leftovers(cluster: str) -> list[str]:
    found = [p.name for p in Path("/run/netns").glob(f"cb-{cluster}-*")] if Path("/run/netns").exists() else []
    links = run(["ip", "-o", "link", "show"]).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if f"cb-{cluster}" in line]
    return found


def test_broken_config_exits_2_and_creates_nothing(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "cluster_name: badinput\nnode_groups:\n  - {name: cpu, count: 2}\n"
        "partitions:\n  - {name: p, node_groups: [gpu]}\n"
    )
    result = run(["make", "cluster", f"CONFIG={config}"], check=False)
    assert result.returncode != 0
    assert "partitions.0.node_groups: 'gpu' is not a node group" in result.stderr
    direct = cb("cluster", "up", config=config, check=False)
    assert direct.returncode == 2
    assert leftovers("badinput") == []


def test_cluster_without_image_says_make_image(tmp_path):
    config = tmp_path / "noimage.yaml"
    config.write_text(
        f"cluster_name: noimage\nnode_groups: [{{name: cpu, count: 1}}]\nlocal:\n  state_dir: {tmp_path}/state\n"
        "  subnet: 10.79.0.0/24\n"
    )
    state = {"CLUSTERBAKE_STATE_DIR": str(tmp_path / "state")}  # its own (empty) store, whatever the run's
    try:
        result = run(["make", "cluster", f"CONFIG={config}"], check=False, env=state)
        assert result.returncode != 0
        assert "run `make image`" in result.stderr
        assert cb("cluster", "up", config=config, check=False, env=state).returncode == 3
        assert leftovers("noimage") == []
        assert not (tmp_path / "state" / "clusters").exists()
    finally:  # had it come up, it must not stay up under the other tests
        cb("cluster", "down", config=config, check=False, env=state)
