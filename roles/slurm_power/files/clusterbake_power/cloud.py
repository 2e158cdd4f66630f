"""What the cloud backends share: the start of nodes (one launch loop over a group's instance types
or VM sizes, in order), the types without capacity skipped for capacity_cooldown seconds (kept in
the state file: resume runs are separate processes), the wait for an address a deleted machine
still holds, and the cloud's errors said as PowerError."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from .core import CONFIG, PARALLEL, UTC, PowerError, log, read_state, update_state

# A just-deleted machine holds its address for a while (an instance's interface goes once it has
# shut down: minutes for a large one): the node's replacement waits for it.
ADDRESS_WAIT = 600.0
ADDRESS_POLL = 5.0


class CloudBackend:
    """A backend says: where its settings are (`section`: node groups, each with `addresses` and its
    types under `types_key`), what the cloud has of some nodes (`existing`), whether a node's machine runs
    already (`alive`), how to clear one that holds its address (`clear`), how to create one
    (`create`: its label), what a failed create means (`failure`: (code, message) of a capacity
    error, else the error text), which nodes run (`running_nodes`), how to stop nodes (`stop`),
    and the words of an error of its API (`cloud_error`: None for any other error)."""

    section: str  # power.json's key of the backend's settings, with `cluster` and `groups`
    types_key: str  # a group's key of its types
    api: str  # the cloud's API, as errors name it
    listing_api: str  # the call `running` makes, as errors name it

    def __init__(self, config: dict, sleep=time.sleep, clock=time.time):
        self.config = config
        self.settings = config[self.section]
        self.cluster: str = self.settings["cluster"]
        self.groups: dict[str, dict] = self.settings["groups"]
        self.cooldown = float(config["capacity_cooldown"])
        self.sleep = sleep
        self.clock = clock

    # --- what the program asks -----------------------------------------------------------

    def power(self, action: str, nodes: list[str]) -> dict[str, str]:
        return self._said(self.api, lambda: self.start(nodes) if action == "start" else self.stop(nodes))

    def running(self) -> set[str]:
        return self._said(self.listing_api, self.running_nodes)

    def _said(self, what: str, work: Callable):
        try:
            return work()
        except Exception as exc:
            words = self.cloud_error(exc)
            if words is None:
                raise
            raise PowerError(f"{what}: {words}") from None

    # --- the capacity cool-down ----------------------------------------------------------

    def cooling(self) -> dict[str, dict]:
        """Types skipped now: type -> {"until": epoch seconds, "code", "message"} (the cloud's error)."""
        now = self.clock()
        return {t: c for t, c in read_state().get("capacity", {}).items() if c.get("until", 0) > now}

    def disable(self, instance_type: str, code: str, message: str) -> None:
        until = self.clock() + self.cooldown

        def change(memory: dict) -> None:
            now = self.clock()
            capacity = {t: c for t, c in memory.get("capacity", {}).items() if c.get("until", 0) > now}
            capacity[instance_type] = {"until": until, "code": code, "message": message}
            memory["capacity"] = capacity

        update_state(change)

    def skipped(self, node: str, instance_type: str, failures: list[str]) -> str | None:
        """The cloud's message when `instance_type` cools down now (noted in `failures`), else None."""
        cooling = self.cooling().get(instance_type)
        if not cooling:
            return None
        until = datetime.fromtimestamp(cooling["until"], UTC).strftime("%H:%M:%SZ")
        failures.append(f"{instance_type}: {cooling.get('code', 'no capacity')} until {until}")
        log(self.config, f"resume {node}: {instance_type} skipped until {until} ({cooling.get('code')})")
        return cooling.get("message", "")

    def no_capacity(self, node: str, instance_type: str, following: list[str], code: str, message: str) -> None:
        """A capacity error of `instance_type`: cool it down, say what comes next."""
        self.disable(instance_type, code, message)
        then = f"trying {following[0]}" if following else "no other type to try"
        skipped = f"{instance_type} skipped for {self.cooldown:.0f}s"
        log(self.config, f"resume {node}: {instance_type}: {code}: {message} {skipped}, {then}")

    # --- the launch loop -----------------------------------------------------------------

    def group_of(self, node: str) -> str | None:
        return next((g for g, group in self.groups.items() if node in group["addresses"]), None)

    def start(self, nodes: list[str]) -> dict[str, str]:
        results: dict[str, str] = {}
        existing = self.existing(nodes)
        launch = []
        for node in nodes:
            if self.group_of(node) is None:
                results[node] = f"{node} is not a node the power program may start in cluster {self.cluster} ({CONFIG})"
                continue
            running = self.alive(node, existing)
            if running:
                log(self.config, f"resume {node}: {running}")
                results[node] = "ok"
                continue
            self.clear(node, existing)  # what holds the node's address goes
            launch.append(node)
        if launch:
            with ThreadPoolExecutor(max_workers=min(PARALLEL, len(launch))) as pool:
                results |= dict(zip(launch, pool.map(self.launch, launch), strict=True))
        return results

    def launch(self, node: str) -> str:
        """One machine for `node`: its group's types in order, skipping those without capacity."""
        group = self.groups[self.group_of(node)]
        types = list(group[self.types_key])
        run_id = format(int(self.clock() * 1000), "x")
        failures: list[str] = []
        message = ""  # the cloud's words of the last capacity error
        for index, kind in enumerate(types):
            cooling = self.skipped(node, kind, failures)
            if cooling is not None:
                message = cooling
                continue
            try:
                label = self.create(node, group, kind, run_id)
            except Exception as exc:
                failure = self.failure(node, exc)
                if isinstance(failure, str):  # not a capacity problem: another type would not help
                    return f"{kind}: {failure}"
                code, message = failure
                failures.append(f"{kind}: {code}")
                self.no_capacity(node, kind, types[index + 1 :], code, message)
                continue
            fallback = f" (fallback: {'; '.join(failures)})" if failures else ""
            log(self.config, f"resume {node}: {label} {kind} at {group['addresses'][node]}{fallback}")
            return "ok"
        return f"no capacity ({'; '.join(failures)}): {message}".rstrip(": ")

    def at_address(self, node: str, address: str, create: Callable, in_use: Callable[[Exception], bool]):
        """What `create` returns, tried again while the cloud says `address` is still in use (by a
        machine deleted a moment ago), for ADDRESS_WAIT seconds."""
        deadline = self.clock() + ADDRESS_WAIT
        while True:
            try:
                return create()
            except Exception as exc:
                if not in_use(exc) or self.clock() > deadline:
                    raise
                log(self.config, f"resume {node}: {address} still in use, waiting")
                self.sleep(ADDRESS_POLL)
