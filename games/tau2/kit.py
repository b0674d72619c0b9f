"""The kit for capability games on τ²-bench's real domains (retail and airline): their databases, tools, policies and
prompts, a scripted customer, and grading by state.

What a game keeps from its target (`tau2_retail` or `tau2_airline`, benchmarks/tau2_game.py), byte for byte: the
system prompt (τ²-bench's agent instruction and the domain's policy) and the domain's tools with the schemas the
package generates, run by tau2's own environment on a copy of the real database each episode (made at the first
tool call, copy-on-lookup: an entry is copied when a tool first looks it up by id). What the kit adds, so that no
LLM is needed inside a game:

- **An instance** (`Instance`): one real customer of the database and one request about one of their real records
  (an order, a reservation), drawn from `random.Random(seed)`, with its decision class and the writes the request
  needs (none when refusing is right).
- **A scripted customer** (`ScriptedCustomer`): opens with the request (the record's id, the reason), says who they
  are only when asked, answers "yes" only to a confirmation question that names its record and its action and no
  other action or record, repeats the request to any other question, and leaves at the first statement, writing
  τ²-bench's `###STOP###` as the target's customer does.
- **The policy's procedure** (`procedure_problems`), any breach of which makes the reward 0: a call other than the
  customer's authentication before it; an authentication with an identity the customer has not given yet; a write
  on a record not looked up first, a write without the customer's yes right before it, and a write the environment
  refuses (the policies ask to check before acting, not to try and see).
- **Telling** (`told`, per domain): only a statement the customer received reports; it counts when it names the
  record and asserts the right fact (the status a retail order ends with, or why it cannot be; the cabin of an
  airline reservation that cannot be cancelled); a reply asserting a wrong fact or naming a record id that is not
  the customer's (any id-shaped token, real or not) voids the telling; a raw tool dump tells nothing.
- **The expected database**: the instance's writes applied by the same tools to a fresh copy; the episode's
  database must hash the same (nothing else changed, nothing missing).

Reward: 0.6 when the database ends as expected and the record was looked up; +0.4 on top when the outcome was told;
0 on any procedure breach. Success is 1.0. A game subclasses `RetailCapabilityGame` or `AirlineCapabilityGame` with
`draw(rng)` and `ablation_decision(name)`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from benchmarks.storefront.communication import (MAX_COPIED_VALUES, LegitValues, Replies, Reply, asserted_statuses,
                                                copied_values, is_raw_dump)
from benchmarks.storefront.user_sim import AUTH_WORDS, CONFIRM_MARKERS, is_question
from benchmarks.tau2_game import Tau2Game, Tau2Tools, load_domain
from benchmarks.tool_env_game import ToolEnvGame
from common.validation import check_int, check_number
from game_registry import DifficultyKnob, GameSpec, Probe, render_tool_call
from games._storefront.spec import ablation_probes

STOP = "###STOP###"  # τ²-bench's customer ends the conversation with it (tau2.user.base.STOP)
ACTION_SHARE, COMMUNICATION_SHARE = 0.6, 0.4


@dataclass(frozen=True)
class Surface:
    """What a kit game needs to know of a domain: the database's tables (copied on lookup), how a customer is
    authenticated, the read that shows a record and the argument naming it, how record ids look in text, the words
    of each write action (a confirmation naming two actions approves none) and the words of an identity question."""

    domain: str
    tables: tuple[str, ...]
    auth_tools: tuple[str, ...]
    lookup_tool: str
    record_arg: str
    record_id: re.Pattern[str]  # group 1: the id as the database writes it, case-folded for comparison
    action_words: dict[str, tuple[str, ...]]
    identity_words: tuple[str, ...]
    identity_question: str  # how the expert asks who the customer is

    @property
    def target(self) -> str:
        return f"tau2_{self.domain}"

    def ids_in(self, text: str) -> set[str]:
        """The record ids `text` names, each as `key` gives it."""
        return {match.upper() for match in self.record_id.findall(text)}

    def key(self, record_id: str) -> str:
        """A record id as `ids_in` finds it in text ("#W1234567" -> "1234567")."""
        return next(iter(self.ids_in(record_id)), record_id.upper())


RETAIL = Surface(
    domain="retail", tables=("products", "users", "orders"), auth_tools=("find_user_id_by_email", "find_user_id_by_name_zip"),
    lookup_tool="get_order_details", record_arg="order_id", record_id=re.compile(r"(?<![\w])#?[Ww]?(\d{7})\b"),
    action_words={"cancel": ("cancel",), "return": ("return", "refund"), "exchange": ("exchange",),
                  "modify": ("modify", "change", "address", "payment")},
    identity_words=AUTH_WORDS,
    identity_question="Could you please give me your email address, or your name and zip code, so I can find your "
                      "account?")
AIRLINE = Surface(
    domain="airline", tables=("flights", "users", "reservations"), auth_tools=("get_user_details",),
    lookup_tool="get_reservation_details", record_arg="reservation_id",
    # a reservation id: six capitals and digits (8JX2WO, MTCVDL); AirlineCapabilityGame.record_ids_in keeps the
    # tokens with a digit or known to the database (not PLEASE), less the flight numbers (HAT170)
    record_id=re.compile(r"\b([A-Z0-9]{6})\b"),
    action_words={"cancel": ("cancel",), "book": ("book",), "modify": ("modify", "change", "update"),
                  "baggage": ("bag",), "certificate": ("certificate", "compensat")},
    identity_words=("user id", "user-id", "userid", "account", "identify", "verify"),
    identity_question="Could you please give me your user id so I can find your account?")


@dataclass
class KitGameConfig:
    """The episode limits every kit game's config has; a game's config subclasses it and adds shares (class priors,
    difficulty rates), each checked to lie in [0, 1]."""

    max_steps: int = 12
    max_errors: int = 3

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_int(self.max_steps, f"{name}.max_steps", 6)  # the expert needs 6 turns
        check_int(self.max_errors, f"{name}.max_errors", 0)
        for field in dataclasses.fields(self):
            if field.name not in ("max_steps", "max_errors"):
                check_number(getattr(self, field.name), f"{name}.{field.name}", 0.0, 1.0)


@dataclass(frozen=True)
class DomainWorld:
    """A real database, loaded once per process, with the target's prompt, tool schemas and write tools."""

    surface: Surface
    db: Any
    hash: str
    system_prompt: str
    schemas: tuple[dict[str, Any], ...]
    write_tools: frozenset[str]

    def fresh_environment(self) -> Any:
        """An environment on a copy of the real database: each table's entries are copied one by one the first
        time a tool looks them up by id (`CopyOnLookup`), not the whole database up front (a deep copy took 0.07-0.3
        s an episode; the domains' tools change an entry only after looking it up by id)."""
        import importlib

        db = self.db.model_copy()  # a new model holding the same tables, each replaced by a copy-on-lookup view
        for name in self.surface.tables:
            setattr(db, name, CopyOnLookup(getattr(self.db, name)))
        module = importlib.import_module(f"tau2.domains.{self.surface.domain}.environment")
        return module.get_environment(db=db)


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


