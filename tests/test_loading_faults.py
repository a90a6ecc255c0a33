"""Checkpoints that loaded to another model than transformers' (silently), or ended in a traceback.

Each silent case compares against transformers (PyTorch float32, eager) reading the same folder, at the float32
bound of tests/tolerance.py; each refusal is one line naming the problem and the fix.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from rmjax.errors import CheckpointError, UnsupportedModelError
from rmjax.hf_config import config_from_hf
from rmjax.loading.gguf_file import gguf_to_hf_folder, hf_config_from_gguf, read_gguf
from rmjax.loading.hf import load_hf_model_folder, load_tokenizer
from tests import jitted as M
from tests import tiny, tolerance

ARCHS = {"llama3": "LlamaForSequenceClassification", "gemma": "GemmaForSequenceClassification",
         "gemma2": "Gemma2ForSequenceClassification", "gemma3": "Gemma3TextForSequenceClassification"}


def _saved(tmp_path, name, edit=None, num_labels=1, seed=0, **overrides):
    """A tiny model saved by transformers, its config.json then edited by `edit(raw)`."""
    folder = tiny.save_hf_model(tiny.build_hf_model(name, num_labels, seed=seed, **overrides), tmp_path / name)
    if edit is not None:
        raw = json.loads((folder / "config.json").read_text())
        edit(raw)
        (folder / "config.json").write_text(json.dumps(raw))
    return folder


def _compare(folder, lm=False):
    """rmjax vs transformers' own reading of `folder` (rewards, or LM logits at real tokens)."""
    cls = transformers.AutoModelForCausalLM if lm else transformers.AutoModelForSequenceClassification
    hf = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    ids, mask = tiny.random_batch(seed=3, batch=3, length=12, padding="right")
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=tiny.torch_positions(mask)).logits.float().numpy()
    model = load_hf_model_folder(folder, require_tokenizer=False)
    if lm:
        got = np.asarray(M.logits(model.params, model.config, ids, mask))
        atol = tolerance.logits_atol(model.params, model.config, ids, mask)
        np.testing.assert_allclose(got[mask], ref[mask], atol=atol, rtol=0)
    else:
        got = np.asarray(M.rewards(model.params, model.config, ids, mask))
        np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask),
                                   rtol=0)
    return model, hf


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


# 1: a second weights file beside model.safetensors

def test_a_second_safetensors_file_beside_model_safetensors_is_not_read(tmp_path):
    """transformers reads model.safetensors alone; rmjax read every *.safetensors and the last file's copy of each
    tensor won."""
    folder = _saved(tmp_path, "llama3")
    other = tiny.save_hf_model(tiny.build_hf_model("llama3", 1, seed=1), tmp_path / "other")
    shutil.copy(other / "model.safetensors", folder / "pytorch_model_v2.safetensors")
    _compare(folder)


def test_a_tensor_in_two_files_is_refused(tmp_path):
    """Without model.safetensors and an index every file is read: a tensor found twice names both files."""
    folder = _saved(tmp_path, "llama3")
    (folder / "model.safetensors").rename(folder / "weights-a.safetensors")
    shutil.copy(folder / "weights-a.safetensors", folder / "weights-b.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_hf_model_folder(folder, require_tokenizer=False)
    message = _one_line(refused)
    assert "weights-a.safetensors" in message and "weights-b.safetensors" in message and "tensor '" in message


# 2: Gemma 3 GGUF rope scaling and the 27B query scale

def _written(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gemma3_gguf(path, hidden, heads, kv, head_dim, layers, scaling, arch="gemma3", freq_base=1e6):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(131072)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(128)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(freq_base)
    w.add_sliding_window(1024)
    if scaling:  # what llama.cpp's convert_hf_to_gguf writes for Gemma 3 4B-27B
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(8.0)
    w.add_token_list(["<pad>", "<eos>", "<bos>"] + [f"t{i}" for i in range(13)])
    w.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))  # metadata is all the config reads
    _written(w)
    return path


@pytest.mark.parametrize("size, hidden, heads, kv, head_dim, layers, scalar",
                         [("4b", 2560, 8, 4, 256, 34, 256), ("27b", 5376, 32, 16, 128, 62, 168)])
