"""Issue 22: no silent wrong result where one stage's output is trusted or read by the next, or where two names
map to one file. Each test fails on the code before the fix. The jobs run in-process as their entry points call
them (tests/inproc.py): reuse, stage inputs and output names are the jobs' own; a lock held by another run and the full
disk (a resource limit on the process) run as the command."""

from __future__ import annotations

import json
import os
import subprocess

import pandas as pd

from rmjax.runs import locks, results
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_job import GcgSpec, run_gcg
from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc


def _sweep(rm_folder, out, **settings):
    """sweep --prompts=greatest --limit=120 --top=2 (--top only prints); `settings`: RunOptions fields."""
    return run_sweep(SweepSpec(inproc.options(rm_folder, out, **settings), inproc.prompts("greatest"), limit=120))


def _gcg(rm_folder, out, **settings):
    """gcg --prompts=greatest with `settings` (GCGConfig flags)."""
    return run_gcg(GcgSpec(inproc.options(rm_folder, out), inproc.prompts("greatest"), GCGConfig(**settings)))


def test_a_finished_result_is_reused_only_when_it_is_whole(rm_folder, tmp_path):
    """Class 1: a result edited after it was written (its last row cut) is not reused: the rerun names what is wrong
    and changes nothing (a same-size edit: test_beam's test_from_sweep_refuses_other_runs_and_incomplete_sweeps);
    --overwrite recomputes it, byte for byte the first result."""
    out = tmp_path / "s.csv"
    _sweep(rm_folder, out)
    whole = out.read_bytes()
    damaged = whole[: whole.rindex(b"\n", 0, -1) + 1]
    out.write_bytes(damaged)
    inproc.refused(lambda: _sweep(rm_folder, out), "does not match its s.csv.meta.json", "cut short", "--overwrite")
    assert out.read_bytes() == damaged
    _sweep(rm_folder, out, overwrite=True)
    assert out.read_bytes() == whole
    # a GCG result JSON cut short: refused the same way (not reused, then a JSONDecodeError)
    gcg_out = tmp_path / "g.json"

    def gcg():  # gcg --num_tokens=2 --steps=1 --search_width=4 --topk=4 --buffer_size=2
        return _gcg(rm_folder, gcg_out, num_tokens=2, steps=1, search_width=4, topk=4, buffer_size=2)

    gcg()
    gcg_out.write_bytes(gcg_out.read_bytes()[:-20])
    inproc.refused(gcg, "g.json", "cut short", "--overwrite")


def test_later_stages_read_only_whole_results_of_the_right_kind(rm_folder, tmp_path, monkeypatch):
    """Class 2: inspect --from_sweep and gcg --init_from refuse, before the model loads, a table cut short, one
    without its .meta.json and one of another kind."""
    from rmjax.inspect.job import InspectSpec, run_inspect

    out = tmp_path / "s.csv"
    _sweep(rm_folder, out)
    cut = tmp_path / "cut.csv"
    cut.write_bytes(out.read_bytes()[:-40])
    meta = json.loads(results.meta_path(out).read_text())
    meta["files"] = {"cut.csv": meta["files"]["s.csv"]}
    results.meta_path(cut).write_text(json.dumps(meta))
    bare = tmp_path / "bare.csv"
    bare.write_bytes(out.read_bytes())

    def inspect(sweep):  # inspect --prompts=greatest --steps=2 --from_sweep=SWEEP
        (prompt,) = inproc.prompts("greatest").items()
        return run_inspect(InspectSpec(inproc.options(rm_folder, tmp_path / "i"), prompt, source=str(sweep), steps=2,
                                       source_flag="--from_sweep"))

    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: inspect(cut), "--from_sweep", "cut short")
    inproc.refused(lambda: inspect(bare), "--from_sweep", "no bare.csv.meta.json")
    # gcg --num_tokens=1 --search_width=4 --topk=4 --init_from=SWEEP
    inproc.refused(lambda: _gcg(rm_folder, tmp_path / "g.json", num_tokens=1, search_width=4, topk=4,
                                init_from=str(out)),
                   "--init_from", "experiments.sweep result, not an experiments.beam result")


