"""A resumed run gives what an uninterrupted one gives, or refuses; a size it cannot hold is refused up front.

Issue 22 ("no silent wrong results"): stored chunks skipped the checks a fresh chunk passes, a run on a mesh
could not restore its own checkpoint, and sizes past the memory or the data crashed or hung. Where the point is the
job's library code (stored chunks checked on resume, sizes refused, a mesh's restore) the job runs in-process, as
its entry point would (tests/inproc.py: an RmjaxError is the command's one `error:` line); --mesh on a device
count and one refusal's exit run the entry points as a user does (SIGKILLed jobs: tests/test_sweep.py and
tests/test_beam.py). A resume is compared byte for byte with an uninterrupted run.
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pandas as pd
import pytest

from tests import cli, inproc


def _meta(out) -> dict:
    from rmjax.runs import results

    return json.loads(results.meta_path(out).read_text())


@pytest.fixture(scope="module")
def nan_row(rm_folder, tmp_path_factory):
    """The tiny reward model with a NaN embedding row: every response holding token 5 scores NaN."""
    model = cli.copy_folder(rm_folder, tmp_path_factory.mktemp("nan") / "model")
    cli.edit_tensor(model, "model.embed_tokens.weight", lambda w: np.where(np.arange(len(w))[:, None] == 5, np.nan, w))
    return model


def test_beam_resume_checks_stored_chunks_like_fresh_ones(nan_row, tmp_path, monkeypatch, capsys):
    """A beam killed after scoring everything with --allow_nonfinite, resumed without it, used to write its CSV from
    the stored NaN chunks with status 0; its .meta.json never counted NaN scores either. Each run is `beam
    --model=NAN_ROW --depth=2 --beam=2 --top=4 --limit=32 --chunk_size=8 --allow_special [--allow_nonfinite]`
    in-process (tests/inproc.py), killed the moment it would write its result."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    def beam(out, allow_nonfinite: bool = False):
        return run_beam(BeamSpec(inproc.options(nan_row, out, allow_nonfinite=allow_nonfinite),
                                 inproc.prompts("greatest"), BeamConfig(depth=2, beam=2, top=4, allow_special=True),
                                 limit=32, chunk_size=8))

    out = tmp_path / "beam.csv"
    chunks = out.with_name(out.name + ".chunks")
    with monkeypatch.context() as patch:
        inproc.interrupt_at_finish(patch)
        with pytest.raises(KeyboardInterrupt):
            beam(out, allow_nonfinite=True)
    stored = sorted(p.name for p in chunks.glob("chunk-*.npy"))
    assert len(stored) == 20 and not out.exists()  # 4 chunks at depth 1, 2 beams x 2 partials x 4 at depth 2
    # Without the flag the stored NaN is refused as a fresh one is: one line, nothing written, the chunks kept.
    line = inproc.refused(lambda: beam(out), "non-finite scores saved in", "chunk-d1-", "response ids [5]",
                          "the embedding row of token 5", "--allow_nonfinite")
    assert "1 of 8" in line
    assert not out.exists() and sorted(p.name for p in chunks.glob("chunk-*.npy")) == stored
    # With it the resumed run is the uninterrupted one, its NaN count included.
    capsys.readouterr()
    beam(out, allow_nonfinite=True)
    assert "160 on disk" in capsys.readouterr().err
    clean = tmp_path / "clean.csv"
    beam(clean, allow_nonfinite=True)
    assert out.read_bytes() == clean.read_bytes()
    assert _meta(out)["resumed_candidates"] == 160 and _meta(clean)["resumed_candidates"] == 0
    assert _meta(out)["nonfinite"] == _meta(clean)["nonfinite"]
    assert _meta(out)["nonfinite"]["allowed"] is True and _meta(out)["nonfinite"]["values"] >= 1
    assert _meta(out)["nonfinite"]["first"][0] == "response ids [5] for 'greatest'"


