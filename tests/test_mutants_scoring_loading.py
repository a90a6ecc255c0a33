"""Tests that kill the mutants the mutation pass over rmjax/scoring (prefix, forked, logprobs, judge, prior,
memory, calls, finite) and rmjax/loading (gguf_reader, gguf_tokenizer, gguf_file, identity, reward_head,
safetensors_io, weights) found surviving: each names the mutant it kills and compares against an independent
reference (transformers, numpy, a brute-force count, a hand computation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rmjax.scoring.prefix import prefill_prefix, score_responses
from rmjax.scoring.prior import first_token_log_probs
from tests import tolerance


def test_the_sweeps_summed_log_probs_count_each_responses_first_token(tied):
    """score_responses(first=…) on equal-length responses (prefix._score_batch with log_probs): each response's
    summed log-probability under the RM's own tied LM head, against transformers' causal LM on prefix + response.
    Kills `first[responses[:, 0]] + later.sum(axis=1)` -> `later.sum(axis=1)` (the first token's term dropped)
    and a read of `later` one position off."""
    hf, lm, rm = tied
    prefix = [1, 5, 9, 13, 200, 7]
    suffix = np.asarray([2, 11], np.int32)
    responses = np.random.default_rng(0).integers(3, 49152, size=(5, 3)).astype(np.int32)
    cache = prefill_prefix(rm, prefix)
    rewards, summed = score_responses(rm, cache, suffix, responses, batch_size=4,
                                      first=first_token_log_probs(rm, prefix))
    assert rewards.shape == summed.shape == (5,)
    for row, got in zip(responses, summed, strict=True):
        ids = [*prefix, *row.tolist()]
        with torch.no_grad():
            ref = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0].double(), -1).numpy()
        want = ref[np.arange(len(prefix) - 1, len(ids) - 1), row].sum()
        # a sum of 3 log-probs, each within the float32 bound of the whole conversation
        atol = 3 * tolerance.logprobs_atol(lm.params, lm.config, np.asarray([ids], np.int32))
        np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def test_plain_whole_turns_are_read_at_their_last_token_not_at_the_end_of_turn(tmp_path):
    """score_responses(lengths=…) with no suffix (a plain, template-less conversation): turn_rows appends the end
    of turn, which only the log-probs read; the reward is read at the response's last token, as transformers
    reads prefix + response. The end of turn here is not the pad id (with pad = end, the pad rule hid it).
    Kills turn_rows' `read_position(rows[i, : length + tail], …)` -> `rows[i, : length + len(after)]`."""
    from rmjax.loading import load
    from rmjax.search import gcg as gcg_lib
    from tests import tiny

    hf, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm", seed=4)
    model = load(str(folder))
    target = gcg_lib.make_target(model, "What is the greatest thing ever?", "plain")
    prefix = list(target.prefix)
    assert target.suffix == () and 2 not in prefix
    end = 198  # not the pad id (2)
    responses = np.asarray([[30200, 8549, 5738], [5738, 771, 30200], [8549, 8549, 771]], np.int32)
    lengths = np.asarray([3, 2, 1])
    got = score_responses(model, target.cache, target.suffix_ids, responses, 4, lengths=lengths, end=end)
    with torch.no_grad():
        want = [float(hf(input_ids=torch.tensor([prefix + r[:n]])).logits[0, 0])
                for r, n in zip(responses.tolist(), lengths, strict=True)]
        at_end = [float(hf(input_ids=torch.tensor([prefix + r[:n] + [end]])).logits[0, 0])
                  for r, n in zip(responses.tolist(), lengths, strict=True)]
    atol = tolerance.any_rewards_atol(model.params, model.config, 64)
    assert np.abs(np.subtract(at_end, want)).min() > 10 * atol  # the case is live: the end of turn reads otherwise
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def test_largest_fitting_is_the_brute_force_largest_multiple_that_fits():
    """memory.largest_fitting (the value a refusal offers) against a scan of every multiple, for every threshold
    of a monotone `fits`. Kills `lo * multiple or None` -> `hi * multiple or None` and off-by-ones in the bisection."""
    from rmjax.scoring.memory import largest_fitting

    for multiple in (1, 2, 3, 8):
        for upto in range(0, 40):
            for threshold in range(-1, 45):
                fits = lambda b, t=threshold: b <= t  # noqa: E731
                want = max((m for m in range(multiple, max(upto, multiple) + 1, multiple) if fits(m)), default=None)
                assert largest_fitting(fits, upto, multiple) == want, (multiple, upto, threshold)


def test_host_memory_is_the_lower_of_the_ram_and_the_containers_limit(monkeypatch):
    """memory.host_memory_bytes: the cgroup limit where it is below the physical RAM, else the RAM ('max': no
    limit). Kills `min(physical, limit)` -> `max(...)` (a container's job planned against the machine's RAM)."""
    from rmjax.scoring import memory

    ram = 64 * 2**30
    monkeypatch.setattr(memory.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": ram // 4096}[name])
    for limit, want in (("8589934592", 8 * 2**30), (str(128 * 2**30), ram), ("max", ram)):

        class Limit:
            def __init__(self, path):
                self.path = path

            def read_text(self, limit=limit):
                if self.path == "/sys/fs/cgroup/memory.max":
                    return limit + "\n"
                raise OSError("absent")

        monkeypatch.setattr(memory, "Path", Limit)
        assert memory.host_memory_bytes() == want, limit


def test_nonfinite_parameters_name_each_weights_count_and_its_rows_or_layers(monkeypatch):
    """finite.nonfinite_parameters (the diagnosis a NaN refusal prints) on hand-placed NaN/Inf: the count per
    weight, and the leading index (layer of a stacked weight, row of a table) of each. Kills the row reduction over
    the wrong axes (`range(1, ndim)` -> `range(0, ndim - 1)`)."""
    import jax.numpy as jnp

    from rmjax.scoring import finite

    q = np.zeros((3, 4, 5), np.float32)
    q[1, 0, 2] = q[2, 3, 4] = np.nan
    embed = np.zeros((6, 4), np.float32)
    embed[5, 0] = np.inf
    kernel = np.zeros((4, 1), np.float32)
    kernel[2, 0] = np.nan
    scale = np.zeros(4, np.float32)
    scale[3] = -np.inf
    params = {"layers.q": q, "embed.embedding": embed, "score.kernel": kernel, "final_norm.scale": scale,
              "layers.k": np.zeros((3, 4, 5), np.float32)}
    monkeypatch.setattr(finite.nn, "flat", lambda p: {k: jnp.asarray(v) for k, v in p.items()})
    assert finite.nonfinite_parameters(params) == [
        "embed.embedding (1 value, row 5)", "final_norm.scale (1 value)", "layers.q (2 values, layers 1, 2)",
        "score.kernel (1 value, row 2)"]


def test_the_nonfinite_record_counts_values_rows_and_the_merge_keeps_a_refusal():
    """finite.check's record with --allow_nonfinite (what .meta.json promises): NaN/Inf values counted, rows
    counted once however many columns they spoil, the first three named in order; finite.merge of parts sums them
    and is `allowed` only where every part was. Kills `len(np.unique(r))` -> `len(r)` and merge's all -> any."""
    from rmjax.scoring import finite

    values = np.zeros((5, 2))
    values[0, 0], values[0, 1], values[3, 1] = np.nan, np.inf, -np.inf
    record = finite.check(values, what="scores", row=lambda i: f"token {i}", columns=["a", "b"], allow=True)
    assert record == {"values": 3, "rows": 2, "first": ["token 0 for 'a'", "token 0 for 'b'", "token 3 for 'b'"],
                      "allowed": True}
    assert finite.check(np.zeros((3, 2)), what="s", row=str, columns=["a", "b"], allow=True) is None
    refused = dict(record, allowed=False, first=["x"])
    assert finite.merge([record, None, refused]) == {"values": 6, "rows": 4, "first": record["first"],
                                                      "allowed": False}
    assert finite.merge([None, None]) is None


def test_the_yardstick_is_the_sample_sd_of_the_finite_values_and_counts_all_it_scored():
    """finite.yardstick with --allow_nonfinite: mean and SD (ddof 1, statistics.stdev) of the finite values, the
    values it was given counted (NaN included) and the NaN recorded. Kills ddof 1 -> 0 and len(values) ->
    len(kept)."""
    import statistics

    from rmjax.scoring import finite

    values = [1.0, 2.0, 4.0, np.nan, 8.0]
    scale = finite.yardstick(np.asarray(values), what="r", row=str, allow=True, fix="f")
    kept = [1.0, 2.0, 4.0, 8.0]
    assert scale[0] == statistics.fmean(kept)
    np.testing.assert_allclose(scale[1], statistics.stdev(kept), rtol=1e-15)
    assert scale.values == 5 and scale.nonfinite["values"] == 1 and scale.nonfinite["rows"] == 1


def _safetensors(path, tensors: dict) -> None:
    """A safetensors file written by hand (the format: 8-byte header length, JSON header, raw little-endian data)."""
    import json
    import struct

    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_a_weights_fingerprint_sees_an_edit_anywhere_and_a_copy_keeps_it(tmp_path, monkeypatch):
    """identity.folder_fingerprint: one value changed in the middle of a tensor (an embedding row edited in place,
    once the blind spot of a 4 KiB sample at each end) changes the fingerprint, as an edit at either end or bytes
    appended past the data do; a copy of the folder elsewhere has the same one (content only). Each against
    hashlib's SHA-256 of the file."""
    import hashlib
    import shutil

    from rmjax.loading.identity import folder_fingerprint, hash_json

    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path / "cache"))
    base = np.arange(8192, dtype=np.float32)
    fingerprints = {}
    for case, edit in (("base", None), ("last", 8191), ("middle", 4096), ("first", 0)):
        t = base.copy()
        if edit is not None:
            t[edit] += 1.0
        (tmp_path / case).mkdir()
        _safetensors(tmp_path / case / "model.safetensors", {"a": np.ones((3, 2), np.float32), "w": t})
        (tmp_path / case / "config.json").write_text("{}")
        fingerprints[case] = folder_fingerprint(tmp_path / case)["weights"]
        data = (tmp_path / case / "model.safetensors").read_bytes()
        want = {"config.json": hashlib.sha256(b"{}").hexdigest()[:24],
                "model.safetensors": hashlib.sha256(data).hexdigest()[:24]}
        assert fingerprints[case] == hash_json(want)
    assert len(set(fingerprints.values())) == 4
    grown = tmp_path / "grown"
    shutil.copytree(tmp_path / "base", grown)
    assert folder_fingerprint(grown)["weights"] == fingerprints["base"]
    with open(grown / "model.safetensors", "ab") as f:
        f.write(b"\0" * 8)
    assert folder_fingerprint(grown)["weights"] != fingerprints["base"]


