"""Bradley–Terry training: objective vs PyTorch, learning, exact resume, HF export."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

from rmjax import nn
from rmjax.loading import load
from rmjax.loading.reward_head import reward_model_from_lm
from rmjax.train.data import Pairs, elo_pairs, elo_probability, read_pairs
from rmjax.train.loop import batch_indices, train_reward_model, trainable_part
from rmjax.train.rm import bradley_terry_loss, save_hf_folder
from rmjax.train.settings import TrainConfig
from tests import inproc, tiny, tolerance
from tests import jitted as M

NOUNS = ["apple", "river", "house", "music", "dog", "book", "tree", "city", "light", "stone", "garden", "friend",
         "road", "window", "cloud", "paper", "chair", "bread", "ocean", "mountain", "coffee", "summer", "letter",
         "bridge", "forest", "market", "winter", "school", "flower", "island"]


def test_bt_loss_and_gradients_match_pytorch(tmp_path):
    hf = tiny.build_hf_model("gemma2", num_labels=1, seed=3)
    rm = load(str(tiny.save_hf_model(hf, tmp_path)), require_tokenizer=False)
    chosen, cmask = tiny.random_batch(seed=8, batch=4, length=9, padding="right")
    rejected, rmask = tiny.random_batch(seed=9, batch=4, length=9, padding="right")
    label = np.asarray([1.0, 0.8, 0.3, 1.0], np.float32)

    def loss_fn(params):
        rc = M.rewards(params, rm.config, chosen, cmask)[:, 0]
        rr = M.rewards(params, rm.config, rejected, rmask)[:, 0]
        return bradley_terry_loss(rc, rr, jnp.asarray(label))

    loss, grads = jax.value_and_grad(loss_fn)(rm.params)
    grads = nn.flat(grads)

    def run(ids, mask):
        return hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                  position_ids=tiny.torch_positions(mask)).logits[:, 0]

    d = run(chosen, cmask) - run(rejected, rmask)
    y = torch.from_numpy(label)
    ref = -(y * torch.nn.functional.logsigmoid(d) + (1 - y) * torch.nn.functional.logsigmoid(-d)).mean()
    ref.backward()
    # the loss's slope in each reward is at most 1: the rewards' float32 bounds add (tests/tolerance.py)
    loss_atol = (tolerance.rewards_atol(rm.params, rm.config, chosen, cmask)
                 + tolerance.rewards_atol(rm.params, rm.config, rejected, rmask))
    assert abs(float(loss) - ref.detach().item()) <= loss_atol
    # a weight's gradient sums one contribution per row (the head) or per token (the layers)
    score = hf.score.weight.grad.numpy().T
    np.testing.assert_allclose(np.asarray(grads["score.kernel"]), score,
                               atol=tolerance.grad_atol(score, rm.config, 9, 2 * 4), rtol=0)
    down = hf.model.layers[1].mlp.down_proj.weight.grad.numpy().T
    np.testing.assert_allclose(np.asarray(grads["layers.down"][1]), down,
                               atol=tolerance.grad_atol(down, rm.config, 9, 2 * 4 * 9), rtol=0)
    q = hf.model.layers[0].self_attn.q_proj.weight.grad.numpy().T.reshape(np.asarray(grads["layers.q"][0]).shape)
    np.testing.assert_allclose(np.asarray(grads["layers.q"][0]), q,
                               atol=tolerance.grad_atol(q, rm.config, 9, 2 * 4 * 9), rtol=0)


def _separable(nouns: list[str], n: int, seed: int) -> Pairs:
    rng = np.random.default_rng(seed)
    a, b = rng.choice(nouns, n), rng.choice(nouns, n)
    return Pairs(["Which is better?"] * n, [f"good {x}" for x in a], [f"bad {x}" for x in b],
                 np.ones(n, np.float32))


def test_head_training_learns_separable_preferences(lm, tmp_path):
    rm = reward_model_from_lm(lm, seed=0)
    train, held = _separable(NOUNS[:20], 400, 0), _separable(NOUNS[20:], 200, 1)
    cfg = TrainConfig(trainable="head", steps=210, batch_size=32, learning_rate=5e-2, checkpoint_every=100)
    result = train_reward_model(rm, train, held, cfg, tmp_path, log=lambda *_: None)
    assert result.evals[-1]["heldout_accuracy"] > 0.95
    # the last step is evaluated and checkpointed too, off the --checkpoint_every grid
    assert [e["step"] for e in result.evals] == [100, 200, 210]
    assert sorted(int(d.name) for d in (tmp_path / "checkpoints").iterdir() if d.name.isdigit()) == [100, 200, 210]
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    # the trained head scores unseen items with the full model too
    from rmjax.scoring.texts import TextScorer

    s = TextScorer(result.model, "Which is better?")
    assert (s.score(["good island"]) > s.score(["bad island"])).all()


def test_nan_features_stop_head_training(lm, tmp_path):
    """A NaN anywhere in a response's hidden state (here one hidden unit of one embedding row) stops
    training with the response named, before any step."""
    from rmjax.errors import NonFiniteError

    rm = reward_model_from_lm(lm, seed=0)
    train, held = _separable(NOUNS[:20], 40, 0), _separable(NOUNS[20:], 10, 1)
    row = lm.tokenizer(" river", add_special_tokens=False).input_ids[0]
    embed = np.asarray(nn.get(rm.params, "embed.embedding")).copy()
    embed[row, 5] = np.nan
    broken = dataclasses.replace(rm, params=nn.replace(rm.params, rm.config, **{"embed.embedding": jnp.asarray(embed)}))
    cfg = TrainConfig(trainable="head", steps=2, batch_size=8, checkpoint_every=2)
    with pytest.raises(NonFiniteError, match="non-finite features.*river"):
        train_reward_model(broken, train, held, cfg, tmp_path, log=lambda *_: None)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


class Crash(Exception):
    """A training run killed at a step: raised by `crash_at`'s log."""


