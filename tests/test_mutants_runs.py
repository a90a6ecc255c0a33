"""Tests that kill the mutants the mutation pass over rmjax/runs (atomic, chunks, claims, locks, stages, jobs,
options, identities, folder_files, table_summary, paths, progress) found surviving: each names the mutant it kills
and compares against an independent reference (a hand computation, hashlib over the file's bytes, the file read
back with json or os.stat, a brute-force loop)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rmjax.errors import LockedError, NonFiniteError, OutputExistsError, ResumeMismatchError, UsageError
from rmjax.runs import atomic, chunks, claims, folder_files, identities, locks, paths, progress, results, stages

IDENTITY = {"job": "sweep", "model": {"weights": "w", "tokenizer": "t"}, "prompts": {"b": "B?", "a": "A?"}}


# --- atomic ------------------------------------------------------------------------------------------------------


def test_read_json_takes_a_file_of_exactly_its_limit_and_refuses_one_byte_more(tmp_path):
    """atomic.read_json(path, most): a regular file of `most` bytes is read, one of `most` + 1 is not.
    Kills `st.st_size > most` -> `st.st_size >= most`."""
    path = tmp_path / "state.json"
    path.write_bytes(b'{"a": [1, 2]}')
    size = len(b'{"a": [1, 2]}')
    assert atomic.read_json(path, most=size) == {"a": [1, 2]}
    assert atomic.read_json(path, most=size - 1) is None


def test_a_failed_replacing_block_leaves_the_old_file_no_temp_and_names_the_output(tmp_path):
    """atomic.replacing: a block failing with a disk error keeps the old file as it was, leaves no temp file in the
    folder (a listing of it) and the error names the output, not the temp file. Kills dropping
    `tmp.unlink(missing_ok=True)` and `error.filename = str(path)` -> `str(tmp)`."""
    path = tmp_path / "result.csv"
    path.write_text("old\n")
    with pytest.raises(OSError) as caught, atomic.replacing(path) as tmp:
        tmp.write_text("half a new resu")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.filename == str(path)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.csv"]


def test_stale_temps_are_other_processes_temps_older_than_the_claim(tmp_path):
    """atomic.stale_temps against a hand-made listing: `.<name>.<pid>.tmp` of another pid, older than `before`,
    is stale; this process's own temp, a newer one, a non-numeric pid and another file's temp are not.
    Kills `st_mtime < before` -> `>`, dropping `tmp.name != mine`, and the pid read one character early."""
    path = tmp_path / "r.csv"
    before = time.time()
    made = {}
    for name, age in [(".r.csv.123.tmp", 100), (f".r.csv.{os.getpid()}.tmp", 100), (".r.csv.456.tmp", -100),
                      (".r.csv.abc.tmp", 100), (".other.csv.789.tmp", 100), (".r.csv.9.tmp", 50)]:
        made[name] = tmp_path / name
        made[name].write_text("x")
        os.utime(made[name], (before - age, before - age))
    assert atomic.stale_temps(path, before) == [made[".r.csv.123.tmp"], made[".r.csv.9.tmp"]]


# --- progress ----------------------------------------------------------------------------------------------------


def test_duration_and_rate_text_by_hand():
    """progress.duration and rate_text against hand-written strings, at their boundaries. Kills `if h` -> `if h > 1`
    (an hour read "60m00s"), `rate >= 10` -> `> 10` (10/s read "10") and `rate <= 0` -> `< 0`."""
    assert progress.duration(3600) == "1h00m00s"
    assert progress.duration(3723.9) == "1h02m03s"
    assert progress.duration(245) == "4m05s"
    assert progress.duration(-5) == "0m00s"
    assert progress.rate_text(10.0) == "10.0"
    assert progress.rate_text(9.5) == "9.5"
    assert progress.rate_text(0.0) == "?"


def test_progress_prints_when_the_work_reaches_its_total_with_the_hand_computed_share():
    """Progress(total=4, every=1e9): no line for 1 of 4 (the interval has not passed), a line "(25.0%" when forced,
    and a line when the work reaches the total exactly. Kills `self.done >= self.total` -> `>` and the share's
    denominator off by one."""
    out = io.StringIO()
    bar = progress.Progress(4, "sweep", stream=out, every=1e9)
    bar.update(1)
    assert out.getvalue() == ""
    bar.update(0, force=True)
    assert "1/4 candidates (25.0%)" in out.getvalue()
    bar.update(3)
    assert out.getvalue().splitlines()[-1].startswith("[sweep] 4/4 candidates (100.0%)")


def test_phase_clock_adds_up_each_phases_time(monkeypatch):
    """PhaseClock with a fake clock (0, 1, 4, 10): a -> 1 + 6 = 7, b -> 3. Kills
    `self.seconds.get(phase, 0.0) + now - self.last` -> `now - self.last` (a phase's earlier time forgotten)."""
    ticks = iter([0.0, 1.0, 4.0, 10.0])
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))  # progress's alone
    clock = progress.PhaseClock()
    clock("a")
    clock("b")
    clock("a")
    assert clock.seconds == {"a": 1.0 + 6.0, "b": 3.0}


# --- paths -------------------------------------------------------------------------------------------------------


