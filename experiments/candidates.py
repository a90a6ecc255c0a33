"""Flags of the jobs that score a candidate set batch by batch in resumable chunks (sweep, beam)."""

from __future__ import annotations

from absl import flags

from experiments.token_ids import TOKEN_IDS, token_ids  # noqa: F401  (the jobs' candidate set)

BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Candidates per forward pass (over all devices); 0 picks the "
                                  "largest that fits the device memory estimate (at most 256 on CPU).", lower_bound=0)
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", 4096, "Candidates per resumable chunk written to <out>.chunks/.",
                                  lower_bound=1)
VOCAB_FILE = flags.DEFINE_string("vocab_file", None,
                                 "Candidate set from a text file, one string per line taken verbatim (' cat' and "
                                 "'cat' are different tokens); lines that are not exactly one token are skipped "
                                 "(counted on stderr, and in .meta.json by the beam).")
flags.declare_key_flag("token_ids")  # so that sweep and beam, adopting this module's flags, list it


def refuse_two_sets() -> None:
    """--token_ids and --vocab_file: the job's refusal (rmjax.text.candidates.refuse_two_candidate_sets), from the
    flags alone."""
    from rmjax.text.candidates import refuse_two_candidate_sets

    refuse_two_candidate_sets(token_ids(), VOCAB_FILE.value)


def refuse_limit_keeping_all(limit: int | None) -> None:
    """With --token_ids the candidates are known from the flags alone, so a --limit that keeps them all is refused
    here, where a launch reads the job's line (experiments.job_line), not only once the model's tokenizer is read."""
    from rmjax.text.candidates import refuse_limit_keeping_all as refuse

    ids = token_ids()
    if ids is not None:
        refuse(limit, len(ids))


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
