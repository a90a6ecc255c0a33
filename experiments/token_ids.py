"""--token_ids: a candidate set given as token ids, one flag and one parser for the jobs that take one (GCG;
sweep and beam through experiments.candidates)."""

from __future__ import annotations

import re
from collections import Counter

from absl import flags

TOKEN_IDS = flags.DEFINE_list("token_ids", None, "Only these token ids (the candidate set): the tokens scored "
                              "(sweep, beam) or searched (GCG). Comma-separated non-negative integers, each once.")

INT64_MAX = 2**63 - 1
_ASCII_DIGITS = re.compile(r"[0-9]+")  # str.isdigit and int() also take '٢٨', '２８' (and isdigit '²')


def _token_ids_are_ints(values: list[str] | None) -> bool:
    """A set of ids written in ASCII digits, each once: a repeated id would be ranked twice and counted in the
    set's size."""
    if values is None:
        return True
    bad = [v for v in values if not _ASCII_DIGITS.fullmatch(v.strip())]
    if bad or not values:
        raise flags.ValidationError(f"expected non-negative integer token ids in ASCII digits 0-9, got "
                                    f"{bad[0] if bad else 'none'!r}")
    # by length first: int() of a string past 4,300 digits is a ValueError traceback of its own
    huge = [v.strip() for v in values if len(v.strip().lstrip("0")) > 19 or int(v) > INT64_MAX]
    if huge:  # numpy cannot hold it (an OverflowError traceback where the job keys its ids); no vocabulary is so large
        raise flags.ValidationError(f"token id {huge[0][:30]}{'…' if len(huge[0]) > 30 else ''} does not fit a 64-bit "
                                    "integer; token ids are below the model's vocabulary size")
    repeated = [str(i) for i, n in Counter(int(v) for v in values).items() if n > 1]
    if repeated:
        raise flags.ValidationError(f"token ids {', '.join(repeated)} are given more than once; give each id once "
                                    "(the candidate set is a set)")
    return True


flags.register_validator("token_ids", _token_ids_are_ints)


def token_ids() -> list[int] | None:
    """--token_ids as ints; None when not given (the whole vocabulary)."""
    return [int(t) for t in TOKEN_IDS.value] if TOKEN_IDS.value else None


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