def test_output_paths_refused_before_any_work(tmp_path):
    """paths.refuse_empty_out refuses an --out of spaces; check_writable refuses a folder given as a file output and
    a file given as a folder output. Kills dropping `.strip()`, and `if False` for each of check_writable's two
    kind checks."""
    with pytest.raises(UsageError, match="empty"):
        paths.refuse_empty_out("  ")
    paths.refuse_empty_out("x.csv")
    with pytest.raises(UsageError, match="is a directory"):
        paths.check_writable(tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        paths.check_writable(tmp_path / "f", folder=True)


def test_an_output_named_as_another_outputs_lock_is_refused(tmp_path):
    """`score --out=s8.csv.lock` wrote a result where the sweep --out=s8.csv keeps its lock: the sweep's rerun was
    then refused ("s8.csv.lock is a file rmjax did not make", helper-155). A file or folder output ending in .lock
    is refused before any work, through the claim every job makes; `x.locked` is no lock's name."""
    from rmjax.runs import jobs

    for folder in (False, True):
        with pytest.raises(UsageError, match=r"s8\.csv\.lock: rmjax names its lock files so"):
            paths.check_writable(tmp_path / "s8.csv.lock", folder=folder)
    with pytest.raises(UsageError, match="give a name not ending in .lock"), \
            jobs.job(tmp_path / "s8.csv.lock", IDENTITY):
        pass
    assert not (tmp_path / "s8.csv.lock").exists()
    assert paths.check_writable(tmp_path / "x.locked") == tmp_path / "x.locked"


def test_a_name_too_long_for_its_companions_is_refused_at_the_limit(tmp_path):
    """paths.check_writable: a name of NAME_MAX - 48 bytes passes, one byte more is refused (its .meta.json and temp
    files would pass the file system's limit). Kills `longest > limit` -> `> limit + 1` and skipping the check."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    paths.check_writable(tmp_path / ("n" * (limit - 48)))
    with pytest.raises(UsageError, match="limit"):
        paths.check_writable(tmp_path / ("n" * (limit - 47)))


def test_companion_and_real_paths_of_links(tmp_path):
    """paths.companion_path keeps a link at the companion's own name (never its target) but resolves its folder;
    real_path resolves a link to its target and keeps a plain path as given. Kills companion_path ->
    `realpath(path)` and real_path -> `return path`."""
    (tmp_path / "real").mkdir()
    (tmp_path / "dir").symlink_to(tmp_path / "real")
    (tmp_path / "target.png").write_text("")
    (tmp_path / "real" / "fig.png").symlink_to(tmp_path / "target.png")
    assert paths.companion_path(tmp_path / "dir" / "fig.png") == Path(os.path.realpath(tmp_path)) / "real" / "fig.png"
    (tmp_path / "out.csv").write_text("")
    (tmp_path / "link.csv").symlink_to(tmp_path / "out.csv")
    assert paths.real_path(tmp_path / "link.csv") == Path(os.path.realpath(tmp_path / "out.csv"))
    assert paths.real_path("some/relative.csv") == Path("some/relative.csv")


# --- identities --------------------------------------------------------------------------------------------------


def test_changed_keys_names_only_what_changed_by_its_full_dotted_path():
    """identities.changed_keys against hand-listed names. Kills the nested prefix dropped (`f"{key}."`) and
    `elif a != b` -> `else` (equal keys listed)."""
    old = {"job": "sweep", "model": {"weights": {"sha": 1, "n": 2}, "tokenizer": "t"}, "dtype": "float32"}
    new = {"job": "sweep", "model": {"weights": {"sha": 9, "n": 2}, "tokenizer": "t"}, "dtype": "bfloat16", "x": 1}
    assert identities.changed_keys(old, new) == ["dtype", "model.weights.sha", "x"]


def test_key_order_and_prompt_order_by_hand():
    """identities.key_order lists every mapping of two or more keys by dotted path; prompt_order keeps the ones
    whose last part is `prompts`, nested too. Kills `len(value) > 1` -> `> 2`, the nested path dropped
    (`str(key)`) and `split(".")[-1]` -> `[0]`."""
    identity = {"job": "gcg", "config": {"prompts": {"b": "B", "a": "A"}, "one": {"k": 1}}}
    assert identities.key_order(identity) == {"identity": ["job", "config"], "config": ["prompts", "one"],
                                              "config.prompts": ["b", "a"]}
    assert identities.prompt_order(identity) == {"config.prompts": ["b", "a"]}


def test_require_claimed_compares_identities_as_they_read_back():
    """identities.require_claimed: a tuple and a list (one JSON array) are one identity; another value is an
    internal error. Kills `canonical(claimed) != canonical(loaded)` -> `claimed != loaded`."""
    identities.require_claimed({"job": "sweep", "ids": (1, 2)}, {"job": "sweep", "ids": [1, 2]}, "out.csv")
    with pytest.raises(RuntimeError, match="different ids"):
        identities.require_claimed({"job": "sweep", "ids": (1, 2)}, {"job": "sweep", "ids": [1, 3]}, "out.csv")


def test_read_meta_identity_of_no_record_is_none(tmp_path):
    """identities.read_meta_identity: None without a file (a claim tells "no progress" from "another run's" by it).
    Kills `else None` -> `else {}`."""
    assert identities.read_meta_identity(tmp_path / "absent.json") is None
    (tmp_path / "m.json").write_text(json.dumps({"identity": {"job": "sweep"}}))
    assert identities.read_meta_identity(tmp_path / "m.json") == {"job": "sweep"}


# --- options -----------------------------------------------------------------------------------------------------


def test_run_options_and_model_inputs(tmp_path):
    """options.RunOptions refuses a system prompt with the plain template; model_inputs keeps the specs that are
    paths here, each of a comma-separated list, and drops a hub id. Kills the refusal -> `if False`, dropping
    `Path(spec).exists()` and not splitting on commas."""
    from rmjax.runs import options

    with pytest.raises(UsageError, match="system_prompt"):
        options.RunOptions("m", "o.csv", template="plain", system_prompt="Be brief.")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert options.model_inputs(lm="org/hub-model", sides=f"{a},{b}", judge=None) == {f"--sides={a}": str(a),
                                                                                     f"--sides={b}": str(b)}


def test_a_reused_result_with_nonfinite_values_needs_the_flag(tmp_path):
    """jobs.refuse_nonfinite_reuse: a .meta.json recording NaN counts (at its top or in its summary) is reused
    only with --allow_nonfinite, by a job's claim and by a library call's own (`jobs.claimed` without a job: a
    write_beam or write_text_scores called twice reused it without the flag). Kills dropping
    `or summary.get("nonfinite")`, dropping `and not allowed`, and the library claim's check dropped."""
    from rmjax.runs import jobs

    out = tmp_path / "r.csv"
    out.write_text("token_id\n")
    (tmp_path / "r.csv.meta.json").write_text(json.dumps({"summary": {"nonfinite": {"p": 3}}}))
    with pytest.raises(NonFiniteError, match="allow_nonfinite"):
        jobs.refuse_nonfinite_reuse(out, False)
    jobs.refuse_nonfinite_reuse(out, True)
    (tmp_path / "r.csv.meta.json").write_text(json.dumps({"summary": {"nonfinite": None}}))
    jobs.refuse_nonfinite_reuse(out, False)
    written = tmp_path / "w.csv"
    with jobs.claimed(None, written, IDENTITY, allow_nonfinite=True) as job:
        job.finish(lambda path: path.write_text("token_id,p\n1,nan\n") and path, allow_nonfinite=True,
                   nonfinite={"p": 1})
    with pytest.raises(NonFiniteError, match="allow_nonfinite"), jobs.claimed(None, written, IDENTITY,
                                                                                allow_nonfinite=False):
        pass
    with jobs.claimed(None, written, IDENTITY, allow_nonfinite=True) as job:
        assert job.reuse


def test_claim_job_claims_its_out_and_refuses_one_of_the_files_the_command_line_names(tmp_path):
    """options.claim_job: the job claims `out` when given (not options.out); an output that is a file named on the
    command line (RunOptions.inputs) is refused. Kills `out or options.out` -> `options.out` and dropping
    options.inputs from what the claim is told the run reads."""
    from rmjax.runs import options

    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("g: Greatest?\n")
    run = options.RunOptions("m", str(tmp_path / "default.csv"), inputs=(("--prompts", str(prompts)),))
    with options.claim_job(run, IDENTITY, out=tmp_path / "other.csv") as job:
        assert job.out == tmp_path / "other.csv"
        assert (tmp_path / "other.csv.lock").exists() and not (tmp_path / "default.csv.lock").exists()
    with pytest.raises(UsageError, match="which this run reads"), \
            options.claim_job(options.RunOptions("m", str(prompts), inputs=run.inputs), IDENTITY):
        pass



def test_an_output_may_not_be_the_record_of_a_result_the_run_reads(tmp_path):
    """gcg --init_from=b.csv --out=b.csv.meta.json --overwrite wrote over the beam's record (and beam --from_sweep
    over its sweep's): the input's result was refused as unreadable afterwards (helper-159). A folder input (a
    model) has no record beside it to guard."""
    from rmjax.runs.claims import Output, check_distinct

    beam, model = tmp_path / "b.csv", tmp_path / "model"
    beam.write_text("x\n")
    model.mkdir()
    record = beam.with_name("b.csv.meta.json")
    with pytest.raises(UsageError, match=f"would write {record}, which this run reads \\(--init_from={beam}'s record"):
        check_distinct([Output(record, IDENTITY, overwrite=True, inputs={"--init_from": str(beam)})])
    check_distinct([Output(tmp_path / "model.meta.json", IDENTITY, inputs={"--model": str(model)})])
    # the companions its record lists (a beam's completions), and the record of a link by the link's own name
    # (the run reads link.csv.meta.json), are read too (helper-160)
    completions = tmp_path / "b.csv.completions.csv"
    completions.write_text("c\n")
    results.write_meta(beam, files=[completions], kind="beam", identity={"job": "beam"})
    with pytest.raises(UsageError, match=f"would write {completions}, which this run reads"):
        check_distinct([Output(completions, IDENTITY, overwrite=True, inputs={"--init_from": str(beam)})])
    with pytest.raises(UsageError, match=f"which this run reads \\(--init_from={beam}\\)"):  # itself, recorded too
        check_distinct([Output(beam, IDENTITY, overwrite=True, inputs={"--init_from": str(beam)})])
    (tmp_path / "link.csv").symlink_to(beam)
    with pytest.raises(UsageError, match="link.csv's record"):
        check_distinct([Output(tmp_path / "link.csv.meta.json", IDENTITY,
                               inputs={"--init_from": str(tmp_path / "link.csv")})])


def test_a_folder_jobs_refusal_names_the_folder_it_was_given_not_a_flag_value_nobody_typed(tmp_path):
    """options.claim_job with `out` inside options.out (inspect's DIR/reward_lens.csv): a refusal names
    `DIR/reward_lens.csv (in --out=DIR)`, as typed; a file job's names `--out=FILE`. It said
    `--out=DIR/reward_lens.csv`, a flag value the user never gave (helper-149)."""
    from rmjax.runs import options

    folder = tmp_path / "ins"
    run = options.RunOptions("m", str(folder))
    with options.claim_job(run, IDENTITY, out=folder / "reward_lens.csv") as job:
        job.finish(lambda out: out.write_text("x\n") and out)
    with pytest.raises(OutputExistsError) as refused, \
            options.claim_job(run, IDENTITY | {"job": "other"}, out=folder / "reward_lens.csv"):
        pass
    assert str(refused.value).startswith(f"{folder / 'reward_lens.csv'} (in --out={folder}) already exists")
    assert "--out=" + str(folder / "reward_lens.csv") not in str(refused.value)
    with pytest.raises(OutputExistsError) as refused, \
            options.claim_job(options.RunOptions("m", str(folder / "reward_lens.csv")), IDENTITY | {"job": "other"}):
        pass
    assert str(refused.value).startswith(f"--out={folder / 'reward_lens.csv'} already exists")


# --- folder_files ------------------------------------------------------------------------------------------------


def test_store_files_tells_the_jobs_files_from_links_folders_and_what_beside_holds(tmp_path):
    """folder_files.store_files against a hand-sorted listing: a link or a folder at a chunk's name is foreign, a
    folder holding a `beside` output is neither, a linked store is foreign as a whole. Kills dropping the link
    check in `_written`, the file/folder check, `entry in other.parents` and `store.is_symlink()`."""
    store = tmp_path / "out.csv.chunks"
    store.mkdir()
    (store / "chunk-0000000000.npy").write_bytes(b"x")
    (store / "manifest.json").write_text("{}")
    (store / "interrupted.json").write_text("{}")
    (tmp_path / "elsewhere.npy").write_bytes(b"y")
    (store / "chunk-0000000010.npy").symlink_to(tmp_path / "elsewhere.npy")
    (store / "chunk-0000000020.npy").mkdir()
    (store / "export").mkdir()
    (store / "export" / "model.bin").write_bytes(b"z")
    own, foreign = folder_files.store_files(store, beside=[store / "export" / "model.bin"])
    assert [p.name for p in own] == ["chunk-0000000000.npy", "interrupted.json", "manifest.json"]
    assert [p.name for p in foreign] == ["chunk-0000000010.npy", "chunk-0000000020.npy"]
    (tmp_path / "linked.chunks").symlink_to(store)
    assert folder_files.store_files(tmp_path / "linked.chunks") == ([], [tmp_path / "linked.chunks"])


def test_clear_store_removes_its_record_too_and_names_what_it_keeps(tmp_path, capsys):
    """folder_files.clear_store: a store of only its job's files (its interrupted.json included) goes whole; one
    holding two foreign files keeps them, named "x and 1 more". Kills dropping "interrupted.json" from
    STORE_FILES and the count `len(foreign) - 1` -> `len(foreign)`."""
    store = tmp_path / "a.chunks"
    store.mkdir()
    for name in ("chunk-0000000000.npy", "manifest.json", "interrupted.json", ".interrupted.json.77.tmp"):
        (store / name).write_text("")
    folder_files.clear_store(store)
    assert not store.exists()
    store.mkdir()
    for name in ("chunk-0000000000.npy", "notes.txt", "z.txt"):
        (store / name).write_text("")
    folder_files.clear_store(store)
    assert sorted(p.name for p in store.iterdir()) == ["notes.txt", "z.txt"]
    assert "holds notes.txt and 1 more," in capsys.readouterr().err


def test_remove_unlinks_a_link_to_a_folder_and_spares_the_folder(tmp_path):
    """folder_files.remove of a link to a folder removes the link only. Kills `p.is_dir() and not p.is_symlink()`
    -> `p.is_dir()` (rmtree of a link)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    folder_files.remove([tmp_path / "link"])
    assert not os.path.lexists(tmp_path / "link")
    assert (tmp_path / "data" / "keep.txt").read_text() == "keep"


# --- stages ------------------------------------------------------------------------------------------------------

_SWEEP = {"identity": {"job": "sweep", "model": {"weights": "w1", "tokenizer": "t1"}, "dtype": "float32",
                       "output_column": 0, "template": "chat", "mode": "token", "prompts": {"g": "Greatest?"}}}


def test_differences_lists_each_need_the_run_did_not_meet():
    """stages.differences against hand-listed keys: a matching tokenizer is no difference, another one is; another
    mode is; a prompt name missing there is; a two-model (GCG) identity without the model is `model.weights`. Kills
    `not theirs & …` -> `theirs & …`, "mode" dropped from the compared keys, a missing prompt accepted, the model
    check skipped and `len(models) == 1` -> `>= 1`."""
    same = stages.Needs(model={"weights": "w1", "tokenizer": "t1"}, tokenizer_of=({"tokenizer": "t1"},),
                        dtype="float32", mode="token", prompts={"g": "Greatest?"})
    assert stages.differences(_SWEEP, same) == []
    other = stages.Needs(model={"weights": "w2", "tokenizer": "t1"}, tokenizer_of=({"tokenizer": "t2"},),
                         mode="text", prompts={"h": "Worst?"})
    assert [key for key, _ in stages.differences(_SWEEP, other)] == ["model.weights", "model.tokenizer", "mode",
                                                                     "prompts.h"]
    models = [{"weights": "a", "tokenizer": "t"}, {"weights": "b", "tokenizer": "t"}]
    gcg = {"identity": {"job": "gcg", "models": models}}
    assert stages.differences(gcg, stages.Needs(model={"weights": "a", "tokenizer": "t"})) == []
    # several models: which one was meant is unknown, so the whole fingerprint is "weights", not a diff with one
    assert stages.differences(gcg, stages.Needs(model={"weights": "c", "tokenizer": "u"})) == [("model.weights", "")]



@pytest.mark.parametrize("head, there, here, differ", [
    ("<|im_start|>user\n", "chat", "auto", False),  # auto renders chat with a chat template: one conversation
    ("<|im_start|>user\n", "auto", "chat", False),
    ("<|im_start|>user\n", "plain", "auto", True),
    (None, "plain", "auto", False),  # no chat template: auto renders plain
    (None, "chat", "auto", True),
])
def test_a_template_is_compared_as_it_rendered_for_the_same_model(head, there, here, differ):
    """beam --from_sweep of a --template=chat sweep, beam at auto, was refused as 'different template' though both
    rendered the one chat conversation (helper-159); the record's chat_template_head says what auto rendered. Of
    another model, or a record without the head (an older rmjax), the flags compare as given."""
    fp = {"weights": "w1", "tokenizer": "t1"}
    meta = {"identity": {**_SWEEP["identity"], "template": there}, "chat_template_head": head}
    assert bool(stages.differences(meta, stages.Needs(model=fp, template=here))) == differ
    assert stages.differences(meta, stages.Needs(model={"weights": "w2", "tokenizer": "t1"}, template=here)) == [
        ("model.weights", ""), *([("template", f"template {there!r} there, {here!r} here")] if there != here else [])]
    older = {"identity": meta["identity"]}
    assert bool(stages.differences(older, stages.Needs(model=fp, template=here))) == (there != here)

def test_an_inspect_result_is_in_token_mode_and_prompt_texts_prefer_the_identity():
    """stages._facts: an inspect identity without a `mode` scored prefix + ids + suffix ("token"); prompt_texts reads
    the identity's prompts before the record's top-level ones. Kills dropping "inspect" from the token jobs and
    `identity.get("prompts", meta.get("prompts"))` -> `meta.get("prompts")`."""
    inspect = {"identity": {"job": "inspect", "model": {"weights": "w", "tokenizer": "t"}}}
    assert stages.differences(inspect, stages.Needs(mode="token")) == []
    meta = {"identity": {"job": "score", "prompts": {"a": "from the identity"}}, "prompts": {"a": "top level"}}
    assert stages.prompt_texts(meta) == {"a": "from the identity"}


def test_short_keeps_a_text_of_exactly_its_limit():
    """stages._short: a text of `most` characters is shown whole, one more is cut to most - 1 and an ellipsis.
    Kills `len(text) <= most` -> `< most`."""
    assert stages._short("x" * 60) == repr("x" * 60)
    assert stages._short("x" * 61) == repr("x" * 59 + "…")


def test_tables_naming_one_prompt_with_two_texts_are_refused(tmp_path):
    """stages.same_prompt_texts: two tables whose .meta.json give prompt "g" different texts are refused; the same
    text passes. Kills the comparison -> `if False`."""
    for name, text in (("a.csv", "Greatest?"), ("b.csv", "Greatest?"), ("c.csv", "Worst?")):
        (tmp_path / name).write_text("token_id\n")
        (tmp_path / f"{name}.meta.json").write_text(json.dumps({"identity": {"prompts": {"g": text}}}))
    stages.same_prompt_texts([("--a", tmp_path / "a.csv"), ("--b", tmp_path / "b.csv")])
    with pytest.raises(UsageError, match="different prompts"):
        stages.same_prompt_texts([("--a", tmp_path / "a.csv"), ("--c", tmp_path / "c.csv")])


# --- locks -------------------------------------------------------------------------------------------------------


def test_a_lock_is_taken_once_and_again_after_release(tmp_path):
    """locks.hold: holding one output twice in one process is refused as "already holds" (not as another run's),
    and once released it is free again, its lock file gone. Kills the `_mine` check -> `if False` and dropping
    `_mine.discard(lock)`."""
    out = tmp_path / "r.csv"
    with locks.hold(out), pytest.raises(LockedError, match="this process already holds"):
        with locks.hold(out):
            pass
    assert not (tmp_path / "r.csv.lock").exists()
    with locks.hold(out) as lock:
        assert lock == tmp_path / "r.csv.lock"


def test_a_hard_linked_or_foreign_lock_file_is_refused(tmp_path):
    """locks: a lock file with two names, or a JSON file with the lock record's keys and one more, is not taken over
    (both are refused and left as they were). Kills `st_nlink > 1` -> `> 2` and
    `set(info) == {pid, host, since}` -> `<=`."""
    (tmp_path / "a.csv.lock").write_text("")
    os.link(tmp_path / "a.csv.lock", tmp_path / "other")
    with pytest.raises(LockedError, match="hard link"), locks.hold(tmp_path / "a.csv"):
        pass
    record = json.dumps({"pid": 1, "host": "h", "since": "00:00:00", "bundler": "2.4"})
    (tmp_path / "b.csv.lock").write_text(record)
    with pytest.raises(LockedError, match="did not make"), locks.hold(tmp_path / "b.csv"):
        pass
    assert (tmp_path / "b.csv.lock").read_text() == record


def test_a_killed_runs_longer_lock_record_is_replaced_whole_and_an_empty_one_taken(tmp_path):
    """locks._acquire: a killed run's lock record longer than this run's is truncated before the new one is written
    (the file reads back as exactly this process's record); an empty lock file is taken over. Kills dropping
    `os.ftruncate(fd, 0)` and the empty file's early return."""
    lock = tmp_path / "r.csv.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "h" * 300, "since": "00:00:00"}))
    with locks.hold(tmp_path / "r.csv"):
        info = json.loads(lock.read_text())
        assert info["pid"] == os.getpid() and set(info) == {"pid", "host", "since"}
    lock.write_text("")
    with locks.hold(tmp_path / "r.csv"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_a_file_swapped_in_under_the_lock_name_survives_the_release(tmp_path):
    """locks.hold: releasing removes the lock file only when the name is still the file held; one put there in its
    place (os.replace) stays. Kills `if _same_file(fd, lock)` -> `if True`."""
    with locks.hold(tmp_path / "r.csv") as lock:
        (tmp_path / "new").write_text("someone's")
        os.replace(tmp_path / "new", lock)
    assert lock.read_text() == "someone's"


def test_a_lock_file_removed_as_it_was_won_is_retaken_under_its_name(tmp_path, monkeypatch):
    """locks._acquire: when the holder removes the lock file just as this process wins it (simulated: the first
    flock unlinks the name), the new lock file at the name is the one held (its inode, read back with os.stat, is
    the held descriptor's, and it holds this process's record). Kills `if not _same_file(fd, lock)` -> `if False`."""
    real, calls = locks.fcntl.flock, []

    def flock(fd, op):
        calls.append(fd)
        real(fd, op)
        if len(calls) == 1:
            os.unlink(tmp_path / "r.csv.lock")

    monkeypatch.setattr(locks.fcntl, "flock", flock)
    with locks.hold(tmp_path / "r.csv") as lock:
        assert len(calls) == 2
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_a_symlinked_output_and_its_target_share_one_lock(tmp_path):
    """locks.lock_path: the lock of a link is beside its target. Kills `realpath` -> `abspath`."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "r.csv").write_text("")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real" / "r.csv")
    assert locks.lock_path(tmp_path / "link.csv") == Path(os.path.realpath(tmp_path)) / "real" / "r.csv.lock"


# --- chunks ------------------------------------------------------------------------------------------------------


def test_a_resume_keeps_the_saved_layout_and_refuses_prompts_in_another_order(tmp_path):
    """chunks.ChunkStore over a manifest written by a first run: a second run with other chunk and batch sizes gets
    the saved ones (as manifest.json reads back with json), one with the prompts in another order is refused, and
    a manifest without a batch size keeps the run's. Kills the key-order check -> `and False`, dropping the saved
    chunk size, and the saved batch size's `is not None` check -> `if False`."""
    out = tmp_path / "s.csv"
    chunks.ChunkStore(out, IDENTITY, 256, batch_size=64)
    manifest = json.loads((tmp_path / "s.csv.chunks" / "manifest.json").read_text())
    assert (manifest["chunk_size"], manifest["batch_size"]) == (256, 64)
    again = chunks.ChunkStore(out, IDENTITY, 128, batch_size=32)
    assert (again.chunk_size, again.batch_size) == (256, 64)
    swapped = {**IDENTITY, "prompts": {"a": "A?", "b": "B?"}}
    with pytest.raises(ResumeMismatchError, match="in the order b, a"):
        chunks.ChunkStore(out, swapped, 256, batch_size=64)
    manifest["batch_size"] = None
    (tmp_path / "s.csv.chunks" / "manifest.json").write_text(json.dumps(manifest))
    assert chunks.ChunkStore(out, IDENTITY, 256, batch_size=32).batch_size == 32


def test_a_saved_batch_size_of_zero_or_a_bool_is_no_batch_size(tmp_path):
    """chunks.saved_batch_size: only an int of at least 1 is a recorded batch size. Kills `saved >= 1` -> `>= 0`."""
    out = tmp_path / "s.csv"
    (tmp_path / "s.csv.chunks").mkdir()
    for saved, want in ((0, None), (True, None), (-3, None), (1, 1), (48, 48)):
        (tmp_path / "s.csv.chunks" / "manifest.json").write_text(json.dumps({"batch_size": saved}))
        assert chunks.saved_batch_size(out) == want, saved


def test_a_chunk_whose_bytes_change_on_the_way_to_disk_is_not_saved(tmp_path, monkeypatch):
    """ChunkStore.write: bytes read back that differ from those written (same size; simulated by overwriting the
    temp file as it is synced) raise ENOSPC and leave no chunk; a good write syncs the temp file (os.fsync is called
    on it) and reads back as the array written. Kills the read-back check -> `if False` and dropping the fsync."""
    store = chunks.ChunkStore(tmp_path / "s.csv", IDENTITY, 4)
    scores = np.arange(8, dtype=np.float32).reshape(4, 2)
    real, synced = os.fsync, []

    def corrupt(fd):
        real(fd)
        os.pwrite(fd, b"\xff", os.fstat(fd).st_size - 1)

    monkeypatch.setattr(chunks.os, "fsync", corrupt)
    with pytest.raises(OSError) as caught:
        store.write(0, scores)
    assert caught.value.errno == errno.ENOSPC
    assert not store.has(0) and sorted(p.name for p in store.dir.iterdir()) == ["manifest.json"]
    monkeypatch.setattr(chunks.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    store.write(0, scores)
    assert synced == [str(store.dir / "tmp-chunk-0000000000.npy")]
    np.testing.assert_array_equal(np.load(store.dir / "chunk-0000000000.npy"), scores)


def test_a_stored_chunk_of_another_dtype_or_not_a_plain_file_is_refused(tmp_path):
    """ChunkStore.read / load / names: a float64 chunk of the right shape is damaged; a link at a chunk's name is no
    chunk (not listed, refused on load). Kills dropping the float32 check, the `_plain` filter of names() and the
    `_plain` check of load()."""
    store = chunks.ChunkStore(tmp_path / "s.csv", IDENTITY, 2)
    np.save(store.dir / "chunk-0000000000.npy", np.zeros((2, 2), np.float64))
    with pytest.raises(ResumeMismatchError, match="float64"):
        store.read(0, (2, 2), lambda scores, what: None)
    np.save(tmp_path / "elsewhere.npy", np.ones((2, 2), np.float32))
    (store.dir / "chunk-0000000002.npy").symlink_to(tmp_path / "elsewhere.npy")
    assert store.names() == {"0000000000"}
    with pytest.raises(ResumeMismatchError, match="not a regular file"):
        store.load(2)


# --- table_summary -----------------------------------------------------------------------------------------------


def _rows(summary: str) -> list[tuple[float, str, str]]:
    """(value, z, decoded) of each listed token line."""
    out = []
    for line in summary.splitlines():
        parts = line.split()
        if len(parts) >= 7 and parts[1] == "z" and parts[3] == "pct":
            out.append((float(parts[0]), parts[2], parts[6]))
    return out


def test_a_summary_ranks_only_finite_values_and_counts_what_it_left_out(tmp_path):
    """summarize_table over a table with a NaN (--allow_nonfinite): the bottom rows are the lowest finite values
    (hand-listed), the header says "1 NaN/Inf left out"; a table of all finite values says nothing of the kind,
    and one column of equal values prints z 0 (sd 0). Kills ranking the NaN row (`ranked = df`), `len(values) <
    len(column)` -> `<=`, and `sd > 0` -> `sd >= 0` (a 0/0 z)."""
    from rmjax.runs import results, table_summary

    out = tmp_path / "s.csv"
    results.write_table(out, {"token_id": [0, 1, 2, 3], "token_name": list("abcd"), "token_decoded": list("abcd")},
                        {"p": np.array([0.5, np.nan, 2.0, -1.0]), "flat": np.array([3.0, 3.0, 3.0, 3.0])},
                        allow_nonfinite=True)
    summary = table_summary.summarize_table(out, k=2)
    assert "3 tokens (1 NaN/Inf left out):" in summary
    p_part = summary.split("'flat'")[0]
    assert [(v, d) for v, _, d in _rows(p_part)] == [(2.0, "'c'"), (0.5, "'a'"), (-1.0, "'d'"), (0.5, "'a'")]
    flat = summary.split("'flat'")[1]
    assert "4 tokens: mean 3.0000" in flat and "left out" not in flat
    assert {z for _, z, _ in _rows(flat)} == {"+0.00"}


def test_a_summary_shows_its_identitys_prompt_and_its_bottom_rows_lowest_first(tmp_path):
    """summarize_table with a .meta.json whose identity records the prompt: the prompt text is shown; the bottom rows
    run from the lowest value up (hand-sorted). Kills `meta.get("identity", meta)` -> `meta` and
    `ranked.tail(k).iloc[::-1]` -> `ranked.tail(k)`."""
    from rmjax.runs import results, table_summary

    out = tmp_path / "s.csv"
    values = np.array([0.3, -2.0, 1.5, -0.7, 0.9])
    results.write_scores_csv(out, np.arange(5), list("abcde"), list("abcde"), {"g": values})
    (tmp_path / "s.csv.meta.json").write_text(json.dumps({"identity": {"prompts": {"g": "Greatest thing?"}}}))
    summary = table_summary.summarize_table(out, k=2)
    assert "'g': 'Greatest thing?'" in summary
    assert [v for v, _, _ in _rows(summary)] == [1.5, 0.9, -2.0, -0.7]


# --- claims ------------------------------------------------------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_outputs_that_meet_or_overwrite_an_input_are_refused(tmp_path):
    """claims.check_distinct: two outputs naming one file, or an output that is a file the run reads, are refused
    before anything is locked. Kills `if path in seen` -> `if False` and the inputs' check -> `if False`."""
    a = tmp_path / "a.csv"
    with pytest.raises(UsageError, match="writes too"):
        claims.check_distinct([claims.Output(a, IDENTITY), claims.Output(a, IDENTITY, flag="--other")])
    with pytest.raises(UsageError, match="which this run reads"):
        claims.check_distinct([claims.Output(a, IDENTITY, inputs={"--from_sweep": a})])
    claims.check_distinct([claims.Output(a, IDENTITY, inputs={"--from_sweep": tmp_path / "b.csv"})])


def test_a_finished_result_in_another_prompt_order_is_not_reused(tmp_path):
    """claims._decide: a result whose record lists the same prompts in another order (its columns) is refused, the
    same order reused. Kills the order check -> `if False`."""
    from rmjax.runs import results

    out = tmp_path / "s.csv"
    out.write_text("token_id,token_name,token_decoded,b,a\n")
    results.write_meta(out, kind="sweep", identity=IDENTITY)
    with claims.claim(out, IDENTITY) as decision:
        assert decision.reuse
    with pytest.raises(OutputExistsError, match="in the order b, a"), \
            claims.claim(out, {**IDENTITY, "prompts": {"a": "A?", "b": "B?"}}):
        pass


def test_a_record_whose_result_was_deleted_is_recomputed_not_reused(tmp_path):
    """claims._decide: a .meta.json of these inputs whose result is gone is no finished result: the run writes it
    anew (reuse False, nothing refused). Kills `stored == identity and present` -> `stored == identity`."""
    from rmjax.runs import results

    out = tmp_path / "s.csv"
    out.write_text("token_id\n")
    results.write_meta(out, kind="sweep", identity=IDENTITY)
    out.unlink()
    with claims.claim(out, IDENTITY) as decision:
        assert not decision.reuse and not decision.resume


def test_a_refused_claim_leaves_none_of_the_folders_it_made(tmp_path):
    """claims.claim_all: when one output is refused, the folders the claim made for another (a/b/c) are all removed,
    deepest first (a listing of tmp_path afterwards). Kills `reverse=True` -> `reverse=False`."""
    (tmp_path / "stranger.csv").write_text("not rmjax's")
    outputs = [claims.Output(tmp_path / "a" / "b" / "c" / "s.csv", IDENTITY),
               claims.Output(tmp_path / "stranger.csv", IDENTITY, flag="--other")]
    with pytest.raises(OutputExistsError, match="not a finished rmjax result"), claims.claim_all(outputs):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stranger.csv"]


def test_an_overwrite_with_deferred_removal_keeps_the_old_result_until_the_write(tmp_path):
    """claims.claim_all(defer_removal=True) with --overwrite: the old result of other inputs is listed to remove but
    is still there, byte for byte, when the block starts. Kills `() if defer_removal else decision.remove` ->
    `decision.remove`."""
    out = tmp_path / "s.csv"
    out.write_text("old result\n")
    with claims.claim(out, IDENTITY, overwrite=True, defer_removal=True) as decision:
        assert out in decision.remove
        assert out.read_text() == "old result\n"


def test_a_dangling_link_at_a_companions_name_is_refused(tmp_path):
    """claims._unrecorded: a link at a companion's name, even one pointing nowhere, is a file no run wrote. Kills
    `(_present(p) or p.is_symlink())` -> `_present(p)`."""
    (tmp_path / "s.csv.png").symlink_to(tmp_path / "nowhere" / "victim.png")
    with pytest.raises(OutputExistsError, match="s.csv.png already exists"), \
            claims.claim(tmp_path / "s.csv", IDENTITY, owned=[tmp_path / "s.csv.png"]):
        pass


def test_an_interrupted_record_holds_each_files_latest_bytes(tmp_path):
    """claims.record_interrupted twice over a companion that changed between: interrupted.json (read with json)
    records the sha256 of its latest bytes (hashlib). Kills `{**saved, **written}` -> `{**written, **saved}`."""
    store, fig = tmp_path / "s.csv.chunks", tmp_path / "s.csv.png"
    fig.write_bytes(b"first")
    claims.record_interrupted(store, IDENTITY, tmp_path / "s.csv", [fig])
    fig.write_bytes(b"second draw")
    claims.record_interrupted(store, IDENTITY, tmp_path / "s.csv", [fig])
    record = json.loads((store / "interrupted.json").read_text())
    assert record["files"] == {"s.csv.png": {"bytes": 11, "sha256": _sha(fig)}}


def test_the_renamed_record_wins_over_a_cut_short_temp_and_a_record_is_matched_by_bytes(tmp_path):
    """claims._saved_record: where interrupted.json and a whole temp record left by a killed write both name a file,
    the renamed record's entry counts; _as_recorded holds a file to its sha256, not only its size; records_only is
    true only when every entry is a record. Kills `{**saved["files"], **files}` -> `{**files, **saved["files"]}`,
    the digest check -> `return True`, and `all(…)` -> `any(…)`."""
    store = tmp_path / "s.csv.chunks"
    store.mkdir()
    identity = identities.canonical(IDENTITY)
    renamed = {"s.csv.png": {"bytes": 3, "sha256": "a" * 64}}
    (store / "interrupted.json").write_text(json.dumps({"identity": identity, "files": renamed}))
    (store / ".interrupted.json.99.tmp").write_text(json.dumps(
        {"identity": identity, "files": {"s.csv.png": {"bytes": 3, "sha256": "b" * 64}, "x.png": {"bytes": 1}}}))
    assert claims._saved_record(store, identity) == {**renamed, "x.png": {"bytes": 1}}
    fig = tmp_path / "f.png"
    fig.write_bytes(b"abc")
    assert claims._as_recorded(fig, {"bytes": 3, "sha256": _sha(fig)})
    assert not claims._as_recorded(fig, {"bytes": 3, "sha256": hashlib.sha256(b"abd").hexdigest()})
    assert claims.records_only([store / "interrupted.json", store / ".interrupted.json.99.tmp"])
    assert not claims.records_only([store / "interrupted.json", store / "chunk-0000000000.npy"])


# --- jobs --------------------------------------------------------------------------------------------------------


def test_finish_records_what_it_is_about_to_write_and_what_it_wrote_before_a_stop(tmp_path):
    """jobs.Job.finish with a saved-progress store: while `write` runs, interrupted.json lists the companion under
    `writing`; a write that fails after drawing the companion leaves its size and sha256 (hashlib) under `files`.
    Kills dropping `record_writing(…)` and dropping the `except`'s `record_interrupted(…)`."""
    from rmjax.runs import jobs

    out, fig, store = tmp_path / "s.csv", tmp_path / "s.csv.png", tmp_path / "s.csv.chunks"
    seen = []

    def write(path):
        seen.append(json.loads((store / "interrupted.json").read_text())["writing"])
        fig.write_bytes(b"a figure")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError), jobs.job(out, IDENTITY, owned=[fig], store=store) as job:
        chunks.ChunkStore(out, IDENTITY, 4).write(0, np.zeros((4, 2), np.float32))
        job.finish(write)
    assert seen == [["s.csv.png"]]
    files = json.loads((store / "interrupted.json").read_text())["files"]
    assert files == {"s.csv.png": {"bytes": 8, "sha256": _sha(fig)}}


def test_a_resume_without_a_figure_removes_the_one_its_killed_run_was_writing(tmp_path):
    """helper-154: `sweep --plot` SIGKILLed between its figure and .meta.json, resumed without --plot (not an input,
    so the same run), left s.csv.png beside the finished result, unrecorded: the next --plot run refused it as no
    run's. The resume now removes the companions its killed run recorded it was writing (record_writing) and does
    not write; a record naming a file that is no companion of the output (../victim, other.png) deletes nothing."""
    from rmjax.runs import jobs

    out, fig, store = tmp_path / "run" / "s.csv", tmp_path / "run" / "s.csv.png", tmp_path / "run" / "s.csv.chunks"
    with pytest.raises(KeyboardInterrupt), jobs.job(out, IDENTITY, owned=[fig], store=store):
        chunks.ChunkStore(out, IDENTITY, 4).write(0, np.zeros((4, 2), np.float32))
        raise KeyboardInterrupt  # stopped with progress saved; the kill below comes in its finish
    claims.record_writing(store, IDENTITY, out, [fig, tmp_path / "victim", tmp_path / "run" / "other.png"])
    for path in (fig, tmp_path / "victim", tmp_path / "run" / "other.png"):
        path.write_bytes(b"drawn before the kill")
    with jobs.job(out, IDENTITY, store=store) as job:  # no --plot: owns no figure
        assert job.claimed.resume
        job.finish(lambda path: path.write_text("token_id,x\n") and path)
    assert out.is_file() and not fig.exists()
    assert (tmp_path / "victim").is_file() and (tmp_path / "run" / "other.png").is_file()
    assert list(json.loads(results.meta_path(out).read_text())["files"]) == ["s.csv"]  # no figure recorded


def test_an_overwrite_stopped_early_records_the_old_result_it_replaces(tmp_path):
    """jobs.job with --overwrite over a result of other inputs: the old result is recorded (size, sha256 by hashlib)
    in the store's interrupted.json before the work, so a rerun without --overwrite may replace it. Kills the
    `overwrite and store is not None and decision.remove` recording -> `if False`."""
    from rmjax.runs import jobs

    out, store = tmp_path / "s.csv", tmp_path / "s.csv.chunks"
    out.write_text("old,result\n")
    with pytest.raises(KeyboardInterrupt), jobs.job(out, IDENTITY, overwrite=True, store=store):
        raise KeyboardInterrupt
    record = json.loads((store / "interrupted.json").read_text())
    assert record["files"]["s.csv"]["sha256"] == _sha(out)


def test_a_store_made_by_a_run_stopped_before_any_chunk_is_removed(tmp_path):
    """jobs._remove_if_unused: a run that made its store (manifest only) and stopped before saving a chunk leaves no
    store folder; one that saved a chunk keeps it whole. Kills `if not rest: store.rmdir()` -> `if False` and
    `not records_only(rest)` -> `records_only(rest)`."""
    from rmjax.runs import jobs

    out, store = tmp_path / "s.csv", tmp_path / "s.csv.chunks"
    with pytest.raises(UsageError), jobs.job(out, IDENTITY, store=store):
        chunks.ChunkStore(out, IDENTITY, 4)
        raise UsageError("a check after the load refused the run")
    assert not os.path.lexists(store)
    with pytest.raises(UsageError), jobs.job(out, IDENTITY, store=store):
        chunks.ChunkStore(out, IDENTITY, 4).write(0, np.zeros((4, 2), np.float32))
        raise UsageError("stopped")
    assert sorted(p.name for p in store.iterdir()) == ["chunk-0000000000.npy", "manifest.json"]


def test_finish_removes_a_killed_runs_old_temps_only(tmp_path):
    """jobs.Job.finish removes the temp files a killed earlier run left beside the result (older than the claim,
    another pid), and keeps a newer one. Kills dropping the `atomic.stale_temps` clean-up."""
    from rmjax.runs import jobs

    out = tmp_path / "s.csv"
    old, new = tmp_path / ".s.csv.4242.tmp", tmp_path / ".s.csv.4243.tmp"
    for tmp in (old, new):
        tmp.write_text("a killed run's rows")
    os.utime(old, (time.time() - 100, time.time() - 100))
    with jobs.job(out, IDENTITY) as job:
        os.utime(new, (job.claimed_at + 100, job.claimed_at + 100))
        job.finish(lambda path: path.write_text("token_id\n") and path)
    assert not old.exists() and new.exists()
    assert json.loads((tmp_path / "s.csv.meta.json").read_text())["files"]["s.csv"]["sha256"] == _sha(out)


def test_an_overwrite_never_writes_through_a_link_planted_at_a_companions_name(tmp_path):
    """jobs.Job.finish with --overwrite: a link planted at a companion's name is removed before `write` runs, so a
    companion written with a plain open (which follows links) leaves the link's target as it was; the new result,
    which replaced the old one, is kept and recorded. Kills dropping the links' early removal and dropping
    `_file_id(p) == was` (the old result's entries removed even where the new result wrote over them)."""
    from rmjax.runs import jobs

    out, fig, victim = tmp_path / "s.csv", tmp_path / "s.csv.png", tmp_path / "victim.txt"
    victim.write_text("precious")
    fig.symlink_to(victim)
    out.write_text("an old result of other inputs\n")

    def write(path):
        atomic.atomic_write_text(path, "token_id\n")
        with open(fig, "w") as f:
            f.write("figure")
        return path

    with jobs.job(out, IDENTITY, overwrite=True, owned=[fig]) as job:
        job.finish(write)
    assert victim.read_text() == "precious"
    assert not fig.is_symlink() and fig.read_text() == "figure"
    assert out.read_text() == "token_id\n"
    assert set(json.loads((tmp_path / "s.csv.meta.json").read_text())["files"]) == {"s.csv", "s.csv.png"}


# --- a real bug: a manifest's invalid batch size was ignored by resume_batch_size but kept by the store -----------


def test_the_store_keeps_only_the_batch_size_resume_batch_size_keeps(tmp_path):
    """A manifest of these inputs whose batch size is no positive int (JSON true, 0, text): resume_batch_size gives
    the memory plan the asked size, and the store must score with that same size (before the fix it took
    int(true) = 1, int(0) = 0, int("8") = 8, and the sweep scored in batches the plan never sized); a manifest
    without a chunk size is refused in one line naming the folder (before: a KeyError traceback)."""
    out = tmp_path / "s.csv"
    chunks.ChunkStore(out, IDENTITY, 4, batch_size=8)
    manifest = tmp_path / "s.csv.chunks" / "manifest.json"
    saved = json.loads(manifest.read_text())
    for bad in (True, 0, "8", -2):
        manifest.write_text(json.dumps({**saved, "batch_size": bad}))
        assert chunks.resume_batch_size(out, 16) == 16
        assert chunks.ChunkStore(out, IDENTITY, 4, batch_size=16).batch_size == 16, bad
    manifest.write_text(json.dumps({k: v for k, v in saved.items() if k != "chunk_size"}))
    with pytest.raises(ResumeMismatchError, match=r"records no valid chunk size \(a positive integer\); delete"):
        chunks.ChunkStore(out, IDENTITY, 4, batch_size=8)



def test_a_stage_input_of_another_job_or_a_folder_is_named_as_such(tmp_path):
    """results.checked_input: a frontier or disagree result read as a sweep was "an frontier result" (its kind had no
    job's name), and a folder given for a result file said "no such file" (helper-159)."""
    from rmjax.errors import InputFileError

    table = tmp_path / "frontier.csv"
    table.write_text("x\n1\n")
    results.write_meta(table, kind="frontier", identity={"job": "frontier"})
    with pytest.raises(InputFileError, match="is an experiments.frontier result, not an experiments.sweep result"):
        results.checked_input(table, ("sweep",), "--scores")
    with pytest.raises(InputFileError, match=f"--from_sweep={tmp_path} is a folder; give an experiments.sweep result"):
        results.checked_input(tmp_path, ("sweep",), "--from_sweep")


def test_a_record_of_an_older_rmjax_with_typed_paths_is_said_to_be_one():
    """Identities recorded before s123 held the paths as typed (a disagree's sides and judge, GCG's files); a rerun
    of the same inputs was refused as "a run with different judge.spec, sides" (helper-160), a change nobody made.
    Another model or file is still named as a change."""
    from rmjax.runs import identities

    fp, judge = {"weights": "w", "tokenizer": "t"}, {"weights": "j", "tokenizer": "u"}
    new = {"job": "disagree", "sides": [{"kind": "rm", "models": [fp]}, {"kind": "implicit", "models": [fp, judge]}],
           "judge": {"model": judge, "template": "its own"}, "config": {"init_from": {"sha1": "s"}}}
    old = {"job": "disagree",
           "sides": [{"spec": "rm/", "models": [fp]}, {"spec": "implicit:a:b", "models": [fp, judge]}],
           "judge": {"spec": "judge", "model": judge, "template": "its own"},
           "config": {"init_from": {"path": "b.csv", "sha1": "s"}}}
    assert identities.without_typed_paths(old) == identities.canonical(new)
    said = identities.mismatch_message("saved progress P", identities.canonical(old), new)
    assert "older rmjax" in said and "--overwrite" in said and "different" not in said
    other = {**old, "config": {"init_from": {"path": "b.csv", "sha1": "other"}}}
    assert "different config.init_from.sha1" in identities.mismatch_message("P", identities.canonical(other), new)
    swapped = {**old, "sides": old["sides"][::-1]}
    assert not identities.of_an_older_rmjax(identities.canonical(swapped), new)