def test_a_remembered_digest_is_reused_until_the_file_is_written_even_with_its_mtime_put_back(tmp_path, monkeypatch):
    """identity.content_digest: a file changed less than SETTLED_NS ago is hashed at every call (a write through a
    memory map may not have moved its times yet); a settled file's digest is kept under the cache folder, and a new
    process reads it instead of hashing; a write in place with the same size, its mtime set back as `cp -p` or
    `touch -r` would, is hashed again (the key holds ctime, which no tool sets back). Kills the settling check
    dropped, ctime dropped from the key, the record read without its key checked, and an old version's record
    left beside the new one's."""
    import hashlib
    import json
    import os
    import time

    from rmjax.loading import identity

    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path / "cache"))
    digests = tmp_path / "cache" / "digests"
    path = tmp_path / "w.gguf"
    path.write_bytes(bytes(range(256)) * 4096)
    hashed, real_sha256 = [], identity.file_sha256
    monkeypatch.setattr(identity, "file_sha256", lambda p: hashed.append(p) or real_sha256(p))
    first = identity.content_digest(path)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()[:24]
    assert identity.content_digest(path) == first and len(hashed) == 2 and not digests.exists()  # just written
    later = identity._now_ns() + 10 * identity.SETTLED_NS  # every file here settled
    monkeypatch.setattr(identity, "_now_ns", lambda: later)
    assert identity.content_digest(path) == first and len(hashed) == 3 and len(list(digests.iterdir())) == 1
    monkeypatch.setattr(identity, "_DIGESTS", {})  # a new process: the record is read, nothing hashed
    assert identity.content_digest(path) == first and len(hashed) == 3
    st = path.stat()
    time.sleep(0.05)  # past a coarse ctime's tick (a jiffy, 4 ms, on kernels before 6.13)
    with open(path, "r+b") as f:  # one byte in the middle, the size and mtime as they were
        f.seek(500_000)
        f.write(b"\xff")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    assert identity.content_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()[:24] != first
    assert len(list(digests.iterdir())) == 1  # the new version's record replaced the old one's
    # a record whose key is another file's (a hash collision of keys, a record edited by hand) is not trusted
    monkeypatch.setattr(identity, "_DIGESTS", {})
    (record,) = [r for r in digests.iterdir() if identity._stat_key(path)[0] in r.read_text()]
    record.write_text(json.dumps({"key": "another", "sha256": first}))
    assert identity.content_digest(path) != first


