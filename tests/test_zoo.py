"""The published reward models: real-size shapes via jax.eval_shape, hub ids resolved offline."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from rmjax import zoo
from rmjax.data import DATA_DIR
from rmjax.loading import load, resolve
from tests import tiny


def test_zoo_matches_the_papers_model_list():
    published = yaml.safe_load((DATA_DIR / "reward_models.yaml").read_text())
    assert [m["name"] for m in published] == [e.hf_id for e in zoo.ZOO]
    assert [m["nickname"] for m in published] == [e.nickname for e in zoo.ZOO]
    for m, e in zip(published, zoo.ZOO, strict=True):
        assert {"gemma2": "gemma2", "llama3": "llama"}[m["family"]] == zoo.BACKBONES[e.backbone]["model_type"]


@pytest.mark.parametrize("entry", zoo.ZOO, ids=lambda e: e.nickname)
def test_real_size_parameter_counts(entry):
    cfg = zoo.architecture_config(entry)
    params = zoo.abstract_params(cfg)
    n = zoo.count_params(params)
    raw = zoo.BACKBONES[entry.backbone]
    lm_head = 0 if raw["tie_word_embeddings"] else raw["vocab_size"] * raw["hidden_size"]
    published_rm = zoo.PUBLISHED_LM_PARAMS[entry.backbone] - lm_head + raw["hidden_size"]
    assert abs(n - published_rm) / published_rm < 0.01, (n, published_rm)
    # The custom heads' own parameters (regression layer + gate), counted by hand from their modeling files.
    h = raw["hidden_size"]
    head = {"score": 0,
            "armorm": 19 * h + (h * 1024 + 1024) + 2 * (1024 * 1024 + 1024) + (1024 * 19 + 19) + 19 * 19 + 1 - h,
            "qrm": (361 if entry.backbone.startswith("llama") else 95) * h - h
            + h * 1024 + 2 * 1024 * 1024 + 3 * 4 * 1024 + (1024 + 1) * (19 if entry.backbone.startswith("llama") else 5)
            + (19 * 19 if entry.backbone.startswith("llama") else 0) + 1,
            "urm": 9 * h + 2 * (h * h + h) + (h * 5 + 5)}[entry.head]
    body = zoo.count_params(zoo.abstract_params(zoo.architecture_config(dataclasses.replace(entry, head="score"))))
    assert n - body == head
    assert params["layers"]["q"].shape == (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim)
    assert params["score"]["kernel"].dtype == "float32" and params["embed"]["embedding"].dtype == "bfloat16"
    if entry.backbone == "gemma-2-27b":
        assert cfg.query_scale == pytest.approx(144**-0.5) and cfg.local_layers[:2] == (True, False)


def test_hub_id_resolves_to_a_local_folder(tmp_path, monkeypatch):
    folder = tmp_path / "Skywork" / "Skywork-Reward-Llama-3.1-8B-v0.2"
    tiny.save_hf_model(tiny.build_hf_model("llama3.1", num_labels=1), folder)
    monkeypatch.setenv("RMJAX_MODELS_DIR", str(tmp_path))
    assert resolve("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2") == ("hf", folder)
    assert load("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", require_tokenizer=False).config.num_labels == 1
    hub = tmp_path / "hub" / "models--Ray2333--GRM-gemma2-2B-rewardmodel-ft" / "snapshots" / "abc"
    hub.mkdir(parents=True)
    (hub / "config.json").write_text(json.dumps({}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve("Ray2333/GRM-gemma2-2B-rewardmodel-ft") == ("hf", hub)


def test_the_70b_backbone_has_the_published_size():
    """Llama 3.1 70B, for plans only (no published RM): 70.6 B parameters with its LM head; with a score head
    instead, the LM head's vocab x hidden less one hidden-wide column."""
    from rmjax.plan.spec import model_config

    cfg, _ = model_config("llama-3.1-70b")
    n = zoo.count_params(zoo.abstract_params(cfg))
    raw = zoo.BACKBONES["llama-3.1-70b"]
    lm_head = raw["vocab_size"] * raw["hidden_size"]
    published_rm = zoo.PUBLISHED_LM_PARAMS["llama-3.1-70b"] - lm_head + raw["hidden_size"]
    assert abs(n - published_rm) / published_rm < 0.01, (n, published_rm)