SURFACES = {surface.domain: surface for surface in (RETAIL, AIRLINE)}


@functools.lru_cache(maxsize=None)
def domain_world(domain: str) -> DomainWorld:
    environment = load_domain(domain).environment()
    target = Tau2Game(domain)
    return DomainWorld(surface=SURFACES[domain], db=environment.tools.db, hash=environment.get_db_hash(),
                       system_prompt=target.get_system_prompt(), schemas=tuple(target.get_tool_schemas()),
                       write_tools=Tau2Tools(environment).write_tools())


@functools.lru_cache(maxsize=4096)
def expected_hash(domain: str, writes: tuple[tuple[str, str], ...]) -> str:
    """The database hash after `writes` ((tool, JSON arguments) pairs) on a fresh copy of the real database."""
    world = domain_world(domain)
    if not writes:
        return world.hash
    tools = Tau2Tools(world.fresh_environment())
    for name, arguments in writes:
        tools.call(name, json.loads(arguments))  # a planned write that fails is a bug of the game: it raises
    return tools.environment.get_db_hash()


@dataclass(frozen=True)
class Customer:
    """A real user of the database as the customer: what they say when asked who they are, the authentication that
    finds them, and numbers of theirs that are no record references (a zip code)."""

    user_id: str
    identity_sentence: str
    auth_tool: str
    auth_args: dict[str, str]
    own_numbers: tuple[str, ...] = ()