def test_a_file_written_while_it_is_hashed_is_hashed_again_and_one_never_still_is_refused(tmp_path, monkeypatch):
    """identity.content_digest: the file's key is taken again after each hash; a file written during the hash is
    hashed again (the digest of what it holds after), one written during three hashes is refused in one line.
    Kills the key compared before and after dropped."""
    import hashlib

    from rmjax.errors import CheckpointError
    from rmjax.loading import identity

    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"a" * 1000)
    real_sha256, writes = identity.file_sha256, []

    def written_during(p, times: int):
        digest = real_sha256(p)
        if len(writes) < times:
            writes.append(1)
            path.write_bytes(bytes([97 + len(writes)]) * (1000 + len(writes)))  # its size too: coarse ctimes
        return digest

    monkeypatch.setattr(identity, "file_sha256", lambda p: written_during(p, 1))
    assert identity.content_digest(path) == hashlib.sha256(b"b" * 1001).hexdigest()[:24]
    writes.clear()
    path.write_bytes(b"a" * 1000)
    monkeypatch.setattr(identity, "file_sha256", lambda p: written_during(p, 3))
    with pytest.raises(CheckpointError, match="changed while it was read"):
        identity.content_digest(path)


def test_a_gguf_fingerprint_is_of_the_whole_file(tmp_path, monkeypatch):
    """identity.gguf_fingerprint: a byte changed anywhere in the file (here between what the former 64 sampled
    blocks read) changes it. Against hashlib's SHA-256 of the file."""
    import hashlib

    from rmjax.loading.identity import gguf_fingerprint

    monkeypatch.setenv("RMJAX_CACHE_DIR", str(tmp_path / "cache"))
    size = 4 * 2**20
    found = set()
    for at in (None, 3, 2**21 + 12345, size - 3):
        path = tmp_path / f"f{at}.gguf"
        with open(path, "wb") as f:
            f.truncate(size)
            if at is not None:
                f.seek(at)
                f.write(b"\1")
        fp = gguf_fingerprint(path)
        assert fp["weights"] == fp["tokenizer"] == hashlib.sha256(path.read_bytes()).hexdigest()[:24]
        found.add(fp["weights"])
    assert len(found) == 4


def test_the_tokenizer_digest_reads_the_named_chat_templates_and_slow_vocabularies(tmp_path):
    """identity.tokenizer_digest: files transformers' tokenizer loading reads beyond the usual names (a named chat
    template, a slow tokenizer's vocab.txt) are part of it; another file in the folder is not. Kills
    TOKENIZER_PATTERNS dropped from tokenizer_files."""
    from rmjax.loading.identity import tokenizer_digest

    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "notes.md").write_text("x")
    base = tokenizer_digest(tmp_path)
    for name, text in (("additional_chat_templates/tool_use.jinja", "{{ message }}"), ("vocab.txt", "a\nc\n"),
                       ("notes.md", "y")):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(text)
        assert (tokenizer_digest(tmp_path) != base) == (name != "notes.md"), name
        (tmp_path / name).write_text(before)
    assert tokenizer_digest(tmp_path) == base


