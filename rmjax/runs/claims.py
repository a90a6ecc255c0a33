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

A job claims its output once, before the model loads (rmjax.runs.options, rmjax.runs.jobs), and hands the
claim to the code that writes. Claims are not re-entrant: claiming an output this process already holds is
refused like any other run's (its lock is held).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from rmjax.errors import OutputExistsError, ResumeMismatchError, UsageError
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs import locks, results
from rmjax.runs.results import json_safe, meta_path


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


def mismatch_message(what: str, old: dict, new: dict, flag: str = "--out") -> str:
    keys = changed_keys(old, canonical(new))
    return (f"{what} was made by a run with different {', '.join(keys) or 'settings'}. Rerun with the same "
            f"model and settings to continue it, pass --overwrite to discard it, or choose another {flag}.")


def require_claimed(claimed: dict, loaded: dict, out: str | Path) -> None:
    """An output claimed before the model loaded (its identity from the fingerprint) is written only by a run of
    that model: a different identity after loading is a bug of ours, never a result under another run's name."""
    if canonical(claimed) != canonical(loaded):
        raise RuntimeError(f"internal error: {out} was claimed for other inputs than the loaded model's (different "
                           f"{', '.join(changed_keys(canonical(claimed), canonical(loaded)))}); please report it.")


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


# What a chunk store (rmjax.runs.chunks) holds that its job wrote: the chunks, their temp files, the manifest and
# its temp file (rmjax.runs.results.atomic_write_text). Anything else in the folder is not the job's to delete.
STORE_FILES = ("chunk-*.npy", "tmp-chunk-*.npy", "manifest.json", ".manifest.json.*.tmp")


def store_files(store: Path) -> tuple[list[Path], list[Path]]:
    """(the files of `store` its job wrote, everything else in it), each sorted; both empty without the folder,
    and a file (or link) in the folder's place is foreign itself."""
    if not store.is_dir() or store.is_symlink():
        return [], ([store] if store.exists() or store.is_symlink() else [])
    own, foreign = [], []
    for entry in sorted(store.iterdir()):
        is_own = entry.is_file() and not entry.is_symlink() and any(fnmatch.fnmatchcase(entry.name, pattern)
                                                                     for pattern in STORE_FILES)
        (own if is_own else foreign).append(entry)
    return own, foreign


def clear_store(store: Path) -> None:
    """Delete what the job wrote in its chunk store, then the folder once empty (anything else stays, named)."""
    own, foreign = store_files(store)
    for path in own:
        path.unlink(missing_ok=True)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        print(f"note: kept {store}: it holds {foreign[0].name}{more}, which no rmjax job wrote.", file=sys.stderr,
              flush=True)
        return
    with contextlib.suppress(FileNotFoundError):
        store.rmdir()


def remove(paths: Sequence[Path], store: Path | None = None) -> None:
    """Delete `paths` (files; folders an rmjax run made, whole) and then, with `store`, the chunk store's own
    files (`clear_store`)."""
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    if store is not None:
        clear_store(store)


@dataclasses.dataclass
class Claim:
    """The decision taken for one output: `reuse` (a finished result with this identity is there) or
    write it (fresh, resuming saved progress, or replacing an old result with --overwrite). `remove`
    lists what process 0 deletes before the work starts, and `clear` a chunk store whose own files it deletes
    (never anything else in that folder)."""

    out: Path
    identity: dict
    reuse: bool = False
    resume: bool = False
    remove: tuple[Path, ...] = ()
    clear: Path | None = None


def _present(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def _refuse(flag: str, out: Path, why: str) -> OutputExistsError:
    return OutputExistsError(f"{flag}={out} already exists and {why}. Pass --overwrite to replace it, or choose "
                             "another output.")


def _decide(out: Path, meta: Path, identity: dict, overwrite: bool, owned: list[Path], store: Path | None,
            flag: str, folder: bool) -> Claim:
    """Read-only: what to do with `out` (raises when it may not be written)."""
    existing = [p for p in dict.fromkeys([out, meta, *owned]) if _present(p)]
    stored = read_meta_identity(meta) if meta.is_file() else None
    if stored == identity and _present(out):
        if not overwrite:  # finished; a leftover store of the same run is only a crash's residue
            if not folder:  # a file result is reused only when it is byte for byte what was written
                problem = results.damage(out, json.loads(meta.read_text()))
                if problem is not None:
                    raise OutputExistsError(f"{flag}={out} holds a result of these inputs that does not match its "
                                            f"{meta.name}: {problem}. Pass --overwrite to recompute it.")
            leftover = store if store is not None and store.is_dir() else None
            return Claim(out, identity, reuse=True, clear=leftover)
    elif stored == identity:
        stored = None  # its .meta.json outlived the result: recompute it
    elif folder and _present(out) and stored is None:
        # A folder is only ever replaced when an rmjax run of this kind made it (never a user's tree).
        raise OutputExistsError(f"{flag}={out} holds files that no rmjax run of this kind wrote (no {meta.name}); "
                                "choose an empty or new folder.")
    clear = None
    if store is not None and _present(store):
        progress = read_meta_identity(store / "manifest.json")
        if overwrite:  # --overwrite recomputes everything: it deletes the store's chunks, and nothing else
            foreign = store_files(store)[1]
            if foreign:
                raise OutputExistsError(f"--overwrite would delete {flag}={out}'s saved progress {store}, but it also "
                                        f"holds {foreign[0]}, which no rmjax job wrote; move it elsewhere, or choose "
                                        "another output.")
            clear = store
        elif progress == identity:
            return Claim(out, identity, resume=True)  # continue it; the old outputs are replaced at the end
        elif progress is None:
            raise _refuse(flag, store, "holds chunks without a manifest (not a resumable rmjax run)")
        else:
            raise ResumeMismatchError(mismatch_message(f"saved progress {store}", progress, identity, flag))
    if existing and not overwrite:
        if stored is None:
            raise _refuse(flag, out, "is not a finished rmjax result (no .meta.json with its inputs)")
        changed = ", ".join(changed_keys(stored, identity))
        raise _refuse(flag, out, f"holds the result of a run with different {changed}")
    return Claim(out, identity, remove=tuple(existing), clear=clear)


def real_path(path: str | Path) -> Path:
    """`path` as given, or its target where a symlink is on the way: a symlink and its target are one output
    (one lock, one .meta.json), and writing replaces the target's content, not the link."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    return real if real != Path(os.path.abspath(path)) else path


@contextlib.contextmanager
def claim(out: str | Path, identity: dict, *, overwrite: bool = False, owned: Sequence[str | Path] = (),
          store: str | Path | None = None, flag: str = "--out", meta: str | Path | None = None,
          folder: bool = False) -> Iterator[Claim]:
    """Check, lock and decide for output `out` (+ `owned` companions, + a progress `store`), held until
    the block ends. Every process takes the same read-only decision; then process 0 (which holds the
    lock) removes what --overwrite replaces."""
    identity = canonical(identity)
    out = check_writable(real_path(out), flag, folder=folder)
    meta = Path(meta) if meta is not None else meta_path(out)
    owned = [real_path(p) for p in owned]
    with contextlib.ExitStack() as held:
        if is_main():  # the companions too: another job's --out may name one of them
            for path in dict.fromkeys([out, *owned]):
                held.enter_context(locks.hold(path, what=f"{flag}={out}"))
        decision = _decide(out, meta, identity, overwrite, owned,
                           Path(store) if store is not None else None, flag, folder)
        barrier("rmjax-claim")  # every process decided before anything is removed
        if (decision.remove or decision.clear) and is_main():
            remove(decision.remove, decision.clear)
        yield decision
