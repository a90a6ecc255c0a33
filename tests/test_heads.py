"""Custom heads (ArmoRM, QRM, URM) against their published PyTorch head logic, re-implemented here.

Each tiny checkpoint is a random transformers backbone plus head tensors under the published key
names, saved as a safetensors folder with the published architecture name; the reference runs
the backbone in transformers and the head as the modeling files do (gate token found by a
Python loop, eval-mode BatchNorm, softmax / temperature * logit_scale, transform matrix).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file
from torch import nn

from rmjax import heads
from rmjax.errors import CheckpointError, UsageError
from rmjax.loading import load
from rmjax.loading.for_job import check_output_column
from rmjax.loading.hf import load_hf_model_folder
from rmjax.parallel.sharding import make_mesh
from rmjax.scoring.prefix import extend_prefix, prefill_prefix, score_variants
from rmjax.scoring.texts import TextScorer
from rmjax.search import gcg
from rmjax.search.beam import BeamConfig, beam_search
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.sides import RewardSide, SideSpec
from rmjax.search.sweep import sweep
from rmjax.text import chat
from tests import jitted as M
from tests import tiny, tolerance

LLAMA_VOCAB = 128_256  # the Llama 3 gate pattern uses ids up to 128009
KINDS = {
    # name: (tiny backbone, architecture, extra config.json keys)
    "armo": ("llama3", "LlamaForRewardModelWithGating",
             dict(num_objectives=6, gating_hidden_dim=24, gating_n_hidden=3, gating_temperature=7)),
    "qrm": ("llama3.1", "LlamaForRewardModelWithGating31",
            dict(num_objectives=5, num_quantiles=4, gating_hidden_dim=24, gating_n_hidden=3)),
    "qrm-gemma2": ("gemma2", "Gemma2ForRewardModelWithGating",
                   dict(num_objectives=5, num_quantiles=3, gating_hidden_dim=24, gating_n_hidden=3)),
    "urm": ("llama3.1", "LlamaForSequenceClassificationWithNormal_Weights", dict(num_labels=10)),
}


def _gate_layers(kind: str, hidden: int, extra: dict) -> nn.ModuleList:
    """The published GatingNetwork's module list (ArmoRM: Linear+ReLU; QRM: Linear, ReLU, BN[, Dropout])."""
    layers, width = [], hidden
    for _ in range(extra["gating_n_hidden"]):
        if kind == "armo":
            layers += [nn.Linear(width, extra["gating_hidden_dim"])]
        else:
            layers += [nn.Linear(width, extra["gating_hidden_dim"], bias=False), nn.ReLU(),
                       nn.BatchNorm1d(extra["gating_hidden_dim"])]
            if kind == "qrm-gemma2":
                layers.append(nn.Dropout(0.0))
        width = extra["gating_hidden_dim"]
    layers.append(nn.Linear(width, extra["num_objectives"]))
    return nn.ModuleList(layers)