def test_models_with_equal_weights_but_another_config_share_no_layers(rm_folder):
    """forked.shared_layers: the same weights under another config (a norm epsilon 100x larger: every layer computes
    other hidden states) share nothing a forked forward can use, and the forked forward refuses a shared span;
    the same model twice shares all layers but the last. Kills the config comparison dropped."""
    import dataclasses

    import pytest

    from rmjax.scoring.forked import forked_token_rewards, shared_layers

    a = load_model(rm_folder)
    b = dataclasses.replace(a, config=a.config.replace(norm_eps=a.config.norm_eps * 100))
    assert shared_layers(a, a) == a.config.num_layers - 1
    assert shared_layers(a, b) == 0
    with pytest.raises(ValueError, match="do not share their first 1 layers"):
        forked_token_rewards(a, b, None, None, np.arange(3), shared=1)


def load_model(folder):
    from rmjax.loading import load

    return load(str(folder))


def test_a_safetensors_tensor_ending_a_few_bytes_past_the_data_is_refused_as_truncated(tmp_path):
    """safetensors_io.read_header: a file cut 4 bytes short (its last tensor ends past the data) is refused naming
    the tensor, before any read; whole, it reads back. Kills the end check loosened (`end > data` ->
    `end > data + 8`)."""
    import pytest

    from rmjax.errors import CheckpointError
    from rmjax.loading.safetensors_io import iter_tensors, read_header

    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    path = tmp_path / "model.safetensors"
    _safetensors(path, {"w": w})
    np.testing.assert_array_equal(dict(iter_tensors(path))["w"](), w)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="tensor 'w' ends at byte 24 of the data but the file holds 20 data"):
        read_header(path)


def test_a_tied_lms_own_head_is_compared_with_the_table_block_by_block_to_the_last_row():
    """weights._require_tied compares lm_head.weight with the embedding table `rows` rows at a time: a difference
    in the last block is found as one in the first. Kills the comparison of the first block alone."""
    import pytest

    from rmjax.errors import CheckpointError
    from rmjax.loading.weights import _require_tied

    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    _require_tied(lambda: table.copy(), lambda: table, "m", rows=3)
    for row in (0, 4, 9):
        head = table.copy()
        head[row, 1] += 1
        with pytest.raises(CheckpointError, match="lm_head.weight differs"):
            _require_tied(lambda h=head: h, lambda: table, "m", rows=3)


