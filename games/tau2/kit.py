"""The kit for capability games on τ²-bench's real retail domain: its database, tools, policy and prompt, a scripted
customer, and grading by state.

What a game keeps from the target `tau2_retail` (benchmarks/tau2_game.py), byte for byte: the system prompt
(τ²-bench's agent instruction and the retail policy) and the 15 retail tools with the schemas the package
generates, run by tau2's own environment on a fresh copy of the real database each episode (made at the first
tool call: an episode without calls never needs one). What the kit adds, so that no LLM is needed inside a game:

- **An instance** (`Instance`): one real customer of the database and one request about one of their real orders,
  drawn from `random.Random(seed)`, with its decision class and the writes the request needs (none when refusing).
- **A scripted customer** (`ScriptedCustomer`): opens with the request (the order id, the reason), says who they
  are only when asked (email, or name and zip), answers "yes" only to a confirmation question that names its
  order and its action and no other action, repeats the request to any other question, and leaves at the first
  statement, writing τ²-bench's `###STOP###` as the target's customer does.
- **The policy's procedure** (`procedure_problems`), any breach of which makes the reward 0: a call other than the
  user look-up before the customer is authenticated; a look-up with an identity the customer has not given yet;
  a write on an order not looked up first, a write without the customer's yes right before it, and a write the
  environment refuses (the retail policy asks to check before acting, not to try and see).
- **Telling**, judged with the storefront's rules (benchmarks/storefront/communication.py): only a statement the
  customer received reports; it counts when it names the order and asserts the right status and nothing wrong;
  a reply asserting a wrong status or naming an order id that is not the customer's (any `#W` + 7 digits, real or
  not) voids the telling; a raw tool dump tells nothing.
- **The expected database**: the instance's writes applied by the same tools to a fresh copy; the episode's
  database must hash the same (nothing else changed, nothing missing).

Reward: 0.6 when the database ends as expected and the order was looked up; +0.4 on top when the outcome was told;
0 on any procedure breach. Success is 1.0.
"""
from __future__ import annotations

import functools
import random
import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from benchmarks.storefront.communication import LegitValues, Replies, Reply
from benchmarks.storefront.user_sim import AUTH_WORDS, CONFIRM_MARKERS, is_question
from benchmarks.tau2_game import Tau2Game, Tau2Tools, load_domain
from benchmarks.tool_env_game import ToolEnvGame
from game_registry import render_tool_call

TARGET = "tau2_retail"
AUTH_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip")
STOP = "###STOP###"  # τ²-bench's customer ends the conversation with it (tau2.user.base.STOP)
ORDER_ID = re.compile(r"#?[Ww]?(\d{7})\b")  # how a retail order id shows in text (#W0000000)
# Words of the retail write actions: a confirmation question naming more than one action approves none.
ACTION_WORDS = {"cancel": ("cancel",), "return": ("return", "refund"), "exchange": ("exchange",),
                "modify": ("modify", "change", "address", "payment")}
ACTION_SHARE, COMMUNICATION_SHARE = 0.6, 0.4


@dataclass(frozen=True)
class RetailWorld:
    """The real retail database, loaded once per process, and what the games draw from it."""

    db: Any
    hash: str
    system_prompt: str
    schemas: tuple[dict[str, Any], ...]
    write_tools: frozenset[str]
    orders_by_status: dict[str, tuple[str, ...]]

    def fresh_environment(self) -> Any:
        """An environment on a copy of the real database: its products, users and orders are copied one by one
        the first time a tool looks them up by id (`CopyOnLookup`), not all 1,000 orders up front (a deep copy
        took 0.07-0.3 s an episode; the retail tools change an entry only after looking it up by id)."""
        from tau2.domains.retail.environment import get_environment

        db = self.db.model_copy()  # a new model holding the same dicts, each replaced by a copy-on-lookup view
        for name in ("products", "users", "orders"):
            setattr(db, name, CopyOnLookup(getattr(self.db, name)))
        return get_environment(db=db)