def test_sweep_resume_stops_at_the_first_bad_stored_chunk(nan_row, tmp_path, monkeypatch):
    """A sweep's stored chunks were checked only once all the missing ones had been scored (and stored). `sweep
    --model=NAN_ROW --limit=2048 --chunk_size=256 --batch_size=64 [--allow_nonfinite]` in-process (tests/inproc.py),
    killed as its third chunk write starts."""
    from rmjax.search.sweep import SweepSpec, run_sweep

    out = tmp_path / "s.csv"

    def sweep(allow_nonfinite: bool = False):
        return run_sweep(SweepSpec(inproc.options(nan_row, out, allow_nonfinite=allow_nonfinite),
                                   inproc.prompts("greatest"), limit=2048, batch_size=64, chunk_size=256))

    with monkeypatch.context() as patch:
        inproc.interrupt_at_write(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            sweep(allow_nonfinite=True)
    done = len(list(out.with_name(out.name + ".chunks").glob("chunk-*.npy")))
    assert done == 2 and not out.exists()
    inproc.refused(sweep, "non-finite scores saved in", "chunk-0000000000", "token 5", "--allow_nonfinite")
    assert len(list(out.with_name(out.name + ".chunks").glob("chunk-*.npy"))) == done  # none scored in vain


def test_train_rm_trains_and_resumes_on_the_mesh_it_is_given(lm_folder, tmp_path, monkeypatch):
    """Issue 13: --mesh reached train_rm's flags but not its model (it trained on one device). Issue 22: a run
    on a mesh, killed after a checkpoint, could not restore it ("incompatible devices ... opt.states int32[]":
    optax's step count came back on one device beside weights on several). Issue 44: with --fsdp (the trained
    layer, head and Adam's moments split over `data` too) and --remat, on 8 devices (data:4,model:2)."""
    devices, mesh_axes, sharded = 8, (4, 2), ("--fsdp", "--remat")
    rng = np.random.default_rng(0)
    for name, nouns in (("train", ["apple", "river", "house", "music", "dog", "book", "tree", "city"]),
                        ("heldout", ["light", "stone", "garden", "road"])):
        pd.DataFrame({"prompt": "Which is better?", "chosen": [f"good {x}" for x in rng.choice(nouns, 32)],
                      "rejected": [f"bad {x}" for x in rng.choice(nouns, 32)]}).to_csv(tmp_path / f"{name}.csv",
                                                                                        index=False)
    four = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    steps, learning_rate, batch = 6, 0.05, 8

    def flags(run: str, *mesh: str) -> list[str]:
        return [f"--model={lm_folder}", f"--pairs={tmp_path / 'train.csv'}",
                f"--heldout_pairs={tmp_path / 'heldout.csv'}", "--trainable=last_k", "--last_k=1", f"--steps={steps}",
                "--warmup_steps=1", "--checkpoint_every=2", f"--batch_size={batch}", f"--learning_rate={learning_rate}",
                *mesh,
                f"--workdir={tmp_path / run}", f"--export={tmp_path / (run + '-hf')}"]

    mesh = f"--mesh=data:{mesh_axes[0]},model:{mesh_axes[1]}"
    cli.ok(cli.run("train_rm", *flags("many", mesh, *sharded), env=four))
    # The one-device reference: `train_rm` with the same flags and no --mesh, in-process (tests/inproc.py).
    inproc.train_rm(lm_folder, pairs=tmp_path / "train.csv", heldout_pairs=tmp_path / "heldout.csv",
                    workdir=tmp_path / "one", export=tmp_path / "one-hf", trainable="last_k", last_k=1, steps=steps,
                    checkpoint_every=2, batch_size=batch, learning_rate=learning_rate, warmup_steps=1)
    assert json.loads((tmp_path / "many" / "summary.json").read_text())["mesh"] == dict(zip(("data", "model"),
                                                                                             mesh_axes, strict=True))
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["mesh"] is None
    losses = [pd.read_csv(tmp_path / run / "train_log.csv")["loss"].to_numpy() for run in ("many", "one")]
    from safetensors.numpy import load_file

    from rmjax import nn
    from rmjax.loading import load
    from rmjax.loading.reward_head import reward_model_from_lm
    from tests import tolerance

    heads = [load_file(str(tmp_path / f"{run}-hf" / "model.safetensors"))["score.weight"] for run in ("many", "one")]
    # The mesh sums gradients in another order: the runs drift apart by rounding only (tests/tolerance.py);
    # 64 tokens bound every pair here.
    rm = reward_model_from_lm(load(str(lm_folder)), seed=0)
    params = nn.replace(rm.params, rm.config, **{"score.kernel": heads[1].T})
    drift = tolerance.adam_atol(learning_rate, steps, tolerance.grad_rel_error(rm.config, 64, 2 * batch * 64))
    np.testing.assert_allclose(losses[0], losses[1], atol=tolerance.bt_loss_atol(params, rm.config, 64, drift), rtol=0)
    np.testing.assert_allclose(heads[0], heads[1], atol=drift, rtol=0)

    # Killed on the mesh after its first checkpoint, then resumed: byte for byte the uninterrupted run. In-process
    # on the same 8 devices (tests/conftest.py): the two runs share one compilation of the mesh's programs, which a
    # command pays afresh (tests/cli.py: no persistent cache for them). The crash comes as the step after the
    # checkpoint is logged, once orbax has finished writing it; issue 22 was the restore onto the mesh.
    from rmjax.parallel.sharding import make_mesh
    from rmjax.train import recipe

    class Killed(Exception):
        pass

    def killed_after_first_checkpoint(message: str) -> None:
        if message.startswith("step 2:"):
            raise Killed

    real_train = recipe.train_reward_model
    settings = dict(pairs=tmp_path / "train.csv", heldout_pairs=tmp_path / "heldout.csv", workdir=tmp_path / "killed",
                    export=tmp_path / "killed-hf", trainable="last_k", last_k=1, steps=steps, checkpoint_every=2,
                    batch_size=batch, learning_rate=learning_rate, warmup_steps=1, fsdp=True, remat=True)
    on_mesh = make_mesh(dict(zip(("data", "model"), mesh_axes, strict=True)))
    monkeypatch.setattr(recipe, "train_reward_model",
                        lambda *a, **k: real_train(*a, **{**k, "log": killed_after_first_checkpoint}))
    with pytest.raises(Killed):
        inproc.train_rm(lm_folder, mesh=on_mesh, **settings)
    monkeypatch.setattr(recipe, "train_reward_model", real_train)
    assert (tmp_path / "killed" / "checkpoints" / "2").is_dir() and not (tmp_path / "killed" / "summary.json").exists()
    assert inproc.train_rm(lm_folder, mesh=on_mesh, **settings).resumed_from == 2
    for name in ("killed-hf/model.safetensors", "killed/train_log.csv", "killed/eval_log.csv"):
        assert (tmp_path / name).read_bytes() == (tmp_path / name.replace("killed", "many")).read_bytes(), name
    # A trained head has one output: another column is refused, not ignored.
    cli.user_error(cli.run("train_rm", *flags("col"), "--output_column=1"), "--output_column=1", "one-output")


def test_sizes_past_memory_or_data_are_refused_up_front(rm_folder, tmp_path, monkeypatch):
    """Each used to run out of memory, run for hours, or (past the context) score positions the model never saw,
    with status 0. Now: one line naming the flag, the estimate or the limit, and a value that fits. In-process
    (tests/inproc.py: the entry points only turn these flags into the spec); one through the command line."""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg
    from rmjax.search.sweep import SweepSpec, run_sweep
    from tests import inproc

    model, greatest = f"--model={rm_folder}", inproc.prompts("greatest")

    def gcg(**settings):
        return lambda: run_gcg(GcgSpec(inproc.options(rm_folder, tmp_path / "g.json"), greatest, GCGConfig(**settings)))

    def beam(out, token_ids=None, limit=None, batch_size=0, **settings):
        return lambda: run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / out), greatest, BeamConfig(**settings),
                                         token_ids, limit=limit, batch_size=batch_size))

    def sweep(**settings):
        return lambda: run_sweep(SweepSpec(inproc.options(rm_folder, tmp_path / "s.csv"), greatest, **settings))

    # A batch past the memory, through the command line: status 2, one line, before any weight is read.
    cli.user_error(cli.run("sweep", model, f"--out={tmp_path / 's.csv'}", "--batch_size=100000000"),
                   "--batch_size=100000000", "does not fit", "GiB", "is the largest that fits")
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        # More candidates than one step can sample: 2 positions x top 8, 1 swapped (2 on a retry) -> 8^2 = 64.
        inproc.refused(gcg(num_tokens=2, topk=8, search_width=10000000),
                       "--search_width=10000000", "64 distinct candidates", "--search_width=64")
        # A width the steps' history of evaluated sequences cannot hold (defaults: 8 tokens, top 64, 100 steps).
        line = inproc.refused(gcg(search_width=10000000), "--search_width=10000000", "does not fit",
                              "GiB of host memory of", "use --search_width=")
        fits = int(line.split("use --search_width=")[1].split()[0])
        assert 10_000 < fits < 10_000_000
        # A response past the context (512 positions) of the model.
        inproc.refused(gcg(num_tokens=600), "--num_tokens=600", "512 positions", "use --num_tokens=")
        words = tuple(range(1000, 1008))  # no special tokens: a beam of those alone is refused first
        inproc.refused(beam("b.csv", words, depth=600), "--depth=600", "512 positions", "use --depth=")
        # A batch past the memory, and one past the candidates there are.
        inproc.refused(sweep(batch_size=100000000), "--batch_size=100000000", "does not fit", "GiB",
                       "is the largest that fits")
        inproc.refused(sweep(limit=64, batch_size=100000), "--batch_size=100000", "64 candidates", "--batch_size=64")
        inproc.refused(beam("b.csv", token_ids=words[:3], batch_size=4096), "--batch_size=4096", "3 candidates",
                       "--batch_size=3")
        # the special tokens a beam leaves out are no candidates (this batch of 4 was accepted: 4 ids given)
        inproc.refused(beam("b.csv", token_ids=(0, *words[:3]), batch_size=4), "--batch_size=4", "3 candidates",
                       "--batch_size=3")
    # An exhaustive enumeration the host cannot list (40,000^3 partials at depth 4): refused before any forward.
    inproc.refused(beam("e.csv", limit=40000, exhaustive=True, allow_special=True, depth=4),
                   "--exhaustive --depth=4", "40,000 candidates", "use at most")
    assert not list(tmp_path.glob("*.csv")) and not list(tmp_path.glob("*.json"))


