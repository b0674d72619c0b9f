"""Inputs checked before the model loads (or before the demo's first step), found late before:

- train.train_router_sft: each sft.data results file and its game, before the base model and adapters load;
- train.evaluate: an --adapter folder that holds no adapter, before the base loads, and an adapter trained on another
  base (its weights' shapes differ), refused with one line instead of torch's RuntimeError;
- train.sft: non-finite --epochs / --lr, and chat records whose messages or tools the chat template would refuse;
- python -m demo: the LLM labelers' API key variable, before the base agent and its evaluation run.

Each CLI runs in process with what would load the model (or run the steps) replaced, so "refused before" is checked
directly; only the adapter-mismatch test loads the tiny model, since the mismatch shows only against a real base."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from benchmarks.results import make_simulation, write_results
from common.cli import exit_code

REPO = Path(__file__).resolve().parent.parent


class ModelLoaded(Exception):
    """Raised where the model would load: the command got past every input check."""


def _model_loaded(*args, **kwargs):
    raise ModelLoaded


def _run(main, argv: list, capsys) -> tuple[int | str, str]:
    """(exit status, or "model loaded"; stderr) of `main(argv)` run in process."""
    capsys.readouterr()
    try:
        code = exit_code(main, [str(a) for a in argv])
    except ModelLoaded:
        code = "model loaded"
    return code, capsys.readouterr().err


def _refused(code, err: str, *parts: str) -> None:
    assert code == 2, (code, err)
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for part in parts:
        assert part in err, err


# --------------------------------------------------------------------------------------------------
# train.train_router_sft: sft.data checked before the model loads
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def router_sft(monkeypatch, tmp_path):
    """A gate config writer; the base model's loader raises ModelLoaded (the model is a hub id, left to it)."""
    from train import policy

    monkeypatch.setattr(policy, "load_base_model", _model_loaded)
    results = write_results(tmp_path / "rollouts.json", [make_simulation(
        task_id="1", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        reward_info={"reward": 1.0}, termination_reason="done")])

    def config(*data: dict) -> Path:
        path = tmp_path / "gate.yaml"
        path.write_text(yaml.safe_dump({
            "model": "org/some-model", "adapters": {"cap_a": str(tmp_path / "a1"), "cap_b": str(tmp_path / "a2")},
            "output_dir": str(tmp_path / "gate"), "sft": {"data": list(data), "epochs": 1}}))
        return path

    return config, results


def test_router_sft_refuses_a_missing_results_file_before_the_model_loads(router_sft, tmp_path, capsys):
    # Before: the base model and both adapters loaded, then "error: ...: file not found".
    from train.train_router_sft import main

    config, results = router_sft
    missing = tmp_path / "no_such_rollouts.json"
    code, err = _run(main, ["--config", config({"path": str(results), "label": "cap_a"},
                                               {"path": str(missing), "label": "cap_b"})], capsys)
    _refused(code, err, f"error: sft.data: {missing}: file not found")
    not_results = tmp_path / "list.json"
    not_results.write_text("[]")
    code, err = _run(main, ["--config", config({"path": str(not_results), "label": "cap_a"})], capsys)
    _refused(code, err, f"{not_results}: not a τ²-bench results file")
    # The same config with the file there gets as far as the model.
    code, err = _run(main, ["--config", config({"path": str(results), "label": "cap_a"})], capsys)
    assert code == "model loaded", err


def test_router_sft_refuses_an_unknown_game_before_the_model_loads(router_sft, capsys):
    # Before: the model loaded and the first file was encoded, then `error: "unknown game 'no_such_game'; ..."` (a
    # KeyError's quoted string).
    from train.train_router_sft import main

    config, results = router_sft
    code, err = _run(main, ["--config", config({"path": str(results), "label": "cap_a", "game": "storefront"},
                                               {"path": str(results), "label": "cap_b", "game": "no_such_game"})],
                     capsys)
    _refused(code, err, f"error: sft.data {results}: unknown game 'no_such_game'; registered games: ")
    assert '"' not in err


