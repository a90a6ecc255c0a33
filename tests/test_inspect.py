"""Inside the reward model (issue 15): reward lens, direct contributions, per-token curve, attribution and
patching, each against an independent reference (transformers hidden states and hooks, full forwards)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

from rmjax.inspect.attribution import attribute
from rmjax.inspect.lens import reward_lens, token_rewards
from rmjax.inspect.patching import patching_map
from rmjax.loading import load
from rmjax.parallel import batching
from tests import jitted as M
from tests import tiny, tolerance

SEQUENCES = [[2, 17, 33, 5, 60, 9, 11], [2, 40, 41, 42, 43]]
FAMILIES = ("llama3", "gemma", "gemma2", "gemma3")


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            hf = tiny.build_hf_model(name, num_labels=2, seed=3)
            folder = tiny.save_hf_model(hf, tmp_path_factory.mktemp(name))
            cache[name] = (hf, load(str(folder), require_tokenizer=False))
        return cache[name]

    return get


def _reward(model, ids) -> np.ndarray:
    ids = np.asarray([ids], np.int32)
    return np.asarray(M.rewards(model.params, model.config, ids, np.ones_like(ids, bool)))[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_lens_equals_transformers_hidden_states_through_norm_and_head(family, name):
    """Gemma 2's soft caps and Gemma 3's sandwich norms included; the last row is the reward, and the direct
    contributions of a linear head sum to it."""
    hf, model = family(name)
    lens = reward_lens(model, SEQUENCES)
    # every lens row is the final norm and the head on some residual: the float32 bound for any input
    atol = tolerance.any_rewards_atol(model.params, model.config, max(map(len, SEQUENCES)))
    for b, seq in enumerate(SEQUENCES):
        with torch.no_grad():
            states = hf.model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
            reward = hf(input_ids=torch.tensor([seq])).logits[0].numpy()
        layers = len(states) - 1  # transformers' last entry is already final-normed
        for layer in range(layers):
            with torch.no_grad():
                want = hf.score(hf.model.norm(states[layer][0, -1])).numpy()
            np.testing.assert_allclose(lens.lens[layer, b], want, atol=atol, rtol=0)
        np.testing.assert_allclose(lens.lens[-1, b], reward, atol=atol, rtol=0)
        np.testing.assert_allclose(lens.reward[b], reward, atol=atol, rtol=0)
    np.testing.assert_allclose(lens.total, lens.reward, atol=tolerance.contributions_atol(model.params, model.config,
                                                                                          SEQUENCES), rtol=0)
    assert lens.attention.shape == lens.mlp.shape == (model.config.num_layers, 2, 2)


@pytest.mark.parametrize("name", ["llama3", "gemma3"])
def test_token_curve_equals_a_full_forward_per_prefix(family, name):
    _, model = family(name)
    curves = token_rewards(model, SEQUENCES)
    for seq, curve in zip(SEQUENCES, curves, strict=True):
        want = np.stack([_reward(model, seq[: j + 1]) for j in range(len(seq))])
        atol = max(tolerance.rewards_atol(model.params, model.config, [seq[: j + 1]]) for j in range(len(seq)))
        np.testing.assert_allclose(curve, want, atol=atol, rtol=0)


@pytest.mark.parametrize("name", ["llama3", "gemma2", "gemma3"])
def test_integrated_gradients_are_complete_at_64_steps(family, name):
    _, model = family(name)

    class PadTokenizer:
        pad_token_id = 0

    # a copy: the module-scoped model is shared by tests that run in any order (pytest-xdist)
    model = dataclasses.replace(model, tokenizer=PadTokenizer())
    attr = attribute(model, SEQUENCES[0], steps=64, batch_size=16, baseline="pad")
    assert attr.reward == pytest.approx(_reward(model, SEQUENCES[0])[0],
                                        abs=tolerance.rewards_atol(model.params, model.config, [SEQUENCES[0]]))
    assert attr.relative_gap < 0.01, attr.completeness_gap
    assert attr.integrated_gradients.shape == attr.grad_x_input.shape == (len(SEQUENCES[0]),)


def test_adaptive_path_integral_resolves_a_cliff_that_uniform_steps_miss():
    """A path like the real RMs' (issue 21): a cliff 0.004 wide at α = 0.28 on a smooth swing. Uniform Simpson on
    65 points misses it by far; the adaptive panels add up within the tolerance, and each part's integral (a
    token's IG) is the same weighted sum, close to its exact value."""
    from rmjax.inspect.attribution import integrate_path

    def f(a):  # two parts (tokens): a cliff and a smooth swing
        return np.stack([-4 * np.tanh((a - 0.2803) / 0.001), 3 * np.sin(7 * a)], -1)

    def df(a):
        return np.stack([-4 / 0.001 * (1 - np.tanh((a - 0.2803) / 0.001) ** 2), 21 * np.cos(7 * a)], -1)

    calls = []

    def evaluate(alphas):
        calls.append(len(alphas))
        a = np.asarray(alphas, np.float64)
        return f(a).sum(-1), df(a)

    exact = f(np.float64(1.0)) - f(np.float64(0.0))
    uniform = integrate_path(evaluate, steps=64, tolerance=0.05, max_evaluations=65, per_round=16)
    assert abs(uniform.integral.sum() - exact.sum()) > 0.5 * abs(exact.sum())  # the cliff falls between nodes
    calls.clear()
    path = integrate_path(evaluate, steps=64, tolerance=0.05, max_evaluations=1024, per_round=16)
    assert abs(path.integral.sum() - exact.sum()) <= 0.05 * abs(exact.sum())
    assert np.abs(path.panel_errors).sum() <= 0.05 * abs(exact.sum())
    np.testing.assert_allclose(path.integral, exact, rtol=0.02)
    assert path.integral.sum() - exact.sum() == pytest.approx(path.panel_errors.sum(), abs=1e-9)
    assert len(path.alphas) == sum(calls) < 400 and set(calls[1:]) == {16}  # rounds of one batch shape
    assert path.alphas[0] == 0 and path.alphas[-1] == 1 and np.all(np.diff(path.alphas) > 0)
    for budget in (66, 67, 100):  # a round that would split more panels than the budget leaves splits fewer
        capped = integrate_path(evaluate, steps=64, tolerance=0.05, max_evaluations=budget, per_round=64)
        assert len(capped.alphas) == budget - (budget - 65) % 2  # two nodes a split, never past the budget


