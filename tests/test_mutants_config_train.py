"""Tests that kill the mutants the mutation pass over rmjax/hf_config, rmjax/heads, rmjax/config, rmjax/loading
(registry, hf, for_job), rmjax/text (prompts, yamlfile) and rmjax/train (planted, planted_find, planted_identity,
recipe, settings) found surviving: each names the mutant it kills and compares against an independent reference
(transformers' config classes and PyTorch models, a hand computation, a brute-force loop)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from rmjax.errors import UsageError
from rmjax.hf_config import config_from_hf
from tests import tiny, tolerance


def _tiny_lm_config():
    """rmjax's config of the tiny Llama causal LM (tests/tiny.py) as transformers writes its config.json."""
    raw = json.loads(tiny.hf_config("llama3").to_json_string())
    return config_from_hf({**raw, "architectures": ["LlamaForCausalLM"]})


# --- rmjax/hf_config.py -------------------------------------------------------------------------------------------


def _raw(cls, arch: str, **fields) -> dict:
    """A config.json as transformers writes it for `cls(**fields)`, with `arch`."""
    raw = json.loads(cls(**fields).to_json_string())
    raw["architectures"] = [arch]
    return raw


def test_gemma3_runs_without_the_attention_soft_cap_its_config_names(tmp_path):
    """A Gemma 3 config.json with attn_logit_softcapping set: transformers' Gemma3Attention never passes it to the
    attention (only Gemma 2 caps), so rmjax's rewards match transformers' uncapped ones. The cap (0.05) is small
    enough to change every attention row. Kills `attn_softcap=... if family == "gemma2"` -> `if sandwich`."""
    hf = tiny.build_hf_model("gemma3", num_labels=1, seed=1, attn_logit_softcapping=0.05)
    folder = tiny.save_hf_model(hf, tmp_path / "g3")
    assert json.loads((folder / "config.json").read_text())["attn_logit_softcapping"] == 0.05
    from rmjax.loading.hf import load_hf_model_folder
    from tests import jitted as M

    ids, mask = tiny.random_batch(seed=3, batch=2, length=10, padding="right")
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=tiny.torch_positions(mask)).logits.float().numpy()
    model = load_hf_model_folder(folder, require_tokenizer=False)
    got = np.asarray(M.rewards(model.params, model.config, ids, mask))
    np.testing.assert_allclose(got, ref, atol=tolerance.rewards_atol(model.params, model.config, ids, mask), rtol=0)


