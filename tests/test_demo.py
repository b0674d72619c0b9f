"""The closed-loop CPU demo's parts: compact tool view, demonstrations with plants, SFT, Step 1 on storefront
results, game mixes with overrides, the demo config; and (slow) the whole fast profile end to end."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
from tracking_readback import (GRPO_NAMES, ROUTER_NAMES, SFT_NAMES, assert_same_series,
                               expected_series, rows, tensorboard_scalars, tensorboard_texts)


@pytest.fixture(scope="module")
def demo_config():
    from benchmarks.storefront.run import load_config

    return load_config(str(REPO / "configs/storefront/cpu_demo.yaml"))


# ---- compact tool view ---------------------------------------------------------------------------------


def test_compact_view_lists_every_tool_and_argument_and_stays_append_only(demo_config):
    from benchmarks.storefront.env import StorefrontGame
    from train.chat_template import CHAT_TEMPLATE, chat_template, render_chat

    assert chat_template("full") == CHAT_TEMPLATE
    game = StorefrontGame(demo_config)
    messages = game.reset(3)
    tools = game.get_tool_schemas()
    full = render_chat(messages, tools)
    compact = render_chat(messages, tools, tools_view="compact")
    assert len(compact) < len(full) / 2
    for tool in tools:
        fn = tool["function"]
        args = ", ".join(fn["parameters"]["required"]
                         + [p for p in fn["parameters"]["properties"] if p not in fn["parameters"]["required"]])
        assert f"\n{fn['name']}({args})" in compact
    longer = messages + [{"role": "assistant", "content": "Please give me your email."},
                         {"role": "user", "content": "mia8@x.io"}]
    assert render_chat(longer, tools, tools_view="compact").startswith(compact)
    with pytest.raises(ValueError, match="tools_view"):
        chat_template("tiny")


def test_tiny_model_built_with_compact_view_renders_it(tmp_path, demo_config):
    from transformers import AutoTokenizer

    from benchmarks.storefront.env import StorefrontGame
    from train.chat_template import render_chat
    from train.tiny import build_tiny_model

    out = build_tiny_model(tmp_path / "m", vocab_size=400, hidden_size=32, num_layers=1, num_heads=2,
                           tools_view="compact")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    game = StorefrontGame(demo_config)
    messages = game.reset(1)
    tools = game.get_tool_schemas()
    assert tokenizer.apply_chat_template(messages, tools=tools, tokenize=False) == render_chat(
        messages, tools, tools_view="compact")
    assert json.loads((out / "tiny_build.json").read_text())["tools_view"] == "compact"


# ---- demonstrations -------------------------------------------------------------------------------------


def test_demonstrations_are_reproducible_and_plants_cost_exactly_their_tasks(demo_config):
    from benchmarks.storefront.demos import make_demonstrations

    clean = make_demonstrations(60, 0, demo_config, {}, progress=False)
    assert all(r["reward"] == 1.0 and r["flaws"] == [] for r in clean)
    planted = make_demonstrations(60, 0, demo_config, {"skip_status_check": 1.0}, progress=False)
    assert planted == make_demonstrations(60, 0, demo_config, {"skip_status_check": 1.0}, progress=False)
    assert [r["task_seed"] for r in planted] == [r["task_seed"] for r in clean]
    failing = [r for r in planted if r["reward"] < 1.0]
    assert failing, "a planted status-check flaw must cost some tasks"
    # Only a forbidden request can be failed by skipping the status check: a write the gold plan lacks.
    for record in failing:
        calls = [c["name"] for m in record["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert any(name.startswith(("cancel_", "modify_", "return_", "exchange_")) for name in calls)
    with pytest.raises(ValueError, match="unknown flaw"):
        make_demonstrations(1, 0, demo_config, {"skip_everything": 0.5}, progress=False)
    with pytest.raises(ValueError, match=r"share in \[0, 1\]"):
        make_demonstrations(1, 0, demo_config, {"drop_hash": 1.5}, progress=False)


def test_openings_end_at_the_first_order_look_up_and_plant_nothing(demo_config):
    from benchmarks.storefront.demos import make_demonstrations, make_openings, opening

    whole = make_demonstrations(40, 3, demo_config, {}, progress=False)
    openings = make_openings(40, 3, demo_config, progress=False)
    cut_short = 0
    for record, cut in zip(whole, openings):
        assert cut["messages"] == record["messages"][: len(cut["messages"])] and cut["flaws"] == []
        calls = [c["name"] for m in cut["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert calls[0].startswith("find_user_id_by_")  # the identification is copied first
        if "get_order_details" in calls:  # cut right after the first look-up
            assert calls.count("get_order_details") == 1
            assert cut["messages"][-1]["tool_calls"][0]["name"] == "get_order_details"
            cut_short += len(cut["messages"]) < len(record["messages"])
        else:  # a request that needs no order (a user's own address) is kept whole
            assert cut == record
    assert cut_short >= 30
    assert sum(len(c["messages"]) for c in openings) < 0.7 * sum(len(r["messages"]) for r in whole)
    no_look_up = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]}
    assert opening(no_look_up) == no_look_up


def test_item_selections_end_at_the_first_write_of_a_return_or_exchange_and_keep_the_plants(demo_config):
    import dataclasses

    from benchmarks.storefront.demos import make_demonstrations, make_item_selections, through_first_write
    from benchmarks.storefront.tools import StorefrontTools

    planted = {"wrong_refund_method": 1.0}
    cuts = make_item_selections(60, 5, demo_config, planted, progress=False)
    # the same episodes played whole: the storefront restricted to the kinds that name items
    item_kinds = {k: w for k, w in demo_config.kind_weights.items() if k in ("return", "exchange") and w > 0}
    whole = make_demonstrations(60, 5, dataclasses.replace(demo_config, kind_weights=item_kinds), planted,
                                progress=False)
    by_seed = {r["task_seed"]: r for r in whole}
    writes = StorefrontTools.write_tools()
    assert 30 <= len(cuts) < 60  # episodes without a write (refused: the order's status forbids it) are dropped
    for cut in cuts:
        record = by_seed[cut["task_seed"]]
        assert cut["messages"] == record["messages"][: len(cut["messages"])] and cut["flaws"] == ["wrong_refund_method"]
        assert set(cut["request_kinds"]) <= {"return", "exchange"}
        names = [c["name"] for m in cut["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert names[-1] in {"return_delivered_order_items", "exchange_delivered_order_items"}
        assert not set(names[:-1]) & writes  # through the first write, not beyond
        assert len(cut["messages"]) < len(record["messages"])  # the write's answer and the rest are cut
    dropped = [r for r in whole if through_first_write(r, writes) is None]
    assert len(dropped) == 60 - len(cuts)
    assert all(not set(c["name"] for m in r["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or [])
               & writes for r in dropped)
    with pytest.raises(ValueError, match="give return and/or exchange a weight > 0"):
        make_item_selections(5, 0, dataclasses.replace(demo_config, kind_weights={"cancel": 1.0}), {}, progress=False)


def test_base_settings_leave_out_the_late_stages_when_neither_runs():
    """Agents built before the late stages existed keep their fingerprint; running a stage changes it."""
    import dataclasses

    from demo.base_agent import settings_fingerprint
    from demo.config import LATE_STAGE_KEYS, base_settings, load_demo_config

    config = load_demo_config(REPO / "configs" / "demo_fast.yaml")
    storefront = config.storefront_config(REPO)
    off = dataclasses.replace(config, base=dataclasses.replace(config.base, selection=0, refresh=0))
    assert not set(LATE_STAGE_KEYS) & set(base_settings(off, storefront))
    fingerprints = {settings_fingerprint(base_settings(off, storefront))}
    for change in ({"selection": 5}, {"refresh": 5}, {"selection": 5, "late_lr": 5e-4}):
        on = dataclasses.replace(config, base=dataclasses.replace(off.base, **change))
        settings = base_settings(on, storefront)
        assert set(LATE_STAGE_KEYS) <= set(settings)
        fingerprints.add(settings_fingerprint(settings))
    assert len(fingerprints) == 4


def test_base_settings_leave_out_the_copy_drills_when_off():
    """The copy drills' key joins the base agent's settings (and changes its fingerprint) only when drills run."""
    import dataclasses

    from demo.base_agent import settings_fingerprint
    from demo.config import base_settings, load_demo_config

    config = load_demo_config(REPO / "configs" / "demo.yaml")
    storefront = config.storefront_config(REPO)

    def settings(drills: int) -> dict:
        return base_settings(dataclasses.replace(config, base=dataclasses.replace(config.base, copy_drills=drills)),
                             storefront)

    off, on = settings(0), settings(10)
    assert "copy_drills" not in off
    assert on == {**off, "copy_drills": 10}
    assert settings_fingerprint(on) != settings_fingerprint(off)


# ---- SFT ------------------------------------------------------------------------------------------------


@pytest.mark.slow  # ~16 s of SFT; test_sft_runs_the_shared_opening_once_... keeps SFT in the default suite
def test_sft_trains_only_assistant_tokens_and_lowers_the_loss(tiny_model_dir, demo_config):
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.storefront.demos import make_demonstrations
    from train.sft import SFTConfig, batch_loss, make_batches, tokenize_chats, train_sft

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    demos = make_demonstrations(6, 0, demo_config, {}, progress=False)
    chats = tokenize_chats(tokenizer, demos, progress=False)
    # The trained tokens are exactly the assistant turns as the template renders them.
    ids, mask = chats[0]
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    turns = [m for m in demos[0]["messages"] if m["role"] == "assistant"]
    assert trained.count("<|im_end|>") == len(turns)
    assert "<|im_start|>" not in trained and "Please give me your email" in trained
    assert "You are a store support agent" not in trained
    batches = make_batches(chats, 4096, tokenizer.pad_token_id, random.Random(0))
    assert sum(b.input_ids.shape[0] for b in batches) == len(chats)
    for batch in batches:
        assert batch.input_ids.numel() <= 4096 or batch.input_ids.shape[0] == 1
        trained_positions = batch.labels != -100
        assert torch.equal(batch.labels[trained_positions], batch.input_ids[trained_positions])
        assert int(trained_positions.sum()) == sum(sum(c.assistant_mask) for c in chats
                                                   if c.input_ids in [r[: len(c.input_ids)].tolist()
                                                                      for r in batch.input_ids])
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    before = batch_loss(model, batches[0])[0].item()
    figures = train_sft(model, chats, SFTConfig(epochs=6, lr=3e-3, warmup_steps=2, batch_tokens=4096), tokenizer.pad_token_id,
                        progress=False)
    after = batch_loss(model, batches[0])[0].item()
    assert figures["steps"] >= 6 and after < before - 0.5


def test_sft_runs_the_shared_opening_once_with_the_same_loss_and_gradients(tiny_model_dir, demo_config):
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.storefront.demos import make_demonstrations
    from train.sft import batch_loss, make_batches, tokenize_chats

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    chats = tokenize_chats(tokenizer, make_demonstrations(3, 0, demo_config, {}, progress=False), progress=False)
    batches = make_batches(chats, 1 << 16, tokenizer.pad_token_id, random.Random(0), share_prefix=True)
    (batch,) = batches  # all 3 in one batch
    assert batch.prefix_len >= 100  # the system prompt and tools
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    results = []
    for prefix_len in (batch.prefix_len, 0):
        model.zero_grad()
        loss, n_trained, n_correct = batch_loss(model, batch._replace(prefix_len=prefix_len))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((loss.item(), n_trained, n_correct, grads))
    (shared_loss, *shared_counts, shared_grads), (plain_loss, *plain_counts, plain_grads) = results
    assert shared_counts == plain_counts and abs(shared_loss - plain_loss) < 1e-5
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_the_shared_opening_stops_before_the_first_trained_token():
    from train.sft import TokenizedChat, shared_prefix_len

    opening = list(range(10, 60))
    a = TokenizedChat(opening + [1, 2, 3], [0] * 45 + [1] * 8)  # trains from index 45 (inside the opening)
    b = TokenizedChat(opening + [4, 5], [0] * 50 + [1] * 2)
    assert shared_prefix_len([a, b]) == 44  # the output at 44 predicts token 45, which a trains on
    assert shared_prefix_len([b, TokenizedChat(opening[:40] + [7, 8], [0] * 40 + [1] * 2)]) == 39
    assert shared_prefix_len([a]) == 0  # one row: nothing to share
    assert shared_prefix_len([TokenizedChat(opening, [0] * 20 + [1] * 30), b]) == 0  # 19 < MIN_SHARED_PREFIX


def test_sft_config_rejects_bad_values():
    from train.sft import SFTConfig

    for bad in ({"lr": 0}, {"epochs": -1}, {"batch_tokens": 8}, {"final_lr_ratio": 2.0}, {"warmup_steps": -1},
                {"report_to": ["tensorbaord"]}):
        with pytest.raises(ValueError, match="SFTConfig"):
            SFTConfig(**bad)


def test_sft_cli_report_to_tensorboard_logs_the_rows_of_sft_info(tiny_model_dir, tmp_path, capsys):
    """`python -m train.sft ... --report_to tensorboard`: the event files hold sft_info.json's log rows."""
    from train.sft import main as sft_main

    data = tmp_path / "demos.jsonl"
    chats = [{"messages": [{"role": "user", "content": f"Where is order #{n}?"},
                           {"role": "assistant", "content": f"Order #{n} ships on day {n % 7}."}]} for n in range(8)]
    data.write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    out = tmp_path / "sft"
    code = sft_main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--epochs", "2",
                     "--lr", "3e-3", "--warmup-steps", "2", "--batch-tokens", "128", "--report_to", "tensorboard"])
    assert code == 0, capsys.readouterr().err[-3000:]
    info = json.loads((out / "sft_info.json").read_text())
    assert len(info["log"]) == info["steps"] >= 3 and info["log"][0]["step"] == 0
    assert all(row["tokens_per_s"] > 0 for row in info["log"])
    assert_same_series(tensorboard_scalars(out / "tb"), expected_series(info["log"], SFT_NAMES, "step"), float32=True)
    (config_text,) = tensorboard_texts(out / "tb")["run/text_summary"]
    assert "batch_tokens: 128" in config_text[1] and str(data) in config_text[1]


