"""rmjax vs transformers PyTorch (eager, float32) on tiny random models of every family."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from rmjax.loading.hf import load_hf_model_folder
from tests import jitted as M
from tests import tiny, tolerance

FAMILIES = list(tiny.CONFIGS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Build (lazily) and save each tiny HF model once per module."""
    cache = {}

    def get(name, num_labels=None, **overrides):
        key = (name, num_labels, tuple(sorted(overrides.items())))
        if key not in cache:
            hf = tiny.build_hf_model(name, num_labels, **overrides)
            folder = tmp_path_factory.mktemp(f"{name}-{num_labels}")
            cache[key] = (hf, tiny.save_hf_model(hf, folder))
        return cache[key]

    return get


def _hf_outputs(hf, ids, mask):
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            position_ids=tiny.torch_positions(mask),
        )
    return out.logits.float().numpy()


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("name", FAMILIES)
def test_reward_parity(saved, name, padding):
    num_labels = 3 if name in ("llama3.1", "gemma2") else 1
    hf, folder = saved(name, num_labels)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.num_labels == num_labels
    ids, mask = tiny.random_batch(seed=1, batch=4, length=12, padding=padding)
    ref = _hf_outputs(hf, ids, mask)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("name", FAMILIES)
def test_lm_logits_parity(saved, name, padding):
    hf, folder = saved(name)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=2, batch=3, length=12, padding=padding)
    ref = _hf_outputs(hf, ids, mask)
    got = np.asarray(M.logits(model.params, model.config, ids, mask))
    atol = tolerance.logits_atol(model.params, model.config, ids, mask)
    np.testing.assert_allclose(got[mask], ref[mask], atol=atol, rtol=0)


def test_multimodal_gemma3_reward_model_text_path(tmp_path):
    """Gemma3ForSequenceClassification (vision tower + language model): rmjax runs the text path."""
    import transformers

    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=tiny.hf_config("gemma3").to_dict(), vision_config=vision.to_dict(),
                                    num_labels=1, mm_tokens_per_image=4, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.Gemma3ForSequenceClassification(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "norm" in name or "embed" in name else 0.15))
    folder = tiny.save_hf_model(hf, tmp_path)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.model_type == "gemma3_text" and model.config.qk_norm
    ids, mask = tiny.random_batch(seed=11, batch=3, length=12, padding="right")
    ref = _hf_outputs(hf, ids, mask)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)


def test_model_safetensors_beside_a_shard_index_is_the_checkpoint_as_for_transformers(tmp_path):
    """A folder with model.safetensors and a shard index (another model's shards) is read as transformers reads it:
    model.safetensors. rmjax read the shards, rewards off by 0.79 with no warning (a fault hunt)."""
    tiny.build_hf_model("llama3.1", num_labels=1, seed=1).save_pretrained(tmp_path, max_shard_size="60KB")
    hf = tiny.build_hf_model("llama3.1", num_labels=1, seed=2)
    hf.save_pretrained(tmp_path / "single")
    (tmp_path / "single" / "model.safetensors").rename(tmp_path / "model.safetensors")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    model = load_hf_model_folder(tmp_path, require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=12, batch=3, length=10, padding="left")
    ref = _hf_outputs(hf, ids, mask)
    weights, read = hf.state_dict(), loaded.state_dict()  # transformers read model.safetensors
    assert weights.keys() == read.keys() and all(torch.equal(weights[k], read[k]) for k in weights)
    np.testing.assert_allclose(np.asarray(M.rewards(model.params, model.config, ids, mask)), ref,
                               atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)


def test_sharded_checkpoint_with_index(tmp_path):
    hf = tiny.build_hf_model("llama3.1", num_labels=1)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="60KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 3 and (tmp_path / "model.safetensors.index.json").is_file()
    model = load_hf_model_folder(tmp_path, require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=12, batch=3, length=10, padding="left")
    np.testing.assert_allclose(np.asarray(M.rewards(model.params, model.config, ids, mask)),
                               _hf_outputs(hf, ids, mask),
                               atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)



@pytest.mark.parametrize("name", FAMILIES)
def test_large_rms_norm_eps_parity(saved, name):
    """RMSNorm's epsilon is part of the math: dropped, the tiny models' default eps (1e-5, 1e-6) moves rewards by
    only 1/50 to 1/2 of the float32 bound, so only the real-model test caught it (issue 42's mutant). With
    rms_norm_eps = 1.0, about the mean square of the activations, every norm (the layers', Gemma 2/3's sandwich
    norms, Gemma 3's q/k norms, the final one) depends on it, and the rewards must still match transformers at
    the same bound."""
    hf, folder = saved(name, 1, rms_norm_eps=1.0)
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.norm_eps == 1.0
    ids, mask = tiny.random_batch(seed=13, batch=4, length=12, padding="left")
    ref = _hf_outputs(hf, ids, mask)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)