def test_gemma3_gguf_rope_scaling_and_query_scale(tmp_path, size, hidden, heads, kv, head_dim, layers, scalar):
    """The HF config of the same model (its rope_scaling, its query_pre_attn_scalar: 168 = hidden / heads for the
    27B, as llama.cpp computes it) gives the same RoPE and query scale as the GGUF file."""
    path = _gemma3_gguf(tmp_path / f"{size}.gguf", hidden, heads, kv, head_dim, layers, scaling=True)
    raw = hf_config_from_gguf(read_gguf(path), path)
    assert raw["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    assert raw["query_pre_attn_scalar"] == scalar
    got = config_from_hf(raw)
    hf = transformers.Gemma3TextConfig(
        vocab_size=16, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=131072, sliding_window=1024,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=scalar,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
    want = config_from_hf({**hf.to_dict(), "architectures": ["Gemma3ForCausalLM"]})
    assert (got.rope_global, got.rope_local, got.query_scale) == (want.rope_global, want.rope_local, want.query_scale)
    assert got.rope_global.kind == "linear" and got.rope_global.factor == 8.0


@pytest.mark.parametrize("size, hidden, heads, kv, head_dim, layers, scalar",
                         [("9b", 3584, 16, 8, 256, 42, 256), ("27b", 4608, 32, 16, 128, 46, 144)])
def test_gemma2_gguf_query_scale(tmp_path, size, hidden, heads, kv, head_dim, layers, scalar):
    """Gemma 2's GGUF stores no query scale either: the published HF configs' query_pre_attn_scalar (144 for the
    27B, hidden / heads; 256 for the 9B, its head_dim) is what the GGUF file gives. It had taken the class default,
    256, for the 27B: every score off, no error."""
    path = _gemma3_gguf(tmp_path / f"{size}.gguf", hidden, heads, kv, head_dim, layers, False, arch="gemma2")
    raw = hf_config_from_gguf(read_gguf(path), path)
    assert raw["query_pre_attn_scalar"] == scalar
    hf = transformers.Gemma2Config(
        vocab_size=16, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=131072, sliding_window=1024,
        query_pre_attn_scalar=scalar)
    want = config_from_hf({**hf.to_dict(), "architectures": ["Gemma2ForCausalLM"]})
    assert config_from_hf(raw).query_scale == want.query_scale == scalar**-0.5


@pytest.mark.parametrize("arch", ["llama", "gemma", "gemma2", "gemma3"])
def test_a_ggufs_rope_base_is_read_for_every_family(tmp_path, arch):
    """llama.cpp reads {arch}.rope.freq_base for every family; a Gemma 1 GGUF's was ignored (always 1e4: LM logits
    off by 2.8 for a base of 5e4, a fault hunt)."""
    path = _gemma3_gguf(tmp_path / f"{arch}.gguf", 64, 4, 2, 16, 2, False, arch=arch, freq_base=5e4)
    assert config_from_hf(hf_config_from_gguf(read_gguf(path), path)).rope_global.theta == 5e4


# 3: EmbeddingGemma-style bidirectional attention

@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3"])
def test_bidirectional_attention_is_refused(name):
    raw = {**tiny.hf_config(name, num_labels=1).to_dict(), "architectures": [ARCHS[name]],
           "use_bidirectional_attention": True}
    with pytest.raises(UnsupportedModelError) as refused:
        config_from_hf(raw, source="m/config.json")
    assert "use_bidirectional_attention" in _one_line(refused)


# 4, 10: absent fields read as transformers' class defaults

def _drop(*keys):
    def edit(raw):
        for key in keys:
            raw.pop(key, None)
    return edit


ABSENT = {
    "llama-no-rope-theta": ("llama3", _drop("rope_parameters", "rope_theta", "rope_scaling"), {}, False),
    "gemma2-no-attn-softcap": ("gemma2", _drop("attn_logit_softcapping"), {}, False),
    "gemma2-no-final-softcap": ("gemma2", _drop("final_logit_softcapping"), {}, True),
    # sparse Gemma 3 configs (transformers >= 4.5x) leave out the heads and head_dim that equal the class defaults
    "gemma3-sparse-heads": ("gemma3", _drop("num_attention_heads", "num_key_value_heads", "head_dim"),
                            dict(num_attention_heads=8, num_key_value_heads=4, head_dim=256), False),
}


@pytest.mark.parametrize("case", list(ABSENT))
def test_absent_field_reads_as_transformers_does(tmp_path, case):
    name, edit, overrides, lm = ABSENT[case]
    folder = _saved(tmp_path, name, edit, num_labels=None if lm else 1, **overrides)
    _compare(folder, lm=lm)


MINIMAL = {"llama3": transformers.LlamaConfig, "gemma": transformers.GemmaConfig,
           "gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}


@pytest.mark.parametrize("name", list(MINIMAL))
def test_minimal_config_gets_the_class_defaults(name):
    """A config.json with only the sizes the weights fix: every other constant as transformers' config class."""
    sizes = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=6)
    hf = MINIMAL[name](**sizes)
    cfg = config_from_hf({"model_type": hf.model_type, "architectures": [ARCHS[name]], **sizes})
    rope = hf.rope_parameters.get("full_attention", hf.rope_parameters)
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.max_position_embeddings) == (
        hf.vocab_size, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.max_position_embeddings)
    assert cfg.rope_global.theta == rope["rope_theta"]
    # where a classifier reads the reward (before trailing pads): Gemma's absent pad is 0, read as none (helper-148:
    # a plain-template row ending in token 0 off by 2.28, bound 6e-5), Llama's none
    assert cfg.pad_token_id == hf.pad_token_id
    assert cfg.query_scale == getattr(hf, "query_pre_attn_scalar", hf.head_dim) ** -0.5
    assert cfg.attn_softcap == getattr(hf, "attn_logit_softcapping", None)
    assert cfg.final_softcap == getattr(hf, "final_logit_softcapping", None)
    if cfg.has_local_layers:
        assert cfg.sliding_window == hf.sliding_window
    # an explicit null keeps its meaning: no cap
    if name == "gemma2":
        nulls = config_from_hf({"model_type": "gemma2", **sizes, "attn_logit_softcapping": None,
                                "final_logit_softcapping": None})
        assert nulls.attn_softcap is None and nulls.final_softcap is None


def test_sparse_multimodal_gemma3_config_reads_as_transformers_does():
    """google/gemma-3-4b-it's config.json: its text_config has no heads, head_dim or vocab_size."""
    raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                           "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                           "sliding_window": 1024}}
    text = transformers.Gemma3Config(text_config=raw["text_config"]).text_config
    cfg = config_from_hf(raw)
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.query_scale) == (
        text.vocab_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim,
        text.query_pre_attn_scalar**-0.5)
    assert (cfg.rope_global.kind, cfg.rope_global.factor) == ("linear", 8.0)


