"""Progress lines with rate and ETA for long runs, and a closing summary."""

from __future__ import annotations

import sys
import time


def duration(seconds: float) -> str:
    """`1h02m03s`, `4m05s`."""
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def rate_text(rate: float) -> str:
    """A rate to read: none measured yet is "?", not "0.0"; under 10 a second, three digits (a 23 s step read
    "0.0")."""
    return "?" if rate <= 0 else f"{rate:,.1f}" if rate >= 10 else f"{rate:.3g}"


class Progress:
    """Prints `label done/total (pct) rate unit/s ETA` at most every `every` seconds (stderr).

    `total` and `label` may change while it runs (rmjax.search.beam counts one whole job over its levels and revises
    the total as a level starts); `rate_hint` (unit/s, e.g. timed on a warm-up batch) stands for the rate until
    some work is measured. With `warmup`, the rate starts at the first work reported, which is left out of it: that
    work paid for compiling (the frontier's first ETA said 15 min for a 5-min run)."""

    def __init__(self, total: int, label: str, unit: str = "candidates", every: float = 5.0,
                 done: int = 0, stream=None, rate_hint: float | None = None, warmup: bool = False):
        self.total, self.label, self.unit, self.every = total, label, unit, every
        self.done = done
        self.resumed = done
        self.rate_base = done  # work the rate leaves out: resumed, and with `warmup` the first work reported
        self.warming = warmup
        self.rate_hint = rate_hint
        self.start = self.last = time.perf_counter()
        self.stream = stream or sys.stderr

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        measured = (self.done - self.rate_base) / elapsed if elapsed > 0 else 0.0
        return measured if measured > 0 or not self.rate_hint else self.rate_hint

    def resume(self, n: int) -> None:
        """Work found done on disk (a resumed job's finished units): counted as done and as "resumed from", but never
        in the rate, which would otherwise promise the rest at the speed of reading it back."""
        self.done += n
        self.resumed += n
        self.rate_base += n

    def update(self, n: int, force: bool = False) -> None:
        self.done += n
        now = time.perf_counter()
        if self.warming and n > 0:
            self.warming, self.rate_base, self.start = False, self.done, now
        if force or now - self.last >= self.every or self.done >= self.total:
            self.last = now
            rate = self.rate
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            pct = 100.0 * self.done / max(self.total, 1)
            eta_s = duration(eta) if eta == eta else "?"
            speed = rate_text(rate)
            resumed = f", resumed from {self.resumed:,}" if self.resumed else ""
            print(
                f"[{self.label}] {self.done:,}/{self.total:,} {self.unit} ({pct:.1f}%{resumed}) "
                f"{speed} {self.unit}/s ETA {eta_s}",
                file=self.stream,
                flush=True,
            )

    def seconds(self) -> float:
        return time.perf_counter() - self.start


class PhaseClock:
    """Seconds per phase of a job, for its .meta.json: each call adds the time since the last one to its phase, so
    where a long run spends its time is on record beside its results."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in self.seconds.items()}
