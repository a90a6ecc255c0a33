"""attribute() on 4 conversations of different token lengths in a fresh process: seconds per call, first
calls (compilation) included, and the values (reward, IG sum, gradient x input sum) to compare across versions.

python bench/attribution_lengths.py
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rmjax.inspect.attribution import attribute  # noqa: E402
from rmjax.inspect.job import items_from_texts  # noqa: E402
from rmjax.loading import load  # noqa: E402

model = load("elo-rm-smollm2-135m")
items = items_from_texts(model, "What, in one word, is the greatest thing ever?",
                         ["love", "chocolate cake", "the sea at night", "a very long answer with many words"])
times, gaps = [], []
for it in items:
    s = time.perf_counter()
    a = attribute(model, list(it.ids), steps=16, batch_size=16)
    times.append(time.perf_counter() - s)
    gaps.append((a.reward, float(a.integrated_gradients.sum()), float(a.grad_x_input.sum())))
print("lengths", [len(i.ids) for i in items])
print("seconds", np.round(times, 2), "total", round(sum(times), 2))
print("values", [tuple(round(v, 5) for v in g) for g in gaps])
