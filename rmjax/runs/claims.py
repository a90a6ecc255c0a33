"""Output safety shared by every job: identity, reuse, refusal to overwrite, writability, locks.

A job's *identity* is everything its result depends on: the model's content fingerprint
(weights, tokenizer and chat template), dtype, output column, prompts and every flag that changes
the numbers. It is written into the result's `.meta.json` and into any saved progress (the
sweep's chunk store, a training workdir), so that

- a finished result with the same identity is reported and reused, not recomputed;
- a result or saved progress of a run with another identity is never overwritten or continued:
  the job stops, naming what changed, unless `--overwrite` is given (which removes the old
  result before the new run starts);
- a file at a companion's path (a figure, a steps CSV) that the output's `.meta.json` does not record is never
  written over unasked, whether the run is fresh or resumed;
- `--overwrite` deletes only what a job wrote (the files a folder output's job declares, a chunk store's own),
  and refuses a folder that holds anything else, every output of a run decided before anything is deleted;
- two runs never write the same output at once (an advisory lock, `OUT.lock`).

A job claims its output once, before the model loads (rmjax.runs.options, rmjax.runs.jobs), and hands the
claim to the code that writes. Claims are not re-entrant: claiming an output this process already holds is
refused like any other run's (its lock is held).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from rmjax.errors import OutputExistsError, ResumeMismatchError, UsageError
from rmjax.parallel.distributed import barrier, is_main
from rmjax.runs import atomic, locks, results
from rmjax.runs.folder_files import foreign_refusal, remove, store_files
from rmjax.runs.identities import (
    OLDER_RMJAX,
    canonical,
    changed_keys,
    mismatch_message,
    of_an_older_rmjax,
    prompt_order,
    read_meta_identity,
    without_typed_paths,
)
from rmjax.runs.paths import check_writable, companion_path, flag_name, named, real_path, refuse_folder_name
from rmjax.runs.results import meta_path

INTERRUPTED = "interrupted.json"  # in the store: the companions a run wrote before it was stopped in its last writes


@dataclasses.dataclass
class Claim:
    """The decision taken for one output: `reuse` (a finished result with this identity is there) or
    write it (fresh, resuming saved progress, or replacing an old result with --overwrite). `remove`
    lists what process 0 deletes (before the work starts, or with `claim_all(defer_removal=True)` those the new
    result did not replace, once it is written: jobs.Job.finish), and `clear` a chunk store whose own files it
    deletes at once (never anything else in that folder)."""

    out: Path
    identity: dict
    reuse: bool = False
    resume: bool = False
    remove: tuple[Path, ...] = ()
    clear: Path | None = None


def record_interrupted(store: Path | None, identity: dict, out: Path, owned: Sequence[Path]) -> None:
    """Record in a run's saved progress the files at hand of `owned` that its rerun may replace: the companions a
    run stopped while writing its result had written (a full disk while audit.png was drawn, Ctrl-C), or the old
    result an --overwrite run was given to replace (`jobs.job`). Its rerun of the same inputs then knows them for its
    own and resumes (`_this_runs`), without --overwrite. Earlier records of the same inputs are kept; without a
    store there is no resume to allow."""
    if store is None or store.is_symlink() or (store.exists() and not store.is_dir()):
        return
    saved, written = _saved_record(store, canonical(identity)), {}
    for p in owned:
        if p.is_file() and not p.is_symlink():
            try:
                written[os.path.relpath(p, out.parent)] = results.file_record(p)
            except OSError:  # unreadable here: left out, so a rerun refuses it (the safe side)
                continue
    store.mkdir(parents=True, exist_ok=True)
    record = {"identity": canonical(identity), "files": {**saved, **written}}
    writing = _saved_writing(store, canonical(identity))
    results.dump_json(record | ({"writing": sorted(writing)} if writing else {}), store / INTERRUPTED)


def record_writing(store: Path | None, identity: dict, out: Path, owned: Sequence[Path]) -> None:
    """Record in a run's saved progress, before it writes its result, the companions of `owned` it is about to write
    (`writing`): a run killed (SIGKILL, a power cut) between writing one and its .meta.json has no `except` to
    `record_interrupted` them, and its rerun refused them as no run's. The claim proved each name absent, recorded
    by this output's .meta.json, or this run's to replace; a rerun of the same inputs takes a file at a recorded name
    as this run's by the name alone (one put there by hand between the kill and the rerun is written over). Only
    into a store the run already holds (none is made for it)."""
    if store is None or store.is_symlink() or not store.is_dir() or not owned:
        return
    record = atomic.read_json(store / INTERRUPTED)
    record = record if isinstance(record, dict) and record.get("identity") == canonical(identity) else {}
    writing = sorted({*record.get("writing", []), *(os.path.relpath(p, out.parent) for p in owned)})
    results.dump_json({"identity": canonical(identity), "files": record.get("files", {}), "writing": writing},
                      store / INTERRUPTED)


def _saved_writing(store: Path | None, identity: dict) -> set[str]:
    """The companions a run of `identity` recorded it was about to write (`record_writing`)."""
    if store is None:
        return set()
    names: set[str] = set()
    for path in [store / INTERRUPTED, *sorted(store.glob(RECORD_FILES[1]))]:
        saved = atomic.read_json(path)
        if isinstance(saved, dict) and saved.get("identity") == identity and isinstance(saved.get("writing"), list):
            names |= {n for n in saved["writing"] if isinstance(n, str)}
    return names


def _saved_record(store: Path | None, identity: dict) -> dict:
    """The files `record_interrupted` recorded in `store` for a run of `identity` (none for another run's). A run
    killed between writing the record's temp file and renaming it left that temp whole or cut: a whole one (it
    parses, and names these inputs) counts, where the record has no entry of its own for a file. Trusting it widens
    nothing: each file it names is still held to its size and sha256 byte for byte (`_as_recorded`)."""
    if store is None:
        return {}
    files: dict = {}
    for path in [store / INTERRUPTED, *sorted(store.glob(RECORD_FILES[1]))]:
        saved = atomic.read_json(path)
        if isinstance(saved, dict) and saved.get("identity") == identity and isinstance(saved.get("files"), dict):
            files = {**saved["files"], **files}  # the renamed record first, then what a cut-short write left
    return files


def _this_runs(paths: list[Path], store: Path | None, identity: dict, out: Path) -> set[Path]:
    """Those of `paths` that a run of these inputs recorded in its saved progress (`record_interrupted`), byte for
    byte as they are: its resume replaces them. Anything else is no file of this run's."""
    files = _saved_record(store, identity) if paths else {}
    writing = _saved_writing(store, identity) if paths else set()
    return {p for p in paths if _as_recorded(p, files.get(os.path.relpath(p, out.parent)))
            or (os.path.relpath(p, out.parent) in writing and p.is_file() and not p.is_symlink())}


