"""The bench scripts run, end with their `name=value` headline line, and exit by their target.

The figures themselves depend on the machine, so the targets are set where the verdict is certain: a
target no run can miss must give exit 0, one no run can reach must give exit 1 (a script that always
exits 0, or 1, fails here). The headline must be computed from the figures printed above it.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    result = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    figures = {name: float(value) for name, value in re.findall(r"^(\w+)=(\d+(?:\.\d+)?)$", result.stdout, re.M)}
    return result, figures


def _headline(result: subprocess.CompletedProcess, name: str) -> float:
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{name}=\d+(\.\d+)?", last), last
    return float(last.split("=")[1])


@pytest.mark.slow  # 8-12 s: TRL's trainer and ours, a warm-up and an iteration each
def test_grpo_step_bench_reports_the_ratio_of_its_timings():
    result, figures = _run("bench/grpo_step.py", "--iterations", "1", "--groups", "1", "--group-size", "2",
                           "--micro-batch", "2", "--max-turn-tokens", "16", "--max-episode-tokens", "2100",
                           "--target", "0.000001")
    assert result.returncode == 0, result.stderr[-2000:]  # any speedup reaches this target
    speedup = _headline(result, "speedup_vs_trl")
    ours, trl = figures["ours_seconds_per_iteration"], figures["trl_seconds_per_iteration"]
    assert ours > 0 and trl > 0
    assert speedup == pytest.approx(trl / ours, rel=0.01, abs=0.002)


@pytest.mark.parametrize("target, code", [("0", 0), ("1e12", 1)])
def test_env_step_bench_exits_by_its_target(target, code):
    result, figures = _run("bench/env_step.py", "--seconds", "0.2", "--target", target)
    assert result.returncode == code, result.stderr[-2000:]
    slowest = _headline(result, "min_steps_per_s")
    rates = [float(rate) for rate in re.findall(r" steps_per_s=\s*(\d+)", result.stdout)]
    assert rates and slowest > 0 and slowest == pytest.approx(min(rates), abs=1)
    assert ("BELOW TARGET" in result.stdout) == (code == 1)


@pytest.mark.slow  # ~9 s
def test_rollout_backends_bench_compares_merged_and_unmerged_lora_sampling():
    # An unreachable target: exit 1 (the vLLM test below reaches its target, 0, and exits 0).
    result, figures = _run("bench/rollout_backends.py", "--groups", "1", "--group-size", "2", "--max-episode-tokens",
                           "2080", "--single-turn-tokens", "4", "--threads", "1", "--lora", "--target", "1e12")
    assert result.returncode == 1, result.stderr[-2000:]
    assert figures["identical_samples"] == 1  # merged or not, cached or not, either layout: the same samples
    speedup = _headline(result, "tokens_per_s_speedup")
    ratio = figures["multi_turn_shared_prefix_tokens_per_s"] / figures["multi_turn_padded_tokens_per_s"]
    assert speedup == pytest.approx(ratio, rel=0.01, abs=0.002)
    ratio = figures["multi_turn_shared_prefix_tokens_per_s"] / figures["multi_turn_shared_prefix_unmerged_tokens_per_s"]
    assert figures["lora_merge_speedup"] == pytest.approx(ratio, rel=0.01, abs=0.002)


@pytest.mark.slow  # ~11 s: three HF sides and a vLLM stub over three workloads (make test stays under 5 minutes)
def test_rollout_backends_bench_reports_the_layout_speedups_and_puts_a_vllm_server_side_by_side():
    from test_vllm_backend import StubVLLM  # an OpenAI-protocol stub of vLLM on 127.0.0.1

    server = StubVLLM(choices=[300, 301])
    try:
        result, figures = _run("bench/rollout_backends.py", "--groups", "1", "--group-size", "2",
                               "--max-episode-tokens", "2080", "--single-turn-tokens", "4", "--threads", "1",
                               "--vllm-url", server.url, "--target", "0")
    finally:
        server.close()
    assert result.returncode == 0, result.stderr[-2000:]
    ratio = _headline(result, "hf_vs_vllm")
    expected = figures["multi_turn_shared_prefix_tokens_per_s"] / figures["multi_turn_vllm_tokens_per_s"]
    assert ratio == pytest.approx(expected, rel=0.01, abs=0.002)
    assert figures["single_turn_vllm_tokens_per_s"] > 0
    # Every HF side samples the same tokens; the prefix cache runs fewer prefill tokens.
    assert figures["identical_samples"] == 1
    assert figures["multi_turn_padded_prefill_tokens"] < figures["multi_turn_padded_nocache_prefill_tokens"]
    ratio = figures["multi_turn_padded_tokens_per_s"] / figures["multi_turn_padded_nocache_tokens_per_s"]
    assert figures["multi_turn_prefix_cache_speedup"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    # The two ratios, each on a line of its own: the shared-prefix layout over today's padded one.
    ratio = figures["multi_turn_shared_prefix_tokens_per_s"] / figures["multi_turn_padded_tokens_per_s"]
    assert figures["tokens_per_s_speedup"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    ratio = figures["evaluation_shared_prefix_episodes_per_s"] / figures["evaluation_padded_episodes_per_s"]
    assert figures["episodes_per_s_speedup"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    ratio = figures["multi_turn_shared_prefix_tokens_per_s"] / figures["multi_turn_shared_prefix_layered_tokens_per_s"]
    assert figures["fused_step_speedup"] == pytest.approx(ratio, rel=0.01, abs=0.002)
    for side in ("padded", "shared_prefix_layered", "shared_prefix"):
        assert 0 < figures[f"multi_turn_{side}_attention_share"] < 1


@pytest.mark.slow  # ~9 s; test_demo's shared-opening SFT test checks the same equality
def test_sft_step_bench_reports_the_shared_prefix_speedup():
    # An unreachable target: exit 1 and a BELOW TARGET line.
    result, figures = _run("bench/sft_step.py", "--demos", "4", "--epochs", "1", "--batch-tokens", "8192",
                           "--threads", "1", "--target", "1e12")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "BELOW TARGET" in result.stdout
    speedup = _headline(result, "shared_prefix_speedup")
    ratio = figures["shared_tokens_per_s"] / figures["unshared_tokens_per_s"]
    assert speedup == pytest.approx(ratio, rel=0.01, abs=0.002)
    # The same training either way, up to float rounding.
    assert figures["shared_final_loss"] == pytest.approx(figures["unshared_final_loss"], abs=2e-4)
