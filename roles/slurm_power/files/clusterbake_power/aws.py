"""The aws backend: elastic nodes as EC2 instances, launched and terminated with the head's
instance role (providers/aws/iam.py, `clusterbake-<cluster>-head`). A node is one RunInstances
from its group's launch template at its planned address; powering down terminates it."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .cloud import CloudBackend
from .core import PowerError, log

# RunInstances errors that say "not now, not this type" come with the settings (aws.capacity_errors:
# the controller's list, providers/aws/api.py CAPACITY_ERRORS): the next type is tried on them.
THROTTLING = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"})
# EC2's codes of server-side trouble, retried (any other 5xx too, unless a capacity error: EC2 sends
# InsufficientInstanceCapacity as a 500), as AWS's retry advice says.
TRANSIENT = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout"})
# A resume of many nodes shares EC2's request buckets with the account's other work: throttling and
# transient errors are retried for about 90 s (waits of 0.5, 1, 2, ... 20 s, with jitter).
CALL_ATTEMPTS = 10
ADDRESS_IN_USE = "InvalidIPAddress.InUse"
LIVE = ("pending", "running", "stopping", "stopped")
FILTER_VALUES = 200  # values of one DescribeInstances filter
# EC2 may take a launch and end the instance moments later (its volumes under a KMS key the head's
# role may not use: Client.InternalError; realcloud review A8): a new instance is watched this long
# while it is pending, every LAUNCH_POLL seconds.
LAUNCH_SETTLE = 60.0
LAUNCH_POLL = 2.0
TERMINATE_AT_ONCE = 500  # instance ids of one TerminateInstances
TOPOLOGY_AT_ONCE = 100  # instance ids of one DescribeInstanceTopology


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""


def error_text(exc: BaseException) -> str:
    code = error_code(exc)
    if not code:
        return f"{type(exc).__name__}: {exc}"
    return f"{code}: {exc.response.get('Error', {}).get('Message', '')}".rstrip(": ")


class LaunchEnded(PowerError):
    """EC2 took the launch, then ended the instance before it ran."""


def is_aws_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("botocore", "boto3")


def retryable(exc: BaseException, capacity_errors: frozenset[str]) -> bool:
    """Throttling, a server-side error, or no answer at all (a refused, dropped or timed-out connection)."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    code = error_code(exc)
    response = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if isinstance(response, dict) else 0
    return code in THROTTLING or code in TRANSIENT or (status >= 500 and bool(code) and code not in capacity_errors)


# EC2 operations the distribution's botocore may lack (DescribeInstanceTopology: Debian 12 has
# botocore 1.29, which predates it), merged into its model from role slurm_power's sdk-extras
# file (clusterbake.providers.aws.botocore_extras), installed beside this package.
BOTOCORE_DATA = Path(__file__).resolve().parent.parent / "botocore-data"


def botocore_session():
    import botocore.session

    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.append(str(BOTOCORE_DATA))
    return session


