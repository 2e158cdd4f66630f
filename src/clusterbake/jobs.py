"""Submit job templates from the workstation, follow them, report on them.

Everything goes through the head node over SSH (clusterbake.remote, to the provider's
endpoint; one connection for the whole session), so the same code serves the local
cluster and cloud clusters. Jobs run as a cluster user (the config's first user
unless --user says otherwise), never as root by accident.

Scripts, uploads and job output live in the user's private directory /shared/jobs/<user>
(0700, made by the head's join where only root writes). Every write there is the job
user's own (runuser): root never follows a path a cluster user could have planted.
"""

from __future__ import annotations

import re
import shlex
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from clusterbake import remote
from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.job_report import detect_transport, format_report, progress_line, training_summary
from clusterbake.paths import repo_root
from clusterbake.progress import say
from clusterbake.providers import get_provider
from clusterbake.providers.base import Provider
from clusterbake.remote import Endpoint

JOBS_DIR = "/shared/jobs"
# What names a job or an upload: it becomes a file name in the user's directory.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A job id as Slurm prints it (an array task: 12_3); anything else never reaches a shell line.
JOB_ID = re.compile(r"^\d+(_\d+)?$")
# As the job's user, in its directory (must be its own, real one): $1 the directory.
OWN_DIRECTORY = (
    'd=$1; if [ ! -d "$d" ] || [ -L "$d" ] || [ ! -O "$d" ]; then '
    "echo \"clusterbake: $d is not a directory of $(id -un) (the head's join makes it: clusterbake cluster up,"
    ' or ops user_add)" >&2; exit 3; fi; umask 077; cd "$d"'
)
TERMINAL = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT",
}  # fmt: skip


@dataclass
class JobState:
    state: str
    exit_code: int
    stdout: str | None
    restarts: int
    user: str  # whose job: its files are read as that user


class Head:
    """Commands on the head node."""

    def __init__(self, provider: Provider):
        self.provider = provider
        self._endpoint: Endpoint | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:  # found once: on clouds the lookup is an API call
            self._endpoint = self.provider.controller_endpoint()
        return self._endpoint

    def run(self, command: str, stdin: bytes | None = None, check: bool = True) -> remote.Result:
        """A shell command line as root; stdout/stderr as bytes. check: raise on a non-zero exit status."""
        return remote.run(self.endpoint, command, stdin=stdin, timeout=120, check=check)

    def text(self, command: str) -> str:
        return self.run(command).stdout.decode(errors="replace")


def resolve_template(template: str) -> Path:
    path = Path(template)
    if path.is_file():
        return path
    name = template if template.endswith(".sbatch") else f"{template}.sbatch"
    candidate = repo_root() / "scripts" / "jobs" / name
    if candidate.is_file():
        return candidate
    known = ", ".join(sorted(p.stem for p in (repo_root() / "scripts" / "jobs").glob("*.sbatch")))
    raise ConfigError(f"job template '{template}': no such file and not one of {known}")


def job_user(config: ClusterConfig, user: str | None) -> str:
    if user:
        if user != "root" and user not in {u.name for u in config.users}:
            raise ConfigError(f"--user {user}: not a user of the config (users: {[u.name for u in config.users]})")
        return user
    if not config.users:
        raise ConfigError("the config has no users: add one (users:) for jobs to run as, or pass --user root")
    return config.users[0].name


def user_jobs_dir(user: str) -> str:
    return f"{JOBS_DIR}/{user}"


def as_user(user: str, script: str, *args: str) -> str:
    """A shell line running `script` as `user` in its own jobs directory ($1 onwards: args)."""
    body = f"{OWN_DIRECTORY}; {script}"
    return shlex.join(["runuser", "-u", user, "--", "sh", "-c", body, "sh", user_jobs_dir(user), *args])


