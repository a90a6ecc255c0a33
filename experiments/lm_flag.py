"""--lm, shared by the jobs that run a causal LM beside the reward model (frontier, beam, GCG)."""

from absl import flags

LM = flags.DEFINE_string("lm", None, "A causal LM with the RM's tokenizer: the frontier's prior, and the LM whose "
                         "greedy continuation completes each written response for the completion check (frontier, "
                         "beam, GCG). Default: the RM's own backbone when it ties its embeddings; a beam or GCG job "
                         "with neither skips the check and says so in .meta.json.")


if __name__ == "__main__":
    from experiments import not_a_job

    not_a_job(__spec__.name)
