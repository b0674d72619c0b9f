"""ChatTokenizer's incremental observations: the tokens a turn appends, rendered from the window (the assistant
turn and what answered it), equal the whole conversation's render on every turn of every registered game."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from game_registry import get_game, list_games
from train.backends import HFBackend
from train.chat_template import chat_template
from train.episodes import ChatTokenizer, EpisodeRequest, run_episodes
from train.policy import load_base_model

REPO = Path(__file__).resolve().parent.parent
DEMO_AGENT = REPO / "assets/demo_base_agent"


class CheckedChat(ChatTokenizer):
    """Incremental, and every observation is also rendered whole: the two must give the same token ids."""

    checked = 0

    def observation_ids(self, conversation, n_new, tools, stopped):
        ids = super().observation_ids(conversation, n_new, tools, stopped)
        self.incremental = False
        try:
            whole = super().observation_ids(conversation, n_new, tools, stopped)
        finally:
            self.incremental = True
        assert ids == whole, (conversation[-n_new - 1 :], ids, whole)
        self.checked += 1
        return ids


def _games():
    import toy_games

    games = [(name, get_game(name), {}) for name in list_games()]
    games.append(("vault", toy_games.make_spec(max_turns=4), {}))
    storefront = yaml.safe_load((REPO / "configs/storefront/cpu_demo.yaml").read_text())
    return [(name, spec, storefront if name == "storefront" else overrides) for name, spec, overrides in games]


@pytest.mark.parametrize("name, spec, overrides", _games(), ids=lambda value: value if isinstance(value, str) else "")
def test_window_renders_equal_whole_renders_on_every_turn(name, spec, overrides):
    model, tokenizer = load_base_model(str(DEMO_AGENT))
    chat = CheckedChat(tokenizer)
    assert chat.incremental  # the project's template passes the probe
    requests = [EpisodeRequest(seed, 0) for seed in (11, 12)]
    episodes = run_episodes(spec, requests, HFBackend(model, tokenizer.pad_token_id, seed=4), chat, temperature=1.0,
                            max_episode_tokens=1400, game_overrides=overrides)
    assert chat.checked >= sum(ep.n_turns - 1 for ep in episodes) and chat.checked > 0, name


def test_a_template_that_reads_the_whole_conversation_falls_back_to_whole_renders():
    _, tokenizer = load_base_model(str(DEMO_AGENT))
    template = chat_template("compact")
    generation_prompt = "{%- if add_generation_prompt -%}\n    {{- '<|im_start|>assistant\\n' -}}"
    assert generation_prompt in template
    counting = copy.deepcopy(tokenizer)  # the generation prompt says how many messages came before
    counting.chat_template = template.replace(generation_prompt,
                                              generation_prompt + "\n    {{- messages | length | string -}}")
    assert ChatTokenizer(tokenizer).incremental
    assert not ChatTokenizer(counting).incremental
    assert not ChatTokenizer(tokenizer, incremental=False).incremental