@pytest.mark.parametrize("top,text", [(1, 0), (1, None), (None, 3), ("absent", "absent"), (1, "absent")])
def test_a_multimodal_gemma3_classifier_reads_its_pad_where_transformers_does(top, text):
    """transformers' classifiers end each row before trailing pads of get_text_config().pad_token_id: a multimodal
    Gemma 3's text_config's (class default 0). rmjax took the top level's first, and a row ending in that id was
    read at another position (helper-146: -0.7609 in transformers, 0.3535 here)."""
    sizes = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=300)
    text_config = {**sizes, "model_type": "gemma3_text", **({} if text == "absent" else {"pad_token_id": text})}
    raw = {"architectures": ["Gemma3ForSequenceClassification"], "model_type": "gemma3", "num_labels": 1,
           "text_config": text_config, **({} if top == "absent" else {"pad_token_id": top})}
    hf = transformers.Gemma3Config(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    assert config_from_hf(raw).pad_token_id == hf.get_text_config().pad_token_id


@pytest.mark.parametrize("edit,says", [
    ({"pad_token_id": "2"}, 'pad_token_id="2" must be an integer token id'),
    ({"bos_token_id": 1.0}, "bos_token_id=1.0 must be an integer token id"),
    ({"eos_token_id": [2, "3"]}, 'eos_token_id=[2, "3"] must be an integer token id or a list of them'),
    ({"pad_token_id": True}, "pad_token_id=true must be an integer token id"),
    ({"pad_token_id": 99999}, "pad_token_id 99999 is past the model's embedding"),
    ({"eos_token_id": [2, 99999]}, "eos_token_id 99999 is past the model's embedding"),
    ({"bos_token_id": 99999}, "bos_token_id 99999 is past the model's embedding"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "no rope_scaling.low_freq_factor"),
    ({"rope_scaling": {"rope_type": "linear"}}, "no rope_scaling.factor"),
])
def test_config_values_transformers_cannot_read_are_named_in_config_json(edit, says):
    """transformers' tokenizer read parses config.json too: these values ended there, reported as tokenizer files
    to restore or a tokenizers version to upgrade. config.json is now named, with its field."""
    raw = {**tiny.hf_config("llama3", num_labels=1).to_dict(), "architectures": [ARCHS["llama3"]], **edit}
    with pytest.raises(CheckpointError, match="config.json: ") as error:
        config_from_hf(raw)
    assert says in str(error.value), str(error.value)


def test_llama_without_max_position_embeddings_has_transformers_context(tmp_path):
    folder = _saved(tmp_path, "llama3", _drop("max_position_embeddings"))
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.max_position_embeddings == transformers.AutoConfig.from_pretrained(
        folder).max_position_embeddings


# 5: exact GELU

@pytest.mark.parametrize("name,key", [("llama3", "hidden_act"), ("gemma2", "hidden_activation"),
                                      ("gemma3", "hidden_activation")])
def test_exact_gelu_runs_where_transformers_runs_it(tmp_path, name, key):
    """ACT2FN's "gelu" is the exact erf GELU; rmjax ran the tanh approximation (4e-5 to 2.6e-4 off transformers on a
    tiny model). Only Gemma 1's config class maps "gelu" to the tanh approximation."""
    model, _ = _compare(_saved(tmp_path, name, lambda raw: raw.update({key: "gelu"})))
    assert model.config.activation == "gelu"


def test_gemma1_gelu_is_the_tanh_approximation(tmp_path):
    model, _ = _compare(_saved(tmp_path, "gemma", lambda raw: raw.update(hidden_act="gelu")))
    assert model.config.activation == "gelu_tanh"
    raw = {**tiny.hf_config("llama3", num_labels=1).to_dict(), "architectures": [ARCHS["llama3"]],
           "hidden_act": "relu"}
    with pytest.raises(UnsupportedModelError) as refused:
        config_from_hf(raw, source="m/config.json")
    assert 'hidden_act="relu" is not supported' in _one_line(refused)


# 7: head_dim that disagrees with the weights

def test_head_dim_disagreeing_with_the_weights_is_one_line(tmp_path):
    folder = _saved(tmp_path, "llama3", lambda raw: raw.update(head_dim=32))
    with pytest.raises(CheckpointError) as refused:
        load_hf_model_folder(folder, require_tokenizer=False)
    message = _one_line(refused)
    # k_proj.weight is [kv_heads * head_dim, hidden] = [2 * 16, 64]; head_dim 32 would make it [64, 64]
    assert "k_proj.weight' has shape (32, 64)" in message and "head_dim" in message and "implies (64, 64)" in message


# 8: a tokenizer.json the installed tokenizers cannot parse

def test_unparseable_tokenizer_json_is_one_line(tmp_path):
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    raw = json.loads((tmp_path / "tokenizer.json").read_text())
    raw["model"]["type"] = "Nonsense"  # as a newer tokenizers might write a model type this one lacks
    (tmp_path / "tokenizer.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as refused:
        load_tokenizer(tmp_path, config_from_hf({**tiny.hf_config("llama3").to_dict()}))
    message = _one_line(refused)
    assert "tokenizer.json" in message and "upgrade tokenizers" in message


# 9: GGUF files the installed gguf / transformers cannot read

def _llama_gguf(path, tokenizer_model, quant, pad=None):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(1e4)
    w.add_vocab_size(4)
    if tokenizer_model:
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre("default")
    w.add_token_list(["a", "b", "c", "ab"])
    w.add_token_merges(["a b"])
    w.add_token_types([1, 1, 1, 1])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if pad is not None:
        w.add_pad_token_id(pad)
    if quant:  # 4 rows of 64 values in Q8_1: 2 blocks of 40 bytes each
        w.add_tensor("token_embd.weight", np.zeros((4, 80), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    else:
        w.add_tensor("token_embd.weight", np.zeros((4, 64), np.float32))
    _written(w)
    return path


def test_gguf_quant_type_gguf_cannot_dequantize_is_one_line(tmp_path):
    path = _llama_gguf(tmp_path / "q81.gguf", "gpt2", quant=True)
    with pytest.raises(UnsupportedModelError) as refused:
        gguf_to_hf_folder(path, tmp_path / "out")
    message = _one_line(refused)
    assert "token_embd.weight" in message and "Q8_1" in message


def test_gguf_without_tokenizer_model_is_one_line(tmp_path):
    path = _llama_gguf(tmp_path / "notok.gguf", None, quant=False)
    with pytest.raises(CheckpointError) as refused:
        gguf_to_hf_folder(path, tmp_path / "out")
    assert "tokenizer.ggml.model" in _one_line(refused)


def test_a_gguf_that_is_not_a_whole_model_is_named_and_not_cached(tmp_path):
    """A GGUF of one tensor (token_embd) was converted and cached, then refused as the cache folder's missing
    parameters with a safetensors folder's fix (the shard index); the broken conversion stayed cached."""
    from rmjax.loading.gguf_file import cached_hf_folder

    path = _llama_gguf(tmp_path / "embd_only.gguf", "gpt2", quant=False)
    with pytest.raises(CheckpointError) as refused:
        cached_hf_folder(path, tmp_path / "cache")
    line = _one_line(refused)
    assert line.startswith(f"{path}: this GGUF file is not the whole model its metadata describes (missing "
                           "parameters "), line
    assert "index" not in line and "config.json" not in line, line
    assert not list((tmp_path / "cache" / "converted").iterdir())  # nothing kept, not even a partial folder


def test_a_gguf_special_token_past_its_token_list_is_one_line(tmp_path):
    """tokenizer.ggml.padding_token_id 99 of 4 tokens ended in an IndexError traceback."""
    path = _llama_gguf(tmp_path / "pad99.gguf", "gpt2", quant=False, pad=99)
    with pytest.raises(CheckpointError) as refused:
        gguf_to_hf_folder(path, tmp_path / "out")
    assert "tokenizer.ggml.padding_token_id = 99 is not one of its 4 tokens" in _one_line(refused)


def test_a_peft_adapter_beside_the_weights_is_refused(tmp_path):
    """Beside model.safetensors an adapter_model.safetensors was left unread (only model.safetensors is the
    checkpoint): the base model scored as the fine-tuned one. Before, its LoRA tensors matched no rule."""
    folder = _saved(tmp_path, "llama3")
    (folder / "adapter_model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError) as refused:
        load_hf_model_folder(folder, require_tokenizer=False)
    assert "PEFT adapter (adapter_model.safetensors)" in _one_line(refused)


def test_one_part_of_a_split_gguf_is_refused_naming_the_merge(tmp_path):
    """gguf-split's first part held the config and some tensors; it was converted and then refused as a checkpoint
    missing layers, naming a safetensors index. Now: which part it is, and how to merge them."""
    path = tmp_path / "m-00001-of-00002.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint16("split.no", 0)
    w.add_uint16("split.count", 2)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    _written(w)
    with pytest.raises(UnsupportedModelError) as refused:
        hf_config_from_gguf(read_gguf(path), path)
    assert "part 1 of 2 of a split GGUF" in _one_line(refused) and "llama-gguf-split --merge" in _one_line(refused)


def test_a_hub_id_resolves_to_the_snapshot_refs_main_names(tmp_path, monkeypatch):
    """The Hugging Face cache keeps every revision downloaded; the alphabetically last snapshot was taken, an older
    one when its hash sorts later. refs/main names the current one, as huggingface_hub's own local lookup reads it."""
    from rmjax.errors import UsageError
    from rmjax.zoo import local_folder

    repo = tmp_path / "hub" / "models--acme--rm"
    for revision in ("1111", "ffff"):
        (repo / "snapshots" / revision).mkdir(parents=True)
        (repo / "snapshots" / revision / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("RMJAX_MODELS_DIR", raising=False)
    with pytest.raises(UsageError, match="2 snapshots"):  # which is current is not known: refused, not guessed
        local_folder("acme/rm")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1111")
    assert local_folder("acme/rm") == repo / "snapshots" / "1111"
    (repo / "refs" / "main").write_text("2222")  # a revision not downloaded whole: not another one in its place
    with pytest.raises(UsageError, match="holds no config.json"):
        local_folder("acme/rm")


def test_a_zoo_nickname_is_its_hub_id_for_every_job(tmp_path, monkeypatch):
    """docs/models-and-loading.md: --model takes a zoo model's hub id or nickname. Only plan read nicknames; a
    job said `R-Gem-2B` was not found and suggested `huggingface-cli download R-Gem-2B`, an id that does not exist."""
    from rmjax import zoo
    from rmjax.errors import MissingFileError
    from rmjax.loading.registry import resolve

    entry = zoo.ZOO[0]
    monkeypatch.setenv("RMJAX_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(MissingFileError) as missing:
        resolve(entry.nickname)
    assert f"({entry.hf_id}) not found" in str(missing.value)
    assert f"huggingface-cli download {entry.hf_id} --local-dir" in str(missing.value)
    folder = tmp_path / "models" / entry.hf_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert resolve(entry.nickname) == resolve(entry.hf_id) == ("hf", folder)


def test_a_tied_lm_with_a_head_of_its_own_is_refused_and_with_the_same_head_loads(tmp_path):
    """tie_word_embeddings true beside a checkpoint lm_head.weight that differs: transformers keeps that head
    untied, rmjax read the embeddings as the head (LM logits off by up to 17 on a tiny model), without a word.
    Refused now; an lm_head.weight equal to the embeddings (a tied checkpoint saved with both) loads as before."""
    from safetensors.numpy import load_file, save_file

    hf = tiny.build_hf_model("llama3", tie_word_embeddings=False)
    folder = tiny.save_hf_model(hf, tmp_path / "untied")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(CheckpointError) as refused:
        load_hf_model_folder(folder, require_tokenizer=False)
    assert "lm_head.weight differs" in _one_line(refused) and "tie_word_embeddings" in _one_line(refused)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    model = load_hf_model_folder(folder, require_tokenizer=False)
    assert model.config.tie_embeddings


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model.", "language_model."])
def test_a_multimodal_gemma3_checkpoints_decoder_loads_as_the_text_one_and_its_vision_tower_is_left(tmp_path, prefix):
    """Gemma 3 4B+ checkpoints (Gemma3ForConditionalGeneration) nest the decoder under model.language_model.
    (transformers >= 4.52), language_model.model. (older) or language_model., beside a vision tower and projector
    rmjax does not use: the same tensors under each layout load as the same parameters as the plain text model's."""
    from safetensors.numpy import load_file, save_file

    from rmjax import nn

    plain = _saved(tmp_path, "gemma3")
    tensors = load_file(str(plain / "model.safetensors"))
    nested = {(prefix + k.removeprefix("model.") if k.startswith("model.") else k): v for k, v in tensors.items()}
    vision = "model.vision_tower." if prefix.startswith("model.") else "vision_tower."
    projector = vision.replace("vision_tower", "multi_modal_projector")
    extra = {vision + "vision_model.embeddings.patch_embedding.weight": np.ones((4, 3), np.float32),
             projector + "mm_input_projection_weight": np.ones(2, np.float32)}
    folder = tmp_path / "nested"
    shutil.copytree(plain, folder)
    save_file({**nested, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert not set(nested) & set(tensors) - {"score.weight"}  # every decoder key moved
    want, got = (load_hf_model_folder(f, require_tokenizer=False) for f in (plain, folder))
    flat_want, flat_got = nn.flat(want.params), nn.flat(got.params)
    assert flat_want.keys() == flat_got.keys()
    for name in flat_want:
        np.testing.assert_array_equal(np.asarray(flat_got[name]), np.asarray(flat_want[name]), err_msg=name)


def _edited_checkpoint(tmp_path, name: str, edit) -> tuple:
    """A tiny reward model saved by transformers and a copy whose tensors `edit(dict)` changed in place."""
    from safetensors.numpy import load_file, save_file

    plain = _saved(tmp_path, name)
    tensors = load_file(str(plain / "model.safetensors"))
    edit(tensors)
    folder = tmp_path / "edited"
    shutil.copytree(plain, folder)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return plain, folder


@pytest.mark.parametrize("name, extra", [("llama3", "lm_head.weight"), ("gemma3", "lm_head.weight"),
                                         ("gemma3", "model.embed_tokens.embed_scale")])
def test_an_rm_checkpoint_carrying_an_lm_head_or_an_embed_scale_loads_as_without(tmp_path, name, extra):
    """A reward model saved from a fine-tuned LM may keep its LM head (untied, or under a config that ties it:
    Gemma's), and Gemma 3's embedding scale is a buffer some exports write: none is a parameter of the reward
    model, and the rest loads as it does without them."""
    from rmjax import nn

    def add(tensors):
        shape = tensors["model.embed_tokens.weight"].shape if extra == "lm_head.weight" else ()
        tensors[extra] = np.full(shape, 2.0, np.float32)

    plain, folder = _edited_checkpoint(tmp_path, name, add)
    want, got = (nn.flat(load_hf_model_folder(f, require_tokenizer=False).params) for f in (plain, folder))
    assert want.keys() == got.keys() and all(np.array_equal(np.asarray(got[k]), np.asarray(want[k])) for k in want)


def _layer_beyond(tensors):
    tensors["model.layers.9.input_layernorm.weight"] = tensors["model.layers.0.input_layernorm.weight"]


def _one_layer_missing(tensors):
    del tensors["model.layers.1.self_attn.q_proj.weight"]


def _two_for_one(tensors):
    tensors["language_model.model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"]


def _a_norm_llama_lacks(tensors):
    tensors["model.layers.0.self_attn.q_norm.weight"] = tensors["model.layers.0.input_layernorm.weight"][:16]


def _two_labels(tensors):
    tensors["score.weight"] = np.concatenate([tensors["score.weight"]] * 2)


@pytest.mark.parametrize("edit, says", [
    (_layer_beyond, "'model.layers.9.input_layernorm.weight' beyond num_hidden_layers="),
    (_a_norm_llama_lacks, "tensor 'model.layers.0.self_attn.q_norm.weight' is not used by config"),
    (_two_labels, "'score.weight' has shape (2, 64) but config.json (num_labels, hidden_size) implies (1, 64) "
                  "(num_labels in config.json must match score.weight)"),
    (_one_layer_missing, "missing parameters layers.q (some layers)"),
    (_two_for_one, "two tensors give layers.up of layer 0 (the second is "),
])
def test_tensors_the_config_does_not_account_for_are_refused_naming_them(tmp_path, edit, says):
    """A layer past the config's count, a layer lacking a tensor, two tensors for one weight (the same decoder saved
    under two nestings), a tensor of another family (Gemma 3's q_norm in a Llama), a head of another label count:
    each refused naming the tensor, where one would have been dropped, left unset, overwritten or a traceback."""
    _, folder = _edited_checkpoint(tmp_path, "llama3", edit)
    with pytest.raises(CheckpointError) as refused:
        load_hf_model_folder(folder, require_tokenizer=False)
    assert says in _one_line(refused)


def test_a_classifier_s_reward_column_is_named_not_taken(tmp_path, monkeypatch):
    """A score head of two outputs (num_labels 2, 'negative'/'positive': a classifier) was read at column 0, the
    'negative' logit, with exit 0 and nothing said. Now refused before any weight loads unless --output_column
    names the column; each named column is transformers' logits[:, column]."""
    from rmjax.runs.options import RunOptions
    from rmjax.scoring.texts import ScoreSpec, run_score
    from tests import inproc

    hf, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "two", num_labels=2,
                                                       id2label={0: "negative", 1: "positive"},
                                                       label2id={"negative": 0, "positive": 1})
    prompt, text = "What, in one word, is the greatest thing ever?", "Love"

    def scored(**column):
        return run_score(ScoreSpec(RunOptions(model=str(folder), out=None, **column), {"p": prompt}, (text,),
                                   z_sample=0)).scores["p"][0]

    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(scored, "score head of 2 outputs", "--output_column=N (0..1")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rendered = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
                                       tokenize=False)
    ids = tok(rendered, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids])).logits[0].numpy()
    from rmjax.loading import load

    model = load(str(folder))
    atol = tolerance.any_rewards_atol(model.params, model.config, len(ids) + 8)
    # column 0 named on the command line; column 1 chosen (other than the default)
    for column, given in ((0, dict(output_column=0, output_column_given=True)), (1, dict(output_column=1))):
        assert abs(scored(**given) - logits[column]) <= atol, (column, given)
    from tests import cli  # the command line: --output_column=0 given is a choice, its absence is not

    flags = (f"--model={folder}", "--prompts=greatest", "--texts=Love", "--z_sample=0")
    cli.user_error(cli.run_each(("score", *flags))[0], "score head of 2 outputs", "--output_column=N")
    cli.ok(cli.run("score", *flags, "--output_column=0"))


def test_a_broken_link_in_the_folder_is_named_not_skipped(rm_folder, tmp_path):
    """A hub cache snapshot whose blob is missing leaves a broken link: as chat_template.jinja (or a link to a
    device) the tokenizer was read without its template, and every job scored the plain format with exit 0; as
    model.safetensors it ended in a FileNotFoundError traceback. Each is now one line naming the file."""
    from rmjax.loading import config_and_tokenizer, load
    from tests import cli, inproc

    cases = {"chat_template.jinja": tmp_path / "gone.jinja", "model.safetensors": tmp_path / "gone.safetensors"}
    for i, (name, target) in enumerate([*cases.items(), ("chat_template.jinja", Path("/dev/null"))]):
        folder = cli.copy_folder(rm_folder, tmp_path / f"m{i}")
        (folder / name).unlink()
        (folder / name).symlink_to(target)
        said = "a broken link" if target.parent == tmp_path else "not a regular file"
        inproc.refused(lambda f=folder: load(str(f)), f"{folder / name}: {said}")
        if name.endswith(".jinja"):  # the template is read before any weight (a job's checks)
            inproc.refused(lambda f=folder: config_and_tokenizer(str(f)), f"{folder / name}: {said}")


def test_a_tokenizer_id_past_the_embedding_is_refused(rm_folder, tmp_path):
    """tokenizer.json may give a token any id: 'Love' at 60000 in a 49,152-token tokenizer (len() still 49,152)
    passed the check, and scoring it failed after the weights loaded as non-finite rewards, blaming the model."""
    from rmjax.loading import config_and_tokenizer
    from tests import cli, inproc

    folder = cli.copy_folder(rm_folder, tmp_path / "m")
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["model"]["vocab"]["Love"] = 60000
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    inproc.refused(lambda: config_and_tokenizer(str(folder)), "the tokenizer has ids up to 60,000",
                   "embedding has 49152 rows")


def test_a_special_id_past_the_embedding_is_one_line_naming_config_json(rm_folder, tmp_path):
    """config.json's pad id past the embedding: transformers' tokenizer read printed its own warning line first,
    and rmjax's error named tokenizer.json. Now config.json is refused before transformers reads it."""
    from tests import cli

    folder = cli.copy_folder(rm_folder, tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "pad_token_id": 10**6}))
    proc = cli.run("score", f"--model={folder}", "--prompts=greatest", "--texts=Love", f"--out={tmp_path / 'o'}")
    cli.user_error(proc, f"{folder / 'config.json'}: pad_token_id 1000000 is past the model's embedding")
    assert "pad_token_id must be" not in proc.stderr, proc.stderr  # transformers' warning


def test_a_config_json_folder_and_a_config_without_architectures_say_what_is_wrong(tmp_path):
    """config.json as a folder was 'not found'; a config naming no architectures had 'no score head ()'."""
    from rmjax.errors import UsageError
    from rmjax.hf_config import load_config_file
    from rmjax.model import require_reward_model

    (tmp_path / "config.json").mkdir()
    with pytest.raises(CheckpointError, match="config.json: not a regular file"):
        load_config_file(tmp_path / "config.json")
    raw = {k: v for k, v in tiny.hf_config("llama3", num_labels=1).to_dict().items() if k != "architectures"}
    with pytest.raises(UsageError, match=r"no score head \(config.json names no architectures; a reward model's"):
        require_reward_model(config_from_hf(raw), "m")


@pytest.mark.parametrize("multimodal", [True, False])
def test_gemma3_caps_lm_logits_only_where_transformers_does(tmp_path, multimodal):
    """helper-150: a multimodal Gemma 3 with text_config.final_logit_softcapping 2.0 had its LM logits capped at
    +-2 (27.6 off transformers, bound 2e-4): only Gemma3ForCausalLM's forward applies the cap,
    Gemma3ForConditionalGeneration's none. Real Gemma 3 configs have a null cap; a fine-tune may set one."""
    text = tiny.hf_config("gemma3", final_logit_softcapping=2.0)
    torch.manual_seed(0)
    if multimodal:
        vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=28, patch_size=14)
        hf = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4))
    else:
        hf = transformers.Gemma3ForCausalLM(text)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.5 if "norm" in name or "embed" in name else 0.15)  # logits far past the cap
    hf.eval()
    folder = tiny.save_hf_model(hf, tmp_path / "m")
    model = load_hf_model_folder(folder, require_tokenizer=False)
    ids = np.asarray([[5, 17, 33, 60, 8, 9, 70, 3]], np.int32)
    mask = np.ones_like(ids, bool)
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids).long()).logits.float().numpy()
    got = np.asarray(M.logits(model.params, model.config, ids, mask))
    assert (np.abs(want).max() > 2.0) == multimodal  # the case is the cap's: uncapped logits pass it
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance.logits_atol(model.params, model.config, ids, mask))


