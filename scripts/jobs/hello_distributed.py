"""All-reduce of every rank's number; started by torchrun (hello-distributed.sbatch)."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    value = torch.tensor([float(rank)], device=device)
    dist.all_reduce(value)
    expected = world * (world - 1) / 2
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    ok = value.item() == expected
    event = {
        "event": "hello",
        "rank": rank,
        "world_size": world,
        "sum": value.item(),
        "expected": expected,
        "ok": ok,
        "backend": dist.get_backend(),
        "hosts": hosts if rank == 0 else None,
    }
    # One write with its newline (print() makes two when unbuffered, and ranks share the log).
    sys.stdout.write(f"CLUSTERBAKE_EVENT {json.dumps(event)}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