def crash_at(step: int):
    """A `log` for train_reward_model that kills the run as it logs `step` (after the checkpoint before it)."""
    def log(message: str) -> None:
        if message.startswith(f"step {step}:"):
            raise Crash

    return log


def test_a_nonfinite_training_loss_stops_the_run_before_its_checkpoint(lm, tmp_path):
    """A step whose loss is NaN/Inf (here a rate that overflows the head) stops the run naming the step, before
    the checkpoint at the run's end."""
    from rmjax.errors import NonFiniteError

    rm = reward_model_from_lm(lm, seed=0)
    train, held = _separable(NOUNS[:20], 40, 0), _separable(NOUNS[20:], 10, 1)
    cfg = TrainConfig(trainable="head", steps=4, batch_size=8, learning_rate=1e38, warmup_steps=0, checkpoint_every=4)
    with pytest.raises(NonFiniteError, match=r"training loss is (nan|inf) at step (\d+)") as caught:
        train_reward_model(rm, train, held, cfg, tmp_path, log=lambda *_: None)
    step = int(caught.value.args[0].split(" at step ")[1].split(";")[0])
    assert 1 < step < cfg.steps  # step 1's loss is finite (the head was small), a later one overflowed
    assert not any(d.name.isdigit() for d in (tmp_path / "checkpoints").iterdir())


# A run of 6 steps checkpointed every 2 (with weight decay), killed at step 4 by test_resume_after_crash_is_exact.
_RESUMED = dict(trainable="last_k", last_k=1, steps=6, batch_size=8, learning_rate=1e-2, checkpoint_every=2,
                weight_decay=0.01)


@pytest.fixture(scope="module")
def uninterrupted(lm, tmp_path_factory):
    """The uninterrupted run both kinds of crash are resumed against (each only reads it): (its RM, its result)."""
    rm = reward_model_from_lm(lm, seed=1)
    train, held = _separable(NOUNS[:20], 64, 2), _separable(NOUNS[20:], 16, 3)
    return rm, train_reward_model(rm, train, held, TrainConfig(**_RESUMED), tmp_path_factory.mktemp("whole"),
                                  log=lambda *_: None)