class Reference(nn.Module):
    """Backbone + the head as the published modeling code computes it (float32, eval mode)."""

    def __init__(self, kind: str, backbone_name: str, extra: dict, vocab: int, seed: int = 0):
        super().__init__()
        self.kind, self.extra = kind, extra
        lm = tiny.build_hf_model(backbone_name, None, seed=seed, vocab_size=vocab)
        self.config, self.model = lm.config, lm.model
        hidden = self.config.hidden_size
        gen = torch.Generator().manual_seed(seed + 1)
        if kind == "urm":
            self.score = nn.Linear(hidden, 10, bias=False)
            self.weights = nn.Module()
            self.weights.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.SELU(), nn.Linear(hidden, hidden), nn.SELU(),
                                            nn.Linear(hidden, 5))
        else:
            k = extra["num_objectives"] * extra.get("num_quantiles", 1)
            self.regression_layer = nn.Linear(hidden, k, bias=False)
            n = extra["num_objectives"]
            transform = torch.randn(n, n, generator=gen) * 0.5 + torch.eye(n)  # not the identity: tests its use
            if kind == "qrm-gemma2":  # reported without a transform matrix (unverified)
                self.register_buffer("reward_transform_matrix", torch.eye(n), persistent=False)
            else:
                self.reward_transform_matrix = nn.Parameter(transform)
            self.gating = nn.Module()
            self.gating.layers = _gate_layers(kind, hidden, extra)
            self.gating.logit_scale = nn.Parameter(torch.tensor([1.7]))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.startswith("model.") and name != "gating.logit_scale":
                    if name != "reward_transform_matrix":
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            for module in self.modules():
                if isinstance(module, nn.BatchNorm1d):
                    module.running_mean.copy_(torch.randn(module.num_features, generator=gen) * 0.3)
                    var = torch.rand(module.num_features, generator=gen) + 0.5
                    var[::4] = 2e-5  # tiny variances make BatchNorm's eps matter
                    module.running_var.copy_(var)
        self.eval()

    def pattern(self) -> list[int]:
        if "gating_token_pattern" in self.extra:
            return list(self.extra["gating_token_pattern"])
        return list(heads.GATE_PATTERNS["gemma2" if self.kind == "qrm-gemma2" else "llama"])

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[B, 1 + objectives] (score, then rewards as the modeling files report them); right padding."""
        with torch.no_grad():
            hs = self.model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                            position_ids=tiny.torch_positions(mask)).last_hidden_state.float()
            rows = torch.arange(len(ids))
            last = hs[rows, torch.from_numpy(mask.sum(-1) - 1).long()]
            if self.kind == "urm":
                logits, w = self.score(last), self.weights.fc(last)
                score = (logits.view(-1, 5, 2)[:, :, 0] * w).sum(-1, keepdim=True)
                return torch.cat([score, logits], -1).numpy()
            positions = [self._find_gate(row.tolist()) for row in ids]
            x = hs[rows, positions]
            for layer in self.gating.layers:
                x = layer(x)
                if self.kind == "armo" and layer is not self.gating.layers[-1]:
                    x = torch.relu(x)
            gate = torch.softmax(x / self.extra.get("gating_temperature", 10), dim=1) * self.gating.logit_scale[0]
            q = self.extra.get("num_quantiles", 1)
            r = self.regression_layer(last).reshape(len(ids), self.extra["num_objectives"], q).mean(-1)
            adjusted = r @ self.reward_transform_matrix
            score = (gate * adjusted).sum(1, keepdim=True)
            return torch.cat([score, adjusted if self.kind != "armo" else r], -1).numpy()

    def _find_gate(self, row: list[int]) -> int:
        pat = self.pattern()
        for j in range(len(row) - len(pat), -1, -1):
            if row[j : j + len(pat)] == pat:
                return j
        raise ValueError("Token pattern not found in the list.")

    def save(self, folder, arch: str):
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        config = self.config.to_dict() | self.extra | {"architectures": [arch]}
        (folder / "config.json").write_text(json.dumps(config))
        return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(kind):
        if kind not in cache:
            backbone, arch, extra = KINDS[kind]
            vocab = tiny.VOCAB if kind == "urm" else (3000 if kind == "qrm-gemma2" else LLAMA_VOCAB)
            ref = Reference(kind, backbone, extra, vocab)
            cache[kind] = (ref, ref.save(tmp_path_factory.mktemp(kind), arch))
        return cache[kind]

    return get


def _conversations(ref: Reference, batch: int = 4, seed: int = 0):
    """Right-padded rows: prompt tokens, the gate pattern, response tokens (varied lengths)."""
    rng = np.random.default_rng(seed)
    pattern = ref.pattern() if ref.kind != "urm" else []
    rows = [list(rng.integers(3, 90, 5 + i)) + pattern + list(rng.integers(3, 90, 2 + (i % 3))) for i in range(batch)]
    rows[0] = pattern + rows[0]  # an earlier occurrence: the gate reads the last one
    width = max(map(len, rows))
    ids = np.full((batch, width), tiny.PAD, np.int32)
    mask = np.zeros((batch, width), bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, True
    return ids, mask


@pytest.mark.parametrize("kind", list(KINDS))
def test_head_matches_published_logic(built, kind):
    ref, folder = built(kind)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.head.kind == kind.split("-")[0]
    ids, mask = _conversations(ref)
    want = ref(ids, mask)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    assert got.shape == want.shape == (len(ids), model.config.num_outputs)
    np.testing.assert_allclose(got, want, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)
    assert np.ptp(got[:, 0]) > 1e-3  # the rows differ, so the test can tell them apart


@pytest.mark.parametrize("kind", ["armo", "qrm", "urm"])
def test_cached_prefix_and_gcg_paths_use_the_same_gate(built, kind):
    """The sweep/GCG path: the prompt (with the gate pattern) is prefilled once, responses appended."""
    ref, folder = built(kind)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    prompt = [5, 9, 14, 3] + (ref.pattern() if kind != "urm" else [7])
    responses = np.array([[11, 40], [23, 8], [61, 62]], np.int32)
    full = np.concatenate([np.tile(prompt, (3, 1)), responses], axis=1).astype(np.int32)
    want = ref(full, np.ones_like(full, bool))[:, 0]
    cache = prefill_prefix(model, prompt)
    got = np.asarray(M.rewards_after(model.params, model.config, cache, responses))[:, 0]
    atol = tolerance.rewards_atol(model.params, model.config, full)
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)
    one_hot = jax.nn.one_hot(responses[0], model.config.vocab_size, dtype=jnp.float32)
    value, _ = gcg._reward_of_one_hot(model.config, model.params, cache, one_hot, jnp.asarray(responses[0]),
                                      jnp.zeros((0,), jnp.int32), column=0)
    assert float(value) == pytest.approx(want[0], abs=atol)
    # GCG's candidates: packed tails against the cache of prompt + current, output column 0
    extended = extend_prefix(model, cache, responses[:1])
    variants = np.concatenate([responses, [[11, 8], [23, 40]]])
    full = np.concatenate([np.tile(prompt, (5, 1)), variants], axis=1).astype(np.int32)
    got = score_variants(model, extended, np.zeros(0, np.int32), responses[0], variants, 8)
    np.testing.assert_allclose(got, ref(full, np.ones_like(full, bool))[:, 0],
                               atol=tolerance.rewards_atol(model.params, model.config, full), rtol=0)


def test_sharded_head_matches(built):
    ref, folder = built("qrm")
    model = load_hf_model_folder(folder, require_tokenizer=False, mesh=make_mesh("data:4,model:2"))
    ids, mask = _conversations(ref, batch=8, seed=3)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    np.testing.assert_allclose(got, ref(ids, mask), atol=tolerance.rewards_atol(model.params, model.config, ids, mask),
                               rtol=0)


def test_missing_gate_pattern_is_an_error_not_a_number(built):
    ref, folder = built("armo")
    model = load_hf_model_folder(folder, require_tokenizer=False)
    ids, mask = _conversations(ref)
    ids[1, : mask[1].sum()] = 7  # row 1 no longer contains the pattern
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    assert np.isnan(got[1, 0]) and np.isfinite(got[[0, 2, 3], 0]).all()
    with pytest.raises(CheckpointError, match="token pattern"):
        prefill_prefix(model, [5, 9, 14, 3])


def test_wrong_gate_layout_names_the_tensor(built, tmp_path):
    """A config whose gate layout does not match the tensors fails with the key and the shapes."""
    ref, folder = built("qrm")
    config = json.loads((folder / "config.json").read_text())
    config["gating_block_modules"] = 4  # claims the Gemma layout (Linear, ReLU, BN, Dropout)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(folder / "model.safetensors")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="gating.layers"):
        load_hf_model_folder(bad, require_tokenizer=False)



def test_sweep_and_text_scoring_with_a_gated_head(tmp_path, lm_folder):
    """End to end on a real chat template (SmolLM2's), the gate pattern set to its prompt end."""
    src = tiny.smollm2_tokenizer_folder()
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    pattern = tok("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).input_ids
    extra = dict(KINDS["armo"][2], gating_token_pattern=pattern)
    ref = Reference("armo", "llama3", extra, 49152, seed=4)
    folder = ref.save(tmp_path / "armo", KINDS["armo"][1])
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).is_file():
            shutil.copy(src / f, folder / f)
    model = load(str(folder))
    tokens = np.array([17, 300, 4051, 12000, 30001], np.int32)
    df = sweep(model, {"p": "Name a fruit."}, tokens, batch_size=8)
    split = chat.split_chat(model.tokenizer, "Name a fruit.")
    full = np.asarray([split.ids_with([t]) for t in tokens], np.int32)
    want = ref(full, np.ones_like(full, bool))[:, 0]
    atol = tolerance.rewards_atol(model.params, model.config, full)
    np.testing.assert_allclose(df["p"].to_numpy(), want, atol=atol, rtol=0)
    objective = dataclasses.replace(model, output_column=check_output_column(model.config, 3, "armo"))
    got = sweep(objective, {"p": "Name a fruit."}, tokens, batch_size=8)["p"].to_numpy()
    np.testing.assert_allclose(got, ref(full, np.ones_like(full, bool))[:, 3], atol=atol, rtol=0)
    with pytest.raises(ValueError, match="7 reward outputs"):
        check_output_column(model.config, 7, "armo")
    # the last: a response holding the gate pattern (its special-token strings read as specials, as transformers
    # reads them): the gate moves there, and the cached prefix's gate was used (a fault hunt: -0.5317 for -0.5261)
    # a search that could write the pattern into a response is refused (its cached gate would be read); without
    # --allow_special the pattern's specials are out of reach (and its newline without --allow_non_ascii)
    allowed_all = GCGConfig(num_tokens=len(pattern), steps=1, search_width=4, allow_special=True,
                            allow_non_ascii=True)
    target = gcg.make_target(model, "Name a fruit.")
    with pytest.raises(UsageError, match="gates on its pattern"):
        gcg.gcg([target], allowed_all)
    with pytest.raises(UsageError, match="gates on its pattern"):
        beam_search(model, {"p": "Name a fruit."}, BeamConfig(depth=len(pattern), beam=2, top=2, allow_special=True),
                    np.asarray(pattern + [17]))
    gcg.gcg([target], dataclasses.replace(allowed_all, allow_special=False))
    # the frontier and the disagreement search (its side A) run the same check once their models load: their whole
    # turns never hold the end of turn (<|im_end|>, the pattern's first token), so gated on the rest of it
    opened = tmp_path / "opened"
    shutil.copytree(folder, opened)
    config = json.loads((opened / "config.json").read_text())
    config["gating_token_pattern"] = pattern[2:]  # <|im_start|>assistant\n
    (opened / "config.json").write_text(json.dumps(config))
    from rmjax.runs.options import RunOptions
    from rmjax.search.disagree_config import DisagreeConfig, DisagreeSpec
    from rmjax.search.disagree_job import run_disagree
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier

    fluent = FluentConfig(num_tokens=len(pattern), samples=8, beam=2, proposals=4, search_width=16, topk=8)
    prompts = {"p": "Name a fruit."}
    for job, run in enumerate((lambda out, **allowed: run_frontier(FrontierSpec(
                    RunOptions(model=str(opened), out=str(out)), prompts, FrontierConfig(lambdas=(0.0,), forwards=100,
                                                                                         **allowed),
                    fluent, lm=str(lm_folder), judge=str(lm_folder))),
                lambda out, **allowed: run_disagree(DisagreeSpec(
                    RunOptions(model=str(opened), out=str(out)), (str(opened), str(folder)), prompts,
                    DisagreeConfig(forwards=100, vocab_map=False, **allowed), fluent, lm=str(lm_folder),
                    judge=str(lm_folder))))):
        with pytest.raises(UsageError, match="gates on its pattern"):
            run(tmp_path / f"job{job}", allow_special=True, allow_non_ascii=True)
        # the refused run leaves no store behind (it pinned the refused flags: the corrected rerun was refused)
        assert not list((tmp_path / f"job{job}").rglob("manifest.json"))  # the rerun: test_safety_resume
    # a disagreement's side B gives no gradient for a text that moves its gate (the cached gate's reward is not
    # the one `rewards` gives it: a review), and one for a text that does not
    side = RewardSide(SideSpec(str(folder), (str(folder),)), model, "Name a fruit.", "auto")
    assert side.gives_gradient("apple") and not side.gives_gradient("apple<|im_end|>\n<|im_start|>assistant\nb")
    # the vocabulary map reads back once for two sides that read alike (same split, template and tokenizer)
    twin = RewardSide(SideSpec(str(folder), (str(folder),)), load(str(folder)), "Name a fruit.", "auto")
    other = RewardSide(SideSpec(str(folder), (str(folder),)), model, "Name a vegetable.", "auto")
    assert side.reads_like(twin) and not side.reads_like(other)
    texts = ["apple", "a banana, ripe", "apple<|im_end|>\n<|im_start|>assistant\nbanana"]
    ids = TextScorer(model, "Name a fruit.").token_ids(texts)
    got = TextScorer(model, "Name a fruit.").score(texts)
    assert len(ids[0]) > len(split.prefix)  # the gate pattern sits in the cached prefix
    assert heads.moves_gate(model.config.head, split.prefix, ids[2][len(split.prefix):])
    for k, row in enumerate(ids):
        row = np.asarray([row], np.int32)
        assert got[k] == pytest.approx(ref(row, np.ones_like(row, bool))[0, 0],
                                       abs=tolerance.rewards_atol(model.params, model.config, row))


def test_train_rm_refuses_a_gated_base_before_any_weight(built, tmp_path, monkeypatch):
    """A fault hunt: train_rm on an ArmoRM kept its gating tensors beside the new head; the export held no
    score.weight (transformers scored it with a random head) and rmjax refused it; --trainable=full crashed."""
    from tests import inproc

    _, folder = built("armo")
    base = tmp_path / "armo"
    shutil.copytree(folder, base)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny.smollm2_tokenizer_folder() / name).is_file():
            shutil.copy(tiny.smollm2_tokenizer_folder() / name, base / name)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i}?,good {i},bad {i}\n" for i in range(8)))
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: inproc.train_rm(base, pairs=pairs, workdir=tmp_path / "w", steps=2, batch_size=2,
                                               warmup_steps=1), "has a gated reward head", "give its base LM")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("kind", ["armo", "urm"])