def retail_customer(user_id: str, auth: str) -> Customer:
    """A retail user identifying by email (`auth` "email") or by name and zip ("name_zip")."""
    user = domain_world("retail").db.users[user_id]
    first, last, zip_code = user.name.first_name, user.name.last_name, user.address.zip
    if auth == "email":
        return Customer(user_id, f"Sure, my email is {user.email}.", "find_user_id_by_email", {"email": user.email},
                        (zip_code,))
    return Customer(user_id, f"I don't remember my email. I'm {first} {last}, zip code {zip_code}.",
                    "find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": zip_code}, (zip_code,))


def airline_customer(user_id: str) -> Customer:
    """An airline user: the policy asks for the user id, and `get_user_details` finds them."""
    return Customer(user_id, f"Sure, my user id is {user_id}.", "get_user_details", {"user_id": user_id})


@dataclass(frozen=True)
class Instance:
    """One request about one real record. `request_writes`: the calls doing what the customer asks ((tool,
    arguments) pairs), made only in the "act" class; `confirm`: the confirmation question the expert asks before
    them; `report`: the statement telling it was done; `refusal`: the statement telling why it cannot be; `fact`:
    what decides (a retail order's status, an airline reservation's cabin), which the refusal asserts;
    `done_fact`: what the report asserts once done ("cancelled"); `action`: the request's kind."""

    customer: Customer
    record_id: str
    fact: str
    action: str
    opening: str
    decision_class: str
    request_writes: tuple[tuple[str, dict[str, Any]], ...]
    confirm: str
    report: str
    refusal: str
    done_fact: str

    @property
    def writes(self) -> tuple[tuple[str, dict[str, Any]], ...]:
        """The writes the episode must make: the request's when acting is right, none when refusing is."""
        return self.request_writes if self.decision_class == "act" else ()

    @property
    def told_fact(self) -> str:
        """The fact the closing statement must assert."""
        return self.done_fact if self.decision_class == "act" else self.fact


class LazyTools:
    """Tau2Tools on a fresh copy of the real database, made at the first call."""

    def __init__(self, world: DomainWorld) -> None:
        self.world = world
        self._tools: Tau2Tools | None = None

    @property
    def tools(self) -> Tau2Tools:
        if self._tools is None:
            self._tools = Tau2Tools(self.world.fresh_environment())
        return self._tools

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.tools.call(name, arguments)

    def ends_episode(self, name: str) -> bool:
        return False

    def db_hash(self) -> str:
        return self.world.hash if self._tools is None else self._tools.environment.get_db_hash()


class ScriptedCustomer:
    """The customer of one instance (see the module docstring). `yes_positions`: where in the message log the
    customer said yes to a confirmation of its request."""

    def __init__(self, instance: Instance, surface: Surface, record_ids_in: Callable[[str], set[str]]) -> None:
        self.instance, self.surface, self.record_ids_in = instance, surface, record_ids_in
        self.revealed_identity = False
        self.yes_positions: list[int] = []

    def names_only_this_action(self, text: str) -> bool:
        lowered = text.lower()
        named = {action for action, words in self.surface.action_words.items() if any(w in lowered for w in words)}
        return named == {self.instance.action} and self.record_ids_in(text) == {self.surface.key(self.instance.record_id)}

    def respond(self, text: str, position: int) -> tuple[str, bool]:
        """The answer to the agent's reply at `position` of the log, and whether the customer leaves."""
        lowered = text.lower()
        if not is_question(text):
            return f"Thank you, that's all. {STOP}", True
        if any(m in lowered for m in CONFIRM_MARKERS) and self.names_only_this_action(text):
            self.yes_positions.append(position + 1)  # the customer's message comes right after the question
            return "Yes, please go ahead.", False
        if any(w in lowered for w in self.surface.identity_words):
            self.revealed_identity = True
            return self.instance.customer.identity_sentence, False
        return f"I'd just like to {self.instance.action} {self.instance.record_id}, please.", False


