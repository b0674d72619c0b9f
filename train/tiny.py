"""Build a tiny random-init Qwen3 model and a byte-level BPE tokenizer locally (no hub, no network).

Tests, the CPU demo and GRPO smoke runs need a causal LM that loads with `AutoModelForCausalLM` /
`AutoTokenizer` from a local folder. This module trains a byte-level BPE tokenizer (`tokenizers`) on the
given text, or on a deterministic built-in corpus of English sentences and rendered tool-calling chats,
wraps it as a transformers fast tokenizer with the TRACE chat template, and saves a random-init
`Qwen3ForCausalLM` in fp32 safetensors.

    python -m train.tiny --out runs/tiny [--vocab 1024 --hidden 192 --layers 4 --heads 4 --ffn 576]
                         [--corpus notes.txt chats.jsonl ...] [--seed 0]

A `--corpus` file ending in `.jsonl` holds chat records `{"messages": [...], "tools": [...]}` (rendered with
the chat template first, so the tokenizer learns the real format); any other file is plain UTF-8 text.
The built-in corpus does not depend on `--seed`: the seed only changes the weight initialisation, so
models built with different seeds share one tokenizer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from jinja2.exceptions import TemplateError
from tqdm import tqdm

from common.io import InputError, atomic_write_json, check_output_folder, load_jsonl
from train.chat_template import (
    TOOLS_VIEWS,
    chat_template,
    ENDOFTEXT,
    IM_END,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    render_chat,
    render_tool_call,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

# Written into every built folder; its presence is what allows a rebuild to replace the folder.
BUILD_INFO_FILE = "tiny_build.json"
BUILD_INFO_FORMAT = "trace-tiny-model/1"

BYTE_ALPHABET_SIZE = 256
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
# A "tiny" model's vocabulary: far above what a corpus of this size yields (a few thousand), well below sizes whose
# embedding alone would not fit in memory; --vocab 100000000 is a typo, not a request.
MAX_VOCAB_SIZE = 262_144

# Qwen2/3 pre-tokenizer split: letters keep one leading non-letter (so `"name` or ` the` is one piece),
# digits are split one by one (numbers and ids generalise), newlines group. Then bytes map to symbols.
PRETOKENIZE_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The built-in corpus is generated from this fixed seed, independent of the model seed.
BUILTIN_CORPUS_SEED = 20240601


@dataclass
class TinyModelConfig:
    """Sizes of the tiny model. Defaults are the measured CPU-demo sizing."""

    vocab_size: int = 1024  # target: BPE stops earlier when the corpus has few distinct words
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: same as num_heads (plain multi-head attention)
    intermediate_size: int | None = None  # None: 3 * hidden_size
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise ValueError(f"vocab_size={self.vocab_size:,} is above the maximum {MAX_VOCAB_SIZE:,} of a tiny model; "
                             "use e.g. --vocab 1024 (BPE stops earlier when the corpus has no more merges)")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size={self.vocab_size} is below the minimum {MIN_VOCAB_SIZE} "
                f"({BYTE_ALPHABET_SIZE} byte symbols + {len(SPECIAL_TOKENS) + len(TOOL_TOKENS)} chat tokens); "
                "use e.g. --vocab 512"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}; "
                f"e.g. use --heads {_largest_divisor_at_most(self.hidden_size, self.num_heads)}"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"head_dim = hidden_size / num_heads = {self.hidden_size // self.num_heads} must be even "
                "(rotary embeddings rotate pairs of dimensions); pick hidden_size and num_heads so it is"
            )
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if not isinstance(self.num_kv_heads, int) or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads!r} must be a positive divisor of num_heads={self.num_heads}"
            )
        if self.intermediate_size is None:
            self.intermediate_size = 3 * self.hidden_size
        if not isinstance(self.intermediate_size, int) or self.intermediate_size < 1:
            raise ValueError(f"intermediate_size must be a positive integer, got {self.intermediate_size!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def head_dim(self) -> int:
        """Per-head width of the attention projections."""
        return self.hidden_size // self.num_heads


def _largest_divisor_at_most(number: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if number % d == 0)


# --------------------------------------------------------------------------------------------------
# Built-in corpus
# --------------------------------------------------------------------------------------------------


def _phrases(block: str) -> list[str]:
    """One phrase per non-empty line (keeps the word lists below short to read)."""
    return [line.strip() for line in block.strip().splitlines() if line.strip()]


_FIRST_NAMES = (
    "James Mia Olivia Noah Liam Emma Sophia Lucas Amelia Ethan Yusuf Aarav Chen Fatima Mei Omar Sara Ivan Lena Raj "
    "Anya Mateo Zoe Harper"
).split()
_LAST_NAMES = (
    "Lee Garcia Smith Johnson Brown Kim Nguyen Patel Rossi Silva Khan Müller Novak Ito Hernandez Lopez Wilson Taylor "
    "Moore Clark"
).split()
# (city, airport code)
_CITIES = [
    tuple(pair.split(":"))
    for pair in _phrases("""
        Atlanta:ATL
        Los Angeles:LAX
        Las Vegas:LAS
        New York:JFK
        Seattle:SEA
        Chicago:ORD
        Boston:BOS
        Denver:DEN
        Miami:MIA
        Houston:IAH
        San Francisco:SFO
        Phoenix:PHX
        Dallas:DFW
        Detroit:DTW
    """)
]
# (product, its option names)
_PRODUCTS = [
    (name, options.split(","))
    for name, options in (
        line.split(":")
        for line in _phrases("""
            T-Shirt:color,size,material
            Water Bottle:capacity,color,material
            Laptop:screen size,processor,storage
            Desk Lamp:color,brightness,power source
            Backpack:color,size,compartment
            Running Shoes:size,color,sole
            Coffee Maker:capacity,type,features
            Headphones:type,connectivity,color
            Office Chair:material,color,armrest
            Skateboard:deck material,length,design
        """)
    )
]
_OPTION_VALUES = (
    "red blue black white green small medium large cotton polyester glass steel plastic wireless wired battery USB "
    "LED leather fabric maple bamboo"
).split()
_SUBJECTS = _phrases("""
    the agent
    the customer
    the user
    our team
    the model
    the reviewer
    a traveler
    the support bot
    the developer
    the manager
    each tool
    the system
    every test
    the policy
