"""The audit in the TPU plan: its conversations sized as the job scores them. Before, `experiments.plan` had no audit
job, and the TPU launcher created an audit's VM unplanned."""

from __future__ import annotations

import numpy as np

from rmjax.audit.job import AuditSpec, run_audit
from rmjax.plan.spec import plan_inputs
from rmjax.scoring import calls, texts
from tests import inproc

SMALL = dict(n_boot=400, n_perm=400, batch_size=256)


def test_the_plan_sizes_the_conversations_the_audit_scores(rm_folder, tmp_path, monkeypatch):
    """The tiny RM's audit of framing and length, its scoring watched (spies on the prefill and the two reward
    calls score_conversations makes): the prompts it prefills and their longest prefix, the conversations it scores
    whole and the longest of them, and the most responses after one prefix and the longest such tail, against the
    plan's shape for the same batteries and batch."""
    prefixes, whole, after = [], [], []
    real_prefill, real_rewards, real_after = texts.prefill_prefix, calls.rewards, calls.rewards_after

    def prefill(model, ids):
        prefixes.append(len(ids))
        after.append([])
        return real_prefill(model, ids)

    def rewards(model, ids, mask):
        whole.extend(int(n) for n in np.asarray(mask).sum(1) if n)
        return real_rewards(model, ids, mask)

    def rewards_after(model, cache, ids, mask):
        after[-1].extend(int(n) for n in np.asarray(mask).sum(1) if n)
        return real_after(model, cache, ids, mask)

    monkeypatch.setattr(texts, "prefill_prefix", prefill)
    monkeypatch.setattr(calls, "rewards", rewards)
    monkeypatch.setattr(calls, "rewards_after", rewards_after)
    run_audit(AuditSpec(inproc.options(rm_folder, tmp_path / "audit"), batteries=("framing", "length"), **SMALL))
    _, _, shape, _ = plan_inputs(str(rm_folder), "v5e-1", "audit", batteries=("framing", "length"), batch_size=256)
    assert shape.prompts == len(prefixes) > 0 and shape.prefix_tokens == max(prefixes)
    assert shape.whole_texts == len(whole) > 0 and shape.whole_tokens == max(whole)
    assert shape.texts == max(len(rows) for rows in after)
    assert shape.text_tokens + shape.suffix_tokens == max(n for rows in after for n in rows)
    assert shape.batch_size == 256
    # its calls: the prefills, the texts after them, and the whole conversations at their longest (4-token buckets)
    import jax

    from rmjax.loading import config_of

    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:1]).reshape(1, 1), ("data", "model"))
    planned = {c.name: c for c in shape.calls(config_of(str(rm_folder)), "float32", mesh, 256)}
    assert list(planned) == ["prefill", "score_texts", "score_whole"]
    assert planned["prefill"].count == len(prefixes)
    assert planned["score_whole"].args[1].shape[1] == -(-max(whole) // 4) * 4
    assert planned["score_whole"].count * planned["score_whole"].args[1].shape[0] >= len(whole)  # every one, planned


def test_the_default_audit_plan_counts_each_distinct_conversation_once():
    """The default batteries share conversations (the name axes: 936 of identity's 5,304), which the audit scores
    once: the plan's whole conversations are those of prompts with fewer than CACHED_PROMPT_ROWS distinct responses,
    counted here from the built batteries by brute force."""
    import collections

    from rmjax.audit import batteries as battery_lib
    from rmjax.scoring.texts import CACHED_PROMPT_ROWS

    _, _, shape, _ = plan_inputs("S-Gem-27B-v0.2", "v5e-8", "audit")
    pairs = {(v.prompt, v.response) for b in battery_lib.build() for v in b.variants}
    per_prompt = collections.Counter(prompt for prompt, _ in pairs)
    assert shape.whole_texts == sum(n for n in per_prompt.values() if n < CACHED_PROMPT_ROWS)
    assert shape.prompts == sum(n >= CACHED_PROMPT_ROWS for n in per_prompt.values())
    assert shape.texts == max(per_prompt.values())


def test_the_audit_plan_without_a_tokenizer_plans_no_shorter_conversations_than_two_real_tokenizers():
    """A zoo model's plan reads no tokenizer and estimates each conversation (3 characters a token and a template's
    markers): for the two builtin tokenizers (SmolLM2's chat template with its default system turn, Gemma 3's) and
    plain text, the estimate plans the same conversations, none shorter than measured, and a prefix cache as wide
    (its PREFIX_BUCKET) as the measured one."""
    from rmjax.plan.spec import _audit_shape, model_config
    from rmjax.scoring.prefix import PREFIX_BUCKET

    def bucket(n):
        return -(-n // PREFIX_BUCKET) * PREFIX_BUCKET

    for name in ("elo-rm-smollm2-135m", "elo-rm-gemma3-270m"):
        cfg, tokenizer = model_config(name)
        for template in ("auto", "plain"):
            measured = _audit_shape(cfg, tokenizer, template, None, 0)
            estimated = _audit_shape(cfg, None, template, None, 0)
            assert (estimated.prompts, estimated.texts, estimated.whole_texts) == (
                measured.prompts, measured.texts, measured.whole_texts), (name, template)
            assert estimated.whole_tokens >= measured.whole_tokens, (name, template)
            longest = [s.prefix_tokens + s.text_tokens + s.suffix_tokens for s in (estimated, measured)]
            assert longest[0] >= longest[1] and bucket(estimated.prefix_tokens) >= bucket(measured.prefix_tokens)
