"""Compute resource provider throttling, as Microsoft's "Troubleshooting API throttling errors" describes it.

Azure Compute counts the calls of a subscription to each of its throttling policies in windows of
time; past a policy's allowance a call is refused with 429 Too Many Requests, `Retry-After` (the
seconds until the window ends) and the body

    {"error": {"code": "OperationNotAllowed", "message": "The server rejected the request because too
     many requests have been received for this subscription.", "details": [{"code": "TooManyRequests",
     "target": "<policy>", "message": "{\"operationGroup\": ..., \"startTime\": ..., \"endTime\": ...,
     \"allowedRequestCount\": n, \"measuredRequestCount\": m}"}]}}

Every answer of a throttled operation says what is left with `x-ms-ratelimit-remaining-resource:
Microsoft.Compute/<policy>;<count>` and `x-ms-request-charge: 1`. Refused calls count too (the
documented example measures more requests than it allows).

What the twin counts (GETs under Microsoft.Compute of a resource group or the subscription):
- `LowCostGet`: a read of one resource (a VM with or without `$expand=instanceView`, its
  `instanceView`, a scale set, a placement group);
- `HighCostGet`: each page of a list.
The policy names are the ones Microsoft's examples show; which operation falls in which policy and
the allowances are the twin's own placeholders (Azure publishes neither): 12 reads and 60 list
pages per 5 seconds, small enough that one read per VM of a 13-VM cluster is refused in part, as
such bursts are at Azure's scale of hundreds of VMs, and lists of them are not. Windows are
seconds, not Azure's 3 and 30 minutes, so a client that waits as Retry-After says goes on soon.
Operation status polls, SKU and usage listings are not counted (Azure counts them elsewhere).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from clusterbake.twins.azure.resource import ArmError

MESSAGE = "The server rejected the request because too many requests have been received for this subscription."
# policy -> (allowance, window in seconds): the switch's default, ON.
DEFAULT_POLICIES = {"LowCostGet": (12, 5.0), "HighCostGet": (60, 5.0)}


@dataclass
class Window:
    limit: int
    seconds: float
    start: float = 0.0
    measured: int = 0
    started_at: str = ""


@dataclass
class Throttle:
    """The subscription's Compute policies (policy -> Window); none: nothing is throttled."""

    windows: dict[str, Window] = field(default_factory=dict)
    refused: int = 0  # calls answered 429 since the policies were set

    @classmethod
    def of(cls, policies: dict[str, tuple[int, float]]) -> Throttle:
        return cls({name: Window(int(limit), float(seconds)) for name, (limit, seconds) in policies.items()})

    def settings(self) -> dict:
        return {
            "policies": {name: {"limit": w.limit, "seconds": w.seconds} for name, w in self.windows.items()},
            "refused": self.refused,
        }

    def charge(self, policy: str | None) -> dict[str, str]:
        """Count one call of `policy`: the headers of its answer, or ArmError 429 past the allowance."""
        window = self.windows.get(policy) if policy else None
        if window is None:
            return {}
        now = time.monotonic()
        if now >= window.start + window.seconds:
            window.start, window.measured = now, 0
            window.started_at = _iso(time.time())
        window.measured += 1
        remaining = window.limit - window.measured
        headers = {"x-ms-ratelimit-remaining-resource": f"Microsoft.Compute/{policy};{max(remaining, 0)}",
                   "x-ms-request-charge": "1"}  # fmt: skip
        if remaining >= 0:
            return headers
        self.refused += 1
        wait = window.start + window.seconds - now
        detail = {
            "operationGroup": policy,
            "startTime": window.started_at,
            "endTime": _iso(time.time() + wait),
            "allowedRequestCount": window.limit,
            "measuredRequestCount": window.measured,
        }
        error = ArmError(429, "OperationNotAllowed", MESSAGE)
        error.extra = {"details": [{"code": "TooManyRequests", "target": policy, "message": json.dumps(detail)}]}
        error.headers = headers | {"Retry-After": str(max(1, math.ceil(wait)))}
        raise error


def policy_of(method: str, parts: list[str]) -> str | None:
    """The Compute policy an ARM request counts against (parts: the path's segments), None when none."""
    lower = [p.lower() for p in parts]
    if method != "GET" or "microsoft.compute" not in lower:
        return None
    tail = lower[lower.index("microsoft.compute") + 1 :]
    if not tail or tail[0] in ("locations", "skus"):
        return None  # operation polls, usages, SKUs
    listing = len(tail) % 2 == 1 and tail[-1] != "instanceview"
    return "HighCostGet" if listing else "LowCostGet"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(seconds))
