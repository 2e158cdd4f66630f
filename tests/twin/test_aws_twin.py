"""An AWS cluster end to end on the EC2 twin (issue 7's "done when").

One cluster (examples/aws-twin.yaml as `citwin`) serves the tests in order; the last
ones take it down and check that nothing is left in the twin's account or on the host.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml
from polling import drained_by_the_poll_that_saw_the_notice, notice_log_after_the_drain, wait_for
from twintest import CLUSTER, REGION, REPO, CheckpointedTraining, run

from clusterbake.job_report import events
from clusterbake.providers.userdata import user_data

pytestmark = pytest.mark.integration


def test_example_names_the_twins_ids(twin):
    example = yaml.safe_load((REPO / "examples" / "aws-twin.yaml").read_text())["aws"]
    status = twin.status()
    assert status["running"]
    assert (example["vpc_id"], example["subnet_id"]) == (status["vpc_id"], status["subnet_id"])
    assert example["ami_id"] in status["amis"].values()


def test_compute_nodes_joined_by_themselves(twin):
    # No SSH login ever reached a compute node: they fetched their bundle and joined
    # at boot, while Ansible configured only the head.
    for name in ("cpu-1", "cpu-2"):
        instance = twin.instance(name)
        logins = twin.inside(
            instance["InstanceId"], "journalctl -u ssh --no-pager | grep -c 'Accepted publickey' || true"
        )
        assert logins.stdout.strip() == "0", f"{name}: something logged in over SSH during cluster up"
        fetch = twin.inside(instance["InstanceId"], "journalctl -u clusterbake-node-fetch --no-pager")
        assert f"joined from secret clusterbake/{CLUSTER}/join/cpu" in fetch.stdout, fetch.stdout[-2000:]
    states = twin.wait_idle({"cpu-1", "cpu-2"}, timeout=30)
    assert states["cpu-1"] == states["cpu-2"] == "idle"


def test_a_user_works_from_the_login_node_and_never_needs_the_head(twin):
    """examples/aws-twin.yaml's login-1: it joined by itself from its own secret like a compute node; a
    researcher logs in over real SSH (the key of the config's users.0.ssh_authorized_keys), submits there, and the job
    runs and is accounted as theirs; the same key does not open the head. Its security groups: the
    cluster's and its own (SSH from login_nodes.ssh_cidrs); no other node has the login nodes' group."""
    login = twin.instance("login-1")
    fetch = twin.inside(login["InstanceId"], "journalctl -u clusterbake-node-fetch --no-pager")
    assert f"joined from secret clusterbake/{CLUSTER}/join/login" in fetch.stdout, fetch.stdout[-2000:]
    ec2 = twin.client("ec2")
    groups = {g["GroupName"]: g for g in ec2.describe_security_groups()["SecurityGroups"]}
    own, cluster_group = groups[f"clusterbake-{CLUSTER}-login"], groups[f"clusterbake-{CLUSTER}"]
    assert [(p.get("FromPort"), [r["CidrIp"] for r in p["IpRanges"]]) for p in own["IpPermissions"]] == [
        (22, ["10.90.0.0/16"])
    ]
    assert sorted(g["GroupId"] for g in login["NetworkInterfaces"][0]["Groups"]) == sorted(
        [own["GroupId"], cluster_group["GroupId"]]
    )
    for node in ("head", "cpu-1"):
        assert [g["GroupId"] for g in twin.instance(node)["NetworkInterfaces"][0]["Groups"]] == [
            cluster_group["GroupId"]
        ], node

    key = twin.config.parent / "researcher_key"  # its public half in the config's users.0.ssh_authorized_keys
    options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]

    def ssh(address: str, command: str):
        return run(["ssh", "-i", str(key), *options, f"researcher@{address}", command], check=False, timeout=120)

    submit = ssh(login["PrivateIpAddress"], "cd /tmp && sbatch --parsable -N2 -o /dev/null --wrap 'srun hostname'")
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    wait_for(
        f"job {job} completed",
        lambda: twin.on("head", f"sacct -n -X -P -j {job} -o State").stdout.strip() == "COMPLETED",
        180,
    )
    assert twin.on("head", f"sacct -n -X -P -j {job} -o User,NNodes").stdout.strip() == "researcher|2"
    refused = ssh(twin.instance("head")["PrivateIpAddress"], "true")
    assert refused.returncode == 255, (refused.stdout, refused.stderr)


def test_srun_on_both_nodes(twin):
    result = twin.on("head", "srun -N2 hostname")
    assert sorted(result.stdout.split()) == ["cpu-1", "cpu-2"]


def test_clusterbake_ssh_reaches_a_node_as_its_login_user_and_runs_as_root(twin):
    """The CLI's own ssh on a cloud node: the login user, then sudo (the tests' `on` keeps a
    connection open instead); the command's output and exit status come back."""
    result = twin.cb("ssh", "cpu-1", "--", "id -un; echo $SUDO_USER; exit 3", check=False)
    assert result.returncode == 3
    from clusterbake.config import load_config

    assert result.stdout.split() == ["root", load_config(twin.config).aws.ssh_user]


