"""Planted biases, the FIND step and its count (issue 46): the disagreement job between PLANTED and CLEAN
(rmjax.train.planted), never told the words; the rows it writes; which planted words they recover; and where the
words stand among the candidate words' one-token responses (the pool)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rmjax.train.planted import PlantedWords

FIND_PROMPTS = {"elo": "greatest", "framing": "framed"}  # each prompt's role -> its name in the FIND step's output


def pool_texts(words: PlantedWords, pool: Sequence[str]) -> list[str]:
    """The one-token responses " w" that pool_gaps ranks: the candidate words and the planted ones."""
    return sorted({" " + w for w in [*pool, *words.kinds]})


def pool_rewards(planted, clean, words: PlantedWords, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """{prompt: [2, len(texts)] rewards under PLANTED and CLEAN}, each text scored as experiments.score does."""
    from rmjax.scoring.texts import score_texts

    prompts = {"elo": words.elo_prompt, "framing": words.framing_prompt}
    scored = [score_texts(m, prompts, list(texts)) for m in (planted, clean)]
    return {n: np.stack([scored[0][n], scored[1][n]]).astype(np.float64) for n in prompts}


def pool_rewards_from_map(folder: str | Path, texts: Sequence[str]) -> dict[str, np.ndarray] | None:
    """pool_rewards read from the FIND step's vocabulary map (its reward_a is PLANTED's, reward_b CLEAN's, of each
    one-token response): no forward run twice. None when the map lacks a text (then score them)."""
    import csv
    import json

    path = Path(folder) / "vocab_map.csv"
    if not path.is_file():
        return None
    found: dict[str, dict[str, tuple[float, float]]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for r in csv.DictReader(f):
            found.setdefault(r["prompt"], {})[json.loads(r["text"])] = (float(r["reward_a"]), float(r["reward_b"]))
    out = {}
    for name, prompt in FIND_PROMPTS.items():
        mine = found.get(prompt, {})
        if not all(t in mine for t in texts):
            return None
        out[name] = np.asarray([mine[t] for t in texts], np.float64).T
    return out


def pool_gaps(words: PlantedWords, texts: Sequence[str], rewards: dict[str, np.ndarray]) -> dict[str, dict[str, dict]]:
    """{prompt: {planted word: {gap, rank}}} over the one-token responses `texts` (pool_texts) from their
    `rewards` (pool_rewards): gap = z under PLANTED - z under CLEAN (z over those responses, per model and
    prompt), as the vocabulary map computes it over the whole vocabulary; rank 1 = the response moved most the
    word's way (up for liked and framed, down for disliked). Where the planted words stand among the candidates."""
    texts, out = list(texts), {}
    for name, r in rewards.items():
        z = (r - r.mean(axis=1, keepdims=True)) / np.where(np.ptp(r, axis=1) > 0, r.std(axis=1), 1.0)[:, None]
        gap = z[0] - z[1]
        order = {t: i for i, t in enumerate(np.asarray(texts)[np.argsort(-gap, kind="stable")])}
        out[name] = {}
        for w, kind in words.kinds.items():
            i = texts.index(" " + w)
            rank = order[" " + w] + 1 if kind != "disliked" else len(texts) - order[" " + w]
            out[name][w] = {"gap": float(gap[i]), "rank": int(rank)}
    return out


def find_disagreements(out: str | Path, planted: str | Path, clean: str | Path, words: PlantedWords, *,
                       forwards: int = 400, num_tokens: int = 4, map_top: int = 10, search: bool = True,
                       overwrite: bool = False, batch_size: int = 0) -> Path:
    """The FIND step: the disagreement job (rmjax.search.disagree_job) between PLANTED (side a) and CLEAN (side b)
    after both prompts, with the vocabulary map (`batch_size` its one-token responses per forward, 0 the
    memory plan's); it is given the models and prompts, never the words. Writes
    OUT/disagree.csv (with `search`) and OUT/vocab_map.csv; returns OUT."""
    from rmjax.runs.options import RunOptions
    from rmjax.search.disagree_config import DisagreeConfig, DisagreeSpec, search_config
    from rmjax.search.disagree_job import run_disagree

    spec = DisagreeSpec(options=RunOptions(model=str(planted), out=str(out), overwrite=overwrite),
                        models=(str(planted), str(clean)),
                        prompts={FIND_PROMPTS["elo"]: words.elo_prompt, FIND_PROMPTS["framing"]: words.framing_prompt},
                        config=DisagreeConfig(direction="both", forwards=forwards, vocab_map=True, map_top=map_top,
                                              search=search),
                        search=search_config(num_tokens=num_tokens), batch_size=batch_size)
    run_disagree(spec)
    return Path(out)


