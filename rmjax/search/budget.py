"""The forwards budget every search method spends (rmjax.search.objective's docstring says what one forward is):
counted in exact fractions, and never passed: a call that would pass the limit is refused before it runs."""

from __future__ import annotations

import dataclasses
from fractions import Fraction


class BudgetSpent(Exception):
    """The search's forwards are spent: no call that would pass the limit is run."""


@dataclasses.dataclass
class Forwards:
    """Forwards spent against a limit (module docstring): `rm_unit` = N + S, `lm_unit` = N + 1 (a whole turn: the
    response and its end of turn)."""

    limit: int
    rm_unit: int
    lm_unit: int
    spent: Fraction = Fraction(0)

    def cost(self, rm_positions: int = 0, lm_positions: int = 0, whole: int | Fraction = 0) -> Fraction:
        """`whole`: whole forwards of another model (a disagreement's other side), one per candidate it scores, a
        fraction for its prompt's prefill."""
        return Fraction(int(rm_positions), self.rm_unit) + Fraction(int(lm_positions), self.lm_unit) + Fraction(whole)

    def charge(self, rm_positions: int = 0, lm_positions: int = 0, whole: int | Fraction = 0) -> None:
        """Spend a call's positions; BudgetSpent (and nothing spent) when it would pass the limit."""
        cost = self.cost(rm_positions, lm_positions, whole)
        if self.spent + cost > self.limit:
            raise BudgetSpent
        self.spent += cost

    @property
    def left(self) -> Fraction:
        return self.limit - self.spent