""")
_VERBS = (
    "checks updates cancels books returns exchanges reads writes verifies explains searches confirms refunds "
    "compares lists transfers finds rejects accepts records"
).split()
_OBJECTS = _phrases("""
    the reservation
    the order
    the flight
    the payment method
    the gift card
    the refund
    the shipping address
    the baggage allowance
    the membership level
    the insurance
    the patch
    the failing test
    the error message
    the file
    the function
    the configuration
    the request
    the travel certificate
    the credit card
    the delivery date
    the item
    the cabin class
""")
_ADVERBIALS = _phrases("""
    before the deadline
    after asking for confirmation
    without changing anything else
    because the policy allows it
    as soon as possible
    for the second time
    in the same cabin
    with the original payment method
    when the user agrees
    only if the order is pending
    to fix the bug
    while the tests run
    once the details are known
    at no extra cost
""")
_CONNECTIVES = ["However,", "Then", "Finally,", "First,", "Meanwhile,", "Therefore,", "Afterwards,", "Also,"]

_SYSTEM_PROMPTS = [
    "You are a customer service agent for an airline. Follow the policy and use the tools to help the user.",
    "You are a retail support agent. Verify the user's identity before you change any order.",
    "You are a helpful assistant that can call tools. Answer briefly.",
    "You are a software engineer fixing a bug in a Python repository. Use the bash tool to inspect files.",
]


def _fn(name: str, description: str, properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_STR = {"type": "string"}
_INT = {"type": "integer"}
_TOOLS: dict[str, dict[str, Any]] = {
    "get_user_details": _fn("get_user_details", "Get the details of a user.", {"user_id": _STR}, ["user_id"]),
    "get_reservation_details": _fn(
        "get_reservation_details", "Get the details of a reservation.", {"reservation_id": _STR}, ["reservation_id"]
    ),
    "search_direct_flight": _fn(
        "search_direct_flight",
        "Search direct flights between two cities on a date.",
        {"origin": _STR, "destination": _STR, "date": _STR},
        ["origin", "destination", "date"],
    ),
    "cancel_reservation": _fn(
        "cancel_reservation", "Cancel the whole reservation.", {"reservation_id": _STR}, ["reservation_id"]
    ),
    "update_reservation_baggages": _fn(
        "update_reservation_baggages",
        "Update the baggage information of a reservation.",
        {"reservation_id": _STR, "total_baggages": _INT, "nonfree_baggages": _INT, "payment_id": _STR},
        ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"],
    ),
    "find_user_id_by_email": _fn("find_user_id_by_email", "Find user id by email.", {"email": _STR}, ["email"]),
    "get_order_details": _fn(
        "get_order_details", "Get the status and details of an order.", {"order_id": _STR}, ["order_id"]
    ),
    "return_delivered_order_items": _fn(
        "return_delivered_order_items",
        "Return some items of a delivered order.",
        {"order_id": _STR, "item_ids": {"type": "array", "items": _STR}, "payment_method_id": _STR},
        ["order_id", "item_ids", "payment_method_id"],
    ),
    "calculate": _fn(
        "calculate", "Calculate the result of a mathematical expression.", {"expression": _STR}, ["expression"]
    ),
    "bash": _fn("bash", "Run a bash command and return its output.", {"command": _STR}, ["command"]),
    "transfer_to_human_agents": _fn(
        "transfer_to_human_agents", "Transfer the user to a human agent.", {"summary": _STR}, ["summary"]
    ),
}
_DOMAIN_TOOLS = {
    "airline": (
        "get_user_details get_reservation_details search_direct_flight cancel_reservation update_reservation_baggages "
        "calculate transfer_to_human_agents"
    ).split(),
    "retail": (
        "find_user_id_by_email get_user_details get_order_details return_delivered_order_items calculate "
        "transfer_to_human_agents"
    ).split(),
    "code": ["bash"],
}
_BASH_COMMANDS = [
    "ls -la",
    "cat setup.py",
    'grep -rn "def parse" src/',
    "python -m pytest tests/test_utils.py -x -q",
    "sed -n 10,40p src/core.py",
    "git diff",
    'find . -name "*.py" | head -20',
    "python reproduce.py",
    "pip show numpy",
    "head -50 README.md",
]


def _user_id(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST_NAMES).lower()}_{rng.choice(_LAST_NAMES).lower()}_{rng.randint(1000, 9999)}"


def _reservation_id(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))


def _order_id(rng: random.Random) -> str:
    return f"#W{rng.randint(1000000, 9999999)}"


def _date(rng: random.Random) -> str:
    return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _sentence(rng: random.Random) -> str:
    text = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ADVERBIALS)}."
    text = text[0].upper() + text[1:]
    if rng.random() < 0.3:
        text = f"{rng.choice(_CONNECTIVES)} {text[0].lower()}{text[1:]}"
    if rng.random() < 0.2:
        text += f" It costs ${rng.randint(5, 900)}.{rng.randint(0, 99):02d} and takes {rng.randint(1, 14)} days."
    return text


def _call(name: str, arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    # Mix the OpenAI nested form and the flat tau2 form: the template accepts both.
    call_id = f"call_{rng.getrandbits(48):012x}"
    if rng.random() < 0.5:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": call_id, "name": name, "arguments": arguments}


def _airline_chat(rng: random.Random) -> list[dict[str, Any]]:
    user_id, reservation_id = _user_id(rng), _reservation_id(rng)
    (city_a, code_a), (city_b, code_b) = rng.sample(_CITIES, 2)
    first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
    date = _date(rng)
    flights = [
        {
            "flight_number": f"HAT{rng.randint(1, 300):03d}",
            "origin": code_a,
            "destination": code_b,
            "scheduled_departure_time_est": f"{rng.randint(5, 22):02d}:00:00",
            "price": rng.randint(80, 1200),
            "available_seats": {"economy": rng.randint(0, 20), "business": rng.randint(0, 9)},
        }
        for _ in range(rng.randint(1, 3))
    ]
    return [
        {
            "role": "user",
            "content": f"Hi, I want to change my flight from {city_a} to {city_b}. My user id is {user_id}.",
        },
        {"role": "assistant", "content": None, "tool_calls": [_call("get_user_details", {"user_id": user_id}, rng)]},
        {
            "role": "tool",
            "content": json.dumps(
                {
                    "user_id": user_id,
                    "name": {"first_name": first, "last_name": last},
                    "membership": rng.choice(["regular", "silver", "gold"]),
                    "reservations": [reservation_id],
                    "payment_methods": {
                        f"credit_card_{rng.randint(1000000, 9999999)}": {
                            "source": "credit_card",
                            "last_four": f"{rng.randint(0, 9999):04d}",
                        }
                    },
                }
            ),
        },
        {
            "role": "assistant",
            "content": f"Thanks, {first}. Let me look for direct flights on {date}.",
            "tool_calls": [_call("search_direct_flight", {"origin": code_a, "destination": code_b, "date": date}, rng)],
        },
        {"role": "tool", "content": json.dumps(flights)},
        {
            "role": "assistant",
            "content": f"I found {len(flights)} direct flight(s). The first one, {flights[0]['flight_number']}, "
            f"costs ${flights[0]['price']}. Would you like me to proceed?",
        },
        {
            "role": "user",
            "content": rng.choice(
                ["Yes, please go ahead.", "No, cancel the reservation instead.", "How much is business class?"]
            ),
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("cancel_reservation", {"reservation_id": reservation_id}, rng)],
        },
        {
            "role": "tool",
            "content": json.dumps(
                {"reservation_id": reservation_id, "status": "cancelled", "refund": rng.randint(50, 900)}
            ),
        },
        {
            "role": "assistant",
            "content": f"Your reservation {reservation_id} is cancelled. "
            "The refund goes back to your original payment method.",
        },
    ]


def _retail_chat(rng: random.Random) -> list[dict[str, Any]]:
    first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
    email = f"{first.lower()}.{last.lower()}{rng.randint(10, 9999)}@example.com"
    user_id, order_id = _user_id(rng), _order_id(rng)
    product, option_names = rng.choice(_PRODUCTS)
    items = [
        {
            "name": product,
            "product_id": str(rng.randint(10**9, 10**10 - 1)),
            "item_id": str(rng.randint(10**9, 10**10 - 1)),
            "price": round(rng.uniform(5, 500), 2),
            "options": {opt: rng.choice(_OPTION_VALUES) for opt in option_names},
        }
        for _ in range(rng.randint(1, 2))
    ]
    payment = f"gift_card_{rng.randint(1000000, 9999999)}"
    return [
        {
            "role": "user",
            "content": f"I'd like to return the {product.lower()} from order {order_id}. My email is {email}.",
        },
        {
            "role": "assistant",
            "content": "Sure. First I need to verify your identity.",
            "tool_calls": [_call("find_user_id_by_email", {"email": email}, rng)],
        },
        {"role": "tool", "content": user_id},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("get_user_details", {"user_id": user_id}, rng),
                _call("get_order_details", {"order_id": order_id}, rng),
            ],
        },
        {
            "role": "tool",
            "content": json.dumps(
                {
                    "user_id": user_id,
                    "payment_methods": {payment: {"source": "gift_card", "balance": rng.randint(0, 300)}},
                }
            ),
        },
        {
            "role": "tool",
            "content": json.dumps({"order_id": order_id, "user_id": user_id, "status": "delivered", "items": items}),
        },
        {
            "role": "assistant",
            "content": f"The order {order_id} was delivered. I can return {len(items)} item(s) to {payment}. "
            "Shall I continue (yes/no)?",
        },
        {"role": "user", "content": "yes"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call(
                    "return_delivered_order_items",
                    {
                        "order_id": order_id,
                        "item_ids": [item["item_id"] for item in items],
                        "payment_method_id": payment,
                    },
                    rng,
                )
            ],
        },
        {"role": "tool", "content": json.dumps({"order_id": order_id, "status": "return requested"})},
        {"role": "assistant", "content": "Done! You will receive an email with the return instructions."},
    ]


def _code_chat(rng: random.Random) -> list[dict[str, Any]]:
    commands = rng.sample(_BASH_COMMANDS, 3)
    error = rng.choice(["KeyError", "TypeError", "ValueError", "AssertionError"])
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"The test suite fails with `{error}: {rng.randint(0, 99)}`. Please fix it."}
    ]
    for command in commands:
        messages.append(
            {
                "role": "assistant",
                "content": rng.choice(["Let me look.", "", "Next I will check this."]) or None,
                "tool_calls": [_call("bash", {"command": command}, rng)],
            }
        )
        messages.append({"role": "tool", "content": f"exit code {rng.choice([0, 0, 1])}\n" + _sentence(rng)})
    messages.append({"role": "assistant", "content": "The bug is fixed and all tests pass now."})
    return messages


def _math_chat(rng: random.Random) -> list[dict[str, Any]]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*"])
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return [
        {"role": "user", "content": f"What is {a} {op} {b}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("calculate", {"expression": f"{a} {op} {b}"}, rng)],
        },
        {"role": "tool", "content": str(result)},
        {"role": "assistant", "content": f"{a} {op} {b} = {result}."},
    ]


def builtin_corpus(num_sentences: int = 600, num_chats: int = 240) -> tuple[list[str], list[dict[str, Any]]]:
    """Deterministic built-in corpus: (English sentences, chat records `{"messages", "tools"}`).

    Generated from a fixed seed so every build gets the same tokenizer.
    """
    rng = random.Random(BUILTIN_CORPUS_SEED)
    texts = []
    for _ in range(num_sentences // 4):
        texts.append(" ".join(_sentence(rng) for _ in range(4)))
    makers = [
        ("airline", _airline_chat, 0),
        ("retail", _retail_chat, 1),
        ("code", _code_chat, 3),
        ("airline", _math_chat, 2),
    ]
    chats = []
    for index in range(num_chats):
        domain, make, system_index = makers[index % len(makers)]
        messages = [{"role": "system", "content": _SYSTEM_PROMPTS[system_index]}] + make(rng)
        tools = [_TOOLS[name] for name in _DOMAIN_TOOLS[domain]]
        chats.append({"messages": messages, "tools": tools})
    # A few direct demonstrations of the call format outside a chat, as the policy will write it.
    texts.append("\n".join(render_tool_call("calculate", {"expression": f"{n} * {n + 1}"}) for n in range(10)))
    return texts, chats


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------

_ADDED_TOKEN_SPLIT = re.compile(
    "|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS + TOOL_TOKENS, key=len, reverse=True))
)


def _training_pieces(texts: Iterable[str]) -> Iterable[str]:
    # At encode time the chat tokens are cut out before BPE runs, so train BPE on the text between them.
    for text in texts:
        for piece in _ADDED_TOKEN_SPLIT.split(text):
            if piece:
                yield piece


def _render_corpus_chats(chats: list[dict[str, Any]], tools_view: str = "full") -> list[str]:
    rendered = []
    for chat in tqdm(chats, desc="render chats", unit="chat", file=sys.stderr, disable=len(chats) < 500):
        rendered.append(render_chat(chat["messages"], chat.get("tools") or None, tools_view=tools_view))
    return rendered


def train_tokenizer(
    corpus_texts: list[str] | None = None,
    chats: list[dict[str, Any]] | None = None,
    *,
    vocab_size: int = 1024,
    min_frequency: int = 2,
    max_length: int = 4096,
    tools_view: str = "full",
) -> "PreTrainedTokenizerFast":
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer with CHAT_TEMPLATE.

    `corpus_texts` are plain strings; `chats` are records `{"messages": [...], "tools": [...]}` rendered with
    the chat template first. With neither, the built-in corpus is used. `tools_view` picks how the template
    lists tool schemas (`train.chat_template.TOOLS_VIEWS`: "full" JSON schemas, or "compact" one-line
    signatures for a model too small to spend ~1,300 prompt tokens on them). `vocab_size` counts everything
    (256 byte symbols, merges, chat tokens); BPE stops earlier when the corpus runs out of pairs seen
    `min_frequency` times. Returns a `PreTrainedTokenizerFast` (eos `<|im_end|>`, pad `<|endoftext|>`).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size={vocab_size} is below the minimum {MIN_VOCAB_SIZE}; use e.g. 512")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    if corpus_texts is None and chats is None:
        corpus_texts, chats = builtin_corpus()
    template = chat_template(tools_view)  # raises on an unknown view before any work
    texts = list(corpus_texts or []) + _render_corpus_chats(list(chats or []), tools_view)
    if not any(text.strip() for text in texts):
        raise ValueError("the tokenizer corpus is empty: pass some text or chats, or neither for the built-in corpus")

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets exact, which assistant-token masks are computed from.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),  # the tool tokens are added after training
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte has a symbol: no unknown tokens
        show_progress=False,
    )
    backend.train_from_iterator(_training_pieces(texts), trainer=trainer)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,  # byte-level: decode must give back the exact text
        model_max_length=max_length,
    )
    tokenizer.chat_template = template
    return tokenizer


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def _make_model(config: TinyModelConfig, tokenizer: "PreTrainedTokenizerFast") -> "Qwen3ForCausalLM":
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    model_config = Qwen3Config(
        vocab_size=len(tokenizer),  # every token id the tokenizer can produce, added tokens included
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(model_config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    return model


def _prepare_out_dir(out_dir: Path) -> None:
    """Refuse to overwrite a folder this module did not build (checked before any work is done)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / BUILD_INFO_FILE).is_file():
        raise InputError(
            f"{out_dir}: folder is not empty and was not built by train.tiny (no {BUILD_INFO_FILE}); "
            "pick another --out or empty it"
        )


