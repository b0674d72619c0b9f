"""`StorefrontCapabilityGame`: the base class of the storefront games (episode, oracle, ablations, per-request
scoring helpers). See games/_storefront/__init__.py."""
from __future__ import annotations

import dataclasses
import random
from abc import abstractmethod
from typing import Any, Callable, ClassVar

from benchmarks.storefront.communication import LegitValues, Replies, Reply
from benchmarks.storefront.compliance import just_confirmed, policy_violations
from benchmarks.storefront.db import StoreDB
from benchmarks.storefront.policy import POLICY, policy_text
from benchmarks.storefront.tasks import GREETINGS as TARGET_GREETINGS
from benchmarks.storefront.tasks import Customer, SubRequest
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import Identity, UserSimulator, is_question
from benchmarks.tool_env_game import ToolCallRecord, ToolEnvGame
from games._storefront.config import StorefrontGameConfig
from games._storefront.instances import (AUTH_QUESTION, GREETINGS, MAX_DRAWS, Instance, PlannedRequest, apply_calls,
                                         follow_up_message, opening_message, oracle_turns, planned_request)
from games._storefront.replies import phrase_pattern
from game_registry import render_tool_call

class StorefrontCapabilityGame(ToolEnvGame):
    """A storefront episode built by `build_instance`, scored by `score`, solved by the planned oracle."""

    game_name: ClassVar[str] = ""
    capability: ClassVar[str] = ""
    toolkit_class: ClassVar[type[StorefrontTools]] = StorefrontTools
    # True: the opening names every request (the multi-step game: remembering them is its skill); False: one
    # request at a time (`requests_per_episode`, see StorefrontGameConfig).
    reveals_all_at_once: ClassVar[bool] = False

    def __init__(self, config: StorefrontGameConfig) -> None:
        super().__init__(max_steps=config.max_steps, max_errors=config.max_errors)
        self.config = config
        # The knobs for summaries, gathered once (dataclasses.asdict per summary is slow); values are
        # immutable (numbers, bools, strings, tuples; the resolved `storefront` mapping is never changed), so a
        # shallow copy per summary is safe.
        self.config_summary = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        self.seed: int | None = None
        self.instance: Instance | None = None
        self.customer: UserSimulator | None = None
        self.start_db: StoreDB | None = None  # the database as generated (for "nothing else changed")
        self.expected_db: StoreDB | None = None  # the starting database after the oracle's writes
        self._replies: list[Reply] = []  # every reply the customer received, with the request it was on
        self._skill_matters: dict[str, bool] = {}

    # ---- for subclasses -------------------------------------------------------------------------
    def build_instance(self, rng: random.Random) -> Instance:
        """Generate one episode from `rng` (the only source of randomness): the game's own instance without a
        surface, else one drawn from the target's surface (drawn again until the oracle's plan fits)."""
        if self.config.surface is None:
            return self._build_alone(rng)
        return self.fitting_instance(rng, self._draw_from_surface)

    @abstractmethod
    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface)."""

    @abstractmethod
    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """An instance of the target's requests (None when its order descriptions read ambiguously)."""

    @abstractmethod
    def score(self) -> dict[str, float]:
        """Named reward parts (already weighted; penalties negative); the reward is their sum clipped to [0, 1]."""

    def make_opening(self, rng: random.Random, identity: str, clauses: list[str]) -> str:
        """The customer's first message; it says who they are (`identity`) only with `identity_in_opening`.
        With a surface it opens with the target customer's greetings."""
        greetings = GREETINGS if self.config.surface is None else TARGET_GREETINGS
        return opening_message(rng, clauses, identity if self.config.identity_in_opening else "", greetings)

    # ---- helpers for drawing from the target's surface ---------------------------------------------
    def make_messages(self, rng: random.Random, identity: str, clauses: list[str]) -> tuple[str, list[str]]:
        """(opening, follow-ups) of an episode whose requests read `clauses`: every clause in the opening when
        the game `reveals_all_at_once`, else the first in the opening and one follow-up per later one."""
        if self.reveals_all_at_once:
            return self.make_opening(rng, identity, clauses), []
        return (self.make_opening(rng, identity, clauses[:1]),
                [follow_up_message(rng, clause) for clause in clauses[1:]])

    def surface_instance(self, rng: random.Random, customer: Customer, subs: list[SubRequest],
                         info: dict[str, Any], clauses: list[str] | None = None,
                         ablated: Callable[[SubRequest, PlannedRequest], dict[str, PlannedRequest]] | None = None,
                         ) -> Instance:
        """An instance of the target's requests `subs` for `customer`: their plans (with the plans
        `ablated(sub, plan)` gives), the target's opening and follow-ups (the requests' own clauses unless
        `clauses` is given) and one of the target customer's identity sentences."""
        user = customer.user
        identity = rng.choice(Identity(first_name=user.first_name, last_name=user.last_name, email=user.email,
                                       zip=user.address.zip, auth=customer.auth).sentences())
        requests = [planned_request(sub, user.user_id) for sub in subs]
        if ablated is not None:
            for sub, request in zip(subs, requests):
                request.ablated = ablated(sub, request)
        opening, follow_ups = self.make_messages(rng, identity, clauses or [sub.clause for sub in subs])
        return Instance(db=customer.db, user=user, auth=customer.auth, opening=opening, requests=requests,
                        info={**info, "zero_zip_auth": customer.zero_zip_auth}, identity_reply=identity,
                        follow_ups=follow_ups)

    def fitting_instance(self, rng: random.Random, draw: Callable[[random.Random], Instance | None]) -> Instance:
        """`draw(rng)` (an Instance, or None when its order descriptions read ambiguously), drawn again from
        the same stream until the oracle's plan fits in `max_steps`: an order search looks up every earlier
        order, and a customer rarely has many. Raises RuntimeError after MAX_DRAWS draws, naming the fix."""
        config = self.config
        for _ in range(MAX_DRAWS):
            instance = draw(rng)
            if instance is not None and oracle_turns(instance, config.asks_confirmation,
                                                     config.identity_in_opening) <= config.max_steps:
                return instance
        raise RuntimeError(f"{self.game_name}: no instance in {MAX_DRAWS} draws fits max_steps={config.max_steps} "
                           f"with an unambiguous opening; raise max_steps")

    # ---- decision classes and ablations (validate_game's class-prior rule) ----------------------------
    # The classes of the decision a request turns on (`GameSpec.decision_classes`); `request_class` says which a
    # request is in. Empty: the game declares none (validate_game then holds its ablations to ABLATION_LIMIT).
    DECISION_CLASSES: ClassVar[tuple[str, ...]] = ()

    def request_class(self, request: PlannedRequest) -> str:
        """The decision class of one planned request (a game that declares DECISION_CLASSES implements it)."""
        raise NotImplementedError(f"{self.game_name}: declares DECISION_CLASSES but no request_class()")

    def decision_class(self) -> str | None:
        """The episode's decision class: its requests' classes joined with '+' (one request: its class); None
        before reset or for a game that declares no classes."""
        if not self.DECISION_CLASSES or self.instance is None:
            return None
        return "+".join(self.request_class(r) for r in self.instance.requests)

    def skill_matters(self) -> dict[str, bool]:
        """{ablation: whether the expert without that skill would leave another database than the oracle, or
        identify the customer with other arguments, on this instance}: where it would not (a one-item order for
        `first_items`, an order paid with the first method for `first_payment_method`, a forbidden order for
        `always_refuse`), the skill decides nothing and the ablation may win; everywhere else it must fail
        (validate_game). Compared by the state the plans' writes leave (a write the tools refuse changes
        nothing), as success is: two plans that differ only in words or in the order of a list are the same."""
        return self._skill_matters  # {} before the first reset

    def _ablations_that_matter(self) -> dict[str, bool]:
        """`skill_matters` computed (in reset, before any write: a plan's user look-up names the live user's
        address)."""
        instance = self.instance
        start, oracle_state = self.start_db, self.expected_db  # as generated, and after the oracle's writes
        auth = (instance.auth_call.name, instance.auth_call.arguments)
        out = {}
        for name in self.ABLATIONS:
            ablated_auth = instance.ablated_auth.get(name, instance.auth_call)
            calls = [c for r in instance.requests for c in r.ablated.get(name, r).calls]
            out[name] = ((ablated_auth.name, ablated_auth.arguments) != auth
                         or apply_calls(start, calls, strict=False) != oracle_state)
        return out

    def first_mistake(self, reward: float | None = None) -> str | None:
        """What went wrong first in an episode that did not succeed (None when it did, or before reset), in
        classes that count across games (Step 2's report of a game this agent cannot win):

          malformed_turn            a turn the parser rejected
          unknown_tool              a call of a tool the storefront does not have
          failed_lookup:<tool>      a read the tools refused (usually a value copied wrong: an id, an email)
          wrong_value:<arguments>   the planned write's tool with other values (e.g. wrong_value:item_ids);
                                    an argument whose value the agent was never shown before that call is
                                    marked `(never shown)`: invented, not copied wrong or chosen wrong
          wrong_tool                a write of another tool than the planned one
          write_where_plan_refuses  a write where the expert changes nothing (e.g. a status ignored)
          ran_out_of_turns / no_action / transferred   a planned call never made (the write, or the look-up
                                    a refusal rests on: cut off, customer left, handed over)
          policy_broken             every planned call made, but the procedure broke (a write without a yes)
          not_reported              the database as expected, the outcome not told honestly
        Extra successful reads are not mistakes. Calls are compared with the oracle's plan, in turn order.
        `reward`: the episode's, when the caller has it (else scored here)."""
        if self.instance is None:
            return None
        if reward is None:
            reward = min(1.0, max(0.0, sum(self.score().values())))
        if reward >= 1.0:
            return None
        instance, state = self.instance, self.state
        plan = [instance.auth_call, *(c for r in instance.requests for c in r.calls)]
        planned = [(c.name, c.arguments) for c in plan]
        planned_writes = [c for c in plan if StorefrontTools.is_write(c.name)]
        events = sorted([(r.turn, 1, r) for r in state.tool_calls] + [(t, 0, None) for t in state.format_error_turns],
                        key=lambda e: (e[0], e[1]))
        names = set(StorefrontTools.tool_names())
        for _, _, record in events:
            if record is None:
                return "malformed_turn"
            if record.name not in names:
                return "unknown_tool"
            if (record.name, record.arguments) in planned:
                continue
            if StorefrontTools.is_write(record.name):
                same = [c for c in planned_writes if c.name == record.name]
                if not planned_writes:
                    return "write_where_plan_refuses"
                if not same:
                    return "wrong_tool"
                args = record.arguments if isinstance(record.arguments, dict) else {}
                differing = sorted(k for k in set(args) | set(same[0].arguments)
                                   if args.get(k) != same[0].arguments.get(k))
                shown = self.text_shown_before(record.call_id)
                return "wrong_value:" + ",".join(
                    k if k not in args or all(str(v) in shown for v in _as_list(args[k])) else f"{k}(never shown)"
                    for k in differing)
            if not record.ok:
                return f"failed_lookup:{record.name}"
        made = [(r.name, r.arguments) for r in state.tool_calls if r.ok]
        if any(call not in made for call in planned):
            return {"max_steps": "ran_out_of_turns", "transfer": "transferred",
                    "too_many_errors": "malformed_turn"}.get(state.termination_reason, "no_action")
        if self.policy_violations():
            return "policy_broken"
        return "not_reported"

    def text_shown_before(self, call_id: str) -> str:
        """Everything the agent was shown before the assistant turn that made call `call_id` (system prompt, the
        customer's messages, tool outputs): a written value found nowhere in it was invented, not copied."""
        shown = []
        for message in self.state.messages:
            if any(call.get("id") == call_id for call in message.get("tool_calls") or []):
                break
            if message.get("role") != "assistant":
                shown.append(str(message.get("content") or ""))
        return "\n".join(shown)

    # ---- helpers for scoring --------------------------------------------------------------------
    @property
    def db(self) -> StoreDB:
        """The episode's live database."""
        if self.toolkit is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() first")
        return self.toolkit.db

    def successful_calls(self, name: str) -> list[ToolCallRecord]:
        """Calls of tool `name` that ran without error."""
        return [record for record in self.state.tool_calls if record.ok and record.name == name]

    def looked_up_order(self, order_id: str) -> bool:
        """True once get_order_details succeeded on `order_id` (so its status was shown to the agent)."""
        return any(r.arguments.get("order_id") == order_id for r in self.successful_calls("get_order_details"))

    def authenticated(self) -> bool:
        """True once a user look-up returned the customer's user id."""
        user_id, auth_tools = self.instance.user.user_id, StorefrontTools.auth_tools()
        return any(r.ok and r.name in auth_tools and r.output == user_id for r in self.state.tool_calls)

    def policy_violations(self) -> list[str]:
        """The target policy's procedure (authenticate first, look orders up before changing them, use only
        ids that were shown, and a yes right before each write unless the surface's policy has no such rule)."""
        return policy_violations(self.state.messages, self.state.tool_calls, self.instance.user.user_id,
                                 write_tools=StorefrontTools.write_tools(), auth_tools=StorefrontTools.auth_tools(),
                                 require_confirmation=self.config.asks_confirmation)

    def legit_values(self) -> LegitValues:
        """What the agent may say: the instance's amounts, the statuses of its requests' orders (before and
        after the expected writes) and the ids of the customer's orders."""
        requested = [r for r in self.instance.requests if r.info.get("order_id")]
        return LegitValues(
            order_statuses={r.info["order_id"]: {self._start_statuses[r.info["order_id"]],
                                                 self.expected_db.orders[r.info["order_id"]].status} for r in requested},
            order_amounts={r.info["order_id"]: [abs(r.info["amount"])] for r in requested if "amount" in r.info},
            order_ids=set(self.instance.user.orders), known_order_ids=set(self.db.orders),
            address_numbers=LegitValues.numbers_of(r.user.address.text() for r in self.instance.requests
                                                   if r.user.address))

    def told(self) -> Replies:
        """The replies judged by the target's rules (see the module docstring): ask it what was told, after
        which call (`written(request)`, `call_position(...)`)."""
        tool_outputs = [m["content"] for m in self.state.messages if m["role"] == "tool"]
        return Replies(self._replies, tool_outputs, self.legit_values())

    def written(self, request: PlannedRequest) -> int | None:
        """Message index of the request's planned write when it succeeded on its target (None if not)."""
        write = next((c for c in request.calls if StorefrontTools.is_write(c.name)), None)
        if write is None:
            return None
        target = {k: write.arguments[k] for k in ("order_id", "user_id") if k in write.arguments}
        return self.call_position(write.name, **target)

    @property
    def current_request(self) -> PlannedRequest | None:
        pointer = self.customer.pointer
        requests = self.instance.requests
        return requests[pointer] if pointer < len(requests) else None

    def failed_call_count(self) -> int:
        return sum(1 for record in self.state.tool_calls if not record.ok)

    def orders_unchanged_except(self, order_ids: set[str]) -> bool:
        """True when every order outside `order_ids` and every product is as generated."""
        start, live = self.start_db, self.db
        return (all(live.orders[oid] == order for oid, order in start.orders.items() if oid not in order_ids)
                and live.products == start.products)

    def nothing_else_changed(self) -> bool:
        """True when nothing outside the requests' targets changed: no other order, product or user, and the
        customer's address only when a request changes it (their gift-card balances move with refunds, which
        each request's order records)."""
        requests = self.instance.requests
        customer_id = self.instance.user.user_id
        if not self.orders_unchanged_except({r.info["order_id"] for r in requests if "order_id" in r.info}):
            return False
        for user_id, start_user in self.start_db.users.items():
            live_user = self.db.users[user_id]
            if user_id != customer_id:
                if live_user != start_user:
                    return False
            elif live_user.address != start_user.address and not any(r.kind == "modify_user_address"
                                                                      for r in requests):
                return False
        return True

    def request_done(self, request: PlannedRequest) -> bool:
        """Whether the request's target is in its expected state: its order equals the expected order (unchanged
        when refusing is right); for the default address, the customer's address equals the expected one."""
        if "order_id" not in request.info:
            user_id = request.info["user_id"]
            return self.db.users[user_id].address == self.expected_db.users[user_id].address
        order_id = request.info["order_id"]
        return self.db.orders[order_id] == self.expected_db.orders[order_id]

    def request_reported(self, request: PlannedRequest, replies: Replies) -> bool:
        """Whether an honest reply after the request's write reported its outcome (the order id of a cancel or
        address change, the amount of a return or exchange, the words "default address"), and no reply
        asserted a wrong value about it."""
        if replies.voided(request.info.get("order_id", "")):
            return False
        after = self.written(request)
        if request.kind == "modify_user_address":
            return replies.tells_phrase(phrase_pattern("default address"), after=after)
        if "amount" in request.info:  # a return or exchange
            return replies.tells_amount(request.info["amount"], after=after)
        return replies.tells_order_id(request.info["order_id"], after=after)

    @staticmethod
    def mean_parts(per_request: list[dict[str, float]]) -> dict[str, float]:
        """Each named part averaged over the requests (each request carries the same weights)."""
        return {name: sum(parts[name] for parts in per_request) / len(per_request) for name in per_request[0]}

    # ---- Game protocol --------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{self.game_name}: seed must be an int, got {seed!r}")
        instance = self.build_instance(random.Random(seed))
        self.seed, self.instance = seed, instance
        self.start_db = instance.db.clone()  # ~0.1 ms: for "nothing else changed"
        self.expected_db = apply_calls(instance.db, instance.write_calls())
        # Replies the customer gives before leaving: identity, a confirmation and a statement per request, slack.
        self.customer = UserSimulator(instance.identity, [r.user for r in instance.requests],
                                      random.Random(f"{self.game_name}-user:{seed}"),
                                      max_turns=2 * len(instance.requests) + 4, identity_reply=instance.identity_reply,
                                      revealed_identity=self.config.identity_in_opening,
                                      own_order_ids=tuple(instance.user.orders), follow_ups=tuple(instance.follow_ups))
        self._replies = []
        self._skill_matters = self._ablations_that_matter()
        # The orders' statuses as generated (the live database is the instance's: a write changes it).
        self._start_statuses = {oid: order.status for oid, order in instance.db.orders.items()}
        return self.start_episode(self.toolkit_class(instance.db), [{"role": "user", "content": instance.opening}])

    def get_system_prompt(self) -> str:
        """The target's policy (without the confirmation rule when the surface's policy has none)."""
        return POLICY if self.config.asks_confirmation else policy_text(require_confirmation=False)

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        current = self.current_request
        answer = self.customer.respond(text)
        self._replies.append(Reply(len(self.state.messages) - 1, text, current.info.get("order_id", "") if current else "",
                                   is_question(text)))
        return answer

    def oracle_response(self) -> str:
        """The expert's next message: ask who the customer is, authenticate, then the current request's
        first call not yet made successfully, then its closing statement."""
        return self._plan_response(None)

    def ablated_response(self, ablation: str) -> str:
        """The next message of the expert without one skill: the oracle, following each request's
        `ablated[ablation]` plan where it has one (the ablations a game declares are its `ABLATIONS`)."""
        if ablation not in self.ABLATIONS:
            raise ValueError(f"{self.game_name}: unknown ablation {ablation!r}; this game declares "
                             f"{', '.join(self.ABLATIONS) or 'none'}")
        return self._plan_response(ablation)

    # {ablation name: what the expert lacks}; each game declares its own (validate_game holds them to a limit).
    ABLATIONS: ClassVar[dict[str, str]] = {}

    def _plan_response(self, ablation: str | None) -> str:
        if self.instance is None or self.state.done:
            raise RuntimeError(f"{self.game_name}: oracle_response() needs a running episode (reset first)")
        if not self.authenticated():
            if not self.customer.revealed_identity:
                return AUTH_QUESTION
            call = self.instance.ablated_auth.get(ablation, self.instance.auth_call)
            return render_tool_call(call.name, call.arguments)
        request = self.current_request
        if request is None:  # every request is closed: the customer has left
            raise RuntimeError(f"{self.game_name}: no request left to handle")
        if ablation is not None:
            request = request.ablated.get(ablation, request)
        made = [(r.name, r.arguments) for r in self.state.tool_calls if r.ok]
        for call in request.calls:
            if (call.name, call.arguments) not in made:
                if (StorefrontTools.is_write(call.name) and self.config.asks_confirmation
                        and not self._just_confirmed(request.confirmation)):
                    return request.confirmation
                return render_tool_call(call.name, call.arguments)
        return request.statement

    def _just_confirmed(self, question: str) -> bool:
        """Whether the agent's last reply was `question` and the customer answered yes."""
        return just_confirmed(self.state.messages, question)

    def get_summary(self) -> dict[str, Any]:
        base = {"game": self.game_name, "capability": self.capability, "seed": self.seed,
                "config": dict(self.config_summary)}
        if self.instance is None:
            return {"reward": 0.0, "steps": 0, "success": False, **base}
        parts = self.score()
        reward = round(min(1.0, max(0.0, sum(parts.values()))), 6)
        return {"reward": reward, "steps": self.state.turns, "success": reward == 1.0, **base,
                "instance": {**self.instance.info, "requests": [{"kind": r.kind, **r.info}
                                                                for r in self.instance.requests]},
                "reward_parts": {name: round(value, 6) for name, value in parts.items()},
                "decision_class": self.decision_class(), "skill_matters": self.skill_matters(),
                "first_mistake": self.first_mistake(reward),
                "tool_calls": len(self.state.tool_calls), "failed_tool_calls": self.failed_call_count(),
                "format_errors": self.state.format_errors, "termination_reason": self.state.termination_reason}


def _as_list(value: Any) -> list[Any]:
    """A tool argument's values: a list's elements, or the value alone."""
    return list(value) if isinstance(value, (list, tuple)) else [value]
