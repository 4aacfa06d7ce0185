"""`kljax bench train` on a tiny random model: JSON, MFU, the loss check, and kljax == PyTorch."""

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kljax.cli import main  # noqa: E402
from kljax.models.tiny import save_tiny_hf_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_hf_model("llama_tied", tmp_path_factory.mktemp("tiny") / "model")


def test_bench_train_writes_speeds_ratio_mfu_and_loss_check(tiny_model, tmp_path, capsys):
    out = tmp_path / "train.json"
    code = main([
        "bench", "train", "--model", str(tiny_model), "--batch", "2", "--seq-len", "12", "--response-len", "6",
        "--repeats", "2", "--warmup", "0", "--peer-threads", "1", "--json", str(out),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    keys = {"kljax", "peer", "ratio", "mfu", "peer_mfu", "peak_gflops", "settings", "machine", "versions"}
    assert keys <= set(result)
    assert result["ratio"] == pytest.approx(result["kljax"] / result["peer"])
    assert 0 < result["mfu"] <= 1.5 and 0 < result["peer_mfu"] <= 1.5
    assert result["peak_gflops"] > 0 and result["peak"]["source"].startswith("measured")
    details = result["details"]
    assert len(details["kljax"]["seconds"]) == 2 and len(details["peer"]["seconds"]) == 2
    assert details["kljax"]["tokens_per_s"] == result["kljax"] and details["kljax_compile_s"] > 0
    flops = details["model_flops_per_update"]
    assert flops["total"] == pytest.approx(flops["matmul"] + flops["attention"] + flops["lm_head"])
    assert result["mfu"] == pytest.approx(details["kljax_gflops"] / result["peak_gflops"])
    check = result["loss_check"]
    assert check["ok"] and check["abs_diff"] < 1e-4 and check["grad_norm_rel_diff"] < 1e-3
    assert result["settings"]["batch"] == 2 and result["settings"]["seq_len"] == 12
    printed = capsys.readouterr().out
    assert "loss check" in printed and "OK" in printed and "MFU" in printed and "ratio" in printed
    floor = result["floor"]
    assert floor["tokens_per_s"] == pytest.approx(2 * 12 / floor["seconds"])
    assert "matmul floor" in printed
    for side in ("kljax_kernel", "peer_kernel"):
        usage = details[side]
        assert usage["sys_s_per_run"] >= 0 and usage["minor_faults_per_run"] >= 0
    assert "kernel time per update" in printed


def test_kernel_usage_counts_the_page_faults_of_fresh_memory():
    """64 MiB allocated and touched per run (above glibc's mmap threshold, so fresh pages each
    time) faults in at least a page per 2 MiB, more than a run that allocates nothing."""
    import numpy as np

    from benchmarks import common

    fresh = common.kernel_usage(lambda: np.ones(16 << 20, np.float32).sum(), 3)
    idle = common.kernel_usage(lambda: None, 3)
    assert fresh["minor_faults_per_run"] >= 32 > idle["minor_faults_per_run"]
    assert fresh["sys_s_per_run"] >= idle["sys_s_per_run"] >= 0


def test_bench_train_random_model_without_peer_uses_given_peak(tmp_path):
    out = tmp_path / "train.json"
    spec = ("random:qwen2.5-0.5b:num_hidden_layers=1,hidden_size=32,intermediate_size=64,num_attention_heads=4,"
            "num_key_value_heads=2,vocab_size=128")
    assert main(["bench", "train", "--model", spec, "--batch", "2", "--seq-len", "8", "--response-len", "4",
                 "--repeats", "2", "--warmup", "0", "--no-peer", "--peak-gflops", "1e4", "--no-scan",
                 "--no-floor", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "peer" not in result and result["loss_check"] is None and "floor" not in result
    assert result["settings"]["scan_layers"] is False
    assert result["peak_gflops"] == 1e4 and result["peak"]["source"] == "--peak-gflops"
    assert result["mfu"] == pytest.approx(result["details"]["kljax_gflops"] / 1e4)


@pytest.mark.parametrize("argv, message", [
    (["--response-len", "8", "--seq-len", "8"], "--response-len 8 must be < --seq-len 8"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--peak-gflops", "-5"], "--peak-gflops must be > 0, got -5"),
    (["--model", "random:gpt-9"], "unknown config 'gpt-9'"),
    (["--model", "random:qwen2.5-0.5b:layers=2"], "override 'layers=2'"),
])
def test_bench_train_rejects_bad_arguments(tmp_path, argv, message, cli_user_error):
    cli_user_error(["bench", "train", "--no-peer", *argv], re.escape(message))


def test_kljax_and_pytorch_updates_agree(tiny_model):
    """Same weights and batch: the same loss, gradient norm, and (after one AdamW step) the same loss again."""
    import jax

    from benchmarks import common
    from benchmarks.train import BETA, CLIP, ESTIMATOR, KljaxRLStep, make_batch
    from benchmarks.train_peer import TorchRLStep
    from kljax.parallel import sharding as shd
    from kljax.train.state import OptimConfig

    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = common.load_model(str(tiny_model), export_for_peer=True, mesh=mesh)
    arrays = make_batch(model.params, model.config, 3, 10, 5, seed=1, mesh=mesh)
    optim = OptimConfig(learning_rate=1e-2, weight_decay=0.1, max_grad_norm=0.5)
    ours = KljaxRLStep(model.params, model.config, arrays, optim, mesh)
    theirs = TorchRLStep(model.hf_dir, arrays, beta=BETA, estimator=ESTIMATOR, aggregation="seq-mean-token-mean",
                         clip_low=CLIP, clip_high=None, optim=optim, dtype="float32", device="cpu", threads=1)
    for _ in range(3):  # the first compares the forward + gradient, the later ones the optimizer too
        a, b = ours.step(), theirs.step()
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
