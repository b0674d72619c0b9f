"""Multi-turn episodes: games + a rollout backend + the model's chat template.

`run_episodes` plays many episodes at once. Each turn, every unfinished episode's token ids go to the
backend in one batch; the sampled text becomes an action (`spec.extract_action`), the game answers, and
the answer is appended as tokens. An episode stops on the game's `done`, on `spec.max_turns`, or when
its token budget is spent.

Token bookkeeping is exact: the ids the policy sampled are kept as sampled (loss_mask 1, with their
sampling log-probs); prompt and observation ids get loss_mask 0. Observations are tokenized from the
chat template's own rendering: the text the template adds after an assistant turn is
render(conversation + observation) minus render(conversation), which needs an append-only template
(ours is; a template that rewrites earlier turns raises a clear error here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from benchmarks.results import make_simulation
from common.chat_render import render_messages
from game_registry import Game, GameSpec, prompt_variant
from train.backends import Completion, RolloutBackend, SamplingParams

IM_END = "<|im_end|>"


@dataclass(frozen=True)
class EpisodeRequest:
    seed: int  # the game instance (GRPO groups share a seed)
    sample_idx: int  # index within the group
    hinted: bool = False  # sample with the game's hint prompt
    trial: int = 0  # the customer's wording, for games whose reset takes a trial (the storefront); 0 = default


@dataclass
class Episode:
    request: EpisodeRequest
    game: Game
    tools: list[dict[str, Any]]
    conversation: list[dict[str, Any]]  # what the model saw: system message with base or hint prompt
    token_ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens
    logprobs: list[float]  # sampling log-prob on sampled tokens, 0 elsewhere
    prompt_len: int  # tokens of the initial prompt (system + opening messages)
    n_prompt_messages: int  # messages returned by reset (the prompt)
    n_turns: int = 0
    termination_reason: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        return float(self.summary["reward"])

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


# A conversation on which ChatTokenizer checks that its template renders an observation the same from a window
# (the assistant turn and what answered it) as from the whole conversation: tool calls, grouped tool results,
# plain turns.
_PROBE_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]
_PROBE_CONVERSATION = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Find a."},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "lookup", "arguments": {"key": "a"}}}]},
    {"role": "tool", "content": "{\"a\": 1}"},
    {"role": "tool", "content": "{\"b\": 2}"},
    {"role": "assistant", "content": "Found it."},
    {"role": "user", "content": "Thanks, bye."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [{"type": "function", "function": {
        "name": "lookup", "arguments": "{\"key\": \"c\"}"}}]},
    {"role": "tool", "content": "error: unknown"},
    {"role": "user", "content": "ok"},
]


class ChatTokenizer:
    """Renders conversations with a tokenizer's chat template and tokenizes the pieces.

    Incremental observations (`incremental=True`, the default): the text a turn appends is rendered from a window,
    the assistant turn just taken and the messages that answered it, not from the whole conversation twice
    (which cost ~13% of a storefront rollout and grows with the episode). That gives the same text only for a
    template whose turns render from their neighbours alone (ours, ChatML, Qwen-style tool grouping do; a
    template that rewrites earlier turns or insists on how a conversation starts does not), so at construction the
    window is checked against the whole render on a probe conversation with tool calls, grouped tool results and
    plain turns; any difference, or a template that refuses the window, falls back to whole renders
    (`self.incremental` says which is used).
    """

    def __init__(self, tokenizer: Any, incremental: bool = True):
        self.tokenizer = tokenizer
        self.im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
        if self.im_end_id is None or self.im_end_id == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {IM_END} token; TRACE expects a Qwen-style chat template")
        stop = {self.im_end_id}
        if tokenizer.eos_token_id is not None:
            stop.add(tokenizer.eos_token_id)
        self.stop_token_ids = tuple(sorted(stop))
        self.incremental = incremental and self._window_renders_like_whole()

    def _window_renders_like_whole(self) -> bool:
        """The window's text equals the whole render's for every assistant turn of the probe conversation."""
        from jinja2 import TemplateError

        for end, message in enumerate(_PROBE_CONVERSATION):
            if message["role"] != "assistant" or end + 1 == len(_PROBE_CONVERSATION):
                continue
            n_new = next((k for k in range(end + 1, len(_PROBE_CONVERSATION))
                          if _PROBE_CONVERSATION[k]["role"] == "assistant"), len(_PROBE_CONVERSATION)) - end - 1
            conversation = _PROBE_CONVERSATION[: end + 1 + n_new]
            try:
                whole = self._observation_text(conversation, n_new, _PROBE_TOOLS, window=False)
                window = self._observation_text(conversation, n_new, _PROBE_TOOLS, window=True)
            except (TemplateError, TypeError, ValueError, KeyError):
                return False
            if whole != window:
                return False
        return True

    def _observation_text(self, conversation: list[dict[str, Any]], n_new: int, tools: list[dict[str, Any]],
                          window: bool) -> str:
        """The text the template adds after the assistant turn conversation[-n_new - 1]: its new messages and
        the next generation prompt, rendered from the window or from the whole conversation."""
        if window:
            conversation, tools = conversation[-n_new - 1 :], []
        before = self.render(conversation[: len(conversation) - n_new], tools, generation_prompt=False)
        after = self.render(conversation, tools, generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template is not append-only (rendering one more turn changed earlier text); "
                "multi-turn RL needs a template whose renders extend each other, e.g. train/chat_template.py"
            )
        return after[len(before) :]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool) -> str:
        # The model's own template; tools in Hermes style when it cannot render them (common/chat_render.py).
        return render_messages(self.tokenizer, messages, tools, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode_completion(self, token_ids: Sequence[int]) -> str:
        """Model text of one turn: special tokens (im_end, eos, pad) dropped, tool-call tags kept."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def prompt_ids(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(conversation, tools, generation_prompt=True))

    def observation_ids(
        self, conversation: list[dict[str, Any]], n_new: int, tools: list[dict[str, Any]], stopped: bool
    ) -> list[int]:
        """Tokens that follow a sampled assistant turn: its end marker (if not sampled) + the observation
        messages (the last `n_new` of `conversation`) + the next generation prompt."""
        text = self._observation_text(conversation, n_new, tools, window=self.incremental)
        glue = "\n" if stopped else IM_END + "\n"  # the template writes "<|im_end|>\n" after each assistant turn
        return self.encode(glue + text)