def test_a_store_that_is_not_what_a_run_writes_is_refused_or_its_batch_ignored(tmp_path, monkeypatch):
    """An unreadable manifest is refused naming the folder to delete (it was an AttributeError); a saved batch size
    that is no positive int (JSON true, 0, text) is not one to keep: the asked size is used; a chunk of another dtype
    or shape than the run's is refused naming the file to delete; a chunk whose bytes read back other than written
    is not saved."""
    from rmjax.errors import ResumeMismatchError
    from rmjax.runs.chunks import ChunkStore, resume_batch_size, store_dir

    out = tmp_path / "s.csv"
    store_dir(out).mkdir()
    manifest = store_dir(out) / "manifest.json"
    manifest.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(ResumeMismatchError, match=f"manifest.json is unreadable; delete {store_dir(out)}"):
        ChunkStore(out, {"job": "sweep"}, 4)
    for saved in (True, 0, "8"):
        manifest.write_text(json.dumps({"identity": {}, "chunk_size": 4, "batch_size": saved}), encoding="utf-8")
        assert resume_batch_size(out, 16) == 16, saved
    manifest.write_text(json.dumps({"identity": {}, "chunk_size": 4, "batch_size": 8}), encoding="utf-8")
    assert resume_batch_size(out, 16) == 8
    manifest.unlink()
    store = ChunkStore(out, {"job": "sweep"}, 4)
    chunk = [[1.0], [2.0], [3.0], [4.0]]
    for saved, why in ((np.asarray(chunk, np.float64), "float64 scores of shape (4, 1)"),
                       (np.asarray(chunk[:3], np.float32), "float32 scores of shape (3, 1)")):
        store.write(0, saved)
        with pytest.raises(ResumeMismatchError, match=rf"chunk-0000000000.npy holds {re.escape(why)} where float32"):
            store.read(0, (4, 1), lambda *args: None)
    store.write(0, np.asarray(chunk, np.float32))
    assert store.read(0, (4, 1), lambda *args: None).tolist() == chunk
    real = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: real(self)[:-1] + b"?")
    with pytest.raises(OSError, match="the bytes read back differ from those written"):
        store.write(4, np.asarray(chunk, np.float32))
    assert not store.has(4) and sorted(p.name for p in store.dir.iterdir()) == ["chunk-0000000000.npy",
                                                                               "manifest.json"]