def test_a_classifier_without_num_labels_or_id2label_has_transformers_two_labels():
    """`*ForSequenceClassification` whose config.json omits num_labels and id2label (transformers writes neither
    for the default): PretrainedConfig's default is 2 labels, so the score head is 2 wide.
    Kills `... or len(raw.get("id2label") or {}) or 2` -> `or 1`."""
    raw = _raw(transformers.LlamaConfig, "LlamaForSequenceClassification", vocab_size=96, hidden_size=64,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    raw.pop("num_labels", None)
    raw.pop("id2label", None)
    raw.pop("label2id", None)
    assert config_from_hf(raw).num_labels == transformers.LlamaConfig.from_dict(dict(raw)).num_labels == 2


@pytest.mark.parametrize("cls, arch", [(transformers.LlamaConfig, "LlamaForCausalLM"),
                                       (transformers.GemmaConfig, "GemmaForCausalLM"),
                                       (transformers.Gemma2Config, "Gemma2ForCausalLM")])
def test_an_absent_tie_word_embeddings_reads_as_the_class_default(cls, arch):
    """config.json without tie_word_embeddings: each family's config class default (Llama untied, Gemma tied).
    Kills `text.get("tie_word_embeddings", is_gemma)` -> `text.get("tie_word_embeddings", False)`."""
    raw = _raw(cls, arch, vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    raw.pop("tie_word_embeddings", None)
    assert config_from_hf(raw).tie_embeddings == cls.from_dict(json.loads(json.dumps(raw))).tie_word_embeddings


def test_llama3_rope_without_its_original_length_uses_the_models_context():
    """A llama3 rope_parameters without original_max_position_embeddings: transformers takes the model's
    max_position_embeddings (64 here), which puts the head's wavelengths in all three bands; the inverse frequencies
    equal transformers' LlamaRotaryEmbedding's. Kills `default=max_position if kind == "llama3" else 8192` ->
    `default=8192`."""
    from rmjax.nn.ops import rope_inv_freq

    raw = _raw(transformers.LlamaConfig, "LlamaForCausalLM", vocab_size=96, hidden_size=64, intermediate_size=96,
               num_hidden_layers=2, num_attention_heads=4, head_dim=16, max_position_embeddings=64)
    raw["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "rope_theta": 10_000.0}
    got = rope_inv_freq(config_from_hf(raw).rope_global, 16)  # first: transformers' from_dict edits `raw`
    ref = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig.from_dict(raw))
    want = ref.inv_freq.double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # float32 rounding of the same formula


# --- rmjax/config.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama3", "gemma2"])
def test_non_embedding_params_count_the_decoder_layers_weights(name):
    """ModelConfig.non_embedding_params against a count of the PyTorch model's decoder-layer matrices (q, k, v, o,
    gate, up, down; the norms' vectors are not matrices a token multiplies through). The tiny models have 2 KV heads
    for 4 query heads. Kills `2 * self.num_kv_heads` -> `self.num_kv_heads` and `3 * h * I` -> `2 * h * I`."""
    hf = tiny.build_hf_model(name)
    want = sum(p.numel() for n, p in hf.model.layers.named_parameters() if p.ndim == 2)
    raw = json.loads(hf.config.to_json_string())
    assert config_from_hf(raw).non_embedding_params == want


def test_a_causal_lm_has_no_reward_output_column():
    """A causal LM has no score head, so no --output_column names one of its outputs (num_outputs 0).
    Kills `(self.num_labels or 0)` -> `(self.num_labels or 1)`."""
    from rmjax.model import check_output_column

    cfg = _tiny_lm_config()
    assert cfg.num_outputs == 0
    with pytest.raises(UsageError, match="output_column"):
        check_output_column(cfg, 0, "lm")


# --- rmjax/heads.py -----------------------------------------------------------------------------------------------


def _brute_starts(ids, mask, pattern):
    """At each position j, the start of the last occurrence of `pattern` among real tokens ending at or before j."""
    n, out = len(pattern), np.full(ids.shape, -1)
    for b in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            for s in range(j - n + 1, -1, -1):
                if all(mask[b, s + k] and ids[b, s + k] == pattern[k] for k in range(n)):
                    out[b, j] = s
                    break
    return out


def test_pattern_starts_and_require_pattern_against_a_brute_force_scan():
    """heads.pattern_starts (where each cut's gate is read) against a loop over every start, on rows as long as the
    pattern, rows with the pattern at their very end, several occurrences and padding; require_pattern accepts a
    prompt whose pattern ends at its last token. Kills pattern_starts' `if t < n` -> `if t <= n` and
    require_pattern's `range(len(ids) - n + 1)` -> `range(len(ids) - n)`."""
    from rmjax.errors import CheckpointError
    from rmjax.heads import HeadConfig, pattern_starts, require_pattern

    head = HeadConfig("armo", num_objectives=2, pattern=(7, 8, 9))
    rng = np.random.default_rng(0)
    for t in (3, 4, 9):
        ids = rng.integers(6, 11, size=(12, t))
        ids[0, :3] = (7, 8, 9)
        ids[1, -3:] = (7, 8, 9)
        mask = np.ones_like(ids, bool)
        mask[2:4, t - 1] = False
        got = np.asarray(pattern_starts(head, ids, mask))
        np.testing.assert_array_equal(got, _brute_starts(ids, mask, head.pattern))
    require_pattern(head, [5, 6, 7, 8, 9], "prompt")  # the pattern at the end: found
    with pytest.raises(CheckpointError):
        require_pattern(head, [8, 9, 9, 7, 8], "prompt")


def test_moves_gate_only_for_an_occurrence_that_ends_in_the_continuation():
    """heads.moves_gate against a scan of prefix + continuation for occurrences whose last token is in the
    continuation: one wholly in the prefix leaves the cached gate where it is. Kills
    `list(prefix)[max(0, len(prefix) - n + 1):]` -> `[max(0, len(prefix) - n):]`."""
    from rmjax.heads import HeadConfig, moves_gate

    head = HeadConfig("armo", num_objectives=2, pattern=(7, 8, 9))
    rng = np.random.default_rng(1)
    for _ in range(400):
        prefix = rng.integers(6, 11, size=int(rng.integers(0, 6))).tolist()
        continuation = rng.integers(6, 11, size=int(rng.integers(0, 4))).tolist()
        ids, n = prefix + continuation, 3
        want = any(ids[j:j + n] == [7, 8, 9] and j + n - 1 >= len(prefix) for j in range(len(ids) - n + 1))
        assert moves_gate(head, prefix, continuation) == want, (prefix, continuation)
    assert not moves_gate(head, [1, 7, 8, 9], [])
    assert not moves_gate(head, [1, 7, 8, 9], [5])


def test_published_heads_default_sizes():
    """Gated heads whose config.json leaves the sizes out take the published code's defaults: ArmoRM
    (LlamaForRewardModelWithGating) 19 objectives, QRM-Gemma-2 5 objectives and 4 modules per gate block (Linear,
    ReLU, BatchNorm, Dropout), QRM-Llama 3 (Linear, ReLU, BatchNorm). Kills `... else 19` -> `else 18` and
    `4 if model_type == "gemma2" else 3` -> `3`."""
    from rmjax.heads import head_config

    assert head_config({}, "LlamaForRewardModelWithGating", "llama").num_objectives == 19
    gemma = head_config({}, "Gemma2ForRewardModelWithGating", "gemma2")
    assert (gemma.num_objectives, gemma.block_modules) == (5, 4)
    assert head_config({}, "LlamaForRewardModelWithGating3", "llama").block_modules == 3


# --- rmjax/loading/registry.py ------------------------------------------------------------------------------------


def test_resolve_picks_a_lone_gguf_only_and_refuses_other_files(tmp_path):
    """registry.resolve: a folder without config.json holding exactly one .gguf is that file; with two it is not
    guessed (read as a checkpoint folder, which then names its missing config.json); a file that is not .gguf is
    refused. Kills `len(ggufs) == 1` -> `>= 1` and `path.is_file() and path.suffix == ".gguf"` -> `path.is_file()`."""
    from rmjax.errors import CheckpointError
    from rmjax.loading.registry import resolve

    one = tmp_path / "one"
    one.mkdir()
    (one / "a.gguf").write_bytes(b"")
    assert resolve(str(one)) == ("gguf", one / "a.gguf")
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    assert resolve(str(two)) == ("hf", two)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\.bin"):
        resolve(str(other))


def test_a_comma_in_an_existing_path_is_one_model(tmp_path):
    """check_one_spec refuses a comma only where it separates several models, not in an existing path's name.
    Kills `"," in spec and not Path(spec).expanduser().exists()` -> `"," in spec`."""
    from rmjax.loading.registry import check_one_spec

    folder = tmp_path / "a,b"
    folder.mkdir()
    check_one_spec(str(folder))
    with pytest.raises(UsageError, match="one model"):
        check_one_spec(str(tmp_path / "x,y"))


def test_training_recipe_of_a_builtin_rm_and_of_an_odd_record(tmp_path):
    """training_recipe: a builtin reward model's is the "recipe" of rmjax/builtin/NAME.json (read here with json);
    a record whose "recipe" is not an object records none. Kills `spec in BUILTIN_RMS or spec in BUILTIN_GGUF` ->
    `spec in BUILTIN_GGUF` in model_folder, and `recipe if isinstance(recipe, dict) else None` -> `recipe`."""
    import rmjax
    from rmjax.loading.registry import model_folder, training_recipe

    name = "elo-rm-smollm2-135m"
    want = json.loads((Path(rmjax.__file__).parent / "builtin" / f"{name}.json").read_text())["recipe"]
    assert model_folder(name) is None
    assert training_recipe(name) == want
    folder = tiny.save_hf_model(tiny.build_hf_model("llama3", 1), tmp_path / "rm")
    (folder / "rmjax_training.json").write_text(json.dumps({"recipe": ["not", "an", "object"]}))
    assert training_recipe(str(folder)) is None


def test_cache_dir_without_the_variable_is_the_checkouts(monkeypatch):
    """Without $RMJAX_CACHE_DIR a source checkout (setup.py beside rmjax/) caches under its .cache/rmjax.
    Kills `if (repo / "setup.py").is_file()` -> `if not ...`."""
    import rmjax
    from rmjax.loading.registry import cache_dir

    repo = Path(rmjax.__file__).resolve().parents[1]
    assert (repo / "setup.py").is_file()
    monkeypatch.delenv("RMJAX_CACHE_DIR", raising=False)
    assert cache_dir() == repo / ".cache" / "rmjax"


# --- rmjax/loading/hf.py ------------------------------------------------------------------------------------------


class _Tok:
    """The parts of a tokenizer check_tokenizer_fits reads: its size, its ids and its own beginning-of-text
    token."""

    def __init__(self, size: int, bos: int | None):
        self.size, self.bos_token_id, self.bos_token = size, bos, f"<t{bos}>"

    def __len__(self):
        return self.size

    def convert_ids_to_tokens(self, i):
        return f"<t{i}>"

    def get_vocab(self):
        return {f"<t{i}>": i for i in range(self.size)}


def test_tokenizer_fit_boundaries():
    """check_tokenizer_fits at its edges, by hand: a tokenizer exactly as large as the embedding fits; an eos id
    equal to the tokenizer's size is no token of it; a bos id 0 that is not the tokenizer's own bos is another
    model's. Kills `size > cfg.vocab_size` -> `>=`, `i >= size` -> `i > size` and `bos_token_id >= 0` -> `> 0`."""
    from rmjax.errors import TokenizerMismatchError
    from rmjax.loading.hf import check_tokenizer_fits

    cfg = _tiny_lm_config()
    check_tokenizer_fits(_Tok(cfg.vocab_size, cfg.bos_token_id), cfg, "t")  # as large as the table: fits
    with pytest.raises(TokenizerMismatchError, match="eos_token_id 50"):
        check_tokenizer_fits(_Tok(50, cfg.bos_token_id), cfg.replace(eos_token_id=50), "t")
    with pytest.raises(TokenizerMismatchError, match="bos_token_id 0"):
        check_tokenizer_fits(_Tok(90, 5), cfg.replace(bos_token_id=0), "t")
    # (an id past the embedding too is config.json's fault: hf_config refuses it, test_loading_faults)
    with pytest.raises(TokenizerMismatchError, match="pad_token_id 50 is not a token"):  # inside the table
        check_tokenizer_fits(_Tok(50, cfg.bos_token_id), cfg.replace(pad_token_id=50), "t")


def test_a_ported_heads_config_may_not_map_a_tokenizer_of_its_own(tmp_path):
    """refuse_remote_code on a config.json of a ported gated head (ArmoRM): its AutoModel entry is the authors'
    modeling file, which rmjax never imports, but an AutoTokenizer entry is code transformers would run; an empty
    or null entry names none. Kills `if not ported or key == "AutoTokenizer"` -> `if not ported` and
    `[value] if value else []` -> `[value]`."""
    from rmjax.errors import CheckpointError
    from rmjax.loading.hf import refuse_remote_code

    config = {"architectures": ["LlamaForRewardModelWithGating"], "auto_map": {"AutoModel": "modeling.ArmoRM"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    refuse_remote_code(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["", None]}}))
    refuse_remote_code(tmp_path)
    config["auto_map"]["AutoTokenizer"] = ["tok.Mine", None]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="tok.Mine"):
        refuse_remote_code(tmp_path)


