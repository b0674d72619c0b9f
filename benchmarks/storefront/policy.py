"""The storefront's written policy: the agent's system prompt.

Kept short on purpose (about 700 characters): the CPU demo trains a ~2M-parameter model that has to
learn it. The tools do not enforce it; the reward does (benchmarks/storefront/compliance.py checks the
procedure, communication.py what the user is told).
"""
from __future__ import annotations

_RULES = (
    "- First authenticate the user: find their user id by email, or by name and zip.",
    "- Look up an order before changing it. If the user does not know the order id, look through their orders.",
    "- Only pending orders can be cancelled or have their address changed.",
    "- Only delivered orders can be returned or exchanged.",
    "- Refunds go to the order's original payment method (see payment_history), or to the user's gift card if asked.",
    "- If a request is not allowed, do not change anything; tell the user the order status.",
    "- Order ids start with '#'. Write amounts like 123.45.",
)
_CONFIRM_RULE = "- Before any change, say what you will do and get the user's explicit yes."
_LAST_RULE = "- Handle every request the user makes. One tool call per turn."


def policy_text(require_confirmation: bool = True) -> str:
    """The policy, with or without the confirmation rule (StorefrontConfig.require_confirmation)."""
    rules = [*_RULES, *((_CONFIRM_RULE,) if require_confirmation else ()), _LAST_RULE]
    return "You are a store support agent. Policy:\n" + "\n".join(rules)


POLICY = policy_text(True)

# Appended instead of nothing for hinted rollouts (GameSpec.hint_prompt): what an expert checks.
HINT = ("Hint: call get_order_details and read status before any write; take the refund payment_method_id "
        "from payment_history; write order ids with '#'; use the exact reason words; ask 'Shall I proceed?' "
        "before each change; finish every request.")