def test_a_jump_no_panel_resolves_stops_at_the_narrowest_panel():
    """f jumps at α = 0.3 with f' = 0 everywhere: no split removes the error, so refinement stops once the panel
    holding the jump is MIN_PANEL wide (eleven halvings of a starting panel, 1/32), far short of the budget."""
    from rmjax.inspect.attribution import MIN_PANEL, integrate_path

    def evaluate(alphas):
        a = np.asarray(alphas, np.float64)
        return (a > 0.3).astype(np.float64), np.zeros((len(a), 1))

    path = integrate_path(evaluate, steps=64, tolerance=0.05, max_evaluations=4096, per_round=2)
    widths = path.panels[:, 2] - path.panels[:, 0]
    assert widths.min() == MIN_PANEL and len(path.alphas) == 65 + 2 * 11
    assert path.integral.sum() == 0 and abs(path.panel_errors.sum()) == 1  # the jump is unresolved, and said so


def test_without_a_narrowest_panel_a_jump_stops_where_float64_has_no_point_between(monkeypatch):
    """The same jump with MIN_PANEL 0: halving the panel holding α = 0.3 reaches float64's resolution (a midpoint
    equal to an end), where a round would add no node; refinement stops there, not once the budget is spent."""
    from rmjax.inspect import attribution

    monkeypatch.setattr(attribution, "MIN_PANEL", 0.0)
    calls = []

    def evaluate(alphas):
        calls.append(len(alphas))
        assert len(calls) < 500, "refinement did not stop"
        a = np.asarray(alphas, np.float64)
        return (a > 0.3).astype(np.float64), np.zeros((len(a), 1))

    path = attribution.integrate_path(evaluate, steps=64, tolerance=0.05, max_evaluations=4096, per_round=2)
    widths = path.panels[:, 2] - path.panels[:, 0]
    assert 0 < widths.min() <= 2 * np.spacing(0.3) and len(path.alphas) == 65 + sum(calls[1:]) < 300
    assert len(set(path.alphas.tolist())) == len(path.alphas) and abs(path.panel_errors.sum()) == 1


def test_gradient_times_input_equals_torch_autograd(family):
    hf, model = family("llama3")
    # gradient × input does not depend on the path's baseline; "zero" needs no pad token in the tokenizer
    attr = attribute(model, SEQUENCES[0], steps=2, batch_size=2, baseline="zero")
    embeds = hf.model.embed_tokens.weight[torch.tensor(SEQUENCES[0])].detach().clone().requires_grad_()
    hf(inputs_embeds=embeds[None]).logits[0, 0].backward()
    want = (embeds * embeds.grad).sum(-1).detach().numpy()
    # a gradient (a backward chain) whose last inner product runs over the hidden size (tests/tolerance.py)
    atol = tolerance.grad_atol(want, model.config, len(SEQUENCES[0]), model.config.hidden_size)
    np.testing.assert_allclose(attr.grad_x_input, want, atol=atol, rtol=0)


