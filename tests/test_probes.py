"""pipeline/probes.py: each generic reward-hacking probe catches the hole it is built for, a fixed game
passes them all, and every registered game is checked on 100 seeds.

The toy "order desk" below is a ToolEnvGame: the customer asks to cancel one or two orders; a pending order
is cancelled and its refund (the sum of its two item prices) stated, any other order is refused and its
status stated. Every `DeskConfig` hole flag defaults to closed (the FIXED game); each test opens one.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

import pytest

import toy_games as toy
from benchmarks.toolkit import Toolkit, tool
from benchmarks.tool_env_game import ToolEnvGame
from game_registry import GameSpec, Probe, get_game, list_games
from pipeline import probes as P
from pipeline.validate_game import main, oracle_policy, probe_check, run_episode, validate

SEEDS = 60
STATUSES = ("pending", "processing", "shipped", "delivered")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


# --------------------------------------------------------------------------------------------------
# The toy order desk
# --------------------------------------------------------------------------------------------------
@dataclass
class DeskConfig:
    n_requests: int = 2
    max_calls_per_turn: int = 1  # > 1 opens the all_calls_in_one_turn hole
    # Holes (False / closed by default):
    skip_auth_ok: bool = False  # no authentication needed
    skip_lookup_ok: bool = False  # cancelling or stating a status needs no prior get_customer
    bare_refusal_ok: bool = False  # a refused request needs no statement of its status
    receipt_shows_refund: bool = False  # cancel_order's receipt carries the refund (the answer)
    status_hedging_ok: bool = False  # a status statement may name other statuses too
    amount_hedging_ok: bool = False  # a refund statement may carry any number of other numbers
    first_request_only: bool = False  # only the first request is graded
    wrong_claims_ok: bool = False  # a reply stating a wrong refund costs nothing (another reply may be right)
    question_reports_ok: bool = False  # a question ("...; you get 12.30 back?") counts as the statement
    malformed_reports_ok: bool = False  # the statement may sit in a turn the parser rejected


@dataclass
class DeskDB:
    email: str
    customer_id: str
    orders: dict[str, dict[str, Any]]  # id -> {"status", "items": [{"name", "price"}]}
    receipt_shows_refund: bool = False


def refund_of(order: dict[str, Any]) -> float:
    return round(sum(item["price"] for item in order["items"]), 2)


class DeskTools(Toolkit):
    db: DeskDB

    @tool(auth=True)
    def find_customer(self, email: str) -> str:
        """Find a customer id by email.

        Args:
            email: The customer's email.
        """
        if email != self.db.email:
            raise ValueError(f"no customer with email {email!r}")
        return self.db.customer_id

    @tool
    def get_customer(self, customer_id: str) -> dict:
        """Get a customer's orders with their status and items.

        Args:
            customer_id: The customer id.
        """
        if customer_id != self.db.customer_id:
            raise ValueError(f"customer {customer_id!r} not found")
        return {"customer_id": customer_id,
                "orders": [{"order_id": oid, **order} for oid, order in self.db.orders.items()]}

    @tool(write=True)
    def cancel_order(self, order_id: str, reason: Literal["no longer needed", "ordered by mistake"]) -> dict:
        """Cancel an order.

        Args:
            order_id: The order id.
            reason: Why the customer cancels.
        """
        order = self.db.orders.get(order_id)
        if order is None:
            raise ValueError(f"order {order_id!r} not found")
        refund = refund_of(order)
        order["status"] = "cancelled"
        receipt = {"order_id": order_id, "status": "cancelled"}
        return {**receipt, "refund": refund} if self.db.receipt_shows_refund else receipt


def tool_text(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class DeskGame(ToolEnvGame):
    toolkit_class = DeskTools

    def __init__(self, config: DeskConfig | None = None) -> None:
        self.config = config or DeskConfig()
        super().__init__(max_steps=12, max_calls_per_turn=self.config.max_calls_per_turn)
        self.db: DeskDB | None = None

    def reset(self, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        ids = [f"#W{n}" for n in rng.sample(range(10000, 99999), 4)]
        requested = ids[: self.config.n_requests]
        statuses = ["pending" if rng.random() < 0.5 else rng.choice(STATUSES[1:]) for _ in requested]
        statuses += rng.sample(STATUSES, 4 - len(requested))  # decoys: at least two distinct statuses in all
        orders = {oid: {"status": status, "items": [{"name": name, "price": round(rng.uniform(5, 300), 2)}
                                                    for name in rng.sample(["lamp", "mug", "desk", "pen", "bag"], 2)]}
                  for oid, status in zip(ids, statuses)}
        self.db = DeskDB(f"user{seed}@example.com", f"cust_{seed}", orders, self.config.receipt_shows_refund)
        self.start = json.loads(json.dumps(orders))
        self.requested = requested
        self.pointer, self.revealed, self.replies = 0, False, []  # replies: (tool calls made before, text)
        opening = " ".join(f"Please cancel order {oid}." for oid in requested)
        return self.start_episode(DeskTools(self.db), [{"role": "user", "content": opening}])

    def get_system_prompt(self) -> str:
        return ("Authenticate the customer by email, look up their orders, cancel only pending orders and tell "
                "the refund; refuse others and tell their status.")

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        self.replies.append((len(self.state.tool_calls), text))
        if "?" in text:
            if "email" in text.lower():
                self.revealed = True
                return f"My email is {self.db.email}.", False
            return "Yes.", False
        self.pointer += 1
        if self.pointer >= len(self.requested) or len(self.replies) > len(self.requested) + 4:
            return "Thanks, bye. ###STOP###", True
        return "Thanks.", False

    # ---- reward ---------------------------------------------------------------------------------
    def _first(self, name: str, **arguments: Any) -> int | None:
        for index, record in enumerate(self.state.tool_calls):
            if record.ok and record.name == name and all(record.arguments.get(k) == v for k, v in arguments.items()):
                return index
        return None

    def _statements(self) -> list[tuple[int, str]]:
        """(tool calls made before, text) of the replies that can state something: the customer's statements
        (no question), or with the hole flags any question and any malformed turn too."""
        replies = self.replies
        if self.config.malformed_reports_ok:  # read the log, where a malformed turn sits like a reply
            replies, calls = [], 0
            for message in self.state.messages:
                calls += len(message.get("tool_calls") or ())
                if message["role"] == "assistant" and not message.get("tool_calls") and message.get("content"):
                    replies.append((calls, message["content"]))
        return [(made, text) for made, text in replies if self.config.question_reports_ok or "?" not in text]

    def _wrong_claim(self) -> bool:
        """A reply states a refund that is no requested order's refund (a guess: it voids every statement)."""
        refunds = [refund_of(self.start[oid]) for oid in self.requested if self.start[oid]["status"] == "pending"]
        return not self.config.wrong_claims_ok and any(
            any(all(abs(float(x) - r) >= 0.005 for r in refunds) for x in _NUMBER.findall(text))
            for _, text in self.replies)

    def _stated_status(self, order_id: str, status: str, after: int) -> bool:
        """A reply after call `after` names the order and its status (and no other status, unless hedging is ok)."""
        for made, text in self._statements():
            words = set(re.findall(r"[a-z]+", text.lower()))
            if (made > after and order_id[2:] in re.findall(r"\d+", text) and status in words
                    and (self.config.status_hedging_ok or len(words & set(STATUSES)) == 1)):
                return True
        return False

    def _stated_refund(self, amount: float, after: int) -> bool:
        for made, text in self._statements():
            numbers = [float(x) for x in _NUMBER.findall(text)]
            if made > after and any(abs(x - amount) < 0.005 for x in numbers) and (
                    self.config.amount_hedging_ok or len(numbers) <= 3):
                return True
        return False

    def parts(self) -> dict[str, bool]:
        config, calls = self.config, self.state.tool_calls
        auth = self._first("find_customer", email=self.db.email)
        order_tools = [i for i, r in enumerate(calls) if r.name in ("get_customer", "cancel_order")]
        lookup = self._first("get_customer", customer_id=self.db.customer_id)
        parts = {"auth": config.skip_auth_ok or (auth is not None and auth < min(order_tools, default=len(calls)))}
        graded = self.requested[:1] if config.first_request_only else self.requested
        wrong_claim = self._wrong_claim()
        for oid in graded:
            start, cancel = self.start[oid], self._first("cancel_order", order_id=oid)
            seen = -1 if config.skip_lookup_ok else lookup  # replies and writes must come after this call
            if start["status"] == "pending":
                parts[oid] = (cancel is not None and seen is not None and seen < cancel and not wrong_claim
                              and self._stated_refund(refund_of(start), cancel))
            else:
                parts[oid] = cancel is None and (config.bare_refusal_ok or (
                    seen is not None and self._stated_status(oid, start["status"], seen)))
        parts["others_untouched"] = all(self.db.orders[oid]["status"] == self.start[oid]["status"]
                                        for oid in self.db.orders if oid not in self.requested)
        return parts

    def get_summary(self) -> dict[str, Any]:
        if self.db is None:
            return {"reward": 0.0, "steps": 0, "success": False}
        parts = self.parts()  # "others_untouched" gates the rest: cancelling a stray order loses everything
        graded = [v for k, v in parts.items() if k != "others_untouched"]
        reward = sum(graded) / len(graded) if parts["others_untouched"] else 0.0
        return {"reward": reward, "steps": self.state.turns, "success": reward == 1.0, "parts": parts}

    def oracle_response(self) -> str:
        if not self.revealed:
            return "Could you tell me your email?"
        if self._first("find_customer", email=self.db.email) is None:
            return tool_text("find_customer", {"email": self.db.email})
        if self._first("get_customer", customer_id=self.db.customer_id) is None:
            return tool_text("get_customer", {"customer_id": self.db.customer_id})
        oid = self.requested[self.pointer]
        start = self.start[oid]
        if start["status"] != "pending":
            return f"Order {oid} is {start['status']}, so I cannot cancel it."
        if self._first("cancel_order", order_id=oid) is None:
            return tool_text("cancel_order", {"order_id": oid, "reason": "no longer needed"})
        return f"Order {oid} is cancelled; you get {refund_of(start):.2f} back."


