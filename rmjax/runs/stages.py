"""One check for every stage that reads an earlier stage's result: beam --from_sweep, frontier --sweep, inspect
--from_sweep / --from_beam, gcg --init_from, and analyze's tables.

A result is read only when it is whole and of an accepted kind (rmjax.runs.results.checked_input) and when the run
that wrote it used what the reader needs (`Needs`): the same model content, dtype, output column, template and
token mode, and for each of the reader's prompt names the same prompt text (more prompts are fine; a sweep of
another text under the same name is not). The kind and the digest alone let a sweep of another model or another
prompt text through. Anything else stops the job in one line, before the model loads; what was read comes back
with its sha1, which the reader records in its own .meta.json (`StageInput.record`, under `inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rmjax.errors import InputFileError, UsageError
from rmjax.runs import results
from rmjax.runs.identities import canonical, changed_keys

DEFAULT_WHY = ("its numbers are not this run's; give one made with the same model content, dtype, output column, "
               "template and prompt texts")


@dataclasses.dataclass(frozen=True)
class Needs:
    """What a reader needs of the run that wrote its input (None / empty: anything)."""

    model: dict | None = None  # content fingerprint (rmjax.loading.fingerprint): weights and tokenizer
    tokenizer_of: tuple[dict, ...] = ()  # fingerprints: the input's ids must be tokens of one of their tokenizers
    dtype: str | None = None
    output_column: int | None = None
    template: str | None = None
    mode: str | None = None  # "token": scores of prefix + ids + suffix (rmjax.search.sweep)
    prompts: Mapping[str, str] | None = None  # the reader's prompt names -> texts


@dataclasses.dataclass(frozen=True)
class StageInput:
    """An earlier result as read: its path, its .meta.json (None for a bare table) and the sha1 of its bytes."""

    path: Path
    meta: dict | None
    sha1: str

    def record(self) -> dict:
        """What the reader's .meta.json says it read (under `inputs`, by flag)."""
        return {"path": str(self.path), "sha1": self.sha1}


def read_input(path: str | Path, kinds: Iterable[str], flag: str, needs: Needs | None = None, *,
               bare: str | None = None, why: str = DEFAULT_WHY) -> StageInput:
    """The earlier result at `path`, refused in one line unless it is whole, of one of `kinds` and made by a run
    with what `needs` asks for (`why`: what the reader would get wrong otherwise, ending the message). `bare`
    allows a table without .meta.json (results.checked_input; nothing can be checked then)."""
    path = Path(path)
    meta = results.checked_input(path, kinds, flag, bare=bare)
    if meta is not None and needs is not None:
        differ = differences(meta, needs, path, flag)
        if differ:
            keys, details = zip(*differ, strict=True)
            shown = "; ".join(d for d in details if d)
            raise UsageError(f"{flag}={path} was made by a run with different {', '.join(keys)}"
                             f"{f' ({shown})' if shown else ''}: {why}.")
    return StageInput(path, meta, results.file_sha1(path))


def stored_identity(meta: dict, path: str | Path, flag: str) -> dict:
    """The identity of the run that wrote a result (every rmjax job records one in .meta.json)."""
    identity = meta.get("identity")
    if not isinstance(identity, dict) or not identity.get("job"):
        raise InputFileError(f"{flag}={path}: its {results.meta_path(path).name} records no identity of the run that "
                             "wrote it (an older rmjax, or edited); rerun that job.")
    return identity


def _facts(identity: dict) -> dict:
    """The identity's model fingerprints (a GCG run has several), dtype, output column, template, mode, prompts."""
    config = identity.get("config") if isinstance(identity.get("config"), dict) else {}
    models = identity.get("models") if isinstance(identity.get("models"), list) else [identity.get("model")]
    token_mode = identity.get("job") in ("beam", "gcg", "inspect")  # they score prefix + ids + suffix only
    return {"models": [m for m in models if isinstance(m, dict)], "dtype": identity.get("dtype"),
            "output_column": identity.get("output_column"),
            "template": identity.get("template", config.get("template")),
            "mode": identity.get("mode", "token" if token_mode else None),
            "prompts": identity.get("prompts") if isinstance(identity.get("prompts"), dict) else {}}


