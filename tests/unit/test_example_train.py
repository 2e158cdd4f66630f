"""The DeepSpeed example job: its config, and the helpers of train.py that need no torch.

train.py imports only the standard library at module level (torch and deepspeed are imported in
main()), so it is loaded here from its path and its input checks are run in a subprocess with
this interpreter, which has no torch.
"""

import importlib.util
import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deepspeed"
TRAIN = EXAMPLE / "train.py"
CONFIG = EXAMPLE / "ds_config.json"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("clusterbake_example_train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def config():
    return json.loads(CONFIG.read_text())


# ----------------------------------------------------------------------------- ds_config.json


def test_config_is_zero_stage_2_with_the_documented_bucket_and_overlap_settings(config):
    zero = config["zero_optimization"]
    assert zero["stage"] == 2
    assert zero["allgather_partitions"] is True
    assert zero["allgather_bucket_size"] == 2e8
    assert zero["overlap_comm"] is True
    assert zero["reduce_scatter"] is True
    assert zero["reduce_bucket_size"] == 2e8
    assert zero["contiguous_gradients"] is True


def test_config_optimizer_scheduler_and_batch(config):
    assert config["optimizer"]["type"] == "AdamW"
    assert config["optimizer"]["params"]["torch_adam"] is True
    assert 5e-4 <= config["optimizer"]["params"]["lr"] <= 2e-3
    assert config["scheduler"]["type"] == "WarmupLR"
    warmup = config["scheduler"]["params"]
    assert warmup["warmup_max_lr"] == config["optimizer"]["params"]["lr"]
    assert 0 < warmup["warmup_num_steps"] <= 30, "warmup must end well inside a 30-step check run"
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["gradient_accumulation_steps"] == 1
    assert config["gradient_clipping"] == 1.0
    assert config["steps_per_print"] >= 10_000
    # No train_batch_size: DeepSpeed derives it from the world size, so any node count works.
    assert "train_batch_size" not in config


def test_config_half_precision_sections_exist_and_are_off(config):
    assert config["bf16"]["enabled"] is False
    assert config["fp16"]["enabled"] is False


# ----------------------------------------------------------------------------- arguments


def test_defaults(train):
    args = train.parse_args(["--deepspeed_config", "c.json"], env={"USER": "ada"})
    assert args.steps == 200
    assert args.checkpoint_every == 50
    assert args.checkpoint_dir == "/shared/checkpoints/ada/deepspeed"
    assert args.data == "/usr/share/common-licenses/GPL-3"
    assert (args.seq_len, args.d_model, args.n_layers, args.n_heads) == (128, 256, 4, 4)


def test_checkpoint_dir_follows_the_slurm_job_name(train):
    args = train.parse_args(["--deepspeed_config", "c.json"], env={"SLURM_JOB_NAME": "gpt-small", "USER": "ada"})
    assert args.checkpoint_dir == "/shared/checkpoints/ada/gpt-small"
    # Without USER (LOGNAME), the user the process runs as: each user's own directory.
    args = train.parse_args(["--deepspeed_config", "c.json"], env={"SLURM_JOB_NAME": "gpt-small"})
    assert args.checkpoint_dir == f"/shared/checkpoints/{pwd.getpwuid(os.getuid()).pw_name}/gpt-small"
    args = train.parse_args(["--deepspeed_config", "c.json", "--checkpoint-dir", "/x"], env={"SLURM_JOB_NAME": "a"})
    assert args.checkpoint_dir == "/x"


def test_checkpoint_dir_follows_the_job_template(train):
    env = {"SLURM_JOB_NAME": "gpt-small", "CLUSTERBAKE_CHECKPOINT_DIR": "/shared/ckpt/custom"}
    assert train.parse_args(["--deepspeed_config", "c.json"], env=env).checkpoint_dir == "/shared/ckpt/custom"


def test_checkpoint_requests_are_watched_where_the_template_writes_them(train):
    assert train.request_paths("/shared/checkpoints/a", {}) == [Path("/shared/checkpoints/a/CHECKPOINT_REQUESTED")]
    same = {"CLUSTERBAKE_CHECKPOINT_DIR": "/shared/checkpoints/a/"}
    assert train.request_paths("/shared/checkpoints/a", same) == [Path("/shared/checkpoints/a/CHECKPOINT_REQUESTED")]
    other = {"CLUSTERBAKE_CHECKPOINT_DIR": "/shared/checkpoints/job"}
    assert train.request_paths("/scratch/mine", other) == [
        Path("/scratch/mine/CHECKPOINT_REQUESTED"),
        Path("/shared/checkpoints/job/CHECKPOINT_REQUESTED"),
    ]


def test_local_rank_from_the_deepspeed_launcher_is_accepted(train):
    args = train.parse_args(["--local_rank=3", "--deepspeed_config", "c.json", "--steps", "7"], env={})
    assert args.steps == 7
    args = train.parse_args(["--local-rank", "1", "--deepspeed_config", "c.json"], env={})
    assert args.deepspeed_config == "c.json"


@pytest.mark.parametrize(
    "argv",
    [
        [],  # --deepspeed_config is required
        ["--deepspeed_config", "c.json", "--steps", "0"],  # `make job STEPS=0` must fail
        ["--deepspeed_config", "c.json", "--checkpoint-every", "-1"],
        ["--deepspeed_config", "c.json", "--seq-len", "0"],
        ["--deepspeed_config", "c.json", "--d-model", "250", "--n-heads", "4"],
    ],
)
def test_bad_arguments_exit_2(train, argv, capsys):
    with pytest.raises(SystemExit) as info:
        train.parse_args(argv, env={})
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


# ----------------------------------------------------------------------------- precision


def test_precision_choice(train):
    assert train.choose_precision(True, True)[0] == "bf16"
    assert train.choose_precision(True, False)[0] == "fp16"
    assert train.choose_precision(False, False)[0] == "fp32"
    # bf16 support is irrelevant without CUDA.
    assert train.choose_precision(False, True)[0] == "fp32"


@pytest.mark.parametrize(
    ("dtype", "bf16", "fp16"), [("bf16", True, False), ("fp16", False, True), ("fp32", False, False)]
)
def test_apply_precision_enables_exactly_the_chosen_section(train, config, dtype, bf16, fp16):
    out = train.apply_precision(config, dtype)
    assert out["bf16"]["enabled"] is bf16
    assert out["fp16"]["enabled"] is fp16
    # The other fp16 settings survive, and nothing else changes.
    assert out["fp16"]["loss_scale"] == config["fp16"]["loss_scale"]
    assert {k: v for k, v in out.items() if k not in ("bf16", "fp16")} == {
        k: v for k, v in config.items() if k not in ("bf16", "fp16")
    }


def test_apply_precision_does_not_change_its_input_and_fills_missing_sections(train, config):
    before = json.dumps(config, sort_keys=True)
    train.apply_precision(config, "bf16")
    assert json.dumps(config, sort_keys=True) == before
    out = train.apply_precision({"bf16": {"enabled": True}}, "fp32")
    assert out == {"bf16": {"enabled": False}, "fp16": {"enabled": False}}
    with pytest.raises(ValueError):
        train.apply_precision(config, "fp8")


# ----------------------------------------------------------------------------- config loading


def test_load_ds_config_reads_the_example(train, config):
    assert train.load_ds_config(str(CONFIG)) == config


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"train_micro_batch_size_per_gpu": 8,', "not valid JSON"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("[1, 2]", "top level must be a JSON object, not list"),
    ],
)
def test_load_ds_config_rejects_bad_files_in_one_line(train, tmp_path, text, reason):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(train.UsageError) as info:
        train.load_ds_config(str(path))
    message = str(info.value)
    assert message.startswith(f"clusterbake: bad DeepSpeed config {path}: ")
    assert reason in message
    assert "\n" not in message