def _gguf(path, metadata: list[tuple[str, int, bytes]], tensors: list[tuple[str, list[int], bytes]]) -> None:
    """A GGUF v3 file written by hand from the format: header, metadata entries (key, value type, packed value),
    tensor infos (F32), data aligned to general.alignment (32 here)."""
    import struct

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += string(key) + struct.pack("<I", kind) + value
    offset = 0
    for name, dims, data in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, offset)
        offset += -(-len(data) // 32) * 32
    out += b"\0" * (-len(out) % 32)
    for _, _, data in tensors:
        out += data + b"\0" * (-len(data) % 32)
    path.write_bytes(out)


def test_gguf_keys_and_tensor_names_given_twice_and_a_zero_alignment_are_refused(tmp_path):
    """gguf_reader: a metadata key or a tensor name given twice (which one the model would use is a guess) and
    general.alignment = 0 are refused as unreadable files in one line; the same file without them reads, its
    values as written. Kills each check dropped (`key in metadata`, `name in names`) and `alignment < 1` ->
    `alignment < 0` (a ZeroDivisionError traceback)."""
    import struct

    import pytest

    from rmjax.errors import CheckpointError
    from rmjax.loading.gguf_file import read_gguf

    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    w = np.arange(6, dtype=np.float32)
    path = tmp_path / "ok.gguf"
    _gguf(path, [("a.b", 4, u32(7)), ("general.alignment", 4, u32(32))], [("t", [3, 2], w.tobytes())])
    contents = read_gguf(path)
    assert contents.metadata == {"a.b": 7, "general.alignment": 32}
    np.testing.assert_array_equal(contents.tensors[0].data, w.reshape(2, 3))
    for case, metadata, tensors, says in (
            ("key", [("a.b", 4, u32(7)), ("a.b", 4, u32(8))], [("t", [3, 2], w.tobytes())], "'a.b' appears twice"),
            ("name", [("a.b", 4, u32(7))], [("t", [3, 2], w.tobytes()), ("t", [6], w.tobytes())],
             "tensor 't' appears twice"),
            ("align", [("general.alignment", 4, u32(0))], [("t", [3, 2], w.tobytes())],
             "general.alignment=0 is not a positive integer")):
        _gguf(tmp_path / f"{case}.gguf", metadata, tensors)
        with pytest.raises(CheckpointError, match=says):
            read_gguf(tmp_path / f"{case}.gguf")


def test_samples_drawn_at_another_temperature_carry_the_priors_own_log_probs(tied):
    """prior.sample_responses at temperatures 0.5 and 2 (best-of-N's tempered draws): each token's log-probability
    is the prior's own (transformers' log-softmax on the whole conversation), not the tempered distribution's it
    was drawn from. Kills `take_along_axis(logp, …)` -> `take_along_axis(logits, …)` (equal at temperature 1)."""
    from rmjax.scoring.prior import sample_responses

    hf, lm, _ = tied
    prefix = [1, 5, 9, 13, 200, 7]
    cache, first = prefill_prefix(lm, prefix), first_token_log_probs(lm, prefix)
    banned = np.zeros(lm.config.vocab_size, bool)
    banned[:100] = True
    for temperature in (0.5, 2.0):
        got, lps = sample_responses(lm, cache, first, banned, 3, 3, seed=1, temperature=temperature, batch_size=4)
        assert not banned[got].any()
        for row, row_lp in zip(got, lps, strict=True):
            full = [*prefix, *row.tolist()]
            with torch.no_grad():
                ref = torch.log_softmax(hf(input_ids=torch.tensor([full])).logits[0].double(), -1).numpy()
            want = ref[np.arange(len(prefix) - 1, len(full) - 1), row]
            np.testing.assert_allclose(row_lp, want, rtol=0, atol=tolerance.logprobs_atol(
                lm.params, lm.config, np.asarray([full], np.int32)))


def test_tokens_past_the_banned_lists_vocabulary_are_never_sampled(tied):
    """prior.sample_responses with a banned list shorter than the LM's vocabulary (a tokenizer smaller than the
    embedding table): ids past it are never drawn (they would hold 98% of the mass here). Kills `never =
    np.ones(...)` -> `np.zeros(...)`."""
    from rmjax.scoring.prior import sample_responses

    _, lm, _ = tied
    prefix = [1, 5, 9, 13]
    banned = np.zeros(1000, bool)
    banned[:3] = True
    got, _ = sample_responses(lm, prefill_prefix(lm, prefix), first_token_log_probs(lm, prefix), banned, 16, 3,
                              seed=0, batch_size=16)
    assert got.shape == (16, 3) and got.min() >= 3 and got.max() < 1000


def test_the_next_tokens_log_probs_after_partial_responses_equal_transformers(tied):
    """prior.next_log_probs: the log-probabilities of the token after each partial response [W, d] (d = 0: the
    prompt's own, d = 3), against transformers' log-softmax at the last position of prefix + partial. Kills the
    read at the partial's first position instead of its last (`hidden[:, -1]` -> `hidden[:, 0]`)."""
    from rmjax.parallel.distributed import to_host
    from rmjax.scoring.prior import next_log_probs

    hf, lm, _ = tied
    prefix = [1, 5, 9, 13, 200, 7]
    cache, first = prefill_prefix(lm, prefix), first_token_log_probs(lm, prefix)
    partials = np.asarray([[30200, 8549, 5738], [771, 30200, 42], [5738, 5738, 8549]], np.int32)
    for part in (partials[:, :0], partials):
        got = np.asarray(to_host(next_log_probs(lm, cache, first, part)))
        assert got.shape == (len(part), lm.config.vocab_size)
        for row, lp in zip(part.tolist(), got, strict=True):
            full = [*prefix, *row]
            with torch.no_grad():
                want = torch.log_softmax(hf(input_ids=torch.tensor([full])).logits[0, -1].double(), -1).numpy()
            np.testing.assert_allclose(lp, want, rtol=0, atol=tolerance.logprobs_atol(
                lm.params, lm.config, np.asarray([full], np.int32)))


def test_an_empty_response_has_no_perplexity_even_counting_the_end_of_turn(lm):
    """judge.judge_perplexities with end_of_turn (whole responses): a text with no token has none (NaN, as
    documented), its end of turn not scored as if it were a response; the other texts are scored. Kills
    `[[*r, end] if r else r …]` -> `[[*r, end] …]`."""
    from rmjax.scoring.judge import judge_perplexities

    got = judge_perplexities(lm, "What is the greatest thing ever?", ["", "Love", ""], end_of_turn=True)
    assert np.isnan(got[0]) and np.isnan(got[2]) and np.isfinite(got[1]) and got[1] > 1


def test_the_logprobs_table_equals_transformers_and_leaves_out_ids_past_the_tokenizer(tmp_path):
    """logprobs.write_logprobs on a causal LM whose embedding table is 8 rows past its tokenizer (49,160 against
    49,152), two prompts of different lengths (left padding): each column is transformers' next-token log-softmax
    after that prompt's chat-template prefix, rows only for the tokenizer's ids, and .meta.json counts the 8 left
    out. Kills the padding side, the prompts' order, the ids past the tokenizer kept, and their count dropped."""
    import json
    import shutil

    from rmjax.loading import load
    from rmjax.runs.results import read_scores_csv
    from rmjax.scoring.logprobs import write_logprobs
    from tests import tiny

    hf = tiny.build_hf_model("llama3", vocab_size=49160, pad_token_id=2, bos_token_id=1, eos_token_id=2, seed=5)
    folder = tiny.save_hf_model(hf, tmp_path / "lm")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny.smollm2_tokenizer_folder() / f, folder / f)
    model = load(str(folder))
    prompts = {"long": "What, in one word, is the greatest thing ever made by anyone?", "short": "Best?"}
    out = write_logprobs(model, prompts, tmp_path / "lp.csv")
    table = read_scores_csv(out)
    assert len(model.tokenizer) == 49152 and list(table.token_id) == list(range(49152))
    assert json.loads(out.with_name(out.name + ".meta.json").read_text())["ids_past_the_tokenizer"] == 8
    for name, text in prompts.items():
        rendered = model.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                       add_generation_prompt=True)
        ids = model.tokenizer(rendered, add_special_tokens=False).input_ids
        with torch.no_grad():
            want = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1).numpy()[:49152]
        np.testing.assert_allclose(table[name].to_numpy(), want, rtol=0, atol=tolerance.logprobs_atol(
            model.params, model.config, np.asarray([ids], np.int32)))


def test_the_estimated_prefix_cache_is_the_bytes_a_prefill_holds(rm_folder):
    """memory.estimate's prefix cache against the K and V arrays prefix.prefill_prefix really holds for a
    prefix of 32 positions (one bucket), unsharded: both, every layer. Kills the factor 2 (K and V) dropped."""
    from rmjax.scoring.memory import estimate

    model = load_model(rm_folder)
    cache = prefill_prefix(model, list(range(3, 35)))
    assert cache.k.shape[2] == 32
    held = cache.k.nbytes + cache.v.nbytes
    assert estimate(model.config, "float32", 32, 2, 8).cache_bytes == held


