"""Refusals a fault hunt found after the weights had loaded (or after a whole GCG search): each is now said in one
line before any weight is read, from the configs and tokenizers alone."""

from __future__ import annotations

import shutil

from rmjax.search.beam import BeamConfig
from rmjax.search.beam_job import BeamSpec, run_beam
from rmjax.search.gcg_config import GCGConfig
from rmjax.search.gcg_job import GcgSpec, run_gcg
from tests import inproc
from tests.inproc import no_weights_read, refused
from tests.test_frontier import _swapped_tokenizer


def test_an_lm_of_another_tokenizer_a_too_large_enumeration_and_an_out_inside_the_lm_stop_before_loading(
        rm_folder, lm_folder, tmp_path, monkeypatch):
    swapped = str(_swapped_tokenizer(lm_folder, tmp_path / "swapped"))
    no_weights_read(monkeypatch)
    gcg = GCGConfig(num_tokens=2, steps=1, search_width=8, topk=8)
    # GCG had run its whole search, then refused the LM of its completion check
    refused(lambda: run_gcg(GcgSpec(inproc.options(rm_folder, tmp_path / "g.json"), inproc.prompts(), gcg,
                                    lm=swapped)), "--lm=", "another tokenizer")
    beam = BeamConfig(depth=2, beam=2)
    refused(lambda: run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / "b.csv"), inproc.prompts(), beam,
                                      limit=40, lm=swapped)), "--lm=", "another tokenizer")
    # an --exhaustive level that cannot fit the host: refused after the load, leaving a store that blocked the
    # smaller run the refusal advised (5000^3 partials of depth 4 pass any host's memory)
    exhaustive = BeamConfig(depth=4, exhaustive=True)
    refused(lambda: run_beam(BeamSpec(inproc.options(rm_folder, tmp_path / "e.csv"), inproc.prompts(), exhaustive,
                                      limit=5000)),
            "--exhaustive --depth=4 over", "partial responses at depth 4", "use at most")
    # the beam's --lm folder was not an input: an --out inside it was written there, and --overwrite deleted its
    # weights
    lm = tmp_path / "lm"
    shutil.copytree(lm_folder, lm)
    weights = (lm / "model.safetensors").read_bytes()
    refused(lambda: run_beam(BeamSpec(inproc.options(rm_folder, lm / "model.safetensors", overwrite=True),
                                      inproc.prompts(), beam, limit=40, lm=str(lm))), "inside a folder this run reads")
    assert (lm / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm", "swapped"]


def test_a_disagreement_writes_inside_none_of_the_models_it_reads(rm_folder, lm_folder, tmp_path, monkeypatch):
    """Side B's folder (and the prior's, the judge's) were not inputs: --out inside one was written there."""
    from rmjax.search.disagree_job import run_disagree
    from tests import cli
    from tests.test_disagree import _spec

    side_b = tmp_path / "b"
    shutil.copytree(rm_folder, side_b)
    cli.edit_tensor(side_b, "score.weight", lambda w: w + 1)  # another model (a copy alone is refused as the same)
    no_weights_read(monkeypatch)
    for out in (side_b / "d", lm_folder / "d"):
        refused(lambda out=out: run_disagree(_spec(rm_folder, side_b, out, lm_folder)),
                "inside a folder this run reads")
        assert not out.exists()


def test_a_prior_that_ends_turns_otherwise_is_refused_before_loading(rm_folder, lm_folder, tmp_path, monkeypatch):
    """The frontier read the prior's end of turn only after the RM, the prior and the judge had loaded."""
    from rmjax.search import fluent
    from rmjax.search.frontier_job import FrontierConfig, FrontierSpec, run_frontier

    lm = tmp_path / "lm"
    shutil.copytree(lm_folder, lm)
    template = (lm / "chat_template.jinja").read_text()
    assert "<|im_end|>" in template
    (lm / "chat_template.jinja").write_text(template.replace("<|im_end|>", "<|endoftext|>"))
    no_weights_read(monkeypatch)
    spec = FrontierSpec(inproc.options(rm_folder, tmp_path / "f"), inproc.prompts(),
                        FrontierConfig(lambdas=(0.0,), forwards=200, z_sample=64),
                        fluent.FluentConfig(num_tokens=3, samples=8), lm=str(lm), judge=str(lm_folder))
    refused(lambda: run_frontier(spec), f"--lm={lm} ends a turn with token", "whole responses need one end of turn")
    assert not (tmp_path / "f").exists()