@pytest.mark.parametrize("between_logs_and_checkpoint", [False, True])
def test_resume_after_crash_is_exact(uninterrupted, tmp_path, monkeypatch, between_logs_and_checkpoint):
    """Killed after step 4's checkpoint, or after its logs were written but before its checkpoint (the logs then
    run past the checkpoint the resume starts from: their later rows are replayed, not kept twice)."""
    import orbax.checkpoint as ocp

    rm, whole = uninterrupted
    train, held = _separable(NOUNS[:20], 64, 2), _separable(NOUNS[20:], 16, 3)
    cfg = TrainConfig(**_RESUMED)
    if between_logs_and_checkpoint:
        save = ocp.CheckpointManager.save

        def crash_saving(self, step, *args, **kwargs):
            if step == 4:
                raise Crash
            return save(self, step, *args, **kwargs)

        monkeypatch.setattr(ocp.CheckpointManager, "save", crash_saving)
    with pytest.raises(Crash):
        train_reward_model(rm, train, held, cfg, tmp_path / "b", log=crash_at(4))
    monkeypatch.undo()
    if between_logs_and_checkpoint:
        assert len((tmp_path / "b" / "train_log.csv").read_text().splitlines()) == 1 + 4  # past checkpoint 2
    said = []
    resumed = train_reward_model(rm, train, held, cfg, tmp_path / "b", log=said.append)
    assert resumed.resumed_from == (2 if between_logs_and_checkpoint else 4)
    # the resume is said first, before the minutes its training data may take, and said again once it is read
    found = f"found a checkpoint at step {resumed.resumed_from} in {tmp_path / 'b'}"
    assert said[0].startswith(found), said
    assert f"resumed from checkpoint at step {resumed.resumed_from}" in said[1:], said
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert [e["step"] for e in resumed.evals] == [2, 4, 6]
    flat_a, flat_b = nn.flat(whole.model.params), nn.flat(resumed.model.params)
    for key in flat_a:
        np.testing.assert_array_equal(np.asarray(flat_a[key]), np.asarray(flat_b[key]))
    # frozen parts did not move, the last layer did
    base = nn.flat(rm.params)
    np.testing.assert_array_equal(np.asarray(flat_a["layers.down"][0]), np.asarray(base["layers.down"][0]))
    np.testing.assert_array_equal(np.asarray(flat_a["embed.embedding"]), np.asarray(base["embed.embedding"]))
    assert not np.array_equal(np.asarray(flat_a["layers.down"][-1]), np.asarray(base["layers.down"][-1]))




def test_bfloat16_layers_train_through_a_float32_master(lm, tmp_path):
    """A bfloat16 weight kept its value when an Adam step (about the learning rate) was below half its spacing
    (2^-8 of it): at lr 1e-4 one trained weight in five moved, and the export was mostly the base model. The reference
    is the same run in float32: where it moved a weight more than 2 bfloat16 spacings, the bfloat16 run moves it too,
    the same way, by as much up to its rounding (at most a quarter of such a move) and the forward's bf16 noise."""
    base32 = reward_model_from_lm(lm, seed=1)
    base16 = reward_model_from_lm(load(lm.source, dtype="bfloat16"), seed=1)
    train, held = _separable(NOUNS[:20], 64, 2), _separable(NOUNS[20:], 16, 3)
    cfg = TrainConfig(trainable="last_k", last_k=1, steps=40, batch_size=8, learning_rate=1e-4, warmup_steps=0,
                      checkpoint_every=40)
    runs = [train_reward_model(rm, train, held, cfg, tmp_path / rm.dtype, log=lambda *_: None)
            for rm in (base32, base16)]
    (f32, b16), (w32, w16) = [nn.flat(r.model.params) for r in runs], [nn.flat(rm.params) for rm in (base32, base16)]
    for key in ("layers.q", "layers.down", "final_norm.scale"):
        layer = -1 if key.startswith("layers") else ...  # the last layer of a stacked weight

        def trained_part(a, layer=layer):
            return np.asarray(a, np.float32)[layer]
        assert b16[key].dtype == jnp.bfloat16  # the model keeps its dtype; the master copy is the optimizer's
        start, trained = trained_part(w16[key]), trained_part(b16[key])
        ref = trained_part(f32[key]) - trained_part(w32[key])
        spacing = 2.0 ** (np.floor(np.log2(np.abs(start) + 1e-30)) - 7)  # bfloat16: 8 significant bits
        far = np.abs(ref) > 2 * spacing
        assert far.mean() > 0.3, key  # the comparison compares something
        moved = trained - start
        assert np.mean((np.sign(moved) == np.sign(ref))[far]) > 0.95, key
        assert np.abs(moved - ref)[far].mean() < 0.3 * np.abs(ref)[far].mean(), key