def partition_nodes(config: ClusterConfig, partition: str | None) -> tuple[str, int]:
    parts = config.effective_partitions()
    chosen = next((p for p in parts if p.name == partition), None) if partition else next(p for p in parts if p.default)
    if chosen is None:
        raise ConfigError(f"--partition {partition}: no such partition (partitions: {[p.name for p in parts]})")
    groups = {g.name: g.max_nodes for g in config.node_groups}
    return chosen.name, sum(groups[name] for name in chosen.node_groups)


def gpus_per_node(head: Head, partition: str) -> int:
    """The GPUs of the partition's smallest node, as Slurm knows them (sinfo's GRES column)."""
    text = head.text(f"sinfo --noheader --partition={shlex.quote(partition)} --format=%G")
    return min((gres_gpus(line) for line in text.split()), default=0)


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: `gpu:h100:8(S:0-1),nic:1` -> 8; `(null)` -> 0."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        fields = item.split(":")
        if fields[0] == "gpu":
            total += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return total


def upload(head: Head, directory: Path, user: str) -> str:
    """Copy a directory to /shared/jobs/<user>/<its name> on the cluster, extracted by the job's user."""
    if not directory.is_dir():
        raise ConfigError(f"--upload {directory}: not a directory")
    name = directory.resolve().name
    if not SAFE_NAME.match(name):
        raise ConfigError(f"--upload {directory}: name the directory with letters, digits, '.', '_' or '-'")
    with tempfile.TemporaryFile() as buffer:
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(directory, arcname=".", filter=lambda info: None if "__pycache__" in info.name else info)
        buffer.seek(0)
        head.run(as_user(user, 'mkdir -p -- "$2" && tar -x --no-same-owner -C "$2"', name), stdin=buffer.read())
    return f"{user_jobs_dir(user)}/{name}"


def submit(
    config: ClusterConfig,
    template: str,
    *,
    nodes: str | None = None,
    partition: str | None = None,
    user: str | None = None,
    job_name: str | None = None,
    upload_dir: Path | None = None,
    args: list[str] | None = None,
    gpus: int | None = None,
    container: str | None = None,
) -> tuple[Head, str, str]:
    """Submit a template; returns (head, job id, output file). With `container`, the template runs
    its steps in that image (scripts/jobs/container-args: an imported bundle, or Pyxis's image)."""
    script = resolve_template(template)
    run_as = job_user(config, user)
    part, part_nodes = partition_nodes(config, partition)
    count = part_nodes if nodes in (None, "all") else int(nodes)
    if count < 1 or count > part_nodes:
        raise ConfigError(f"--nodes {nodes}: partition {part} has {part_nodes} nodes")
    name = job_name or script.stem
    if not SAFE_NAME.match(name):
        raise ConfigError(f"--job-name {name!r}: use letters, digits, '.', '_' or '-' (it names files)")
    head = Head(get_provider(config))
    if upload_dir:
        say(f"    uploaded {upload_dir} to {upload(head, upload_dir, run_as)}")
    jobs_dir = user_jobs_dir(run_as)
    remote_script = f"{jobs_dir}/{name}.sbatch"
    head.run(as_user(run_as, 'cat > "$2.sbatch"', name), stdin=script.read_bytes())
    output = f"{jobs_dir}/%x-%j.out"
    # Slurm gives a job GPUs only when it asks (even --exclusive ones): every GPU of the node.
    gpus = gpus_per_node(head, part) if gpus is None else gpus
    sbatch = [
        "sbatch", "--parsable", f"--job-name={name}", f"--partition={part}", f"--nodes={count}",
        *([f"--gpus-per-node={gpus}"] if gpus else []),
        *([f"--export=ALL,CLUSTERBAKE_CONTAINER={container}"] if container else []),
        f"--output={output}", remote_script, *(args or []),
    ]  # fmt: skip
    if gpus:
        say(f"    {gpus} GPUs per node")
    job_id = head.text(as_user(run_as, 'shift; exec "$@"', *sbatch)).strip().split(";")[0]
    if not job_id.isdigit():
        raise ClusterbakeError(f"sbatch did not return a job id: {job_id!r}")
    return head, job_id, output.replace("%x", name).replace("%j", job_id)


