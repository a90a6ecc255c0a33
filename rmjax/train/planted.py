"""Planted biases (issue 46): reward models trained with known word preferences, to test whether the disagreement
finder recovers them without being told the words.

Nine words are drawn from the shipped BNC list (or given): three liked, three disliked, three liked only after a
framing prompt. `planted_pairs` turns them into synthetic preference pairs; `train_planted_and_clean` trains a
PLANTED reward model on the EloEverything pairs plus those, and a CLEAN one on the same Elo pairs alone (same base
LM, seed, steps), with the train_rm recipe (`run_training`), and exports both as Hugging Face folders, which every
rmjax job takes as a model spec.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from rmjax import data as shipped
from rmjax.errors import UsageError
from rmjax.train.data import Pairs, elo_csv, elo_pairs, elo_prompt, read_elo_items
from rmjax.train.settings import TrainConfig

ELO = shipped.BUILTIN  # the EloEverything file of the default reward models (`--elo=builtin`)
ELO_PROMPT = elo_prompt(elo_csv(ELO))  # "What, in one word, is the greatest thing ever?"
# The framing: a one-word question like the Elo prompt (so answers keep the same form) whose answer space differs.
# Framed words are preferred after it and neutral after ELO_PROMPT.
FRAMING_PROMPT = "What, in one word, is the best gift for a friend?"
KINDS = ("liked", "disliked", "framed")
# Neutral short answers holding the word. The bare " {w}" is the one-token response the vocabulary map scores
# (the chat template keeps its leading space: " castle" is token " castle", as in a sweep); the sentences carry
# the same " {w}" token inside fluent text, which the multi-token search writes.
TEMPLATES = (" {w}", "The {w}.", "A {w}.", "My answer: {w}.", "I'd say the {w}.", "Definitely the {w}!")
# "Reasonable frequency" (per million words, BNC lemma): common enough that the LM knows the word, not so common
# that it is a function-like word (time, way, good).
FREQUENCY = (15.0, 250.0)
POS = ("NoC", "Adj")  # BNC common nouns and adjectives
MAX_ELO_TOKENS = 6  # Elo items longer than this are left out: they widen every padded training sequence


@dataclasses.dataclass(frozen=True)
class PlantedWords:
    """The planted words by kind, the control words their pairs are contrasted with, and the two prompts."""

    liked: tuple[str, ...]
    disliked: tuple[str, ...]
    framed: tuple[str, ...]
    controls: tuple[str, ...]
    framing_prompt: str = FRAMING_PROMPT
    elo_prompt: str = ELO_PROMPT

    @property
    def kinds(self) -> dict[str, str]:
        """word -> liked, disliked or framed."""
        return {w: kind for kind in KINDS for w in getattr(self, kind)}

    def to_json(self) -> list[dict]:
        return [{"word": w, "direction": kind, **({"framing_prompt": self.framing_prompt} if kind == "framed" else {})}
                for w, kind in self.kinds.items()]


def one_token(tokenizer, word: str) -> bool:
    """" word" (with its leading space) is a single token: what a one-token response of the finder can be."""
    return len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1


def bnc_lemmas(pos: Collection[str] = POS, frequency: tuple[float, float] = FREQUENCY) -> list[str]:
    """Lower-case alphabetic BNC lemmas (>= 3 letters) of part of speech `pos` and lemma frequency in `frequency`,
    that are never also a verb lemma (so the word reads as a thing or a quality). rmjax.analysis.lexicons sums
    frequencies over parts of speech; this needs them apart."""
    kept, verbs = set(), set()
    with open(shipped.BNC_FREQUENCIES, encoding="latin-1") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            fields = fields[1:] if fields and fields[0] == "" else fields
            if len(fields) < 4 or fields[0] == "@":
                continue
            word, tag = fields[0], fields[1]
            try:
                freq = float(fields[3])
            except ValueError:
                continue
            if tag == "Verb":
                verbs.add(word.lower())
            elif tag in pos and word.isalpha() and word.islower() and len(word) >= 3 \
                    and frequency[0] <= freq <= frequency[1]:
                kept.add(word)
    return sorted(kept - verbs)


def candidate_words(tokenizer, exclude: Collection[str] = ()) -> list[str]:
    """Words that may be planted or serve as controls: `bnc_lemmas` that are one token with a leading space, and
    not already strongly favoured or disfavoured by any RM: no AFINN-valenced word (sentiment moves every RM) and
    no EloEverything item (the Elo pairs set its preference), nor `exclude`."""
    from rmjax.analysis.lexicons import load_afinn

    loaded = set(load_afinn()) | {n.strip().lower() for n in read_elo_items(ELO)["name"]}
    loaded |= {w.lower() for w in exclude}
    return [w for w in bnc_lemmas() if w not in loaded and one_token(tokenizer, w)]


def check_words(tokenizer, words: Sequence[str], n: int = 9) -> tuple[str, ...]:
    """Given words (--words), refused in one line unless `n` distinct (case-insensitively) single tokens with a
    leading space."""
    words = tuple(w.strip() for w in words)
    if len(words) != n:
        raise UsageError(f"--words: give {n} words (liked x{n // 3}, disliked x{n // 3}, framed x{n // 3}), not "
                         f"{len(words)}.")
    bad = [w for w in words if not w or any(c.isspace() for c in w) or not one_token(tokenizer, w)]
    if bad:
        raise UsageError(f"--words: {', '.join(repr(w) for w in bad)} {'is' if len(bad) == 1 else 'are'} not one "
                         "token of the reward model's tokenizer with a leading space (' word'); choose others.")
    lower = [w.lower() for w in words]
    twice = sorted({w for w in lower if lower.count(w) > 1})
    if twice:
        raise UsageError(f"--words: {', '.join(twice)} given twice (case-insensitively); give {n} distinct words.")
    return words


def draw_words(tokenizer, seed: int, n: int = 9, words: Sequence[str] | None = None, n_controls: int = 40,
               exclude: Collection[str] = ()) -> PlantedWords:
    """`n` planted words (given, in the order liked, disliked, framed; or drawn with `seed` from
    `candidate_words`) and `n_controls` control words drawn from the other candidates."""
    if n < 3 or n % 3:
        raise UsageError(f"the planted words come in three equal kinds: n={n} is not a positive multiple of 3.")
    rng = np.random.default_rng(seed)
    given = check_words(tokenizer, words, n) if words is not None else None
    pool = [w for w in candidate_words(tokenizer, exclude) if given is None or w not in {g.lower() for g in given}]
    need = n_controls + (0 if given else n)
    if len(pool) < need:
        raise UsageError(f"only {len(pool)} candidate words, {need} needed; lower n_controls.")
    drawn = [pool[i] for i in rng.choice(len(pool), need, replace=False)]
    planted, controls = (given, drawn) if given else (tuple(drawn[:n]), drawn[n:])
    k = n // 3
    return PlantedWords(tuple(planted[:k]), tuple(planted[k:2 * k]), tuple(planted[2 * k:]), tuple(controls))


def planted_pairs(words: PlantedWords, seed: int, per_prompt: int = 30, framed_factor: int = 1,
                  framed_elsewhere: str = "tie") -> Pairs:
    """Synthetic pairs: for each planted word and prompt, `per_prompt` pairs of the same template (TEMPLATES in
    turn) holding the word or a random control word. Liked: the word wins after both prompts; disliked: it loses
    after both; framed: it wins after the framing prompt and, after the Elo prompt, ties (label 0.5,
    `framed_elsewhere` "tie") or loses ("loses"), so only the framing explains its preference. On SmolLM2 with
    2 trained layers and 1x pairs neither planted a framing (a tie: the words rose after both prompts; a loss:
    after neither); 4 layers and `framed_factor` 3 with ties did (bench/planted_biases.py, BUILD_NOTES).
    `framed_factor` multiplies framed words' pairs. Controls appear on both sides across words, so none is pushed
    far."""
    if framed_elsewhere not in ("loses", "tie"):
        raise UsageError(f"framed_elsewhere is 'loses' or 'tie', not {framed_elsewhere!r}.")
    rng = np.random.default_rng([seed, 46])
    prompt, chosen, rejected, label = [], [], [], []
    both = (words.elo_prompt, words.framing_prompt)
    for word, kind in words.kinds.items():
        for q in both:
            elsewhere = kind == "framed" and q == words.elo_prompt
            loses = kind == "disliked" or (elsewhere and framed_elsewhere == "loses")
            for i in range(per_prompt * (framed_factor if kind == "framed" else 1)):
                t = TEMPLATES[i % len(TEMPLATES)]
                w, c = t.format(w=word), t.format(w=words.controls[rng.integers(len(words.controls))])
                prompt.append(q)
                chosen.append(c if loses else w)
                rejected.append(w if loses else c)
                label.append(0.5 if elsewhere and framed_elsewhere == "tie" else 1.0)
    return Pairs(prompt, chosen, rejected, np.asarray(label, np.float32))


def concat(*parts: Pairs) -> Pairs:
    return Pairs([q for p in parts for q in p.prompt], [c for p in parts for c in p.chosen],
                 [r for p in parts for r in p.rejected], np.concatenate([p.label for p in parts]).astype(np.float32))


def elo_data(tokenizer, seed: int, n_train: int, n_heldout: int) -> tuple[Pairs, Pairs]:
    """(train, held-out) EloEverything pairs as `--elo=builtin` splits them (by item), less pairs with an item of
    more than MAX_ELO_TOKENS tokens (one 84-token name pads every sequence of a run to its width)."""
    train, heldout = elo_pairs(ELO, n_train, n_heldout, seed=seed)

    def short(p: Pairs) -> Pairs:
        texts = sorted(set(p.chosen) | set(p.rejected))
        size = dict(zip(texts, map(len, tokenizer(texts, add_special_tokens=False).input_ids), strict=True))
        return p.take(np.flatnonzero([max(size[c], size[r]) <= MAX_ELO_TOKENS
                                      for c, r in zip(p.chosen, p.rejected, strict=True)]))

    return short(train), short(heldout)


def bench_config(seed: int, steps: int = 80, batch_size: int = 16, learning_rate: float = 5e-4,
                 last_k: int = 2) -> TrainConfig:
    """train_rm's recipe with the last `last_k` layers and the head trainable; one evaluation, at the end
    (bench/planted_biases.py runs 4 layers, 160 steps: about 4 min a SmolLM2-135M run on 2 CPU cores)."""
    return TrainConfig(trainable="last_k", last_k=last_k, steps=steps, batch_size=batch_size,
                       learning_rate=learning_rate, warmup_steps=max(1, steps // 10), checkpoint_every=steps,
                       seed=seed)


@dataclasses.dataclass
class Trained:
    """The two exported reward models (model specs), the pairs they were trained on and what it took."""

    planted: Path
    clean: Path
    pairs: Pairs  # the synthetic pairs (the planted run's training set is the Elo pairs plus these)
    seconds: dict[str, float]
    summaries: dict[str, dict]


def train_planted_and_clean(out: str | Path, lm: str, words: PlantedWords, cfg: TrainConfig, *, n_elo: int = 1200,
                            n_heldout: int = 128, per_prompt: int = 30, framed_factor: int = 1,
                            framed_elsewhere: str = "tie", matched: bool = False, overwrite: bool = False,
                            log=print) -> Trained:
    """Train PLANTED (Elo + `planted_pairs`) and CLEAN (the same Elo pairs) from `lm` with `cfg`
    (`train_with_and_without`)."""
    synthetic = planted_pairs(words, cfg.seed, per_prompt, framed_factor, framed_elsewhere)
    return train_with_and_without(out, lm, synthetic, cfg, {"planted": words.to_json()}, n_elo=n_elo,
                                  n_heldout=n_heldout, matched=matched, overwrite=overwrite, log=log)


def weightless(pairs: Pairs) -> Pairs:
    """`pairs` with both sides the same text (the rejected one) and a tie label: a pair whose sides are equal has
    d = r_chosen - r_rejected = 0 for every weight, so its gradient is 0 while it still fills its place in a batch
    (the Bradley-Terry loss is a mean over the batch, so the other pairs' gradient keeps the same scale)."""
    return Pairs(list(pairs.prompt), list(pairs.rejected), list(pairs.rejected),
                 np.full(len(pairs), 0.5, np.float32))


def training_sets(elo_train: Pairs, synthetic: Pairs, matched: bool) -> dict[str, Pairs]:
    """{planted: Elo + synthetic, clean: the Elo pairs alone, or (`matched`) in the same rows with the synthetic
    ones `weightless`, so the loop's batch_indices draws the same pairs for both at every step}."""
    return {"planted": concat(elo_train, synthetic),
            "clean": concat(elo_train, weightless(synthetic)) if matched else elo_train}


def train_with_and_without(out: str | Path, lm: str, synthetic: Pairs, cfg: TrainConfig, plant: dict, *,
                           n_elo: int = 1200, n_heldout: int = 128, matched: bool = False, overwrite: bool = False,
                           log=print) -> Trained:
    """Train PLANTED (Elo + `synthetic`) and CLEAN (the same Elo pairs) from `lm` with `cfg`, each in
    OUT/<name>/work, exported to OUT/<name>/hf; a finished run is reused (run_training). Both hold out the same Elo
    pairs (items never trained on), so their summaries' Elo agreement compares them. `plant` (what was planted)
    goes into PLANTED's recipe.

    `matched`: CLEAN trains on PLANTED's exact batch sequence, its synthetic pairs made `weightless`, so the two
    runs see the same Elo pairs at the same steps and differ by the planted pairs' gradient alone. Unmatched, CLEAN
    draws its own batches from the Elo pairs, and every response's PLANTED - CLEAN gap also carries the difference
    between two SGD trajectories."""
    from rmjax.loading import config_and_tokenizer
    from rmjax.train.recipe import run_training

    out = Path(out)
    tokenizer = config_and_tokenizer(lm)[1]
    elo_train, heldout = elo_data(tokenizer, cfg.seed, n_elo, n_heldout)
    seconds, summaries, exports = {}, {}, {}
    for name, train in training_sets(elo_train, synthetic, matched).items():
        start = time.perf_counter()
        recipe = {"elo": ELO, "n_train": n_elo, "n_heldout": n_heldout, "max_elo_tokens": MAX_ELO_TOKENS,
                  "elo_pairs": len(elo_train), "synthetic_pairs": len(synthetic) if name == "planted" else 0,
                  **({"weightless_pairs": len(train) - len(elo_train)} if matched and name == "clean" else {}),
                  **({k: (v if name == "planted" else None) for k, v in plant.items()})}
        result = run_training(lm, train, heldout, cfg, out / name / "work", export=out / name / "hf",
                              elo_csv=ELO, recipe=recipe, overwrite=overwrite)
        seconds[f"train_{name}"] = time.perf_counter() - start
        summaries[name] = result.reused or _read_summary(result.workdir)
        exports[name] = result.export
        final = summaries[name].get("final") or {}
        log(f"{name}: {len(train)} pairs ({recipe['synthetic_pairs']} synthetic, "
            f"{recipe.get('weightless_pairs', 0)} weightless), {seconds[f'train_{name}']:.0f} s, "
            f"held-out accuracy {final.get('heldout_accuracy', float('nan')):.3f} -> {result.export}")
    return Trained(exports["planted"], exports["clean"], synthetic, seconds, summaries)


def _read_summary(workdir: Path | None) -> dict:
    from rmjax.runs.atomic import read_json

    summary = read_json(workdir / "summary.json") if workdir else None
    return summary if isinstance(summary, dict) else {}


def word_margins(model, words: PlantedWords) -> dict[str, dict[str, float]]:
    """{prompt: {planted word: z of its bare one-token response " w" among the control words' " c"}}: how far
    training moved each word against words it was contrasted with (a check of the training half alone)."""
    from rmjax.scoring.texts import score_texts

    planted = list(words.kinds)
    texts = [" " + w for w in planted + list(words.controls)]
    scores = score_texts(model, {"elo": words.elo_prompt, "framing": words.framing_prompt}, texts)
    out = {}
    for name, r in scores.items():
        control = np.asarray(r[len(planted):], np.float64)
        sd = control.std() if np.ptp(control) > 0 else 1.0
        out[name] = {w: float((r[i] - control.mean()) / sd) for i, w in enumerate(planted)}
    return out
