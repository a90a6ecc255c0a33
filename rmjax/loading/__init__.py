"""Checkpoint loading: HF safetensors folders, GGUF files, builtin model names."""
