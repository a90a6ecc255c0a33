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
