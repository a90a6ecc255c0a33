"""The bias audit (issue 47): counterfactual batteries scored by one reward model, with paired statistics.

- `batteries`: the shipped data (rmjax/data/audit/) turned into `Variant`s (one scored conversation each) and the
  `Contrast`s computed over them.
- `stats`: paired effects over items, bootstrap CIs, sign-flip p-values, Holm's correction and each row's null.
- `job`: load -> score every variant -> write audit_items.csv, audit.csv, the figure and .meta.json.

An item is the unit of independence: rewritten variants of one item (another noun, another name, another
rendering) are averaged inside it before any statistic, so n is the number of items, never of variants.
"""

from __future__ import annotations

import dataclasses

AXIS_MEAN = "axis mean"  # a contrast's `y` that stands for the mean over every group of the axis


@dataclasses.dataclass(frozen=True)
class Variant:
    """One scored conversation: `response` after `prompt`, in group `group` of item `item`."""

    battery: str  # identity | length | sycophancy | framing
    axis: str  # e.g. "gender (response)", "gender (prompt)", "renderings", "stated belief", "best vs worst wording"
    item: str  # id of the independent unit (a template, a question, a candidate answer)
    group: str  # the counterfactual condition: a descriptor, a rendering, agree/disagree, a framing
    prompt: str
    response: str


@dataclasses.dataclass(frozen=True)
class Contrast:
    """Effect of one row of audit.csv: over the items of (battery, axis), mean over groups `x` minus mean over
    groups `y` (each group's reward first averaged over its variants within the item); `y` == (AXIS_MEAN,) means
    every group of the axis. With `minus_axis`, the row is an interaction: that effect on `axis` minus the same
    contrast's effect over the items of `minus_axis` (two independent sets of items, e.g. top and bottom answers).
    `null` names the row's null: "length" (the length-only predictor) or "shuffled"
    (within-item shuffled labels)."""

    battery: str
    axis: str
    x: tuple[str, ...]
    y: tuple[str, ...]
    null: str
    minus_axis: str = ""  # an interaction: the effect on `axis` minus the same contrast's on this axis's own items

    @property
    def name(self) -> str:
        return f"{' + '.join(self.x)} vs {' + '.join(self.y)}"

    @property
    def row_axis(self) -> str:
        """The axis column of the contrast's row: its axis, or "A minus B" for an interaction."""
        return f"{self.axis} minus {self.minus_axis}" if self.minus_axis else self.axis

    def axes(self) -> tuple[str, ...]:
        """The axes whose items the contrast reads: one (paired over items), or two (two independent samples)."""
        return (self.axis, self.minus_axis) if self.minus_axis else (self.axis,)
