"""pipeline/recalibrate.py: file mode (CLI) on hand-made rollouts, and search_knob on a toy game."""
from __future__ import annotations

import json

import pytest

import toy_games as toy
from common.validation import InputError
from benchmarks.results import make_simulation
from game_registry import DifficultyKnob
from pipeline.recalibrate import decide, main, parse_knob_value, policy_collector, search_knob, search_knobs


def rollouts(tmp_path, name: str, successes: int, total: int = 10, samples: int = 2):
    """A τ²-bench results file with `successes` of `total` samples succeeding (groups of `samples`)."""
    sims = [
        {"id": f"{name}-{i}", "task_id": i // samples, "sample_idx": i % samples,
         "reward_info": {"reward": 1.0 if i < successes else 0.0}}
        for i in range(total)
    ]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return str(path)


@pytest.fixture
def game(monkeypatch):
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_recal"))
    return "toy_vault_recal"


def run(game, tmp_path, *pairs, extra=("--band", "0.2,0.6")):
    # These file-mode cases were written for a [0.2, 0.6] band (the default is now [0.1, 0.6]).
    out = tmp_path / "decision.json"
    code = main(["--game", game, "--knob", "n_keys", "--rollouts", *pairs, "--json-output", str(out), *extra])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_bracketed_proposes_the_bisection_point(game, tmp_path):
    # n_keys=1 succeeds 9/10 (too easy), n_keys=8 1/10 (too hard): harder as n_keys grows; try (1+8)//2 = 4.
    code, d = run(game, tmp_path, f"1={rollouts(tmp_path, 'k1', 9)}", f"8={rollouts(tmp_path, 'k8', 1)}")
    assert code == 1
    assert (d["status"], d["harder"], d["next_value"], d["value"]) == ("bracketed", "increase", 4, None)
    assert [m["success_rate"] for m in d["measurements"]] == [0.9, 0.1]


def test_in_band_value_closest_to_centre(game, tmp_path, capsys):
    # 3 -> 0.55 and 4 -> 0.4 are both in [0.2, 0.6]; 4 is at the centre 0.4.
    code, d = run(
        game, tmp_path, f"1={rollouts(tmp_path, 'k1', 9)}", f"3={rollouts(tmp_path, 'k3', 11, total=20)}",
        f"4={rollouts(tmp_path, 'k4', 4)}", f"8={rollouts(tmp_path, 'k8', 1)}",
    )
    assert code == 0
    assert (d["status"], d["value"]) == ("in_band", 4)
    assert "IN_BAND: use 4" in capsys.readouterr().out


def test_all_too_easy_steps_out_in_the_harder_direction(game, tmp_path):
    code, d = run(game, tmp_path, f"1={rollouts(tmp_path, 'k1', 10)}", f"2={rollouts(tmp_path, 'k2', 8)}")
    assert code == 1
    assert (d["status"], d["move"], d["harder"], d["next_value"]) == ("too_easy", "harder", "increase", 3)


def test_single_measurement_moves_the_declared_way(game, tmp_path):
    path = rollouts(tmp_path, "k2", 0)
    code, d = run(game, tmp_path, f"2={path}")
    # Too hard; the toy declares n_keys harder as it increases, so easier = fewer keys. Stepping 2 down from 2
    # gives 0, which VaultConfig rejects (n_keys >= 1): halve to 1.
    assert (code, d["status"], d["move"], d["next_value"], d["harder"]) == (1, "too_hard", "easier", 1, "increase")
    code, d = run(game, tmp_path, f"1={path}")
    assert (d["status"], d["next_value"]) == ("too_hard", None) and "exhausted" in d["message"]


def test_adjacent_integers_leave_nothing_to_bisect():
    d = decide([{"value": 3, "success_rate": 0.8}, {"value": 4, "success_rate": 0.1}], (0.2, 0.6))
    assert (d["status"], d["next_value"]) == ("bracketed", None)
    assert "make the knob finer" in d["message"]
    floats = decide([{"value": 0.5, "success_rate": 0.8}, {"value": 1.0, "success_rate": 0.1}], (0.2, 0.6))
    assert floats["next_value"] == 0.75


