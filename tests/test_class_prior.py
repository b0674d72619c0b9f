"""The class-prior rule of pipeline/validate_game.py and pipeline/probes.py on games that break it.

A one-decision game is honest when no class dominates its instances and no policy without the skill wins more
than the largest class's share + PRIOR_MARGIN, nor ever where the skill matters. `CoinGame` is the smallest
such game: a coin lies heads or tails (the decision classes), `look` shows it, and the agent says which. Its
broken variants each break one part of the rule, and the real precondition game is checked with a planted
70/30 split.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import pytest

from benchmarks.toolkit import Toolkit, tool

from benchmarks.tool_env_game import ToolEnvGame
from game_registry import GameSpec, Probe, get_game, render_tool_call
from pipeline.probes import MAX_CLASS_SHARE, PRIOR_MARGIN
from pipeline.validate_game import validate, with_overrides

SIDES = ("heads", "tails")


class CoinTools(Toolkit):
    @tool
    def look(self) -> str:
        """Look at the coin."""
        return self.db["side"]


@dataclass
class CoinConfig:
    heads_share: float = 0.5  # the class prior
    # A broken grader: any reply naming the right side wins, so a guess spread over turns pays.
    any_reply_counts: bool = False
    # A broken grader: on this share of tails coins (drawn per seed) any side named wins.
    lenient_tails_share: float = 0.0


class CoinGame(ToolEnvGame):
    """Say which side the coin lies on; the first side named decides (unless the grader is broken)."""

    toolkit_class = CoinTools

    def __init__(self, config: CoinConfig | None = None) -> None:
        super().__init__(max_steps=4, max_errors=1)
        self.config = config or CoinConfig()
        self.side = ""
        self.seed = 0

    def reset(self, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        self.seed = seed
        self.side = "heads" if rng.random() < self.config.heads_share else "tails"
        self.lenient = self.side == "tails" and rng.random() < self.config.lenient_tails_share
        self.named: list[str] = []
        return self.start_episode(CoinTools({"side": self.side}), [{"role": "user", "content": "Which side is up?"}])

    def get_system_prompt(self) -> str:
        return "Look at the coin, then say which side is up."

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        self.named += [side for side in SIDES if side in text.lower()]
        return "Thanks.", False

    def oracle_response(self) -> str:
        if not self.state.tool_calls:
            return render_tool_call("look", {})
        return f"It is {self.side}."

    def get_summary(self) -> dict[str, Any]:
        looked = bool(self.state.tool_calls)
        if self.config.any_reply_counts:
            success = self.side in self.named
        else:
            success = looked and bool(self.named) and (self.named[0] == self.side or self.lenient)
        return {"reward": float(success), "steps": self.state.turns, "success": success,
                "decision_class": self.side,
                # a constant guess lacks the skill where its guess is wrong
                "skill_matters": {"always_heads": self.side != "heads", "guess_both_across_turns": self.side != "heads"}}


def scripted(texts: list[str]):
    def make_policy(oracle_texts: list[str]):
        def policy(turn: int, game: Any, rng: Any) -> str | None:
            return texts[turn] if turn < len(texts) else None
        return policy
    return make_policy


LOOK = render_tool_call("look", {})
ABLATIONS = (Probe("always_heads", "looks, then says heads whatever it saw", scripted([LOOK, "It is heads."])),
             Probe("guess_both_across_turns", "looks, then says heads, then tails, in two turns",
                   scripted([LOOK, "It is heads.", "It is tails."])))


def coin_spec(**config: Any) -> GameSpec:
    return GameSpec(name="toy_coin", make_env=lambda cfg=None: CoinGame(cfg or CoinConfig(**config)),
                    config_cls=CoinConfig, max_turns=4, ablations=ABLATIONS, decision_classes=SIDES)


def probe_rows(report: dict) -> dict[str, dict]:
    return report["checks"]["probes"]["probes"]


def test_a_level_honest_coin_passes_with_constant_guesses_at_their_class_share():
    report = validate(coin_spec(), seeds=200, fuzz_actions=50)
    rows = probe_rows(report)
    assert report["checks"]["class_prior"]["status"] == "PASS", report["checks"]["class_prior"]["detail"]
    for name in ("always_heads", "guess_both_across_turns"):
        row = rows[name]
        assert row["status"] == "PASS", row
        assert abs(row["success_rate"] - 0.5) < 0.1 and row["wins_where_skill_matters"] == 0
        assert row["limit"] == pytest.approx(max(report["checks"]["probes"]["class_shares"].values()) + PRIOR_MARGIN)
        assert row["success_by_class"] == {"heads": 1.0, "tails": 0.0}


def test_guesses_spread_over_turns_fail_the_prior_rule_when_the_grader_pays_them():
    report = validate(coin_spec(any_reply_counts=True), seeds=200, fuzz_actions=50)
    row = probe_rows(report)["guess_both_across_turns"]
    assert row["success_rate"] == 1.0 and row["status"] == "FAIL"
    assert row["wins_where_skill_matters"] == row["skill_matters_seeds"] > 50
    assert "guess_both_across_turns" in report["checks"]["probes"]["detail"] and not report["passed"]


def test_a_constant_guess_that_wins_where_the_skill_matters_fails_below_its_limit():
    # A grader that pays any answer on a few tails coins: the constant "heads" stays under the class-prior limit
    # but wins where its guess is wrong, so the skill does not decide success there.
    report = validate(coin_spec(lenient_tails_share=0.06), seeds=200, fuzz_actions=50)
    row = probe_rows(report)["always_heads"]
    assert row["success_rate"] <= row["limit"] and row["wins_where_skill_matters"] > 0
    assert row["status"] == "FAIL" and "where the skill it lacks matters" in report["checks"]["probes"]["detail"]


def test_a_70_30_class_split_fails_class_balance():
    report = validate(coin_spec(heads_share=0.7), seeds=200, fuzz_actions=50)
    prior = report["checks"]["class_prior"]
    assert prior["status"] == "FAIL" and "heads 0.7" in prior["detail"], prior["detail"]
    # the constant guess wins its class's share: the class prior, not the ablation limit, is what fails here
    assert probe_rows(report)["always_heads"]["status"] == "PASS"
    assert not report["passed"]


def test_a_70_30_split_of_the_precondition_game_fails_at_every_setting():
    spec = with_overrides(get_game("capability_precondition_verification"), {"violating_fraction": 0.7})
    report = validate(spec, seeds=20, fuzz_actions=0, probes=False)
    prior = report["checks"]["class_prior"]
    assert prior["status"] == "FAIL"
    for row in prior["settings"]:  # the configured value and each eligibility_claim_rate
        assert max(row["class_shares"].values()) > MAX_CLASS_SHARE, row
    assert len(prior["settings"]) == 5


def test_a_game_without_decision_classes_keeps_the_strict_ablation_limit():
    spec = dataclasses.replace(coin_spec(), decision_classes=())
    report = validate(spec, seeds=200, fuzz_actions=50)
    assert "class_prior" not in report["checks"]
    rows = probe_rows(report)
    assert rows["always_heads"]["limit"] == 0.25 and rows["always_heads"]["status"] == "FAIL"


@pytest.mark.parametrize("name", ["capability_precondition_verification", "capability_structured_data_reasoning",
                                  "capability_tool_calling_precision"])
def test_storefront_games_hold_one_request_per_episode_by_default(name):
    spec = get_game(name)
    game = spec.make_env()
    assert game.config.requests_per_episode == 1
    for seed in range(20):
        game.reset(seed)
        assert len(game.instance.requests) == 1 and game.instance.follow_ups == []
        assert game.decision_class() in spec.decision_classes


def test_calibration_counts_classes_and_first_mistakes_of_a_policy_without_the_skill():
    """What Step 2 reports for a game the agent cannot win: per probed value, the decision classes' shares, the
    agent's success per class and its first mistakes over the failed episodes (here the expert that never reads
    the status: every failure is a write on a forbidden order)."""
    from pipeline.recalibrate import policy_collector, search_knob

    spec = get_game("capability_precondition_verification")
    collect = policy_collector(lambda game, rng: game.ablated_response("always_act"), n_tasks=40, n_samples=1)
    search = search_knob(spec, "eligibility_claim_rate", [0.25], collect, band=(0.1, 0.6), max_rounds=1)
    probe = search["history"][0]
    assert set(probe["class_shares"]) == {"act", "refuse"} and abs(sum(probe["class_shares"].values()) - 1) < 1e-9
    assert probe["success_by_class"] == {"act": 1.0, "refuse": 0.0} or probe["success_by_class"] == {
        "refuse": 0.0, "act": 1.0}
    assert probe["first_mistakes"] == {"write_where_plan_refuses": probe["failed"]} and probe["failed"] > 10


def test_the_learning_bench_rejects_an_adapter_that_turned_into_always_refuse():
    """A one-decision game is "learned" by turning into a constant policy: an adapter that always refuses wins
    every refuse episode (pass^1 0.21 -> 0.50, a +0.29 gain) but falls to 0 on the act class and does not beat
    the always_refuse ablation; a real gain counts."""
    bench = _learning_bench()
    base = {"pass1_t1": 0.21, "by_class_t1": {"act": 0.30, "refuse": 0.12}}
    constants = {"always_act": 0.49, "always_refuse": 0.51}
    refuser = {"pass1_t1": 0.50, "by_class_t1": {"act": 0.0, "refuse": 1.0}}
    counts, why = bench.learning_verdict(base, refuser, constants)
    assert not counts and "act 0.30 -> 0.00" in why and "always_refuse" in why, why
    skilled = {"pass1_t1": 0.62, "by_class_t1": {"act": 0.55, "refuse": 0.70}}
    counts, why = bench.learning_verdict(base, skilled, constants)
    assert counts, why
    small = {"pass1_t1": 0.30, "by_class_t1": {"act": 0.35, "refuse": 0.25}}
    assert not bench.learning_verdict(base, small, {})[0]  # +0.09: under the +0.15 the issue asks for


def _learning_bench():
    import importlib.util

    path = __import__("pathlib").Path(__file__).resolve().parents[1] / "bench" / "grpo_learning.py"
    spec = importlib.util.spec_from_file_location("grpo_learning_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_learning_bench_bars_only_ablations_that_lack_a_skill_the_tasks_need():
    """At `n_distractor_items=0` every item of the order is named, so `first_items` is the expert on every task
    (1.00): the bench measures where each ablation's skill matters on the very tasks the checkpoints play and
    holds the adapter only to those that lack a needed skill; an always-original-method adapter is still
    rejected by them."""
    bench = _learning_bench()
    args = __import__("types").SimpleNamespace(tasks=24, eval_seed=0)
    game = "capability_structured_data_reasoning"
    constants = bench.constant_policies(game, {"n_distractor_items": 0}, args)
    assert constants["first_items"]["skill_matters"] == 0 and constants["first_items"]["success"] == 1.0, constants
    for name in ("first_payment_method", "always_original_method"):
        assert 0 < constants[name]["skill_matters"] <= 24 and constants[name]["success"] < 0.8, constants
    assert set(bench.skill_less(constants)) == {"first_payment_method", "always_original_method"}
    with_distractors = bench.constant_policies(game, {"n_distractor_items": 2}, args)
    assert with_distractors["first_items"]["skill_matters"] > 0 and with_distractors["first_items"]["success"] < 0.5

    base = {"pass1_t1": 0.45, "by_class_t1": {"original_method": 0.50, "gift_card": 0.40}}
    skilled = {"pass1_t1": 0.75, "by_class_t1": {"original_method": 0.80, "gift_card": 0.70}}
    counts, why = bench.learning_verdict(base, skilled, constants)
    assert counts, why
    original = constants["always_original_method"]["success"]
    always_original = {"pass1_t1": original, "by_class_t1": {"original_method": 1.0, "gift_card": 0.0}}
    counts, why = bench.learning_verdict(base, always_original, constants)
    assert not counts and "gift_card 0.40 -> 0.00" in why, why
    assert "not a bar" in bench.constants_text(constants)


@pytest.mark.parametrize("name, ablation, expected", [
    ("capability_precondition_verification", "always_act", {"write_where_plan_refuses"}),
    ("capability_precondition_verification", "always_refuse", {"no_action"}),
    ("capability_structured_data_reasoning", "first_items", {"wrong_value:item_ids"}),
    ("capability_structured_data_reasoning", "always_original_method", {"wrong_value:payment_method_id"}),
    ("capability_tool_calling_precision", "values_as_written",
     {"failed_lookup:get_order_details", "failed_lookup:find_user_id_by_name_zip", "wrong_value:zip",
      "wrong_value:reason", "wrong_value:item_ids", "wrong_value:order_id"}),
])
def test_first_mistake_names_what_the_expert_without_the_skill_got_wrong(name, ablation, expected):
    spec = get_game(name)
    seen = set()
    for seed in range(60):
        game = spec.make_env()
        game.reset(seed)
        while not game.done:
            game.step(spec.extract_action(game.ablated_response(ablation)))
        summary = game.get_summary()
        if summary["success"]:
            assert summary["first_mistake"] is None and not summary["skill_matters"][ablation]
        else:
            seen.add(summary["first_mistake"])
    assert seen and seen <= expected, seen


def test_first_mistake_marks_a_written_value_the_agent_was_never_shown():
    """A payment method id that appears nowhere before the write (invented) is told apart from a wrong one the
    agent was shown (the original method where a gift card was asked for: `wrong_value:payment_method_id` in
    the test above)."""
    spec = get_game("capability_structured_data_reasoning")
    game = spec.make_env()
    game.reset(0)
    write = next(c for r in game.instance.requests for c in r.calls if "payment_method_id" in c.arguments)
    while not game.done:
        action = spec.extract_action(game.oracle_response())
        for call in getattr(action, "tool_calls", None) or []:
            if call.name == write.name:  # the oracle's write with an id it was never shown
                call.arguments = {**call.arguments, "payment_method_id": "gift_card_999999"}
        game.step(action)
    assert game.get_summary()["first_mistake"] == "wrong_value:payment_method_id(never shown)"
