"""AWS clients and the one retry policy every call goes through.

boto3 reads the standard environment itself (AWS_PROFILE, AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ...); the region comes from the config. botocore's own retries
are off so that exactly one policy applies: `call` retries throttling, AWS's transient
server errors (HTTP 5xx, but not a capacity error, which EC2 also sends as a 500) and a
connection that failed or dropped, with exponential backoff (with jitter), as AWS's
retry recommendations say ("Ensuring idempotency in Amazon EC2 API requests"); every other
error goes through at once (InsufficientInstanceCapacity must reach the launcher's
rollback, not be retried). RunInstances is safe to retry: every launch carries a ClientToken.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from clusterbake.errors import ClusterbakeError

THROTTLING = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"})
# RunInstances' errors that say "not now, not this type" (EC2 API reference, "Error codes", and
# what ParallelCluster fails over on): a group's launch stops and says what to try, the head's
# power program (its own copy: clusterbake_power/aws.py) tries the next type.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "ReservationCapacityExceeded",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "Unsupported",
        "UnfulfillableCapacity",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
    }
)
# AWS's codes of server-side trouble: retried (any other 5xx too, unless a capacity error).
TRANSIENT = frozenset(
    {
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
ATTEMPTS = 8
BASE_DELAY = 0.5
MAX_DELAY = 20.0


def client(service: str, region: str):
    """A boto3 client of `service` (iam, sts, kms, secretsmanager, efs, fsx, s3, ...) with
    botocore's retries off: `call` is the one retry policy."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, user_agent_appid="clusterbake")
    made = boto3.session.Session().client(service, region_name=region, config=config)
    if os.environ.get(API_TIMINGS):
        _time_calls(made)
    return made


# bench/: with $CLUSTERBAKE_API_TIMINGS=FILE, each API call's operation and seconds (request sent to
# answer parsed) are appended to FILE as JSON lines, so that a run's time in the cloud's API (on the
# twin, moto's) can be told from its own.
API_TIMINGS = "CLUSTERBAKE_API_TIMINGS"


def _time_calls(made) -> None:
    started: dict[int, float] = {}

    def before(model, **_):
        started[threading.get_ident()] = time.perf_counter()

    def after(model, **_):
        begun = started.pop(threading.get_ident(), None)
        if begun is not None:
            line = {
                "operation": f"{model.service_model.service_name}:{model.name}",
                "seconds": time.perf_counter() - begun,
            }
            with open(os.environ[API_TIMINGS], "a") as out:
                out.write(json.dumps(line) + "\n")

    made.meta.events.register("before-call.*.*", before)
    made.meta.events.register("after-call.*.*", after)


def ec2_client(region: str):
    return client("ec2", region)


def error_code(exc: BaseException) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""


def transient(exc: BaseException) -> bool:
    """Whether AWS's retry advice says try again: a server-side error, or no answer at all (a refused,
    dropped or timed-out connection: botocore's ConnectionError and HTTPClientError)."""
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    if not isinstance(exc, ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return error_code(exc) in TRANSIENT or (status >= 500 and error_code(exc) not in CAPACITY_ERRORS)


def or_if_gone(code: str, gone: Any, work: Callable[[], Any]) -> Any:
    """What work() returns, or `gone` when AWS answers with error `code` (its "not found": it is not there)."""
    try:
        return work()
    except ClientError as exc:
        if error_code(exc) != code:
            raise
        return gone


def backoff_delays(attempts: int = ATTEMPTS, base: float = BASE_DELAY, cap: float = MAX_DELAY) -> list[float]:
    """Upper bounds of the waits between attempts: base, 2 x base, 4 x base, ... capped."""
    return [min(cap, base * 2**n) for n in range(attempts - 1)]


def call(
    operation: Callable[..., Any],
    /,
    *,
    retry_codes: frozenset[str] = THROTTLING,
    retry_transient: bool = True,
    sleep: Callable[[float], None] | None = None,
    attempts: int = ATTEMPTS,
    **params: Any,
) -> Any:
    """`operation(**params)`, retried on throttling (or `retry_codes`) and transient errors (unless
    `retry_transient` is off: a call whose answer may be done without) with backoff and jitter."""
    delays = backoff_delays(attempts)
    for attempt in range(attempts):
        try:
            return operation(**params)
        except (ClientError, BotoCoreError) as exc:
            if not (error_code(exc) in retry_codes or (retry_transient and transient(exc))) or attempt == attempts - 1:
                raise
            (sleep or time.sleep)(random.uniform(delays[attempt] / 2, delays[attempt]))
    raise AssertionError("unreachable")


def paginate(
    client,
    operation: str,
    key: str,
    *,
    retry_codes: frozenset[str] = THROTTLING,
    retry_transient: bool = True,
    token_in: str = "NextToken",
    token_out: str | None = None,
    **params: Any,
) -> list[dict]:
    """Every item of a paginated call (each page retried on throttling).

    Most APIs page with NextToken; IAM sends `Marker` and answers `Marker` (token_in="Marker"),
    EFS answers `NextMarker` (token_in="Marker", token_out="NextMarker")."""
    items: list[dict] = []
    token = None
    method = getattr(client, operation)
    while True:
        page = call(
            method,
            retry_codes=retry_codes,
            retry_transient=retry_transient,
            **params,
            **({token_in: token} if token else {}),
        )
        items += page.get(key, [])
        token = page.get(token_out or token_in)
        if not token:
            return items


@contextlib.contextmanager
def aws_error_translation() -> Iterator[None]:
    """Turn botocore's exceptions into ClusterbakeError: a message, no traceback."""
    try:
        yield
    except NoCredentialsError:
        raise ClusterbakeError(
            "AWS: no credentials (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or run where an instance role applies)"
        ) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise ClusterbakeError(
            f"AWS {exc.operation_name}: {error.get('Code', '?')}: {error.get('Message', '')}"
        ) from exc
    except BotoCoreError as exc:
        raise ClusterbakeError(f"AWS: {exc}") from exc


def aws_errors(method: Callable) -> Callable:
    """aws_error_translation around a function (a contextmanager is a ContextDecorator too)."""
    return aws_error_translation()(method)