def test_a_finished_run_is_reused_before_anything_is_computed(lm_folder, tmp_path, monkeypatch, capsys):
    """Issue 45: a finished train_rm recomputed every feature (the default RM's 7,516 responses, about 60 s) and
    rewrote its --export folder silently before saying it was done, and never said where it exported. Now the
    command prints its Hugging Face folder; run again, it reads no weight and computes no feature, keeps the export
    as it is (saying so); an output the finished run has not written yet (--head_out) restores its last checkpoint,
    computing no feature either."""
    from safetensors.numpy import load_file

    from rmjax.train import loop
    from tests import cli, inproc

    pairs, held, work, export = (tmp_path / name for name in ("pairs.csv", "held.csv", "work", "hf"))
    _separable(NOUNS[:20], 48, 0).to_frame().to_csv(pairs, index=False)
    _separable(NOUNS[20:], 16, 1).to_frame().to_csv(held, index=False)
    settings = dict(steps=2, warmup_steps=1, checkpoint_every=2, batch_size=8)
    proc = cli.ok(cli.run("train_rm", f"--model={lm_folder}", f"--pairs={pairs}", f"--heldout_pairs={held}",
                          f"--workdir={work}", f"--export={export}", *(f"--{k}={v}" for k, v in settings.items())))
    assert proc.stdout.strip().splitlines()[-1] == f"Hugging Face folder: {export}"
    summary = json.loads((work / "summary.json").read_text())
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [*export.iterdir(), work / "summary.json"]}

    def computed(*args, **kwargs):
        raise AssertionError("the finished run computed its features again")

    monkeypatch.setattr(loop, "_objective", computed)
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        capsys.readouterr()
        again = inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=held, workdir=work, export=export, **settings)
    err = capsys.readouterr().err
    took = f"took {summary['seconds']:.1f} s"  # the old run's date and time, never passed off as just measured
    assert f"{work}: reused (written {summary['written_at']}, {took}): this run, finished" in err
    assert f"--export={export}: reused (written " in err
    assert again.model is None and again.resumed_from == 2 and again.export == export
    assert again.evals[-1] == summary["final"]
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files  # nothing rewritten
    # A head file the finished run has not written: its last checkpoint restored, no step run, no feature computed.
    head = tmp_path / "head.safetensors"
    inproc.train_rm(lm_folder, pairs=pairs, heldout_pairs=held, workdir=work, export=export, head_out=head,
                    **settings)
    assert "its last checkpoint is restored" in capsys.readouterr().err
    np.testing.assert_array_equal(load_file(str(head))["score.weight"],
                                  load_file(str(export / "model.safetensors"))["score.weight"])
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files


@pytest.mark.parametrize("trainable, trained", [
    ("head", {"score.kernel"}),
    ("last_k", {"final_norm.scale", "score.kernel"}),
    ("full", {"final_norm.scale", "score.kernel"}),
])
def test_frozen_parts_carry_no_optimizer_state(lm, trainable, trained):
    rm = reward_model_from_lm(lm, seed=0)
    n = rm.config.num_layers
    module, wrt = trainable_part(rm, TrainConfig(trainable=trainable, last_k=1))
    opt = nnx.Optimizer(module, optax.adam(1e-3), wrt=wrt)
    moments = {".".join(map(str, p[3:])): v.shape for p, v in nnx.to_flat_state(nnx.state(opt)) if p[2:3] == ("mu",)}
    layers = {k: s for k, s in moments.items() if ".q" in k or ".down" in k}
    assert "embed.embedding" not in moments
    assert trained <= set(moments)
    if trainable == "head":
        assert set(moments) == trained
    else:  # only the trainable layers have Adam moments: 1 layer for last_k=1, all for full
        assert layers and all(s[0] == (1 if trainable == "last_k" else n) for s in layers.values()), layers


def test_last_k_holds_no_second_copy_of_the_frozen_layers(lm):
    """The trained module shares every frozen array with the loaded model: what it adds is the trained layers'
    copy alone. Before, splitting the stack sliced the frozen layers into a stack of their own, a second copy of
    them held through the run (28 of SmolLM2-135M's 30 layers)."""
    rm = reward_model_from_lm(lm, seed=0)
    n, last_k = rm.config.num_layers, 1
    assert n > last_k
    module, _ = trainable_part(rm, TrainConfig(trainable="last_k", last_k=last_k))
    loaded = {a.unsafe_buffer_pointer() for a in jax.tree.leaves(rm.params)}
    added = sum(a.nbytes for a in jax.tree.leaves(nnx.state(module)) if a.unsafe_buffer_pointer() not in loaded)
    one_layer = sum(a.nbytes for p, a in nn.flat(rm.params).items() if p.startswith("layers.")) // n
    assert added == last_k * one_layer, (added, one_layer)