def test_numpy_dtypes_are_the_named_ones():
    """numpy_dtype maps each --dtype name to that numpy type. Kills `"float16": np.float16` -> ml_dtypes.bfloat16."""
    import ml_dtypes

    from rmjax.loading.hf import numpy_dtype

    assert np.dtype(numpy_dtype("float16")) == np.dtype("float16")
    assert np.dtype(numpy_dtype("bfloat16")) == np.dtype(ml_dtypes.bfloat16)
    assert np.dtype(numpy_dtype("float32")) == np.dtype("float32")


# --- rmjax/loading/for_job.py -------------------------------------------------------------------------------------


def test_token_ids_at_the_vocabulary_size_are_outside_it():
    """check_token_ids: ids run 0 .. vocab_size - 1. Kills `t >= vocab_size` -> `t > vocab_size`."""
    from rmjax.text.candidates import check_token_ids as check_in_vocabulary

    check_in_vocabulary([0, 95], 96)
    with pytest.raises(UsageError, match=r"\[96\]"):
        check_in_vocabulary([3, 96], 96)


@pytest.fixture(scope="module")
def broken_template_folder(tmp_path_factory):
    """A tiny reward model with the SmolLM2 tokenizer whose chat template jinja cannot compile."""
    hf, folder = tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("broken") / "rm", seed=2)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = "{% if messages %}{{ messages[0]['content'] }"
    path.write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def test_a_broken_chat_template_is_refused_before_the_weights(broken_template_folder):
    """check_model_template (train_rm's early check) and check_template with --template=auto refuse a template
    jinja cannot compile; --template=plain never reads it. Kills check_model_template's check dropped and
    `if template != "plain"` -> `if template == "chat"`."""
    from transformers import AutoTokenizer

    from rmjax.loading.for_job import check_model_template, check_template

    tokenizer = AutoTokenizer.from_pretrained(broken_template_folder)
    with pytest.raises(Exception):  # noqa: B017 - what transformers raises on this template is its own business
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    for template in ("auto", "chat"):
        with pytest.raises(UsageError):
            check_template(tokenizer, template)
        with pytest.raises(UsageError):
            check_model_template(str(broken_template_folder), template)
    check_template(tokenizer, "plain")
    check_model_template(str(broken_template_folder), "plain")


