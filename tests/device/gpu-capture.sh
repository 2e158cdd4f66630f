#!/bin/bash
# Captures, on a machine with an NVIDIA GPU, what the GPU parts of clusterbake read
# from real hardware and libraries, for tests/unit/data/captured/ (see its README):
#   - the nvidia-smi queries of clusterbake-health and the nvidia_driver role's check,
#     and clusterbake-health's GPU checks run against the real nvidia-smi;
#   - NCCL_DEBUG=INFO logs of scripts/jobs/hello_distributed.py and of the DeepSpeed
#     example with two ranks that NCCL takes for two hosts (NCCL_HOSTID differs, so they
#     talk over NCCL's network transport, as two single-GPU nodes would) on one GPU;
#   - the DeepSpeed example (examples/deepspeed/train.py) on the GPU: a run that
#     checkpoints, a run that resumes from it, and a checkpoint asked for mid-run with
#     the request file that deepspeed.sbatch writes on Slurm's pre-timeout signal.
# No Slurm, munge or cluster is involved: this is the single-machine half of a GPU node.
#
#   OUT=/some/dir bash tests/device/gpu-capture.sh [GROUP...]   (from the repository root)
#
# GROUPs (default: all, in this order): node, hello, deepspeed-1gpu, deepspeed-2hosts,
# missing-plugin (an EFA node whose aws-ofi-nccl is missing: NCCL_NET_PLUGIN names a
# library that is not there, and NCCL_NET names its network).
#
# Needs python3 with torch and deepspeed importable (CPU-only torch runs the same steps
# over gloo, which is how the script itself is tested without a GPU). Every step has a
# timeout and the script goes on after a failed one; summary.txt has each step's status.
set -uo pipefail
OUT=${OUT:?set OUT to the directory for the captures}
mkdir -p "$OUT"
WORK=$(mktemp -d)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

step() { # step NAME TIMEOUT_S LOGFILE COMMAND...: run it, append to LOGFILE, note its status
  local name=$1 limit=$2 logfile=$3 started status
  shift 3
  started=$(date +%s%N)
  echo "=== $name: $*" >>"$logfile"
  timeout --kill-after=10 "$limit" "$@" >>"$logfile" 2>&1
  status=$?
  printf '%-20s exit %3d  %6d ms\n' "$name" "$status" $((($(date +%s%N) - started) / 1000000)) >>"$SUMMARY"
  return $status
}

# Python run inline by the steps below (kept flush left: Python reads the indentation).
VERSIONS='
import platform, torch
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", nccl)
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "count", torch.cuda.device_count(), "bf16", torch.cuda.is_bf16_supported())
import deepspeed; print("deepspeed", deepspeed.__version__)'
# clusterbake-health's GPU checks against the real nvidia-smi and kernel log, for a node
# whose GRES says 1 GPU and, to see the failure, 8.
HEALTH_GPU_CHECKS='
import importlib.machinery, importlib.util, json
loader = importlib.machinery.SourceFileLoader("health", "roles/node_health/files/clusterbake-health")
health = importlib.util.module_from_spec(importlib.util.spec_from_loader("health", loader))
loader.exec_module(health)
for gpus in (1, 8):
    print(json.dumps({"gpus": gpus, "check_gpus": health.check_gpus({"gpus": gpus})}))
print(json.dumps({"check_xids": health.check_xids({"fatal_xids": [48, 74, 79, 94, 95]})}))'

node() {
  local log=$OUT/gpu-node.txt
  step versions 120 "$log" python3 -c "$VERSIONS"
  step nvidia-smi 60 "$log" nvidia-smi
  step smi-list 30 "$log" nvidia-smi -L
  # The exact queries clusterbake runs (roles/node_health/files/clusterbake-health,
  # roles/nvidia_driver/tasks/validate.yml), as they print on this driver.
  step smi-health-query 30 "$log" nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode --format=csv,noheader
  step smi-driver-query 30 "$log" nvidia-smi --query-gpu=driver_version,name --format=csv,noheader
  step smi-topo 30 "$log" nvidia-smi topo -m
  step health-gpu-checks 60 "$log" python3 -c "$HEALTH_GPU_CHECKS"
}