def test_a_head_only_step_moves_only_the_head_and_its_optimizer_state(lm):
    """What a step returns is what it changes: a step that handed back the whole frozen model copied every weight
    each time (60× slower on SmolLM2). Its donated inputs are copies: the loaded model stays whole and unchanged."""
    from rmjax.train.step import Steps, feature_pair_rewards

    rm = reward_model_from_lm(lm, seed=0)
    before = np.asarray(nn.get(rm.params, "score.kernel")).copy()
    module, wrt = trainable_part(rm, TrainConfig(trainable="head"))
    opt = nnx.Optimizer(module, optax.sgd(1.0), wrt=wrt)
    features = jax.random.normal(jax.random.key(0), (6, rm.config.hidden_size))
    data = (features, jnp.asarray([0, 1, 2]), jnp.asarray([3, 4, 5]))
    steps = Steps(rm.config, None, module, opt, wrt, feature_pair_rewards, data)
    loss = steps(jnp.asarray([0, 1, 2]), jnp.ones(3))
    moved = {".".join(map(str, p[1:])) for p, _ in nnx.to_flat_state(steps.moving) if p[0] == 0}
    assert moved == {"score.kernel"}
    steps.write_back()
    # plain SGD with lr 1: the head moved by minus the Bradley–Terry gradient, computed here by hand in float64
    f = np.asarray(features, np.float64)
    diff, w = f[:3] - f[3:], before[:, 0].astype(np.float64)
    margin = diff @ w
    grad = -(diff * (1 - 1 / (1 + np.exp(-margin)))[:, None]).mean(0)
    # float32 bound: each margin is an inner product of H terms (plus the feature difference's rounding); the loss's
    # and the sigmoid's slopes are at most 1 and 1/4; the update itself rounds once more
    scale = float(((np.abs(f[:3]) + np.abs(f[3:])) @ np.abs(w)).max())
    margin_atol = tolerance.f32_atol(scale, rm.config.hidden_size + 1, evaluations=1)
    assert float(loss) == pytest.approx(np.mean(np.log1p(np.exp(-margin))), abs=margin_atol + 4 * tolerance.U32)
    updated = np.asarray(nn.get(nnx.state(module), "score.kernel"))[:, 0]
    step_atol = 0.25 * np.abs(diff).max() * margin_atol + 2 * tolerance.U32 * (np.abs(w) + np.abs(grad)).max()
    np.testing.assert_allclose(updated, w - grad, atol=step_atol, rtol=0)
    np.testing.assert_array_equal(np.asarray(nn.get(rm.params, "score.kernel")), before)
    np.testing.assert_array_equal(np.asarray(nn.get(rm.params, "embed.embedding")),
                                  np.asarray(nn.get(lm.params, "embed.embedding")))


@pytest.mark.parametrize("family", ["llama3.1", "gemma3"])
def test_saved_folder_loads_in_transformers_and_rmjax(tmp_path, family):
    lm_hf = tiny.build_hf_model(family, seed=4)
    lm = load(str(tiny.save_hf_model(lm_hf, tmp_path / "lm")), require_tokenizer=False)
    rm = reward_model_from_lm(lm, seed=5)
    score = nn.get(rm.params, "score.kernel") * 50
    rm = dataclasses.replace(rm, params=nn.replace(rm.params, rm.config, **{"score.kernel": score}))
    folder = save_hf_folder(rm, tmp_path / "rm")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32,
                                                                         attn_implementation="eager").eval()
    assert type(hf).__name__ == tiny._CLASSES["llama" if family.startswith("llama") else family][0]
    again = load(str(folder), require_tokenizer=False)
    ids, mask = tiny.random_batch(seed=10, batch=3, length=10, padding="right")
    ours = np.asarray(M.rewards(rm.params, rm.config, ids, mask))
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                 position_ids=tiny.torch_positions(mask)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=tolerance.rewards_atol(rm.params, rm.config, ids, mask), rtol=0)
    # float32 weights round-trip exactly and the same jitted forward runs: the same bits
    np.testing.assert_array_equal(np.asarray(M.rewards(again.params, again.config, ids, mask)), ours)