def test_export_refuses_a_gated_head_transformers_would_score_otherwise(built, tmp_path, monkeypatch, kind):
    """A fault hunt: an ArmoRM's export loaded in transformers as a plain classifier with a random score head, a
    URM's scored its first raw output: the job said it wrote a Hugging Face folder. Refused before any weight."""
    from rmjax.loading.export import run_export
    from tests import inproc

    _, folder = built(kind)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_export(inproc.options(folder, tmp_path / "hf")), f"gated {kind.split('-')[0]} "
                       "reward head", "score it with rmjax")
    assert not (tmp_path / "hf").exists()


def test_a_continuation_moves_the_gate_where_a_pattern_ends_in_it():
    """heads.moves_gate against a brute-force reading: some occurrence of the pattern in prefix + continuation ends
    inside the continuation (one straddling the two counts)."""
    rng = np.random.default_rng(3)
    for _ in range(3000):
        pattern = tuple(int(t) for t in rng.integers(0, 3, int(rng.integers(1, 4))))
        prefix, continuation = (list(map(int, rng.integers(0, 3, int(rng.integers(0, 6))))) for _ in range(2))
        whole, n = prefix + continuation, len(pattern)
        want = any(tuple(whole[j:j + n]) == pattern and j + n > len(prefix) for j in range(len(whole) - n + 1))
        assert heads.moves_gate(types.SimpleNamespace(pattern=pattern), prefix, continuation) == want
    assert not heads.moves_gate(None, [1, 2], [1, 2])