def _stray_companions(store: Path, identity: dict, out: Path, meta: Path, owned: Sequence[Path]) -> list[Path]:
    """Companions a killed run of these inputs was writing (`record_writing`) that this run does not write: a
    `sweep --plot` killed before its .meta.json, resumed without --plot, left its figure beside the finished result,
    unrecorded, and the next --plot run refused it as no run's (helper-154). Only files named as a companion of `out`
    is (`out.name` + a suffix, beside it): a record names nothing else this run may delete."""
    mine = {Path(os.path.abspath(p)) for p in (meta, *owned)}
    stray = []
    for name in sorted(_saved_writing(store, identity)):
        path = Path(os.path.abspath(out.parent / name))
        if path.parent == Path(os.path.abspath(out.parent)) and path.name.startswith(out.name + ".") and \
                path not in mine and path.is_file() and not path.is_symlink():
            stray.append(path)
    return stray


RECORD_FILES = (INTERRUPTED, ".interrupted.json.*.tmp")  # a store's record of the files its run may replace


def records_only(entries: Iterable[Path]) -> bool:
    """Whether a store's `entries` are only its record of the files its run may replace (and that record's temp)."""
    return all(any(fnmatch.fnmatchcase(p.name, pattern) for pattern in RECORD_FILES) for p in entries)


