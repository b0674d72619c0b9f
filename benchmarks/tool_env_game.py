"""The episode loop shared by τ²-bench-style tool-use games: `ToolEnvGame`, a message-log game over a
`Toolkit` (benchmarks/toolkit.py).

It keeps the message log, counts turns, executes tool calls with `call_<turn>_<i>` ids, handles format errors
and termination. A subclass supplies the toolkit, the task, the user simulator (`respond_to_user`), the reward
(`get_summary`) and the expert (`oracle_response`).
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from game_registry import Action, Game, StepResult


from benchmarks.toolkit import Toolkit

# --------------------------------------------------------------------------------------------------
# The episode loop shared by tool-use games
# --------------------------------------------------------------------------------------------------
FORMAT_ERROR_TEMPLATE = (
    "[format error] {why}. Call a tool with <tool_call>{{...}}</tool_call> or reply in plain text."
)


@dataclass
class ToolCallRecord:
    """One executed tool call, kept by ToolEnvGame for rewards and oracles."""

    turn: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    output: str
    ok: bool  # False when the call raised ValueError (the output then starts with "Error: ")
    executed: bool = True  # False for a call past the turn's limit: answered with an error, never run


@dataclass
class EpisodeState:
    """Bookkeeping of one episode (reset by `ToolEnvGame.start_episode`)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0  # assistant turns taken
    format_errors: int = 0
    format_error_turns: list[int] = field(default_factory=list)  # the turns that could not be parsed
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    done: bool = False
    termination_reason: str = ""  # user_stop | max_steps | too_many_errors | transfer | agent_stop (subclass)