def test_only_a_one_slash_name_is_looked_up_as_a_hub_id(tmp_path, monkeypatch):
    """resolve: a spec that is no path here and has one slash is a hub id looked up under $RMJAX_MODELS_DIR/ORG/NAME;
    `a/b/c` is not a hub id, so it is not found even where MODELS_DIR/a/b/c exists. Kills `spec.count("/") == 1` ->
    `>= 1`."""
    from rmjax.errors import MissingFileError
    from rmjax.loading.registry import resolve

    for sub in ("org/name", "org/name/deeper"):
        (tmp_path / "models" / sub).mkdir(parents=True)
        (tmp_path / "models" / sub / "config.json").write_text("{}")
    monkeypatch.setenv("RMJAX_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert resolve("org/name") == ("hf", tmp_path / "models" / "org" / "name")
    with pytest.raises(MissingFileError):
        resolve("org/name/deeper")


def test_load_for_job_gives_before_weights_the_jobs_tokenizer_and_checks_the_column(rm_folder, tmp_path):
    """load_for_job with --system_prompt: `before_weights` sees the tokenizer the job renders with (its
    conversations open with the system message, as transformers' template renders [system, user]); the loaded model
    is fingerprinted with it; an --output_column the head lacks is refused. Kills the early `peeked = (peeked[0],
    with_system_prompt(...))` dropped, `model.stamp(model.fingerprint)` dropped and check_output_column skipped."""
    from transformers import AutoTokenizer

    from rmjax.loading.for_job import load_for_job
    from rmjax.runs.options import RunOptions
    from rmjax.text.chat import render_template

    seen = []
    options = RunOptions(model=str(rm_folder), out=str(tmp_path / "o.csv"), system_prompt="Answer like a pirate.")
    model = load_for_job(options, before_weights=lambda config, tokenizer, mesh: seen.append(tokenizer))
    user = [{"role": "user", "content": "Hello there"}]
    base = AutoTokenizer.from_pretrained(rm_folder)
    want = base.apply_chat_template([{"role": "system", "content": "Answer like a pirate."}, *user], tokenize=False)
    assert render_template(seen[0], user) == want != base.apply_chat_template(user, tokenize=False)
    assert model.fingerprint_of == (id(model.params), id(model.tokenizer))
    with pytest.raises(UsageError, match="output_column"):
        load_for_job(RunOptions(model=str(rm_folder), out=str(tmp_path / "o.csv"), output_column=5))


# --- rmjax/text/prompts.py ----------------------------------------------------------------------------------------


def test_the_54_prompt_set_written_out_by_hand():
    """factorial_prompts: 6 adjectives x 3 scopes x 3 styles, each prompt as paper 2 words it (three written out
    here). Kills `"time": "of all time"` -> `"of all times"`."""
    from rmjax.text.prompts import factorial_prompts

    prompts = factorial_prompts()
    assert len(prompts) == len(set(prompts.values())) == 54
    assert prompts["best_time_please"] == "What is the best thing of all time? Please answer in one word only."
    assert prompts["terrible_world_single"] == "What, in a single word, is the most terrible thing in the world?"
    assert prompts["good_ever_one"] == "What, in one word, is the most good thing ever?"


def test_resolve_prompts_names_and_pairs(tmp_path):
    """resolve_prompts: a name given twice is refused; a prompt reached twice with the same text (greatest, and
    greatest in paper1) is one column; --prompt splits at the first '=' and needs a name. Kills
    `count(n) > 1` -> `> 2`, `name in out and out[name] != text` -> `name in out`, `not name.strip()` dropped and
    `partition` -> `rpartition`."""
    from rmjax.text.prompts import PAPER1, resolve_prompts

    with pytest.raises(UsageError, match="more than once"):
        resolve_prompts("greatest,greatest")
    assert resolve_prompts("paper1,greatest") == PAPER1
    assert resolve_prompts(None, ["eq=Is 1+1=2?"]) == {"eq": "Is 1+1=2?"}
    for bad in ("=no name", " =no name"):
        with pytest.raises(UsageError, match="name=text"):
            resolve_prompts(None, [bad])


def test_prompt_files_and_reserved_names(tmp_path):
    """read_prompt_file refuses a prompt whose text is blank; check_prompt_names refuses a single clash with a key
    column. Kills `not value.strip()` dropped and `if clash:` -> `if len(clash) > 1:`."""
    from rmjax.text.prompts import check_prompt_names, read_prompt_file

    path = tmp_path / "p.yaml"
    path.write_text('ok: "Fine?"\nblank: "   "\n')
    with pytest.raises(UsageError, match="blank"):
        read_prompt_file(path)
    with pytest.raises(UsageError, match="token_id"):
        check_prompt_names({"token_id": "x", "fine": "y"}, ("token_id", "token_name"))


# --- rmjax/text/yamlfile.py ---------------------------------------------------------------------------------------

_MERGE = "base: &b {x: 1, y: 2}\nitem:\n  <<: *b\n  y: 3\n"


@pytest.mark.parametrize("keys_as_written", [False, True])
def test_merge_keys_keep_their_yaml_meaning(keys_as_written):
    """`<<: *anchor` merges the anchored mapping (PyYAML's safe_load is the reference), with and without
    keys_as_written. Kills the merge-key exemption dropped from the repeated-key scan (`if key_node.tag ==
    MERGE_TAG: continue`) and from keys_as_written (`and key_node.tag != MERGE_TAG`)."""
    import yaml

    from rmjax.text import yamlfile

    assert yamlfile.loads(_MERGE, keys_as_written=keys_as_written) == yaml.safe_load(_MERGE)


def test_keys_as_written_and_where_a_repeated_key_is():
    """keys_as_written keeps `007:` and `yes:` as written; a repeated key names its two lines (or one, in a flow
    mapping on one line). Kills `loader.keys_as_written = keys_as_written` -> `False` and the `line == first_line`
    test flipped."""
    from rmjax.text import yamlfile

    assert yamlfile.loads("007: a\nyes: b\n", keys_as_written=True) == {"007": "a", "yes": "b"}
    assert yamlfile.loads("007: a\n") == {7: "a"}
    with pytest.raises(UsageError, match="lines 1 and 3"):
        yamlfile.loads("a: 1\nb: 2\na: 3\n")
    with pytest.raises(UsageError, match=r"\(line 1\)"):
        yamlfile.loads("{a: 1, a: 2}\n")


def test_aliases_that_contain_themselves_or_expand_too_far_are_refused():
    """An alias inside the value it names is refused as such (not as a deep nesting); a document whose aliases
    stand for 1.1 million values (six levels of ten, counted by hand: 1 + 10 + ... + 10^6 > MAX_NODES = 10^6) is
    refused, though far below 10x the limit. Kills the `id(node) in open_` check dropped and `total > MAX_NODES` ->
    `total > 10 * MAX_NODES`."""
    from rmjax.text import yamlfile

    with pytest.raises(UsageError, match="contains it"):
        yamlfile.loads("a: &a [1, *a]\n")
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 6)]
    assert sum(10**k for k in range(7)) > yamlfile.MAX_NODES
    with pytest.raises(UsageError, match="expand to more than"):
        yamlfile.loads("\n".join(lines) + "\n")