def test_non_monotone_measurements_warn():
    d = decide([{"value": v, "success_rate": r} for v, r in [(1, 0.9), (2, 0.1), (3, 0.8)]], (0.2, 0.6))
    assert any("not monotone" in w for w in d["warnings"])


def test_bad_input_exits_2_and_writes_nothing(game, tmp_path, capsys):
    good = rollouts(tmp_path, "ok", 5)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    cases = [
        (["--game", game, "--knob", "no_such_knob", "--rollouts", f"1={good}"], "not a field of VaultConfig"),
        (["--game", game, "--knob", "n_keys", "--rollouts", f"1.5={good}"], "is not of type int"),
        (["--game", game, "--knob", "n_keys", "--rollouts", f"0={good}"], "VaultConfig(n_keys=0) is rejected"),
        (["--game", game, "--knob", "n_keys", "--rollouts", good], "expects VALUE=FILE"),
        (["--game", game, "--knob", "n_keys", "--rollouts", f"2={good}", f"2={good}"], "given twice"),
        (["--game", game, "--knob", "n_keys", "--rollouts", f"2={broken}"], "broken JSON"),
        (["--game", "no_such_game", "--knob", "n_keys", "--rollouts", f"2={good}"], "unknown game"),
    ]
    out = tmp_path / "decision.json"
    for argv, message in cases:
        assert main([*argv, "--json-output", str(out)]) == 2, argv
        assert message in capsys.readouterr().err, argv
        assert not out.exists()
    with pytest.raises(SystemExit):
        main(["--game", game, "--knob", "n_keys", "--rollouts", f"2={good}", "--band", "0.7,0.2"])


def test_parse_knob_value_types():
    spec = toy.make_spec()
    assert parse_knob_value(spec, "n_keys", "3") == 3
    with pytest.raises(InputError, match="not of type int"):
        parse_knob_value(spec, "n_keys", "three")


# -- search_knob with a simulated model ----------------------------------------------------------------
# The "model" plays the oracle move with probability 0.8 per turn, so it wins an n_keys episode (n_keys
# lookups + one submit) with probability about 0.8 ** (n_keys + 1): 0.64, 0.51, 0.41, 0.33, 0.26, 0.21, ...
COLLECT = policy_collector(toy.skilled_policy(0.8), n_tasks=20, n_samples=4)


def test_search_finds_a_value_in_band_in_the_declared_direction():
    spec = toy.make_spec()
    result = search_knob(spec, "n_keys", [8, 1, 2, 3, 4, 5, 6, 7], COLLECT, band=(0.2, 0.3), max_rounds=5)
    assert result["status"] == "in_band"
    assert 0.2 <= result["success_rate"] <= 0.3
    assert result["harder"] == "increase"
    probes = [m["value"] for m in result["history"]]
    assert probes[0] == 4  # the direction is declared: bisection starts in the middle
    assert len(probes) <= 5 and len(set(probes)) == len(probes)


def test_search_with_known_direction_starts_in_the_middle():
    result = search_knob(toy.make_spec(), "n_keys", list(range(1, 9)), COLLECT, band=(0.2, 0.3), harder="increase")
    assert result["status"] == "in_band"
    assert result["history"][0]["value"] == 4


def test_search_reports_an_unreachable_band_and_round_limits():
    spec = toy.make_spec()
    easy = search_knob(spec, "n_keys", [1, 2, 3], COLLECT, band=(0.01, 0.05))
    assert easy["status"] == "out_of_range" and easy["rounds"] == 2
    limited = search_knob(spec, "n_keys", list(range(1, 9)), COLLECT, band=(0.2, 0.3), max_rounds=1)
    assert limited["status"] == "max_rounds" and limited["rounds"] == 1
    with pytest.raises(ValueError, match="n_keys"):
        search_knob(spec, "n_keys", [0, 1], COLLECT)  # VaultConfig rejects 0 before any rollout
    with pytest.raises(ValueError, match="not a field"):
        search_knob(spec, "difficulty", [1], COLLECT)