def test_elo_pairs_split_by_item_and_follow_elo(tmp_path):
    path = tmp_path / "What is best.csv"
    names = [f"item{i}" for i in range(200)]
    elo = np.linspace(600, 1600, 200)
    import pandas as pd

    pd.DataFrame({"elo_rank": range(200), "elo_score": elo, "name": names}).to_csv(path, index=False)
    train, held = elo_pairs(path, 4000, 1000, seed=0)
    assert set(train.prompt) == {"What is best?"}
    train_items, held_items = set(train.chosen) | set(train.rejected), set(held.chosen) | set(held.rejected)
    assert not train_items & held_items
    # a fifth of the items held out (4,000 pairs miss one of 160 items with probability about 160·e⁻⁵⁰); no item
    # is paired with itself
    assert (len(train_items), len(held_items)) == (160, 40)
    assert all(c != r for pairs in (train, held) for c, r in zip(pairs.chosen, pairs.rejected, strict=True))
    score = dict(zip(names, elo, strict=True))
    # sampled winners agree with the higher Elo about as often as the Elo probabilities say
    # the Elo win probability written out here, independent of rmjax.train.data
    p = 1.0 / (1.0 + 10.0 ** ((np.array([score[r] for r in train.rejected]) -
                               np.array([score[c] for c in train.chosen])) / 400.0))
    assert elo_probability(np.array([1400.0]), np.array([1000.0]))[0] == pytest.approx(10 / 11)
    higher = np.array([score[c] > score[r] for c, r in zip(train.chosen, train.rejected, strict=True)])
    expected = np.mean(np.maximum(p, 1 - p))
    assert abs(higher.mean() - expected) < 0.03
    soft, _ = elo_pairs(path, 100, 10, soft=True, seed=0)
    hi = np.array([max(score[c], score[r]) for c, r in zip(soft.chosen, soft.rejected, strict=True)])
    lo = np.array([min(score[c], score[r]) for c, r in zip(soft.chosen, soft.rejected, strict=True)])
    # labels are float32 (relative rounding 2^-24 ~ 6e-8); the formula is float64
    np.testing.assert_allclose(soft.label, 1.0 / (1.0 + 10.0 ** ((lo - hi) / 400.0)), rtol=1e-6)


def test_read_pairs_and_batches(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "q", "chosen": "None", "rejected": "b", "label": 0.7}\n')
    p = read_pairs(f)
    assert p.chosen == ["None"] and p.label.tolist() == [pytest.approx(0.7)]
    a = [batch_indices(10, 4, 0, s) for s in range(5)]
    assert np.array_equal(a[2], batch_indices(10, 4, 0, 2))
    assert sorted(np.concatenate(a)[:10].tolist()) == list(range(10))  # first epoch is a permutation
    # the definition written out: epoch e is the permutation seeded (seed, e), the steps consecutive slices of the
    # epochs end to end (a step across an epoch's end takes the next epoch's first rows)
    stream = np.concatenate([np.random.default_rng([3, e]).permutation(10) for e in range(5)])
    for step in range(12):
        assert batch_indices(10, 4, 3, step).tolist() == stream[4 * step : 4 * step + 4].tolist()
    assert stream[:10].tolist() != stream[10:20].tolist()  # each epoch its own order


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "fsdp"])
def test_data_parallel_training_on_a_mesh_matches_one_device(lm, tmp_path, fsdp):
    """--fsdp without --remat: the backward pass gathers each trained layer's weights again (its own remat)."""
    from rmjax.parallel import sharding

    meshed_lm = load(lm.source, mesh=sharding.make_mesh("data:4,model:2"))
    train, held = _separable(NOUNS[:20], 64, 4), _separable(NOUNS[20:], 16, 5)
    cfg = TrainConfig(trainable="last_k", last_k=1, steps=4, batch_size=8, learning_rate=1e-2, checkpoint_every=4)
    one = train_reward_model(reward_model_from_lm(lm, seed=2), train, held, cfg, tmp_path / "one", log=lambda *_: None)
    many = train_reward_model(reward_model_from_lm(meshed_lm, seed=2), train, held,
                              dataclasses.replace(cfg, fsdp=fsdp), tmp_path / "many", log=lambda *_: None)
    assert nn.get(many.model.params, "layers.down").sharding.spec[1] == "model"  # [layers, mlp, embed]
    # The mesh sums gradients in another order: Adam's steps drift apart by rounding only (tests/tolerance.py);
    # 64 tokens bound every pair here.
    drift = tolerance.adam_atol(cfg.learning_rate, cfg.steps, tolerance.grad_rel_error(lm.config, 64, 2 * 8 * 64))
    loss_atol = tolerance.bt_loss_atol(one.model.params, one.model.config, 64, drift)
    np.testing.assert_allclose([h["loss"] for h in many.history], [h["loss"] for h in one.history], atol=loss_atol,
                               rtol=0)
    np.testing.assert_allclose(np.asarray(nn.get(many.model.params, "score.kernel")),
                               np.asarray(nn.get(one.model.params, "score.kernel")), atol=drift, rtol=0)


