"""Builtin prompts: the first paper's three and the second paper's 54-prompt factorial set."""

from __future__ import annotations

from pathlib import Path

import yaml

PAPER1 = {
    "greatest": "What, in one word, is the greatest thing ever?",
    "best": "What, in one word, is the best thing ever?",
    "worst": "What, in one word, is the worst thing ever?",
}

# 6 adjectives x 3 superlative scopes x 3 answer-length styles (paper 2).
ADJECTIVES = {
    "best": "the best",
    "greatest": "the greatest",
    "good": "the most good",
    "worst": "the worst",
    "bad": "the most bad",
    "terrible": "the most terrible",
}
SCOPES = {"ever": "ever", "world": "in the world", "time": "of all time"}
STYLES = {
    "one": "What, in one word, is {adj} thing {scope}?",
    "single": "What, in a single word, is {adj} thing {scope}?",
    "please": "What is {adj} thing {scope}? Please answer in one word only.",
}


def factorial_prompts() -> dict[str, str]:
    return {
        f"{a}_{s}_{st}": template.format(adj=adj, scope=scope)
        for a, adj in ADJECTIVES.items()
        for s, scope in SCOPES.items()
        for st, template in STYLES.items()
    }


PROMPT_SETS = {"paper1": PAPER1, "prompts54": factorial_prompts()}


def builtin_prompts() -> dict[str, str]:
    return {**PAPER1, **factorial_prompts()}


def resolve_prompts(names: str | list[str] | None = None, extra: list[str] | None = None) -> dict[str, str]:
    """Prompts from builtin names, set names (paper1, prompts54), YAML files, and name=text pairs."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: dict[str, str] = {}
    known = builtin_prompts()
    for name in names or []:
        if name in PROMPT_SETS:
            out.update(PROMPT_SETS[name])
        elif name in known:
            out[name] = known[name]
        elif name.endswith((".yaml", ".yml")):
            path = Path(name)
            if not path.is_file():
                raise FileNotFoundError(f"prompt file {path} not found.")
            data = yaml.safe_load(path.read_text())
            if not isinstance(data, dict):
                raise ValueError(f"{path}: expected a mapping `name: prompt text`.")
            out.update({str(k): str(v) for k, v in data.items()})
        else:
            raise ValueError(
                f"unknown prompt {name!r}: use greatest, best, worst, a name from the 54-prompt set "
                "(e.g. best_world_please), a set (paper1, prompts54), a .yaml file, or --prompt=name=text."
            )
    for item in extra or []:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            raise ValueError(f"--prompt expects name=text, got {item!r}")
        out[name] = text
    if not out:
        raise ValueError("no prompts given.")
    return out