def test_bad_config_message_is_one_line_without_pydantic_urls(train):
    reason = (
        "1 validation error for DeepSpeedZeroConfig\nstagee\n  Extra inputs are not permitted\n"
        "    For further information visit https://errors.pydantic.dev/2/v/extra_forbidden"
    )
    message = train.bad_config_message("/c.json", reason)
    assert message == (
        "clusterbake: bad DeepSpeed config /c.json: 1 validation error for DeepSpeedZeroConfig; stagee; "
        "Extra inputs are not permitted"
    )


# ----------------------------------------------------------------------------- data and batches


def test_read_data_needs_more_than_one_window(train, tmp_path):
    path = tmp_path / "text"
    path.write_bytes(b"x" * 10)
    with pytest.raises(train.UsageError, match="has 10 bytes"):
        train.read_data(str(path), seq_len=9)
    assert train.read_data(str(path), seq_len=8) == b"x" * 10
    with pytest.raises(train.UsageError, match="cannot read training data"):
        train.read_data(str(tmp_path / "missing"), seq_len=8)


def test_batches_are_a_function_of_seed_step_and_rank(train):
    def starts(seed=1, step=5, rank=0, micro=0):
        return train.window_starts(seed, step, rank, 8, 35_000, 128, micro)

    assert starts() == starts()  # a resumed run draws what an uninterrupted one drew
    assert len(starts()) == 8
    assert starts(step=6) != starts()
    assert starts(rank=1) != starts()
    assert starts(seed=2) != starts()
    assert starts(micro=1) != starts()


