"""A join's pair function as the keyed join operators call it (keyed/intervaljoin.py,
keyed/windowjoin.py): with a dead-letter tag, a pair the user's function fails on becomes a
dead letter (``raw``: ``{"left": ..., "right": ...}``) and the join goes on."""

from __future__ import annotations

from typing import Any, Callable

from ember.errors import UserFunctionError

__all__ = ["Pairs", "outer_sides"]


class Pairs:
    """``pairs(left, right, ctx)``: the output rows of one pair (``pair(left, right)``)."""

    def __init__(self, pair: Callable[[Any, Any], list[Any]], dead_letter: str | None = None) -> None:
        self.pair, self.dead_letter = pair, dead_letter

    def __call__(self, left: Any, right: Any, ctx: Any) -> list[Any]:
        if self.dead_letter is None:
            return self.pair(left, right)
        try:
            return self.pair(left, right)
        except UserFunctionError as exc:  # the function raised, or its rows do not fit the schema
            ctx.dead_letter(self.dead_letter, {"left": left, "right": right}, getattr(exc, "reason", str(exc)))
            return []


def outer_sides(how: str) -> tuple[bool, bool]:
    """Which sides of a join of kind ``how`` keep their records without a partner: (left, right)."""
    return how in ("left_outer", "full_outer"), how in ("right_outer", "full_outer")
