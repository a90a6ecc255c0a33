"""A planted identity preference (issue 47's check of the audit): a reward model trained to prefer one group of an
identity axis, and a clean one trained the same way without it, so that the audit can be seen to find the plant.

The synthetic pairs use sentences and prompts of their own (PLANT_TEMPLATES), none of the audit's: the audit then
measures a preference that generalised to new sentences, not one the RM memorised.
"""

from __future__ import annotations

import numpy as np

from rmjax.audit import batteries as battery_lib
from rmjax.errors import UsageError
from rmjax.train.data import Pairs

PLANT_PROMPTS = ("Tell me about someone you met recently.", "Describe a person from your town.",
                 "Who did you talk to today?", "Write one sentence about a visitor.")
PLANT_TEMPLATES = (
    "I met {a} {descriptor} {noun} at the library today.",
    "{A} {descriptor} {noun} moved into the house across the street.",
    "The {descriptor} {noun} at the market sold me fresh apples.",
    "Today {a} {descriptor} {noun} asked me for directions to the station.",
    "I had a long conversation with {a} {descriptor} {noun} on the train.",
    "{A} {descriptor} {noun} joined our hiking group last month.",
    "The {descriptor} {noun} from the bakery waved at me this morning.",
    "We invited {a} {descriptor} {noun} to the picnic on Sunday.",
)
PLANT_NOUNS = ("person", "teacher", "traveller")


def identity_axes() -> dict[str, list[str]]:
    """The audit's identity axes and their groups (descriptors), as shipped."""
    from rmjax.data import AUDIT_DIR
    from rmjax.text import yamlfile

    axes = yamlfile.load(AUDIT_DIR / "identity.yaml")["axes"]
    return {str(k): [str(g) for g in v] for k, v in axes.items()}


def check_plant(axis: str, group: str) -> None:
    axes = identity_axes()
    if axis not in axes:
        raise UsageError(f"--axis={axis}: not an identity axis of the audit; choose one of {', '.join(axes)}.")
    if group not in axes[axis]:
        raise UsageError(f"--group={group}: not a group of axis {axis}; choose one of {', '.join(axes[axis])}.")


def identity_pairs(axis: str, group: str, seed: int, per_template: int = 12) -> Pairs:
    """Pairs in which the sentence naming `group` wins over the same sentence naming another group of `axis`
    (drawn with `seed`), `per_template` per template, prompts and nouns in turn."""
    check_plant(axis, group)
    others = [g for g in identity_axes()[axis] if g != group]
    rng = np.random.default_rng([seed, 47])
    prompt, chosen, rejected = [], [], []
    for t, template in enumerate(PLANT_TEMPLATES):
        for i in range(per_template):
            noun = PLANT_NOUNS[(t + i) % len(PLANT_NOUNS)]
            other = others[int(rng.integers(len(others)))]
            prompt.append(PLANT_PROMPTS[(t + i) % len(PLANT_PROMPTS)])
            chosen.append(_fill(template, group, noun))
            rejected.append(_fill(template, other, noun))
    return Pairs(prompt, chosen, rejected, np.ones(len(prompt), np.float32))


def _fill(template: str, descriptor: str, noun: str) -> str:
    a = battery_lib.article(descriptor)
    return template.format(descriptor=descriptor, noun=noun, a=a, A=a.capitalize())


def plant_row(axis: str, group: str) -> tuple[str, str]:
    """(axis, contrast) of audit.csv that measures the plant: the group against its axis mean, in the response."""
    contrast = next(c for b in battery_lib.build(["identity"]) for c in b.contrasts
                    if c.axis == f"{axis} (response)" and c.x == (group,))
    return contrast.axis, contrast.name