@pytest.mark.parametrize("name", ["llama3", "gemma2"])
def test_patching_itself_changes_nothing_and_the_last_residual_gives_the_donor(family, name):
    _, model = family(name)
    clean, donor = SEQUENCES[0], [*SEQUENCES[0][:-1], 44]
    atol = tolerance.any_rewards_atol(model.params, model.config, len(clean))  # a patched run is some input
    same = patching_map(model, clean, clean, batch_size=16, skip_shared=False)
    for values in same.maps.values():
        np.testing.assert_allclose(values, _reward(model, clean)[0], atol=atol, rtol=0)
    pm = patching_map(model, clean, donor, batch_size=16, skip_shared=False)
    assert pm.clean_reward == pytest.approx(_reward(model, clean)[0], abs=atol)
    shortcut = patching_map(model, clean, donor, batch_size=16)  # positions before the difference are filled in
    for name, values in pm.maps.items():
        np.testing.assert_allclose(shortcut.maps[name], values, atol=atol, rtol=0)
    assert pm.donor_reward == pytest.approx(_reward(model, donor)[0], abs=atol)
    # only the last position differs: patching it after any layer gives the donor's reward, elsewhere the clean one
    np.testing.assert_allclose(pm.maps["residual"][:, -1], _reward(model, donor)[0], atol=atol, rtol=0)
    np.testing.assert_allclose(pm.maps["residual"][:, :-1], _reward(model, clean)[0], atol=atol, rtol=0)