def job_state(head: Head, job_id: str) -> JobState | None:
    if not JOB_ID.match(job_id):
        raise ConfigError(f"job id {job_id!r}: a Slurm job id is a number (or NUMBER_TASK for an array task)")
    result = head.run(f"scontrol show job -o {job_id}", check=False)
    if result.returncode != 0:
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", result.stdout.decode(errors="replace")))
    code, _, signal = fields.get("ExitCode", "0:0").partition(":")
    exit_code = int(code) if int(code or 0) else (128 + int(signal) if int(signal or 0) else 0)
    user = fields.get("UserId", "").partition("(")[0]
    return JobState(
        fields.get("JobState", "UNKNOWN"), exit_code, fields.get("StdOut"), int(fields.get("Restarts", 0)), user
    )


def read_as(head: Head, user: str, path: str, offset: int = 0) -> bytes:
    """A job's file from `offset` on, read by the job's user (a user's file may be a link to
    anything root can read); empty if it is not there (yet)."""
    tail = ["runuser", "-u", user, "--", "tail", "-c", f"+{offset + 1}", "--", path]
    return head.run(f"{shlex.join(tail)} 2>/dev/null", check=False).stdout


class LineStream:
    """Whole lines to `stream`, each through `render` (a partial line waits for its end)."""

    def __init__(self, stream, render):
        self.stream, self.render, self.pending = stream, render, ""

    def write(self, text: str, final: bool = False) -> None:
        *complete, self.pending = (self.pending + text).split("\n")
        if final and self.pending:
            complete.append(self.pending)
            self.pending = ""
        for line in complete:
            self.stream.write(self.render(line) + "\n")
        self.stream.flush()


def follow(head: Head, job_id: str, output: str, poll: float = 1.0, stream=sys.stdout, raw: bool = False) -> JobState:
    """Stream the job's output until it ends (a requeued job is followed on); training events as
    progress lines unless `raw`."""
    offset = 0
    last: JobState | None = None
    lines = LineStream(stream, (lambda line: line) if raw else progress_line)
    while True:
        state = job_state(head, job_id)
        user = (state or last).user if (state or last) else ""
        chunk = read_as(head, user, output, offset) if user else b""
        if chunk:
            offset += len(chunk)
            lines.write(chunk.decode(errors="replace"))
        if state is None:
            if last is None:
                raise ClusterbakeError(f"job {job_id} is unknown to slurmctld")
            return last
        if state.state != (last.state if last else None):
            say(f"    job {job_id}: {state.state}" + (f" (restart {state.restarts})" if state.restarts else ""))
        last = state
        if state.state in TERMINAL:
            time.sleep(poll)  # let the last lines reach the shared filesystem
            lines.write(read_as(head, state.user, output, offset).decode(errors="replace"), final=True)
            return state
        time.sleep(poll)


def job_log(head: Head, job_id: str) -> str:
    state = job_state(head, job_id)
    if state and state.stdout:
        path, user = state.stdout, state.user
    else:  # gone from slurmctld: the output clusterbake asked for, in its user's directory
        found = head.text(f"ls -1 {JOBS_DIR}/*/*-{job_id}.out 2>/dev/null || true").split()
        if not found:
            raise ClusterbakeError(f"no log for job {job_id}: not in slurmctld any more and not in {JOBS_DIR}/<user>")
        path = found[0]
        user = path.split("/")[3]  # /shared/jobs/<user>/<name>-<id>.out
    return read_as(head, user, path).decode(errors="replace")


def report(head: Head, job_id: str) -> tuple[dict, str, int]:
    """(report dict, text, exit status: 0 ok, 4 fabric mismatch)."""
    log = job_log(head, job_id)
    summary = training_summary(log)
    transport = detect_transport(log)
    text = format_report(summary, transport)
    return {"job": job_id, "training": summary, "transport": transport.as_dict()}, text, 4 if transport.mismatch else 0