def test_a_batch_over_data_shards_and_a_cache_over_model_shards_are_counted_per_device(rm_folder):
    """memory.estimate per device: a batch of 8 over 4 data shards costs each device what a batch of 2 costs one;
    the prefix cache splits over `model` only where the K/V heads divide (the loader's rule: 2 heads over 2
    shards, halved; over 4, each device holds all of it). Kills `ceil(batch / data_shards)` -> `batch` and the
    cache split over shards that do not divide its heads."""
    from rmjax.scoring.memory import estimate

    cfg = load_model(rm_folder).config
    assert cfg.num_kv_heads == 2
    whole = 2 * cfg.num_layers * 64 * cfg.num_kv_heads * cfg.head_dim * 4  # K and V, float32
    per_device = estimate(cfg, "float32", 64, 3, 8, data_shards=4).batch_bytes
    assert per_device == estimate(cfg, "float32", 64, 3, 2).batch_bytes
    assert estimate(cfg, "float32", 64, 3, 8).cache_bytes == whole
    assert estimate(cfg, "float32", 64, 3, 8, model_shards=2).cache_bytes == whole // 2
    assert estimate(cfg, "float32", 64, 3, 8, model_shards=4).cache_bytes == whole


def test_a_tied_rm_scoring_on_the_cpu_in_bfloat16_copies_its_table_only_where_it_reads_lm_logits(tied):
    """memory.upcast_bytes for an RM whose backbone ties its embeddings (both default RMs): a sweep only gathers
    rows of the table (no float32 copy of it); a call computing LM logits through it (the RM as its own prior)
    copies it too. Counted against the RM's own weights: 4 bytes per value of every weight but the score head
    (kept in float32), the table only in the second case. Kills `not (tie_embeddings and reads_head)` ->
    `not tie_embeddings`."""
    from rmjax import nn
    from rmjax.scoring.memory import upcast_bytes

    _, _, rm = tied
    sizes = {k: int(np.prod(v.shape)) for k, v in nn.flat(rm.params).items()}
    assert rm.config.tie_embeddings and rm.config.is_reward_model and "lm_head.kernel" not in sizes
    matmuls = 4 * sum(n for k, n in sizes.items() if k not in ("score.kernel", "embed.embedding"))
    assert upcast_bytes(rm.config, "bfloat16", 1, "cpu", lm_head=False) == matmuls
    assert upcast_bytes(rm.config, "bfloat16", 1, "cpu", lm_head=True) == matmuls + 4 * sizes["embed.embedding"]
    assert upcast_bytes(rm.config, "float32", 1, "cpu", lm_head=True) == 0


def test_a_sentencepiece_gguf_that_does_not_say_adds_bos(tmp_path):
    """gguf_tokenizer.tokenizer_from_gguf: Gemma 3's GGUF (a sentencepiece vocabulary, tokenizer.ggml.model =
    llama) with its add_bos_token entry removed builds a tokenizer that adds BOS, as llama.cpp and transformers'
    sentencepiece tokenizers do by default. Kills the default flipped (`setdefault("add_bos_token", True)` ->
    `False`); the shipped file sets the entry, so the parity test cannot."""
    import dataclasses

    from rmjax.loading import resolve
    from rmjax.loading.gguf_file import read_gguf
    from rmjax.loading.gguf_tokenizer import tokenizer_from_gguf

    _, path = resolve("gemma-3-270m")
    contents = read_gguf(path)
    assert contents.metadata["tokenizer.ggml.model"] == "llama" and contents.metadata["tokenizer.ggml.add_bos_token"]
    bos = contents.metadata["tokenizer.ggml.bos_token_id"]
    metadata = {k: v for k, v in contents.metadata.items() if k != "tokenizer.ggml.add_bos_token"}
    tokenizer = tokenizer_from_gguf(dataclasses.replace(contents, metadata=metadata), "gemma3_text", path)
    ids = tokenizer("Hello there").input_ids
    assert ids[0] == bos and bos not in ids[1:], ids


def test_the_diagnosis_names_the_first_position_of_a_nan_embedding_row(rm_folder):
    """finite.first_nonfinite_stage on a model whose embedding row 17 is NaN, token 17 at positions 2 and 4 of
    the sequence: the message names the token and its first position (2); one whose layer 1 is NaN, that layer
    (0-based). Kills `bad[0]` -> `bad[-1]` and the layer named 1-based."""
    import dataclasses

    import jax.numpy as jnp

    from rmjax import nn
    from rmjax.scoring import finite

    model = load_model(rm_folder)
    flat = nn.flat(model.params)
    flat["embed.embedding"] = jnp.asarray(flat["embed.embedding"]).at[17].set(jnp.nan)
    broken = dataclasses.replace(model, params=nn.from_flat(model.config, flat))
    text = model.tokenizer.decode([17])
    assert finite.first_nonfinite_stage(broken, [5, 9, 17, 8, 17, 3]) == (
        f"the embedding row of token 17 ({text!r}) at position 2")
    # a NaN in layer 1's MLP (0-based): the residual after layer 1 is the first non-finite, at every position
    flat = nn.flat(model.params)
    flat["layers.down"] = jnp.asarray(flat["layers.down"]).at[1].set(jnp.nan)
    broken = dataclasses.replace(model, params=nn.from_flat(model.config, flat))
    layers = model.config.num_layers
    assert finite.first_nonfinite_stage(broken, [5, 9, 8]) == (
        f"the output of layer 1 (0-based, of {layers}) at positions 0, 1, 2")


