"""rmjax: reward-model interpretability on JAX (Llama 3.x and Gemma 1/2/3 backbones)."""

__version__ = "0.1.0"