def test_collector_writes_tau2_simulations():
    sims = policy_collector(toy.skilled_policy(1.0), n_tasks=3, n_samples=2)(toy.make_spec(), {"n_keys": 2})
    assert len(sims) == 6
    assert {(s["task_id"], s["sample_idx"]) for s in sims} == {(t, i) for t in range(3) for i in range(2)}
    assert all(s["reward_info"]["reward"] == 1.0 for s in sims)  # the oracle always wins
    assert sims[0]["messages"][0]["role"] == "system"


def test_collector_plays_exactly_the_task_seeds_given():
    # The learning bench plays constant policies on the tasks an evaluation played (seeds drawn by hash).
    sims = policy_collector(toy.skilled_policy(1.0), n_samples=1, task_seeds=[907, 12, 907])(toy.make_spec(), {})
    assert [s["task_id"] for s in sims] == [907, 12, 907]
    assert sims[0]["messages"] == sims[2]["messages"]
    with pytest.raises(ValueError, match="task_seeds is empty"):
        policy_collector(toy.skilled_policy(1.0), task_seeds=[])


def _collector_with_rates(rate_of):
    """A collector whose success rate is a set function of the knob settings: it tests the order in which
    knobs are searched, not a model. Records every call's settings in `.calls`."""

    def collect(spec, overrides):
        collect.calls.append(dict(overrides))
        wins = round(rate_of(overrides) * 20)
        return [make_simulation(task_id=str(i), messages=[], reward_info={"reward": float(i < wins)},
                                termination_reason="agent_stop") for i in range(20)]

    collect.calls = []
    return collect


TWO_KNOBS = (DifficultyKnob("n_keys", "increase", (1, 2, 3)), DifficultyKnob("n_items", "increase", (2, 4, 6, 8)))


def test_search_knobs_moves_the_next_knob_from_where_the_first_one_stopped():
    spec = toy.make_spec(difficulty_knobs=TWO_KNOBS)
    # Out of reach at every n_keys while the vault is large; one key in a small vault is in band.
    collect = _collector_with_rates(lambda o: 0.4 if o["n_keys"] == 1 and o.get("n_items", 8) <= 4 else 0.0)
    result = search_knobs(spec, collect, band=(0.2, 0.6))
    assert result["status"] == "in_band" and result["settings"] == {"n_keys": 1, "n_items": 4}
    assert result["knob"] == "n_items" and result["success_rate"] == 0.4
    first = [c for c in collect.calls if "n_items" not in c]
    assert [c["n_keys"] for c in first] == [2, 1]  # bisected from the middle to the easiest value
    assert all(c["n_keys"] == 1 for c in collect.calls[len(first):])  # the first knob stays at its easiest
    assert [(h["knob"], h["value"]) for h in result["history"]] == [("n_keys", 2), ("n_keys", 1), ("n_items", 4)]

    in_reach = _collector_with_rates(lambda o: 0.4 if o["n_keys"] == 1 else 0.0)
    stopped = search_knobs(spec, in_reach, band=(0.2, 0.6))
    assert stopped["settings"] == {"n_keys": 1} and all("n_items" not in c for c in in_reach.calls)

    never = search_knobs(spec, _collector_with_rates(lambda o: 0.0), band=(0.2, 0.6))
    assert never["status"] == "out_of_range" and never["settings"] == {"n_keys": 1, "n_items": 2}


def test_search_over_str_values_learns_the_direction_from_their_order():
    """str knobs keep the given order; two ends that straddle the band are not 'out of range'."""
    import dataclasses

    from game_registry import DifficultyKnob, GameSpec

    @dataclasses.dataclass
    class LevelConfig:
        level: str = "easy"

    rates = {"trivial": 0.95, "easy": 0.8, "medium": 0.4, "hard": 0.1, "brutal": 0.0}

    def collect(spec, overrides):  # 10 tasks x 2 samples; the first round(20 * rate) succeed
        n_wins = round(20 * rates[overrides["level"]])
        return [{"task_id": task, "sample_idx": sample, "reward_info": {"reward": float(2 * task + sample < n_wins)}}
                for task in range(10) for sample in range(2)]

    spec = GameSpec(name="levels", make_env=lambda config=None: None, config_cls=LevelConfig,
                    difficulty_knobs=(DifficultyKnob("level", "increase", tuple(rates)),))
    result = search_knob(spec, "level", list(rates), collect, band=(0.2, 0.6))
    assert result["status"] == "in_band" and result["value"] == "medium"
    assert result["harder"] == "increase"