def test_no_warmup_starts_at_the_peak_rate():
    """--warmup_steps=0 warmed up for one step anyway, at rate 0 (step 1 changed nothing), and --steps=1 with it died
    in optax after the model loaded. Reference: the schedule's formula (linear warmup over W steps from 0, then a
    cosine to a tenth of the peak at step T), read from AdamW's first steps on a constant gradient (each of size
    ≈ the rate: Adam divides the gradient by its own size)."""
    import math

    from rmjax.train.optimizer import make_optimizer

    def first_steps(warmup: int, steps: int) -> list[float]:
        opt = make_optimizer(TrainConfig(steps=steps, warmup_steps=warmup, learning_rate=1.0, weight_decay=0.0,
                                         clip_norm=1e9))
        params, state, sizes = jnp.zeros(1), None, []
        state = opt.init(params)
        for _ in range(steps):
            update, state = opt.update(jnp.ones(1), state, params)
            sizes.append(-float(update[0]))
        return sizes

    def formula(t: int, warmup: int, steps: int) -> float:
        if t < warmup:
            return t / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (steps - warmup)))

    for warmup, steps in [(0, 5), (2, 6), (0, 1)]:
        # Adam's bias correction 1 - 0.999^t, in float32, is off by up to 2^-24 / 1e-3 = 6e-5 of itself
        np.testing.assert_allclose(first_steps(warmup, steps), [formula(t, warmup, steps) for t in range(steps)],
                                   rtol=1.2e-4, atol=0)


def test_the_optimizer_clips_the_global_norm_then_steps_adamw_with_decoupled_decay():
    """make_optimizer against AdamW written out in numpy (float64): the gradient scaled to norm ≤ clip_norm over all
    weights together, Adam's bias-corrected moments (0.9, 0.999, eps 1e-8), and weight decay added to Adam's
    direction before the rate (decoupled), on the schedule the test above checks. Gradients of changing size, some
    over the clip: Adam alone is blind to one constant scale, not to clipping some steps and not others."""
    import math

    from rmjax.train.optimizer import make_optimizer

    steps, rate, clip, decay = 6, 0.1, 0.5, 0.2
    cfg = TrainConfig(steps=steps, warmup_steps=0, learning_rate=rate, weight_decay=decay, clip_norm=clip)
    opt = make_optimizer(cfg)
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=(2, 3)) * scale for scale in (3.0, 0.05, 2.0, 0.1, 0.02, 5.0)]
    params = {"a": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32), "b": jnp.asarray(rng.normal(size=2), jnp.float32)}
    state = opt.init(params)
    want = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in want.items()}
    v = {k: np.zeros_like(x) for k, x in want.items()}
    for t, g in enumerate(grads):
        g = {"a": g[:, :2], "b": g[:, 2]}
        update, state = opt.update({k: jnp.asarray(x, jnp.float32) for k, x in g.items()}, state, params)
        params = optax.apply_updates(params, update)
        norm = math.sqrt(sum(float((x ** 2).sum()) for x in g.values()))
        lr = rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t / steps)))
        for k in want:
            gk = g[k] * min(1.0, clip / norm)
            m[k] = 0.9 * m[k] + 0.1 * gk
            v[k] = 0.999 * v[k] + 0.001 * gk ** 2
            direction = (m[k] / (1 - 0.9 ** (t + 1))) / (np.sqrt(v[k] / (1 - 0.999 ** (t + 1))) + 1e-8)
            want[k] = want[k] - lr * (direction + decay * want[k])
    # float32 against float64: each step's direction (size ~1) is off by ~10 ulps (1.2e-6) times a rate ≤ 0.1;
    # six steps stay under 1e-6, and 1e-5 leaves ten times that
    for k in want:
        np.testing.assert_allclose(np.asarray(params[k]), want[k], rtol=0, atol=1e-5)