class AwsBackend(CloudBackend):
    """Elastic nodes as EC2 instances, launched and terminated with the head's instance role."""

    section, types_key = "aws", "instance_types"
    api, listing_api = "EC2", "EC2 DescribeInstances"

    def __init__(self, config: dict, client=None, sleep=time.sleep, clock=time.time):
        super().__init__(config, sleep, clock)
        self.aws = self.settings
        self.capacity_errors = frozenset(self.aws["capacity_errors"])
        self._client = client
        self._listed: list[dict] | None = None  # running_nodes()' instances, for the topology of the same pass

    @property
    def client(self):
        if self._client is None:
            try:
                import boto3  # only here: the local backend needs no boto3
                from botocore.config import Config
            except ImportError as exc:
                raise PowerError(f"the aws power backend needs boto3 (python3-boto3): {exc}") from None
            # botocore's retries off: a capacity error must reach the fallover at once (and EC2
            # sends InsufficientInstanceCapacity as HTTP 500, which botocore would retry).
            self._client = boto3.session.Session(botocore_session=botocore_session()).client(
                "ec2",
                region_name=self.aws["region"],
                endpoint_url=self.aws.get("endpoint_url") or None,
                config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
            )
        return self._client

    def _call(self, operation: str, **params):
        """One EC2 call, retried on throttling and transient errors with growing waits (RunInstances
        too: its ClientToken makes EC2 launch the node once)."""
        for attempt in range(CALL_ATTEMPTS):
            try:
                return getattr(self.client, operation)(**params)
            except Exception as exc:
                if not retryable(exc, self.capacity_errors) or attempt == CALL_ATTEMPTS - 1:
                    raise
                wait = min(20.0, 0.5 * 2**attempt)
                self.sleep(random.uniform(wait / 2, wait))
        raise AssertionError("unreachable")

    def cloud_error(self, exc: Exception) -> str | None:
        return error_text(exc) if is_aws_error(exc) else None

    # --- what is there -------------------------------------------------------------

    def instances(self, names: list[str] | None = None, states=LIVE) -> list[dict]:
        """The cluster's instances in `states` (those named `names`), every page."""
        base = [
            {"Name": "tag:clusterbake:cluster", "Values": [self.cluster]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
        if names is None:
            queries = [base]
        else:
            wanted = sorted(set(names))
            queries = [
                [*base, {"Name": "tag:clusterbake:name", "Values": wanted[start : start + FILTER_VALUES]}]
                for start in range(0, len(wanted), FILTER_VALUES)
            ]
        found = []
        for filters in queries:
            token = None
            while True:
                page = self._call("describe_instances", Filters=filters, **({"NextToken": token} if token else {}))
                found += [i for r in page.get("Reservations", []) for i in r.get("Instances", [])]
                token = page.get("NextToken")
                if not token:
                    break
        return found

    @staticmethod
    def name_of(instance: dict) -> str | None:
        return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == "clusterbake:name"), None)

    def running_nodes(self) -> set[str]:
        self._listed = self.instances(states=("pending", "running"))
        return {n for i in self._listed if (n := self.name_of(i))}

    # --- where they hang (clusterbake_power.network) ---------------------------------

    def running_instance_ids(self, nodes: list[str]) -> dict[str, str]:
        """The running instance of each of `nodes` that has one: name -> instance id (those running_nodes()
        listed in this pass, else listed now)."""
        listed = self._listed if self._listed is not None else self.instances(states=("running",))
        wanted = set(nodes)
        return {
            name: i["InstanceId"]
            for i in listed
            if i["State"]["Name"] == "running" and (name := self.name_of(i)) in wanted
        }

    def network_paths(self, running: dict[str, str]) -> dict[str, list[str]]:
        """Where each of the `running` instances hangs (name -> DescribeInstanceTopology's NetworkNodes, top
        first); EC2 leaves out the types it documents no topology for."""
        names = {instance_id: name for name, instance_id in running.items()}
        ids = sorted(names)
        paths: dict[str, list[str]] = {}
        for start in range(0, len(ids), TOPOLOGY_AT_ONCE):
            token = None
            while True:
                extra = {"NextToken": token} if token else {}
                page = self._call(
                    "describe_instance_topology", InstanceIds=ids[start : start + TOPOLOGY_AT_ONCE], **extra
                )
                for entry in page.get("Instances", []):
                    if entry.get("InstanceId") in names:
                        paths[names[entry["InstanceId"]]] = list(entry.get("NetworkNodes", []))
                token = page.get("NextToken")
                if not token:
                    break
        return paths

    # --- power ---------------------------------------------------------------------

    def existing(self, nodes: list[str]) -> dict[str, list[dict]]:
        found: dict[str, list[dict]] = {}
        for instance in self.instances(nodes):
            found.setdefault(self.name_of(instance), []).append(instance)
        return found

    def alive(self, node: str, existing: dict[str, list[dict]]) -> str | None:
        alive = [i for i in existing.get(node, []) if i["State"]["Name"] in ("pending", "running")]
        return f"{alive[0]['InstanceId']} runs already" if alive else None

    def clear(self, node: str, existing: dict[str, list[dict]]) -> None:
        """Stopped instances hold the node's address: they go."""
        ids = [i["InstanceId"] for i in existing.get(node, [])]
        if ids:
            self._call("terminate_instances", InstanceIds=ids)
            log(self.config, f"resume {node}: terminated its stopped instance(s) {', '.join(ids)}")

    def create(self, node: str, group: dict, instance_type: str, run_id: str) -> str:
        instance = self.run(node, group, instance_type, run_id)
        self.settle(instance)
        return instance["InstanceId"]

    def settle(self, instance: dict) -> None:
        """LaunchEnded when EC2 ends the new instance while it is pending, with EC2's reason."""
        deadline = self.clock() + LAUNCH_SETTLE
        state = instance
        while state.get("State", {}).get("Name") == "pending":
            try:
                found = self._call("describe_instances", InstanceIds=[instance["InstanceId"]])
                state = next((i for r in found.get("Reservations", []) for i in r.get("Instances", [])), state)
            except Exception as exc:
                if error_code(exc) != "InvalidInstanceID.NotFound":  # not listed yet, moments after the launch
                    raise
            if state.get("State", {}).get("Name") != "pending" or self.clock() >= deadline:
                break
            self.sleep(LAUNCH_POLL)
        if state.get("State", {}).get("Name") in ("shutting-down", "terminated"):
            reason = state.get("StateReason", {})
            raise LaunchEnded(
                f"{instance['InstanceId']} ended while starting: {reason.get('Code', '?')}: {reason.get('Message', '')}"
                " (volumes under a customer managed KMS key the head's role may not use end so)"
            )

    def failure(self, node: str, exc: Exception) -> tuple[str, str] | str:
        if isinstance(exc, LaunchEnded):
            return str(exc)
        code = error_code(exc)
        if code not in self.capacity_errors:
            return error_text(exc)
        return code, exc.response.get("Error", {}).get("Message", "")

    def run(self, node: str, group: dict, instance_type: str, run_id: str) -> dict:
        interfaces = [dict(i) for i in group["network_interfaces"][instance_type]]
        interfaces[0]["PrivateIpAddress"] = group["addresses"][node]
        node_tags = {**group["tags"], "clusterbake:name": node, "Name": f"{self.cluster}-{node}"}
        template = group["launch_template"]
        params = {
            "LaunchTemplate": {"LaunchTemplateId": template["id"], "Version": str(template["version"])},
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "NetworkInterfaces": interfaces,
            "UserData": group["user_data"].replace(self.aws["name_placeholder"], node),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in node_tags.items()]}
            ],
            # The same token on a retried call: EC2 launches the node once.
            "ClientToken": f"cbp-{run_id}-{node}-{instance_type}"[:64],
        }
        return self.at_address(
            node,
            group["addresses"][node],
            lambda: self._call("run_instances", **params)["Instances"][0],
            lambda exc: error_code(exc) == ADDRESS_IN_USE,
        )

    def stop(self, nodes: list[str]) -> dict[str, str]:
        """Terminate the nodes' instances (those without one are already off)."""
        ids = {i["InstanceId"]: self.name_of(i) for i in self.instances(nodes)}
        results = {node: "ok" for node in nodes}
        chunk = sorted(ids)
        for start in range(0, len(chunk), TERMINATE_AT_ONCE):
            part = chunk[start : start + TERMINATE_AT_ONCE]
            try:
                self._call("terminate_instances", InstanceIds=part)
            except Exception as exc:
                if not error_code(exc):
                    raise
                for instance_id in part:
                    results[ids[instance_id]] = error_text(exc)
        for instance_id, node in sorted(ids.items(), key=lambda item: str(item[1])):
            if results.get(node) == "ok":
                log(self.config, f"terminate {node}: {instance_id}")
        return results
