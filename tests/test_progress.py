"""Progress lines (issue 45): a resumed run says where it resumed from; no measured work shows no rate, not 0.0."""

from __future__ import annotations

import io

from rmjax.runs.progress import Progress


def test_a_resumed_run_says_so_and_an_unmeasured_rate_is_unknown():
    out = io.StringIO()
    resumed = Progress(1000, "sweep", done=400, stream=out, every=0)
    resumed.update(0, force=True)  # nothing scored yet in this process
    line = out.getvalue().strip()
    assert line.startswith("[sweep] 400/1,000 candidates (40.0%, resumed from 400) ? candidates/s ETA ?"), line
    assert "0.0 candidates/s" not in line
    fresh = io.StringIO()
    Progress(10, "inspect", unit="responses", stream=fresh, every=0).update(0, force=True)
    assert "resumed" not in fresh.getvalue() and "? responses/s" in fresh.getvalue()


def test_a_slow_rate_keeps_its_digits():
    """A full fine-tune's step of 23 s read "0.0 steps/s": under 10 a second the rate shows three digits."""
    from rmjax.runs.progress import rate_text

    assert (rate_text(2 / 46), rate_text(9.994), rate_text(12345.67), rate_text(0.0)) == \
        ("0.0435", "9.99", "12,345.7", "?")
    out = io.StringIO()
    progress = Progress(10, "train", unit="steps", stream=out, every=0)
    progress.start -= 46.0  # 2 steps in 46 s (and the moments since: a busy machine's, not exactly 46)
    progress.update(2)
    assert out.getvalue().split(") ")[1].startswith("0.04"), out.getvalue()


def test_work_read_back_counts_as_resumed_and_never_in_the_rate():
    """The frontier counted units read back from disk as if just computed: its rate, and so its ETA, took the
    speed of reading them back. Now `resume` counts them done and resumed, and the rate is this process's work."""
    out = io.StringIO()
    progress = Progress(1000, "frontier 2/4: greatest optimal, search λ=0.25", unit="forwards", stream=out, every=0)
    progress.resume(500)
    progress.start -= 10.0  # 10 s of this process's work: 100 forwards
    progress.update(100)
    line = out.getvalue().strip()
    rate = float(line.split(") ")[1].split(" ")[0])
    assert line.startswith("[frontier 2/4: greatest optimal, search λ=0.25] 600/1,000 forwards (60.0%, resumed "
                           "from 500) "), line
    assert 9.0 <= rate <= 10.0  # 100 forwards in 10 s and the few microseconds since, not 600 in 10 s


def test_with_warmup_the_first_work_and_its_compile_stay_out_of_the_rate():
    """Issue 45: the frontier's first ETA said 15 min for a 5-min run: its first step's time was mostly compiling.
    With `warmup` the rate starts at the first work reported: 100 forwards in the 10 s after it, not 110 in 110 s."""
    out = io.StringIO()
    progress = Progress(1000, "frontier", unit="forwards", stream=out, every=0, warmup=True)
    progress.start -= 100.0  # the first step: compiling, then 10 forwards
    progress.update(10)
    assert "? forwards/s ETA ?" in out.getvalue() and "resumed" not in out.getvalue()
    progress.start -= 10.0
    progress.update(100)
    rate = float(out.getvalue().strip().splitlines()[-1].split(") ")[1].split(" ")[0])
    assert 9.0 <= rate <= 10.0


def test_a_resume_kept_batch_size_is_said_without_claiming_the_memory_plan_would_pick_another(tmp_path, capsys):
    """With --batch_size=0 a resume keeps the saved batch size before the memory plan runs: the note said "not the
    memory plan's pick" even where the plan then picked that very size (a fault hunt). --batch_size=N still says
    what it overrode."""
    import json

    from rmjax.runs.chunks import resume_batch_size, store_dir

    out = tmp_path / "scores.csv"
    store_dir(out).mkdir()
    (store_dir(out) / "manifest.json").write_text(json.dumps({"batch_size": 256}))
    assert resume_batch_size(out, 0) == 256
    said = capsys.readouterr().err
    assert "with its batch size 256" in said and "not the memory plan" not in said and "not --" not in said
    assert resume_batch_size(out, 64) == 256
    assert "with its batch size 256, not --batch_size=64" in capsys.readouterr().err
    assert resume_batch_size(out, 256) == 256 and capsys.readouterr().err == ""