def test_derived_file_names_are_injective_and_symlinks_are_one_output(rm_folder, tmp_path, capsys):
    """Class 4: a sweep to x.csv and a beam to x.txt keep their own .meta.json (both run, sequentially, and
    --overwrite of one leaves the other's); a symlinked --out is its target: same result, same lock."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    sweep_out, beam_out = tmp_path / "x.csv", tmp_path / "x.txt"
    _sweep(rm_folder, sweep_out)
    # beam --prompts=greatest --token_ids=5,6,7,8 --depth=2 --beam=2
    run_beam(BeamSpec(inproc.options(rm_folder, beam_out), inproc.prompts("greatest"),
                      BeamConfig(depth=2, beam=2, allow_special=True), (5, 6, 7, 8)))
    kinds = {p.name: json.loads(results.meta_path(p).read_text())["kind"] for p in (sweep_out, beam_out)}
    assert kinds == {"x.csv": "sweep", "x.txt": "beam"}
    beam_meta = results.meta_path(beam_out).read_bytes()
    _sweep(rm_folder, sweep_out, overwrite=True)
    assert results.meta_path(beam_out).read_bytes() == beam_meta
    link = tmp_path / "link.csv"
    link.symlink_to(sweep_out)
    capsys.readouterr()
    _sweep(rm_folder, link)
    assert "reused (written " in capsys.readouterr().err and not results.meta_path(link).exists()
    with locks.hold(sweep_out):  # a run writing the target holds its lock: a run through the link (another
        # process: the command) is refused
        refused = cli.run("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={link}", "--token_ids=1,2")
    cli.user_error(refused, "another run holds", os.path.basename(sweep_out) + ".lock")


def test_inspect_labels_identify_each_response(rm_folder, tmp_path):
    """Class 6: tokens that all decode to U+FFFD are inspected under labels that carry their ids, so every row of
    every table names one response. (`sweep --token_ids=…` and `inspect --from_sweep --top=1 --steps=2
    --ig_max_evaluations=8`, in-process.)"""
    from transformers import AutoTokenizer

    from rmjax.inspect.job import InspectSpec, run_inspect

    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    replacement = [i for i in range(len(tok)) if tok.decode([i]) == "\ufffd"][:3]
    assert len(replacement) == 3
    swept = tmp_path / "fffd.csv"
    run_sweep(SweepSpec(inproc.options(rm_folder, swept), inproc.prompts("greatest"), tuple(replacement)))
    out = tmp_path / "inspect"
    (prompt,) = inproc.prompts("greatest").items()
    run_inspect(InspectSpec(inproc.options(rm_folder, out), prompt, source=str(swept), top=1, steps=2,
                            max_evaluations=8, source_flag="--from_sweep"))
    lens = pd.read_csv(out / "reward_lens.csv", keep_default_na=False)
    labels = sorted(set(lens.response))
    assert len(labels) == 2, labels
    assert all(label.startswith("\ufffd [ids ") for label in labels), labels
    assert {int(label.split()[-1].rstrip("]")) for label in labels} <= set(replacement), labels


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(rm_folder, tmp_path):
    """Unclear errors: writing past the space there is (here a file-size limit, EFBIG, as ENOSPC) stops with one
    line naming the file and the fix, and leaves neither a partial result nor a temp file. (A resource limit on the
    process, and experiments.cli's one line for a disk error: the command.)"""
    out = tmp_path / "s.csv"
    proc = subprocess.run(["bash", "-c", 'ulimit -f 4 && exec "$@"', "bash",
                           *cli.command("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={out}",
                                        "--limit=600")],
                          cwd=cli.REPO, env=cli.ENV, capture_output=True, text=True, timeout=600)
    cli.user_error(proc, "cannot write", "free space", loaded=True)
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
