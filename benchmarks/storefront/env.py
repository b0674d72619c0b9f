"""StorefrontGame: the built-in target benchmark, a small τ²-bench-style store.

`reset(seed)` builds the task (DB, scenario, gold plan) from the seed, the episode's DB is a clone of
the task's initial DB, and the scripted user answers replies. Reward (τ²-bench's DB + COMMUNICATE
basis) = db_match × communicate_ok, computed on demand: the gold write actions replayed on a fresh
copy of the initial DB must hash like the agent's DB, and every `communicate_info` value must appear
in some assistant reply (the status of a refused request only after a successful look-up of its order). `oracle_response()` is the expert: it follows the gold plan from the current
state (authenticate, look up, write, tell).
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from benchmarks.storefront.db import StoreDB, db_hash
from benchmarks.storefront.policy import POLICY
from benchmarks.storefront.tasks import FAMILIES, Task, family_for_seed, make_task
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import UserSimulator
from benchmarks.tooling import ToolEnvGame
from train.chat_template import render_tool_call

AUTH_QUESTION = "Please give me your email, or your name and zip code."


@dataclass
class StorefrontConfig:
    """Knobs of the storefront game (all episodes of one game object share them)."""

    families: tuple[str, ...] = FAMILIES  # task families drawn (by seed) at reset
    max_steps: int = 14  # assistant turns per episode
    max_errors: int = 3  # format errors tolerated (one more ends the episode)
    max_user_turns: int = 10  # user replies before the user gives up
    n_users: int = 3  # database size (other users are distractors for the user look-ups)
    n_products: int = 6

    def __post_init__(self) -> None:
        if isinstance(self.families, str):
            self.families = tuple(f.strip() for f in self.families.split(",") if f.strip())
        self.families = tuple(self.families)
        unknown = [f for f in self.families if f not in FAMILIES]
        if not self.families or unknown:
            raise ValueError(f"families must be a non-empty subset of {', '.join(FAMILIES)}; got {self.families!r}")
        for name in ("max_steps", "max_user_turns", "n_users"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"StorefrontConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_errors, int) or self.max_errors < 0:
            raise ValueError(f"StorefrontConfig.max_errors must be an int >= 0, got {self.max_errors!r}")
        if not isinstance(self.n_products, int) or not 3 <= self.n_products <= 12:
            raise ValueError(f"StorefrontConfig.n_products must be in 3..12 (the catalog), got {self.n_products!r}")


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """Hermes tool-call markup for one call, byte-identical to what the chat template renders."""
    return render_tool_call(name, arguments)


def mentions(value: str, texts: list[str]) -> bool:
    """Whether `value` appears in one of `texts`: amounts as whole numbers ('123.45' not inside '1123.456'),
    words case-insensitively on word boundaries."""
    if re.fullmatch(r"\d+\.\d\d", value):
        pattern = re.compile(rf"(?<![\d.]){re.escape(value)}(?!\d)")
    else:
        pattern = re.compile(rf"\b{re.escape(value)}\b", re.IGNORECASE)
    return any(pattern.search(text) for text in texts)


def _canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


class StorefrontGame(ToolEnvGame):
    """The storefront benchmark as a Game (see the module docstring)."""

    toolkit_class = StorefrontTools

    def __init__(self, config: StorefrontConfig | None = None) -> None:
        self.config = config or StorefrontConfig()
        super().__init__(max_steps=self.config.max_steps, max_errors=self.config.max_errors)
        self.task: Task | None = None
        self.user: UserSimulator | None = None
        self._gold_db: StoreDB | None = None
        self._ok_calls: set[tuple[str, str]] = set()
        self._ok_calls_seen = 0  # tool-call records already added to _ok_calls (reset per episode)
        self._gold_keys: dict[int, tuple[str, str]] = {}  # id(gold action dict) -> key; reset per episode

    # ---- episode ----------------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        family = family_for_seed(seed, self.config.families)
        self.task = make_task(seed, family, n_users=self.config.n_users, n_products=self.config.n_products)
        self.user = UserSimulator(self.task, random.Random(f"storefront-user:{seed}"), self.config.max_user_turns)
        self._gold_db, self._gold_keys, self._ok_calls, self._ok_calls_seen = None, {}, set(), 0
        return self.start_episode(StorefrontTools(self.task.db.clone()),
                                  [{"role": "user", "content": self.task.opening}])

    def get_system_prompt(self) -> str:
        return POLICY

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        return self.user.respond(text)

    # ---- scoring ----------------------------------------------------------------------------------
    def gold_db(self) -> StoreDB:
        """The initial DB after the gold write actions (built once per episode, on first use)."""
        if self._gold_db is None:
            tools = StorefrontTools(self.task.db.clone())
            for action in self.task.gold_actions:
                if tools.is_write(action["name"]):
                    try:
                        tools.call(action["name"], action["arguments"])
                    except ValueError as err:  # the task generator produced an impossible plan: a bug
                        raise RuntimeError(f"task {self.task.task_id}: gold action {action} fails: {err}") from err
            self._gold_db = tools.db
        return self._gold_db

    def gold_hash(self) -> str:
        """`db_hash` of the gold DB."""
        return db_hash(self.gold_db())

    def db_match(self) -> bool:
        """Whether the agent's DB equals the gold DB.

        Compares the dataclasses field by field, which is equivalent to comparing their `db_hash`es (the
        hash covers `to_dict()`, a one-to-one view of the fields) and ~10x cheaper; tests check both agree.
        """
        return self.toolkit.db == self.gold_db()

    def _successful_calls(self) -> set[tuple[str, str]]:
        """(name, canonical arguments) of the calls that succeeded so far (incremental: the log only grows)."""
        calls = self.state.tool_calls
        for record in calls[self._ok_calls_seen:]:
            if record.ok:
                self._ok_calls.add((record.name, _canonical(record.arguments)))
        self._ok_calls_seen = len(calls)
        return self._ok_calls

    def _gold_key(self, action: dict[str, Any]) -> tuple[str, str]:
        """(name, canonical arguments) of a gold action, computed once per episode."""
        key = self._gold_keys.get(id(action))
        if key is None:
            key = self._gold_keys[id(action)] = (action["name"], _canonical(action["arguments"]))
        return key

    def _replies(self) -> list[str]:
        return [m["content"] for m in self.state.messages
                if m["role"] == "assistant" and not m.get("tool_calls") and m.get("content")]

    def get_summary(self) -> dict[str, Any]:
        """Reward and its breakdown (τ²-bench style); valid at any time, final once `done`."""
        if self.task is None:
            raise RuntimeError("StorefrontGame: call reset() before get_summary()")
        db_match = self.db_match()
        replies = self._replies()
        done_ok = self._successful_calls()
        communicate = []
        for sub in self.task.sub_requests:
            # A refused request's status counts only once the order was looked up: otherwise a reply listing
            # every status word, with no tool call at all, would pass every forbidden request.
            looked_up = sub.allowed or ("get_order_details", _canonical({"order_id": sub.order_id})) in done_ok
            communicate += [{"info": v, "met": looked_up and mentions(v, replies)} for v in sub.communicate]
        communicate_ok = all(c["met"] for c in communicate)
        actions = [{"action": a, "action_match": self._gold_key(a) in done_ok}
                   for a in self.task.gold_actions]
        reward = 1.0 if db_match and communicate_ok else 0.0
        return {
            "reward": reward,
            "success": reward == 1.0,
            "steps": self.state.turns,
            "db_check": {"db_match": db_match, "db_reward": float(db_match)},
            "communicate_checks": communicate,
            "action_checks": actions,  # informational, not part of the reward (as in τ²-bench's default basis)
            "reward_basis": ["DB", "COMMUNICATE"],
            "reward_breakdown": {"DB": float(db_match), "COMMUNICATE": float(communicate_ok)},
            "family": self.task.family,
            "task_id": self.task.task_id,
            "format_errors": self.state.format_errors,
            "tool_errors": sum(not r.ok for r in self.state.tool_calls),
            "termination_reason": self.state.termination_reason,
        }

    # ---- the expert -------------------------------------------------------------------------------
    def oracle_response(self) -> str:
        """The expert's next message: authenticate, then for the current request its look-ups, its write
        (if allowed) and a closing statement that carries the values to communicate."""
        if self.task is None or self.state.done:
            raise RuntimeError("StorefrontGame: oracle_response() needs a running episode (reset first)")
        task, user = self.task, self.user
        done_ok = self._successful_calls()
        authenticated = any(r.ok and r.name.startswith("find_user_id") and r.output == task.user_id
                            for r in self.state.tool_calls)
        if not authenticated:
            if not user.revealed_auth:
                return AUTH_QUESTION
            auth = task.auth_action
            return tool_call_text(auth["name"], auth["arguments"])
        sub = user.current
        if sub is None:  # every request is closed; the user has stopped
            raise RuntimeError("StorefrontGame: no request left to handle")
        for action in sub.gold:
            if self._gold_key(action) not in done_ok:
                return tool_call_text(action["name"], action["arguments"])
        return sub.statement