# --------------------------------------------------------------------------------------------------
# train.evaluate: the adapter folder
# --------------------------------------------------------------------------------------------------
def _evaluate(model_dir: Path, adapter: Path, out: Path) -> list:
    return ["--model", model_dir, "--adapter", adapter, "--tasks", "1", "--out", out]


def test_evaluate_refuses_a_folder_without_an_adapter_before_the_model_loads(tiny_model_dir, monkeypatch, tmp_path,
                                                                              capsys):
    # Before: an empty folder passed the check (is_dir() only) and PEFT failed on it after the base had loaded.
    from train import evaluate

    monkeypatch.setattr(evaluate, "load_policy_model", _model_loaded)
    empty = tmp_path / "adapter"
    empty.mkdir()
    out = tmp_path / "results.json"
    code, err = _run(evaluate.main, _evaluate(tiny_model_dir, empty, out), capsys)
    _refused(code, err, f"error: --adapter {empty}: neither a PEFT adapter (adapter_config.json) nor a gate folder")
    assert not out.exists()
    for name in ("adapter_config.json", "gate_config.json"):  # either kind gets as far as the model
        (empty / name).write_text("{}")
        code, err = _run(evaluate.main, _evaluate(tiny_model_dir, empty, out), capsys)
        assert code == "model loaded", err
        (empty / name).unlink()


def _adapter_for_another_base(folder: Path, hidden: int = 32, rank: int = 4) -> Path:
    """A PEFT LoRA adapter (q_proj, 2 layers) for a base of hidden size `hidden`, written by hand."""
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM"}))
    weights = {}
    for layer in range(2):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        weights[f"{prefix}.lora_A.weight"] = torch.zeros(rank, hidden)
        weights[f"{prefix}.lora_B.weight"] = torch.zeros(hidden, rank)
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return folder


def test_evaluate_refuses_an_adapter_trained_on_another_base(tiny_model_dir, tmp_path, capsys):
    # Before: torch's RuntimeError "size mismatch for ..." as a traceback, exit 1.
    from train import evaluate

    adapter = _adapter_for_another_base(tmp_path / "adapter")
    out = tmp_path / "results.json"
    code, err = _run(evaluate.main, _evaluate(tiny_model_dir, adapter, out), capsys)
    last = err.strip().splitlines()[-1]  # after the weights' loading bar
    _refused(code, last, f"error: adapter {adapter} does not match the base model {tiny_model_dir}")
    assert "Traceback" not in err
    assert not out.exists()


