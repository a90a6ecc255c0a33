"""Issue 22: no silent wrong result where one stage's output is trusted or read by the next, or where two names
map to one file. Each test runs the entry points as a user does and fails on the code before the fix."""

from __future__ import annotations

import json
import os
import subprocess

import pandas as pd

from rmjax.runs import locks, results
from tests import cli


def _sweep(rm_folder, out, *flags):
    return cli.run("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=120", "--top=2",
                   *flags)


def test_a_finished_result_is_reused_only_when_it_is_whole(rm_folder, tmp_path):
    """Class 1: a result edited after it was written (its last row cut) is not reused: the rerun names what is wrong
    and changes nothing (a same-size edit: test_beam's test_from_sweep_refuses_other_runs_and_incomplete_sweeps);
    --overwrite recomputes it, byte for byte the first result."""
    out = tmp_path / "s.csv"
    cli.ok(_sweep(rm_folder, out))
    whole = out.read_bytes()
    damaged = whole[: whole.rindex(b"\n", 0, -1) + 1]
    out.write_bytes(damaged)
    cli.user_error(_sweep(rm_folder, out), "does not match its s.csv.meta.json", "cut short", "--overwrite")
    assert out.read_bytes() == damaged
    cli.ok(_sweep(rm_folder, out, "--overwrite"))
    assert out.read_bytes() == whole
    # a GCG result JSON cut short: refused the same way (not reused, then a JSONDecodeError)
    gcg_out = tmp_path / "g.json"
    gcg = ("gcg", f"--model={rm_folder}", "--prompts=greatest", f"--out={gcg_out}", "--num_tokens=2", "--steps=1",
           "--search_width=4", "--topk=4", "--buffer_size=2")
    cli.ok(cli.run(*gcg))
    gcg_out.write_bytes(gcg_out.read_bytes()[:-20])
    cli.user_error(cli.run(*gcg), "g.json", "cut short", "--overwrite")


def test_later_stages_read_only_whole_results_of_the_right_kind(rm_folder, tmp_path):
    """Class 2: inspect --from_sweep and gcg --init_from refuse, before the model loads, a table cut short, one
    without its .meta.json and one of another kind."""
    out = tmp_path / "s.csv"
    cli.ok(_sweep(rm_folder, out))
    cut = tmp_path / "cut.csv"
    cut.write_bytes(out.read_bytes()[:-40])
    meta = json.loads(results.meta_path(out).read_text())
    meta["files"] = {"cut.csv": meta["files"]["s.csv"]}
    results.meta_path(cut).write_text(json.dumps(meta))
    bare = tmp_path / "bare.csv"
    bare.write_bytes(out.read_bytes())
    inspect = ("inspect", f"--model={rm_folder}", "--prompts=greatest", f"--out={tmp_path / 'i'}", "--steps=2")
    cli.user_error(cli.run(*inspect, f"--from_sweep={cut}"), "--from_sweep", "cut short")
    cli.user_error(cli.run(*inspect, f"--from_sweep={bare}"), "--from_sweep", "no bare.csv.meta.json")
    gcg = ("gcg", f"--model={rm_folder}", "--prompts=greatest", f"--out={tmp_path / 'g.json'}", "--num_tokens=1",
           "--search_width=4", "--topk=4")
    cli.user_error(cli.run(*gcg, f"--init_from={out}"), "--init_from", "experiments.sweep result, not an "
                   "experiments.beam result")


def test_derived_file_names_are_injective_and_symlinks_are_one_output(rm_folder, tmp_path):
    """Class 4: a sweep to x.csv and a beam to x.txt keep their own .meta.json (both run, sequentially, and
    --overwrite of one leaves the other's); a symlinked --out is its target: same result, same lock."""
    sweep_out, beam_out = tmp_path / "x.csv", tmp_path / "x.txt"
    cli.ok(_sweep(rm_folder, sweep_out))
    cli.ok(cli.run("beam", f"--model={rm_folder}", "--prompts=greatest", f"--out={beam_out}",
                   "--token_ids=5,6,7,8", "--depth=2", "--beam=2"))
    kinds = {p.name: json.loads(results.meta_path(p).read_text())["kind"] for p in (sweep_out, beam_out)}
    assert kinds == {"x.csv": "sweep", "x.txt": "beam"}
    beam_meta = results.meta_path(beam_out).read_bytes()
    cli.ok(_sweep(rm_folder, sweep_out, "--overwrite"))
    assert results.meta_path(beam_out).read_bytes() == beam_meta
    link = tmp_path / "link.csv"
    link.symlink_to(sweep_out)
    reused = cli.ok(_sweep(rm_folder, link))
    assert "reusing it" in reused.stderr and not results.meta_path(link).exists()
    with locks.hold(sweep_out):  # a run writing the target holds its lock: a run through the link is refused
        refused = cli.run("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={link}", "--token_ids=1,2")
    cli.user_error(refused, "another run holds", os.path.basename(sweep_out) + ".lock")


def test_inspect_labels_identify_each_response(rm_folder, tmp_path):
    """Class 6: tokens that all decode to U+FFFD are inspected under labels that carry their ids, so every row of
    every table names one response."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(rm_folder))
    replacement = [i for i in range(len(tok)) if tok.decode([i]) == "\ufffd"][:3]
    assert len(replacement) == 3
    swept = tmp_path / "fffd.csv"
    cli.ok(cli.run("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={swept}",
                   "--token_ids=" + ",".join(map(str, replacement))))
    out = tmp_path / "inspect"
    cli.ok(cli.run("inspect", f"--model={rm_folder}", "--prompts=greatest", f"--from_sweep={swept}", "--top=1",
                   f"--out={out}", "--steps=2", "--ig_max_evaluations=8"))
    lens = pd.read_csv(out / "reward_lens.csv", keep_default_na=False)
    labels = sorted(set(lens.response))
    assert len(labels) == 2, labels
    assert all(label.startswith("\ufffd [ids ") for label in labels), labels
    assert {int(label.split()[-1].rstrip("]")) for label in labels} <= set(replacement), labels


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(rm_folder, tmp_path):
    """Unclear errors: writing past the space there is (here a file-size limit, EFBIG, as ENOSPC) stops with one
    line naming the file and the fix, and leaves neither a partial result nor a temp file."""
    out = tmp_path / "s.csv"
    proc = subprocess.run(["bash", "-c", 'ulimit -f 4 && exec "$@"', "bash",
                           *cli.command("sweep", f"--model={rm_folder}", "--prompts=greatest", f"--out={out}",
                                        "--limit=600")],
                          cwd=cli.REPO, env=cli.ENV, capture_output=True, text=True, timeout=600)
    cli.user_error(proc, "cannot write", "free space", loaded=True)
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
