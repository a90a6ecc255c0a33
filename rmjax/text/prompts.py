"""Builtin prompts: the first paper's three and the second paper's 54-prompt factorial set."""

from __future__ import annotations

from pathlib import Path

from rmjax.errors import UsageError, require_file
from rmjax.text import yamlfile

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


def read_prompt_file(path: Path) -> dict[str, str]:
    """`name: text` pairs of a YAML file; every value must be a non-empty string (a bare `null`, `yes` or
    number would otherwise become the prompt "None", "True" or "7")."""
    require_file(path, f"prompt file {path}")
    # Names as written (`007:` stays "007", not 7); a name given twice is refused, not its first text dropped.
    data = yamlfile.load(path, keys_as_written=True)
    if not isinstance(data, dict) or not data:
        raise UsageError(f"{path}: expected a mapping `name: prompt text`, one per line.")
    out = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key.strip():
            raise UsageError(f"{path}: prompt name {key!r} is not a name; write `name: \"the prompt text\"`.")
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{path}: prompt {key!r} has no text (YAML read {value!r}); write `{key}: "
                             "\"the prompt text\"` in quotes.")
        out[key] = value
    return out


def _add(out: dict[str, str], name: str, text: str, where: str) -> None:
    if name in out and out[name] != text:
        raise UsageError(f"prompt name {name!r} is given twice with different texts ({where}); rename one.")
    out[name] = text


def resolve_prompts(names: str | list[str] | None = None, extra: list[str] | None = None) -> dict[str, str]:
    """Prompts from builtin names, set names (paper1, prompts54), YAML files, and name=text pairs."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: dict[str, str] = {}
    known = builtin_prompts()
    repeated = sorted({n for n in names or [] if list(names).count(n) > 1})
    if repeated:  # one column per name: a name twice was kept once, unsaid
        raise UsageError(f"--prompts names {repeated[0]} more than once; give each once.")
    for name in names or []:
        if name in PROMPT_SETS:
            for key, text in PROMPT_SETS[name].items():
                _add(out, key, text, name)
        elif name in known:
            _add(out, name, known[name], "builtin")
        elif name.endswith((".yaml", ".yml")):
            for key, text in read_prompt_file(Path(name)).items():
                _add(out, key, text, name)
        else:
            raise UsageError(
                f"unknown prompt {name!r}: use greatest, best, worst, a name from the 54-prompt set "
                "(e.g. best_world_please), a set (paper1, prompts54), a .yaml file, or --prompt=name=text."
            )
    for item in extra or []:
        name, sep, text = item.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise UsageError(f"--prompt expects name=text, got {item!r}")
        _add(out, name, text, "--prompt")
    if not out:
        raise UsageError("no prompts given.")
    return out


def check_prompt_names(prompts: dict[str, str], reserved: list[str] | tuple[str, ...]) -> None:
    """Prompt names become CSV columns: they may not repeat a key column."""
    clash = [name for name in prompts if name in reserved]
    if clash:
        raise UsageError(f"prompt name {clash[0]!r} is a key column of the result ({', '.join(reserved)}); rename "
                         "the prompt.")