def test_gguf_arrays_nested_past_eight_levels_are_refused(tmp_path):
    """gguf_reader: arrays of arrays read to 8 levels (gguf writes none deeper than 1); a ninth level is refused
    as an unreadable file (a file of thousands of levels would end in a RecursionError traceback). Kills the
    depth limit dropped."""
    import struct

    import pytest

    from rmjax.errors import CheckpointError
    from rmjax.loading.gguf_file import read_gguf

    def nested(levels: int) -> bytes:  # `levels` arrays, each holding the next, the innermost two u32s
        value = struct.pack("<IQ", 4, 2) + struct.pack("<II", 5, 6)
        for _ in range(levels - 1):
            value = struct.pack("<IQ", 9, 1) + value
        return value

    _gguf(tmp_path / "eight.gguf", [("a", 9, nested(8))], [])
    want = [5, 6]
    for _ in range(7):
        want = [want]
    assert read_gguf(tmp_path / "eight.gguf").metadata == {"a": want}
    _gguf(tmp_path / "nine.gguf", [("a", 9, nested(9))], [])
    with pytest.raises(CheckpointError, match="unknown metadata value type 9"):
        read_gguf(tmp_path / "nine.gguf")


def test_a_gguf_reads_as_the_transformers_config_of_the_same_model(tmp_path):
    """gguf_file.hf_config_from_gguf on GGUF files written with gguf's writer: a Gemma 3 file (14 layers, 8 heads
    over 4 K/V heads) gives transformers' Gemma3TextConfig's local/global layer pattern and K/V heads, and a Llama
    file that stores no norm epsilon reads as LlamaConfig's default, as transformers' GGUF import does. Kills the
    window pattern 6 -> 5, the K/V head count ignored, and the epsilon default 1e-6 -> 1e-5."""
    import gguf
    import transformers

    from rmjax.hf_config import config_from_hf
    from rmjax.loading.gguf_file import hf_config_from_gguf, read_gguf
    from tests.test_loading_faults import _gemma3_gguf, _written

    path = _gemma3_gguf(tmp_path / "g3.gguf", 64, 8, 4, 16, 14, False)
    got = config_from_hf(hf_config_from_gguf(read_gguf(path), path))
    hf = transformers.Gemma3TextConfig(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=14,
                                       num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                                       sliding_window=1024)
    assert got.local_layers == tuple(t == "sliding_attention" for t in hf.layer_types)
    assert got.num_kv_heads == hf.num_key_value_heads == 4

    w = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_tensor("token_embd.weight", np.zeros((16, 64), np.float32))
    _written(w)
    raw = hf_config_from_gguf(read_gguf(tmp_path / "llama.gguf"), tmp_path / "llama.gguf")
    # (read as float32, as GGUF stores it: the default too)
    assert np.float32(raw["rms_norm_eps"]) == np.float32(transformers.LlamaConfig().rms_norm_eps)


def test_a_reward_model_made_from_an_lm_has_its_own_fingerprint_per_head(lm):
    """reward_head.reward_model_from_lm + identity.derived: the RM of a new head (seed 0, seed 1) and of a given
    head each have a fingerprint of their own, none the LM's (a result of one head was reused for another), the
    same again for the same head; the tokenizer and reading stay the LM's. Kills `derived` returning the
    fingerprint unchanged and the given head's digest replaced by a constant."""
    from rmjax.loading.reward_head import reward_model_from_lm

    def fingerprint(**head):
        return reward_model_from_lm(lm, **head).fingerprint

    head = np.linspace(-1, 1, lm.config.hidden_size, dtype=np.float32)[:, None]
    prints = [fingerprint(seed=0), fingerprint(seed=1), fingerprint(score=head), fingerprint(score=-head)]
    assert len({p["weights"] for p in prints} | {lm.fingerprint["weights"]}) == 5
    assert fingerprint(seed=1) == prints[1] and fingerprint(score=head.copy()) == prints[2]
    assert all(p["tokenizer"] == lm.fingerprint["tokenizer"] and p["reading"] == lm.fingerprint["reading"]
               for p in prints)


def test_an_in_memory_models_fingerprint_holds_its_config(rm_folder):
    """identity.model_fingerprint of a model whose params were replaced (digested, not the checkpoint's): the
    same weights under another config (a norm epsilon 100x larger: other rewards) fingerprint apart; the same
    weights and config again alike; a replaced tokenizer is digested anew. Kills the config left out of the digest
    and the stamp trusted when only the params are the loaded ones."""
    import copy
    import dataclasses

    import jax

    from rmjax.loading.identity import model_fingerprint

    model = load_model(rm_folder)

    def replaced(**change):
        params = jax.tree.map(lambda a: a.copy(), model.params)  # other arrays: the loaded fingerprint is not theirs
        return dataclasses.replace(model, params=params, **change)

    same, again = model_fingerprint(replaced()), model_fingerprint(replaced())
    other = model_fingerprint(replaced(config=model.config.replace(norm_eps=model.config.norm_eps * 100)))
    assert same == again and same["weights"] != model.fingerprint["weights"]
    assert other["weights"] != same["weights"]
    # a replaced tokenizer (another chat template) is digested anew; the loaded weights keep their fingerprint
    tokenizer = copy.deepcopy(model.tokenizer)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    retok = model_fingerprint(dataclasses.replace(model, tokenizer=tokenizer))
    assert retok["weights"] == model.fingerprint["weights"] and retok["tokenizer"] != model.fingerprint["tokenizer"]


