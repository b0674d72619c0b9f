"""Copy drills: chats whose only skill is repeating a random token string, for a tiny model's first SFT stage.

Why: the demo's recipe-E agent (shipped until 3584465) copied the values its training data makes predictable (an
email, a name from a short list) but not a string it had never seen: `bench/copy_probe.py` found
`get_user_details.user_id` right in 0 of 50 calls although the id is the previous message (it wrote the commonest
surname), and item ids in 3-16%. Asked to repeat random token strings, it stayed near chance (loss 5.4 nats a token
after 254 steps of these drills, 3.9 after 1,265): no general in-context copy (induction) circuit, so what a tool
answer says was copied only where memory already knew it. Small transformers form such a circuit on repeated random
sequences, where nothing but copying lowers the loss; a drill is one such sequence in the agent's chat format:

    user:      Repeat: <s>
    assistant: <s>

`<s>` is 4-24 tokens drawn uniformly from the tokenizer's ordinary tokens (no special or chat token, no piece with
a newline, an angle bracket or a partial UTF-8 character), joined as text: it never spells a chat token and stays
on one line. BPE may merge neighbouring pieces, so the string's tokens are not always the drawn ones; the same
merges happen in the question and the answer (past the question's first word, which joins the space before it).
Every drill from its own `random.Random(f"copy-drill/{seed}/{index}")`, so a record does not depend on `n`.

Measured (README, recipe F): 200,000 drills as the build's first stage, 2,249 steps from the untrained weights,
take the drill loss from 6.9 to 0.59 by step 600 and 0.028 at the end; the finished agent then copies the user id
1.00 and item ids 0.86-0.87 (recipe E: 0.00 and 0.03-0.16).
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
    """`n` drill chats (module docstring), each with `metadata` {seed, index, tokens: how many pieces were drawn}."""
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
