"""The EC2 twin's process: moto's server, the instance metadata service and the node keeper.

Started by `clusterbake twin up aws` (src/clusterbake/twins/aws/control.py), in a
session of its own, logging to <twin dir>/twin.log. One process, threads:

- moto (with moto_ext's additions) on the twin's bridge address, so the host and
  every node reach the same API at AWS_ENDPOINT_URL. IAM authorization is on: only
  the twin's administrator key (written 0600 to <twin dir>/credentials) and
  credentials EC2 hands to instances through their instance profile are accepted,
  each limited by its policies.
- the instance metadata service (imds.py) at 169.254.169.254:80 inside a service
  namespace on the bridge;
- the node keeper: every instance launched from one of the twin's AMIs becomes a
  node (nodes.py) and follows the instance's state within a fraction of a second;
  a node that powers itself off stops its instance, as EC2 does;
- a control socket for tests and the CLI (control.py): status, spot interruption /
  rebalance notices on an instance's metadata, and EC2's capacity per instance type
  (`PUT /capacity {"c7a.large": 0}`: RunInstances fails with InsufficientInstanceCapacity
  beyond that many non-terminated instances of the type; `DELETE /capacity`: no limit;
  `GET /capacity`), and faults per API action (`PUT /faults {"DescribeInstances": {"fault":
  "InternalError", "times": 2}}`: moto_ext.FAULTS; `DELETE /faults`; `GET /faults`: what is
  left, in the file $MOTO_FAULTS_FILE). The limits are the file $MOTO_CAPACITY_FILE (`twin up` sets it to
  <twin dir>/capacity.json), which moto_ext reads at each RunInstances.

The ids of the twin's VPC, subnet and AMI are the same on every start (moto's random
source is seeded before they are created), so a config file can name them. Keys are
not: the administrator's key and the instances' credentials come from os.urandom.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path
from typing import Any

from clusterbake.state import open_private
from clusterbake.twins.aws.egress import add_nat_route
from clusterbake.twins.runtime import daemon_parser, in_netns, iso, keep_reconciling, log, run_daemon, serve_control

ACCOUNT = "123456789012"
SEED = 20261201
ADMIN_USER = "clusterbake-twin-admin"
CHECKPOINT_BUCKET = "clusterbake-twin-checkpoints"
CREDENTIAL_SECONDS = 6 * 3600
POLL = 0.25
SERVICE_NETNS = "cbsvc-twin-aws"


def unpredictable_moto_random() -> None:
    """Draw moto's randomness (access keys, secret keys, session tokens, ids) from os.urandom."""
    import random

    from moto.moto_api._internal import mock_random

    system = random.SystemRandom()
    mock_random.random = system.random
    mock_random.getrandbits = system.getrandbits


EXPORT_EVERY = 5.0  # seconds between FSx automatic export rounds