def test_a_new_score_head_is_drawn_as_transformers_initializes_score():
    """reward_head.init_score_head: normal(0, initializer_range) with transformers' default range, 0.02
    (LlamaConfig().initializer_range): over 40,000 values the sample SD is within 2% of it (its standard error is
    0.35%) and the mean within 5 standard errors of 0; seeded. Kills the SD scaled."""
    import transformers

    from rmjax.loading.reward_head import init_score_head

    head = init_score_head(40_000, seed=3)
    std = transformers.LlamaConfig().initializer_range
    assert head.shape == (40_000, 1) and head.dtype == np.float32
    assert abs(head.std() / std - 1) < 0.02 and abs(head.mean()) < 5 * std / 200
    np.testing.assert_array_equal(head, init_score_head(40_000, seed=3))
    assert not np.array_equal(head, init_score_head(40_000, seed=4))


def test_a_layer_just_past_the_configs_count_is_refused_as_beyond_it(tmp_path):
    """weights.assemble: a checkpoint with a tensor of layer L in a config of L layers (0 … L − 1) is refused
    naming it as beyond num_hidden_layers (the fault test's layer 9 is far past). Kills `i >= num_layers` ->
    `i > num_layers` (then refused only as a layer 'missing', the wrong fault)."""
    import re

    import pytest

    from rmjax.errors import CheckpointError
    from rmjax.loading.hf import load_hf_model_folder
    from tests.test_loading_faults import _edited_checkpoint

    layers = []

    def one_past(tensors):
        count = 1 + max(int(m.group(1)) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k)))
        layers.append(count)
        tensors[f"model.layers.{count}.input_layernorm.weight"] = tensors["model.layers.0.input_layernorm.weight"]

    _, folder = _edited_checkpoint(tmp_path, "llama3", one_past)
    with pytest.raises(CheckpointError, match=rf"'model\.layers\.{layers[0]}\.input_layernorm\.weight' beyond "
                                              rf"num_hidden_layers={layers[0]}"):
        load_hf_model_folder(folder, require_tokenizer=False)


def test_skipped_swaps_count_only_allowed_tokens_nan_entries():
    """finite.gradient_swaps_skipped with allow: of a gradient's NaN/Inf entries, those of allowed tokens (not
    banned, within the banned list's width) are counted, as .meta.json records them; without allow it refuses
    naming the first. Kills the banned tokens' entries counted too."""
    import jax.numpy as jnp
    import pytest

    from rmjax.errors import NonFiniteError
    from rmjax.scoring import finite

    grad = np.zeros((3, 6), np.float32)
    grad[0, 1] = grad[2, 4] = np.nan  # allowed tokens 1 and 4
    grad[1, 2] = grad[2, 2] = np.inf  # banned token 2
    banned = np.asarray([True, False, True, False, False], bool)  # 5 wide: token 5 is past it
    grad[0, 5] = np.nan
    assert finite.gradient_swaps_skipped(jnp.asarray(grad), banned, allow=True, what="g") == 2
    with pytest.raises(NonFiniteError, match=r"g is NaN/Inf at 5 \(position, token\) entries \(first: position 0, "
                                             r"token 1\)"):
        finite.gradient_swaps_skipped(jnp.asarray(grad), banned, allow=False, what="g")


def test_final_hidden_states_after_a_cached_prompt_are_read_at_each_rows_last_real_token(tmp_path):
    """calls.last_hidden_after (head-only training's features) on rows of 3, 2 and 1 tokens right-padded with id 0
    (not the pad id, so only the mask says it is padding): each row's feature times the score head is
    transformers' reward of prefix + that row's tokens; calls.last_hidden of whole rows, one ending in the pad id,
    reads before it as transformers does. Kills the mask dropped (the padding read as tokens) and whole rows read
    at their last token (`nn.at_last`) instead of the head's read point."""
    from rmjax import nn
    from rmjax.loading import load
    from rmjax.parallel.distributed import to_host
    from rmjax.scoring import calls
    from tests import tiny

    hf, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "rm", seed=6)
    model = load(str(folder))
    prefix = [1, 5, 9, 13, 200, 7]
    rows = [[30200, 8549, 5738], [771, 42], [5738]]
    ids = np.asarray([r + [0] * (3 - len(r)) for r in rows], np.int32)
    mask = np.asarray([[j < len(r) for j in range(3)] for r in rows])
    hidden = np.asarray(to_host(calls.last_hidden_after(model, prefill_prefix(model, prefix), ids, mask)))
    got = hidden @ np.asarray(nn.flat(model.params)["score.kernel"])[:, 0]
    with torch.no_grad():
        want = [float(hf(input_ids=torch.tensor([prefix + r])).logits[0, 0]) for r in rows]
    atol = tolerance.any_rewards_atol(model.params, model.config, 16)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    # whole rows (calls.last_hidden), one ending in the pad id (2, = eos): read before it, as transformers reads
    whole = [prefix + [30200, 8549], prefix + [771, 2]]
    hidden = np.asarray(to_host(calls.last_hidden(model, np.asarray(whole, np.int32), np.ones((2, 8), bool))))
    with torch.no_grad():
        want = [float(hf(input_ids=torch.tensor([r])).logits[0, 0]) for r in whole]
    np.testing.assert_allclose(hidden @ np.asarray(nn.flat(model.params)["score.kernel"])[:, 0], want, rtol=0,
                               atol=atol)