def test_only_declared_difficulty_knobs_are_searched(tmp_path, monkeypatch):
    """A config field that is not a declared difficulty knob is refused (a class prior tuned to a band would
    only change the label mix), in file mode and in search mode; --harder must agree with the declaration."""
    spec = toy.make_spec(name="toy_vault_undeclared", difficulty_knobs=())
    toy.register_temporarily(monkeypatch, spec)
    good = tmp_path / "r.json"
    good.write_text(json.dumps({"simulations": [{"task_id": 0, "sample_idx": 0, "reward_info": {"reward": 1.0}}]}))
    assert main(["--game", spec.name, "--knob", "n_keys", "--rollouts", f"2={good}"]) == 2
    with pytest.raises(ValueError, match="not a declared difficulty knob"):
        search_knob(spec, "n_keys", [1, 2], COLLECT)
    declared = toy.make_spec(name="toy_vault_declared")
    toy.register_temporarily(monkeypatch, declared)
    assert main(["--game", declared.name, "--knob", "n_keys", "--rollouts", f"2={good}", "--harder", "decrease"]) == 2
    with pytest.raises(ValueError, match="contradicts"):
        search_knob(declared, "n_keys", [1, 2], COLLECT, harder="decrease")


def test_the_real_games_refuse_their_class_prior():
    from game_registry import get_game
    spec = get_game("capability_precondition_verification")
    with pytest.raises(ValueError, match="not a declared difficulty knob.*eligibility_claim_rate"):
        search_knob(spec, "violating_fraction", [0.2, 0.8], COLLECT)


# -- the figures beside the success rate: mean reward and the share of GRPO groups with reward spread ---------
def _collector_with_rewards(rewards_of):
    """A collector whose 10 tasks each score the rewards `rewards_of(overrides)` (one per sample)."""

    def collect(spec, overrides):
        return [{"task_id": task, "sample_idx": sample, "reward_info": {"reward": reward}}
                for task in range(10) for sample, reward in enumerate(rewards_of(overrides))]

    return collect


def test_search_history_carries_mean_reward_and_the_spread_share():
    """No success at any value, but every task scores 0 once and 0.6 once: the probes say so, at the GRPO
    group size asked for (a group of 8 drawn from a 50/50 task is constant with chance 2 / 2^8)."""
    spec = toy.make_spec(difficulty_knobs=TWO_KNOBS)
    collect = _collector_with_rewards(lambda o: [0.0, 0.6])
    result = search_knob(spec, "n_keys", [1, 2, 3], collect, band=(0.2, 0.6), group_size=8)
    assert result["status"] == "out_of_range" and result["group_size"] == 8
    for probe in result["history"]:
        assert probe["success_rate"] == 0.0
        assert probe["mean_reward"] == pytest.approx(0.3)
        assert probe["spread_share"] == pytest.approx(1 - 2 * 0.5 ** 8)
    assert (result["mean_reward"], result["spread_share"]) == (pytest.approx(0.3), pytest.approx(1 - 2 * 0.5 ** 8))
    both = search_knobs(spec, collect, band=(0.2, 0.6), group_size=4)
    assert both["group_size"] == 4 and {h["knob"] for h in both["history"]} == {"n_keys", "n_items"}
    assert all(h["spread_share"] == pytest.approx(1 - 2 * 0.5 ** 4) and h["mean_reward"] == pytest.approx(0.3)
               for h in both["history"])