def _make_readable(folder: Path) -> None:
    # mkdtemp/mkstemp create owner-only entries; give the build the usual umask permissions instead.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def _replace_dir(built: Path, out_dir: Path) -> None:
    # Move the old build aside first so the final step is one rename; the old copy is deleted afterwards.
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
        os.replace(out_dir, old / "previous")
    os.replace(built, out_dir)
    if old is not None:
        shutil.rmtree(old)


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    corpus_texts: list[str] | None = None,
    chats: list[dict[str, Any]] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    seed: int = 0,
    corpus_info: dict[str, Any] | None = None,
    tools_view: str = "full",
) -> Path:
    """Train the tokenizer, build a random-init Qwen3ForCausalLM and save both to `out_dir`.

    With neither `corpus_texts` nor `chats` the built-in corpus is used. The folder is written to a
    temporary sibling and renamed into place; an existing folder is replaced only if an earlier build
    wrote it (it has tiny_build.json). Returns `out_dir` as a Path.
    """
    config = TinyModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        seed=seed,
    )
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    builtin = corpus_texts is None and chats is None
    tokenizer = train_tokenizer(
        corpus_texts, chats, vocab_size=config.vocab_size, max_length=config.max_position_embeddings,
        tools_view=tools_view,
    )
    model = _make_model(config, tokenizer)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build.", dir=out_dir.parent))
    try:
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        info = {
            "format": BUILD_INFO_FORMAT,
            "config": asdict(config),
            "tokenizer_vocab_size": len(tokenizer),
            "tools_view": tools_view,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "corpus": corpus_info or {"source": "builtin" if builtin else "api"},
        }
        atomic_write_json(staging / BUILD_INFO_FILE, info)
        _make_readable(staging)
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _check_chat_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list) or not record["messages"]:
        raise InputError(f'{where}: expected an object with a non-empty "messages" list')
    for number, message in enumerate(record["messages"]):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f'{where}: messages[{number}] must be an object with a string "role"')
    tools = record.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InputError(f'{where}: "tools" must be a list of JSON schema objects')
    return {"messages": record["messages"], "tools": tools}


