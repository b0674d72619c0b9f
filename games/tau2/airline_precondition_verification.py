"""Capability game `precondition_verification` on τ²-bench's real airline domain (`tau2_airline_precondition_verification`):
check a reservation against the cancellation rules before cancelling it.

Each episode is one user of the real airline database asking to cancel one of their real reservations because their
plans changed. The airline policy allows it (for a reason insurance does not cover) when the reservation is in
business class or was booked in the last 24 hours (the policy's clock: 2024-05-15 15:00 EST); otherwise the agent
must refuse. Reservations with a flight already flown or cancelled by the airline (other rules: a transfer, a
refund) are never drawn. `cancel_reservation` itself checks nothing (the policy says so), so the only way to know is
`get_reservation_details`: its cabin and its creation time.

Two classes, level by `refuse_share` (a class prior): `act` (confirm, cancel, say it is cancelled) and `refuse`
(say the reservation's cabin and that it cannot be cancelled, change nothing). Of the `act` instances,
`recent_share` are economy bookings made in the last 24 hours, so the booking time matters and not only the cabin.
Ablations: `always_act` (confirms and cancels whatever the reservation) and `always_refuse` (looks up and refuses);
each wins exactly its class.

Expert (oracle): ask for the user id, get the user's details, get the reservation's, then either confirm, cancel and
say it is cancelled (6 turns) or say its cabin and that it cannot be cancelled (4 turns).

Reward (games/tau2/kit.py): 0.6 when the database ends as expected and the reservation was looked up, +0.4 when a
statement after the cancel (or the look-up, when refusing) names the reservation and asserts "cancelled" (or its
cabin); 0 on any breach of the procedure. Success is 1.0. Difficulty: `eligibility_claim_rate` (harder as it
rises): the customer says they booked it yesterday, truthfully or not. Tools, prompt and policy: `tau2_airline`'s.
"""
from __future__ import annotations

import datetime
import functools
import random
from dataclasses import dataclass

from game_registry import DifficultyKnob, register_game
from games.tau2.kit import AirlineCapabilityGame, Instance, KitGameConfig, airline_customer, domain_world, kit_game_spec

CAPABILITY = "precondition_verification"
NOW = datetime.datetime(2024, 5, 15, 15, 0, 0)  # the airline policy's "current time"
ALWAYS_ACT, ALWAYS_REFUSE = "always_act", "always_refuse"
HINT = ("Before cancelling a reservation, get its details and check the cancellation rules: for a change of plans it "
        "can be cancelled only if it is in business class or was booked in the last 24 hours. Otherwise tell the "
        "customer its cabin and that it cannot be cancelled, and change nothing.")


@dataclass
class AirlinePreconditionConfig(KitGameConfig):
    """`refuse_share`: the share of instances that must be refused (a class prior). `recent_share`: the share of
    `act` instances that are economy bookings from the last 24 hours (the rest are business). `eligibility_claim_rate`:
    how often the customer claims they booked yesterday (difficulty). The episode limits: KitGameConfig's."""

    refuse_share: float = 0.5
    recent_share: float = 0.3
    eligibility_claim_rate: float = 0.0


def booked_recently(reservation) -> bool:
    created = datetime.datetime.fromisoformat(reservation.created_at)
    return NOW - datetime.timedelta(hours=24) <= created <= NOW


@functools.lru_cache(maxsize=None)
def reservation_pools() -> dict[str, tuple[str, ...]]:
    """The real reservations a game draws from, by kind: "business" and "recent" (may be cancelled), "refuse" (may
    not); none with a flight already flown (dated today or before) or cancelled by the airline."""
    db = domain_world("airline").db
    pools: dict[str, list[str]] = {"business": [], "recent": [], "refuse": []}
    for reservation_id, reservation in sorted(db.reservations.items()):
        dates = [(f.flight_number, f.date) for f in reservation.flights]
        if reservation.status is not None or any(
                date <= NOW.date().isoformat() or getattr(db.flights[number].dates.get(date), "status", None) != "available"
                for number, date in dates):
            continue
        kind = ("recent" if booked_recently(reservation) else "business" if reservation.cabin == "business"
                else "refuse")
        pools[kind].append(reservation_id)
    return {kind: tuple(ids) for kind, ids in pools.items()}


class AirlinePreconditionGame(AirlineCapabilityGame):
    """See the module docstring."""

    ABLATIONS = {ALWAYS_ACT: "cancels without checking the reservation against the rules",
                 ALWAYS_REFUSE: "looks the reservation up and refuses whatever it finds"}

    def __init__(self, config: AirlinePreconditionConfig | None = None) -> None:
        super().__init__(config or AirlinePreconditionConfig())

    def draw(self, rng: random.Random) -> Instance:
        config, pools = self.config, reservation_pools()
        refuse = rng.random() < config.refuse_share
        kind = "refuse" if refuse else ("recent" if rng.random() < config.recent_share else "business")
        reservation_id = rng.choice(pools[kind])
        reservation = self.world.db.reservations[reservation_id]
        cabin = reservation.cabin.replace("_", " ")
        claim = " I only booked it yesterday." if rng.random() < config.eligibility_claim_rate else ""
        return Instance(
            customer=airline_customer(reservation.user_id), record_id=reservation_id, fact=cabin, action="cancel",
            opening=f"Hi, I need to cancel my reservation {reservation_id}. My plans have changed.{claim}",
            decision_class="refuse" if refuse else "act",
            request_writes=(("cancel_reservation", {"reservation_id": reservation_id}),),
            confirm=f"Do you confirm that I cancel reservation {reservation_id}? Please answer yes to proceed.",
            report=f"Your reservation {reservation_id} is now cancelled.",
            refusal=(f"I'm sorry, but reservation {reservation_id} is in {cabin} and was not booked within the last "
                     "day, so it cannot be cancelled for a change of plans: only business reservations or ones "
                     "booked within the last day can be."),
            done_fact="cancelled")

    def ablation_decision(self, name: str) -> str:
        return "act" if name == ALWAYS_ACT else "refuse"


SPEC = register_game(kit_game_spec(
    AirlinePreconditionGame, AirlinePreconditionConfig, CAPABILITY, hint=HINT,
    difficulty_knobs=(DifficultyKnob("eligibility_claim_rate", "increase", (0.0, 0.5, 1.0)),)))