def test_out_of_range_keeps_the_probe_with_spread_among_equally_far_ones():
    """Every probe fails every episode, but only n_keys=2 has partial rewards that differ: it is kept, not the
    latest probe (n_keys=1, all rewards equal), since GRPO could learn only there."""
    spec = toy.make_spec()
    collect = _collector_with_rewards(lambda o: [0.0, 0.6] if o["n_keys"] == 2 else [0.0, 0.0])
    result = search_knob(spec, "n_keys", [1, 2, 3], collect, band=(0.2, 0.6), group_size=8)
    assert [h["value"] for h in result["history"]] == [2, 1]
    assert result["status"] == "out_of_range" and result["value"] == 2 and result["spread_share"] > 0.9
    flat = search_knob(spec, "n_keys", [1, 2, 3], _collector_with_rewards(lambda o: [0.0, 0.0]), band=(0.2, 0.6))
    assert flat["value"] == 1  # all alike: the latest (the easiest value tried), as before


def partial_rollouts(tmp_path, name: str, rewards: list[float], tasks: int = 5):
    sims = [{"task_id": t, "sample_idx": i, "reward_info": {"reward": r}} for t in range(tasks)
            for i, r in enumerate(rewards)]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"simulations": sims}))
    return str(path)


def test_cli_prints_and_writes_mean_reward_and_spread(game, tmp_path, capsys):
    code, d = run(game, tmp_path, f"1={partial_rollouts(tmp_path, 'k1', [0.0, 0.6])}",
                  f"2={partial_rollouts(tmp_path, 'k2', [0.0, 0.0])}", extra=("--group-size", "8"))
    assert code == 1 and d["group_size"] == 8
    by_value = {m["value"]: m for m in d["measurements"]}
    assert by_value[1]["mean_reward"] == pytest.approx(0.3) and by_value[1]["spread_share"] == pytest.approx(0.9921875)
    assert by_value[2]["spread_share"] == 0.0
    out = capsys.readouterr().out
    assert "groups of 8" in out
    assert "n_keys=1          success_rate 0.000  mean_reward 0.300  spread 0.992" in out, out
    assert main(["--game", game, "--knob", "n_keys", "--rollouts", f"1={partial_rollouts(tmp_path, 'k', [0.0])}",
                 "--group-size", "1"]) == 2
    assert "--group-size must be >= 2" in capsys.readouterr().err


def mistaken_rollouts(tmp_path, name: str, successes: int, failed: int) -> str:
    """A results file whose failed episodes record their first mistake and decision class (as the games do)."""
    sims = [{"id": f"{name}-{i}", "task_id": i // 2, "sample_idx": i % 2,
             "reward_info": {"reward": 1.0 if i < successes else 0.0, "decision_class": ("act", "refuse")[i % 2],
                             "first_mistake": None if i < successes else ("no_action", "wrong_tool")[i % 3 == 0]}}
            for i in range(successes + failed)]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return str(path)


def test_cli_out_of_the_band_reports_first_mistakes_once_30_episodes_failed(game, tmp_path, capsys):
    """Issue 41 point 3: out of the band, the first mistakes at the value nearest it, and no verdict on what the
    agent lacks from fewer than 30 failed episodes (it asks for more rollouts there instead)."""
    code, d = run(game, tmp_path, f"1={mistaken_rollouts(tmp_path, 'few', 90, 10)}")
    out = capsys.readouterr().out
    assert code == 1 and d["not_in_band"]["failed"] == 10 and d["not_in_band"]["value"] == 1
    assert "classes act 0.50 (0.90), refuse 0.50 (0.90)" in out, out
    assert "first mistakes no_action" in out and "(of 10 failed)" in out
    assert "counted over 10 failed episodes, fewer than 30: collect more rollouts there" in out, out
    code, d = run(game, tmp_path, f"1={mistaken_rollouts(tmp_path, 'many', 160, 40)}",
                  f"2={mistaken_rollouts(tmp_path, 'more', 180, 20)}")
    out = capsys.readouterr().out
    mistakes = d["not_in_band"]["first_mistakes"]
    assert d["not_in_band"]["value"] == 1 and sum(mistakes.values()) == 40 and set(mistakes) == {"no_action", "wrong_tool"}
    assert "not trainable with this agent; its first mistakes at 1 (nearest the band): " in out, out
    code, d = run(game, tmp_path, f"1={rollouts(tmp_path, 'k', 4)}")  # in the band: no such report
    assert code == 0 and "not_in_band" not in d