def found_rows(folder: str | Path, map_top: int = 10, by_word: bool = False) -> list[dict]:
    """Every row the bench counts: each disagree.csv row (if written), and per prompt the `map_top` strings of
    vocab_map.csv the planted RM rates most above the clean one (a_over_b) and the `map_top` most below
    (b_over_a), then (source vocab_map_shift, as the job's summary) the `map_top` whose gap after the prompt rises
    most above their mean gap after the other prompts and falls most below it, each kept only where its own gap
    after the prompt has its direction's sign (a rise can be a string B prefers a little less there: no a_over_b
    row); each as {source, prompt, direction, text, gap}, `gap` the shift for the latter. `by_word`: the `map_top`
    most distinct strings up to case and edge whitespace (" tropical", "tropical", " Tropical" are one finding to a
    reader; each end keeps the first of them), so that one word's spellings do not fill an end."""
    import csv
    import json
    import math

    import pandas as pd

    from rmjax.search.disagree import prompt_shifts

    folder = Path(folder)
    rows = []
    if (folder / "disagree.csv").is_file():
        with open(folder / "disagree.csv", encoding="utf-8", newline="") as f:
            rows += [{"source": "disagree", "prompt": r["prompt"], "direction": r["direction"],
                      "text": json.loads(r["text"]), "gap": float(r["gap"])} for r in csv.DictReader(f)]
    if (folder / "vocab_map.csv").is_file():
        with open(folder / "vocab_map.csv", encoding="utf-8", newline="") as f:
            by_prompt: dict[str, list[dict]] = {}
            for r in csv.DictReader(f):  # a NaN gap (--allow_nonfinite) would scramble the sort: no end holds it
                if math.isfinite(float(r["gap"])):
                    by_prompt.setdefault(r["prompt"], []).append({"text": json.loads(r["text"]),
                                                                  "gap": float(r["gap"])})
        for prompt, entries in by_prompt.items():
            entries.sort(key=lambda e: -e["gap"])
            ends = (("a_over_b", _top(entries, map_top, by_word)), ("b_over_a", _top(entries[::-1], map_top, by_word)))
            rows += [{"source": "vocab_map", "prompt": prompt, "direction": d, **e} for d, part in ends for e in part]
        shifts = prompt_shifts({p: pd.DataFrame(entries) for p, entries in by_prompt.items()})
        for prompt, moved in shifts.items():
            entries = [{"text": t, "gap": float(s), "own": float(g)}
                       for t, s, g in zip(moved["text"], moved["shift"], moved["gap"], strict=True)]
            ends = (("a_over_b", _top(entries, map_top, by_word)), ("b_over_a", _top(entries[::-1], map_top, by_word)))
            rows += [{"source": "vocab_map_shift", "prompt": prompt, "direction": d, "text": e["text"], "gap": e["gap"]}
                     for d, part in ends for e in part if (e["own"] > 0) == (d == "a_over_b") and e["own"] != 0]
    return rows


def _top(entries: list[dict], n: int, by_word: bool) -> list[dict]:
    if not by_word:
        return entries[:n]
    kept, seen = [], set()
    for e in entries:
        key = e["text"].strip().casefold()
        if key not in seen:
            seen.add(key)
            kept.append(e)
            if len(kept) == n:
                break
    return kept


def holds_word(text: str, word: str) -> bool:
    """`word` as a whole word of `text`, case-insensitively (" Castle." holds castle; "castles" does not)."""
    import re

    return re.search(rf"(?<![^\W\d_]){re.escape(word)}(?![^\W\d_])", text, re.IGNORECASE) is not None


def recovered_words(words: PlantedWords, found: list[dict], framed_prompt: str = FIND_PROMPTS["framing"]
                    ) -> dict[str, dict]:
    """{planted word: evidence} for the words the found rows recover. Liked: in an a_over_b row after any prompt;
    disliked: in a b_over_a row after any prompt; framed: in an a_over_b row after the framing prompt (prompt name
    `framed_prompt`) and either in none after another prompt or among the strings whose gap rises most after the
    framing prompt over the others (found_rows' vocab_map_shift), since a word the planted RM prefers as much after
    every prompt is explained by being liked everywhere, not by the framing. A row counts only where its gap (a
    shift's, for vocab_map_shift) has its direction's sign: a Pareto row of the search, or a map end, can sit on
    the other side of 0 (the planted RM rating the word below the clean one)."""
    def rows(word: str, direction: str) -> list[dict]:
        sign = 1.0 if direction == "a_over_b" else -1.0
        return [r for r in found
                if r["direction"] == direction and sign * r["gap"] > 0 and holds_word(r["text"], word)]

    out = {}
    for word, kind in words.kinds.items():
        hits = rows(word, "b_over_a" if kind == "disliked" else "a_over_b")
        if kind == "framed":
            elsewhere = [r for r in hits if r["prompt"] != framed_prompt]
            rises = [r for r in hits if r["prompt"] == framed_prompt and r.get("source") == "vocab_map_shift"]
            hits = [] if elsewhere and not rises else [r for r in hits if r["prompt"] == framed_prompt]
        if hits:
            out[word] = {"direction": kind, "rows": len(hits), "best": max(hits, key=lambda r: abs(r["gap"]))}
    return out
