"""Reading a reward model from inside: reward lens, attribution, activation patching."""