class ToolEnvGame(Game):
    """Base class of τ²-style games: the model talks to a simulated user and calls tools.

    Subclasses implement `reset` (build the DB, the toolkit and the task, then call `start_episode`),
    `get_system_prompt`, `respond_to_user`, `get_summary` and `oracle_response`. This class owns the
    message log, the turn count and termination:
      - tool calls get ids `call_<turn>_<i>` and run through the toolkit; a ValueError becomes the tool
        message "Error: <msg>", any other exception propagates (it is a bug);
      - a reply goes to `respond_to_user`, whose message (if any) is appended as the user's turn;
      - a malformed action gets a "[format error] ..." user message and counts toward `max_errors`;
        the episode ends when the count exceeds `max_errors`; a turn longer than `max_turn_chars`
        characters is malformed too (and kept cut in the log);
      - at most `max_calls_per_turn` tool calls run per turn (the written policy says one): each extra
        call is not executed, gets an error tool message and counts as a failed call;
      - a tool output longer than `max_observation_chars` is cut (a 100k-character argument echoed in an
        error would otherwise flood the context);
      - a successful call of a tool declared `@tool(ends_episode=True)` (a transfer to a human) ends it;
      - the episode ends after `max_steps` assistant turns.
    """

    # The Toolkit subclass the game uses: lets `get_tool_schemas()` answer before the first reset.
    toolkit_class: type[Toolkit] | None = None

    def __init__(self, max_steps: int = 12, max_errors: int = 3, max_calls_per_turn: int = 1,
                 max_observation_chars: int = 2000, max_turn_chars: int = 4000) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        if not isinstance(max_errors, int) or max_errors < 0:
            raise ValueError(f"max_errors must be an int >= 0, got {max_errors!r}")
        for name, value in (("max_calls_per_turn", max_calls_per_turn), ("max_observation_chars", max_observation_chars),
                            ("max_turn_chars", max_turn_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.max_calls_per_turn = max_calls_per_turn
        self.max_observation_chars = max_observation_chars
        self.max_turn_chars = max_turn_chars
        self.toolkit: Toolkit | None = None
        self.state = EpisodeState()

    # ---- for subclasses -------------------------------------------------------------------------
    def start_episode(self, toolkit: Toolkit, opening: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Begin a new episode with `toolkit`; the log starts with the system prompt then `opening`."""
        self.toolkit = toolkit
        self.state = EpisodeState(messages=[{"role": "system", "content": self.get_system_prompt()}, *opening])
        return self.get_messages()

    @abstractmethod
    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        """The simulated user's answer to an assistant reply: (message or None, episode over?)."""

    def call_position(self, name: str, **match: Any) -> int | None:
        """Index in the message log of the first successful call of `name` whose arguments include `match`
        (None when there is none): replies after it can report on it."""
        ids = {r.call_id for r in self.state.tool_calls
               if r.ok and r.name == name and all(r.arguments.get(k) == v for k, v in match.items())}
        if not ids:
            return None
        return next(index for index, message in enumerate(self.state.messages)
                    if any(call.get("id") in ids for call in message.get("tool_calls") or ()))

    def _cap(self, text: str) -> str:
        """A tool output cut to `max_observation_chars` (with a marker saying how much was dropped)."""
        if len(text) <= self.max_observation_chars:
            return text
        return f"{text[: self.max_observation_chars]} [cut {len(text) - self.max_observation_chars} characters]"

    def end_episode(self, reason: str) -> None:
        """Mark the episode over (idempotent: the first reason is kept)."""
        if not self.state.done:
            self.state.done = True
            self.state.termination_reason = reason

    # ---- Game protocol --------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def termination_reason(self) -> str:
        return self.state.termination_reason

    def _toolkit_source(self) -> type[Toolkit] | Toolkit | None:
        return self.toolkit if self.toolkit is not None else self.toolkit_class

    def write_tool_names(self) -> frozenset[str] | None:
        source = self._toolkit_source()
        return None if source is None else source.write_tools()

    def auth_tool_names(self) -> frozenset[str] | None:
        source = self._toolkit_source()
        return None if source is None else source.auth_tools()

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        """Schemas of the current toolkit, or of `toolkit_class` before the first reset."""
        source = self.toolkit if self.toolkit is not None else self.toolkit_class
        if source is None:
            raise RuntimeError(f"{type(self).__name__}: set the class attribute toolkit_class, or call reset() "
                               "before asking for tool schemas")
        return source.schemas()

    def get_messages(self) -> list[dict[str, Any]]:
        # Copy each message and its tool calls so callers cannot edit the log; no full deep copy (speed).
        out = []
        for message in self.state.messages:
            copy = dict(message)
            if "tool_calls" in copy:
                copy["tool_calls"] = [{**c, "arguments": dict(c["arguments"])} for c in copy["tool_calls"]]
            out.append(copy)
        return out

    def step(self, action: Action) -> StepResult:
        """Apply one assistant action (see the class docstring for the rules)."""
        if self.toolkit is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()")
        if self.state.done:
            raise RuntimeError(f"{type(self).__name__}: the episode is over ({self.state.termination_reason}); "
                               "call reset() to start another")
        state = self.state
        turn = state.turns
        state.turns += 1
        observations: list[dict[str, Any]] = []
        if len(action.raw) > self.max_turn_chars:
            action = Action(kind="malformed", raw=action.raw[: self.max_turn_chars] + " [cut]",
                            error=f"the turn is {len(action.raw)} characters long; the limit is {self.max_turn_chars}")
        if action.kind == "tool_call":
            for index, call in enumerate(action.tool_calls):
                call.id = f"call_{turn}_{index}"
            state.messages.append(action.to_message())
            for index, call in enumerate(action.tool_calls):
                if index >= self.max_calls_per_turn or state.done:
                    output, ok, executed = (f"Error: not executed: the policy allows {self.max_calls_per_turn} tool "
                                            "call(s) per turn; make this call in a later turn"), False, False
                else:
                    executed = True
                    try:
                        output, ok = self._cap(self.toolkit.call(call.name, call.arguments)), True
                    except ValueError as err:
                        output, ok = self._cap(f"Error: {err}"), False
                state.tool_calls.append(ToolCallRecord(turn, call.id, call.name, call.arguments, output, ok, executed))
                observations.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": output})
                if ok and self.toolkit.ends_episode(call.name):
                    self.end_episode("transfer")
        elif action.kind == "reply":
            state.messages.append(action.to_message())
            user_message, user_done = self.respond_to_user(action.content)
            if user_message is not None:
                observations.append({"role": "user", "content": user_message})
            if user_done:
                self.end_episode("user_stop")
        else:  # malformed: the model sees why, and it counts toward max_errors
            state.messages.append(action.to_message())
            state.format_errors += 1
            state.format_error_turns.append(turn)
            why = (action.error or "the output could not be parsed").rstrip(".")
            observations.append({"role": "user", "content": FORMAT_ERROR_TEMPLATE.format(why=why)})
            if state.format_errors > self.max_errors:
                self.end_episode("too_many_errors")
        state.messages.extend(observations)
        if not state.done and state.turns >= self.max_steps:
            self.end_episode("max_steps")
        reward = float(self.get_summary()["reward"]) if state.done else 0.0
        info = {"turn": turn, "termination_reason": state.termination_reason}
        return StepResult(observation_messages=[dict(m) for m in observations], reward=reward, done=state.done,
                          info=info)
