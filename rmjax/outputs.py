"""Output safety shared by every job: identity, reuse, refusal to overwrite, writability, locks.

A job's *identity* is everything its result depends on: the model's content fingerprint
(weights, tokenizer and chat template), dtype, output column, prompts and every flag that changes
the numbers. It is written into the result's `.meta.json` and into any saved progress (the
sweep's chunk store, a training workdir), so that

- a finished result with the same identity is reported and reused, not recomputed;
- a result or saved progress of a run with another identity is never overwritten or continued:
  the job stops, naming what changed, unless `--overwrite` is given (which removes the old
  result before the new run starts);
- two runs never write the same output at once (an advisory lock, `OUT.lock`).

`claim` does all of this before the model loads; the library functions that write call it again
(the lock is re-entrant), so they are safe when called directly too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from rmjax import locks
from rmjax.distributed import is_main
from rmjax.errors import OutputExistsError, ResumeMismatchError, UsageError
from rmjax.results import meta_path


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
    """The identity as it reads back from JSON (so a fresh one compares equal to a stored one)."""
    return json.loads(json.dumps(identity, sort_keys=True, default=str))


def mismatch_message(what: str, old: dict, new: dict, flag: str = "--out") -> str:
    keys = changed_keys(old, canonical(new))
    return (f"{what} was made by a run with different {', '.join(keys) or 'settings'}. Rerun with the same "
            f"model and settings to continue it, pass --overwrite to discard it, or choose another {flag}.")


def check_writable(path: str | Path, flag: str = "--out", folder: bool = False) -> Path:
    """Fail now, not after the work, when `path` cannot be written."""
    path = Path(path)
    if not folder and path.is_dir():
        raise UsageError(f"{flag}={path} is a directory; give a file path such as {path / 'result'}.")
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{flag}={path} is a file; give a folder.")
    parent = path if folder else path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".rmjax-write-test-"):
            pass
    except OSError as error:
        raise UsageError(f"{flag}={path}: cannot write in {parent} ({error.strerror or error}).") from None
    return path


def read_meta_identity(meta: Path) -> dict | None:
    try:
        return json.loads(meta.read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None


def remove(paths: Sequence[Path]) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


@dataclasses.dataclass
class Claim:
    """The decision taken for one output: `reuse` (a finished result with this identity is there) or
    write it (fresh, resuming saved progress, or replacing an old result with --overwrite)."""

    out: Path
    identity: dict
    reuse: bool = False
    resume: bool = False


def _present(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def _decide(out: Path, meta: Path, identity: dict, overwrite: bool, owned: list[Path], store: Path | None,
            flag: str) -> Claim:
    identity = canonical(identity)
    existing = [p for p in dict.fromkeys([out, meta, *owned]) if _present(p)]
    stored = read_meta_identity(meta) if meta.is_file() else None
    if not overwrite and _present(out) and stored == identity:
        return Claim(out, identity, reuse=True)
    manifest = store / "manifest.json" if store is not None else None
    if manifest is not None and manifest.is_file():
        progress = read_meta_identity(manifest)
        if overwrite:
            existing.append(store)  # --overwrite recomputes everything
        elif progress == identity:
            return Claim(out, identity, resume=True)  # continue it; the old outputs are replaced at the end
        else:
            raise ResumeMismatchError(mismatch_message(f"saved progress {store}", progress or {}, identity, flag))
    if existing and not overwrite:
        if stored is None:
            why = "is not a finished rmjax result (no .meta.json with its inputs)"
        else:
            why = f"holds the result of a run with different {', '.join(changed_keys(stored, identity))}"
        raise OutputExistsError(f"{flag}={out} already exists and {why}. Pass --overwrite to replace it, or "
                                "choose another output.")
    if existing and is_main():
        remove(existing)
    return Claim(out, identity)


@contextlib.contextmanager
def claim(out: str | Path, identity: dict, *, overwrite: bool = False, owned: Sequence[str | Path] = (),
          store: str | Path | None = None, flag: str = "--out", meta: str | Path | None = None,
          folder: bool = False) -> Iterator[Claim]:
    """Check, lock and decide for output `out` (+ `owned` companions, + a progress `store`), held until
    the block ends. Only process 0 locks and removes; every process takes the same decision."""
    out = check_writable(out, flag, folder=folder)
    meta = Path(meta) if meta is not None else meta_path(out)
    owned = [Path(p) for p in owned]
    store = Path(store) if store is not None else None
    lock = locks.hold(out, what=f"{flag}={out}") if is_main() else contextlib.nullcontext()
    with lock:
        yield _decide(out, meta, identity, overwrite, owned, store, flag)
