"""A GGUF file's tokenizer, rebuilt without PyTorch.

`AutoTokenizer.from_pretrained(gguf_file=…)` reads the metadata with transformers' GGUF reader,
which imports torch at module level; torch is a test extra here (a runtime pin would pull CUDA
wheels onto GPU and TPU hosts). So the metadata comes from rmjax's reader (gguf_reader), which the
weight conversion reads anyway, and only the torch-free half of transformers' GGUF support builds
the tokenizer: `convert_gguf_tokenizer`, from the same dictionary transformers would hand it.
`tests/test_real_models.py` holds the result equal to transformers' own GGUF tokenizer.
"""

from __future__ import annotations

from rmjax.errors import CheckpointError
from rmjax.loading.gguf_reader import GGUFContents

# llama.cpp metadata key -> the name transformers' tokenizer builders read it under.
_TOKENIZER_KEYS = {
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap",
    "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
_CONFIG_KEYS = {"chat_template": "chat_template", "ggml.add_bos_token": "add_bos_token",
                "ggml.add_eos_token": "add_eos_token"}
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unk_token_id",
                   "pad_token": "pad_token_id"}


def check_special_ids(contents: GGUFContents, path) -> None:
    """Each special token id is one of the file's tokens (an IndexError traceback before; the config check, which
    runs first, would blame a config.json the file does not have)."""
    tokens = contents.metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    for key in ("ggml.bos_token_id", "ggml.eos_token_id", "ggml.unknown_token_id", "ggml.padding_token_id"):
        token_id = contents.metadata.get(f"tokenizer.{key}")
        if token_id is not None and not 0 <= int(token_id) < len(tokens):
            raise CheckpointError(f"{path}: tokenizer.{key} = {int(token_id)} is not one of its {len(tokens)} "
                                  "tokens (tokenizer.ggml.tokens): the file is damaged; convert it again with "
                                  "llama.cpp's convert_hf_to_gguf.py, or load the Hugging Face folder instead.")


def tokenizer_from_gguf(contents: GGUFContents, model_type: str, path) -> object:
    """The tokenizer transformers would build from this GGUF, as a transformers tokenizer object."""
    from transformers import GemmaTokenizer, LlamaTokenizer, TokenizersBackend
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    fields = contents.metadata
    if "tokenizer.ggml.tokens" not in fields:
        raise CheckpointError(f"{path}: this GGUF file has no tokenizer (no tokenizer.ggml.tokens); "
                              "load a Hugging Face folder with its tokenizer files instead.")
    if "tokenizer.ggml.model" not in fields:
        raise CheckpointError(f"{path}: this GGUF file has no tokenizer.ggml.model (the tokenizer's kind: llama, "
                              "gpt2); convert it again with llama.cpp's convert_hf_to_gguf.py, or load the Hugging "
                              "Face folder with its tokenizer files instead.")
    # the values as transformers' reader gives them: scalars, and numeric and string lists in full
    tokenizer = {name: fields[f"tokenizer.{key}"] for key, name in _TOKENIZER_KEYS.items()
                 if f"tokenizer.{key}" in fields}
    config = {name: fields[f"tokenizer.{key}"] for key, name in _CONFIG_KEYS.items() if f"tokenizer.{key}" in fields}
    sentencepiece = tokenizer.get("tokenizer_type") == "llama"
    if sentencepiece:
        # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise (as transformers does).
        config.setdefault("add_bos_token", True)
    check_special_ids(contents, path)
    for name, key in _SPECIAL_TOKENS.items():
        token_id = tokenizer.get(key)
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    architecture = str(fields["general.architecture"])
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer)
    except (ValueError, KeyError, TypeError, IndexError) as error:  # an unknown kind, a missing or odd field
        raise CheckpointError(f"{path}: transformers cannot build this GGUF file's tokenizer (tokenizer.ggml.model="
                              f"{tokenizer.get('tokenizer_type')!r}; {type(error).__name__}: "
                              f"{' '.join(str(error).split())[:160]}); load the Hugging Face folder with its "
                              "tokenizer files instead.") from None
    # The class transformers' AutoTokenizer picks for these files: Gemma's and Llama 2's sentencepiece
    # classes, and the generic backend for byte-level BPE (Llama 3, SmolLM2).
    if sentencepiece:
        cls = GemmaTokenizer if model_type.startswith("gemma") else LlamaTokenizer
    else:
        cls = TokenizersBackend
    return cls(tokenizer_object=backend, **config, **extra)


def refuse_added_tokens(built, contents: GGUFContents, path) -> None:
    """transformers' byte-level builder gives GPT-2's default specials: a Llama 3 GGUF without <|endoftext|> gets
    it past the file's tokens and the embedding, which was refused naming rmjax's cache folder ("use the tokenizer
    saved with this checkpoint"). Checked once the tensors are (a file short of them says so first)."""
    count = len(contents.metadata["tokenizer.ggml.tokens"])
    added = sorted(t for t, i in built.get_vocab().items() if i >= count)
    if added:
        raise CheckpointError(f"{path}: transformers builds this GGUF's tokenizer with tokens the file does not have "
                              f"({', '.join(added[:3])}), past its {count} tokens and the model's embedding; load the "
                              "Hugging Face folder (with its tokenizer.json) instead.")
