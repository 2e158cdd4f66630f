"""Train a small byte-level GPT with DeepSpeed ZeRO stage 2: the clusterbake example job.

Started by torchrun (one per node under srun, c10d rendezvous), which sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT. By hand on one machine:

    torchrun --nproc-per-node=2 train.py --deepspeed_config ds_config.json --steps 30

Rank 0 writes one line per event to stdout, ``CLUSTERBAKE_EVENT {json}``, so the run can be
followed in a mixed Slurm log. Precision is chosen at run time: bf16 on GPUs that support it,
else fp16; fp32 on CPU (gloo).

Checkpoints go to --checkpoint-dir every --checkpoint-every steps, and when asked: a file
CHECKPOINT_REQUESTED in that directory (the job template writes it on Slurm's pre-timeout
signal) or SIGUSR1 delivered to a training process. After such a checkpoint the script exits 0
so the job can be requeued; on start it resumes from the newest checkpoint there.

Only the standard library is imported at module level, so the helpers can be tested (and the
config and data checks run) without torch; torch and deepspeed are imported inside main().
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

EVENT_PREFIX = "CLUSTERBAKE_EVENT"
REQUEST_FILE = "CHECKPOINT_REQUESTED"
DEFAULT_DATA = "/usr/share/common-licenses/GPL-3"
KEEP_CHECKPOINTS = 2
TAG_RE = re.compile(r"^step(\d+)$")
EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the inputs (config, data, flags): reported as one line, exit status 2."""


# --------------------------------------------------------------------------- pure helpers


def default_checkpoint_dir(env: dict[str, str]) -> str:
    """$CLUSTERBAKE_CHECKPOINT_DIR (the job template sets it), else the user's own
    /shared/checkpoints/<user>/<Slurm job name> (never a directory another user could have made)."""
    if env.get("CLUSTERBAKE_CHECKPOINT_DIR"):
        return env["CLUSTERBAKE_CHECKPOINT_DIR"]
    job_name = env.get("SLURM_JOB_NAME") or "deepspeed"
    user = env.get("USER") or env.get("LOGNAME") or pwd.getpwuid(os.getuid()).pw_name
    return f"/shared/checkpoints/{user}/{job_name}"


