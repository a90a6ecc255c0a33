"""Content fingerprints of checkpoints: what a resumed or reused result was computed from.

A fingerprint is `{"weights": …, "tokenizer": …, "reading": READING}`. Weights: config.json, the shard index and
the SHA-256 of every safetensors file, or of the GGUF file, whole: an edit anywhere (one embedding row changed in
place) changes it. A file is hashed once per cache folder (about 1.5 GB/s with SHA instructions, the shards in
parallel): its digest is remembered by the file's device, inode, size, mtime and ctime, which a write changes, once
the file has been unchanged for a minute (SETTLED_NS: a write through a memory map can leave them as they were for
up to ~30 s). Tokenizer: every tokenizer and chat-template file in full (they are small).
Content only, no paths or mtimes: a copied or moved checkpoint is hashed again and keeps its fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rmjax.errors import CheckpointError
from rmjax.loading.cache_folder import cache_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt")


def hash_json(value) -> str:
    """Short stable digest of a JSON-able value (dict keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def file_sha256(path: str | Path) -> str:
    h, buffer = hashlib.sha256(), bytearray(max(1, min(8 << 20, os.path.getsize(path))))  # tokenizer files are small
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(memoryview(buffer)[:n])
    return h.hexdigest()[:24]


_DIGESTS: dict[str, str] = {}  # this process's, by the file's key below
# A digest is remembered only for a file last changed at least this long before it was hashed. A write through a
# memory map moves mtime and ctime at the first write to a clean page; later writes to a page still dirty move
# nothing until writeback (about 30 s by default), and some kernels and file systems keep ctime in milliseconds or
# seconds: a file changed this recently may change again under the same key (git's "racily clean" entries).
SETTLED_NS = 60 * 10**9


def _stat_key(path: Path) -> tuple[str, int]:
    """(key, the later of mtime and ctime in ns): the key changes whenever the file is written (a write, truncation,
    rename or `touch` updates ctime, which no user tool sets back), within SETTLED_NS; size and mtime beside it."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return key, max(st.st_mtime_ns, st.st_ctime_ns)


def _now_ns() -> int:
    return time.time_ns()


def _record(key: str) -> Path:
    """Where the digest of the file with this key is remembered: named by the file's path, then by its key, so
    that a new version's record replaces the last one's (one record per path, not one per version)."""
    path = key.split("|", 1)[0]
    return cache_dir() / "digests" / (f"{hashlib.sha256(path.encode()).hexdigest()[:16]}-"
                                      f"{hashlib.sha256(key.encode()).hexdigest()[:32]}")


def content_digest(path: str | Path) -> str:
    """SHA-256 (24 hex digits) of the whole file, remembered by its `_stat_key` in this process and under the
    cache folder's digests/ (written atomically; an unwritable cache folder only costs hashing again) once the
    file has been unchanged for SETTLED_NS."""
    path = Path(path)
    key, _ = _stat_key(path)
    if key in _DIGESTS:
        return _DIGESTS[key]
    try:
        remembered = json.loads(_record(key).read_text())
        if remembered["key"] == key:
            _DIGESTS[key] = remembered["sha256"]
            return _DIGESTS[key]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        pass
    for _ in range(3):
        started = _now_ns()
        digest = file_sha256(path)
        (key, changed), before = _stat_key(path), key
        if key == before:
            break
    else:  # written to while it was read, each time: the digest would be of no one version
        raise CheckpointError(f"{path}: changed while it was read (three times); rerun once it is written.")
    if started - changed < SETTLED_NS:
        return digest
    _DIGESTS[key] = digest
    try:
        record = _record(key)  # the key after the hash: the one that was checked
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"key": key, "sha256": digest}))
        os.replace(tmp, record)
        for older in record.parent.glob(f"{record.name.split('-')[0]}-*"):
            if older != record and not older.name.endswith(".tmp"):
                older.unlink(missing_ok=True)
    except OSError:
        pass
    return digest


# What transformers' tokenizer loading reads besides TOKENIZER_FILES when they are there: a slow tokenizer's vocabulary
# (vocab.txt, any *.model), Mistral's tekken.json, the versioned tokenizer.X.json that tokenizer_config.json's
# fast_tokenizer_files names, and the named chat templates (additional_chat_templates/*.jinja; default.jinja is the
# template when chat_template.jinja is absent).
TOKENIZER_PATTERNS = ("vocab.txt", "tekken.json", "*.model", "tokenizer.*.json", "additional_chat_templates/*.jinja")


def tokenizer_files(folder: Path, every: bool = False) -> dict[str, Path]:
    """Every file of `folder` its tokenizer may read, by name relative to the folder (`every`: each such name
    there, a broken link or a folder too)."""
    paths = [folder / name for name in TOKENIZER_FILES]
    paths += [path for pattern in TOKENIZER_PATTERNS for path in sorted(folder.glob(pattern))]
    return {path.relative_to(folder).as_posix(): path for path in paths
            if path.is_file() or every and (path.is_symlink() or path.exists())}


def tokenizer_digest(folder: Path) -> str:
    """The digest of every file the tokenizer reads (a folder holding only TOKENIZER_FILES digests as before)."""
    return hash_json({name: file_sha256(path) for name, path in tokenizer_files(folder).items()})


# How rmjax reads a checkpoint into a model (config.json's absent fields, GGUF conversion): part of every file
# fingerprint, so a result computed under another reading is not reused as this one's, and of the converted-GGUF
# cache key (rmjax.loading.gguf_file.cached_hf_folder), so one number says both. 2: transformers' class
# defaults, exact GELU, Gemma 3 GGUF rope scaling and 27B query scale. 3: Gemma 2 GGUF 27B query scale. 4: what a
# folder says twice, read as transformers reads it (rope_scaling, a top-level original length, model.safetensors).
# 5: a Gemma 1 GGUF's rope.freq_base (it was always 1e4). 6: the reward head reads past trailing pad ids, as
# transformers does (nn.read_index: a pad = eos RM's turn that ends in eos was read at the eos). 7: a Gemma pad id
# as transformers' classifiers read it: absent, its class default 0 (it was none); a multimodal Gemma 3's from its
# text_config (the top level's was taken first). 8: a multimodal Gemma 3's LM logits uncapped, as transformers'
# Gemma3ForConditionalGeneration leaves them (text_config's final_logit_softcapping was applied).
READING = 8


def folder_fingerprint(folder: Path) -> dict:
    """Fingerprint of an HF checkpoint folder (config.json, index, safetensors, tokenizer files)."""
    from rmjax.loading.safetensors_io import checkpoint_files

    parts = {name: file_sha256(folder / name) for name in ("config.json", "model.safetensors.index.json")
             if (folder / name).is_file()}
    shards = checkpoint_files(folder)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(shards), os.cpu_count() or 1))) as pool:
        parts |= dict(zip((path.name for path in shards), pool.map(content_digest, shards), strict=True))
    return {"weights": hash_json(parts), "tokenizer": tokenizer_digest(folder), "reading": READING}


def gguf_fingerprint(path: Path) -> dict:
    digest = content_digest(path)
    return {"weights": digest, "tokenizer": digest, "reading": READING}  # the tokenizer and template: in the GGUF


def derived(fingerprint: dict, **change) -> dict:
    """The fingerprint of a model made from another (a new or given score head)."""
    return {**fingerprint, "weights": hash_json([fingerprint["weights"], change])}


def array_digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(array)).tobytes()).hexdigest()[:24]


def model_fingerprint(model) -> dict:
    """The loaded model's fingerprint, with the --system_prompt its tokenizer renders conversations with (as
    `rmjax.loading.fingerprint(spec, system_prompt)` gives before loading)."""
    from rmjax.text.chat import system_prompt_of

    fp = _content_fingerprint(model)
    system = system_prompt_of(model.tokenizer)
    return fp if system is None else fp | {"system_prompt": system}


def _content_fingerprint(model) -> dict:
    """The loaded model's content fingerprint; for a model built in memory, or whose params or tokenizer were
    replaced since it was loaded, a digest of its parameters and tokenizer (each part recomputed only
    when it was replaced)."""
    fp, of = model.fingerprint or {}, model.fingerprint_of or (None, None)
    if fp and of == (id(model.params), id(model.tokenizer)):
        return fp
    from rmjax import nn
    from rmjax.parallel.distributed import to_host

    weights = fp.get("weights") if of[0] == id(model.params) else None
    if weights is None:
        digests = {k: array_digest(to_host(v)) for k, v in sorted(nn.flat(model.params).items())}
        config = repr(model.config)  # the output column (a run option) is part of each job's identity
        weights = hash_json([digests, config])
    tokenizer = fp.get("tokenizer") if of[1] == id(model.tokenizer) else None
    tok = model.tokenizer
    if tokenizer is None and tok is not None:
        tokenizer = hash_json([type(tok).__name__, sorted(tok.get_vocab().items()), getattr(tok, "chat_template", None),
                               list(tok.all_special_tokens)])
    kept = {k: v for k, v in fp.items() if k not in ("weights", "tokenizer", "system_prompt")}  # the reading
    return model.stamp({**kept, "weights": weights, "tokenizer": tokenizer}).fingerprint