def test_patching_one_layer_equals_a_transformers_hook(family):
    """Residual after layer 1 at position 3, attention write of layer 2 at position 5, MLP write of layer 0 at
    position 4: a forward hook in transformers doing the same replacement gives the same reward."""
    hf, model = family("llama3")
    clean, donor = SEQUENCES[0], [2, 50, 51, 52, 53, 54, 55]
    pm = patching_map(model, clean, donor, batch_size=16)
    with torch.no_grad():
        states = hf.model(input_ids=torch.tensor([donor]), output_hidden_states=True).hidden_states
        captured = {}
        grabs = [hf.model.layers[2].self_attn.register_forward_hook(lambda m, i, o: captured.update(attn=o[0])),
                 hf.model.layers[0].mlp.register_forward_hook(lambda m, i, o: captured.update(mlp=o.clone()))]
        hf(input_ids=torch.tensor([donor]))
        for grab in grabs:
            grab.remove()

        def put_residual(module, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            hidden[0, 3] = states[2][0, 3]  # hidden_states[2] is the residual after layer 1
            return output

        hook = hf.model.layers[1].register_forward_hook(put_residual)
        want_residual = hf(input_ids=torch.tensor([clean])).logits[0, 0].item()
        hook.remove()

        def put_attention(module, inputs, output):
            output[0][0, 5] = captured["attn"][0, 5]
            return output

        hook = hf.model.layers[2].self_attn.register_forward_hook(put_attention)
        want_attention = hf(input_ids=torch.tensor([clean])).logits[0, 0].item()
        hook.remove()

        def put_mlp(module, inputs, output):
            output[0, 4] = captured["mlp"][0, 4]
            return output

        hook = hf.model.layers[0].mlp.register_forward_hook(put_mlp)
        want_mlp = hf(input_ids=torch.tensor([clean])).logits[0, 0].item()
        hook.remove()
    atol = tolerance.any_rewards_atol(model.params, model.config, len(clean))  # a patched run is some input
    assert pm.maps["residual"][2, 3] == pytest.approx(want_residual, abs=atol)  # row 0 is the embeddings
    assert pm.maps["attention"][2, 5] == pytest.approx(want_attention, abs=atol)
    assert pm.maps["mlp"][0, 4] == pytest.approx(want_mlp, abs=atol)
    for want in (want_residual, want_attention, want_mlp):  # each patch matters, so the test can tell
        assert abs(want - pm.clean_reward) > 4 * atol


def test_a_gated_head_goes_through_the_lens_with_its_gate(tmp_path):
    from rmjax.loading.hf import load_hf_model_folder
    from tests.test_heads import KINDS, LLAMA_VOCAB, Reference

    backbone, arch, extra = KINDS["armo"]
    ref = Reference("armo", backbone, extra, LLAMA_VOCAB)
    model = load_hf_model_folder(ref.save(tmp_path / "armo", arch), require_tokenizer=False)
    seq = [5, 9, 14, 3, *ref.pattern(), 11, 40]
    lens = reward_lens(model, [seq])
    ids = np.asarray([seq], np.int32)
    want = ref(ids, np.ones_like(ids, bool))[0]
    np.testing.assert_allclose(lens.lens[-1, 0], want, atol=tolerance.rewards_atol(model.params, model.config, ids),
                               rtol=0)
    assert np.isfinite(lens.explained).all() and lens.lens.shape[0] == model.config.num_layers + 1


def test_a_gated_heads_token_curve_gates_each_cut_on_its_own_pattern(tmp_path):
    """Each prefix's gate is the pattern's last occurrence inside it, as the published code reads it from the cut
    conversation; a cut before any has no gate (the score NaN, as scoring gives). The curve used the whole
    conversation's gate at every position (fault hunt)."""
    from rmjax.loading.hf import load_hf_model_folder
    from tests.test_heads import KINDS, LLAMA_VOCAB, Reference

    backbone, arch, extra = KINDS["armo"]
    ref = Reference("armo", backbone, extra, LLAMA_VOCAB)
    model = load_hf_model_folder(ref.save(tmp_path / "armo", arch), require_tokenizer=False)
    pattern = ref.pattern()
    seq = [5, 9, 14, *pattern, 11, 40, *pattern, 12, 8]
    (curve,) = token_rewards(model, [seq])
    first = len(pattern) + 2  # the first cut that holds the pattern ends with its last token
    for j in range(len(seq)):
        cut = np.asarray([seq[: j + 1]], np.int32)
        if j < first:
            assert np.isnan(curve[j, 0]) and np.isfinite(curve[j, 1:]).all(), j
            continue
        want = ref(cut, np.ones_like(cut, bool))[0]
        np.testing.assert_allclose(curve[j], want, atol=tolerance.rewards_atol(model.params, model.config, cut),
                                   rtol=0, err_msg=str(j))


def test_the_inspect_job_writes_a_gated_heads_prefixes_before_its_pattern_as_no_value(tmp_path):
    """On a real chat template (SmolLM2's) with the gate pattern at the prompt's end: the prompt's cuts have no
    score, written as NaN ("no value"), where refusing them as non-finite would have stopped every gated inspect."""
    import shutil

    import pandas as pd
    import transformers

    from rmjax.inspect.job import InspectSpec, run_inspect
    from rmjax.inspect.lens import gated_from
    from rmjax.runs.options import RunOptions
    from tests.test_heads import KINDS, Reference

    src = tiny.smollm2_tokenizer_folder()
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    pattern = tok("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).input_ids
    ref = Reference("armo", "llama3", dict(KINDS["armo"][2], gating_token_pattern=pattern), 49152, seed=4)
    folder = ref.save(tmp_path / "armo", KINDS["armo"][1])
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).is_file():
            shutil.copy(src / f, folder / f)
    out = tmp_path / "inspect"
    run_inspect(InspectSpec(RunOptions(model=str(folder), out=str(out)), ("p", "Name a fruit."),
                            responses=("an apple",), steps=2, max_evaluations=3, tolerance=10.0))
    curve = pd.read_csv(out / "token_rewards.csv", keep_default_na=False, na_values=["nan"])  # as written
    ids = curve.token_id.tolist()
    first = gated_from(load(str(folder)), ids)
    assert ids[first - len(pattern) + 1: first + 1] == pattern and 0 < first < len(ids) - 1
    assert curve.reward.iloc[:first].isna().all() and np.isfinite(curve.reward.iloc[first:]).all()
    for j in (first, len(ids) - 1):
        cut = np.asarray([ids[: j + 1]], np.int32)
        assert curve.reward.iloc[j] == pytest.approx(ref(cut, np.ones_like(cut, bool))[0, 0], abs=1e-4)


def test_inspect_entry_point_from_a_sweep(rm_folder, tmp_path):
    """The CLI writes its four tables, three figures and .meta.json; --from_sweep inspects the best and worst
    tokens (patching the worst into the best: same length), the lens's last row equal to the sweep's scores."""
    import json

    import pandas as pd

    from rmjax.runs import results
    from rmjax.search.sweep import sweep
    from rmjax.text import chat
    from tests import cli

    model = load(str(rm_folder))
    scores = tmp_path / "scores.csv"
    sweep(model, {"greatest": "What, in one word, is the greatest thing ever?"}, list(range(1000, 1040)), out=scores)
    out = tmp_path / "inspect"
    proc = cli.ok(cli.run("inspect", f"--model={rm_folder}", "--prompts=greatest", f"--from_sweep={scores}",
                          "--top=1", "--steps=8", "--ig_tolerance=0", "--ig_max_evaluations=9", f"--out={out}"))
    assert "IG completeness gap" in proc.stdout
    # no gap is within a tolerance of 0, and 9 evaluations leave no room to refine: said loudly, and recorded
    assert "WARNING: integrated gradients of" in proc.stdout and "do not add up" in proc.stderr
    assert "asks for an exact sum" in proc.stderr and "larger --ig_max_evaluations" not in proc.stderr  # no cap meets 0
    meta = json.loads((out / "reward_lens.csv.meta.json").read_text())
    assert meta["summary"]["ig_evaluations"] == [9, 9] and len(meta["summary"]["ig_warnings"]) == 2
    assert meta["ig_tolerance"] == 0 and meta["ig_max_evaluations"] == 9
    for name in ("reward_lens.csv", "token_rewards.csv", "attribution.csv", "patching.csv", "lens.png",
                 "attribution.png", "patching.png", "reward_lens.csv.meta.json"):
        assert (out / name).is_file(), name
    df = results.read_scores_csv(scores).sort_values("greatest", kind="stable")
    best, worst = int(df.token_id.iloc[-1]), int(df.token_id.iloc[0])
    lens = pd.read_csv(out / "reward_lens.csv", keep_default_na=False)
    last = lens[(lens.component == "lens") & (lens.layer == model.config.num_layers)]
    split = chat.split_chat(model.tokenizer, "What, in one word, is the greatest thing ever?")
    full = [split.ids_with([best]), split.ids_with([worst])]
    atol = max(tolerance.rewards_atol(model.params, model.config, [ids]) for ids in full)
    np.testing.assert_allclose(last.reward.to_numpy(), [df.greatest.iloc[-1], df.greatest.iloc[0]], atol=atol, rtol=0)
    patch = pd.read_csv(out / "patching.csv", keep_default_na=False)
    assert set(patch.component) == {"residual", "attention", "mlp"}
    # one layer numbering in both files (issue 45: patching.csv counted blocks from 0, reward_lens.csv from 1)
    n = model.config.num_layers
    for table in (patch, lens):
        blocks = table[table.component.isin(["attention", "mlp"])]
        assert set(blocks.layer) == set(range(1, n + 1))
    assert set(patch[patch.component == "residual"].layer) == set(range(n + 1))
    assert set(patch.clean) == {model.tokenizer.decode([best])}
    assert set(patch.donor) == {model.tokenizer.decode([worst])}
    # in_response marked the template's end of turn after the response too (<|im_end|>, its newline)
    tokens = pd.read_csv(out / "token_rewards.csv", keep_default_na=False)
    for token in (best, worst):
        rows = tokens[tokens.response == model.tokenizer.decode([token])]
        assert rows[rows.in_response == 1].token_id.tolist() == [token]
        assert rows.position.max() == len(split.ids_with([token])) - 1  # every position listed
    (out / "lens.png").unlink()  # reused without it: the closing line said it wrote lens.png
    prompts, responses, reused = cli.run_each(  # in one interpreter (tests.cli.run_each)
        ("inspect", f"--model={rm_folder}", "--prompts=greatest,worst", "--responses=a", f"--out={tmp_path / 'x'}"),
        ("inspect", f"--model={rm_folder}", f"--out={tmp_path / 'x'}"),
        ("inspect", f"--model={rm_folder}", "--prompts=greatest", f"--from_sweep={scores}", "--top=1", "--steps=8",
         "--ig_tolerance=0", "--ig_max_evaluations=9", f"--out={out}"))
    cli.user_error(prompts, "one prompt")
    cli.user_error(responses, "--responses")
    said = cli.ok(reused).stdout
    # (helper-145: it said "wrote" for a result it only read back)
    assert f"results in {out}: reward_lens.csv, token_rewards.csv, attribution.csv, patching.csv, attribution.png" \
        in said and "wrote" not in said, said
    assert "(lens.png missing: rerun with --overwrite" in said


def test_mesh_and_bfloat16_run_the_same_reads(rm_folder):
    """On a data x model mesh the lens, curve, attribution and patching equal one device's; in bfloat16 the lens
    stays close to float32."""
    from rmjax.parallel.sharding import make_mesh

    seqs = [[1, 504, 3180, 2, 17, 40], [1, 9, 13, 2, 17, 41]]
    one = load(str(rm_folder))
    mesh = load(str(rm_folder), mesh=make_mesh("data:4,model:2"))
    a, b = reward_lens(one, seqs), reward_lens(mesh, seqs)
    # the mesh's partial sums round differently: the float32 bounds of tests/tolerance.py
    atol = tolerance.any_rewards_atol(one.params, one.config, 6)
    np.testing.assert_allclose(b.lens, a.lens, atol=atol, rtol=0)
    np.testing.assert_allclose(b.mlp, a.mlp, atol=tolerance.contributions_atol(one.params, one.config, seqs), rtol=0)
    np.testing.assert_allclose(token_rewards(mesh, seqs)[0], token_rewards(one, seqs)[0], atol=atol, rtol=0)
    ig = attribute(one, seqs[0], steps=4, batch_size=4).integrated_gradients
    np.testing.assert_allclose(attribute(mesh, seqs[0], steps=4, batch_size=4).integrated_gradients, ig,
                               atol=tolerance.grad_atol(ig, one.config, 6, one.config.hidden_size), rtol=0)
    np.testing.assert_allclose(patching_map(mesh, *seqs, batch_size=16).maps["residual"],
                               patching_map(one, *seqs, batch_size=16).maps["residual"], atol=atol, rtol=0)
    half_model = load(str(rm_folder), dtype="bfloat16")
    half = reward_lens(half_model, seqs)
    # bf16 rounds each stored weight and activation once (u = 2^-8, the same on any IEEE CPU; tests/tolerance.py):
    # measured 2% of the scale
    np.testing.assert_allclose(half.lens, a.lens, atol=0.05 * np.abs(a.lens).max(), rtol=0)
    # its last layer is the bfloat16 model's reward: the forward's own hidden state through the float32 head (a
    # residual normed in float32, or a norm fused into the head, read 1.7e-3 and 5.6e-4 off it). Two float32 sums of
    # the head's products differ by far less than the float32 bound of a whole forward
    ids, mask = batching.pad_rows(seqs, pad_id=0)
    np.testing.assert_allclose(half.lens[-1], np.asarray(M.rewards(half_model.params, half_model.config, ids, mask)),
                               atol=tolerance.any_rewards_atol(one.params, one.config, 6), rtol=0)
    with warnings.catch_warnings():  # the path's float32 points cast to bfloat16 silently warned (an error in a
        warnings.simplefilter("error", FutureWarning)  # later jax): seen on a GPU run in bfloat16
        half_ig = attribute(half_model, seqs[0], steps=4, batch_size=4).integrated_gradients
    # the same rounding as the lens, through a gradient: measured 0.4% of the scale
    np.testing.assert_allclose(half_ig, ig, atol=0.05 * np.abs(ig).max(), rtol=0)


def test_best_and_worst_of_beam_and_gcg_results(tmp_path):
    from rmjax.inspect import job
    from rmjax.runs import results

    def best_and_worst(path, *args, **kwargs):  # as inspect --from_beam reads it
        return job.best_and_worst(path, *args, **{"flag": "--from_beam", **kwargs})

    beam = tmp_path / "beam.csv"
    results.write_table(beam, {"depth": [1, 1, 2, 2, 2, 2], "direction": ["optimal", "pessimal"] + ["optimal"] * 2
                               + ["pessimal"] * 2, "rank": [1, 1, 1, 2, 1, 2],
                               "ids": ["5", "6", "1 2", "3 4", "7 8", "9 9"], "tokens": ["[]"] * 6,
                               "decoded": ['""'] * 6}, {"p": np.asarray([5.0, 0.0, 4.0, 3.0, 0.0, 1.0])})
    results.write_meta(beam, kind="beam")
    assert best_and_worst(beam, "p", 1) == [(1, 2), (7, 8)]  # the deepest level: best optimal, worst pessimal
    assert best_and_worst(beam, "p", 2) == [(1, 2), (3, 4), (9, 9), (7, 8)]
    assert best_and_worst(beam, "p", 1, depth=1) == [(5,), (6,)]
    # a beam over two prompts ranks by their mean: the inspected prompt's best and worst are by its own column (its
    # rank 1 was taken, and the patching map's clean run was not this prompt's best)
    two = tmp_path / "two.csv"
    results.write_table(two, {"depth": [1] * 6, "direction": ["optimal"] * 3 + ["pessimal"] * 3,
                              "rank": [1, 2, 3, 1, 2, 3], "ids": ["1", "2", "3", "4", "5", "6"], "tokens": ["[]"] * 6,
                              "decoded": ['""'] * 6},
                        {"p": np.asarray([1.0, 3.0, 2.0, -1.0, -3.0, -2.0]), "q": np.asarray([5.0, 0, 0, -5, 0, 0])})
    results.write_meta(two, kind="beam")
    assert best_and_worst(two, "p", 1) == [(2,), (5,)] and best_and_worst(two, "q", 1) == [(1,), (4,)]
    assert best_and_worst(two, "p", 3) == [(2,), (3,), (1,), (4,), (6,), (5,)]
    # one direction only: a pessimal beam's least and most pessimal (it was refused: "use a smaller --top")
    pessimal = tmp_path / "pessimal.csv"
    results.write_table(pessimal, {"depth": [2, 2, 2], "direction": ["pessimal"] * 3, "rank": [1, 2, 3],
                                   "ids": ["7 8", "9 9", "4 4"], "tokens": ["[]"] * 3, "decoded": ['""'] * 3},
                        {"p": np.arange(3.0)})
    results.write_meta(pessimal, kind="beam")
    assert best_and_worst(pessimal, "p", 1) == [(4, 4), (7, 8)]
    # a NaN reward (a sweep or beam written with --allow_nonfinite) sorted last: it was inspected as the worst
    from rmjax.runs import finiteness

    nan_beam, sweep = tmp_path / "nan_beam.csv", tmp_path / "sweep.csv"
    with finiteness.nonfinite_allowed(True, has_flag=True):
        results.write_table(nan_beam, {"depth": [1] * 4, "direction": ["optimal"] * 2 + ["pessimal"] * 2,
                                       "rank": [1, 2, 1, 2], "ids": ["1", "2", "3", "4"], "tokens": ["[]"] * 4,
                                       "decoded": ['""'] * 4}, {"p": np.asarray([2.0, 1.0, -1.0, np.nan])})
        results.write_scores_csv(sweep, np.arange(5), list("abcde"), list("abcde"),
                                 {"p": np.asarray([0.5, np.nan, 2.0, -1.0, 1.0])})
    results.write_meta(nan_beam, kind="beam")
    assert best_and_worst(nan_beam, "p", 1) == [(1,), (3,)]
    results.write_meta(sweep, kind="sweep")
    assert job.best_and_worst(sweep, "p", 2, flag="--from_sweep") == [(2,), (4,), (0,), (3,)]
    gcg = tmp_path / "gcg.json"
    gcg.write_text('{"buffer": [{"ids": [3, 4], "reward": 1.0}, {"ids": [5, 6], "reward": 0.5}]}')
    results.write_meta(gcg, kind="gcg")
    assert best_and_worst(gcg, "p", 1) == [(3, 4), (5, 6)]
    from rmjax.errors import UsageError

    # a pessimal buffer (lowest reward first): its best is its last, as a pessimal beam's
    pessimal_gcg = tmp_path / "pessimal_gcg.json"
    pessimal_gcg.write_text('{"buffer": [{"ids": [3, 4], "reward": -2.0}, {"ids": [5, 6], "reward": -1.0}, '
                            '{"ids": [7, 7], "reward": -0.5}]}')
    results.write_meta(pessimal_gcg, kind="gcg", identity={"prompts": {"p": "x"}, "models": [{}]})
    assert best_and_worst(pessimal_gcg, "p", 1) == [(5, 6), (3, 4)]
    # a GCG run over two prompts (or models) ranks its buffer by their mean: its first entry was taken as this
    # prompt's best, as a two-prompt beam's rank 1 was
    for prompts, models in (({"p": "x", "q": "y"}, [{}]), ({"p": "x"}, [{}, {}])):
        results.write_meta(gcg, kind="gcg", identity={"prompts": prompts, "models": models})
        with pytest.raises(UsageError, match="ranks its buffer by their mean reward, not by prompt 'p'"):
            best_and_worst(gcg, "p", 1)

    with pytest.raises(UsageError, match="--depth=2 picks a level of a beam CSV"):  # was ignored, exit 0
        best_and_worst(gcg, "p", 1, depth=2)
    # each flag reads its own kind: a beam given as --from_sweep was read, and recorded as a sweep
    from rmjax.errors import InputFileError

    with pytest.raises(InputFileError, match="--from_sweep=.*beam.csv is an experiments.beam result, not an "
                                         "experiments.sweep result"):
        job.best_and_worst(beam, "p", 1, flag="--from_sweep")
    sweep = tmp_path / "sweep.csv"
    results.write_table(sweep, {"token_id": [5, 6]}, {"p": np.asarray([1.0, 0.0])})
    results.write_meta(sweep, kind="sweep")
    assert job.best_and_worst(sweep, "p", 1, flag="--from_sweep") == [(5,), (6,)]
    with pytest.raises(InputFileError, match="--from_beam=.*sweep.csv is an experiments.sweep result, not an "
                                         "experiments.beam result or an experiments.gcg result"):
        best_and_worst(sweep, "p", 1)


def test_nonfinite_weights_stop_inspect_before_writing(rm_folder, tmp_path):
    from rmjax import nn
    from rmjax.errors import NonFiniteError
    from rmjax.inspect.job import items_from_texts, write_inspect

    model = load(str(rm_folder))
    kernel = nn.get(model.params, "score.kernel")
    model.params = nn.replace(model.params, model.config, **{"score.kernel": kernel.at[0, 0].set(float("nan"))})
    items = items_from_texts(model, "What is best?", ["love", "war"])
    with pytest.raises(NonFiniteError, match="non-finite values in the reward lens.*score.kernel"):
        write_inspect(model, "What is best?", items, tmp_path / "out", steps=2)
    assert not (tmp_path / "out" / "reward_lens.csv").exists()
    # a NaN in the second response's own token: the diagnosis was of the first response (finite), which ended in
    # "nowhere in a full forward ... please report it"
    model = load(str(rm_folder))
    token = next(t for t in items[1].ids if t not in items[0].ids)
    table = nn.get(model.params, "embed.embedding")
    model.params = nn.replace(model.params, model.config, **{"embed.embedding": table.at[token].set(float("nan"))})
    with pytest.raises(NonFiniteError, match=f"first: 'war'.*the embedding row of token {token}"):
        write_inspect(model, "What is best?", items, tmp_path / "out", steps=2)


def test_text_responses_mark_only_their_own_tokens(rm_folder):
    """`--responses` as text: the response's span is its tokens between the template's prefix and its end of turn
    (transformers' rendering cut at both ends), not the end of turn after it."""
    from rmjax.inspect.job import items_from_texts
    from rmjax.text import chat

    model = load(str(rm_folder))
    prompt = "What, in one word, is the greatest thing ever?"
    split = chat.split_chat(model.tokenizer, prompt)
    for item in items_from_texts(model, prompt, ["love", "a long answer, with commas"]):
        rendered = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                                        {"role": "assistant", "content": item.label}], tokenize=False)
        ids = model.tokenizer(rendered, add_special_tokens=False).input_ids
        assert list(item.ids) == ids and ids[item.end:] == list(split.suffix) and len(split.suffix) >= 1
        assert model.tokenizer.decode(ids[item.start:item.end]) == item.label