def start_episode(spec: GameSpec, game: Game, request: EpisodeRequest, chat: ChatTokenizer) -> Episode:
    opening = game.reset(request.seed, trial=request.trial) if request.trial else game.reset(request.seed)
    conversation = prompt_variant(opening, spec, request.hinted)
    tools = game.get_tool_schemas()
    ids = chat.prompt_ids(conversation, tools)
    return Episode(
        request, game, tools, conversation, ids, [0] * len(ids), [0.0] * len(ids), len(ids), len(conversation)
    )


MIN_EPISODE_TOKENS = 16  # train.config's floor for max_episode_tokens


def check_prompts_fit(spec: GameSpec, requests: Sequence[EpisodeRequest], chat: ChatTokenizer, max_episode_tokens: int,
                      game_overrides: dict[str, Any] | None = None, flag: str = "--max-episode-tokens") -> None:
    """InputError when `max_episode_tokens` is below the floor or leaves no room after the longest opening prompt
    of `requests` (each distinct task and wording once): such episodes generate nothing and score 0 while the
    run looks normal. The rule of the GRPO trainer's `check_prompts_fit`, for the evaluation and rollout CLIs."""
    from common.validation import InputError

    if isinstance(max_episode_tokens, bool) or not isinstance(max_episode_tokens, int) \
            or max_episode_tokens < MIN_EPISODE_TOKENS:
        raise InputError(f"{flag} must be an integer >= {MIN_EPISODE_TOKENS}, got {max_episode_tokens!r}")
    game = spec.make(**(game_overrides or {}))
    longest, where, seen = 0, None, set()
    for request in requests:
        if (request.seed, request.trial, request.hinted) in seen:
            continue
        seen.add((request.seed, request.trial, request.hinted))
        episode = start_episode(spec, game, request, chat)
        if episode.prompt_len > longest:
            longest, where = episode.prompt_len, request
    if where is not None and longest >= max_episode_tokens:
        raise InputError(
            f"the opening prompt of {spec.name} is {longest} tokens (seed {where.seed}), but {flag} is "
            f"{max_episode_tokens}: no episode could generate a token and every one would score 0. Raise {flag} above "
            f"the prompt (at least {longest + spec.max_gen_tokens} for one full turn of {spec.max_gen_tokens} tokens)")