def template_used(meta: Mapping, template: object) -> object:
    """`template` as rendered for the one model a result's .meta.json records: auto is chat where its tokenizer has a
    chat template (the record's chat_template_head) and plain where it has none; an older record, without the head,
    says only what was given."""
    if template == "auto" and "chat_template_head" in meta:
        return "chat" if meta["chat_template_head"] is not None else "plain"
    return template


def recorded_template(meta: Mapping) -> object:
    """The template a result was made under, as rendered (`template_used` of its identity's --template)."""
    identity = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
    return template_used(meta, identity.get("template", meta.get("template")))


def differences(meta: dict, needs: Needs, path: str | Path = "", flag: str = "") -> list[tuple[str, str]]:
    """(key, detail) of each thing the run recorded in `meta` differs in from `needs` (empty: none)."""
    facts = _facts(stored_identity(meta, path, flag))
    out: list[tuple[str, str]] = []
    # one model, this reader's: --template=auto there and chat or plain here are one rendering where auto rendered so
    same_model = needs.model is not None and facts["models"] == [canonical(needs.model)]
    if needs.model is not None:
        want = canonical(needs.model)
        if want not in facts["models"]:
            keys = changed_keys(facts["models"][0], want) if len(facts["models"]) == 1 else ["weights"]
            out += [(f"model.{k}", "") for k in keys or ["fingerprint"]]
    if needs.tokenizer_of:
        theirs = {m.get("tokenizer") for m in facts["models"]}
        if not theirs & {fp.get("tokenizer") for fp in needs.tokenizer_of}:
            out.append(("model.tokenizer", "its token ids are other tokens"))
    for key in ("dtype", "output_column", "template", "mode"):
        want = getattr(needs, key)
        if key == "template" and same_model and template_used(meta, facts[key]) == template_used(meta, want):
            continue
        if want is not None and facts[key] != want:
            out.append((key, f"{key} {facts[key]!r} there, {want!r} here"))
    for name, text in (needs.prompts or {}).items():
        there = facts["prompts"].get(name)
        if there != text:
            out.append((f"prompts.{name}", f"no prompt {name!r} there" if there is None
                        else f"prompt {name!r} is {_short(there)} there, {_short(text)} here"))
    return out


def _short(text: object, most: int = 60) -> str:
    text = str(text)
    return repr(text if len(text) <= most else text[: most - 1] + "…")


def recorded(inputs: Mapping[str, StageInput | None]) -> dict:
    """The `inputs` field of a reader's .meta.json: per flag, the path and sha1 of the result it read."""
    return {flag: given.record() for flag, given in inputs.items() if given is not None}


def sweep_subset(identity: Mapping | None) -> dict[str, object]:
    """The flags that chose a sweep's candidates from its identity (--limit: the first N; --token_ids, --vocab_file:
    a set), each with its value; empty for a whole-vocabulary sweep or another kind of result."""
    if not identity or identity.get("job") != "sweep":
        return {}
    return {key: identity[key] for key in ("limit", "token_ids", "vocab_file") if identity.get(key) is not None}


def prompt_texts(meta: dict | None) -> dict[str, str]:
    """Prompt name -> text of a result's .meta.json (its identity's, else its top-level `prompts`; {} without)."""
    if meta is None:
        return {}
    identity = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
    prompts = identity.get("prompts", meta.get("prompts"))
    return {str(k): v for k, v in prompts.items() if isinstance(v, str)} if isinstance(prompts, dict) else {}


def same_prompt_texts(tables: Sequence[tuple[str, Path]]) -> None:
    """Tables compared column by column (analyze): a prompt name must mean one prompt text in every table whose
    .meta.json says (`(flag, path)` each; bare tables say nothing), else their columns of that name score
    different conversations and are refused in one line."""
    first: dict[str, tuple[str, str, Path]] = {}
    for flag, path in tables:
        for name, text in prompt_texts(results.read_meta(path)).items():
            seen = first.setdefault(name, (text, flag, path))
            if seen[0] != text:
                raise UsageError(f"prompt {name!r} is {_short(seen[0])} in {seen[1]}={seen[2]} but {_short(text)} in "
                                 f"{flag}={path}: their {name!r} columns score different prompts and cannot be "
                                 "compared; rescore one with the other's text, or give it another name.")
