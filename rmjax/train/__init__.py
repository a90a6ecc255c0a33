"""Reward-model training: Bradley–Terry objective, EloEverything pairs, optax loop, orbax checkpoints."""