class Tau2CapabilityGame(ToolEnvGame):
    """Base of a capability game on a real τ²-bench domain: a subclass draws instances (`draw`) and judges the telling
    (`told`); the kit runs the episode, the customer, the procedure checks, the grading and the expert.

    `DECISION_CLASSES` and `ABLATIONS` ({name: what the expert lacks}) as the storefront games declare them;
    `ablation_decision(name)` says what each ablation decides ("act" or "refuse") on the current instance."""

    SURFACE: Surface = RETAIL
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

    @property
    def world(self) -> DomainWorld:
        return domain_world(self.SURFACE.domain)

    @abstractmethod
    def draw(self, rng: random.Random) -> Instance:
        """The instance of a seed (every choice from `rng`)."""

    @abstractmethod
    def ablation_decision(self, name: str) -> str:
        """What ablation `name` decides on the current instance: "act" or "refuse"."""

    def record_ids_in(self, text: str) -> set[str]:
        """The record ids `text` names (as `Surface.key` writes them)."""
        return self.SURFACE.ids_in(text)

    @abstractmethod
    def told(self, replies: list[Reply], after: int | None) -> bool:
        """Whether a report after position `after` told `instance.told_fact` about the record, with no reply of the
        episode asserting a wrong fact or naming a record that is not the customer's."""

    # ---- episode ----------------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.instance = self.draw(random.Random(seed))
        self.customer = ScriptedCustomer(self.instance, self.SURFACE, self.record_ids_in)
        self._replies, self._grade = [], None
        return self.start_episode(LazyTools(self.world), [{"role": "user", "content": self.instance.opening}])

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        position = len(self.state.messages) - 1  # the reply was just logged
        self._replies.append(Reply(position, text, self.instance.record_id, question=is_question(text)))
        return self.customer.respond(text, position)

    def get_system_prompt(self) -> str:
        return self.world.system_prompt

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self.world.schemas]

    def write_tool_names(self) -> frozenset[str]:
        return self.world.write_tools

    def auth_tool_names(self) -> frozenset[str]:
        return frozenset(self.SURFACE.auth_tools)

    # ---- grading ----------------------------------------------------------------------------------
    def _calls_in_order(self) -> list[tuple[int, Any]]:
        """(position in the log, ToolCallRecord) of every executed call."""
        records = {r.call_id: r for r in self.state.tool_calls if r.executed}
        return [(position, records[call["id"]]) for position, message in enumerate(self.state.messages)
                for call in message.get("tool_calls") or () if call["id"] in records]

    def _authenticates(self, record: Any) -> bool:
        """A successful authentication of this customer (the output is the user id, or the user's record)."""
        if not record.ok:
            return False
        user_id = self.instance.customer.user_id
        try:
            found = json.loads(record.output)
        except json.JSONDecodeError:
            found = record.output
        return found == user_id or (isinstance(found, dict) and found.get("user_id") == user_id)

    def procedure_problems(self) -> list[str]:
        """The policy's procedure, call by call (module docstring); empty when it held."""
        surface, problems = self.SURFACE, []
        authenticated, looked_up = False, set()
        messages = self.state.messages
        user_positions = [i for i, m in enumerate(messages) if m["role"] == "user"]
        writes_since_yes: set[int] = set()
        for position, record in self._calls_in_order():
            if record.name in surface.auth_tools:
                said = " ".join(messages[i]["content"] for i in user_positions if i < position)
                if not all(str(v) and str(v) in said for v in record.arguments.values()):
                    problems.append(f"{record.name} with an identity the customer has not given")
                authenticated = authenticated or self._authenticates(record)
                continue
            if not authenticated:
                problems.append(f"{record.name} before the customer was authenticated")
            record_id = record.arguments.get(surface.record_arg)
            record_id = record_id if isinstance(record_id, str) else repr(record_id)  # the model may send any JSON
            if record.name == surface.lookup_tool and record.ok:
                looked_up.add(record_id)
            if record.name in self.world.write_tools:
                if record_id not in looked_up:
                    problems.append(f"{record.name} on a record not looked up")
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
        instance, surface = self.instance, self.SURFACE
        problems = self.procedure_problems()
        lookup = self.call_position(surface.lookup_tool, **{surface.record_arg: instance.record_id})
        writes = tuple((name, json.dumps(args, sort_keys=True)) for name, args in instance.writes)
        database_right = self.toolkit.db_hash() == expected_hash(surface.domain, writes)
        action = lookup is not None and database_right
        after = lookup
        if instance.writes:
            after = self.call_position(instance.writes[-1][0], **instance.writes[-1][1])
        told = self.told(self._replies, after)
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
        summary.update(record_id=instance.record_id, fact=instance.fact, decision_class=instance.decision_class,
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
        """The expert's next turn when it decides `decision` ("act": confirm, write, report; "refuse": tell why
        not): ask who the customer is, authenticate them, look the record up, then act or refuse."""
        instance, customer, surface = self.instance, self.customer, self.SURFACE
        if instance is None:
            raise RuntimeError("reset() before oracle_response()")
        if not customer.revealed_identity:
            return surface.identity_question
        auth = instance.customer
        if self.call_position(auth.auth_tool, **auth.auth_args) is None:
            return render_tool_call(auth.auth_tool, auth.auth_args)
        if self.call_position(surface.lookup_tool, **{surface.record_arg: instance.record_id}) is None:
            return render_tool_call(surface.lookup_tool, {surface.record_arg: instance.record_id})
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


def tool_outputs(records: list[Any]) -> list[str]:
    """Every tool answer of the episode, also in compact JSON: τ²-bench's answers are spaced JSON (`"a": "b"`), and
    the storefront's rules find copied values in compact JSON (`"a":"b"`), so both forms go to them."""
    outputs = [r.output for r in records]
    compact = []
    for output in outputs:
        try:
            compact.append(json.dumps(json.loads(output), separators=(",", ":"), ensure_ascii=False))
        except json.JSONDecodeError:
            continue
    return outputs + compact


class RetailCapabilityGame(Tau2CapabilityGame):
    """A game on the real retail domain; telling is judged with the storefront's rules on order statuses."""

    SURFACE = RETAIL

    def told(self, replies: list[Reply], after: int | None) -> bool:
        instance, db = self.instance, self.world.db
        outputs = tool_outputs(self.state.tool_calls)
        named = {f"#W{digits}" for reply in replies for digits in RETAIL.record_id.findall(reply.text)}
        # The statuses before and after the instance's writes (the storefront's rule): the status a write leaves is
        # true only where the instance makes that write, so "cancelled" on an order that must not be is a false claim.
        statuses = {instance.fact} | ({instance.done_fact} if instance.writes else set())
        legit = LegitValues(order_statuses={instance.record_id: statuses},
                            order_ids=set(db.users[instance.customer.user_id].orders),
                            known_order_ids=set(db.orders) | named,  # any #W-shaped id the agent names
                            address_numbers=set(instance.customer.own_numbers))
        judged = Replies(replies, outputs, legit)
        return (judged.tells_status(instance.told_fact, after=after, order_id=instance.record_id)
                and not judged.voided(instance.record_id))


@functools.lru_cache(maxsize=None)
def flight_numbers() -> frozenset[str]:
    return frozenset(number.upper() for number in domain_world("airline").db.flights)


CABINS = ("basic economy", "economy", "business")
_CABIN = re.compile(r"(?:\b([\w']+)\s+)?\b(basic[\s_]economy|economy|business)\b", re.IGNORECASE)
_NOT_ASSERTED_AFTER = ("be", "been", "not", "only", "no", "isn't", "wasn't", "never", "or")


_REFERENCE = re.compile(r"\b(?:reservations?|bookings?)(?:\s+(?:id|number|code)\b)?\s*[:#]?\s*([A-Za-z0-9]+)",
                        re.IGNORECASE)


def referenced_reservations(text: str) -> set[str]:
    """The tokens `text` names as a reservation ("reservation 1Y36Z", "booking #ABC123"): any with a digit or in
    capitals, well formed or not (a guessed id one digit off is a reference too)."""
    return {token.upper() for token in _REFERENCE.findall(text)
            if any(c.isdigit() for c in token) or (len(token) >= 3 and token.isupper())}


def asserted_cabins(text: str) -> set[str]:
    """The cabins `text` asserts; one right after "only", "not", "be", ... is no assertion ("only business
    reservations can be cancelled"), and "economy" inside "basic economy" is basic economy."""
    found = set()
    for match in _CABIN.finditer(text):
        cabin = re.sub(r"[\s_]+", " ", match.group(2).lower())
        if (match.group(1) or "").lower() in _NOT_ASSERTED_AFTER:
            continue
        found.add(cabin)
    return found


class AirlineCapabilityGame(Tau2CapabilityGame):
    """A game on the real airline domain. Telling: a report (a statement the customer received, no tool dump, fewer
    than MAX_COPIED_VALUES values copied from tool answers) after `after` names the reservation and asserts the told fact ("cancelled" once cancelled; the cabin when
    refusing); any reply asserting another cabin than the reservation's, naming a reservation id that is not the
    customer's, or claiming a cancellation the instance does not make, voids it."""

    SURFACE = AIRLINE

    def record_ids_in(self, text: str) -> set[str]:
        """Reservation ids named in `text`: six capitals and digits with a digit or known to the database (a word
        in capitals is none), and not a flight number (HAT170 has the same shape)."""
        reservations = self.world.db.reservations
        return {token for token in AIRLINE.ids_in(text)
                if any(c.isdigit() for c in token) or token in reservations} - flight_numbers()

    def told(self, replies: list[Reply], after: int | None) -> bool:
        instance, db = self.instance, self.world.db
        outputs = tool_outputs(self.state.tool_calls)
        copied = {value.lower() for value in copied_values(outputs)}
        own = {rid.upper() for rid in db.users[instance.customer.user_id].reservations}
        cabin = db.reservations[instance.record_id].cabin.replace("_", " ")
        judged = [r for r in replies if not is_raw_dump(r.text, outputs)]
        if any(referenced_reservations(r.text) - own or self.record_ids_in(r.text) - own
               or asserted_cabins(r.text) - {cabin}
               # a cancellation claimed where the instance makes none (the storefront's rule on a status claim)
               or (not instance.writes and "cancelled" in asserted_statuses(r.text)) for r in judged):
            return False
        rid = AIRLINE.key(instance.record_id)
        reports = [r for r in judged if not r.question and after is not None and r.position > after
                   and rid in self.record_ids_in(r.text)
                   and sum(value in r.text.lower() for value in copied) < MAX_COPIED_VALUES]  # a list of copies
        if instance.told_fact == "cancelled":
            return any(re.search(r"\bcancell?ed\b", r.text, re.IGNORECASE) and not re.search(
                r"\b(not|cannot|can't|be)\s+(been\s+)?cancell?ed\b", r.text, re.IGNORECASE) for r in reports)
        return any(instance.told_fact in asserted_cabins(r.text) for r in reports)


def kit_game_spec(game_class: type[Tau2CapabilityGame], config_class: type[KitGameConfig], capability: str, *,
                  hint: str, difficulty_knobs: tuple[DifficultyKnob, ...], probes: tuple[Probe, ...] = ()) -> GameSpec:
    """The GameSpec of a kit game (what each game file registers): named `tau2_<domain>_<capability>`, the target's
    own prompt (the game gives it), `hint` as the hint prompt, its domain's target for the tool check, and the
    ablations and decision classes the game class declares."""
    return GameSpec(
        name=f"{game_class.SURFACE.target}_{capability}",
        make_env=game_class,  # game_class(config), config None for the defaults
        hint_prompt=hint,
        max_gen_tokens=256,
        max_turns=config_class().max_steps,
        capability=capability,
        config_cls=config_class,
        target=game_class.SURFACE.target,
        difficulty_knobs=difficulty_knobs,
        probes=probes,
        ablations=ablation_probes(game_class.ABLATIONS),
        decision_classes=game_class.DECISION_CLASSES,
    )
