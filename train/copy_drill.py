"""Copy drills: chats whose only skill is repeating a random token string, for a tiny model's first SFT stage.

Why: the demo's base agent copies the values its training data makes predictable (an email, a name from a short
list) but not a string it has never seen: `bench/copy_probe.py` finds `get_user_details.user_id` right in 0 of 50
calls although the id is the previous message (it writes the commonest surname), and item ids in 3-16%. Asked to
repeat random token strings, the shipped agent is near chance (loss 5.4 nats a token after 254 steps of this
drill), i.e. it has no general in-context copy (induction) circuit: what a tool answer says is copied only where
memory already knows it. Small transformers form such a circuit on repeated random sequences, where nothing but
copying lowers the loss; a drill is one such sequence in the agent's chat format:

    user:      Repeat: <s>
    assistant: <s>

`<s>` is 4-24 tokens drawn uniformly from the tokenizer's ordinary tokens (no special or chat tokens, no token
with a newline or an angle bracket, so the text re-tokenizes to the same pieces and never spells a chat token),
joined as text. Every drill from its own `random.Random((seed, index))`, so a record does not depend on `n`.
"""
from __future__ import annotations

import random
from typing import Any

from common.validation import InputError

PROMPT = "Repeat: "
MIN_TOKENS = 4
MAX_TOKENS = 24


def drill_pieces(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's ordinary tokens a drill draws from (sorted by token id)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    pieces = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if text.strip() and not any(c in text for c in "\r\n<>") and "\ufffd" not in text:
            pieces.append(text)
    if len(pieces) < 2:
        raise InputError(f"the tokenizer has {len(pieces)} ordinary token(s) to draw copy drills from; a drill needs "
                         "a vocabulary (build the tokenizer on more text)")
    return pieces


def make_copy_drills(n: int, seed: int, tokenizer: Any) -> list[dict[str, Any]]:
    """`n` drill chats (module docstring), each with `metadata` {seed, index, tokens}."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"the number of copy drills must be an int >= 0, got {n!r}")
    pieces = drill_pieces(tokenizer)
    records = []
    for index in range(n):
        rng = random.Random(f"copy-drill/{seed}/{index}")
        count = rng.randint(MIN_TOKENS, MAX_TOKENS)
        text = "".join(rng.choice(pieces) for _ in range(count)).strip()
        records.append({"messages": [{"role": "user", "content": PROMPT + text},
                                     {"role": "assistant", "content": text}],
                        "metadata": {"seed": seed, "index": index, "tokens": count}})
    return records