def holds_progress(store: Path | None) -> bool:
    """Whether `store` holds anything but a record of the files its run may replace (a run stopped before it saved
    any progress, after --overwrite recorded the old result: `jobs.job`)."""
    return store is not None and _present(store) and not records_only(store.iterdir())


def _present(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def _refuse(flag: str, out: Path, why: str, fix: str | None = None) -> OutputExistsError:
    return OutputExistsError(f"{named(flag, out)} already exists and {why}. "
                             f"{fix or 'Pass --overwrite to replace it, or choose another output.'}")


def _unrecorded(meta: Path, owned: Sequence[Path]) -> list[Path]:
    """The companions at hand that the output's `meta` does not record as written (name, size and digest): a file
    there that no rmjax run of this output wrote, or one changed since."""
    saved = atomic.read_json(meta)
    files = saved.get("files") if isinstance(saved, dict) else None
    files = files if isinstance(files, dict) else {}
    return [p for p in owned if (_present(p) or p.is_symlink())
            and not _as_recorded(p, files.get(os.path.relpath(p, meta.parent)))]


def _as_recorded(path: Path, want: object) -> bool:
    """Whether `path` is byte for byte the file a record (size, sha256) describes; a link never is (writing it
    would have followed the link)."""
    if not isinstance(want, dict) or path.is_symlink() or not path.is_file():
        return False
    if path.stat().st_size != want.get("bytes"):
        return False
    return results.file_record(path)["sha256"] == want.get("sha256")


def _refuse_links(out: Path, patterns: Sequence[str], beside: Sequence[Path], flag: str) -> None:
    """A folder output (a training workdir, an export) is written into: a link in it, or in a folder its job writes
    whole (orbax's checkpoints/), would make the run write, and prune, where the link points (a planted
    `checkpoints -> elsewhere`). Refused on a fresh, resumed or reused run alike."""
    own, foreign = store_files(out, patterns, beside)
    inside = [entry for folder in own if folder.is_dir() for entry in sorted(folder.iterdir())]
    linked = [entry for entry in [*foreign, *inside] if entry.is_symlink() and entry != out]
    if linked:
        raise OutputExistsError(f"{linked[0]} is a link, in {named(flag, out)} which rmjax writes into: the run would "
                                f"write (and delete) where it points. Remove the link, or give {flag_name(flag)} the "
                                "real folder.")


def _decide(out: Path, meta: Path, identity: dict, overwrite: bool, owned: list[Path], store: Path | None,
            flag: str, folder: Sequence[str] | None, beside: Sequence[Path], fix: str | None = None,
            order: dict[str, list[str]] | None = None) -> Claim:
    """Read-only: what to do with `out` (raises when it may not be written); `fix`: what a refusal advises, where
    --overwrite would replace more than this output (Output.fix); `order`: the run's `prompt_order`, which
    `identity` (canonical: sorted) has lost."""
    order = order or {}
    if folder is not None:
        _refuse_links(out, folder, beside, flag)
    # a folder holding only the run's other outputs (`beside`: an export inside a workdir) is an empty one
    present = _present(out) if folder is None else any(store_files(out, folder, beside))
    existing = [p for p in dict.fromkeys([out, meta, *owned]) if (present if p == out else _present(p))]
    stored = read_meta_identity(meta) if meta.is_file() else None
    outlived = False
    if stored == identity and present:
        if not overwrite and prompt_order(stored) != order:  # the same prompts, its columns in another order
            path = next(p for p in sorted(set(order) | set(prompt_order(stored)))
                        if prompt_order(stored).get(p) != order.get(p))
            raise OutputExistsError(
                f"{named(flag, out)} holds a finished result of these inputs with its {path} in the order "
                f"{', '.join(prompt_order(stored).get(path) or [])}, not {', '.join(order.get(path) or [])} (its "
                f"columns, rows or sums follow that order). Rerun with them in that order to reuse it, pass "
                f"--overwrite to recompute it, or choose another {flag_name(flag)}.")
        if not overwrite:  # finished; a leftover store of the same run is only a crash's residue
            # reused only when byte for byte what was written; a folder too where its record lists its files (an
            # export cut short or edited; not a training workdir, whose run.json records only the run it holds)
            recorded = atomic.read_json(meta) or {}
            if folder is None:
                problem = results.damage(out, recorded)
            else:  # a training workdir's run.json lists no files: it records the run it holds
                problem = results.damage(out, recorded, meta) if "files" in recorded else None
            if problem is not None:
                raise OutputExistsError(f"{named(flag, out)} holds a result of these inputs that does not match its "
                                        f"{meta.name}: {problem}. {fix or 'Pass --overwrite to recompute it.'}")
            if folder is None and is_main():
                for name in results.missing_figures(out, recorded):
                    print(f"note: {name}, a figure of {out}, was deleted; the result itself is whole and is reused.",
                          file=sys.stderr)
            leftover = store if store is not None and store.is_dir() else None
            if leftover is not None and read_meta_identity(store / "manifest.json") not in (None, identity):
                leftover = None  # another run's saved progress (an --overwrite stopped before its end): kept
            return Claim(out, identity, reuse=True, clear=leftover)
    elif stored == identity:  # its .meta.json outlived the result: recompute it (that .meta.json and the
        stored, outlived = None, True  # companions it records as written are this run's, replaced)
    elif folder is not None and present and stored is None and (
            store_files(out, folder, beside)[1] or not (out / results.UNFINISHED).is_file()):
        # A folder is only ever replaced when an rmjax run of this kind made it (never a user's tree, e.g. a saved
        # model of the same file names); one marked unfinished and holding only what its job writes is that job's,
        # stopped before its record (replaced with --overwrite, below).
        raise OutputExistsError(f"{named(flag, out)} holds files that no rmjax run of this kind wrote (no "
                                f"{meta.name}); choose an empty or new folder.")
    ours = _this_runs(existing, store, identity, out) if not overwrite else set()
    unrecorded = [p for p in _unrecorded(meta, owned) if p not in ours] if not overwrite else []
    if unrecorded:  # a resume or a fresh run would write over it at the end
        raise OutputExistsError(f"{unrecorded[0]} already exists and no rmjax run of {named(flag, out)} wrote it (no "
                                f"{meta.name} records it as it is): move it away, pass --overwrite to replace it, or "
                                "choose another output.")
    clear = None
    if store is not None and (store.is_symlink() or (store.exists() and not store.is_dir())):
        raise OutputExistsError(f"{store} is a link or a file, not a folder of saved chunks an rmjax run made: the "
                                "chunks would be written where it points. Remove it, or choose another output.")
    if store is not None and (holds_progress(store) or overwrite and _present(store)):
        progress = read_meta_identity(store / "manifest.json")
        if overwrite:  # --overwrite recomputes everything: it deletes the store's chunks, and nothing else
            foreign = store_files(store)[1]
            if foreign:
                raise foreign_refusal(f"{named(flag, out)}'s saved progress {store}", foreign[0], flag_name(flag))
            clear = store
        elif progress == identity:  # continue it; the old outputs are replaced at the end, none left beside it
            stray = _stray_companions(store, identity, out, meta, owned) if folder is None else []
            return Claim(out, identity, resume=True, remove=tuple(existing + stray) if folder is None else ())
        elif progress is None:
            raise _refuse(flag, store, "holds chunks without a manifest (not a resumable rmjax run)")
        else:
            raise ResumeMismatchError(mismatch_message(f"saved progress {store}", progress, identity, flag_name(flag)))
    if not overwrite and not outlived and [p for p in existing if p not in ours]:
        if stored is None:
            raise _refuse(flag, out, f"is not a finished rmjax result (no {meta.name} with its inputs: a run that "
                          "stopped before its end, or another program's file)", fix)
        changed = ", ".join(changed_keys(without_typed_paths(stored), canonical(identity)))
        record = atomic.read_json(meta) or {}
        files = record.get("files") if isinstance(record.get("files"), dict) else {}  # an older list: no digests
        if folder is None and out.name in files and (problem := results.damage(out, record)):
            # a run stopped between its result and its record (an --overwrite's): the record is the old run's
            raise _refuse(flag, out, f"does not match its {meta.name}, which records a run with different "
                          f"{changed} ({problem}: edited, or a run stopped between it and its record)", fix)
        if of_an_older_rmjax(stored, identity):
            raise _refuse(flag, out, f"holds a result that {OLDER_RMJAX}", fix)
        raise _refuse(flag, out, f"holds the result of a run with different {changed}", fix)
    if folder is not None and out in existing:  # an rmjax folder: --overwrite deletes what its job wrote, only
        own, foreign = store_files(out, folder, beside)
        if foreign:
            raise foreign_refusal(f"{named(flag, out)}", foreign[0], flag_name(flag))
        existing = [*(p for p in existing if p != out and out not in p.parents), *own]
    return Claim(out, identity, remove=tuple(dict.fromkeys(existing)), clear=clear)


@dataclasses.dataclass(frozen=True)
class Output:
    """One output of a run to claim (`claim`'s arguments). `owned`: its companions (a figure, a steps CSV), refused
    when `meta` does not record them unless --overwrite; `store`: its saved progress; `folder`: `out` is a folder
    and these are the names of what its job writes in it (`store_files`), all that --overwrite deletes there;
    `beside`: the run's other outputs that may lie inside it (and their locks), left to their own claims."""

    out: str | Path
    identity: dict
    overwrite: bool = False
    owned: Sequence[str | Path] = ()
    store: str | Path | None = None
    flag: str = "--out"
    meta: str | Path | None = None
    folder: Sequence[str] | None = None
    beside: Sequence[str | Path] = ()
    inputs: Mapping[str, str | Path | None] = dataclasses.field(default_factory=dict)  # flag -> a file the run reads
    fix: str | None = None  # a refusal's advice where --overwrite would replace the run's other outputs too


def _lock_and_decide(output: Output, held: contextlib.ExitStack) -> Claim:
    """Check that `output` can be written, lock it (process 0, in `held`) and take the read-only decision."""
    identity, flag = canonical(output.identity), output.flag
    if output.folder is None:
        refuse_folder_name(output.out, flag)
    out = check_writable(real_path(output.out), flag, folder=output.folder is not None)
    meta = Path(output.meta) if output.meta is not None else meta_path(out)
    owned = [companion_path(p) for p in output.owned]
    if is_main():  # the companions too: another job's --out may name one of them
        for path in dict.fromkeys([out, *owned]):
            held.enter_context(locks.hold(path, what=f"{named(flag, out)}"))
    beside = [path for p in output.beside for path in (Path(p), locks.lock_path(p))]
    return _decide(out, meta, identity, output.overwrite, owned,
                   Path(output.store) if output.store is not None else None, flag, output.folder, beside, output.fix,
                   prompt_order(output.identity))


def _named_files(output: Output) -> list[Path]:
    """The paths `output` writes by name (the result, unless a folder; its .meta.json; its companions)."""
    out = Path(os.path.realpath(real_path(output.out)))
    meta = Path(output.meta) if output.meta is not None else meta_path(out)
    return [out, *(Path(os.path.realpath(p)) for p in (meta, *output.owned))]


def _record_and_its_files(path: Path) -> list[Path]:
    """An input result's .meta.json and the companions it records, which the run checks the input against (as
    given: a link's record is its own name's): gcg --init_from=b.csv --out=b.csv.meta.json (or
    b.csv.completions.csv) --overwrite wrote over them, and the beam was then refused as damaged."""
    if path.is_dir():
        return []
    record = meta_path(path)
    files = (atomic.read_json(record) or {}).get("files") if record.is_file() else None
    return [record, *(record.parent / name for name in (files if isinstance(files, dict) else ()))]


def check_distinct(outputs: Sequence[Output]) -> None:
    """Refuse, before anything is locked or written, a run whose outputs name one file twice: a head whose recipe
    is itself (--head_out=x.json: x.json), or a file a folder output writes (--head_out=WORKDIR/run: its recipe
    WORKDIR/run.json is the workdir's run.json). One would overwrite the other, with exit 0. Nor may an output be
    a file the run reads (`Output.inputs`): beam --from_sweep=X --out=X --overwrite deleted its sweep."""
    seen: dict[Path, str] = {}
    for output in outputs:
        who = named(output.flag, output.out)
        for path in _named_files(output):
            if seen.get(path) == who:
                raise UsageError(f"{who} would write two of its files (the result and its record) to one, {path}; "
                                 f"give {flag_name(output.flag)} another name (e.g. another suffix).")
            if path in seen:
                raise UsageError(f"{who} would write {path}, which {seen[path]} writes too; give the outputs names "
                                 "that do not meet.")
            seen[path] = who
    given_as = {Path(path): flag if "=" in flag else f"{flag}={path}" for output in outputs
                for flag, path in output.inputs.items() if path}  # a key may name the flag and its value already
    read = {Path(os.path.realpath(path)): given for path, given in given_as.items()}
    for path, given in given_as.items():  # an input itself keeps its own name, not "its record"'s
        for recorded in _record_and_its_files(path):
            read.setdefault(Path(os.path.realpath(recorded)), f"{given}'s record")
    for path, given in read.items():
        if path in seen:
            raise UsageError(f"{seen[path]} would write {path}, which this run reads ({given}); choose another "
                             "output.")
    for path, who in seen.items():  # a folder read (a model's checkpoint folder) holds no output either
        inside = [given for folder, given in read.items() if folder in path.parents]
        if inside:
            raise UsageError(f"{who} would write {path}, inside a folder this run reads ({inside[0]}); choose an "
                             "output outside it.")
    for output in outputs:
        if output.folder is None:
            continue
        root, who = Path(os.path.realpath(real_path(output.out))), named(output.flag, output.out)
        for path, other in [*seen.items(), *read.items()]:
            inside = [p for p in output.folder if path.parent == root and fnmatch.fnmatchcase(path.name, p.rstrip("/"))
                      or p.endswith("/") and root / p.rstrip("/") in path.parents]
            if other != who and inside:
                raise UsageError(f"{other} would write {path}, where {who} writes its own {inside[0]}; give the "
                                 "outputs names that do not meet.")


@contextlib.contextmanager
def claim_all(outputs: Sequence[Output], defer_removal: bool = False) -> Iterator[list[Claim]]:
    """Check, lock and decide for each of a run's outputs, held until the block ends. Every process takes the same
    read-only decisions, all of them (a refusal of any output stops the run before anything is deleted); then
    process 0 (which holds the locks) removes what --overwrite replaces, or with `defer_removal` only clears the
    chunk stores and leaves the old result whole to the writer (jobs.Job.finish), so a run refused or stopped
    before its writes never costs the result it would have replaced."""
    check_distinct(outputs)
    missing = _missing_folders(outputs)
    claimed = False
    try:
        with contextlib.ExitStack() as held:
            decisions = [_lock_and_decide(output, held) for output in outputs]
            barrier("rmjax-claim")  # every process decided before anything is removed
            if is_main():
                for decision in decisions:
                    if decision.remove or decision.clear:
                        remove(() if defer_removal else decision.remove, decision.clear)
            claimed = True
            yield decisions
    except BaseException:
        if not claimed:  # a refused claim leaves no folder it made (the write check and the locks make them)
            for folder in sorted(missing, key=lambda f: len(f.parts), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only an empty one
        raise


def _missing_folders(outputs: Sequence[Output]) -> list[Path]:
    """The folders the claim of `outputs` would create (each output's folder, or its file's): absent now."""
    missing = []
    for output in outputs:
        path = Path(os.path.abspath(real_path(output.out)))
        folder = path if output.folder is not None else path.parent
        missing += [f for f in (folder, *folder.parents) if not f.exists()]
    return list(dict.fromkeys(missing))


@contextlib.contextmanager
def claim(out: str | Path, identity: dict, *, overwrite: bool = False, owned: Sequence[str | Path] = (),
          store: str | Path | None = None, flag: str = "--out", meta: str | Path | None = None,
          folder: Sequence[str] | None = None, beside: Sequence[str | Path] = (),
          inputs: Mapping[str, str | Path | None] | None = None, defer_removal: bool = False) -> Iterator[Claim]:
    """Claim one output (`claim_all`; the arguments: `Output`)."""
    with claim_all([Output(out, identity, overwrite, owned, store, flag, meta, folder, beside,
                           dict(inputs or {}))], defer_removal) as (decision,):
        yield decision