# --------------------------------------------------------------------------------------------------
# train.sft: numbers and records checked before the model loads
# --------------------------------------------------------------------------------------------------
GOOD_RECORD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture
def sft_run(monkeypatch, tiny_model_dir, tmp_path):
    """Runs train.sft on one JSONL file of records; transformers' model and tokenizer loaders raise ModelLoaded."""
    import transformers

    from train import sft

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", _model_loaded)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", _model_loaded)

    def run(records: list, *flags: str, capsys) -> tuple[int | str, str]:
        data = tmp_path / "demos.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        return _run(sft.main, ["--model", tiny_model_dir, "--data", data, "--out", tmp_path / "out", *flags], capsys)

    return run


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "inf"], "SFTConfig.epochs must be a finite number > 0, got inf"),
    (["--lr", "inf", "--warmup-steps", "0"], "SFTConfig.lr must be a finite number > 0, got inf"),
    (["--lr", "nan"], "SFTConfig.lr must be a finite number > 0, got nan"),
    (["--max-grad-norm", "inf"], "SFTConfig.max_grad_norm must be a finite number > 0, got inf"),
])
def test_sft_refuses_non_finite_numbers_before_the_model_loads(sft_run, flags, message, tmp_path, capsys):
    # Before: --epochs inf ended in an OverflowError traceback after the model loaded; --lr inf exited 0 having saved
    # weights that were all inf/nan.
    code, err = sft_run([GOOD_RECORD], *flags, capsys=capsys)
    _refused(code, err, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("record, message", [
    ({"messages": ["hello", "x"]}, "record 1: messages[0] must be an object with a string 'role'"),
    ({"messages": [{"content": "hi"}]}, "record 1: messages[0] must be an object with a string 'role'"),
    ({**GOOD_RECORD, "tools": "abc"}, "record 1: tools must be a list of tool schemas (JSON objects), got 'abc'"),
    ({**GOOD_RECORD, "tools": ["abc"]}, "record 1: tools must be a list of tool schemas"),
])
def test_sft_refuses_records_the_chat_template_cannot_render_before_the_model_loads(sft_run, record, message,
                                                                                    tmp_path, capsys):
    # Before: a TypeError (a message that is not an object) or ValueError (tools a string) from the chat template,
    # after the model had loaded.
    code, err = sft_run([record], capsys=capsys)
    _refused(code, err, "error: --data ", message)
    assert not (tmp_path / "out").exists()


def test_sft_accepts_records_with_tool_schemas_or_no_tools(sft_run, capsys):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    code, err = sft_run([GOOD_RECORD, {**GOOD_RECORD, "tools": tools}, {**GOOD_RECORD, "tools": None}], capsys=capsys)
    assert code == "model loaded", err


# --------------------------------------------------------------------------------------------------
# python -m demo: the LLM labelers' API key, before any step
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_steps(monkeypatch):
    """The demo's steps replaced by a recorder of whether they started."""
    from demo import run as demo_run

    started = []
    monkeypatch.setattr(demo_run, "_run_steps", lambda *args: started.append(args) or 0)
    return started


def test_demo_refuses_llm_labelers_without_their_api_key_before_any_step(no_steps, monkeypatch, tmp_path, capsys):
    # Before: the base agent and its evaluation ran (up to an hour on CPU), then Step 1 stopped on the missing key.
    from demo.run import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    argv = ["--profile", "fast", "--run-dir", tmp_path / "run", "--labeler-url", "http://127.0.0.1:8000/v1",
            "--labeler-model", "m"]
    code, err = _run(main, argv, capsys)
    _refused(code, err, "error: select.labeler_url http://127.0.0.1:8000/v1: ", "$OPENAI_API_KEY",
             "OPENAI_API_KEY=EMPTY")
    assert no_steps == [] and not (tmp_path / "run").exists()
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")  # any value does, as for the labelers' client
    code, err = _run(main, argv, capsys)
    assert code == 0 and len(no_steps) == 1, err


def test_demo_reads_the_key_variable_the_config_names(no_steps, monkeypatch, tmp_path, capsys):
    from demo.run import main

    values = yaml.safe_load((REPO / "configs/demo_fast.yaml").read_text())
    values["select"] = {**values.get("select", {}), "labeler_url": "http://127.0.0.1:8000/v1",
                        "labeler_model": "m", "labeler_api_key_env": "TRACE_TEST_LABELER_KEY"}
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(values))
    monkeypatch.delenv("TRACE_TEST_LABELER_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "set, but not the variable the config names")
    code, err = _run(main, ["--config", config, "--run-dir", tmp_path / "run"], capsys)
    _refused(code, err, "$TRACE_TEST_LABELER_KEY (select.labeler_api_key_env)")
    assert no_steps == []
    monkeypatch.delenv("OPENAI_API_KEY")  # rule-based labelers need no key
    del values["select"]["labeler_url"], values["select"]["labeler_model"], values["select"]["labeler_api_key_env"]
    config.write_text(yaml.safe_dump(values))
    code, err = _run(main, ["--config", config, "--run-dir", tmp_path / "run"], capsys)
    assert code == 0 and len(no_steps) == 1, err


def test_a_flaw_planted_twice_is_refused():
    # Before: `--plant skip_status_check=0.5,skip_status_check=0.2` kept 0.2 without a word.
    from benchmarks.storefront.demos import parse_planted
    from common.validation import InputError

    with pytest.raises(InputError, match="skip_status_check is given twice \\(0.5 and 0.2\\); give each flaw once"):
        parse_planted("skip_status_check=0.5,skip_status_check=0.2")
    assert parse_planted("skip_status_check=0.5,drop_hash=0.2") == {"skip_status_check": 0.5, "drop_hash": 0.2}