class Twin:
    def __init__(self, args: argparse.Namespace):
        from clusterbake.twins.aws.nodes import Nodes
        from clusterbake.twins.nodes import NodeKeeper

        self.args = args
        self.root = Path(args.state)
        self.region = args.region
        self.images: dict[str, Path] = {}  # AMI id -> image root
        self.notices: dict[str, dict[str, Any]] = {}  # instance id -> {"spot": ..., "rebalance": ...}
        self.credentials_cache: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.nodes = Nodes(self.root, args.vpc_cidr, log)
        self.keeper = NodeKeeper(self.nodes, log)

    # --- moto --------------------------------------------------------------------

    @property
    def ec2(self):
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][self.region]

    def start_moto(self) -> None:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per API call is too much
        from moto.moto_api._internal import mock_random
        from moto.server import ThreadedMotoServer

        from clusterbake.twins.aws import moto_ext
        from clusterbake.twins.aws.moto_ext import install

        install()
        moto_ext.CONSOLE_LOG = lambda instance_id: self.nodes.paths(instance_id).console_log
        mock_random.seed(SEED)
        self.server = ThreadedMotoServer(self.args.address, self.args.port, verbose=False)
        self.server.start()
        log(f"moto on http://{self.args.address}:{self.args.port}")

    def setup_account(self) -> dict[str, str]:
        """Through the API, before authorization is switched on: admin key, VPC, subnet, AMIs."""
        import boto3
        from moto import settings

        session = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup")
        url = f"http://{self.args.address}:{self.args.port}"
        iam = session.client("iam", region_name=self.region, endpoint_url=url)
        ec2 = session.client("ec2", region_name=self.region, endpoint_url=url)
        # The seeded draws in the order they always had (the administrator first), so that the ids
        # below stay what configs name; this key is replaced by an unpredictable one further down.
        iam.create_user(UserName=ADMIN_USER)
        iam.put_user_policy(
            UserName=ADMIN_USER,
            PolicyName="administrator",
            PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
            ),
        )
        seeded = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]["AccessKeyId"]
        vpc = ec2.create_vpc(
            CidrBlock=self.args.vpc_cidr,
            TagSpecifications=[{"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": "clusterbake-twin"}]}],
        )["Vpc"]["VpcId"]
        ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
        subnet = ec2.create_subnet(
            VpcId=vpc,
            CidrBlock=self.args.subnet_cidr,
            AvailabilityZone=self.args.zone,
            TagSpecifications=[{"ResourceType": "subnet", "Tags": [{"Key": "Name", "Value": "clusterbake-twin"}]}],
        )["Subnet"]["SubnetId"]
        amis = {}
        for spec in self.args.image:
            name, _, path = spec.partition("=")
            image = ec2.register_image(
                Name=name,
                Description=f"clusterbake twin image {name} (a local node image, booted as systemd-nspawn nodes)",
                Architecture="x86_64",
                RootDeviceName="/dev/xvda",
                VirtualizationType="hvm",
                ImdsSupport="v2.0",  # as packer/plugins registers ours: EC2's hop limit 2 unless launches set it
                TagSpecifications=[
                    {"ResourceType": "image", "Tags": [{"Key": "clusterbake-twin:image", "Value": name}]}
                ],
            )["ImageId"]
            self.images[image] = Path(path) / "rootfs"
            self.ec2.amis[image].architecture = "x86_64"  # moto 5.2.5 drops RegisterImage's Architecture
            amis[name] = image
        # A bucket for durable checkpoint copies (examples/aws-twin.yaml's checkpoints.copy_to): an
        # account's own, like the VPC; clusterbake never creates buckets.
        s3 = session.client("s3", region_name=self.region, endpoint_url=url)
        s3.create_bucket(Bucket=CHECKPOINT_BUCKET)
        # Ids above come from the seeded source (stable across starts); every key from here on
        # (the administrator's, the instances' role sessions) from the system's CSPRNG: a key
        # drawn after a public seed is one anybody recomputes.
        unpredictable_moto_random()
        # After the seeded draws, so the ids above stay what they were.
        nat = add_nat_route(ec2, vpc, subnet)
        key = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]
        iam.delete_access_key(UserName=ADMIN_USER, AccessKeyId=seeded)  # anybody could recompute that one
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on, every request is signed and authorized
        log(
            f"account ready: vpc {vpc}, subnet {subnet} (default route: {nat}), images {amis}, bucket "
            f"{CHECKPOINT_BUCKET}; "
            "IAM authorization on"
        )
        return {
            "access_key_id": key["AccessKeyId"],
            "secret_access_key": key["SecretAccessKey"],
            "vpc_id": vpc,
            "subnet_id": subnet,
            "amis": amis,
        }

    # --- what an instance looks like from inside -----------------------------------

    def instances(self) -> list:
        found = []
        for reservation in list(self.ec2.reservations.values()):
            found += list(reservation.instances)
        return found

    def instance_at(self, address: str):
        for instance in self.instances():
            if instance.private_ip == address and instance.state in ("pending", "running"):
                return instance
        return None

    def role_of(self, instance) -> tuple[Any, Any] | None:
        association = self.ec2.iam_instance_profile_associations.get(instance.id)
        if association is None or not association.iam_instance_profile.roles:
            return None
        return association.iam_instance_profile, association.iam_instance_profile.roles[0]

    def metadata(self, address: str) -> dict[str, Any] | None:
        instance = self.instance_at(address)
        if instance is None:
            return None
        subnet = self.ec2.get_subnet(instance.subnet_id)
        vpc = self.ec2.get_vpc(subnet.vpc_id)
        suffix = "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"
        hostname = f"ip-{instance.private_ip.replace('.', '-')}.{suffix}"
        from clusterbake.twins.aws.nodes import mac_of

        mac = mac_of(instance.id)
        options = instance.metadata_options
        groups = sorted(
            {g.id for g in instance.security_groups}
            | {g.id for nic in instance.nics.values() for g in getattr(nic, "group_set", [])}
        )
        notices = self.notices.get(instance.id, {})
        meta: dict[str, Any] = {
            "ami-id": instance.image_id,
            "ami-launch-index": str(instance.ami_launch_index),
            "block-device-mapping": {"ami": "/dev/xvda", "root": "/dev/xvda"},
            "events": {"maintenance": {"history": "[]", "scheduled": "[]"}},
            "hostname": hostname,
            "instance-action": "none",
            "instance-id": instance.id,
            "instance-life-cycle": "spot" if instance.lifecycle == "spot" else "on-demand",
            "instance-type": instance.instance_type,
            "local-hostname": hostname,
            "local-ipv4": instance.private_ip,
            "mac": mac,
            "network": {
                "interfaces": {
                    "macs": {
                        mac: {
                            "device-number": "0",
                            "local-hostname": hostname,
                            "local-ipv4s": instance.private_ip,
                            "mac": mac,
                            "owner-id": ACCOUNT,
                            "security-group-ids": "\n".join(groups),
                            "subnet-id": subnet.id,
                            "subnet-ipv4-cidr-block": subnet.cidr_block,
                            "vpc-id": vpc.id,
                            "vpc-ipv4-cidr-block": vpc.cidr_block,
                            "vpc-ipv4-cidr-blocks": vpc.cidr_block,
                        }
                    }
                }
            },
            "placement": {"availability-zone": subnet.availability_zone, "region": self.region},
            "reservation-id": next((r.id for r in list(self.ec2.reservations.values()) if instance in r.instances), ""),
            "services": {"domain": "amazonaws.com", "partition": "aws"},
        }
        if "rebalance" in notices:
            meta["events"]["recommendations"] = {"rebalance": json.dumps(notices["rebalance"])}
        if "spot" in notices:
            meta["spot"] = {"instance-action": json.dumps(notices["spot"]), "termination-time": notices["spot"]["time"]}
        if options.instance_metadata_tags == "enabled":
            meta["tags"] = {"instance": {t["key"]: t["value"] for t in instance.get_tags()}}
        role = self.role_of(instance)
        if role is not None:
            profile, iam_role = role
            meta["iam"] = {
                "info": json.dumps(
                    {
                        "Code": "Success",
                        "LastUpdated": iso(datetime.now(UTC)),
                        "InstanceProfileArn": profile.arn,
                        "InstanceProfileId": profile.id,
                    },
                    indent=2,
                ),
                "security-credentials": {iam_role.name: ""},
            }
        keys = {}
        if instance.key_name and instance.key_name in self.ec2.key_pairs:
            keys[instance.key_name] = self.ec2.key_pairs[instance.key_name].public_key.strip()
        user_data = base64.b64decode(instance.user_data.as_bytes()) if instance.user_data else None
        return {
            "instance_id": instance.id,
            "http_tokens": options.http_tokens,
            "http_endpoint": options.http_endpoint,
            "hop_limit": options.http_put_response_hop_limit,
            "user_data": user_data,
            "meta": meta,
            "public_keys": keys,
            "role": role[1].name if role else None,
            "identity": {
                "accountId": ACCOUNT,
                "architecture": instance.architecture,
                "availabilityZone": subnet.availability_zone,
                "billingProducts": None,
                "devpayProductCodes": None,
                "imageId": instance.image_id,
                "instanceId": instance.id,
                "instanceType": instance.instance_type,
                "kernelId": None,
                "marketplaceProductCodes": None,
                "pendingTime": instance.launch_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "privateIp": instance.private_ip,
                "ramdiskId": None,
                "region": self.region,
                "version": "2017-09-30",
            },
        }

    def credentials(self, instance_id: str, role_name: str) -> dict[str, Any] | None:
        """What EC2 does for an instance profile: an STS session of the role, renewed before it ends;
        None while the role is too new (iam_spread)."""
        from moto.iam.models import iam_backends
        from moto.sts.models import sts_backends

        from clusterbake.twins.aws import iam_spread

        key = (instance_id, role_name)
        with self.lock:
            cached = self.credentials_cache.get(key)
            if cached and cached["_expires"] - time.time() > 900:
                return {k: v for k, v in cached.items() if not k.startswith("_")}
            role = iam_backends[ACCOUNT]["aws"].get_role(role_name)
            if iam_spread.too_new(role.create_date):
                return None  # IAM has not spread the new role yet: 404, as EC2's metadata service answers
            session = sts_backends[ACCOUNT]["aws"].assume_role(
                region_name=self.region,
                role_session_name=instance_id,
                role_arn=role.arn,
                policy=None,
                duration=CREDENTIAL_SECONDS,
                external_id=None,
            )
            expires = datetime.now(UTC) + timedelta(seconds=CREDENTIAL_SECONDS)
            answer = {
                "Code": "Success",
                "LastUpdated": iso(datetime.now(UTC)),
                "Type": "AWS-HMAC",
                "AccessKeyId": session.access_key_id,
                "SecretAccessKey": session.secret_access_key,
                "Token": session.session_token,
                "Expiration": iso(expires),
                "_expires": expires.timestamp(),
            }
            self.credentials_cache[key] = answer
            return {k: v for k, v in answer.items() if not k.startswith("_")}

    def start_imds(self) -> None:
        from clusterbake.twins.aws.imds import MetadataServer, listen

        sock = in_netns(SERVICE_NETNS, listen)
        self.imds = MetadataServer(sock, self.metadata, self.credentials, lambda m: log(f"imds {m}"))
        threading.Thread(target=self.imds.serve_forever, name="imds", daemon=True).start()
        log("instance metadata service on 169.254.169.254:80")

    # --- nodes ---------------------------------------------------------------------

    def reconcile(self) -> None:
        from clusterbake.twins.aws.nodes import Instance
        from clusterbake.twins.nodes import REMOVE, RUN, STOP, Wanted

        def subnet_of(instance):
            return self.ec2.get_subnet(instance.subnet_id) if instance.subnet_id else None

        def outside(instance) -> str | None:
            subnet = subnet_of(instance)
            return None if subnet and subnet.vpc_id == self.vpc_id else f"is not in the twin's VPC {self.vpc_id}"

        wanted = []
        for instance in self.instances():
            image = self.images.get(instance.image_id)
            if image is None:  # not an image of the twin's: it never has a node
                continue
            self._enforce_notice(instance)
            state = {"pending": RUN, "running": RUN, "stopping": STOP, "stopped": STOP}.get(instance.state, REMOVE)
            if state == REMOVE:
                self.notices.pop(instance.id, None)
            wanted.append(
                Wanted(
                    key=instance.id,
                    what=f"instance {instance.id}",
                    state=state,
                    spec=lambda i=instance, image=image: self.nodes.spec(
                        Instance(i.id, i.state, i.private_ip, subnet_of(i).cidr_block, image)
                    ),
                    outside=lambda i=instance: outside(i),
                    # EC2 stops an instance whose OS powered off.
                    stopped_inside=lambda i=instance: self.ec2.stop_instances([i.id]),
                )
            )
        self.keeper.keep(wanted, time.monotonic)
        self.sync_storage()

    def _enforce_notice(self, instance) -> None:
        spot = self.notices.get(instance.id, {}).get("spot")
        if not spot or not spot.get("enforce") or instance.state != "running":
            return
        if datetime.now(UTC) >= datetime.fromisoformat(spot["time"].replace("Z", "+00:00")):
            log(f"spot interruption of {instance.id}: {spot['action']}")
            if spot["action"] == "stop":
                self.ec2.stop_instances([instance.id])
            else:
                self.ec2.terminate_instances([instance.id])

    def sync_storage(self) -> None:
        """A directory per EFS / FSx file system of the account; the mount helper's address map."""
        from moto.efs.models import efs_backends
        from moto.fsx.models import fsx_backends

        endpoints: dict[str, dict[str, str]] = {}
        wanted: set[str] = set()
        for fs in list(efs_backends[ACCOUNT][self.region].file_systems_by_id.values()):
            directory = f"efs/{fs.file_system_id}"
            wanted.add(directory)
            for target in list(fs._mount_targets.values()):
                endpoints[target.ip_address] = {"dir": directory}
            endpoints[f"{fs.file_system_id}.efs.{self.region}.amazonaws.com"] = {"dir": directory}
        for fs in list(fsx_backends[ACCOUNT][self.region].file_systems.values()):
            directory = f"fsx/{fs.file_system_id}"
            wanted.add(directory)
            endpoints[fs.dns_name] = {"dir": directory}
        self.nodes.sync_storage(wanted, endpoints)
        self.export_to_s3()

    def export_to_s3(self) -> None:
        """FSx's automatic export (data repository associations with an AutoExportPolicy): new and
        changed files to S3, every EXPORT_EVERY seconds (twins/aws/fsx.py)."""
        from moto.s3.models import s3_backends

        from clusterbake.twins.aws import fsx

        if time.monotonic() < getattr(self, "_next_export", 0.0):
            return
        self._next_export = time.monotonic() + EXPORT_EVERY
        s3 = s3_backends[ACCOUNT]["aws"]
        for file_system_id, path, s3_path in fsx.exports(ACCOUNT, self.region):
            directory = self.nodes.storage / "fsx" / file_system_id
            put = lambda bucket, key, data: s3.put_object(bucket, key, data)  # noqa: E731
            for key in fsx.export_changes(directory, path, s3_path, put):
                log(f"fsx {file_system_id}: exported {key} to {s3_path}")

    def keep_nodes(self) -> None:
        keep_reconciling(self.reconcile, self.stopping, POLL)

    def close(self) -> None:
        """Nothing to close: moto and the metadata service end with the process."""

    # --- control ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        running = self.nodes.running()
        return {
            "region": self.region,
            "endpoint": f"http://{self.args.address}:{self.args.port}",
            "instances": [
                {
                    "instance_id": i.id,
                    "state": i.state,
                    "address": i.private_ip,
                    "image_id": i.image_id,
                    "node": "running" if i.id in running else ("stopped" if i.id in self.nodes.known() else "absent"),
                    "notices": self.notices.get(i.id, {}),
                }
                for i in self.instances()
            ],
        }

    def set_notice(self, instance_id: str, kind: str, body: dict[str, Any] | None) -> dict[str, Any]:
        if not any(i.id == instance_id for i in self.instances()):
            raise KeyError(instance_id)
        notices = self.notices.setdefault(instance_id, {})
        if body is None:
            notices.pop(kind, None)
        elif kind == "spot":
            after = float(body.get("seconds", 120))
            notices["spot"] = {
                "action": body.get("action", "terminate"),
                "time": iso(datetime.now(UTC) + timedelta(seconds=after)),
                "enforce": bool(body.get("enforce", False)),
            }
        elif kind == "rebalance":
            notices["rebalance"] = {"noticeTime": iso(datetime.now(UTC))}
        else:
            raise KeyError(kind)
        log(f"notice {kind} on {instance_id}: {notices.get(kind)}")
        return notices

    @property
    def capacity_file(self) -> Path:
        return Path(os.environ.get("MOTO_CAPACITY_FILE") or self.root / "capacity.json")

    def capacity(self) -> dict[str, int]:
        try:
            return json.loads(self.capacity_file.read_text())
        except (OSError, ValueError):
            return {}

    def set_capacity(self, limits: dict[str, Any] | None) -> dict[str, int]:
        if limits is None:
            self.capacity_file.unlink(missing_ok=True)
            log("capacity: no limits")
            return {}
        from clusterbake.twins.aws.moto_ext import capacity_limit

        if not isinstance(limits, dict) or not all(isinstance(k, str) for k in limits):
            raise ValueError('expected {"instance type": count or {"count": N, "code": CODE}, ...}')
        for value in limits.values():
            capacity_limit(value)
        tmp = self.capacity_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(limits, sort_keys=True))
        tmp.replace(self.capacity_file)
        log(f"capacity: {limits}")
        return limits

    @property
    def faults_file(self) -> Path:
        return Path(os.environ.get("MOTO_FAULTS_FILE") or self.root / "faults.json")

    def faults(self) -> dict:
        try:
            return json.loads(self.faults_file.read_text())
        except (OSError, ValueError):
            return {}

    def set_faults(self, faults: dict | None) -> dict:
        from clusterbake.twins.aws.moto_ext import check_faults

        if faults is None:
            self.faults_file.unlink(missing_ok=True)
            log("faults: none")
            return {}
        tmp = self.faults_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(check_faults(faults), sort_keys=True))
        tmp.replace(self.faults_file)
        log(f"faults: {faults}")
        return faults

    def control(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """The control socket's requests (twins/runtime.py serves them)."""
        if method == "GET":
            if path == "/status":
                return HTTPStatus.OK, self.status()
            if path == "/capacity":
                return HTTPStatus.OK, self.capacity()
            if path == "/faults":
                return HTTPStatus.OK, self.faults()
            return HTTPStatus.NOT_FOUND, {"error": path}
        if path == "/capacity" and method == "PUT":
            try:
                return HTTPStatus.OK, self.set_capacity(body)
            except (ValueError, AttributeError) as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        if path == "/capacity" and method == "DELETE":
            return HTTPStatus.OK, self.set_capacity(None)
        if path == "/faults":
            try:
                return HTTPStatus.OK, self.set_faults(body if method == "PUT" else None)
            except ValueError as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        if method not in ("PUT", "DELETE"):
            return HTTPStatus.NOT_FOUND, {"error": path}
        parts = path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "instances" or parts[2] != "notices":
            return HTTPStatus.NOT_FOUND, {"error": path}
        try:
            return HTTPStatus.OK, self.set_notice(parts[1], parts[3], body if method == "PUT" else None)
        except KeyError as exc:
            return HTTPStatus.NOT_FOUND, {"error": f"unknown {exc}"}

    def serve_control(self, path: Path) -> None:
        serve_control(path, self.control)


def main(argv: list[str] | None = None) -> int:
    parser = daemon_parser("EC2", 4566, "moto listens", "NAME=IMAGE_DIR, registered as an AMI")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--zone", default="us-east-1a")
    parser.add_argument("--vpc-cidr", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    twin = Twin(args)
    root = Path(args.state)

    def start() -> dict[str, Any]:
        twin.start_moto()
        account = twin.setup_account()
        twin.vpc_id = account["vpc_id"]
        with open_private(root / "credentials") as credentials:
            credentials.write(
                "# The EC2 twin's administrator key: accepted by the twin only.\n"
                f"[clusterbake-twin]\naws_access_key_id = {account['access_key_id']}\n"
                f"aws_secret_access_key = {account['secret_access_key']}\n"
            )
        twin.start_imds()
        twin.serve_control(root / "control.sock")
        return {
            "endpoint": f"http://{args.address}:{args.port}",
            "region": args.region,
            "availability_zone": args.zone,
            "vpc_id": account["vpc_id"],
            "subnet_id": account["subnet_id"],
            "vpc_cidr": args.vpc_cidr,
            "subnet_cidr": args.subnet_cidr,
            "amis": account["amis"],
            "images": {ami: str(path.parent) for ami, path in twin.images.items()},
        }

    return run_daemon(root, twin, start)


if __name__ == "__main__":
    sys.exit(main())