def test_batch_seed_is_stable_across_interpreters(train):
    # Python's hash() of strings changes between processes; the batch seed must not.
    code = (
        "import importlib.util as u, sys; s = u.spec_from_file_location('t', sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.batch_seed(1234, 77, 3))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code, str(TRAIN)],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hash_seed in (1, 2)
    }
    assert outputs == {str(train.batch_seed(1234, 77, 3))}


def test_windows_stay_inside_the_data(train):
    data_len, seq_len = 200, 50
    seen = set()
    for step in range(1, 200):
        for start in train.window_starts(0, step, 0, 8, data_len, seq_len):
            assert 0 <= start <= data_len - seq_len - 1
            seen.add(start)
    # Both ends of the range are reachable (the last window ends exactly at the last byte).
    assert {0, data_len - seq_len - 1} <= seen
    with pytest.raises(ValueError):
        train.window_starts(0, 1, 0, 8, seq_len, seq_len)


# ----------------------------------------------------------------------------- checkpoints, signals, events


def test_only_the_two_newest_step_tags_are_kept(train):
    names = ["step100", "step20", "latest", "step5", "zero_to_fp32.py", "step90", "stepx", "global_step3"]
    # Ordered by step number, not by name: step100 is the newest.
    assert train.tags_to_prune(names) == ["step5", "step20"]
    assert train.tags_to_prune(["step10", "step20"]) == []
    assert train.tags_to_prune(["step1", "step2", "step3"], keep=1) == ["step1", "step2"]


def test_a_request_file_older_than_the_run_is_stale(train, tmp_path):
    request = tmp_path / "CHECKPOINT_REQUESTED"
    now = time.time()
    assert train.stale_request(request, now) is False  # no file
    request.touch()
    os.utime(request, (now - 3600, now - 3600))
    assert train.stale_request(request, now) is True
    os.utime(request, (now + 5, now + 5))
    assert train.stale_request(request, now) is False


def test_transport_description(train):
    assert train.transport_description("gloo", {}) == "gloo over TCP"
    assert (
        train.transport_description("gloo", {"GLOO_SOCKET_IFNAME": "eth1"}) == "gloo over TCP (GLOO_SOCKET_IFNAME=eth1)"
    )
    assert train.transport_description("nccl", {"GLOO_SOCKET_IFNAME": "eth1"}) == "nccl (see NCCL_DEBUG=INFO lines)"


def test_single_process_defaults_only_outside_torchrun(train):
    assert train.single_process_env({"RANK": "1", "WORLD_SIZE": "2"}) == {}
    env = train.single_process_env({})
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["MASTER_ADDR"]


def test_event_lines_are_prefixed_json(train):
    line = train.format_event("step", step=3, loss=2.5, tokens_per_s=1000.0)
    prefix, _, payload = line.partition(" ")
    assert prefix == "CLUSTERBAKE_EVENT"
    data = json.loads(payload)
    stamp = data.pop("time")
    assert data == {"event": "step", "step": 3, "loss": 2.5, "tokens_per_s": 1000.0}
    assert abs(stamp - time.time()) < 60
    assert "\n" not in line


def test_mean(train):
    assert train.mean([]) is None
    assert train.mean([1.0, 2.0, 6.0]) == 3.0


# ----------------------------------------------------------------------------- the script's input checks (no torch)


def run_script(*args):
    return subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True, text=True, timeout=60)


def test_missing_config_exits_2_with_one_clear_line(tmp_path):
    missing = tmp_path / "nope.json"
    result = run_script("--deepspeed_config", str(missing))
    assert result.returncode == 2
    assert result.stderr == f"clusterbake: bad DeepSpeed config {missing}: No such file or directory\n"
    assert result.stdout == ""


def test_invalid_json_config_exits_2(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text("{not json")
    result = run_script("--deepspeed_config", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"clusterbake: bad DeepSpeed config {path}: not valid JSON: ")
    assert result.stderr.count("\n") == 1


def test_missing_data_exits_2(tmp_path):
    result = run_script("--deepspeed_config", str(CONFIG), "--data", str(tmp_path / "none.txt"))
    assert result.returncode == 2
    assert result.stderr.startswith("clusterbake: cannot read training data ")
    assert result.stderr.count("\n") == 1


def test_module_imports_only_the_standard_library():
    code = (
        "import importlib.util as u, sys; s = u.spec_from_file_location('t', sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); "
        "print(sorted(n for n in ('torch', 'deepspeed', 'numpy') if n in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code, str(TRAIN)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
