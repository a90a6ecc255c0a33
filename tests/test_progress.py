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