def test_the_demos_grpo_runs_report_to_its_trackers(tiny_model_dir, tmp_path, monkeypatch):
    """demo/loop.py train_lora (every GRPO run of the demo) passes report_to to the trainer: output_dir/tb."""
    import game_registry
    from demo.config import LoopSettings
    from demo.loop import train_lora

    # The test game is registered for this test only (later tests list every registered capability game). The
    # registry is discovered first: a copy taken before discovery would be restored empty, marked discovered.
    game_registry.discover_games()
    monkeypatch.setattr(game_registry, "_REGISTRY", dict(game_registry._REGISTRY))
    monkeypatch.setattr(game_registry, "_LOADED_FILES", set(game_registry._LOADED_FILES))
    game_registry._import_game_file(REPO / "tests" / "games" / "capability_letter_density_game.py")
    settings = LoopSettings(groups_per_iteration=2, group_size=4, max_episode_tokens=128, learning_rate=3e-2)
    run = train_lora(game_registry.get_game("capability_letter_density"), tiny_model_dir, tmp_path / "cap", {},
                     settings, 2, report_to=["tensorboard"])
    assert [point["iteration"] for point in run["curve"]] == [1, 2]
    assert_same_series(tensorboard_scalars(tmp_path / "cap" / "tb"),
                       expected_series(rows(tmp_path / "cap" / "metrics.jsonl"), GRPO_NAMES, "iteration"), float32=True)


