"""The built-in corpus the tiny model's tokenizer is trained on (`python -m train.tiny` without --corpus):
English sentences and tool-use chats in the airline, retail, code and math domains, drawn from word lists with
a fixed seed, so every build gets the same tokenizer."""
from __future__ import annotations

import json
import random
from typing import Any

from train.chat_template import render_tool_call

# The built-in corpus is generated from this fixed seed, independent of the model seed.
BUILTIN_CORPUS_SEED = 20240601


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