class CopyOnLookup(dict):
    """A dict of pydantic models whose entry is deep-copied, and kept, the first time it is looked up by key
    (`d[key]`, `d.get(key)`): an episode changes its own copies and never the shared original. Iteration
    (`items()`, `values()`) reads the entries as they are, copied or not, which is what a read-only scan needs."""

    def __init__(self, source: dict[str, Any]) -> None:
        super().__init__(source)
        self._copied: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if key not in self._copied:
            value = value.model_copy(deep=True)
            super().__setitem__(key, value)
            self._copied.add(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


@functools.lru_cache(maxsize=None)
def retail_world() -> RetailWorld:
    domain = load_domain("retail")
    environment = domain.environment()
    by_status: dict[str, list[str]] = {}
    for order_id, order in sorted(environment.tools.db.orders.items()):
        by_status.setdefault(order.status, []).append(order_id)
    target = Tau2Game("retail")
    return RetailWorld(db=environment.tools.db, hash=environment.get_db_hash(), system_prompt=target.get_system_prompt(),
                       schemas=tuple(target.get_tool_schemas()), write_tools=Tau2Tools(environment).write_tools(),
                       orders_by_status={status: tuple(ids) for status, ids in by_status.items()})


@functools.lru_cache(maxsize=4096)
def expected_hash(writes: tuple[tuple[str, str], ...]) -> str:
    """The database hash after `writes` ((tool, JSON arguments) pairs) on a fresh copy of the real database."""
    import json

    world = retail_world()
    if not writes:
        return world.hash
    tools = Tau2Tools(world.fresh_environment())
    for name, arguments in writes:
        tools.call(name, json.loads(arguments))  # a planned write that fails is a bug of the game: it raises
    return tools.environment.get_db_hash()


@dataclass(frozen=True)
class Customer:
    user_id: str
    first_name: str
    last_name: str
    email: str
    zip: str
    auth: str  # "email" or "name_zip": how they identify themselves

    @classmethod
    def of_user(cls, user_id: str, auth: str) -> "Customer":
        user = retail_world().db.users[user_id]
        return cls(user_id, user.name.first_name, user.name.last_name, user.email, user.address.zip, auth)

    def identity_sentence(self) -> str:
        if self.auth == "email":
            return f"Sure, my email is {self.email}."
        return f"I don't remember my email. I'm {self.first_name} {self.last_name}, zip code {self.zip}."

    def auth_call(self) -> tuple[str, dict[str, str]]:
        if self.auth == "email":
            return "find_user_id_by_email", {"email": self.email}
        return "find_user_id_by_name_zip", {"first_name": self.first_name, "last_name": self.last_name,
                                            "zip": self.zip}


@dataclass(frozen=True)
class Instance:
    """One request about one real order. `request_writes`: the calls doing what the customer asks ((tool,
    arguments) pairs), made only in the "act" class; `confirm`: the confirmation question the expert asks before
    them; `report`: the statement telling it was done; `refusal`: the statement telling why it cannot be (the
    order's status); `action`: the request's kind (its words name it in a confirmation)."""

    customer: Customer
    order_id: str
    status: str
    action: str
    opening: str
    decision_class: str
    request_writes: tuple[tuple[str, dict[str, Any]], ...]
    confirm: str
    report: str
    refusal: str
    done_status: str  # the order's status once the request is done (the report asserts it)

    @property
    def writes(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The writes the episode must make: the request's when acting is right, none when refusing is."""
        return self.request_writes if self.decision_class == "act" else ()

    @property
    def told_status(self) -> str:
        """The status the closing statement must assert."""
        return self.done_status if self.decision_class == "act" else self.status

    def expected_hash(self) -> str:
        import json

        return expected_hash(tuple((name, json.dumps(args, sort_keys=True)) for name, args in self.writes))


class LazyTools:
    """Tau2Tools on a fresh copy of the real database, made at the first call."""

    def __init__(self) -> None:
        self._tools: Tau2Tools | None = None

    @property
    def tools(self) -> Tau2Tools:
        if self._tools is None:
            self._tools = Tau2Tools(retail_world().fresh_environment())
        return self._tools

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.tools.call(name, arguments)

    def ends_episode(self, name: str) -> bool:
        return False

    def db_hash(self) -> str:
        return retail_world().hash if self._tools is None else self._tools.environment.get_db_hash()


class ScriptedCustomer:
    """The customer of one instance (see the module docstring). `yes_positions`: where in the message log the
    customer said yes to a confirmation of its request."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.revealed_identity = False
        self.yes_positions: list[int] = []
        self._order_digits = instance.order_id.removeprefix("#W")

    def names_only_this_action(self, lowered: str) -> bool:
        named = {action for action, words in ACTION_WORDS.items() if any(w in lowered for w in words)}
        ids = set(ORDER_ID.findall(lowered))
        return named == {self.instance.action} and ids == {self._order_digits}

    def respond(self, text: str, position: int) -> tuple[str, bool]:
        """The answer to the agent's reply at `position` of the log, and whether the customer leaves."""
        lowered = text.lower()
        if not is_question(text):
            return f"Thank you, that's all. {STOP}", True
        if any(m in lowered for m in CONFIRM_MARKERS) and self.names_only_this_action(lowered):
            self.yes_positions.append(position + 1)  # the customer's message comes right after the question
            return "Yes, please go ahead.", False
        if any(w in lowered for w in AUTH_WORDS):
            self.revealed_identity = True
            return self.instance.customer.identity_sentence(), False
        return f"I'd just like to {self.instance.action} my order {self.instance.order_id}, please.", False


class RetailCapabilityGame(ToolEnvGame):
    """Base of a capability game on the real retail domain: a subclass draws instances (`draw`); the kit runs the
    episode, the customer, the procedure checks, the grading and the expert (module docstring).

    `DECISION_CLASSES` and `ABLATIONS` ({name: what the expert lacks}) as the storefront games declare them;
    `ablation_decision(name)` says what each ablation decides ("act" or "refuse") on the current instance."""

    DECISION_CLASSES: tuple[str, ...] = ("act", "refuse")
    ABLATIONS: dict[str, str] = {}

    def __init__(self, config: Any) -> None:
        self.config = config
        super().__init__(max_steps=config.max_steps, max_errors=config.max_errors, max_calls_per_turn=1,
                         max_observation_chars=10**9, max_turn_chars=16000)
        self.instance: Instance | None = None
        self.customer: ScriptedCustomer | None = None
        self._replies: list[Reply] = []
        self._grade: dict[str, Any] | None = None

    @abstractmethod
    def draw(self, rng: random.Random) -> Instance:
        """The instance of a seed (every choice from `rng`)."""

    @abstractmethod
    def ablation_decision(self, name: str) -> str:
        """What ablation `name` decides on the current instance: "act" or "refuse"."""

    # ---- episode ----------------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.instance = self.draw(random.Random(seed))
        self.customer = ScriptedCustomer(self.instance)
        self._replies, self._grade = [], None
        return self.start_episode(LazyTools(), [{"role": "user", "content": self.instance.opening}])

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        position = len(self.state.messages) - 1  # the reply was just logged
        self._replies.append(Reply(position, text, self.instance.order_id, question=is_question(text)))
        return self.customer.respond(text, position)

    def get_system_prompt(self) -> str:
        return retail_world().system_prompt

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [dict(s) for s in retail_world().schemas]

    def write_tool_names(self) -> frozenset[str]:
        return retail_world().write_tools

    def auth_tool_names(self) -> frozenset[str]:
        return frozenset(AUTH_TOOLS)

    # ---- grading ----------------------------------------------------------------------------------
    def _calls_in_order(self) -> list[tuple[int, Any]]:
        """(position in the log, ToolCallRecord) of every executed call."""
        records = {r.call_id: r for r in self.state.tool_calls if r.executed}
        return [(position, records[call["id"]]) for position, message in enumerate(self.state.messages)
                for call in message.get("tool_calls") or () if call["id"] in records]

    def procedure_problems(self) -> list[str]:
        """The policy's procedure, call by call (module docstring); empty when it held."""
        instance, problems = self.instance, []
        said = ""  # what the customer has said so far
        authenticated, looked_up = False, set()
        messages = self.state.messages
        user_positions = [i for i, m in enumerate(messages) if m["role"] == "user"]
        writes_since_yes: set[int] = set()
        for position, record in self._calls_in_order():
            said = " ".join(messages[i]["content"] for i in user_positions if i < position)
            if record.name in AUTH_TOOLS:
                values = [str(v) for v in record.arguments.values()]
                if not all(v and v in said for v in values):
                    problems.append(f"{record.name} with an identity the customer has not given")
                authenticated = authenticated or (record.ok and record.output == instance.customer.user_id)
                continue
            if not authenticated:
                problems.append(f"{record.name} before the customer was authenticated")
            order_id = record.arguments.get("order_id")
            order_id = order_id if isinstance(order_id, str) else repr(order_id)  # the model may send any JSON
            if record.name == "get_order_details" and record.ok:
                looked_up.add(order_id)
            if record.name in retail_world().write_tools:
                if order_id not in looked_up:
                    problems.append(f"{record.name} on an order not looked up")
                last_user = max((i for i in user_positions if i < position), default=-1)
                if last_user not in self.customer.yes_positions or last_user in writes_since_yes:
                    problems.append(f"{record.name} without the customer's yes right before it")
                writes_since_yes.add(last_user)
                if not record.ok:
                    problems.append(f"{record.name} refused by the environment ({record.output[:80]})")
        return problems

    def grade(self) -> dict[str, Any]:
        """The reward and its parts (computed once the episode is over)."""
        if self._grade is not None:
            return self._grade
        instance = self.instance
        problems = self.procedure_problems()
        lookup = self.call_position("get_order_details", order_id=instance.order_id)
        database_right = self.toolkit.db_hash() == instance.expected_hash()
        action = lookup is not None and database_right
        after = lookup
        if instance.writes:
            after = self.call_position(instance.writes[-1][0], **instance.writes[-1][1])
        outputs = [r.output for r in self.state.tool_calls]
        named = {f"#W{digits}" for reply in self._replies for digits in ORDER_ID.findall(reply.text)}
        user = retail_world().db.users[instance.customer.user_id]
        legit = LegitValues(order_statuses={instance.order_id: {instance.status, instance.told_status}},
                            order_ids=set(user.orders),
                            known_order_ids=set(retail_world().db.orders) | named,
                            address_numbers=LegitValues.numbers_of([instance.customer.zip]))
        replies = Replies(self._replies, outputs, legit)
        told = (replies.tells_status(instance.told_status, after=after, order_id=instance.order_id)
                and not replies.voided(instance.order_id))
        reward = 0.0 if problems else ACTION_SHARE * action + COMMUNICATION_SHARE * (action and told)
        self._grade = {"reward": round(reward, 6), "problems": problems, "looked_up": lookup is not None,
                       "database_right": database_right, "told": told}
        return self._grade

    def get_summary(self) -> dict[str, Any]:
        instance = self.instance
        summary: dict[str, Any] = {"reward": 0.0, "steps": self.state.turns, "success": False,
                                   "termination_reason": self.state.termination_reason,
                                   "format_errors": self.state.format_errors}
        if instance is None:
            return summary
        summary.update(order_id=instance.order_id, order_status=instance.status,
                       decision_class=instance.decision_class,
                       skill_matters={name: self.ablation_decision(name) != instance.decision_class
                                      for name in self.ABLATIONS})
        if self.state.done:
            grade = self.grade()
            summary.update(grade, success=grade["reward"] == 1.0)
        return summary

    # ---- the expert and its ablations ---------------------------------------------------------------
    def oracle_response(self) -> str:
        return self._plan_response(self.instance.decision_class)

    def ablated_response(self, name: str) -> str:
        return self._plan_response(self.ablation_decision(name))

    def _plan_response(self, decision: str) -> str:
        """The expert's next turn when it decides `decision` ("act": confirm, write, report; "refuse": report the
        status): ask who the customer is, look them up, look the order up, then act or refuse."""
        instance, customer = self.instance, self.customer
        if instance is None:
            raise RuntimeError("reset() before oracle_response()")
        if not customer.revealed_identity:
            return "Could you please give me your email address, or your name and zip code, so I can find your account?"
        auth_name, auth_args = instance.customer.auth_call()
        if self.call_position(auth_name, **auth_args) is None:
            return render_tool_call(auth_name, auth_args)
        if self.call_position("get_order_details", order_id=instance.order_id) is None:
            return render_tool_call("get_order_details", {"order_id": instance.order_id})
        if decision == "refuse":
            return instance.refusal
        pending = [w for w in instance.request_writes if not self._attempted(*w)]
        if not pending:
            return instance.report
        last_user = max(i for i, m in enumerate(self.state.messages) if m["role"] == "user")
        if last_user not in customer.yes_positions:
            return instance.confirm
        return render_tool_call(*pending[0])

    def _attempted(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether this call was made (answered by the environment, with success or an error)."""
        return any(r.executed and r.name == name and r.arguments == arguments for r in self.state.tool_calls)
