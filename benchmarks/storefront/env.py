"""StorefrontGame: the built-in target benchmark, a small τ²-bench-style store.

`reset(seed, trial=0)` builds the task (DB, customer, plan) from the seed; the trial seeds the customer's
wording and the order in which they list their requests, so repeated trials of one task differ while the
facts stay the same. The episode's DB is a clone of the task's initial DB.

Reward (τ²-bench's DB + COMMUNICATE basis, plus the policy's procedure) is 1 when all three hold, else 0:
  - DB: the gold writes replayed on a fresh copy of the initial DB equal the agent's DB;
  - COMMUNICATE: per request, an honest report (a reply the customer read as a statement, with no pasted
    tool output and no status, amount or order id wrong for what it is about;
    benchmarks/storefront/communication.py) tells it: a refused request's status after its order's
    look-up; after a change, the amount of a return / exchange, the order id of a cancel or address change,
    "default address" for the default address. Any reply asserting a wrong value about a request voids
    that request's check (a wrong guess costs);
  - POLICY: no write before authentication, on an order not looked up, with an id never seen, or (with
    `require_confirmation`) without the customer's yes right before it (benchmarks/storefront/compliance.py).
`oracle_response()` is the expert: it follows each request's plan from the current state.
"""
from __future__ import annotations

import random
import re
from typing import Any

from benchmarks.storefront.communication import LegitValues, Replies, Reply
from benchmarks.storefront.compliance import just_confirmed, policy_violations
from benchmarks.storefront.config import StorefrontConfig
from benchmarks.storefront.db import StoreDB, db_hash
from benchmarks.storefront.policy import policy_text
from benchmarks.storefront.tasks import Step, SubRequest, Task, call_key, make_task
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import UserSimulator, is_question
from benchmarks.tool_env_game import ToolEnvGame
from game_registry import render_tool_call

__all__ = ["AUTH_QUESTION", "StorefrontConfig", "StorefrontGame", "tool_call_text"]

AUTH_QUESTION = "Please give me your email, or your name and zip code."


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """Hermes tool-call markup for one call, byte-identical to what the chat template renders."""
    return render_tool_call(name, arguments)