def test_demo_report_to_comes_from_the_config_or_the_command_line_and_fingerprints_no_step(tmp_path):
    from common.validation import InputError
    from demo.config import load_demo_config

    path = tmp_path / "demo.yaml"
    path.write_text((REPO / "configs" / "demo_fast.yaml").read_text() + "report_to: [tensorboard]\n")
    assert load_demo_config(path).report_to == ["tensorboard"]
    path.write_text("report_to: tensorbored\n")
    with pytest.raises(InputError, match="unknown tracker 'tensorbored'; accepted: tensorboard, wandb"):
        load_demo_config(path)


# ---- Step 1 on storefront results -------------------------------------------------------------------------


def test_step1_on_a_flawed_expert_selects_the_planted_capability(tmp_path, demo_config):
    from benchmarks.results import write_results
    from benchmarks.storefront.flaws import FlawedExpertAgent
    from benchmarks.storefront.run import run_benchmark
    from demo.config import SelectSettings
    from demo.selection import select_on_results

    simulations, tasks = run_benchmark(FlawedExpertAgent("skip_status_check"), 80, 7, config=demo_config,
                                       progress=False)
    results = write_results(tmp_path / "results.json", simulations, tasks, {})
    figures = select_on_results(Path(results), tmp_path, {"skip_status_check": 1.0}, SelectSettings())
    assert figures["selected"] == ["precondition_verification"]
    assert figures["precision"] == 1.0 and figures["recall"] == 1.0
    assert (tmp_path / "selected_capabilities.json").is_file()
    assert len(list((tmp_path / "labels").glob("run_*.json"))) == 10


def test_step1_refuses_to_contrast_without_passed_trajectories(tmp_path, demo_config):
    from benchmarks.results import write_results
    from benchmarks.storefront.flaws import FlawedExpertAgent
    from benchmarks.storefront.run import run_benchmark
    from demo.config import SelectSettings
    from demo.selection import select_on_results

    simulations, tasks = run_benchmark(FlawedExpertAgent("skip_status_check"), 30, 7, config=demo_config,
                                       progress=False)
    for sim in simulations:
        sim["reward_info"]["reward"] = 0.0
    results = write_results(tmp_path / "results.json", simulations, tasks, {})
    figures = select_on_results(Path(results), tmp_path, {"skip_status_check": 1.0}, SelectSettings())
    assert figures["selected"] == [] and "passed no analysis task" in figures["why_empty"]
    assert figures["precision"] is None and figures["recall"] == 0.0


