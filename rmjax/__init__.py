"""rmjax: reward-model interpretability on JAX (Llama 3.x and Gemma 1/2/3 backbones)."""

import os

# rmjax needs no PyTorch: transformers' advisory that it found none ("PyTorch was not found. Models won't be
# available ...") is noise in every job, bench and notebook that imports rmjax first (a user's setting stands).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