# --- rmjax/train/settings.py --------------------------------------------------------------------------------------


def _pairs(n: int, label: float = 1.0, prompt: str = "Q?"):
    from rmjax.train.data import Pairs

    return Pairs([prompt] * n, [f"good {i}" for i in range(n)], [f"bad {i}" for i in range(n)],
                 np.full(n, label, np.float32))


def test_train_identity_leaves_out_exactly_the_settings_that_change_no_parameter():
    """train_identity: --last_k counts only with --trainable=last_k, and feature_batch_size (how features are
    batched) never changes the trained parameters, so runs differing only there share checkpoints; a run in
    float16 keeps a float32 master copy as bfloat16 does. Kills `if cfg.trainable != "last_k"` -> `== "head"`,
    feature_batch_size dropped from NOT_IN_IDENTITY and `dtype != "float32"` -> `dtype == "bfloat16"`."""
    from rmjax.train.settings import TrainConfig, needs_master, train_identity

    train, heldout = _pairs(4), _pairs(2, prompt="H?")

    def identity(dtype="float32", **settings):
        return train_identity({"m": 1}, dtype, train, heldout, TrainConfig(**settings))

    assert identity(trainable="full", last_k=1) == identity(trainable="full", last_k=3)
    assert identity(trainable="last_k", last_k=1) != identity(trainable="last_k", last_k=3)
    assert identity(feature_batch_size=8) == identity(feature_batch_size=512)
    for dtype in ("float16", "bfloat16"):
        assert needs_master(TrainConfig(trainable="last_k"), dtype)
    assert not needs_master(TrainConfig(trainable="last_k"), "float32")


def test_training_checks_at_their_edges():
    """settings' refusals at their boundaries, by hand: a batch of all the pairs, --last_k of all the layers, a
    held-out set whose labels are 0 (preferring the rejected side) are fine; --fsdp on a data axis of 1 and a batch
    of 6 on a data axis of 4 are refused; frozen_layers is the layers below the trained ones. Kills `batch_size >
    pairs` -> `>=`, `last_k > num_layers` -> `>=`, `label != 0.5` -> `> 0.5`, `data == 1` -> `data == 0`,
    `batch_size % data` -> `% data == 1` and `num_layers - cfg.last_k` -> `cfg.last_k`."""
    from types import SimpleNamespace

    from rmjax.train import settings as s

    s.check_batch_size(8, 8)
    with pytest.raises(UsageError):
        s.check_batch_size(9, 8)
    last = s.TrainConfig(trainable="last_k", last_k=4)
    s.check_last_k(last, SimpleNamespace(num_layers=4), "m")
    with pytest.raises(UsageError):
        s.check_last_k(last, SimpleNamespace(num_layers=3), "m")
    s.check_heldout(_pairs(3, label=0.0))
    with pytest.raises(UsageError, match="tie"):
        s.check_heldout(_pairs(3, label=0.5))
    with pytest.raises(UsageError, match="fsdp"):
        s.check_sharding_on_data(s.TrainConfig(trainable="full", fsdp=True), 1)
    s.check_sharding_on_data(s.TrainConfig(trainable="full", fsdp=True), 2)
    with pytest.raises(UsageError, match="multiple of 4"):
        s.check_batch_on_data(s.TrainConfig(batch_size=6), 4)
    s.check_batch_on_data(s.TrainConfig(batch_size=8), 4)
    assert s.frozen_layers(s.TrainConfig(trainable="last_k", last_k=1), 4) == 3
    assert s.frozen_layers(s.TrainConfig(trainable="full"), 4) == 0