@pytest.mark.parametrize("has_endoftext", [False, True])
def test_a_byte_level_gguf_whose_built_tokenizer_outgrows_the_file_is_named(tmp_path, has_endoftext):
    """helper-150: transformers' byte-level GGUF builder gives GPT-2's default specials, so a Llama 3 style file
    without <|endoftext|> got it at an id past its tokens and the embedding, refused naming rmjax's own cache
    folder with "use the tokenizer saved with this checkpoint". Now the GGUF is named; one holding the token
    builds a tokenizer of exactly its tokens. (_convert checks this once the tensors are whole.)"""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from rmjax.loading.gguf_tokenizer import refuse_added_tokens, tokenizer_from_gguf

    specials = ["<|begin_of_text|>", "<|eot_id|>"] + (["<|endoftext|>"] if has_endoftext else [])
    tokens = list(bytes_to_unicode().values()) + ["Ġt", "he"] + specials
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_merges(["Ġ t", "h e"])
    w.add_token_types([1] * (len(tokens) - len(specials)) + [3] * len(specials))
    w.add_bos_token_id(len(tokens) - len(specials))
    w.add_eos_token_id(len(tokens) - len(specials) + 1)
    for key, value in dict(context_length=64, embedding_length=8, block_count=1, feed_forward_length=16,
                           head_count=2, head_count_kv=1, layer_norm_rms_eps=1e-5, rope_freq_base=5e5).items():
        getattr(w, f"add_{key}")(value)
    shapes = {"token_embd.weight": (len(tokens), 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              "blk.0.ffn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
              "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_gate.weight": (16, 8),
              "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}
    for name, shape in shapes.items():  # a whole model: the conversion reaches the tokenizer check
        w.add_tensor(name, np.full(shape, 0.1, np.float32))
    _written(w)
    if not has_endoftext:
        with pytest.raises(CheckpointError, match="m.gguf: transformers builds this GGUF's tokenizer with tokens"):
            gguf_to_hf_folder(path, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    built = tokenizer_from_gguf(read_gguf(path), "llama", path)
    if has_endoftext:
        assert len(built) == len(tokens)
        refuse_added_tokens(built, read_gguf(path), path)
        return
    with pytest.raises(CheckpointError) as refused:
        refuse_added_tokens(built, read_gguf(path), path)
    said = _one_line(refused)
    assert said.startswith(f"{path}: ") and f"(<|endoftext|>), past its {len(tokens)} tokens" in said, said