class StorefrontGame(ToolEnvGame):
    """The storefront benchmark as a Game (see the module docstring)."""

    toolkit_class = StorefrontTools

    def __init__(self, config: StorefrontConfig | None = None) -> None:
        self.config = config or StorefrontConfig()
        super().__init__(max_steps=self.config.max_steps, max_errors=self.config.max_errors)
        self.policy = policy_text(self.config.require_confirmation)
        self.task: Task | None = None
        self.trial = 0
        self.subs: list[SubRequest] = []  # the task's requests in this episode's order
        self.user: UserSimulator | None = None
        self._gold_db: StoreDB | None = None
        self._ok_calls: set[tuple[str, str]] = set()
        self._ok_calls_seen = 0  # tool-call records already added to _ok_calls (reset per episode)
        self._replies: list[Reply] = []  # every reply the customer received, with how they read it

    # ---- episode ----------------------------------------------------------------------------------
    def reset(self, seed: int, trial: int = 0) -> list[dict[str, Any]]:
        if isinstance(trial, bool) or not isinstance(trial, int) or trial < 0:
            raise ValueError(f"trial must be an int >= 0, got {trial!r}")
        self.task = make_task(seed, self.config)
        self.trial = trial
        rng = random.Random(f"storefront-user:{seed}:{trial}")
        order = list(range(len(self.task.sub_requests)))
        rng.shuffle(order)
        self.subs = [self.task.sub_requests[i] for i in order]
        self.user = UserSimulator(self.task.identity, [s.user for s in self.subs], rng, self.config.max_user_turns,
                                  own_order_ids=tuple(self.task.user.orders))
        self._gold_db, self._ok_calls, self._ok_calls_seen, self._replies = None, set(), 0, []
        return self.start_episode(StorefrontTools(self.task.db.clone()),
                                  [{"role": "user", "content": self.task.opening(rng, order)}])

    def get_system_prompt(self) -> str:
        return self.policy

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        current = self.current
        answer = self.user.respond(text)
        self._replies.append(Reply(len(self.state.messages) - 1, text, current.order_id if current else "",
                                   is_question(text)))
        return answer

    @property
    def current(self) -> SubRequest | None:
        """The request the customer is on (None once every request is closed)."""
        pointer = self.user.pointer
        return self.subs[pointer] if pointer < len(self.subs) else None

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

    def successful_calls(self) -> set[tuple[str, str]]:
        """(name, canonical arguments) of the calls that succeeded so far (incremental: the log only grows)."""
        calls = self.state.tool_calls
        for record in calls[self._ok_calls_seen:]:
            if record.ok:
                self._ok_calls.add(call_key(record.name, record.arguments))
        self._ok_calls_seen = len(calls)
        return self._ok_calls

    def legit_values(self) -> LegitValues:
        """What the agent may say in this task: its amounts, the statuses of its requests' orders (before and
        after the gold writes) and the ids of the customer's orders (a search may name the ones it passed)."""
        task, gold = self.task, self.gold_db()
        requested = [s for s in task.sub_requests if s.order_id]
        return LegitValues(
            order_statuses={s.order_id: {db.orders[s.order_id].status for db in (task.db, gold)} for s in requested},
            order_amounts={s.order_id: [abs(s.tell_amount)] for s in requested if s.tell_amount is not None},
            order_ids=set(task.user.orders), known_order_ids=set(task.db.orders),
            address_numbers=LegitValues.numbers_of(s.user.address.text() for s in task.sub_requests if s.user.address))

    def _communication(self) -> list[dict[str, Any]]:
        replies = Replies(self._replies, [m["content"] for m in self.state.messages if m["role"] == "tool"],
                          self.legit_values())
        checks = []
        for sub in self.task.sub_requests:
            # A refusal reports what the look-up showed; a return or exchange reports what the write did. A
            # wrong assertion about the request (or sent while the customer was on it) voids its checks.
            clean = not replies.voided(sub.order_id)
            if sub.tell_status:
                looked_up = self.call_position("get_order_details", order_id=sub.order_id)
                checks.append({"info": sub.tell_status, "met": clean and replies.tells_status(
                    sub.tell_status, after=looked_up, order_id=sub.order_id)})
            if not sub.allowed:
                continue
            target = {"order_id": sub.order_id} if sub.order_id else {"user_id": self.task.user_id}
            written = self.call_position(sub.write.name, **target)
            if sub.tell_amount is not None:
                checks.append({"info": f"{abs(sub.tell_amount):.2f}",
                               "met": clean and replies.tells_amount(sub.tell_amount, after=written)})
            if sub.tell_order_id:
                checks.append({"info": sub.order_id,
                               "met": clean and replies.tells_order_id(sub.order_id, after=written)})
            if sub.tell_phrase:
                pattern = re.compile(r"\b" + r"\s+".join(map(re.escape, sub.tell_phrase.split())) + r"\b", re.I)
                checks.append({"info": sub.tell_phrase, "met": clean and replies.tells_phrase(pattern, after=written)})
        return checks

    def policy_violations(self) -> list[str]:
        """Why the agent's writes break the written policy's procedure (empty: none does)."""
        return policy_violations(self.state.messages, self.state.tool_calls, self.task.user_id,
                                 write_tools=StorefrontTools.write_tools(), auth_tools=StorefrontTools.auth_tools(),
                                 require_confirmation=self.config.require_confirmation)

    def get_summary(self) -> dict[str, Any]:
        """Reward and its breakdown (τ²-bench style); valid at any time, final once `done`."""
        if self.task is None:
            raise RuntimeError("StorefrontGame: call reset() before get_summary()")
        db_match = self.db_match()
        communicate = self._communication()
        communicate_ok = all(c["met"] for c in communicate)
        violations = self.policy_violations()
        done_ok = self.successful_calls()
        actions = [{"action": a, "action_match": call_key(a["name"], a["arguments"]) in done_ok}
                   for a in self.task.gold_actions]
        reward = 1.0 if db_match and communicate_ok and not violations else 0.0
        return {
            "reward": reward,
            "success": reward == 1.0,
            "steps": self.state.turns,
            "db_check": {"db_match": db_match, "db_reward": float(db_match)},
            "communicate_checks": communicate,
            "policy_checks": {"violations": violations, "policy_reward": float(not violations)},
            "action_checks": actions,  # informational, not part of the reward (as in τ²-bench's default basis)
            "reward_basis": ["DB", "COMMUNICATE", "POLICY"],
            "reward_breakdown": {"DB": float(db_match), "COMMUNICATE": float(communicate_ok),
                                 "POLICY": float(not violations)},
            "request_kinds": self.task.request_kinds,
            "task_id": self.task.task_id,
            "trial": self.trial,
            "format_errors": self.state.format_errors,
            "tool_errors": sum(not r.ok for r in self.state.tool_calls),
            "termination_reason": self.state.termination_reason,
        }

    # ---- the expert -------------------------------------------------------------------------------
    def authenticated(self) -> bool:
        return any(r.ok and r.name in StorefrontTools.auth_tools() and r.output == self.task.user_id
                   for r in self.state.tool_calls)

    def just_confirmed(self, question: str) -> bool:
        """Whether the agent's last reply was `question` and the customer's answer to it was a yes."""
        return just_confirmed(self.state.messages, question)

    def next_step(self, steps: list[Step]) -> str | None:
        """The expert's text for the first step of `steps` not done yet, or None when all are done."""
        done_ok = self.successful_calls()
        for index, step in enumerate(steps):
            if step.is_confirm:
                if steps[index + 1].key in done_ok or self.just_confirmed(step.text):
                    continue
                return step.text
            if step.key not in done_ok:
                return tool_call_text(step.name, step.arguments)
        return None

    def oracle_response(self) -> str:
        """The expert's next message: authenticate, then for the current request its look-ups, confirmation
        and write (if allowed) and a closing statement that carries the values to tell."""
        if self.task is None or self.state.done:
            raise RuntimeError("StorefrontGame: oracle_response() needs a running episode (reset first)")
        if not self.authenticated():
            if not self.user.revealed_identity:
                return AUTH_QUESTION
            auth = self.task.auth_action
            return tool_call_text(auth["name"], auth["arguments"])
        sub = self.current
        if sub is None:  # every request is closed; the user has stopped
            raise RuntimeError("StorefrontGame: no request left to handle")
        return self.next_step(sub.steps) or sub.statement