def test_responses_past_the_context_blank_or_merged_with_the_template(rm_folder, tmp_path, monkeypatch):
    """A fault hunt: inspect wrote its tables for a conversation longer than the model's context (score refuses
    it) and for an empty response (a stray comma in --responses), and marked the first token of a response starting
    with a newline as the template's (ChatML's '\\n' and the response's '\\n\\n' tokenize as '\\n\\n', '\\n')."""
    from rmjax.inspect.job import InspectSpec, items_from_texts, run_inspect
    from tests import cli, inproc

    model = load(str(rm_folder))
    prompt = "What, in one word, is the greatest thing ever?"
    for response in ("\n\nhello", "hello\n\n"):
        (item,) = items_from_texts(model, prompt, [response])
        assert response in model.tokenizer.decode(list(item.ids[item.start:item.end])), response
    inproc.no_weights_read(monkeypatch)
    long = " ".join(["word"] * model.config.max_position_embeddings)
    inproc.refused(lambda: run_inspect(InspectSpec(inproc.options(rm_folder, tmp_path / "long"),
                                                   ("greatest", prompt), responses=(long,))),
                   "more than the model's context")
    assert not (tmp_path / "long").exists()
    (blank,) = cli.run_each(("inspect", f"--model={rm_folder}", "--responses=a,,b", f"--out={tmp_path / 'blank'}"))
    cli.user_error(blank, "--responses=a,,b has an empty response")


def test_a_pad_baseline_without_a_pad_token_is_refused_before_loading(rm_folder, tmp_path, monkeypatch):
    """helper-149: --baseline=pad (the default) on a tokenizer without a pad token was refused only after the
    weights loaded; the tokenizer, read before them, says it. --baseline=zero needs none."""
    import json

    from rmjax.inspect.job import InspectSpec, run_inspect
    from tests import cli, inproc

    folder = cli.copy_folder(rm_folder, tmp_path / "nopad")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    inproc.no_weights_read(monkeypatch)
    inproc.refused(lambda: run_inspect(InspectSpec(inproc.options(folder, tmp_path / "out"), ("p", "Name a fruit."),
                                                   responses=("apple",))), "--baseline=pad", "no pad token")
    assert not (tmp_path / "out").exists()
