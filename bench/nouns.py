"""The findings' candidate set: the N most frequent BNC common nouns that are one token, with their leading space,
in the tokenizers of both default reward models (so both models search the same words).

python bench/nouns.py results/findings/words500.txt [--n=500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=500)
    args = ap.parse_args()

    from rmjax.data import BNC_FREQUENCIES
    from rmjax.loading import load

    tokenizers = [load(m).tokenizer for m in ("elo-rm-smollm2-135m", "elo-rm-gemma3-270m")]
    frequency: dict[str, float] = {}
    for line in open(BNC_FREQUENCIES, encoding="latin-1"):
        fields = line.rstrip("\n").split("\t")
        fields = fields[1:] if fields and fields[0] == "" else fields
        word = fields[0] if fields else ""
        if len(fields) >= 4 and fields[1] == "NoC" and word.isalpha() and word.islower() and len(word) >= 3:
            try:
                frequency[word] = frequency.get(word, 0.0) + float(fields[3])
            except ValueError:
                pass
    words = [f" {w}" for w in sorted(frequency, key=lambda w: -frequency[w])
             if all(len(t(f" {w}", add_special_tokens=False).input_ids) == 1 for t in tokenizers)][: args.n]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(words) + "\n", encoding="utf-8")
    print(f"{len(words)} words -> {args.out}: {words[:5]} … {words[-3:]}")


if __name__ == "__main__":
    main()