def test_the_heads_host_keys_were_pinned_from_its_console_not_trusted_on_first_use(twin):
    """Security review finding 8: the controller's known_hosts has the head's keys as its boot printed
    them on the console (EC2 GetConsoleOutput), before the first connection."""
    from clusterbake.state import StateDir

    state = StateDir(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")))
    known = state.cluster(CLUSTER).known_hosts.read_text()
    head = twin.instance("head")
    console = twin.client("ec2").get_console_output(InstanceId=head["InstanceId"], Latest=True)["Output"]
    assert "-----BEGIN SSH HOST KEY KEYS-----" in console
    actual = twin.on("head", "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub").stdout.strip()
    assert f"{head['PrivateIpAddress']},head {actual}" in known, known


def test_second_cluster_up_changes_nothing(twin):
    before = {n: twin.instance(n)["InstanceId"] for n in ("head", "cpu-1", "cpu-2")}
    result = twin.cb("cluster", "up", timeout=900)
    assert ", 0 changed tasks" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "launching" not in result.stderr
    assert {n: twin.instance(n)["InstanceId"] for n in before} == before


def test_deepspeed_trains_across_both_nodes_with_checkpoint_on_shared_storage(twin):
    result = twin.train_deepspeed("twin-ds")
    assert "nodes: cpu-1, cpu-2 (world size 2)" in result.stdout, result.stdout[-3000:]
    # The checkpoint is on the shared file system: the head (which ran no rank) sees it.
    checkpoints = "/shared/checkpoints/researcher/twin-ds"
    listing = twin.on("head", f"ls {checkpoints} && stat -c %U {checkpoints}")
    assert "step12" in listing.stdout.split(), listing.stdout
    assert listing.stdout.split()[-1] == "researcher"
    mounts = twin.on("cpu-1", "findmnt -n -o TARGET /shared; findmnt -n -o TARGET /home")
    assert mounts.stdout.split() == ["/shared", "/home"]


def test_checkpoints_are_copied_to_s3_and_restored_when_shared_storage_lost_them(twin):
    """After test_deepspeed_trains...: the job's checkpoints are in the bucket, under the job user's
    prefix (the job's credentials may write nowhere else); /shared loses them; the same job name,
    run again, resumes from S3's copy."""
    s3 = twin.client("s3")
    listed = s3.list_objects_v2(Bucket="clusterbake-twin-checkpoints", Prefix="twindemo/researcher/twin-ds/")
    keys = {item["Key"] for item in listed.get("Contents", [])}
    assert "twindemo/researcher/twin-ds/latest" in keys
    assert any(key.startswith("twindemo/researcher/twin-ds/step12/") for key in keys), sorted(keys)
    latest = s3.get_object(Bucket="clusterbake-twin-checkpoints", Key="twindemo/researcher/twin-ds/latest")[
        "Body"
    ].read()
    assert latest == b"step12\n"
    twin.on("head", "rm -rf /shared/checkpoints/researcher/twin-ds")  # the shared file system lost them
    result = twin.cb(
        "job", "submit", "deepspeed", "--nodes", "2", "--upload", "examples/deepspeed", "--job-name", "twin-ds",
        "--wait", "--raw", "--", "deepspeed/train.py", "--deepspeed_config", "deepspeed/ds_config.json",
        "--steps", "18", "--checkpoint-every", "6",
        timeout=1200,
    )  # fmt: skip
    assert (
        "restored checkpoint step12 from s3://clusterbake-twin-checkpoints/twindemo/researcher/twin-ds" in result.stdout
    )
    found = events(result.stdout)
    assert next(e for e in found if e["event"] == "resumed")["step"] == 12
    assert next(e for e in found if e["event"] == "done")["steps"] == 18


def test_stopped_and_started_instance_rejoins_without_ansible(twin):
    twin.cb("node", "stop", "cpu-2")
    assert twin.instance("cpu-2")["State"]["Name"] == "stopped"
    twin.cb("node", "start", "cpu-2")
    twin.wait_idle({"cpu-2"})
    assert sorted(twin.on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


def test_terminated_instance_is_replaced_and_rejoins_without_ansible(twin):
    old = twin.instance("cpu-2")
    ec2 = twin.client("ec2")
    ec2.terminate_instances(InstanceIds=[old["InstanceId"]])
    ec2.get_waiter("instance_terminated").wait(InstanceIds=[old["InstanceId"]], WaiterConfig={"Delay": 1})
    twin.cb("node", "start", "cpu-2")
    new = twin.instance("cpu-2")
    assert new["InstanceId"] != old["InstanceId"]
    # The replacement keeps the node's address: nothing on the head changes.
    assert new["PrivateIpAddress"] == old["PrivateIpAddress"]
    # A boot and a join from scratch: minutes on a loaded 2-core host (four lanes of the suite at once).
    twin.wait_idle({"cpu-2"}, timeout=360)
    fetch = twin.inside(new["InstanceId"], "journalctl -u clusterbake-node-fetch --no-pager")
    assert "joined from secret" in fetch.stdout
    assert sorted(twin.on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


def test_instance_without_the_profile_cannot_read_the_bundle(twin):
    cpu1 = twin.instance("cpu-1")
    ec2 = twin.client("ec2")
    raw = ec2.describe_instance_attribute(InstanceId=cpu1["InstanceId"], Attribute="userData")["UserData"]["Value"]
    document = base64.b64decode(raw).decode()
    join = json.loads(re.search(r"\{\n.*\n\}", document, re.S).group(0))["join"]
    data = user_data(cluster=CLUSTER, hostname="intruder", ssh_user="ubuntu", authorized_keys=[], join=join)
    launched = ec2.run_instances(
        ImageId=cpu1["ImageId"],
        InstanceType="c7a.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=cpu1["SubnetId"],
        UserData=data,
        MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
    )["Instances"][0]
    try:
        deadline = time.monotonic() + 120
        journal = ""
        while time.monotonic() < deadline:
            time.sleep(3)
            journal = twin.inside(
                launched["InstanceId"], "journalctl -u clusterbake-node-fetch --no-pager", check=False
            ).stdout
            if "no IAM instance profile" in journal:
                break
        assert "this instance has no IAM instance profile, so it cannot read its join bundle" in journal, journal
        assert twin.inside(launched["InstanceId"], "test -e /etc/munge/munge.key", check=False).returncode != 0
    finally:
        ec2.terminate_instances(InstanceIds=[launched["InstanceId"]])


def test_node_role_reads_only_its_own_clusters_secrets(twin):
    secrets = twin.client("secretsmanager")
    other = secrets.create_secret(Name="clusterbake/othercluster/join/cpu", SecretString="not yours")["ARN"]
    try:
        probe = (
            "import boto3, json, sys\n"
            "source = json.load(open('/etc/clusterbake/join-source.json'))\n"
            "c = boto3.session.Session().client('secretsmanager', region_name=source['region'],"
            " endpoint_url=source['endpoint_url'])\n"
            "out = {}\n"
            "own, other = source['secret_id'], sys.argv[1]\n"
            "for name, stage in ((own, 'AWSCURRENT'), (own, None), (other, 'AWSCURRENT')):\n"
            "    try:\n"
            "        c.get_secret_value(SecretId=name, **({'VersionStage': stage} if stage else {}))\n"
            "        out[f'{name} {stage}'] = 'read'\n"
            "    except Exception as exc:\n"
            "        out[f'{name} {stage}'] = type(exc).__name__ + ': ' + str(exc)\n"
            "print(json.dumps(out))\n"
        )
        result = twin.on("cpu-1", f"python3 -c {shlex.quote(probe)} clusterbake/othercluster/join/cpu")
        answers = json.loads(result.stdout)
        assert answers[f"clusterbake/{CLUSTER}/join/cpu AWSCURRENT"] == "read"  # as the boot program asks
        # Only the current version, asked for by its stage (finding 14): no stage named, no read.
        assert "AccessDenied" in answers[f"clusterbake/{CLUSTER}/join/cpu None"]
        assert "AccessDenied" in answers["clusterbake/othercluster/join/cpu AWSCURRENT"]
    finally:
        secrets.delete_secret(SecretId=other, ForceDeleteWithoutRecovery=True)


IMDS_TOKEN = (
    "import urllib.request as u\n"
    "ask = u.Request('http://169.254.169.254/latest/api/token', method='PUT',"
    " headers={'X-aws-ec2-metadata-token-ttl-seconds': '60'})\n"
    "try:\n"
    "    print('token' if u.urlopen(ask, timeout=3).read() else 'empty')\n"
    "except Exception as exc:\n"
    "    print('refused:', exc)\n"
)


def imds_token_as(twin, node: str, user: str) -> str:
    command = f"python3 -c {shlex.quote(IMDS_TOKEN)}"
    return twin.on(node, f"runuser -u {user} -- {command}" if user != "root" else command).stdout.strip()


def test_only_root_reaches_the_metadata_service_and_on_the_head_the_power_programs_user(twin):
    """Security review finding 1 (critical): any user or job on any node took the node's role from the
    metadata service, then the join bundle (the munge key) from Secrets Manager, and forged root."""
    for node in ("cpu-1", "login-1", "head"):
        assert imds_token_as(twin, node, "root") == "token", node
        for user in ("researcher", "mallory"):
            answer = imds_token_as(twin, node, user)
            assert answer.startswith("refused:"), (node, user, answer)
    assert imds_token_as(twin, "head", "slurm") == "token"  # the power program launches nodes
    assert imds_token_as(twin, "cpu-1", "slurm").startswith("refused:")
    readable = twin.on("cpu-1", "runuser -u researcher -- cat /etc/clusterbake/join-source.json", check=False)
    assert readable.returncode != 0, "where the bundle is (secret, vault, identity) is root's to know"
    # The exploit's next step, with the SDK's default chain: no credentials to be had.
    secret = (
        "import boto3\n"
        f"c = boto3.session.Session().client('secretsmanager', region_name='{REGION}',"
        f" endpoint_url='{twin.env['AWS_ENDPOINT_URL']}')\n"
        "try:\n"
        f"    c.get_secret_value(SecretId='clusterbake/{CLUSTER}/join/cpu'); print('read')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    taken = twin.on("cpu-1", f"runuser -u researcher -- python3 -c {shlex.quote(secret)}").stdout.strip()
    assert taken == "NoCredentialsError", taken


def test_a_container_on_a_node_gets_nothing_from_the_metadata_service(twin):
    """Finding 9: a container (its own network namespace, NAT through the node) one hop behind the
    node. The guard drops its traffic in the forward chain; the hop limit (1) would stop the token."""
    setup = (
        "set -e; ip netns add cbsec; ip link add cbsec0 type veth peer name cbsec1; ip link set cbsec1 netns cbsec;"
        " ip addr add 10.251.0.1/30 dev cbsec0; ip link set cbsec0 up;"
        " ip -n cbsec addr add 10.251.0.2/30 dev cbsec1; ip -n cbsec link set cbsec1 up; ip -n cbsec link set lo up;"
        " ip -n cbsec route add default via 10.251.0.1;"
        " nft add table ip cbsecnat; nft 'add chain ip cbsecnat post { type nat hook postrouting priority srcnat; }';"
        " nft add rule ip cbsecnat post ip saddr 10.251.0.0/30 masquerade"
    )
    dropped = "nft list chain inet clusterbake_imds forward | grep -o 'packets [0-9]*' | head -1 | cut -d' ' -f2"
    # Forwarding on, as the node's root would (nspawn keeps /proc/sys read-only inside: from the host,
    # in the node's network namespace).
    node_netns = f"cb-twin-aws-{twin.instance('cpu-1')['InstanceId']}"
    forwarding = ["ip", "netns", "exec", node_netns, "sysctl", "-qw"]
    try:
        run([*forwarding, "net.ipv4.ip_forward=1"])
        twin.on("cpu-1", setup)
        before = int(twin.on("cpu-1", dropped).stdout)
        answer = twin.on("cpu-1", f"ip netns exec cbsec python3 -c {shlex.quote(IMDS_TOKEN)}").stdout.strip()
        assert answer.startswith("refused:"), answer
        assert int(twin.on("cpu-1", dropped).stdout) > before  # dropped by the guard, not only by the TTL
    finally:
        twin.on("cpu-1", "ip netns del cbsec; nft delete table ip cbsecnat", check=False)
        run([*forwarding, "net.ipv4.ip_forward=0"], check=False)


def test_cluster_instances_pin_the_metadata_hop_limit_to_one(twin):
    """Finding 9: our AMIs say ImdsSupport v2.0, which makes EC2 (and the twin) default the hop limit to 2."""
    for node in ("head", "login-1", "cpu-1", "cpu-2"):
        options = twin.instance(node)["MetadataOptions"]
        assert (options["HttpTokens"], options["HttpPutResponseHopLimit"]) == ("required", 1), (node, options)


ROLE_CREDENTIALS = (
    "import json, urllib.request as u\n"
    "IMDS = 'http://169.254.169.254/latest/'\n"
    "ask = u.Request(IMDS + 'api/token', method='PUT', headers={'X-aws-ec2-metadata-token-ttl-seconds': '60'})\n"
    "token = {'X-aws-ec2-metadata-token': u.urlopen(ask).read().decode()}\n"
    "role = u.urlopen(u.Request(IMDS + 'meta-data/iam/security-credentials/', headers=token)).read().decode()\n"
    "print(u.urlopen(u.Request(IMDS + 'meta-data/iam/security-credentials/' + role, headers=token)).read().decode())\n"
)


def test_the_heads_role_launches_only_compute_nodes_from_their_templates_and_ends_only_them(twin):
    """Security review finding 2: whoever held the head's credentials (any user on the head, before the
    metadata guard) could launch any instance type without a template, with a key pair and user data of
    their choice, terminate the head, and read every join bundle. The credentials are taken here as
    root does on the head, then used as that user would."""
    import boto3

    answer = json.loads(twin.on("head", f"python3 -c {shlex.quote(ROLE_CREDENTIALS)}").stdout)
    head_role = boto3.session.Session(
        aws_access_key_id=answer["AccessKeyId"],
        aws_secret_access_key=answer["SecretAccessKey"],
        aws_session_token=answer["Token"],
        region_name=REGION,
    )
    ec2 = head_role.client("ec2", endpoint_url=twin.env["AWS_ENDPOINT_URL"])
    cpu1, head = twin.instance("cpu-1"), twin.instance("head")

    def refused(call, **params) -> str:
        try:
            call(**params)
        except Exception as exc:
            return type(exc).__name__ + ": " + str(exc)
        return "allowed"

    plain = refused(ec2.run_instances, ImageId=cpu1["ImageId"], InstanceType="p5.48xlarge", MinCount=1, MaxCount=1,
                    SubnetId=cpu1["SubnetId"])  # fmt: skip
    assert "UnauthorizedOperation" in plain or "AccessDenied" in plain, plain
    templates = twin.client("ec2").describe_launch_templates(
        Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}]
    )["LaunchTemplates"]
    compute = next(t for t in templates if t["LaunchTemplateName"].endswith("-cpu"))
    other_type = refused(ec2.run_instances, LaunchTemplate={"LaunchTemplateId": compute["LaunchTemplateId"]},
                         InstanceType="p5.48xlarge", MinCount=1, MaxCount=1)  # fmt: skip
    assert "UnauthorizedOperation" in other_type or "AccessDenied" in other_type, other_type
    ended = refused(ec2.terminate_instances, InstanceIds=[head["InstanceId"]])
    assert "UnauthorizedOperation" in ended or "AccessDenied" in ended, ended
    assert twin.instance("head")["State"]["Name"] == "running"
    secrets = head_role.client("secretsmanager", endpoint_url=twin.env["AWS_ENDPOINT_URL"])
    bundle = refused(secrets.get_secret_value, SecretId=f"clusterbake/{CLUSTER}/join/cpu")
    assert "AccessDenied" in bundle, bundle


COPY_PROBE = (
    "import boto3, json, os, sys\n"
    "s3 = boto3.session.Session().client('s3', endpoint_url=os.environ['CLUSTERBAKE_S3_ENDPOINT_URL'] or None)\n"
    "bucket, _, prefix = os.environ['CLUSTERBAKE_CHECKPOINT_COPY_ROOT'].removeprefix('s3://').partition('/')\n"
    "out = {}\n"
    "for who in sys.argv[1:]:\n"
    "    try:\n"
    "        s3.put_object(Bucket=bucket, Key=f\"{prefix.strip('/')}/{who}/security-probe\", Body=b'x')\n"
    "        out[who] = 'written'\n"
    "    except Exception as exc:\n"
    "        out[who] = type(exc).__name__ + ': ' + str(exc)\n"
    "endpoint = os.environ['CLUSTERBAKE_S3_ENDPOINT_URL']  # the twin's one endpoint\n"
    "secrets = boto3.session.Session().client('secretsmanager', endpoint_url=endpoint)\n"
    "try:\n"
    f"    secrets.get_secret_value(SecretId='clusterbake/{CLUSTER}/join/cpu'); out['secret'] = 'read'\n"
    "except Exception as exc:\n"
    "    out['secret'] = type(exc).__name__ + ': ' + str(exc)\n"
    "print(json.dumps(out))\n"
)


def test_a_jobs_credentials_reach_its_own_users_checkpoint_copies_only(twin):
    """Finding 5: the copies were the node role's, shared by every user (another user's `latest` and
    checkpoints were anyone's to rewrite). A job now gets a session of the jobs role narrowed to its
    user's prefix, from the node's helper (sudo; the job never holds the node's role)."""
    s3 = twin.client("s3")
    try:
        for user, other in (("researcher", "mallory"), ("mallory", "researcher")):
            command = (
                "set -a; . /etc/clusterbake/checkpoints.env; set +a; "
                f"python3 -c {shlex.quote(COPY_PROBE)} {user} {other}"
            )
            answers = json.loads(twin.on("cpu-1", f"runuser -u {user} -- sh -c {shlex.quote(command)}").stdout)
            assert answers[user] == "written", answers
            assert "AccessDenied" in answers[other], answers
            assert "AccessDenied" in answers["secret"], answers
    finally:
        for user in ("researcher", "mallory"):
            s3.delete_object(Bucket="clusterbake-twin-checkpoints", Key=f"twindemo/{user}/security-probe")


def test_spot_and_rebalance_notices_appear_in_the_nodes_metadata(twin):
    from clusterbake.state import StateDir
    from clusterbake.twins.aws import control

    state = StateDir(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")))
    instance_id = twin.instance("cpu-1")["InstanceId"]
    probe = (
        "import urllib.request as u\n"
        "IMDS = 'http://169.254.169.254/latest/'\n"
        "ask = u.Request(IMDS + 'api/token', method='PUT', headers={'X-aws-ec2-metadata-token-ttl-seconds': '60'})\n"
        "token = u.urlopen(ask).read().decode()\n"
        "for path in ('spot/instance-action', 'events/recommendations/rebalance'):\n"
        "    try:\n"
        "        print(u.urlopen(u.Request(IMDS + 'meta-data/' + path, headers={'X-aws-ec2-metadata-token': token}))"
        ".read().decode())\n"
        "    except Exception as exc:\n"
        "        print(exc)\n"
    )
    read = f"python3 -c {shlex.quote(probe)}"
    before = twin.inside(instance_id, read).stdout.splitlines()
    assert all("404" in line for line in before), before
    control.request(state, "PUT", f"/instances/{instance_id}/notices/spot", {"action": "terminate", "seconds": 120})
    control.request(state, "PUT", f"/instances/{instance_id}/notices/rebalance", {})
    spot, rebalance = (json.loads(line) for line in twin.inside(instance_id, read).stdout.splitlines())
    assert spot["action"] == "terminate" and spot["time"].endswith("Z")
    assert set(rebalance) == {"noticeTime"}
    control.request(state, "DELETE", f"/instances/{instance_id}/notices/spot")
    control.request(state, "DELETE", f"/instances/{instance_id}/notices/rebalance")
    assert all("404" in line for line in twin.inside(instance_id, read).stdout.splitlines())
    assert twin.instance("cpu-1")["State"]["Name"] == "running"  # a notice without enforce stops nothing


def test_a_spot_interruption_mid_training_checkpoints_requeues_and_the_node_is_replaced(twin):
    """EC2's two-minute notice (here 60 s, then the twin terminates the instance as EC2 does): the
    node's agent drains it while the instance runs, the job checkpoints and requeues, the head's reconcile loop
    launches a replacement at the node's address, and the training completes."""
    from clusterbake.state import StateDir
    from clusterbake.twins.aws import control

    state = StateDir(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")))
    training = CheckpointedTraining(twin, "twin-spot")
    old = twin.instance("cpu-2")
    body = {"action": "terminate", "seconds": 60, "enforce": True}
    control.request(state, "PUT", f"/instances/{old['InstanceId']}/notices/spot", body)
    noticed = time.monotonic()

    def reason() -> str:
        return twin.on("head", "sinfo --noheader --Node --nodes cpu-2 --format=%E").stdout.strip()

    # Drained within the notice, while the instance still runs (how soon: bench, not a test).
    wait_for("cpu-2 drained", lambda: reason().startswith("clusterbake: spot reclaim at"), timeout=60, interval=0.25)
    print(f"cpu-2 drained {time.monotonic() - noticed:.1f} s after the notice")
    still = twin.instance("cpu-2", states=("running",)) or {}
    assert still.get("InstanceId") == old["InstanceId"], "drained only after the reclaim"
    read_log = lambda: twin.on("cpu-2", "cat /var/log/clusterbake/notice.log").stdout  # noqa: E731
    notice_log = notice_log_after_the_drain(read_log, "cpu-2")
    assert drained_by_the_poll_that_saw_the_notice(notice_log, "cpu-2"), notice_log
    assert reason().endswith("(EC2 spot/instance-action terminate)")

    training.assert_resumed_from_the_notice_checkpoint()
    new = twin.instance("cpu-2")
    assert new["InstanceId"] != old["InstanceId"] and new["PrivateIpAddress"] == old["PrivateIpAddress"]
    assert (
        "reconcile: cpu-2 lost: started again and returned to service"
        in twin.on("head", "cat /var/log/clusterbake/power.log").stdout
    )
    twin.wait_idle({"cpu-1", "cpu-2"})


def test_cluster_down_leaves_nothing_in_the_account_or_on_the_host(twin):
    twin.cb("cluster", "down", timeout=600)
    twin.assert_cluster_gone()
    assert not run(["ip", "netns", "list"]).stdout.count("cb-twin-aws-i-")
