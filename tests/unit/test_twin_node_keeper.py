"""The twins' node keeper (twins/nodes.py NodeKeeper): the state machine both twins run their
VMs' nodes by. The nodes here are a stand-in that records what the keeper asked of it (booting
real nodes is the twin lanes' work: tests/twin/); the clock is given."""

from __future__ import annotations

from clusterbake.twins.nodes import REMOVE, RUN, STOP, NodeKeeper, NodeSpec, Wanted


class Machines:
    """Running nodes (key -> pid) and kept disks, changed only by what the keeper asks."""

    def __init__(self, running=None, known=None, fail=()):
        self.pids = dict(running or {})
        self.disks = set(known or ()) | set(self.pids)
        self.fail = set(fail)
        self.asked: list[tuple[str, str]] = []

    def running(self):
        return dict(self.pids)

    def known(self):
        return set(self.disks)

    def boot(self, spec: NodeSpec):
        self.asked.append(("boot", spec.key))
        if spec.key in self.fail:
            raise RuntimeError("nspawn failed")
        self.pids[spec.key] = 100 + len(self.asked)
        self.disks.add(spec.key)

    def stop(self, key, pid):
        self.asked.append(("stop", key))
        self.pids.pop(key, None)

    def remove(self, key, pid):
        self.asked.append(("remove", key))
        self.pids.pop(key, None)
        self.disks.discard(key)


def vm(key, state=RUN, **kwargs) -> Wanted:
    spec = NodeSpec(key=key, address="10.0.0.5", subnet_cidr="10.0.0.0/24", image_root=None, hostname=key,
                    mac="02:00:00:00:00:01", uuid=key)  # fmt: skip
    return Wanted(key=key, what=f"VM {key}", state=state, spec=lambda: spec, **kwargs)


def test_boots_what_runs_stops_what_stopped_removes_what_is_gone_and_orphans():
    machines = Machines(running={"b": 1, "orphan": 2}, known={"c"})
    keeper = NodeKeeper(machines, lambda m: None)
    up = keeper.keep([vm("a"), vm("b", STOP), vm("c", REMOVE)], lambda: 0.0)
    assert up == {"a"}
    assert machines.asked == [("boot", "a"), ("stop", "b"), ("remove", "c"), ("remove", "orphan")]


def test_a_node_that_powers_itself_off_stops_its_vm_and_is_not_booted_again():
    machines = Machines()
    stopped = []
    keeper = NodeKeeper(machines, lambda m: None)
    keeper.keep([vm("a", stopped_inside=lambda: stopped.append("a"))], lambda: 0.0)
    machines.pids.clear()  # `poweroff` inside the node
    up = keeper.keep([vm("a", stopped_inside=lambda: stopped.append("a"))], lambda: 1.0)
    assert (up, stopped, machines.asked[-1]) == (set(), ["a"], ("stop", "a"))
    # The cloud now says stopped; a later start boots it again.
    keeper.keep([vm("a", STOP)], lambda: 2.0)
    assert keeper.keep([vm("a")], lambda: 3.0) == {"a"}


def test_a_failed_start_is_retried_after_the_pause_and_a_vm_outside_the_network_is_not_booted():
    machines = Machines(fail={"a"})
    logged = []
    keeper = NodeKeeper(machines, logged.append)
    keeper.keep([vm("a"), vm("x", outside=lambda: "is not in the twin's network")], lambda: 0.0)
    assert machines.asked == [("boot", "a")]
    assert logged[-1] == "VM x is not in the twin's network: not booted"
    keeper.keep([vm("a")], lambda: 29.0)
    assert machines.asked == [("boot", "a")]
    machines.fail.clear()
    assert keeper.keep([vm("a")], lambda: 31.0) == {"a"}


def test_a_restarted_vm_reboots_its_running_node():
    machines = Machines(running={"a": 7})
    keeper = NodeKeeper(machines, lambda m: None)
    assert keeper.keep([vm("a", restart=True)], lambda: 0.0) == {"a"}
    assert machines.asked == [("stop", "a"), ("boot", "a")]