# ---- game mix with per-game overrides ----------------------------------------------------------------------


def test_game_mix_applies_each_games_overrides():
    from game_registry import get_game
    from train.game_mix import mixed_spec

    specs = [get_game("capability_precondition_verification"), get_game("capability_structured_data_reasoning")]
    mix = mixed_spec(specs, overrides={specs[0].name: {"short_ids": True}})
    game = mix.make()
    game.reset(0)  # seed 0 plays the first game, with short ids
    orders = [m for m in game.inner.db.orders]
    assert orders and all(len(o) == len("#W123") for o in orders)
    game.reset(1)  # the second game keeps its defaults
    assert all(len(o) == len("#W1234567") for o in game.inner.db.orders)
    with pytest.raises(ValueError, match="outside the mix"):
        mixed_spec(specs, overrides={"storefront": {}})
    with pytest.raises(ValueError, match="do not fit"):
        mixed_spec(specs, overrides={specs[0].name: {"no_such_field": 1}})


# ---- config -----------------------------------------------------------------------------------------------


def test_demo_configs_load_and_bad_ones_say_what_to_fix(tmp_path):
    from common.validation import InputError
    from demo.config import load_demo_config

    for name in ("demo.yaml", "demo_full.yaml", "demo_fast.yaml"):
        config = load_demo_config(REPO / "configs" / name)
        config.storefront_config(REPO)
    cases = {"base: {hidden: 3}\n": "unknown key", "select: {k: 11, runs: 10}\n": "k=11",
             "colour: red\n": "unknown section", "loop: {capabilities: [flying]}\n": "candidate capabilities",
             "base: {planted: {skip_status_check: 2}}\n": r"share in \[0, 1\]",
             "base: {openings: -5}\n": "base.openings must be an int >= 0",
             "base: {selection: -1}\n": r"base.selection must be an int >= 0 \(0 skips that stage\)",
             "base: {refresh: 2.5}\n": "base.refresh must be an int >= 0",
             "base: {copy_drills: -1}\n": r"base.copy_drills must be an int >= 0 \(0 skips the copy drills\)",
             "base: {late_lr: 0}\n": r"base.late_lr must be a number in \[1e-09, 1.0\]",
             "evaluate: {max_steps: 0}\n": "evaluate.max_steps must be an int >= 1",
             "own_game: {tasks: 0}\n": "own_game.tasks must be an int >= 1",
             "evaluate: {efficiency_fractions: [0.5, 1.0]}\n": r"efficiency_fractions must list fractions .* \[\] turns "
                                                              "the efficiency step off",
             "loop: {direct_fresh: false, direct_task_pool: 0}\n": "direct_fresh false needs loop.direct_task_pool > 0",
             "own_game: {enabled: 1}\n": "own_game.enabled must be true or false",
             "evaluate: {each_adapter: no-thanks}\n": "evaluate.each_adapter must be true or false"}
    for text, message in cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(InputError, match=message):
            load_demo_config(path)


def test_make_demo_is_make_demo_full_without_the_diagnostic_rows():
    """The claims profile (configs/demo.yaml) and the full one differ only in the diagnostic switches, so they share
    the base agent, Steps 1-2 and every budget; the claims profile keeps the rows the paper's claims need."""
    from demo.config import load_demo_config

    claims, full = (dataclasses.asdict(load_demo_config(REPO / "configs" / name)) for name in ("demo.yaml", "demo_full.yaml"))
    switches = {("evaluate", "each_adapter"), ("evaluate", "efficiency_fractions"), ("loop", "direct_fresh"),
                ("own_game", "enabled")}
    differing = {(section, key) for section, values in full.items() if isinstance(values, dict)
                 for key in values if claims[section][key] != values[key]}
    assert differing == switches
    assert {k: v for k, v in full.items() if not isinstance(v, dict)} == \
        {k: v for k, v in claims.items() if not isinstance(v, dict)}
    assert claims["evaluate"]["efficiency_fractions"] == [0.25]  # TRACE @1/4 against direct GRPO's final and @1/4
    assert claims["loop"]["baselines"] and claims["loop"]["direct_task_pool"] > 0  # direct GRPO on the task pool


@pytest.mark.slow  # ~3 min: the fast profile's budgets with the claims profile's switches
def test_the_claims_profile_trains_direct_grpo_on_the_pool_and_evaluates_only_the_claims_rows(tmp_path):
    fast = yaml.safe_load((REPO / "configs" / "demo_fast.yaml").read_text())
    fast["evaluate"]["each_adapter"] = False
    fast["loop"]["direct_fresh"] = False
    fast["own_game"]["enabled"] = False
    config = tmp_path / "claims_fast.yaml"
    config.write_text(yaml.safe_dump(fast))
    demo = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "demo", "--config", str(config), "--run-dir", str(demo)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    baselines = json.loads((demo / "baselines" / "step.json").read_text())["figures"]
    assert "direct_pool" not in baselines and not (demo / "baselines" / "direct_pool").exists()
    assert baselines["direct"]["tasks"]["pool"] == fast["loop"]["direct_task_pool"]  # the one direct run: the pool
    (checkpoint,) = baselines["direct"]["checkpoints"]
    assert checkpoint["label"] == "direct GRPO @1/2"
    results = json.loads((demo / "results.json").read_text())
    assert set(results["evaluation"]) == {"base", "TRACE", "TRACE @1/2", "direct GRPO", "direct GRPO @1/2",
                                          "single-adapter GRPO"}
    assert json.loads((demo / "own_game" / "step.json").read_text())["figures"] == {}
    assert "fixed pool of 2 target tasks" in (demo / "report.md").read_text()