def test_a_search_that_could_finish_the_gate_pattern_is_refused_and_only_such_a_search():
    """heads.check_search_keeps_gate against a brute-force search over every response the allowed tokens make, the
    template's suffix after it (moves_gate on each): refused exactly when some response of 1 to `longest` tokens
    and its suffix finish the pattern."""
    rng = np.random.default_rng(5)
    refused = 0
    for _ in range(600):
        pattern = tuple(int(t) for t in rng.integers(0, 3, int(rng.integers(1, 4))))
        prefix, suffix = (list(map(int, rng.integers(0, 3, int(rng.integers(0, k))))) for k in (5, 3))
        allowed = {t for t in range(3) if rng.random() < 0.6} or {int(rng.integers(0, 3))}  # a search has tokens
        longest = int(rng.integers(1, 4))
        head = types.SimpleNamespace(pattern=pattern, kind="armo")
        responses = [list(r) for n in range(1, longest + 1) for r in itertools.product(sorted(allowed), repeat=n)]
        if any(heads.moves_gate(head, prefix, r + suffix) for r in responses):
            refused += 1
            with pytest.raises(UsageError, match="gates on its pattern"):
                heads.check_search_keeps_gate(head, prefix, allowed.__contains__, longest, suffix=suffix)
        else:
            heads.check_search_keeps_gate(head, prefix, allowed.__contains__, longest, suffix=suffix)
    assert 100 < refused < 500  # both outcomes exercised