def load_corpus_files(paths: list[str | os.PathLike]) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Read `--corpus` files: `.jsonl` → chat records, anything else → plain UTF-8 text.

    Returns (texts, chats, file descriptions with sha256). Problems raise InputError naming the file.
    """
    texts: list[str] = []
    chats: list[dict[str, Any]] = []
    described = []
    for raw_path in paths:
        path = Path(raw_path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: file not found") from None
        except OSError as err:
            raise InputError(f"{path}: cannot read ({err})") from None
        if path.name.endswith(".jsonl"):
            records = load_jsonl(path)
            if not records:
                raise InputError(f"{path}: no chat records")
            for number, record in enumerate(records, start=1):
                chat = _check_chat_record(record, f"{path}: record {number}")
                try:
                    render_chat(chat["messages"], chat["tools"])
                except (TemplateError, TypeError, ValueError) as err:  # odd message shapes: name the record
                    raise InputError(
                        f"{path}: record {number} cannot be rendered with the chat template ({err})"
                    ) from None
                chats.append(chat)
            kind = "chats"
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}: not UTF-8 text ({err})") from None
            if not text.strip():
                raise InputError(f"{path}: empty text file")
            texts.append(text)
            kind = "text"
        described.append({"path": str(path), "kind": kind, "sha256": hashlib.sha256(data).hexdigest()})
    return texts, chats, described


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build a tiny model folder. Returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m train.tiny",
        description="Build a tiny random-init Qwen3 model and BPE tokenizer locally (no network).",
    )
    defaults = TinyModelConfig()
    parser.add_argument("--out", required=True, help="output folder (replaced if an earlier build made it)")
    parser.add_argument("--vocab", type=int, default=defaults.vocab_size, help="target vocabulary size")
    parser.add_argument("--hidden", type=int, default=defaults.hidden_size, help="hidden size")
    parser.add_argument("--layers", type=int, default=defaults.num_layers, help="number of decoder layers")
    parser.add_argument("--heads", type=int, default=defaults.num_heads, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    parser.add_argument("--ffn", type=int, default=None, help="MLP intermediate size (default: 3 x hidden)")
    parser.add_argument(
        "--corpus",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="tokenizer corpus: .jsonl chat records or plain text (default: built-in corpus)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight-initialisation seed")
    parser.add_argument("--tools-view", choices=TOOLS_VIEWS, default="full",
                        help="how the chat template lists tool schemas: full JSON (default) or compact signatures")
    args = parser.parse_args(argv)

    try:
        TinyModelConfig(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            intermediate_size=args.ffn,
            seed=args.seed,
        )
    except ValueError as err:
        print(f"train.tiny: {err}", file=sys.stderr)
        return 2
    try:
        check_output_folder(args.out, "--out")
        corpus_texts, chats, described = load_corpus_files(args.corpus) if args.corpus else (None, None, [])
        _prepare_out_dir(Path(args.out))
    except InputError as err:
        print(f"train.tiny: {err}", file=sys.stderr)
        return 2
    corpus_info = {"source": "files", "files": described} if described else {"source": "builtin"}
    out = build_tiny_model(
        args.out,
        corpus_texts=corpus_texts,
        chats=chats,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.ffn,
        seed=args.seed,
        corpus_info=corpus_info,
        tools_view=args.tools_view,
    )
    info = json.loads((out / BUILD_INFO_FILE).read_text(encoding="utf-8"))
    if info["tokenizer_vocab_size"] < args.vocab:  # said, not silent: the corpus ran out of merges
        print(f"train.tiny: warning: the vocabulary has {info['tokenizer_vocab_size']:,} tokens, fewer than --vocab "
              f"{args.vocab:,}: the corpus has no more merges (a larger --corpus gives more)", file=sys.stderr)
    print(
        f"train.tiny: built {out} (vocab {info['tokenizer_vocab_size']}, {info['num_parameters']:,} parameters)",
        file=sys.stderr,
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
