"""How long the test suite's CPU compiles take with XLA's defaults and with tests/cli.py's QUICK_COMPILE flags (and
each flag alone): a tiny reward model's text scoring and a short GCG, compiled cold in a fresh process each, three
times in turn. Prints the backend compile seconds per setting and their ratio to the defaults measured in this run.

    python bench/test_compile_speed.py [--repeats=3]

Needs the test extras (`make test`'s .venv): the tiny model is built with transformers' PyTorch classes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in each fresh process: no persistent cache, so every program compiles.
_PROGRAMS = """
import json, tempfile, pathlib
import jax
jax.config.update("jax_enable_compilation_cache", False)
import jax.monitoring
seconds = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: seconds.append(duration) if event == "/jax/core/compile/backend_compile_duration"
    else None)
from tests import tiny
from rmjax.loading import load
from rmjax.scoring.texts import score_texts
from rmjax.search.gcg import gcg, make_target
from rmjax.search.gcg_config import GCGConfig
_, folder = tiny.save_reward_model_with_tokenizer(pathlib.Path(tempfile.mkdtemp()) / "rm")
model = load(str(folder))
score_texts(model, {"p": "What is the best thing?"}, ["a", "b c", "hello there friend", "x " * 20] * 9)
gcg([make_target(model, "What, in one word, is the greatest thing ever?")],
    GCGConfig(num_tokens=3, steps=3, search_width=16, topk=8, seed=0))
print(json.dumps({"seconds": sum(seconds), "programs": len(seconds)}))
"""


def compile_seconds(flags: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "PYTHONPATH": str(REPO),
           "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _PROGRAMS], cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # say why (torch missing: the runtime install alone), not only that it failed
        raise SystemExit(f"error: the compiles failed with XLA_FLAGS={flags!r}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.cli import QUICK_COMPILE

    settings = {"XLA defaults": "", **{f"{flag} alone": flag for flag in QUICK_COMPILE},
                "QUICK_COMPILE (the tests')": " ".join(QUICK_COMPILE)}
    found: dict[str, list[float]] = {name: [] for name in settings}
    programs = {}
    for _ in range(args.repeats):  # in turn, so a slower spell of the machine falls on every setting
        for name, flags in settings.items():
            run = compile_seconds(flags)
            found[name].append(run["seconds"])
            programs[name] = run["programs"]
    base = statistics.median(found["XLA defaults"])
    for name, seconds in found.items():
        median = statistics.median(seconds)
        print(f"{name:55s} {median:6.2f} s (runs {', '.join(f'{s:.2f}' for s in seconds)}; {programs[name]} "
              f"programs) {median / base:5.2f}x the defaults")


if __name__ == "__main__":
    main()
