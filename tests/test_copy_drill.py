"""Copy drills (train/copy_drill.py): random token strings to repeat, in the chat format SFT trains on."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from common.validation import InputError
from train.copy_drill import MAX_TOKENS, MIN_TOKENS, PROMPT, drill_pieces, make_copy_drills
from train.sft import tokenize_chats


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_a_drill_asks_to_repeat_a_string_and_the_answer_repeats_it(tokenizer):
    drills = make_copy_drills(200, 7, tokenizer)
    pieces = set(drill_pieces(tokenizer))
    for record in drills:
        user, assistant = record["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert user["content"] == PROMPT + assistant["content"] and assistant["content"]
        assert MIN_TOKENS <= record["metadata"]["tokens"] <= MAX_TOKENS
    # the strings are random: hardly any repeats, and no piece is a special token
    assert len({r["messages"][1]["content"] for r in drills}) == len(drills)
    special = {tokenizer.decode([i]) for i in set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)}
    assert not pieces & special and len(pieces) > 100
    # no newline (the chat template's turn structure) or angle bracket (chat and tool tokens are spelled with them)
    assert all(piece.strip() and not set(piece) & set("\r\n<>") for piece in pieces)


def test_the_answer_is_the_same_tokens_as_the_string_in_the_question(tokenizer):
    """Copying token by token is the whole skill: past its first word (which joins the space before it in the
    question, and so may be cut into other pieces there), the string has the same tokens in the question as in the
    answer."""
    pre_tokenize = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
    compared = 0
    for record in make_copy_drills(200, 11, tokenizer):
        question, answer = (tokenizer(m["content"], add_special_tokens=False)["input_ids"] for m in record["messages"])
        first_word = pre_tokenize(record["messages"][1]["content"])[0][0]
        rest = answer[len(tokenizer.backend_tokenizer.model.tokenize(first_word)):]
        assert question[len(question) - len(rest):] == rest
        compared += len(rest)
    assert compared > 200 * (MIN_TOKENS - 1)  # most of every string is compared


def test_the_trained_tokens_are_the_string_and_spell_no_chat_token(tokenizer):
    """What SFT trains on is the repeated string (plus the end of the turn); the string re-tokenizes into ordinary
    tokens only, so a drill never writes a chat or tool token."""
    drills = make_copy_drills(50, 1, tokenizer)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    for record, chat in zip(drills, tokenize_chats(tokenizer, drills, progress=False)):
        trained = [t for t, m in zip(chat.input_ids, chat.assistant_mask) if m]
        text = record["messages"][1]["content"]
        assert tokenizer.decode(trained).startswith(text)
        string_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert not set(string_ids) & special


def test_drills_are_reproducible_per_index_and_seeded(tokenizer):
    assert make_copy_drills(30, 3, tokenizer) == make_copy_drills(60, 3, tokenizer)[:30]
    assert make_copy_drills(30, 3, tokenizer) != make_copy_drills(30, 4, tokenizer)
    assert make_copy_drills(0, 3, tokenizer) == []
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError, match="copy drills must be an int >= 0"):
            make_copy_drills(bad, 0, tokenizer)