# --- rmjax/train/recipe.py ----------------------------------------------------------------------------------------


def test_head_recipe_path_and_head_out_refusal():
    """head_recipe_path: X.safetensors -> X.json, another name keeps its whole name (head.v1 -> head.v1.json);
    --head_out after --trainable=full (backbone layers trained) is refused as after last_k. Kills
    `... if head_out.suffix == ".safetensors"` -> `if True` and `trainable != "head"` -> `trainable == "last_k"`."""
    from rmjax.train.recipe import check_head_out, head_recipe_path

    assert head_recipe_path(Path("d/h.safetensors")) == Path("d/h.json")
    assert head_recipe_path(Path("d/head.v1")) == Path("d/head.v1.json")
    for trainable in ("full", "last_k"):
        with pytest.raises(UsageError, match="head_out"):
            check_head_out("h.safetensors", trainable)
    check_head_out("h.safetensors", "head")


def test_check_context_exempts_only_training_weightless_pairs_and_refuses_trained_heldout(lm_folder):
    """check_context: a weightless pair (same text both sides, label 0.5) is a batch's place in training only; in
    the held-out set it is refused; a held-out pair equal to a training pair (sides swapped) is refused. Kills
    `name == "training" and ...` dropped and `len(pairs) > 1` -> `> 2`."""
    from rmjax.train.data import Pairs
    from rmjax.train.recipe import check_context

    train = Pairs(["Q?", "Q?"], ["red", "same"], ["blue", "same"], np.asarray([1.0, 0.5], np.float32))
    check_context(str(lm_folder), (train, _pairs(1)), "plain")
    weightless = Pairs(["Q?"], ["other"], ["other"], np.asarray([0.5], np.float32))
    with pytest.raises(UsageError, match="held-out pair 1: .* one conversation"):
        check_context(str(lm_folder), (train, weightless), "plain")
    swapped = Pairs(["Q?"], ["blue"], ["red"], np.asarray([0.0], np.float32))
    with pytest.raises(UsageError, match="training pairs"):
        check_context(str(lm_folder), (train, swapped), "plain")


def test_load_pairs_takes_a_heldout_file_whole(tmp_path):
    """load_pairs with --heldout_pairs: the training file is all trained on and the held-out file is the held-out
    set (no split). Kills `if heldout_pairs:` -> never."""
    from rmjax.train.recipe import load_pairs

    train, held = tmp_path / "t.csv", tmp_path / "h.csv"
    train.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i}?,a{i},b{i}\n" for i in range(10)))
    held.write_text("prompt,chosen,rejected\nH?,x,y\nH?,u,v\n")
    got_train, got_held, split = load_pairs(str(train), None, 0, 0, False, 0, heldout_pairs=str(held))
    assert (len(got_train), got_held.chosen, split["split_by"]) == (10, ["x", "u"], "file")


def test_elo_agreement_by_hand(tmp_path, monkeypatch):
    """elo_agreement with a stub scorer: accuracy over the held-out pairs whose items' Elo differ (a tie of Elo has
    no right order), and the ceiling mean(max(p, 1 - p)) with p the Elo logistic 1 / (1 + 10^((e_r - e_c) / 400)),
    both computed by hand here. Kills `distinct = ec != er` -> all pairs and `np.maximum(p, 1 - p)` -> `p`."""
    from rmjax.scoring import texts as texts_lib
    from rmjax.train.data import Pairs
    from rmjax.train.recipe import elo_agreement

    elo = {"a": 1400.0, "b": 1000.0, "c": 1000.0, "d": 1200.0}
    score = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.0}
    csv = tmp_path / "What is best?.csv"
    csv.write_text("name,elo_score\n" + "".join(f"{k},{v}\n" for k, v in elo.items()))

    class Scorer:
        def __init__(self, *args):
            pass

        def score(self, texts):
            return [score[t] for t in texts]

    monkeypatch.setattr(texts_lib, "TextScorer", Scorer)
    held = Pairs(["Q?"] * 4, ["a", "c", "d", "d"], ["b", "b", "b", "a"], np.ones(4, np.float32))
    got = elo_agreement(None, held, csv, "plain")
    # (a,b) right; (c,b) an Elo tie, left out; (d,b) wrong (d scores 0 < b's 1); (d,a) right (both lower)
    assert got["heldout_accuracy_vs_elo_order"] == 2 / 3
    p = [1 / (1 + 10 ** ((elo[r] - elo[c]) / 400)) for c, r in zip(held.chosen, held.rejected, strict=True)]
    assert got["sampled_label_ceiling"] == pytest.approx(np.mean([max(x, 1 - x) for x in p]), rel=1e-12)


