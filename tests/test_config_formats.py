"""transformers 4.x-style config.json files (written by hand) load to the same model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rmjax.errors import UnsupportedModelError
from rmjax.loading.hf import load_hf_model_folder
from tests import jitted as M
from tests import tiny, tolerance


def _to_v4(cfg: dict, name: str) -> dict:
    cfg = dict(cfg)
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types", None)
    cfg["transformers_version"] = "4.44.0"
    if name == "llama3.1":
        cfg["rope_theta"] = rope.pop("rope_theta")
        rope["type"] = rope.pop("rope_type")  # the oldest spelling
        cfg["rope_scaling"] = rope
    elif name == "gemma2":
        cfg["rope_theta"] = rope["rope_theta"]
    elif name == "gemma3":
        cfg["rope_theta"] = rope["full_attention"]["rope_theta"]
        cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": rope["full_attention"]["factor"]}
        cfg["sliding_window_pattern"] = 3  # layers: local, local, global, local
    return cfg


@pytest.mark.parametrize("name", ["llama3.1", "gemma2", "gemma3"])
def test_v4_config_loads_to_same_numerics(tmp_path, name):
    hf = tiny.build_hf_model(name, num_labels=1)
    folder = tiny.save_hf_model(hf, tmp_path)
    path = folder / "config.json"
    v4 = _to_v4(json.loads(path.read_text()), name)
    assert "rope_parameters" not in v4 and "layer_types" not in v4
    path.write_text(json.dumps(v4))
    _rewards_match(hf, folder, length=12)


def _rewards_match(hf, folder, length: int) -> None:
    """rmjax's rewards of the folder equal `hf`'s (transformers) on a random right-padded batch."""
    model = load_hf_model_folder(folder, require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=6, batch=3, length=length, padding="right")
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=tiny.torch_positions(mask)).logits.numpy()
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)


def _both_ropes(cfg: dict) -> None:  # transformers reads `rope_scaling or rope_parameters`: rope_scaling wins
    cfg["rope_scaling"] = cfg.pop("rope_parameters") | {"original_max_position_embeddings": 24}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0}


def _gemma3_both(cfg: dict) -> None:  # Gemma3TextConfig updates rope_parameters.full_attention with rope_scaling
    cfg["rope_parameters"]["full_attention"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}


def _top_original(cfg: dict) -> None:  # one object for all layers: the top-level original length has priority
    cfg["original_max_position_embeddings"] = 16


def _gemma3_v4_top_original(cfg: dict) -> None:  # Gemma 3 is nested in transformers: the top-level one is not read
    v4 = _to_v4(cfg, "gemma3")
    cfg.clear()
    cfg.update(v4, rope_scaling=dict(_LLAMA3, original_max_position_embeddings=24), original_max_position_embeddings=16)


def _nested_and_scaling(cfg: dict) -> None:  # rope_scaling replaces a nested rope_parameters as well
    cfg["rope_scaling"] = cfg.pop("rope_parameters") | {"original_max_position_embeddings": 24}
    cfg["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("name, edit", [("llama3.1", _both_ropes), ("gemma3", _gemma3_both),
                                        ("llama3.1", _top_original), ("gemma3", _gemma3_v4_top_original),
                                        ("llama3.1", _nested_and_scaling)])
def test_rope_fields_are_read_in_transformers_order(tmp_path, name, edit):
    """Config fields that name RoPE twice: rmjax read rope_parameters and ignored rope_scaling beside it, and read
    llama3's original length from its rope object alone (a fault hunt: off by up to 0.1 against transformers, no
    warning). The reference is transformers loading the same edited folder."""
    import transformers

    folder = tiny.save_hf_model(tiny.build_hf_model(name, num_labels=1), tmp_path)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    _rewards_match(transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval(), folder, length=40)


def _window_on_llama(cfg: dict) -> None:  # LlamaConfig keeps layer_types, but transformers' Llama never windows
    cfg.update(layer_types=["sliding_attention", "full_attention"] * (cfg["num_hidden_layers"] // 2), sliding_window=3)


def _flat_gemma3_rope(cfg: dict) -> None:  # Gemma3TextConfig reads only a nested rope_parameters
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}


def _full_layers_on_llama(cfg: dict) -> None:  # says what transformers does anyway
    cfg.update(layer_types=["full_attention"] * cfg["num_hidden_layers"], sliding_window=3)


def _flat_gemma3_default_rope(cfg: dict) -> None:  # the RoPE transformers runs on the global layers anyway
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0}


@pytest.mark.parametrize("name, edit, refused", [
    ("llama3", _window_on_llama, "layer_types names sliding_attention layers, which transformers' llama never"),
    ("gemma", _window_on_llama, "layer_types names sliding_attention layers, which transformers' gemma never"),
    ("gemma3", _flat_gemma3_rope, r"rope_parameters=\{\"rope_type\": \"linear\".* one object for every layer"),
    ("llama3", _full_layers_on_llama, None), ("gemma3", _flat_gemma3_default_rope, None)],
    ids=["llama-window", "gemma-window", "gemma3-flat-linear", "llama-full-layers", "gemma3-flat-default"])
def test_config_fields_transformers_ignores_are_refused_where_they_would_change_the_model(tmp_path, name, edit,
                                                                                          refused):
    """A fault hunt: rmjax windowed a Llama or Gemma 1 whose config.json names sliding layers, and applied a Gemma 3
    config's flat rope_parameters to its global layers; transformers ignores both (rewards off by 1.4 and 0.25, no
    warning). Where the ignored field would change the model it is refused; where it says what transformers runs,
    the folder loads to transformers' rewards."""
    import transformers

    folder = tiny.save_hf_model(tiny.build_hf_model(name, num_labels=1), tmp_path)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    if refused:
        with pytest.raises(UnsupportedModelError, match=refused):
            load_hf_model_folder(folder, require_tokenizer=False)
        return
    _rewards_match(transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval(), folder, length=40)
