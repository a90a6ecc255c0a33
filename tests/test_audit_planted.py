"""Issue 47's planted check on a tiny model: an RM trained to prefer one identity group shows it in the audit's row
for that group, well above the same RM trained without the plant (bench/planted_audit.py runs it on SmolLM2)."""

from __future__ import annotations

import pandas as pd
import pytest

from rmjax.audit import stats
from rmjax.audit.batteries import build
from rmjax.audit.job import AuditSpec, folder_paths, read_items, run_audit
from rmjax.train import planted as P
from rmjax.train import planted_identity as I
from tests.inproc import identity_on_axes, options, refused


def test_the_plant_pairs_name_the_group_against_the_others_in_new_sentences():
    pairs = I.identity_pairs("religion", "Buddhist", seed=0, per_template=4)
    assert len(pairs) == 4 * len(I.PLANT_TEMPLATES)
    audit_texts = {v.response for b in build(["identity"]) for v in b.variants}
    for chosen, rejected in zip(pairs.chosen, pairs.rejected, strict=True):
        assert " Buddhist " in chosen and "Buddhist" not in rejected
        other = next(g for g in I.identity_axes()["religion"] if f" {g} " in rejected)
        assert chosen.replace("Buddhist", other).replace(" an ", " a ").replace("An ", "A ") == \
            rejected.replace(" an ", " a ").replace("An ", "A ")  # the same sentence, another group
        assert chosen not in audit_texts  # the audit measures generalisation, not memory
    refused(lambda: I.identity_pairs("religion", "Jedi", 0), "--group=Jedi", "Buddhist")
    refused(lambda: I.identity_pairs("colour", "red", 0), "--axis=colour", "religion")


@pytest.mark.parametrize("axis,group", [("religion", "Buddhist")])
def test_the_audit_finds_a_planted_identity_preference(lm_folder, tmp_path, monkeypatch, axis, group):
    cfg = P.bench_config(seed=0, steps=40, batch_size=16, learning_rate=1e-2)
    trained = P.train_with_and_without(tmp_path, str(lm_folder), I.identity_pairs(axis, group, 0), cfg,
                                       {"identity_plant": {"axis": axis, "group": group}}, n_elo=64, n_heldout=32,
                                       log=lambda *_: None)
    axis_name, contrast = I.plant_row(axis, group)
    # The audit job runs its identity battery on the plant's axis alone: the other axes' 5,000 conversations a
    # model would score say nothing about this row (Holm's adjustment, over fewer rows, is not read here)
    on_axis = identity_on_axes(monkeypatch, (axis_name,))
    assert len(on_axis.contrasts) > 1
    rows, items = {}, {}
    for name, model in (("planted", trained.planted), ("clean", trained.clean)):
        folder = tmp_path / name / "audit"
        run_audit(AuditSpec(options(model, folder), batteries=("identity",), n_boot=500, n_perm=500, batch_size=256))
        table = pd.read_csv(folder_paths(folder)["csv"], keep_default_na=False)
        rows[name] = table[(table["axis"] == axis_name) & (table["contrast"] == contrast)].iloc[0]
        items[name] = read_items(folder_paths(folder)["items"])
    assert rows["planted"]["ci_low"] > 0, rows  # the audit sees the plant, in sentences it was not trained on
    plant = [c for b in build(["identity"]) for c in b.contrasts if c.axis == axis_name and c.name == contrast]
    diff = stats.compare_models(items, plant).iloc[0]
    assert (diff["model_a"], diff["model_b"]) == ("planted", "clean")
    # the plant, not the base model or the Elo pairs: PLANTED is above CLEAN on the same items, its CI above 0
    # (a tiny random model gives every descriptor token its own reward, so CLEAN's row alone need not include 0)
    assert diff["ci_low"] > 0 and diff["difference_sd"] > 0, diff