def test_a_finished_run_of_another_identity_is_not_reused(tmp_path):
    """finished_run: a workdir whose summary.json records another identity holds no finished run of this one.
    Kills the `summary.get("identity") != canonical(identity)` test dropped."""
    from types import SimpleNamespace

    from rmjax.runs.identities import canonical
    from rmjax.train.recipe import finished_run

    identity = {"job": "train_rm", "config": {"steps": 3}}
    (tmp_path / "summary.json").write_text(json.dumps({"identity": canonical({**identity, "job": "other"})}))
    assert finished_run(tmp_path, identity, SimpleNamespace(reuse=True)) is None
    (tmp_path / "summary.json").write_text(json.dumps({"identity": canonical(identity)}))
    assert finished_run(tmp_path, identity, SimpleNamespace(reuse=True)) is not None


# --- rmjax/train/planted.py ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_tokenizer():
    """The real SmolLM2 tokenizer (the planted words are one token of it with a leading space)."""
    return transformers.AutoTokenizer.from_pretrained(tiny.smollm2_tokenizer_folder())


def test_bnc_lemmas_keep_their_edges():
    """bnc_lemmas keeps lemmas of >= 3 letters with a frequency in [15, 250] inclusive, never a verb. Read off the
    shipped BNC list with awk: "cab" (NoC, 17: three letters), "academy" (NoC, exactly 15); "act" (NoC 248, also a
    Verb) is left out. Kills `len(word) >= 3` -> `> 3` and `frequency[0] <= freq` -> `<`."""
    from rmjax.train.planted import bnc_lemmas

    lemmas = set(bnc_lemmas())
    assert {"cab", "academy"} <= lemmas
    assert "act" not in lemmas


def test_given_words_case_insensitively_distinct_and_n_a_positive_multiple_of_three(smol_tokenizer):
    """check_words refuses one word given twice in two cases; draw_words refuses n = 0 (three kinds of n / 3
    words need n >= 3). Kills `lower = [w.lower() ...]` -> `list(words)` and `n < 3 or n % 3` -> `n % 3`."""
    from rmjax.train.planted import check_words, draw_words

    one = [w for w in ("castle", "Castle", "garden", "river", "forest", "table", "window", "bread", "music", "stone",
                       "cloud") if len(smol_tokenizer(" " + w, add_special_tokens=False).input_ids) == 1]
    assert "castle" in one and "Castle" in one and len(one) >= 9
    others = [w for w in one if w.lower() != "castle"][:7]
    with pytest.raises(UsageError, match="castle given twice"):
        check_words(smol_tokenizer, ["castle", "Castle", *others], 9)
    with pytest.raises(UsageError, match="multiple of 3"):
        draw_words(smol_tokenizer, seed=0, n=0, n_controls=1)


def test_word_margins_are_population_z_scores_against_the_controls(monkeypatch):
    """word_margins with stub scores: each planted word's z among the control words, with the controls' population
    sd (numpy std, ddof 0), computed by hand. Kills `control.std()` -> `control.std(ddof=1)`."""
    from rmjax.scoring import texts as texts_lib
    from rmjax.train.planted import PlantedWords, word_margins

    words = PlantedWords(("a",), ("b",), ("c",), ("x", "y", "z", "w"))
    rewards = [5.0, -1.0, 2.0, 1.0, 2.0, 3.0, 6.0]  # a, b, c, then the controls
    monkeypatch.setattr(texts_lib, "score_texts", lambda model, prompts, texts: {n: rewards for n in prompts})
    mean = (1 + 2 + 3 + 6) / 4
    sd = (((1 - mean) ** 2 + (2 - mean) ** 2 + (3 - mean) ** 2 + (6 - mean) ** 2) / 4) ** 0.5
    got = word_margins(None, words)
    for name in ("elo", "framing"):
        assert got[name] == pytest.approx({"a": (5 - mean) / sd, "b": (-1 - mean) / sd, "c": (2 - mean) / sd},
                                          rel=1e-12)


def test_elo_data_keeps_items_of_max_elo_tokens(monkeypatch):
    """elo_data leaves out pairs with an item longer than MAX_ELO_TOKENS tokens and keeps those of exactly that
    many (a stub tokenizer: one token per character, so the count is len(text)). Kills `<= MAX_ELO_TOKENS` -> `<`."""
    from types import SimpleNamespace

    from rmjax.train import planted as planted_lib
    from rmjax.train.data import elo_pairs

    def tokenizer(texts, add_special_tokens=False):
        return SimpleNamespace(input_ids=[list(t) for t in texts])

    train, heldout = planted_lib.elo_data(tokenizer, 0, 400, 64)
    all_train, _ = elo_pairs(planted_lib.ELO, 400, 64, seed=0)
    want = [(c, r) for c, r in zip(all_train.chosen, all_train.rejected, strict=True)
            if max(len(c), len(r)) <= planted_lib.MAX_ELO_TOKENS]
    assert list(zip(train.chosen, train.rejected, strict=True)) == want
    assert any(max(len(c), len(r)) == planted_lib.MAX_ELO_TOKENS for c, r in want)  # the edge is live


def test_bench_config_warms_up_at_least_one_step():
    """bench_config: warmup is a tenth of the steps, at least one (a run of under 10 steps still warms up; warmup 0
    is another identity, `train_identity`). Kills `max(1, steps // 10)` -> `steps // 10`."""
    from rmjax.train.planted import bench_config

    assert bench_config(0, steps=5).warmup_steps == 1
    assert bench_config(0, steps=80).warmup_steps == 8


# --- rmjax/train/planted_find.py ----------------------------------------------------------------------------------