def request_paths(checkpoint_dir: str, env: dict[str, str]) -> list[Path]:
    """Where a checkpoint request may appear: the checkpoint directory, and the template's directory
    ($CLUSTERBAKE_CHECKPOINT_DIR) when --checkpoint-dir points elsewhere."""
    paths = [Path(checkpoint_dir) / REQUEST_FILE]
    template_dir = env.get("CLUSTERBAKE_CHECKPOINT_DIR")
    if template_dir and Path(template_dir) / REQUEST_FILE not in paths:
        paths.append(Path(template_dir) / REQUEST_FILE)
    return paths


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def parse_args(argv: list[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
    env = dict(os.environ) if env is None else env
    parser = argparse.ArgumentParser(description="Train a small byte-level GPT with DeepSpeed ZeRO-2.")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", required=True, help="DeepSpeed JSON config")
    parser.add_argument("--steps", type=positive_int, default=200, help="train until this step (default 200)")
    parser.add_argument(
        "--checkpoint-every", type=non_negative_int, default=50, help="checkpoint interval in steps, 0: never"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=default_checkpoint_dir(env),
        help="default $CLUSTERBAKE_CHECKPOINT_DIR, else /shared/checkpoints/$USER/$SLURM_JOB_NAME (or .../deepspeed)",
    )
    parser.add_argument("--data", default=DEFAULT_DATA, help=f"text file to train on (default {DEFAULT_DATA})")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--seq-len", type=positive_int, default=128, help="context length in bytes")
    parser.add_argument("--d-model", type=positive_int, default=256)
    parser.add_argument("--n-layers", type=positive_int, default=4)
    parser.add_argument("--n-heads", type=positive_int, default=4)
    # The DeepSpeed launcher (and torch.distributed.launch) pass this; torchrun sets LOCAL_RANK instead.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.d_model % args.n_heads:
        parser.error(f"--d-model {args.d_model} is not divisible by --n-heads {args.n_heads}")
    return args


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def load_ds_config(path: str) -> dict:
    """The config as a dict, or UsageError with a one-line reason."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(bad_config_message(path, exc.strerror or str(exc))) from exc
    try:
        config = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:  # json.JSONDecodeError, or a duplicate key
        raise UsageError(bad_config_message(path, f"not valid JSON: {exc}")) from exc
    if not isinstance(config, dict):
        raise UsageError(bad_config_message(path, f"top level must be a JSON object, not {type(config).__name__}"))
    return config


def one_line(text: str, limit: int = 400) -> str:
    """Several lines of an error as one; pydantic's "For further information visit <url>" lines left out."""
    lines = [line.strip() for line in str(text).splitlines()]
    joined = "; ".join(line for line in lines if line and not line.startswith("For further information"))
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def bad_config_message(path: str, reason: object) -> str:
    return f"clusterbake: bad DeepSpeed config {path}: {one_line(str(reason))}"


def read_data(path: str, seq_len: int) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"clusterbake: cannot read training data {path}: {exc.strerror or exc}") from exc
    if len(data) < seq_len + 2:
        raise UsageError(
            f"clusterbake: training data {path} has {len(data)} bytes, needs more than --seq-len + 1 = {seq_len + 1}"
        )
    return data


def single_process_env(env: dict[str, str]) -> dict[str, str]:
    """Variables to add so `python train.py` without torchrun runs as a world of one; none under torchrun."""
    if "RANK" in env or "WORLD_SIZE" in env:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def choose_precision(cuda_available: bool, bf16_supported: bool) -> tuple[str, str]:
    """(dtype name, why): bf16 on GPUs that have it, fp16 on other GPUs, fp32 on CPU."""
    if not cuda_available:
        return "fp32", "no CUDA device: CPU run"
    if bf16_supported:
        return "bf16", "torch.cuda.is_bf16_supported() is True"
    return "fp16", "torch.cuda.is_bf16_supported() is False"


def apply_precision(config: dict, dtype: str) -> dict:
    """A copy of the config with exactly the chosen half-precision section enabled (none for fp32)."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"unknown dtype {dtype!r}")
    out = json.loads(json.dumps(config))
    for section in ("bf16", "fp16"):
        settings = out.get(section)
        settings = dict(settings) if isinstance(settings, dict) else {}
        settings["enabled"] = section == dtype
        out[section] = settings
    return out


def transport_description(backend: str, env: dict[str, str]) -> str:
    if backend == "nccl":
        return "nccl (see NCCL_DEBUG=INFO lines)"
    text = f"{backend} over TCP"
    ifname = env.get("GLOO_SOCKET_IFNAME")
    if ifname:
        text += f" (GLOO_SOCKET_IFNAME={ifname})"
    return text


def batch_seed(seed: int, step: int, rank: int, micro: int = 0) -> int:
    """A seed that depends only on (seed, step, rank, micro-batch), the same in every process and run."""
    digest = hashlib.sha256(f"clusterbake:{seed}:{step}:{rank}:{micro}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def window_starts(
    seed: int, step: int, rank: int, batch_size: int, data_len: int, seq_len: int, micro: int = 0
) -> list[int]:
    """Start offsets of the batch's windows of seq_len + 1 bytes (input plus the next-byte target)."""
    last_start = data_len - (seq_len + 1)
    if last_start < 0:
        raise ValueError(f"data of {data_len} bytes is shorter than a window of {seq_len + 1}")
    rng = random.Random(batch_seed(seed, step, rank, micro))
    return [rng.randint(0, last_start) for _ in range(batch_size)]


def checkpoint_tags(names: list[str]) -> list[tuple[int, str]]:
    """(step, name) of the step<N> tags among the names, oldest first."""
    tags = []
    for name in names:
        match = TAG_RE.match(name)
        if match:
            tags.append((int(match.group(1)), name))
    return sorted(tags)


def tags_to_prune(names: list[str], keep: int = KEEP_CHECKPOINTS) -> list[str]:
    """The step<N> tags to delete so that only the `keep` newest (highest step) remain."""
    tags = checkpoint_tags(names)
    return [name for _, name in tags[: max(len(tags) - keep, 0)]]


def stale_request(path: Path, started_at: float) -> bool:
    """A request file older than this run was meant for an earlier one (which died before handling it)."""
    try:
        return path.stat().st_mtime < started_at
    except FileNotFoundError:
        return False


def format_event(event: str, **fields: object) -> str:
    # Wall-clock time on every event: bench/training.py measures sbatch -> first step.
    return f"{EVENT_PREFIX} " + json.dumps({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=False)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# --------------------------------------------------------------------------- training


def build_model(vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, n_heads, c // n_heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq_len, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied input/output embedding
            self.apply(self._init)

        @staticmethod
        def _init(module) -> None:
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    return TinyGPT()


def fail(message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    started_at = time.time()
    args = parse_args(argv)
    # Checked before torch is imported or the process group formed, so every rank fails fast.
    try:
        raw_config = load_ds_config(args.deepspeed_config)
        data_bytes = read_data(args.data, args.seq_len)
    except UsageError as exc:
        return fail(str(exc))

    signal_seen = {"usr1": False}

    def on_usr1(signum, frame) -> None:
        signal_seen["usr1"] = True

    signal.signal(signal.SIGUSR1, on_usr1)

    import deepspeed
    import torch
    import torch.distributed as dist

    os.environ.update(single_process_env(dict(os.environ)))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank if args.local_rank is not None else 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        device = torch.device("cpu")
        backend = "gloo"
    dtype, dtype_reason = choose_precision(cuda, cuda and torch.cuda.is_bf16_supported())
    config = apply_precision(raw_config, dtype)

    deepspeed.init_distributed(dist_backend=backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def log(event: str, **fields: object) -> None:
        if rank == 0:
            # One write with its newline: print() makes two when output is unbuffered, and
            # another rank's line could land between them.
            sys.stdout.write(format_event(event, **fields) + "\n")
            sys.stdout.flush()

    def agree(flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def shutdown() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    torch.manual_seed(args.seed)
    model = build_model(256, args.d_model, args.n_layers, args.n_heads, args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())

    # DeepSpeed's own check of the config, then the engine; both fail the same way on every rank.
    try:
        from deepspeed.runtime.config import DeepSpeedConfig

        DeepSpeedConfig(config)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        shutdown()
        return fail(bad_config_message(args.deepspeed_config, f"{type(exc).__name__}: {exc}"))

    micro_bs = engine.train_micro_batch_size_per_gpu()
    grad_accum = engine.gradient_accumulation_steps()
    tokens_per_step = micro_bs * grad_accum * world_size * args.seq_len

    hosts: list[str | None] = [None] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    log(
        "init",
        world_size=world_size,
        backend=backend,
        device=str(device) if not cuda else f"cuda ({torch.cuda.get_device_name(device)})",
        dtype=dtype,
        dtype_reason=dtype_reason,
        hosts=hosts,
        parameters=n_params,
        transport=transport_description(backend, dict(os.environ)),
        socket_ifname=os.environ.get("GLOO_SOCKET_IFNAME") if backend == "gloo" else None,
        cpu_threads=None if cuda else torch.get_num_threads(),
        master=f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}",
        micro_batch_size=micro_bs,
        gradient_accumulation_steps=grad_accum,
        seq_len=args.seq_len,
        data=args.data,
        data_bytes=len(data_bytes),
        torch=torch.__version__,
        deepspeed=deepspeed.__version__,
    )

    ckpt_dir = Path(args.checkpoint_dir)
    requests = request_paths(str(ckpt_dir), dict(os.environ))
    mkdir_error = None
    try:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        mkdir_error = f"clusterbake: cannot create checkpoint directory {ckpt_dir}: {exc.strerror or exc}"
    if agree(mkdir_error is not None):  # every rank stops, not only those that failed
        shutdown()
        return fail(mkdir_error or f"clusterbake: cannot create checkpoint directory {ckpt_dir} on another rank")

    stale_removed = False
    for request in requests if rank == 0 else []:
        if stale_request(request, started_at):
            request.unlink(missing_ok=True)
            stale_removed = True
    # Rank 0 decides whether to resume, so all ranks take the same branch.
    decision = [(ckpt_dir / "latest").is_file()]
    dist.broadcast_object_list(decision, src=0)
    start_step = 0
    last_checkpoint: str | None = None
    if decision[0]:
        load_path, client_state = engine.load_checkpoint(str(ckpt_dir))
        if load_path is None or not client_state or "step" not in client_state:
            shutdown()
            return fail(f"clusterbake: could not resume from {ckpt_dir} (see the DeepSpeed messages above)")
        start_step = int(client_state["step"])
        last_checkpoint = str(Path(load_path).parent)  # load_path is the tag's model-states file
        log("resumed", step=start_step, path=last_checkpoint, stale_request_removed=stale_removed)
    else:
        log("fresh_start", checkpoint_dir=str(ckpt_dir), stale_request_removed=stale_removed)
    dist.barrier()

    def save(step: int, reason: str) -> str:
        tag = f"step{step}"
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step})
        dist.barrier()
        if rank == 0:
            for old in tags_to_prune([p.name for p in ckpt_dir.iterdir() if p.is_dir()]):
                if old != tag:
                    shutil.rmtree(ckpt_dir / old, ignore_errors=True)
        path = str(ckpt_dir / tag)
        log("checkpoint", step=step, path=path, reason=reason)
        return path

    data = torch.frombuffer(bytearray(data_bytes), dtype=torch.uint8)
    offsets = torch.arange(args.seq_len + 1)

    def batch(step: int, micro: int):
        starts = window_starts(args.seed, step, rank, micro_bs, len(data_bytes), args.seq_len, micro)
        windows = data[torch.tensor(starts).unsqueeze(1) + offsets].long().to(device)
        return windows[:, :-1], windows[:, 1:]

    losses: list[float] = []
    rates: list[float] = []
    loop_start = time.perf_counter()
    requested = False
    step = start_step
    engine.train()
    while step < args.steps:
        t0 = time.perf_counter()
        step += 1
        lr = engine.get_lr()[0]
        total = torch.zeros((), device=device)
        for micro in range(grad_accum):
            x, y = batch(step, micro)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        total /= grad_accum
        dist.all_reduce(total)
        loss_value = total.item() / world_size
        step_s = time.perf_counter() - t0
        losses.append(loss_value)
        rates.append(tokens_per_step / step_s)
        log(
            "step",
            step=step,
            loss=round(loss_value, 5),
            tokens_per_s=round(tokens_per_step / step_s, 1),
            step_s=round(step_s, 4),
            elapsed_s=round(time.perf_counter() - loop_start, 3),
            lr=lr,
        )

        requested = agree(signal_seen["usr1"] or any(request.exists() for request in requests))
        if requested:
            last_checkpoint = save(step, "signal")
            for request in requests if rank == 0 else []:
                request.unlink(missing_ok=True)
            break
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            last_checkpoint = save(step, "interval")

    # The trained model is always kept: a final checkpoint unless the last step has one.
    if step > start_step and not (last_checkpoint and last_checkpoint.endswith(f"step{step}")):
        last_checkpoint = save(step, "final")

    log(
        "done",
        steps=step,
        start_step=start_step,
        stopped_by_signal=requested,
        first_loss=losses[0] if losses else None,
        final_loss=losses[-1] if losses else None,
        tokens_per_s=mean(rates[1:]),
        world_size=world_size,
        hosts=hosts,
        checkpoint_dir=str(ckpt_dir),
        last_checkpoint=last_checkpoint,
    )
    dist.barrier()
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
