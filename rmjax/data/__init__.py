"""The data the analyses and the default reward models' recipe read, shipped inside the package so that a clone or
a `pip install` has it (MIT licence: LICENSE-elo-and-corpora.txt beside these files).

- elo/*.csv: EloEverything human Elo ratings and the ten published RMs' scores, one file per prompt (named after
  the prompt, minus its question mark); `--elo=builtin` reads them.
- corpora/1_1_all_alpha.txt: BNC word frequencies (the analyses' `--frequencies` default).
- reward_models.yaml: the ten published RMs (the analyses' `--models_yaml` default).
- prompts.yaml, prompts54.yaml: the two papers' prompt sets (rmjax.text.prompts builds the same ones).
- audit/*.yaml: the bias audit's counterfactual batteries (rmjax.audit.batteries; LICENSE-audit.txt beside them).

Imports nothing from rmjax, so every layer may use it.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
ELO_DIR = DATA_DIR / "elo"
BNC_FREQUENCIES = DATA_DIR / "corpora" / "1_1_all_alpha.txt"
REWARD_MODELS_YAML = DATA_DIR / "reward_models.yaml"
PROMPTS_YAML = DATA_DIR / "prompts.yaml"
PROMPTS54_YAML = DATA_DIR / "prompts54.yaml"
LICENSE = DATA_DIR / "LICENSE-elo-and-corpora.txt"
AUDIT_DIR = DATA_DIR / "audit"

BUILTIN = "builtin"  # `--elo=builtin`: the EloEverything files above
GREATEST = "What, in one word, is the greatest thing ever"  # the default reward models' training prompt


def elo_files() -> dict[str, Path]:
    """The shipped EloEverything files by prompt (without its question mark)."""
    return {path.stem: path for path in sorted(ELO_DIR.glob("*.csv"))}


def elo_file(prompt: str = GREATEST) -> Path | None:
    """The shipped EloEverything file of `prompt` (its question mark optional); None when none ships."""
    return elo_files().get(prompt.strip().removesuffix("?"))


def builtin_elo_choices() -> str:
    """The `--elo=builtin:<prompt>` spellings that name a shipped file, for a refusal to list."""
    return ", ".join(f'"{BUILTIN}:{name}"' for name in elo_files())