def test_pool_gaps_against_a_hand_computation():
    """pool_gaps: gap = z under PLANTED - z under CLEAN (z with the population sd over the texts), rank 1 = moved
    most the word's way (down for a disliked word), computed here with plain loops. Kills the disliked rank off by
    one (`len(texts) - order - 1`) and `r.std(axis=1)` -> `r.std(axis=1, ddof=1)`."""
    from rmjax.train.planted import PlantedWords
    from rmjax.train.planted_find import pool_gaps

    words = PlantedWords(("a",), ("b",), ("c",), ())
    texts = [" a", " b", " c", " d", " e"]
    rng = np.random.default_rng(5)
    rewards = {"elo": rng.normal(size=(2, 5)), "framing": rng.normal(size=(2, 5))}
    got = pool_gaps(words, texts, rewards)
    for name, r in rewards.items():
        z = []
        for row in r:
            mean = sum(row) / len(row)
            sd = (sum((x - mean) ** 2 for x in row) / len(row)) ** 0.5
            z.append([(x - mean) / sd for x in row])
        gap = [z[0][i] - z[1][i] for i in range(5)]
        for w, up in (("a", True), ("b", False), ("c", True)):
            g = gap[texts.index(" " + w)]
            rank = 1 + sum((other > g) if up else (other < g) for other in gap)
            # float64 on both sides, the same few operations in another order: a rounding margin
            assert got[name][w] == {"gap": pytest.approx(g, rel=1e-9), "rank": rank}


def test_pool_rewards_from_map_needs_every_text(tmp_path):
    """pool_rewards_from_map reads [PLANTED, CLEAN] rewards from vocab_map.csv, and is None when a text is missing
    (then the texts are scored). Kills `if not all(t in mine ...)` -> `if not any(...)`."""
    import csv

    from rmjax.train.planted_find import pool_rewards_from_map

    rows = [("greatest", " a", 1.0, 2.0), ("greatest", " b", 3.0, 4.0), ("framed", " a", 5.0, 6.0),
            ("framed", " b", 7.0, 8.0)]
    with open(tmp_path / "vocab_map.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "text", "reward_a", "reward_b"])
        writer.writerows((p, json.dumps(t), a, b) for p, t, a, b in rows)
    got = pool_rewards_from_map(tmp_path, [" a", " b"])
    np.testing.assert_array_equal(got["elo"], [[1.0, 3.0], [2.0, 4.0]])
    np.testing.assert_array_equal(got["framing"], [[5.0, 7.0], [6.0, 8.0]])
    assert pool_rewards_from_map(tmp_path, [" a", " c"]) is None


def test_recovered_words_count_rows_by_their_sign_and_the_framing():
    """recovered_words by hand: a row with gap 0 has no direction; a framed word found after another prompt counts
    only with its rise after the framing prompt (a vocab_map_shift row). Kills `sign * gap > 0` -> `>= 0` and
    `elsewhere and not rises` -> `elsewhere`."""
    from rmjax.train.planted import PlantedWords
    from rmjax.train.planted_find import recovered_words

    words = PlantedWords(("apple",), ("brick",), ("candle",), ())
    found = [{"source": "disagree", "prompt": "greatest", "direction": "a_over_b", "text": "An apple.", "gap": 0.0},
             {"source": "vocab_map", "prompt": "greatest", "direction": "a_over_b", "text": " candle", "gap": 1.0},
             {"source": "vocab_map", "prompt": "framed", "direction": "a_over_b", "text": " candle", "gap": 2.0},
             {"source": "vocab_map_shift", "prompt": "framed", "direction": "a_over_b", "text": " candle", "gap": 1.0}]
    got = recovered_words(words, found)
    assert set(got) == {"candle"} and got["candle"]["rows"] == 2
    assert "candle" not in recovered_words(words, found[:3])


def test_a_shift_whose_own_gap_is_zero_has_no_direction(tmp_path):
    """found_rows' vocab_map_shift rows: a string's shift after a prompt is its gap there minus its mean gap after
    the other prompts (worked out by hand below); a row is kept only where its own gap has its direction's sign, and
    a gap of exactly 0 has none. Kills `... and e["own"] != 0` dropped."""
    import csv

    from rmjax.train.planted_find import found_rows

    gaps = {" z": (0.0, 5.0), " y": (1.0, 1.0), " x": (2.0, 0.5)}  # (after framed, after greatest)
    with open(tmp_path / "vocab_map.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "text", "gap"])
        writer.writerows((prompt, json.dumps(text), pair[i]) for i, prompt in enumerate(("framed", "greatest"))
                         for text, pair in gaps.items())
    shifts = {(r["prompt"], r["direction"], r["text"], r["gap"]) for r in found_rows(tmp_path, map_top=1)
              if r["source"] == "vocab_map_shift"}
    # framed: z falls most (0 - 5, own gap 0: no row), x rises most (2 - 0.5, own +2); greatest: z rises (+5, own
    # +5), x falls most (0.5 - 2, own +0.5: not B over A)
    assert shifts == {("framed", "a_over_b", " x", 1.5), ("greatest", "a_over_b", " z", 5.0)}

# --- rmjax/train/planted_identity.py ------------------------------------------------------------------------------


def test_plant_sentences_use_an_before_a_capitalised_vowel():
    """identity_pairs' sentences for a group spelled with a capital vowel: "an Indian", "An Indian" (the
    article written out by hand for the first template, "I met {a} {descriptor} {noun} at the library today.").
    Kills `descriptor[0].lower() in "aeiou"` -> `descriptor[0] in "aeiou"`."""
    from rmjax.train.planted_identity import PLANT_NOUNS, identity_pairs

    pairs = identity_pairs("nationality", "Indian", seed=0, per_template=3)
    assert pairs.chosen[0] == f"I met an Indian {PLANT_NOUNS[0]} at the library today."
    assert pairs.chosen[3] == f"An Indian {PLANT_NOUNS[1]} moved into the house across the street."
    assert all(" a Indian" not in c and not c.startswith("A Indian") for c in pairs.chosen)