# Two ranks on GPU 0 that NCCL takes for two hosts: NCCL_HOSTID sets the host hash, so
# NCCL neither refuses a duplicate GPU nor uses P2P/SHM between them.
printf '%s\n' '#!/bin/bash' \
  'export NCCL_HOSTID=capture-host-$LOCAL_RANK LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=0' \
  'exec "$@"' >"$WORK/as-own-host"
# two-hosts PORT COMMAND...: the command as two such ranks under torchrun.
printf '%s\n' '#!/bin/bash' 'port=$1; shift' \
  "NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo exec python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --no-python \\" \
  "  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:\$port --max-restarts=0 $WORK/as-own-host \"\$@\"" \
  >"$WORK/two-hosts"
chmod +x "$WORK/as-own-host" "$WORK/two-hosts"
# The line torchrun-node prints, which the transport report reads the fabric from.
FABRIC_LINE="clusterbake: job capture (restart 0) on capture-host-[0-1], fabric tcp"

hello() {
  local log=$OUT/nccl-hello-2hosts.log
  echo "$FABRIC_LINE" >"$log"
  step hello-2hosts 240 "$log" "$WORK/two-hosts" 29411 python3 scripts/jobs/hello_distributed.py
}

missing-plugin() {
  local log=$OUT/nccl-efa-plugin-missing.log
  echo "${FABRIC_LINE/fabric tcp/fabric efa}" >"$log"
  step efa-plugin-missing 240 "$log" env NCCL_NET_PLUGIN=aws-ofi "$WORK/two-hosts" 29415 \
    python3 scripts/jobs/hello_distributed.py
  log=$OUT/nccl-net-named-missing.log
  echo "${FABRIC_LINE/fabric tcp/fabric efa}" >"$log"
  step net-named-missing 240 "$log" env "NCCL_NET=AWS Libfabric" "$WORK/two-hosts" 29416 \
    python3 scripts/jobs/hello_distributed.py
}

TRAIN=(examples/deepspeed/train.py --deepspeed_config examples/deepspeed/ds_config.json --data README.md)
deepspeed-1gpu() {
  DS=$OUT/deepspeed-1gpu.log
  : >"$DS"
  for run in "fresh 30" "resume 40"; do
    set -- $run
    step "ds-1gpu-$1" 300 "$DS" python3 -m torch.distributed.run --standalone --nproc-per-node=1 \
      "${TRAIN[@]}" --steps "$2" --checkpoint-every 10 --checkpoint-dir "$WORK/ckpt-1gpu"
  done
  ls "$WORK/ckpt-1gpu" >>"$DS" 2>&1
}

# The two "hosts" train ZeRO-2 over NCCL's network transport; the request file appears
# once step 5 is logged, as deepspeed.sbatch writes it on the pre-timeout signal.
deepspeed-2hosts() {
  DS2=$OUT/deepspeed-2hosts.log
  echo "$FABRIC_LINE" >"$DS2"
  mkdir -p "$WORK/ckpt-2hosts"
  (
    for _ in $(seq 1200); do
      grep -q '"event": "step", [^}]*"step": 5,' "$DS2" && touch "$WORK/ckpt-2hosts/CHECKPOINT_REQUESTED" && break
      sleep 0.25
    done
  ) &
  watcher=$!
  step ds-2hosts-request 300 "$DS2" "$WORK/two-hosts" 29414 python3 "${TRAIN[@]}" --steps 100000 \
    --checkpoint-every 0 --checkpoint-dir "$WORK/ckpt-2hosts"
  kill "$watcher" 2>/dev/null
  ls "$WORK/ckpt-2hosts" >>"$DS2" 2>&1
}

for group in "${@:-node hello deepspeed-1gpu deepspeed-2hosts missing-plugin}"; do
  for name in $group; do
    case $name in
      node | hello | deepspeed-1gpu | deepspeed-2hosts | missing-plugin) "$name" ;;
      *) echo "unknown group $name" >&2 ;;
    esac
  done
done
rm -rf "$WORK"
cat "$SUMMARY"