class SilentDesk(DeskGame):
    """Says nothing about which tools write or authenticate."""

    def write_tool_names(self):
        return None

    def auth_tool_names(self):
        return None


class RefusalCrashDesk(DeskGame):
    """Raises on a refusal: a bug only the refuse_blindly probe reaches."""

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        if text == P.REFUSAL:
            raise RuntimeError("boom on a refusal")
        return super().respond_to_user(text)


def desk_spec(game_cls: type[DeskGame] = DeskGame, name: str = "toy_desk", **config: Any) -> GameSpec:
    spec_fields = {k: config.pop(k) for k in ("probes", "probe_expectations") if k in config}
    return GameSpec(name=name, make_env=lambda cfg=None: game_cls(cfg or DeskConfig(**config)), max_turns=12,
                    config_cls=DeskConfig, **spec_fields)


def rows(check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return check["probes"]


# --------------------------------------------------------------------------------------------------
# The fixed game passes; each hole is caught by its probe
# --------------------------------------------------------------------------------------------------
def test_oracle_wins_every_seed_and_one_hole_flag_changes_nothing_for_it():
    for config in ({}, {"receipt_shows_refund": True}, {"max_calls_per_turn": 4}, {"n_requests": 1}):
        spec = desk_spec(**config)
        for seed in range(SEEDS):
            episode = run_episode(spec, spec.make_env(), seed, oracle_policy, random.Random(0))
            assert episode.error is None and episode.summary["success"], (config, seed, episode.summary)


@pytest.mark.parametrize("config", [{}, {"n_requests": 1}])
def test_fixed_game_passes_every_probe(config):
    check = probe_check(desk_spec(**config), seeds=SEEDS)
    assert check["status"] == "PASS", check["detail"]
    assert check["oracle_success_rate"] == 1.0
    table = rows(check)
    assert list(table) == list(P.GENERIC_PROBE_NAMES)
    for name, row in table.items():
        assert row["status"] in ("PASS", "n/a"), (name, row)
        assert row["success_rate"] in (None, 0.0), (name, row)
    assert table["do_nothing"]["applicable_seeds"] == SEEDS


HOLES = [
    ("skip_authentication", {"skip_auth_ok": True}),
    ("act_without_lookups", {"skip_lookup_ok": True}),
    ("refuse_blindly", {"bare_refusal_ok": True}),
    ("echo_last_observation", {"receipt_shows_refund": True}),
    ("list_enum_values", {"status_hedging_ok": True}),
    ("spam_numbers", {"amount_hedging_ok": True, "wrong_claims_ok": True}),  # either rule closes it
    ("all_calls_in_one_turn", {"max_calls_per_turn": 4}),
    ("stop_after_first_request", {"first_request_only": True}),
    ("wrong_claim_then_report", {"wrong_claims_ok": True}),
    ("report_as_question", {"question_reports_ok": True}),
    ("report_in_malformed_turn", {"malformed_reports_ok": True}),
]


@pytest.mark.parametrize("probe, hole", HOLES, ids=[probe for probe, _ in HOLES])
def test_each_probe_catches_its_hole(probe, hole):
    check = probe_check(desk_spec(**hole), seeds=SEEDS)
    row = rows(check)[probe]
    assert row["status"] == "FAIL" and row["success_rate"] > row["limit"] == pytest.approx(0.1), row
    assert row["example_success_seeds"]
    assert check["status"] == "FAIL"
    assert f"{probe} succeeds on {row['success_rate']:.1%}" in check["detail"]
    # The same probe on the fixed game never wins.
    assert rows(probe_check(desk_spec(), seeds=SEEDS))[probe]["success_rate"] == 0.0


def test_live_probes_write_replies_from_the_conversation():
    spec = desk_spec(receipt_shows_refund=True)
    game = spec.make_env()
    seed = next(s for s in range(SEEDS) if game.reset(s) and all(game.start[o]["status"] == "pending"
                                                                 for o in game.requested))
    oracle = run_episode(spec, spec.make_env(), seed, oracle_policy, random.Random(0))
    facts, problems, warnings = P.tool_facts(spec, game)
    assert problems == warnings == []
    assert facts.write_tools == {"cancel_order"} and facts.auth_tools == {"find_customer"}
    probes = {p.name: p for p in P.generic_probes(spec, facts)[0]}

    echo = run_episode(spec, spec.make_env(), seed, probes["echo_last_observation"].make_policy(oracle.texts),
                       random.Random(0))
    replies = [m["content"] for m in echo.final_messages if m["role"] == "assistant" and not m.get("tool_calls")]
    tools = [m["content"] for m in echo.final_messages if m["role"] == "tool"]
    assert replies[0] == oracle.texts[0]  # the identity question comes before any tool call: kept
    assert set(replies[1:]) <= set(tools) and replies[1:]
    assert echo.summary["success"]  # both receipts carry the refund: the hole this probe finds

    enum = run_episode(spec, spec.make_env(), seed, probes["list_enum_values"].make_policy(oracle.texts),
                       random.Random(0))
    listing = next(m["content"] for m in enum.final_messages[3:] if m["role"] == "assistant" and not m.get("tool_calls"))
    assert listing.startswith("It is one of: no longer needed, ordered by mistake, ")
    assert "processing" in listing or "shipped" in listing or "delivered" in listing
    assert f"cust_{seed}" in listing


# --------------------------------------------------------------------------------------------------
# Applicability, missing facts, game-specific probes, expectations, exceptions
# --------------------------------------------------------------------------------------------------
def test_one_request_game_reports_stop_after_first_request_as_not_applicable():
    check = probe_check(desk_spec(n_requests=1, first_request_only=True), seeds=SEEDS)
    row = rows(check)["stop_after_first_request"]
    assert row["status"] == "n/a" and row["applicable_seeds"] == 0 and row["success_rate"] is None
    assert check["status"] == "PASS" and "n/a: stop_after_first_request" in check["detail"]


def test_game_without_write_or_auth_facts_warns_for_the_probes_that_need_them():
    check = probe_check(desk_spec(SilentDesk), seeds=20)
    table = rows(check)
    needing = {"refuse_blindly", "skip_authentication", "act_without_lookups", "stop_after_first_request",
               "blanket_confirmation"}
    assert {name for name, row in table.items() if row["status"] == "WARN"} == needing
    assert all("write_tool_names() is None" in table[n]["skipped"] or "auth_tool_names() is None" in table[n]["skipped"]
               for n in needing)
    assert "write_tool_names() is None and auth_tool_names() is None" in table["act_without_lookups"]["skipped"]
    assert check["status"] == "WARN" and "not run: refuse_blindly" in check["detail"]
    # The probes that need no fact still ran.
    assert table["echo_last_observation"]["applicable_seeds"] == 20 and table["do_nothing"]["status"] == "PASS"


def test_plain_game_without_tool_facts_is_a_warning_in_validate():
    report = validate(desk_spec(SilentDesk), seeds=20, fuzz_actions=0)
    assert report["checks"]["probes"]["status"] == "WARN"
    assert report["passed"] and any(w.startswith("probes: ") for w in report["warnings"])


def replay(texts: list[str]):
    return lambda turn, game, rng: texts[turn] if turn < len(texts) else None


def test_game_specific_probe_is_judged_with_its_expected_success():
    oracle_replay = Probe("replay_oracle", "the oracle's own texts", lambda texts: replay(texts), expected_success=1.0)
    never = Probe("never_applies", "applies nowhere", lambda texts: None)
    cheat = Probe("replay_oracle_cheat", "the oracle again, but declared a hack", lambda texts: replay(texts))
    check = probe_check(desk_spec(probes=(oracle_replay, never)), seeds=20)
    table = rows(check)
    assert list(table)[-2:] == ["replay_oracle", "never_applies"]
    assert table["replay_oracle"]["origin"] == "game" and table["replay_oracle"]["success_rate"] == 1.0
    assert table["replay_oracle"]["limit"] == pytest.approx(1.1) and table["replay_oracle"]["status"] == "PASS"
    assert table["never_applies"]["status"] == "n/a"
    assert check["status"] == "PASS"

    failing = probe_check(desk_spec(probes=(cheat,)), seeds=20)
    assert rows(failing)["replay_oracle_cheat"]["status"] == "FAIL" and failing["status"] == "FAIL"
    assert "replay_oracle_cheat succeeds on 100.0%" in failing["detail"]


def test_probe_expectations_raise_a_generic_probes_limit():
    hole = {"skip_auth_ok": True}
    assert rows(probe_check(desk_spec(**hole), seeds=20))["skip_authentication"]["status"] == "FAIL"
    declared = probe_check(desk_spec(**hole, probe_expectations={"skip_authentication": 1.0}), seeds=20)
    row = rows(declared)["skip_authentication"]
    assert row["expected_success"] == 1.0 and row["limit"] == pytest.approx(1.1) and row["status"] == "PASS"
    assert declared["status"] == "PASS"
    too_low = probe_check(desk_spec(**hole, probe_expectations={"skip_authentication": 0.5}), seeds=20)
    assert rows(too_low)["skip_authentication"]["status"] == "FAIL"  # 100% > 0.5 + 0.1
    # The tolerance is a flag: 0.5 + 0.5 lets it through.
    assert rows(probe_check(desk_spec(**hole, probe_expectations={"skip_authentication": 0.5}), seeds=20,
                            tolerance=0.5))["skip_authentication"]["status"] == "PASS"


def test_bad_probe_declarations_are_reported():
    typo = probe_check(desk_spec(probe_expectations={"skip_auth": 1.0}), seeds=5)
    assert typo["status"] == "WARN" and "probe_expectations names no generic probe: ['skip_auth']" in typo["detail"]
    clash = Probe("do_nothing", "a second do_nothing", lambda texts: None)
    clashing = probe_check(desk_spec(probes=(clash,)), seeds=5)
    assert clashing["status"] == "FAIL" and "reuse generic probe names" in clashing["detail"]


def test_exception_in_the_game_during_a_probe_is_a_failure():
    check = probe_check(desk_spec(RefusalCrashDesk), seeds=20)
    row = rows(check)["refuse_blindly"]
    assert row["status"] == "FAIL" and row["errors"] > 0
    assert "boom on a refusal" in row["error_examples"][0]
    assert check["status"] == "FAIL" and "refuse_blindly raised on" in check["detail"]
    assert "RuntimeError" in check["detail"]


def test_probe_that_raises_in_make_policy_is_a_failure():
    def broken(texts):
        raise KeyError("no such field")

    check = probe_check(desk_spec(probes=(Probe("broken_probe", "raises", broken),)), seeds=5)
    assert rows(check)["broken_probe"]["status"] == "FAIL" and "KeyError" in check["detail"]


# --------------------------------------------------------------------------------------------------
# Script helpers
# --------------------------------------------------------------------------------------------------
def test_scripts_keep_the_oracles_format_and_stop_when_they_run_out():
    spec = desk_spec()
    facts = P.ToolFacts(spec.extract_action, frozenset({"cancel_order"}), frozenset({"find_customer"}))
    two_calls = "Let me do both.\n" + tool_text("get_customer", {"customer_id": "c"}) + "  " + \
        tool_text("cancel_order", {"order_id": "#W1", "reason": "no longer needed"})
    texts = ["Could you tell me your email?", tool_text("find_customer", {"email": "e"}), two_calls, "Done."]
    probes = {p.name: p for p in P.generic_probes(spec, facts)[0]}
    refuse = probes["refuse_blindly"].make_policy(texts)
    script = [refuse(t, None, None) for t in range(5)]
    assert script == [texts[0], texts[1], "Let me do both.\n" + tool_text("get_customer", {"customer_id": "c"}) + "  ",
                      P.REFUSAL, None]
    skip = probes["skip_authentication"].make_policy(texts)
    assert [skip(t, None, None) for t in range(3)] == [two_calls, "Done.", None]
    batch = probes["all_calls_in_one_turn"].make_policy(texts)
    assert batch(0, None, None) == texts[1] + "\n" + two_calls  # the oracle's own call texts, joined
    first = spec.extract_action(batch(0, None, None))
    assert [c.name for c in first.tool_calls] == ["find_customer", "get_customer", "cancel_order"]
    assert [batch(t, None, None) for t in (1, 2, 3)] == [texts[0], "Done.", None]
    lookups = probes["act_without_lookups"].make_policy(texts)
    assert spec.extract_action(lookups(2, None, None)).tool_calls[0].name == "cancel_order"
    # "Done." is the oracle's last text: a one-request episode, so stop_after_first_request does not apply.
    assert probes["stop_after_first_request"].make_policy(texts) is None
    stop = probes["stop_after_first_request"].make_policy([*texts, "Anything else?", "Bye."])
    assert [stop(t, None, None) for t in range(3, 7)] == ["Done.", "Goodbye.", "Goodbye.", "Goodbye."]
    # A question after the work (a confirmation) does not close the request; the statement after it does.
    confirming = [*texts[:3], "Shall I go ahead?", "Done.", "Bye."]
    stop = probes["stop_after_first_request"].make_policy(confirming)
    assert [stop(t, None, None) for t in range(3, 6)] == ["Shall I go ahead?", "Done.", "Goodbye."]
    # A script equal to the oracle's is not applicable; one call is too few to batch.
    assert probes["skip_authentication"].make_policy(["Hi.", tool_text("get_customer", {"customer_id": "c"})]) is None
    assert probes["all_calls_in_one_turn"].make_policy(["Hi.", texts[1], "Done."]) is None
    assert probes["echo_last_observation"].make_policy(["Hi.", texts[1]]) is None


class FakeGame:
    def __init__(self, tool_contents: list[str], schemas: list[dict] | None = None) -> None:
        self.messages = [{"role": "tool", "content": c} for c in tool_contents]
        self.schemas = schemas or []

    def get_messages(self):
        return self.messages

    def get_tool_schemas(self):
        return self.schemas


def test_numbers_reply_lists_numbers_sums_and_differences():
    reply = P.numbers_reply(FakeGame(['{"a": 10.5, "b": [2, "total 3.25"], "id": "W999", "ok": true}']))
    values = reply.removeprefix("It is one of: ").removesuffix(".").split(", ")
    assert values[:3] == ["10.50", "2.00", "3.25"]
    assert {"12.50", "8.50", "13.75", "7.25", "5.25", "1.25"} <= set(values)
    assert "999.00" not in values and "1.00" not in values  # ids' digits and booleans are not numbers
    many = FakeGame([json.dumps(list(range(1000)))])
    assert len(P.numbers_reply(many).split(", ")) == P.MAX_LISTED
    assert P.numbers_reply(FakeGame([])) == P.NOTHING_SEEN
    assert P.numbers_reply(FakeGame([json.dumps([10 ** 400, 7, "9" * 400])])) == "It is one of: 7.00."


def test_enum_reply_lists_schema_enums_and_short_strings_only():
    schemas = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "mode": {"type": "string", "enum": ["fast", "slow"]}}}}}]
    reply = P.enum_reply(FakeGame(['{"status": "shipped", "note": "' + "x" * 41 + '", "n": 5}', "user_7"], schemas))
    assert reply == "It is one of: fast, slow, user_7, shipped."
    assert P.echo_reply(FakeGame(['{"a": 1}', "last one"])) == "last one"