def test_an_identity_tells_runs_the_old_rules_trained_apart():
    """A run with --warmup_steps=0 (once a step at rate 0) and one of bfloat16 layers (once without a float32 master)
    each carry a key that runs written under the old rules lack, so none is resumed or reused as theirs. Head-only
    training needs no master in any dtype (the score head is float32): its identity has none, and it holds none."""
    from rmjax.train.settings import needs_master, train_identity

    pairs = Pairs(["p"], ["a"], ["b"], np.ones(1))
    fp = {"model": "m"}

    def identity(dtype="float32", **cfg):
        return train_identity(fp, dtype, pairs, pairs, TrainConfig(**cfg))

    assert identity(warmup_steps=0)["warmup"] and "warmup" not in identity(warmup_steps=1)
    assert identity("bfloat16", trainable="full")["master"] == "float32"
    assert "master" not in identity("float32", trainable="full") and "master" not in identity("bfloat16")
    assert not needs_master(TrainConfig(trainable="head"), "bfloat16")
    assert needs_master(TrainConfig(trainable="last_k"), "bfloat16")


def test_training_from_a_reward_model_says_its_head_is_replaced(rm_folder, tmp_path, capsys):
    """train_rm --model=<a reward model> trained a new random head in silence (step 1's loss about log 2): the
    model's own head is not where training starts, and the note says so."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,chosen,rejected\n" + "".join(f"Q{i},Love,Hate\n" for i in range(4)))
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("prompt,chosen,rejected\nH,Gold,Dirt\n")
    inproc.train_rm(rm_folder, pairs=pairs, heldout_pairs=heldout, workdir=tmp_path / "work", steps=1, batch_size=2,
                    warmup_steps=0, checkpoint_every=1)
    assert f"note: {rm_folder} is a reward model; its score head is replaced" in capsys.readouterr().err


def test_heldout_accuracy_counts_decisive_pairs_by_their_labels_side():
    """A pair is right when the reward orders it the way its label leans (label < 0.5: the rejected side preferred);
    a tie (0.5) is neither right nor counted. The loss is the soft-label Bradley–Terry loss, by hand in float64."""
    from rmjax.train.loop import _evaluation

    label = np.asarray([1.0, 0.0, 0.5, 0.8, 0.2, 0.3], np.float32)
    chosen = np.asarray([1.0, 1.0, 1.0, 1.0, 1.0, -1.0], np.float32)
    rejected = np.zeros(6, np.float32)
    held = Pairs(["q"] * 6, [f"c{i}" for i in range(6)], [f"r{i}" for i in range(6)], label)
    got = _evaluation(None, lambda _: (jnp.asarray(chosen), jnp.asarray(rejected)), held)
    assert got["heldout_accuracy"] == pytest.approx(3 / 5, rel=2**-23)  # rows 0, 3, 5 right; 1, 4 wrong; 2 a tie
    d = (chosen - rejected).astype(np.float64)
    want = -np.mean(label * np.log(1 / (1 + np.exp(-d))) + (1 - label) * np.log(1 / (1 + np.exp(d))))
    # float32: each log-sigmoid within a few ulps (2^-23 ≈ 1.2e-7 relative) and the mean of six terms adds about
    # six more; 1e-6 is above that sum
    assert got["heldout_loss"] == pytest.approx(want, rel=1e-6)


def test_ctrl_c_during_a_checkpoint_save_comes_after_it():
    """helper-149: Ctrl-C inside orbax's wait for a checkpoint printed 2-3 tracebacks (orbax logged the interrupt as
    a failed save; its threads then scheduled work at shutdown) beside the one `interrupted:` line, and left the save
    half-written. The interrupt now waits for the save: the block runs to its end, then KeyboardInterrupt."""
    import os
    import signal
    import threading

    from rmjax.train.loop import _ctrl_c_after

    done, finished, before = threading.Event(), [], signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever the test runner set
    threading.Timer(0.3, done.set).start()  # the save, finishing on another thread
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)
            done.wait(5)  # interrupted here before
            finished.append(done.is_set())
    try:
        assert finished == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with _ctrl_c_after():  # no Ctrl-C: nothing raised
            pass
        finished.clear()
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C does not wait (a save that hangs)
            with _ctrl_c_after():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
                finished.append(True)
        assert finished == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
