"""Where two sides disagree (issue 46): the gap z_A − z_B that the frontier's search climbs (the Objective's
`partner`), and the vocabulary-wide map over the one-token responses both vocabularies share.

z is each side's reward in SDs of its own single-token rewards for the prompt (`Side.yardstick`): one affine map
per side, so a gap of 3 means one side puts the response 3 SDs further up its own scale than the other does. The
search runs in side A's tokens; side B scores the decoded text in its own template and tokenization, and a
candidate whose text does not round-trip in B is never scored (`round_trips`, a re-tokenization check).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from scipy import stats

from rmjax.analysis import stats as analysis_stats
from rmjax.runs.progress import Progress
from rmjax.scoring import finite
from rmjax.search import turns
from rmjax.search.sides import RewardSide, Side
from rmjax.text.candidates import decoded_tokens, encoded_each


@dataclasses.dataclass(eq=False)
class Disagreement:
    """The Objective's partner (rmjax.search.terms.Partner): A's rewards of candidates (A's ids) become gaps;
    every candidate scored is kept in `ledger` (its own tokens -> (reward A, reward B)), so written rows read
    their values."""

    tokenizer: object  # side A's
    end: int  # A's end of turn (rmjax.search.turns)
    z_a: finite.Scale
    other: Side
    z_b: finite.Scale
    allow_nonfinite: bool = False
    plain_a: bool = False  # side A reads the plain template, whose one space before the response is format
    token_map: np.ndarray | None = None  # A's id -> B's id of the same string (-1: none); None: B's gradient unused
    ledger: dict = dataclasses.field(default_factory=dict)
    known: dict = dataclasses.field(default_factory=dict)  # text -> B's reward (a text is scored once)

    def content(self, text: str) -> str:
        return response_content(text, self.plain_a)

    @property
    def each(self) -> int:
        return self.other.spec.each

    @property
    def scale(self) -> float:
        return self.z_a[1]

    def gradient_cost(self, turn: np.ndarray) -> int:
        """Whole forwards of side B that `gradient(turn)` runs: 0 where B's gradient is not used or B gives none for
        the turn's text (its conversation does not continue B's cached prefix)."""
        if self.token_map is None or not self.other.gradient_each:
            return 0
        return self.other.gradient_each if self.other.gives_gradient(self._text(turn)) else 0

    def _text(self, turn: np.ndarray) -> str:
        return self.content(self.tokenizer.decode(turns.tokens(turn, self.end)))

    def gradient(self, turn: np.ndarray, width: int) -> jax.Array | None:
        """d z_B / d one_hot(A's turn form) [L + 1, width], estimated through the tokens both sides read alike: at
        a position where A's token and B's cover the same characters, swapping A's token for t changes z_B by B's
        gradient toward t's twin in B's vocabulary less B's gradient at its own token (0 where t has no twin, and at
        every other position). Without it the proposals see only A, and B enters a step only when candidates are
        scored."""
        body = turns.tokens(turn, self.end)
        found = self.other.gradient(self._text(turn)) if self.token_map is not None else None
        if found is None:
            return None
        grad_b, body_b = found
        pairs = aligned_tokens(self.tokenizer, body, self.other.tokenizer, body_b, self.token_map)
        out = jnp.zeros((len(turn), width), jnp.float32)
        if not pairs:
            return out
        mine, theirs = (np.asarray(x, np.int32) for x in zip(*pairs, strict=True))
        twins = np.full((len(pairs), width), -1, np.int64)
        twins[:, : min(width, len(self.token_map))] = self.token_map[:width]
        own = np.asarray(body_b, np.int64)[theirs]
        twins = np.where(twins >= 0, twins, own[:, None])  # no twin: no estimated change
        rows = grad_b[theirs]
        delta = jnp.take_along_axis(rows, jnp.asarray(twins), axis=1) - rows[jnp.arange(len(pairs)), own][:, None]
        return out.at[mine].set(delta / self.z_b[1])

    def rewards_b(self, texts: list[str]) -> np.ndarray:
        """B's reward of each text (a text B scored before is not scored again); NaN/Inf stops the job unless
        allowed."""
        new = [t for t in dict.fromkeys(texts) if t not in self.known]
        if new:
            values = self.other.rewards(new)
            finite.check(values[:, None], what=f"rewards of side B ({self.other.spec.text})", columns=["reward"],
                         allow=self.allow_nonfinite, row=lambda i: f"text {new[i]!r}")
            self.known.update(zip(new, values.tolist(), strict=True))
        return np.asarray([self.known[t] for t in texts], np.float64)

    def texts(self, ids: np.ndarray) -> list[str]:
        """What side B reads of candidates (A's ids)."""
        return [self.content(t) for t in turns.decode(self.tokenizer, ids, self.end)]

    def unscored(self, ids: np.ndarray) -> int:
        return len({t for t in self.texts(ids) if t not in self.known})

    def gap(self, reward: np.ndarray, ids: np.ndarray) -> np.ndarray:
        reward = np.asarray(reward, np.float64)
        rb = self.rewards_b(self.texts(ids))
        for row, a, b in zip(np.asarray(ids).tolist(), reward.tolist(), rb.tolist(), strict=True):
            self.ledger[tuple(turns.tokens(row, self.end))] = (a, b)
        return z_of(reward, self.z_a) - z_of(rb, self.z_b)

    def round_trips(self, body: list[int]) -> bool:
        """A response's own tokens (A's) decode to a text that round-trips in side B."""
        return self.other.round_trips(self.content(self.tokenizer.decode(list(body))))


def aligned_tokens(tokenizer_a, body_a: list[int], tokenizer_b, body_b: list[int], token_map: np.ndarray
                   ) -> list[tuple[int, int]]:
    """(i, j): A's token i and B's token j span the same characters of the text (each side's decoding less its
    leading whitespace, which one template's space before the response adds) and are the same string (B's j is
    A's i's twin in `token_map`)."""
    def spans(tokenizer, body):
        ends = [len(tokenizer.decode(body[:k])) for k in range(len(body) + 1)]
        whole = tokenizer.decode(body)
        lead = len(whole) - len(whole.lstrip())
        return {(ends[k] - lead, ends[k + 1] - lead): k for k in range(len(body))}

    theirs = spans(tokenizer_b, body_b)
    pairs = []
    for span, i in spans(tokenizer_a, body_a).items():
        j = theirs.get(span)
        if j is not None and body_a[i] < len(token_map) and token_map[body_a[i]] == body_b[j]:
            pairs.append((i, j))
    return pairs


def response_content(text: str, plain: bool) -> str:
    """What a response of side A's says, the text B reads and the CSV holds: A's decoded tokens, less the space the
    plain template puts before every response (its first token carries it)."""
    return text.strip() if plain else text


def z_of(reward, scale: tuple[float, float]) -> np.ndarray:
    return (np.asarray(reward, np.float64) - scale[0]) / scale[1]


def shared_strings(a: Side, b: Side, banned_a: np.ndarray, banned_b: np.ndarray) -> pd.DataFrame:
    """The strings both sides' tokenizers read as one allowed token: text, token_a, token_b (the token each
    tokenizer makes of the string alone, which decodes back to it), sorted by A's id. A token its own tokenizer
    never produces from its text (a normalizer changes it, another split wins) is no response the side can read."""
    def first_ids(side: Side, banned: np.ndarray) -> dict[str, int]:
        texts = decoded_tokens(side.tokenizer, side.vocab)
        candidates = [i for i, text in enumerate(texts) if not banned[i] and text]
        encoded = encoded_each(side.tokenizer, [texts[i] for i in candidates])
        return {texts[i]: i for i, ids in zip(candidates, encoded, strict=True) if ids == [i]}

    ids_a, ids_b = first_ids(a, banned_a), first_ids(b, banned_b)
    both = [(text, i, ids_b[text]) for text, i in ids_a.items() if text in ids_b]
    return pd.DataFrame(both, columns=["text", "token_a", "token_b"])


def twin_map(shared: pd.DataFrame, size: int) -> np.ndarray:
    """A's id -> B's id of the same string over `size` ids of A's (-1 where B has none): Disagreement.token_map."""
    out = np.full(size, -1, np.int64)
    inside = shared["token_a"].to_numpy() < size
    out[shared["token_a"].to_numpy()[inside]] = shared["token_b"].to_numpy()[inside]
    return out


MAP_CHUNK = 4096  # single tokens scored between progress lines


def token_rewards_of(side: Side, ids: np.ndarray, progress: Progress | None = None) -> np.ndarray:
    """A side's single-token rewards of its own ids (Side.token_rewards), a chunk at a time with `progress`."""
    ids = np.asarray(ids, np.int64)
    out = []
    for start in range(0, len(ids), MAP_CHUNK):
        out.append(side.token_rewards(ids[start : start + MAP_CHUNK]))
        if progress is not None:
            progress.update(len(out[-1]))
    return np.concatenate(out) if out else np.zeros(0)


def map_rewards(a: Side, b: Side, shared: pd.DataFrame, prompt: str) -> tuple[np.ndarray, np.ndarray, int]:
    """both_token_rewards of the shared strings, with a progress line: the map's forwards."""
    progress = Progress(2 * len(shared), f"vocabulary map: {prompt}", unit="tokens", every=10.0)
    return both_token_rewards(a, b, shared, progress)


def vocab_map(shared: pd.DataFrame, rewards: tuple[np.ndarray, np.ndarray, int], z_a: tuple[float, float],
              z_b: tuple[float, float], prompt: str, left_out: int = 0) -> tuple[pd.DataFrame, dict]:
    """Per shared string: both sides' single-token rewards (map_rewards), their z and the gap z_A − z_B, sorted by
    gap (largest first, ties by text); and the summary: Kendall τ (b) between the sides' rewards over the strings,
    their Pearson r and the affine-invariant distance sqrt((1 − r) / 2) of the standardised rewards (EPIC's).
    `left_out`: shared strings a side does not read as that token in a conversation (disagree_job._read_back)."""
    ra, rb, layers = rewards
    frame = shared.assign(prompt=prompt, reward_a=ra, reward_b=rb, z_a=z_of(ra, z_a), z_b=z_of(rb, z_b))
    frame["gap"] = frame["z_a"] - frame["z_b"]
    frame = frame.sort_values(["gap", "text"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    return frame[["prompt", "text", "token_a", "token_b", "reward_a", "reward_b", "z_a", "z_b", "gap"]], \
        agreement(ra, rb) | {"shared_layers": layers, "left_out": left_out}


def prompt_shifts(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Per prompt (with two or more maps): each string's gap after it, its mean gap after the other prompts and the
    shift between them, over the strings every map holds, largest shift first (ties by text). A disagreement that
    holds after one prompt alone (a preference tied to a framing) tops this list; at the map's own ends it is
    swamped by what the sides disagree on after every prompt (the planted bench: framed words 17th-22nd there)."""
    if len(frames) < 2:
        return {}
    gaps = pd.concat({p: f.set_index("text")["gap"] for p, f in frames.items()}, axis=1, join="inner")
    gaps = gaps[np.isfinite(gaps.to_numpy()).all(axis=1)]  # a NaN (--allow_nonfinite) has no shift to rank
    out = {}
    for p in frames:
        others = gaps.drop(columns=p).mean(axis=1)
        table = pd.DataFrame({"text": gaps.index, "gap": gaps[p].to_numpy(), "others_gap": others.to_numpy(),
                              "shift": (gaps[p] - others).to_numpy()})
        out[p] = table.sort_values(["shift", "text"], ascending=[False, True], kind="mergesort").reset_index(drop=True)
    return out


def both_token_rewards(a: Side, b: Side, shared: pd.DataFrame, progress: Progress | None = None
                       ) -> tuple[np.ndarray, np.ndarray, int]:
    """Both sides' single-token rewards of the shared strings, and how many leading layers were run once for both:
    two RMs that hold their first layers alike (one fine-tuned from the other with those layers frozen) and read
    the strings as the same tokens share that part of every forward (rmjax.scoring.forked); others run their own."""
    ids_a, ids_b = shared["token_a"].to_numpy(), shared["token_b"].to_numpy()
    layers = a.shared_layers(b) if isinstance(a, RewardSide) and np.array_equal(ids_a, ids_b) else 0
    if not layers:
        return token_rewards_of(a, ids_a, progress), token_rewards_of(b, ids_b, progress), 0
    return (*a.forked_token_rewards(b, ids_a, layers, progress, MAP_CHUNK), layers)


def agreement(ra: np.ndarray, rb: np.ndarray) -> dict:
    """Kendall τ (b), Pearson r and the EPIC-style distance sqrt((1 − r)/2) (Gleave et al.: Pearson distance after
    standardising; 0 equal up to an affine map, 1 opposite) of two reward vectors over the same items, over the
    items where both are finite (`nonfinite`: those left out; only --allow_nonfinite writes any, and one NaN made
    every statistic of the prompt NaN)."""
    ra, rb = np.asarray(ra, np.float64), np.asarray(rb, np.float64)
    both = np.isfinite(ra) & np.isfinite(rb)
    ra, rb, dropped = ra[both], rb[both], int((~both).sum())
    if len(ra) < analysis_stats.MIN_ITEMS:  # two items: tau and r +-1 whatever the models
        return {"n": int(len(ra)), "nonfinite": dropped, "kendall_tau": float("nan"), "pearson_r": float("nan"),
                "epic_distance": float("nan")}
    return {"n": int(len(ra)), "nonfinite": dropped, "kendall_tau": float(stats.kendalltau(ra, rb).statistic),
            "pearson_r": analysis_stats.pearson(ra, rb), "epic_distance": analysis_stats.epic_distance(ra, rb)}