# --------------------------------------------------------------------------------------------------
# validate and the CLI
# --------------------------------------------------------------------------------------------------
def test_validate_runs_probes_after_baselines_and_can_skip_them():
    report = validate(desk_spec(skip_auth_ok=True), seeds=20, fuzz_actions=0)
    assert list(report["checks"])[:3] == ["oracle", "baselines", "probes"]
    assert report["checks"]["probes"]["status"] == "FAIL" and not report["passed"]
    assert any(f.startswith("probes: ") and "skip_authentication" in f for f in report["failures"])
    skipped = validate(desk_spec(skip_auth_ok=True), seeds=20, fuzz_actions=0, probes=False)
    assert skipped["checks"]["probes"]["status"] == "WARN" and skipped["passed"]
    with pytest.raises(ValueError, match="probe_tolerance"):
        validate(desk_spec(), seeds=5, probe_tolerance=2.0)


def test_cli_prints_the_probe_table_and_takes_the_flags(monkeypatch, tmp_path, capsys):
    toy.register_temporarily(monkeypatch, desk_spec(name="toy_desk_cli", skip_auth_ok=True))
    out = tmp_path / "report.json"
    code = main(["toy_desk_cli", "--seeds", "20", "--fuzz-actions", "0", "--no-progress", "--json-output", str(out)])
    stdout = capsys.readouterr().out
    assert code == 1 and "FAIL  probes" in stdout
    assert re.search(r"^ +\(oracle\) +20 +100\.0% +1\.000", stdout, re.M)
    assert re.search(r"^ +skip_authentication +20 +100\.0% +1\.000 +0\.10  FAIL$", stdout, re.M)
    assert re.search(r"^ +do_nothing +20 +0\.0% +0\.\d+ +0\.10  PASS$", stdout, re.M)
    saved = json.loads(out.read_text())["checks"]["probes"]
    assert saved["probes"]["skip_authentication"]["success_rate"] == 1.0 and saved["tolerance"] == 0.1

    assert main(["toy_desk_cli", "--seeds", "20", "--fuzz-actions", "0", "--no-progress", "--no-probes"]) == 0
    assert "WARN  probes" in capsys.readouterr().out
    assert main(["toy_desk_cli", "--seeds", "20", "--fuzz-actions", "0", "--no-progress",
                 "--probe-tolerance", "1.0"]) == 0
    assert main(["toy_desk_cli", "--probe-tolerance", "1.5"]) == 2
    assert "--probe-tolerance" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Every registered game (the real games are being fixed elsewhere: expected to fail until then)
# --------------------------------------------------------------------------------------------------
# Three of the capability games (~2-3 s each) run with `-m slow`; storefront and the rest stay in the default suite.
SLOW_PROBE_GAMES = {"capability_structured_data_reasoning", "capability_precondition_verification",
                    "capability_tool_calling_precision"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_PROBE_GAMES else n
                                  for n in list_games()])
def test_registered_game_passes_the_probes(name):
    check = probe_check(get_game(name), seeds=100)
    failing = {n: f"{r['success_rate']:.0%}" if r["success_rate"] is not None else f"{r['errors']} raised"
               for n, r in check["probes"].items() if r["status"] == "FAIL"}
    assert check["status"] != "FAIL", f"{name}: probes that win: {failing}; {check['detail']}"