@pytest.mark.slow
def test_demo_fast_runs_every_step_and_resumes(tmp_path):
    command = [sys.executable, "-m", "demo", "--profile", "fast", "--run-dir", str(tmp_path / "demo")]
    first = subprocess.run([*command, "--report-to", "tensorboard"], cwd=REPO, capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    # --report-to: every training run the demo started has its own TensorBoard run holding its metrics file
    demo = tmp_path / "demo"
    for run in ("base/sft_copy_drills", "base/sft_openings", "base/sft", "base/sft_selection", "base/sft_refresh"):
        log = json.loads((demo / "base" / "step.json").read_text())["figures"]
        log = log["log"] if run == "base/sft" else log[run.removeprefix("base/sft_")]["log"]
        assert_same_series(tensorboard_scalars(demo / run / "tb"), expected_series(log, SFT_NAMES, "step"),
                           float32=True)
    grpo_runs = [p.parent.relative_to(demo) for p in sorted(demo.glob("*/*/metrics.jsonl"))]
    assert {str(p) for p in grpo_runs} >= {"train/precondition_verification", "train/structured_data_reasoning",
                                            "gate/gate", "baselines/direct", "baselines/mixed"}, grpo_runs
    for run in grpo_runs:
        assert_same_series(tensorboard_scalars(demo / run / "tb"),
                           expected_series(rows(demo / run / "metrics.jsonl"), GRPO_NAMES, "iteration"), float32=True)
    if "sft_gate" in json.loads((demo / "gate" / "step.json").read_text())["figures"]:  # router SFT ran (the fast
        # profile's weak agent may have no successful rollout to warm-start the gate on)
        assert_same_series(tensorboard_scalars(demo / "gate" / "gate_sft" / "tb"),
                           expected_series(rows(demo / "gate" / "gate_sft" / "sft_metrics.jsonl"), ROUTER_NAMES,
                                           "epoch"), float32=True)
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert set(results["steps"]) == {"base", "evaluate", "select", "environments", "train", "own_game", "gate",
                                     "baselines", "final", "efficiency"}
    assert (tmp_path / "demo" / "report.md").is_file() and (tmp_path / "demo" / "sft_curve.png").is_file()
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "After it, at lr 0.001: return and exchange demonstrations cut through their write" in report
    assert "First of all, 100 copy drills (repeat a random token string" in report
    assert "TRACE" in results["evaluation"] and "direct GRPO" in results["evaluation"]
    # direct GRPO's second setting: a fixed pool of 2 tasks (demo_fast.yaml), 12 groups = 6 passes, evaluated beside
    # the fresh-task run
    pool_run = json.loads((demo / "baselines" / "step.json").read_text())["figures"]["direct_pool"]
    assert pool_run["tasks"] == {"pool": 2, "groups": 12, "distinct": 2, "passes": 6.0}
    assert "direct GRPO (task pool)" in results["evaluation"] and set(results["direct_settings"]["rows"]) == {
        "direct GRPO", "direct GRPO (task pool)"}
    assert "baselines/direct_pool" in {str(p) for p in grpo_runs}
    # efficiency (efficiency_fractions [0.5]; direct GRPO runs 6 iterations): its checkpoint at iteration 3, evaluated
    # on the final step's tasks, beside TRACE
    direct = json.loads((demo / "baselines" / "step.json").read_text())["figures"]["direct"]
    (checkpoint,) = direct["checkpoints"]
    assert checkpoint["iteration"] == 3 and checkpoint["label"] == "direct GRPO @1/2"
    assert sorted(p.name for p in (demo / "baselines" / "direct" / "checkpoints").iterdir()) == ["iter_000003",
                                                                                                 "iter_000006"]
    evaluated = json.loads((demo / "efficiency" / "direct_GRPO_at1of2_seed1000_greedy.json").read_text())
    assert evaluated["info"]["adapter"] == checkpoint["adapter"]
    final = json.loads((demo / "final" / "direct_GRPO_seed1000_greedy.json").read_text())
    assert [s["task_id"] for s in evaluated["simulations"]] == [s["task_id"] for s in final["simulations"]]
    # and TRACE at 1/2 of its own budget: each adapter's checkpoint at iteration 1 of 2 and a gate of 1 GRPO iteration
    # (of 2) trained on them: 2 x 4 + 4 of TRACE's 24 episodes
    efficiency = json.loads((demo / "efficiency" / "step.json").read_text())["figures"]
    (half,) = efficiency["trace_checkpoints"].values()
    assert (half["iteration"], half["gate_iterations"], half["episodes"]) == (1, 1, 12), half
    moe = yaml.safe_load((Path(half["gate"]).parent / "moe_gate.yaml").read_text())
    assert all(a.endswith("checkpoints/iter_000001/adapter") for a in moe["adapters"].values())
    assert moe["grpo"]["iterations"] == 1
    assert set(results["efficiency"]["rows"]) == {"base", "direct GRPO @1/2", "direct GRPO", "TRACE @1/2", "TRACE"}
    assert "direct GRPO @1/2" in results["evaluation"] and "TRACE @1/2" in results["evaluation"]
    assert (demo / "efficiency.png").is_file()
    # own_game: the base agent and each adapter played that adapter's game, at the settings calibration chose.
    trained = json.loads((tmp_path / "demo" / "train" / "step.json").read_text())["figures"]["adapters"]
    assert set(results["own_game"]) == set(trained)
    for capability, row in results["own_game"].items():
        assert row["game_overrides"] == results["environments"][capability]["game_overrides"]
        for label in ("base", "lora"):
            played = json.loads((tmp_path / "demo" / "own_game" / f"{capability}_{label}_seed7000_greedy.json")
                                .read_text())["simulations"]
            assert {s["reward_info"]["game"] for s in played} == {f"capability_{capability}"}
            assert all(s["reward_info"]["config"][k] == v for s in played for k, v in row["game_overrides"].items())
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0
    assert second.stdout.count("up to date") == 10  # report_to is no step's setting: dropping it re-runs nothing
    # --repeat 2: the first run's steps stay up to date; the steps from train on run again with training seed 1 in
    # repeats/seed1/, every training run with that seed, and the report gives the spread over the two runs
    third = subprocess.run([*command, "--repeat", "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.stdout.count("up to date") == 10
    repeat = demo / "repeats" / "seed1"
    assert sorted(p.parent.name for p in repeat.glob("*/step.json")) == sorted(
        ["train", "own_game", "gate", "baselines", "final", "efficiency"])
    for config in [*repeat.glob("train/*/config.yaml"), *repeat.glob("baselines/*/config.yaml")]:
        assert yaml.safe_load(config.read_text())["seed"] == 1, config
    assert yaml.safe_load((repeat / "gate" / "moe_gate.yaml").read_text())["seed"] == 1
    results = json.loads((demo / "results.json").read_text())
    assert results["repeats"]["training_seeds"] == [0, 1]
    assert set(results["repeats"]["models"]) >= {"base", "TRACE", "direct GRPO", "direct GRPO (task pool)"}


def test_step1_with_llm_labelers_goes_through_label_trajectories(tmp_path, demo_config, monkeypatch):
    from fake_openai_server import FakeOpenAIServer

    from benchmarks.results import write_results
    from benchmarks.storefront.flaws import FlawedExpertAgent
    from benchmarks.storefront.run import run_benchmark
    from demo.config import SelectSettings
    from demo.selection import select_on_results

    simulations, tasks = run_benchmark(FlawedExpertAgent("skip_status_check"), 12, 7, config=demo_config,
                                       progress=False)
    results = write_results(tmp_path / "results.json", simulations, tasks, {})
    monkeypatch.setenv("DEMO_TEST_KEY", "secret")
    with FakeOpenAIServer(api_key="secret") as server:
        settings = SelectSettings(runs=3, k=2, labeler_url=server.base_url, labeler_model=server.model,
                                  labeler_api_key_env="DEMO_TEST_KEY")
        figures = select_on_results(Path(results), tmp_path, {"skip_status_check": 1.0}, settings)
        n_requests = len(server.requests)
    assert figures["labelers"] == "llm"
    assert n_requests == 3 * len(simulations)  # one labeling call per (labeler, trajectory)
    assert len(list((tmp_path / "llm").glob("run_*.json"))) == 3
    # The fake labels PRESENT unless a transcript carries its markers: nothing is selected, and that is reported.
    assert figures["selected"] == [] and figures["recall"] == 0.0
    with pytest.raises(ValueError, match="go together"):
        SelectSettings(labeler_url="http://x")


def test_a_game_is_trained_only_where_the_base_agent_sometimes_wins_it_in_full():
    """The full-success rule: a calibrated game is trained when the base agent's full-success rate at some value
    tried is in the band; a game it never wins (partial credit alone, however much its rewards vary) is *not
    trainable with this agent*, and the reason gives each value's figures and the first mistakes counted there."""
    from demo.trainable import TRAIN_BAND, binary_spread_share, not_trained_because

    assert TRAIN_BAND == (0.10, 0.60)
    assert abs(binary_spread_share(0.0830, 8) - 0.5) < 1e-3  # a record without spread figures gets 0/1 spread
    env = {"status": "in_band", "knob": "k", "value": 1, "success_rate": 0.3}
    assert not_trained_because(env, 8) is None
    partial = {"status": "out_of_range", "knob": "k", "value": 1, "success_rate": 0.0, "mean_reward": 0.3,
               "spread_share": 0.99, "group_size": 8,
               "history": [{"knob": "k", "value": 2, "success_rate": 0.0, "mean_reward": 0.2, "spread_share": 0.4},
                           {"knob": "k", "value": 1, "success_rate": 0.02, "mean_reward": 0.3, "spread_share": 0.99,
                            "first_mistakes": {"wrong_value:item_ids": 50, "no_action": 10}, "failed": 63}]}
    reason = not_trained_because(partial, 8)  # rewards that vary, and no success: not trained any more
    assert reason.startswith("not trainable with this agent: its full-success rate is outside [0.1, 0.6] at every "
                             "k value tried"), reason
    assert "2: success 0.00, mean reward 0.20, spread 0.40; 1: success 0.02, mean reward 0.30, spread 0.99" in reason
    assert "first mistakes at k=1: wrong_value:item_ids 50, no_action 10 (of 63 failed)" in reason
    # One value in the band is enough (the search keeps it); the band's edges count as in it.
    edge = {**partial, "history": [*partial["history"], {"knob": "k", "value": 0, "success_rate": 0.1}]}
    assert not_trained_because(edge, 8) is None
    assert not_trained_because({**env, "status": "out_of_range", "success_rate": 0.8}, 8).startswith("not trainable")
    assert not_trained_because({**env, "band": [0.0, 0.9], "success_rate": 0.8}, 8) is None  # the record's band
    assert not_trained_because({"status": "invalid", "detail": "probe x scores"}, 8) == "probe x scores"
    assert not_trained_because({"status": "no_game", "detail": "no registered game"}, 8) == "no registered game"
    assert not_trained_because({"status": "no_knob", "value": None}, 8) is None
    assert not_trained_because(partial, 8, forced=True) is None  # loop.capabilities: trained anyway
    two_knobs = {**partial, "knob": "b", "history": [{"knob": "a", "value": 2, "success_rate": 0.0},
                                                     {"knob": "b", "value": 5, "success_rate": 0.01}]}
    assert "every a / b value tried" in not_trained_because(two_knobs, 8)
    assert "a=2: success 0.00" in not_trained_because(two_knobs, 8)
    assert not_trained_because({"status": "invalid", "detail": "bad"}, 8, forced=True) == "bad"


@pytest.fixture
def partial_reward_game(monkeypatch):
    """A registered capability game (the toy vault) whose calibration rollouts a test scripts; its validation
    is taken as passed (validation is not what these tests look at)."""
    import toy_games as toy

    import pipeline.validate_game

    toy.register_temporarily(monkeypatch, toy.make_spec(name="capability_toy_partial"))
    monkeypatch.setattr(pipeline.validate_game, "validate",
                        lambda spec, **kw: {"passed": True, "failures": [], "seconds": 0.0})

    def script(rewards_of):
        def collector(model, tokenizer, base_overrides, n_tasks, n_samples, **kw):
            def collect(spec, overrides):
                return [{"task_id": str(t), "sample_idx": i, "reward_info": {"reward": r}}
                        for t in range(n_tasks) for i, r in enumerate(rewards_of(overrides)[:n_samples])]
            return collect

        monkeypatch.setattr("demo.loop.model_collector", collector)

    return script


def test_calibration_records_mean_reward_and_spread_and_skips_a_game_with_partial_credit_alone(partial_reward_game):
    import dataclasses

    from demo.config import LoopSettings
    from demo.loop import calibrate_capability
    from demo.trainable import not_trained_because

    settings = dataclasses.replace(LoopSettings(), calibration_tasks=6, calibration_samples=2, group_size=8)
    partial_reward_game(lambda overrides: [0.0, 0.6])  # no success at any knob value, rewards that differ
    result = calibrate_capability("toy_partial", None, None, {}, settings)
    assert result["status"] == "out_of_range" and result["group_size"] == 8 and result["band"] == [0.1, 0.6]
    assert result["history"] and all(set(h) == {"knob", "value", "success_rate", "mean_reward", "spread_share"}
                                      for h in result["history"])
    assert all(h["success_rate"] == 0.0 and h["mean_reward"] == pytest.approx(0.3)
               and h["spread_share"] == pytest.approx(1 - 2 * 0.5 ** 8) for h in result["history"])
    # Partial credit that varies, never a win: not trained (it was before issue 41).
    reason = not_trained_because(result, settings.group_size)
    assert reason.startswith("not trainable with this agent") and "mean reward 0.30, spread 0.99" in reason, reason
    json.dumps(result)  # the Step 2 artifact is JSON

    partial_reward_game(lambda overrides: [1.0, 0.0])  # a win in half the episodes: in the band, trained
    won = calibrate_capability("toy_partial", None, None, {}, settings)
    assert won["status"] == "in_band" and not_trained_because(won, settings.group_size) is None


def test_a_game_out_of_the_band_gets_its_first_mistakes_counted_over_30_failed_episodes(partial_reward_game,
                                                                                         monkeypatch):
    """Issue 41 point 3: a game the base agent wins too often to train is reported with its first mistakes counted
    over >= 30 failed episodes: the kept probe's failures, then rounds of fresh tasks (seeds after calibration's)
    at the settings kept, until 30 failed; capped, with the shortfall said, for a game it nearly always wins."""
    import dataclasses

    from demo.config import LoopSettings
    from demo.loop import CENSUS_MAX_ROUNDS, calibrate_capability
    from demo.trainable import not_trained_because

    settings = dataclasses.replace(LoopSettings(), calibration_tasks=8, calibration_samples=2, group_size=8)
    calls = []

    def collector(model, tokenizer, base_overrides, n_tasks, n_samples, first_seed=10_000, **kw):
        def collect(spec, overrides):
            calls.append((first_seed, {**base_overrides, **overrides}))
            # 1 episode in 4 fails (success 0.75: above the band at every value), its first mistake by task seed
            return [{"task_id": str(first_seed + t), "sample_idx": i,
                     "reward_info": {"reward": 0.0 if (t * n_samples + i) % 4 == 0 else 1.0,
                                     "first_mistake": "wrong_value:item_ids" if t % 2 else "no_action"}}
                    for t in range(n_tasks) for i in range(n_samples)]
        return collect

    monkeypatch.setattr("demo.loop.model_collector", collector)
    result = calibrate_capability("toy_partial", None, None, {"n_items": 11}, settings)
    census = result["mistake_census"]
    # 16 episodes a round, 4 failed each: the kept probe's 4, then 7 rounds would reach 32; the cap stops it first.
    assert census["failed"] < 30 and census["rounds"] == CENSUS_MAX_ROUNDS
    assert census["episodes"] == 16 * (1 + CENSUS_MAX_ROUNDS) and census["failed"] == 4 * (1 + CENSUS_MAX_ROUNDS)
    assert sum(census["first_mistakes"].values()) == census["failed"]
    census_calls = calls[len(result["history"]):]
    assert [seed for seed, _ in census_calls] == [10_000 + 8 * r for r in range(1, CENSUS_MAX_ROUNDS + 1)]
    assert all(overrides == result["game_overrides"] for _, overrides in census_calls)  # at the settings kept
    reason = not_trained_because(result, settings.group_size)
    assert f"(of {census['failed']} failed in {census['episodes']} episodes, success 0.75)" in reason, reason
    assert "fewer than the 30 failed episodes" in reason

    calls.clear()
    enough = dataclasses.replace(settings, calibration_tasks=40)  # 20 failed a round: the probe's and one more
    result = calibrate_capability("toy_partial", None, None, {}, enough)
    assert result["mistake_census"]["failed"] == 40 and result["mistake_census"]["rounds"] == 1
    assert "fewer than" not in not_trained_because(result, settings.group_size)
    forced = calibrate_capability("toy_partial", None, None, {}, enough, census=False)
    assert "mistake_census" not in forced


def test_step2_validates_the_game_with_the_overrides_it_calibrates(partial_reward_game, monkeypatch):
    """The game is validated as it will be trained (the evaluation's surface), not at its own defaults."""
    import dataclasses

    import pipeline.validate_game
    from demo.config import LoopSettings
    from demo.loop import calibrate_capability

    validated = []
    monkeypatch.setattr(pipeline.validate_game, "validate", lambda spec, **kw: (
        validated.append(spec.make_env()) or {"passed": True, "failures": [], "seconds": 0.0}))
    partial_reward_game(lambda overrides: [0.0, 0.6])
    settings = dataclasses.replace(LoopSettings(), calibration_tasks=2, calibration_samples=2, group_size=8)
    calibrate_capability("toy_partial", None, None, {"n_items": 11}, settings)
    assert [game.config.n_items for game in validated] == [11]


def test_step2_report_and_progress_lines_show_each_values_figures():
    from demo.config import DemoConfig
    from demo.report import _environment_tables, environment_lines

    env = {"game": "capability_x", "validated": True, "status": "out_of_range", "knob": "k", "value": 1,
           "success_rate": 0.0, "mean_reward": 0.3, "spread_share": 0.99, "group_size": 8, "settings": {"k": 1},
           "history": [{"knob": "k", "value": 2, "success_rate": 0.0, "mean_reward": 0.1, "spread_share": 0.41},
                       {"knob": "k", "value": 1, "success_rate": 0.0, "mean_reward": 0.3, "spread_share": 0.99}]}
    lines = environment_lines("x", env, None)
    assert lines == ["  x: out_of_range (k=1: success 0.00, mean reward 0.30, spread 0.99 of groups of 8)",
                     "    probe k=2: success 0.00, mean reward 0.10, spread 0.41",
                     "    probe k=1: success 0.00, mean reward 0.30, spread 0.99"]
    text = "\n".join(_environment_tables({"x": env}, DemoConfig(), forced=False))
    assert "| x | capability_x | True | k=1 | 0.00 | 0.30 | 0.99 | out_of_range | no: not trainable with this agent" in text, text
    assert "| x | k=2 | 0.00 | 0.10 | 0.41 | - | - |" in text
    classes = {**env, "history": [{**env["history"][1], "class_shares": {"act": 0.5, "refuse": 0.5},
                                   "success_by_class": {"act": 0.25, "refuse": 0.0},
                                   "first_mistakes": {"write_where_plan_refuses": 30, "no_action": 10}, "failed": 40}]}
    text = "\n".join(_environment_tables({"x": classes}, DemoConfig(), forced=False))
    assert "| act 0.50 (0.25), refuse 0.50 (0.00) | write_where_plan_refuses 30, no_action 10 (of 40 failed) |" in text
    assert "first mistakes at k=1: write_where_plan_refuses 30, no_action 10 (of 40 failed)" in text
    old = {"game": "capability_y", "validated": True, "status": "in_band", "knob": "k", "value": 1,
           "success_rate": 0.3, "history": [{"value": 1, "success_rate": 0.3}]}  # written before the spread
    old_text = "\n".join(_environment_tables({"y": old}, DemoConfig(), forced=False))
    assert "| y | capability_y | True | k=1 | 0.30 | - | - | in_band | yes |" in old_text
    assert "| y | k=1 | 0.30 | - | - | - | - |" in old_text


def test_evaluate_max_steps_limits_the_episodes_the_demo_plays_but_not_the_demonstrations(tmp_path):
    import dataclasses

    from benchmarks.storefront.config import StorefrontConfig
    from benchmarks.storefront.game import StorefrontGame
    from game_registry import parse_hermes_action
    from demo.run import Demo
    from demo.config import load_demo_config

    config = load_demo_config(REPO / "configs/demo.yaml")
    demo = Demo(config, tmp_path, fresh=False, profile="default")
    played = demo.storefront_fields()
    assert played["max_steps"] == config.evaluate.max_steps < demo.storefront.max_steps
    unlimited = dataclasses.replace(config, evaluate=dataclasses.replace(config.evaluate, max_steps=None))
    assert Demo(unlimited, tmp_path, False, "default").storefront_fields()["max_steps"] == demo.storefront.max_steps

    game = StorefrontGame(StorefrontConfig(**played))  # an agent that looks up a missing order forever
    game.reset(7)
    while not game.done:
        game.step(parse_hermes_action('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
                                      '</tool_call>'))
    turns = sum(m["role"] == "assistant" for m in game.get_messages())
    assert turns == config.evaluate.max_steps and game.get_summary()["termination_reason"] == "max_steps"


def test_training_curves_end_at_the_episodes_each_run_used():
    from demo.report_plots import curve_episodes

    metrics = [{"iteration": i, "success_rate": 0.1 * i} for i in range(1, 9)]  # as train.grpo logs them
    assert curve_episodes(metrics, 64) == [64 * i for i in range(1, 9)]  # 8 iterations x 64 = 512, not 576


def test_own_game_report_puts_each_adapter_beside_the_base_agent_on_its_game(tmp_path):
    from benchmarks.results import write_results
    from demo.run import summarize_runs
    from demo.config import DemoConfig
    from demo.report import _own_game_section

    def runs(greedy: float, sampled: float, reward: float | None) -> dict:
        out = {}
        for mode, value in (("greedy", greedy), ("sampled", sampled)):
            out[f"7000/{mode}"] = {"pass_hat_k": {"all": {"n_tasks": 40, "1": value}}, "path": f"{mode}.json"}
            if reward is not None:
                out[f"7000/{mode}"]["mean_reward"] = reward
        return out

    # a run recorded before mean_reward existed: the report reads it from the results files
    for mode, rewards in (("greedy", [0.0, 0.25]), ("sampled", [0.5, 0.0, 0.0, 0.0])):
        write_results(tmp_path / f"{mode}.json", [{"id": f"t{i}", "task_id": f"t{i}", "messages": [],
                                                   "reward_info": {"reward": r}} for i, r in enumerate(rewards)],
                      None, {})
    records = {"own_game": {"figures": {
        "precondition_verification": {"game": "capability_precondition_verification",
                                      "game_overrides": {"short_ids": True, "eligibility_claim_rate": 0.5},
                                      "base": runs(0.225, 0.2875, None), "lora": runs(0.275, 0.3, 0.175)}}}}
    results: dict = {}
    text = "\n".join(_own_game_section(tmp_path, records, DemoConfig(), results, summarize_runs))
    assert ("| precondition_verification | short_ids=True, eligibility_claim_rate=0.5 | 0.225 → 0.275 | 0.287 → 0.300 "
            "| 0.125 → 0.175 | 0.125 → 0.175 |") in text, text
    assert results["own_game"]["precondition_verification"]["lora"] == {"greedy": 0.275, "sampled": 0.3}
    assert results["own_game"]["precondition_verification"]["mean_reward"]["base"] == {"greedy": 0.125,
                                                                                      "sampled": 0.125}
    assert _own_game_section(tmp_path, {}, DemoConfig(), {}, summarize_runs) == []  # a run without the step
