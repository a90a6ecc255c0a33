"""Comparing a run's identity with what an output or saved progress records (rmjax.runs.claims): equality as a
stored .meta.json reads back, what changed, and the order of the prompt columns."""

from __future__ import annotations

import json
from pathlib import Path

from rmjax.runs import atomic
from rmjax.runs.results import json_safe


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted names of the entries that differ between two identities."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def canonical(identity: dict) -> dict:
    """The identity as it reads back from a stored .meta.json (so a fresh one compares equal to it)."""
    return json.loads(json.dumps(json_safe(identity), sort_keys=True, default=str))


def key_order(value: object, path: str = "") -> dict[str, list[str]]:
    """The key order of every mapping of two or more keys in an identity, by dotted path: what `canonical` loses
    and a result keeps (the sweep's, beam's and score's columns are their prompts in the order given)."""
    out: dict[str, list[str]] = {}
    if isinstance(value, dict):
        if len(value) > 1:
            out[path or "identity"] = [str(k) for k in value]
        for key, item in value.items():
            out.update(key_order(item, f"{path}.{key}" if path else str(key)))
    return out


def prompt_order(identity: object) -> dict[str, list[str]]:
    """The order of the identity's prompt mappings: the order its result's prompt columns are written in, which
    the user chose (--prompts); the other mappings' order is the code's, and may change between versions."""
    return {path: keys for path, keys in key_order(identity).items() if path.split(".")[-1] == "prompts"}


def without_typed_paths(identity: dict) -> dict:
    """An identity as rmjax records it since s123: a disagree's sides by kind, no judge or input file by the path
    typed (their content fingerprints and digests were recorded beside them, and still are)."""
    out = canonical(identity)
    if isinstance(out.get("judge"), dict):
        out["judge"].pop("spec", None)
    for side in out.get("sides") if isinstance(out.get("sides"), list) else ():
        if isinstance(side, dict) and side.pop("spec", None) is not None:
            side.setdefault("kind", "implicit" if len(side.get("models") or ()) == 2 else "rm")
    config = out.get("config") if isinstance(out.get("config"), dict) else {}
    for name in ("init_from", "vocab_file"):
        if isinstance(config.get(name), dict):
            config[name].pop("path", None)
    return out


def of_an_older_rmjax(old: dict, new: dict) -> bool:
    """Whether `old` is `new`'s inputs as an rmjax before s123 recorded them (the paths as typed): not reused or
    continued (the records around it hold the old identity), but said so, not as a change the user made."""
    return old != canonical(new) and without_typed_paths(old) == canonical(new)


OLDER_RMJAX = ("was made from these inputs by an older rmjax (it recorded the paths as typed), which this version "
               "cannot reuse or continue")


def mismatch_message(what: str, old: dict, new: dict, flag: str = "--out") -> str:
    if of_an_older_rmjax(old, new):
        return f"{what} {OLDER_RMJAX}; pass --overwrite to recompute it, or choose another {flag}."
    keys = changed_keys(without_typed_paths(old), canonical(new))  # what the user changed, not how it was recorded
    return (f"{what} was made by a run with different {', '.join(keys) or 'settings'}. Rerun with the same "
            f"model and settings to continue it, pass --overwrite to discard it, or choose another {flag}.")


def require_claimed(claimed: dict, loaded: dict, out: str | Path) -> None:
    """An output claimed before the model loaded (its identity from the fingerprint) is written only by a run of
    that model: a different identity after loading is a bug of ours, never a result under another run's name."""
    if canonical(claimed) != canonical(loaded):
        raise RuntimeError(f"internal error: {out} was claimed for other inputs than the loaded model's (different "
                           f"{', '.join(changed_keys(canonical(claimed), canonical(loaded)))}); please report it.")


def read_meta_identity(meta: Path) -> dict | None:
    """The identity a .meta.json or manifest records (None without one; a FIFO or device there is never read)."""
    saved = atomic.read_json(meta)
    return saved.get("identity") if isinstance(saved, dict) else None