def run_episodes(
    spec: GameSpec,
    requests: Sequence[EpisodeRequest],
    backend: RolloutBackend,
    chat: ChatTokenizer,
    *,
    temperature: float,
    max_episode_tokens: int,
    game_overrides: dict[str, Any] | None = None,
) -> list[Episode]:
    """Play every request to the end; returns episodes in request order with `summary` filled in."""
    episodes = [start_episode(spec, spec.make(**(game_overrides or {})), r, chat) for r in requests]
    active = [ep for ep in episodes if not _finish_if_over(ep, spec, max_episode_tokens)]
    while active:
        # One batched call samples up to the largest remaining limit; each completion is then cut to its own
        # episode's limit (a prefix of an autoregressive sample is a sample with the shorter limit), so one
        # episode near its token budget does not truncate the turns of the others.
        limits = [max(1, min(spec.max_gen_tokens, max_episode_tokens - len(ep.token_ids))) for ep in active]
        params = SamplingParams(
            max_new_tokens=max(limits),
            temperature=temperature,
            stop_token_ids=chat.stop_token_ids,
        )
        completions = backend.generate([ep.token_ids for ep in active], params)
        still_active = []
        for ep, completion, limit in zip(active, completions, limits):
            if len(completion.token_ids) > limit:
                completion = Completion(completion.token_ids[:limit], completion.logprobs[:limit], "length")
            ep.token_ids.extend(completion.token_ids)
            ep.loss_mask.extend([1] * len(completion.token_ids))
            ep.logprobs.extend(completion.logprobs)
            ep.n_turns += 1
            action = spec.extract_action(chat.decode_completion(completion.token_ids))
            result = ep.game.step(action)
            # The game's log holds the assistant message it derived from the action plus the observations.
            ep.conversation = ep.conversation[:1] + ep.game.get_messages()[1:]
            if _finish_if_over(ep, spec, max_episode_tokens):
                continue
            observation = chat.observation_ids(
                ep.conversation, len(result.observation_messages), ep.tools,
                stopped=completion.finish_reason == "stop" and completion.token_ids[-1] == chat.im_end_id,
            )
            ep.token_ids.extend(observation)
            ep.loss_mask.extend([0] * len(observation))
            ep.logprobs.extend([0.0] * len(observation))
            if not _finish_if_over(ep, spec, max_episode_tokens):
                still_active.append(ep)
        active = still_active
    return episodes


def _finish_if_over(ep: Episode, spec: GameSpec, max_episode_tokens: int) -> bool:
    if ep.game.done:
        ep.termination_reason = "done"
    elif ep.n_turns >= spec.max_turns:
        ep.termination_reason = "max_turns"
    elif len(ep.token_ids) >= max_episode_tokens:
        ep.termination_reason = "max_tokens"
    else:
        return False
    ep.summary = dict(ep.game.get_summary())
    return True


def rescored_under_base_prompt(ep: Episode, spec: GameSpec, chat: ChatTokenizer) -> tuple[list[int], list[int], int]:
    """(token_ids, loss_mask, prompt_len) of a hinted episode with its prompt swapped for the base prompt.

    Everything after the prompt (sampled turns and observations) is kept token for token, so the adapter
    is trained to produce the hinted behaviour without seeing the hint.
    """
    base = prompt_variant(ep.game.get_messages()[:1] + ep.conversation[1:], spec, hinted=False)
    prompt = chat.prompt_ids(base[: ep.n_prompt_messages], ep.tools)
    tail = ep.token_ids[ep.prompt_len :]
    return prompt + tail, [0] * len(prompt) + ep.loss_mask[ep.prompt_len :], len(prompt)



def episode_to_simulation(ep: Episode, sim_id: str | None = None) -> dict[str, Any]:
    """The episode as a τ²-bench results simulation (task_id = seed, trial = sample_idx)."""
    summary = {k: v for k, v in ep.summary.items() if isinstance(v, (str, int, float, bool, type(None), list, dict))}
    return make_simulation(
        task_id=str(ep.request.seed), messages=ep.conversation, reward_info={**summary, "reward": ep.reward},
        termination_reason=ep.termination_reason, trial=ep.request.sample_idx, sample_idx=ep.request.sample_idx,
        seed=ep.request.seed, sim_id=sim_id, hinted=ep.request.hinted, n_turns=ep.n_turns,
        n_generated_tokens=ep.n_generated,
    )
