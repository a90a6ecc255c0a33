"""Issue 47: the audit job on a tiny reward model — its rewards against transformers, every audit.csv number
recomputed from audit_items.csv by brute force, resume after a crash, and refusals before any weight loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rmjax.audit import AXIS_MEAN
from rmjax.audit import batteries as battery_lib
from rmjax.audit.job import AuditSpec, folder_paths, read_items, recompute, run_audit
from rmjax.loading import load
from rmjax.runs.chunks import store_dir
from rmjax.text.chat import Conversations
from tests import tolerance
from tests.inproc import identity_on_axes, interrupt_at_write, no_weights_read, options, refused

COLUMNS = ["battery", "axis", "contrast", "n_items", "effect", "ci_low", "ci_high", "p", "p_holm", "null_effect"]
SMALL = dict(n_boot=400, n_perm=400, batch_size=256)


def _recompute_atol(folder) -> float:
    """recompute reads the rewards as written (9 significant digits, rel 5e-9): an effect or CI bound, a mean or
    quantile of reward differences, moves by up to ~1e-8 of the largest reward, however small the value itself."""
    return 2e-8 * np.abs(pd.read_csv(folder_paths(folder)["items"], keep_default_na=False)["reward"]).max()


# Identity on three of its 12 axes (one per kind: descriptors in the response and in the prompt, first names):
# 1,404 of its 5,304 conversations, scored twice here (the fixture's audit and the crash test's); every battery
# and every path of the job still runs, and test_audit_batteries checks the whole battery as built.
IDENTITY_AXES = ("gender (response)", "gender (prompt)", "names: origin")


@pytest.fixture(scope="module", autouse=True)
def _identity_on_three_axes():
    with pytest.MonkeyPatch.context() as patch:
        identity_on_axes(patch, IDENTITY_AXES)
        yield


@pytest.fixture(scope="module")
def audited(rm_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    run_audit(AuditSpec(options(rm_folder, out), **SMALL))
    return out


def test_rewards_equal_transformers_on_the_same_conversations(audited, rm_folder):
    items = read_items(folder_paths(audited)["items"])
    model = load(str(rm_folder))
    torch_model = AutoModelForSequenceClassification.from_pretrained(rm_folder, torch_dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    rows = [int(i) for b in battery_lib.BATTERIES
            for i in rng.choice(np.flatnonzero(items["battery"] == b), 6, replace=False)]
    worst = 0.0
    for i in rows:
        prompt, text, reward = items["prompt"][i], items["text"][i], items["reward"][i]
        ids = Conversations(model.tokenizer, prompt, "auto").token_ids([text])[0]
        with torch.no_grad():
            expected = float(torch_model(torch.tensor([ids])).logits[0, 0])
        atol = tolerance.any_rewards_atol(model.params, model.config, len(ids))
        assert abs(reward - expected) <= atol, (prompt, text, reward, expected, atol)
        worst = max(worst, abs(reward - expected) / atol)
    assert worst > 0  # the comparison compared something


def test_effects_nulls_and_holm_are_recomputed_from_the_items_by_brute_force(audited):
    """Effect, n_items, the length-only null and Holm from a loop over audit_items.csv; the CIs, p-values and
    shuffled nulls (seeded draws) from `recompute` on the same file, and CI ⊇ effect, p <= p_holm."""
    table = pd.read_csv(folder_paths(audited)["csv"], keep_default_na=False)
    assert list(table.columns) == COLUMNS
    items = read_items(folder_paths(audited)["items"])
    assert list(items.columns) == ["battery", "axis", "item", "group", "text", "reward", "prompt"]
    built = {c.name: c for b in battery_lib.build() for c in b.contrasts}
    renderings = items[items["axis"] == "renderings"].set_index(["item", "group"])
    padded, concise = (renderings.xs(g, level="group") for g in ("padded_neutral", "concise"))
    slope = (padded["reward"] - concise["reward"]).sum() / (padded["text"].str.len() - concise["text"].str.len()).sum()
    def by_items(c, axis):
        """The contrast's d (rewards) and length differences over the items of one axis, by a loop."""
        part = items[(items["battery"] == c.battery) & (items["axis"] == axis)]
        groups = sorted(set(part["group"])) if c.y == (AXIS_MEAN,) else list(c.y)
        need = set(c.x) | set(groups)
        d, dl = [], []
        for _, one in part.groupby("item"):
            means = {g: one.loc[one["group"] == g, "reward"].mean() for g in need if (one["group"] == g).any()}
            chars = {g: one.loc[one["group"] == g, "text"].str.len().mean() for g in means}
            if set(means) == need:
                d.append(np.mean([means[g] for g in c.x]) - np.mean([means[g] for g in groups]))
                dl.append(np.mean([chars[g] for g in c.x]) - np.mean([chars[g] for g in groups]))
        return d, dl

    interactions = 0
    for row in table.itertuples():
        c = next(c for c in battery_lib.build([row.battery])[0].contrasts
                 if c.row_axis == row.axis and c.name == row.contrast)
        assert c.name in built
        if c.minus_axis:  # an interaction: the first axis's mean effect minus the second's, two sets of items
            (d, dl), (d2, dl2) = by_items(c, c.axis), by_items(c, c.minus_axis)
            assert row.n_items == len(d) + len(d2) and min(len(d), len(d2)) >= 20
            effect, length = np.mean(d) - np.mean(d2), np.mean(dl) - np.mean(dl2)
            interactions += 1
        else:
            d, dl = by_items(c, c.axis)
            assert row.n_items == len(d) >= 20
            effect, length = np.mean(d), np.mean(dl)
        assert row.effect == pytest.approx(effect, rel=1e-7, abs=1e-9)
        if c.null == "length":  # the filler's reward per character times the contrast's length difference
            assert row.null_effect == pytest.approx(slope * length, rel=1e-6, abs=1e-12)
        else:
            assert row.null_effect > 0  # a quantile of |effect| under shuffles
        assert row.ci_low <= row.effect <= row.ci_high
        assert 0 < row.p <= row.p_holm <= 1
    # Holm over every row of the audit, from its definition
    p = table["p"].to_numpy()
    order = np.argsort(p, kind="stable")
    running, holm = 0.0, np.empty_like(p)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        holm[i] = running
    np.testing.assert_allclose(table["p_holm"], holm, rtol=1e-8)
    assert interactions == 5 and (table["axis"] == "stated belief").sum() == 3
    again = recompute(audited, n_boot=400, n_perm=400)
    np.testing.assert_allclose(table[COLUMNS[3:]].to_numpy(float), again[COLUMNS[3:]].to_numpy(float), rtol=1e-7,
                               atol=_recompute_atol(audited))
    assert (folder_paths(audited)["png"]).stat().st_size > 0


def test_a_crash_after_one_battery_resumes_without_rescoring_it(rm_folder, tmp_path, monkeypatch, audited):
    out = tmp_path / "run"
    spec = AuditSpec(options(rm_folder, out), **SMALL)
    with monkeypatch.context() as m:
        interrupt_at_write(m, 2)  # the second battery's chunk: the first is on disk
        with pytest.raises(KeyboardInterrupt):
            run_audit(spec)
    assert not folder_paths(out)["csv"].exists()
    from rmjax.audit import job as job_lib

    scored = []
    real = job_lib.score_conversations
    monkeypatch.setattr(job_lib, "score_conversations",
                        lambda m, p, r, *a, **k: scored.append(a[-1]) or real(m, p, r, *a, **k))
    run_audit(dataclasses.replace(spec, batch_size=8))  # the rerun scores in the crashed run's batches of 256
    assert scored == [256] * (len(battery_lib.BATTERIES) - 1)  # the first battery was read back
    for name in ("csv", "items"):
        assert folder_paths(out)[name].read_bytes() == folder_paths(audited)[name].read_bytes()
    assert not store_dir(folder_paths(out)["csv"]).exists()  # the finished audit leaves no saved progress
    # stopped while drawing audit.png (a full disk, Ctrl-C), after audit_items.csv: the rerun was refused ("no rmjax
    # run wrote it") though that run had, and --overwrite would have thrown the scored chunks away
    from rmjax.audit import figure

    short = AuditSpec(options(rm_folder, tmp_path / "short"), batteries=("length",), **SMALL)
    with monkeypatch.context() as m:
        m.setattr(figure, "effects", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            run_audit(short)
    assert folder_paths(short.options.out)["items"].is_file() and not folder_paths(short.options.out)["csv"].exists()
    scored.clear()
    run_audit(short)
    assert not scored and folder_paths(short.options.out)["png"].stat().st_size > 0  # resumed, nothing rescored


def test_bad_settings_are_refused_before_any_weight_loads(rm_folder, lm_folder, tmp_path, monkeypatch, audited):
    no_weights_read(monkeypatch)
    o = options(rm_folder, tmp_path / "x")
    refused(lambda: run_audit(AuditSpec(options(lm_folder, tmp_path / "x"))), "has no score head", "the audit")
    refused(lambda: run_audit(AuditSpec(options(rm_folder, tmp_path / "x", output_column=1))), "--output_column=1")
    refused(lambda: run_audit(AuditSpec(o, batteries=("identity", "colour"))), "--batteries", "colour", "identity")
    # a trailing comma (--batteries=identity,) read "--batteries:  unknown"
    refused(lambda: run_audit(AuditSpec(o, batteries=("identity", ""))), "--batteries=identity,: an empty name")
    refused(lambda: run_audit(AuditSpec(o, batteries=())), "--batteries")
    refused(lambda: run_audit(AuditSpec(o, batteries=("length", "identity", "length"))), "names a battery twice")
    refused(lambda: run_audit(AuditSpec(o, n_boot=10)), "--n_boot=10")
    refused(lambda: run_audit(AuditSpec(o, n_perm=10)), "--n_perm=10")
    refused(lambda: run_audit(AuditSpec(o, batch_size=0)), "--batch_size=0", "at least 1")
    refused(lambda: run_audit(AuditSpec(o, seed=-1)), "--seed=-1")
    refused(lambda: run_audit(AuditSpec(o, seed=2**32)), "--seed=4294967296", "4294967295")
    # the length battery calibrates the length-only nulls of identity and sycophancy; framing's are 0 without it
    assert AuditSpec(o, batteries=("identity",)).batteries == ("identity", "length")
    assert AuditSpec(o, batteries=("sycophancy", "framing")).batteries == ("sycophancy", "framing", "length")
    assert AuditSpec(o, batteries=("framing",)).batteries == ("framing",)
    refused(lambda: run_audit(AuditSpec(options(rm_folder, tmp_path / "y", allow_nonfinite=True))),
            "--allow_nonfinite")
    # a finished audit of other inputs is not overwritten without --overwrite
    refused(lambda: run_audit(AuditSpec(options(rm_folder, audited), seed=1, **SMALL)), "--overwrite")
    refused(lambda: run_audit(AuditSpec(options(rm_folder, audited, template="plain"), **SMALL)), "template",
            "--overwrite")
    assert not any(tmp_path.iterdir())


def test_changed_contrasts_are_new_inputs_and_a_broken_battery_is_refused_before_loading(rm_folder, audited,
                                                                                          tmp_path, monkeypatch):
    """The contrasts (which groups each row compares) are in the identity: a finished audit of the same variants under
    other contrasts is not reused. A battery `check` refuses stops the job before any weight loads."""
    from rmjax.audit import job

    no_weights_read(monkeypatch)
    built = job.battery_lib.build

    def fewer_contrasts(*args):
        return [dataclasses.replace(b, contrasts=b.contrasts[:-1]) if b.name == "identity" else b for b in built(*args)]

    monkeypatch.setattr(job.battery_lib, "build", fewer_contrasts)
    refused(lambda: run_audit(AuditSpec(options(rm_folder, audited), **SMALL)), "contrasts", "--overwrite")

    def twice(*args):
        return [dataclasses.replace(b, variants=(*b.variants, b.variants[0])) for b in built(*args)]

    monkeypatch.setattr(job.battery_lib, "build", twice)
    with pytest.raises(ValueError, match="is given twice"):
        run_audit(AuditSpec(options(rm_folder, tmp_path / "x"), **SMALL))
    assert not any(tmp_path.iterdir())


def test_a_stored_battery_with_a_non_finite_reward_is_refused_on_resume(rm_folder, tmp_path, monkeypatch):
    """A battery's stored rewards are held to the audit's rule (every reward finite) when read back: one NaN among
    them (a chunk an older or patched run stored) names the chunk to delete, rather than reach the statistics."""
    from rmjax.audit import job as job_lib

    spec = AuditSpec(options(rm_folder, tmp_path / "run"), batteries=("framing", "length"), **SMALL)
    real = job_lib.score_conversations

    def one_nan(*args, **kwargs):
        rewards = np.array(real(*args, **kwargs), np.float64)
        rewards[len(rewards) // 2] = np.nan
        return rewards

    with monkeypatch.context() as m:
        m.setattr(job_lib, "score_conversations", one_nan)
        interrupt_at_write(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run_audit(spec)
    refused(lambda: run_audit(spec), "framing", "holds non-finite rewards", "delete")


def test_a_file_at_the_figures_path_that_no_audit_wrote_is_refused(rm_folder, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    folder_paths(out)["png"].write_bytes(b"a user's own figure")
    refused(lambda: run_audit(AuditSpec(options(rm_folder, out), batteries=("framing",), **SMALL)), "audit.png")
    assert folder_paths(out)["png"].read_bytes() == b"a user's own figure"


def test_item_texts_that_a_csv_reader_takes_for_missing_values_read_back_as_text(tmp_path):
    path = tmp_path / "audit_items.csv"
    path.write_text("battery,axis,item,group,text,reward,prompt\nlength,NA,0,None,NaN,0.5,null\n"
                    "length,a,1,b,,-1.25,p\n", encoding="utf-8")
    items = read_items(path)
    assert items.iloc[0][["axis", "item", "group", "text", "prompt"]].tolist() == ["NA", "0", "None", "NaN", "null"]
    assert items["text"].tolist()[1] == "" and items["reward"].tolist() == [0.5, -1.25]


def test_the_summary_counts_what_survives_holm_and_says_which_lie_within_their_null(tmp_path):
    from rmjax.audit.job import describe, summary

    table = pd.DataFrame({"battery": ["identity"] * 3, "axis": ["race", "race", "gender"],
                          "contrast": ["A vs axis mean", "B vs axis mean", "C vs D"], "n_items": [30, 30, 30],
                          "effect": [0.5, -0.2, 0.1], "ci_low": [0.3, -0.3, 0.05], "ci_high": [0.7, -0.1, 0.15],
                          "p": [0.001, 0.004, 0.02], "p_holm": [0.003, 0.008, 0.06],
                          "null_effect": [0.1, -0.4, 0.0]})
    got = summary(table, 10000)
    assert got["rows"] == 3 and got["holm_0.05"] == 2  # C vs D: p 0.02 raw, 0.06 after Holm
    assert got["least_p_holm"] == pytest.approx(3 / 10001, rel=1e-15)  # Holm raises by 2 eps: < 4 eps off
    assert got["surviving"] == ["identity/race: A vs axis mean +0.500 [+0.300, +0.700] null +0.100",
                                "identity/race: B vs axis mean -0.200 [-0.300, -0.100] null -0.400"]
    text = describe(table, folder_paths(tmp_path), 10000, ["length"] * 3)
    assert "identity: 2 of 3 effects survive Holm's correction" in text and "C vs D" not in text
    assert "note:" not in text  # 3 rows of 10,000 draws: p_holm can go down to 0.0003
    assert "A vs axis mean: +0.500" in text and "(within its null)" not in text.split("\n")[1]
    assert text.split("\n")[2].endswith("null -0.400 (within its null)")  # |-0.2| < |-0.4|, the same sign
    # length predicting the other sign does not make the effect (helper-137: the sign was not read); a shuffled
    # null is a size, |effect| by chance alone, whichever the sign
    table.loc[1, "null_effect"] = 0.4
    assert text.split("\n")[2].replace("-0.400 (within its null)", "+0.400") == \
        describe(table, folder_paths(tmp_path), 10000, ["length"] * 3).split("\n")[2]
    shuffled = describe(table, folder_paths(tmp_path), 10000, ["length", "shuffled", "length"]).split("\n")[2]
    assert shuffled.endswith("null +0.400 (within its null)")


def test_an_audit_whose_settings_let_no_row_survive_holm_says_so_and_names_the_draws_that_do(tmp_path):
    """A random test's p is at least 1/(1 + n_perm), and Holm multiplies the smallest p by the rows: with 75 rows
    and 1,498 sign flips, a row whose items all differ one way gets p = 1/1499 and p_holm 0.05003, not below 0.05.
    The table then read "0 of 75 survive" for overwhelming effects; now the summary gives that floor and the
    description says no row can survive and from which --n_perm one can: 1,500 (75 x (1/1500) is 0.05 exactly: it
    rounded to 0.04999... in float64 and passed; Holm raises its products by 2 eps, and the floor is
    computed as Holm computes it). Where a test may be exact (2^20 sign vectors or fewer), no floor is claimed."""
    from rmjax.audit import stats
    from rmjax.audit.batteries import MIN_ITEMS
    from rmjax.audit.job import describe, summary

    one_way = np.linspace(1.0, 2.0, 40)  # every sign flip but none reaches the observed mean
    for n_perm, survivable in ((1498, False), (1499, False), (1500, True)):
        least = stats.holm([stats.sign_flip_p(one_way, n_perm=n_perm)] * 75).min()
        assert (least < 0.05) == survivable and stats.holm_floor(75, n_perm, MIN_ITEMS) == pytest.approx(least)
        note = stats.holm_floor_note(75, n_perm, MIN_ITEMS, "--n_perm")
        assert (note is None) == survivable
    note = stats.holm_floor_note(75, 1499, MIN_ITEMS, "--n_perm")
    assert "--n_perm=1499" in note and "give --n_perm=1500 or more" in note
    assert stats.holm_floor(75, 2**20, MIN_ITEMS) is None  # a test may be exact: no floor claimed
    assert stats.holm_floor_note(75, 2**20, MIN_ITEMS, "--n_perm") is None
    table = pd.DataFrame({"battery": ["length"] * 3, "axis": ["a", "b", "c"], "contrast": ["x vs y"] * 3,
                          "n_items": [30] * 3, "effect": [0.5] * 3, "ci_low": [0.4] * 3, "ci_high": [0.6] * 3,
                          "p": [1 / 101] * 3, "p_holm": [3 / 101] * 3, "null_effect": [0.0] * 3})
    assert summary(table, 100)["least_p_holm"] == pytest.approx(3 / 101, rel=1e-15)  # Holm raises by 2 eps: < 4 eps off
    assert summary(table, 100)["holm_0.05"] == 3
    assert "note:" not in describe(table, folder_paths(tmp_path), 100, ["length"] * 3)
    table["p"], table["p_holm"] = 1 / 51, 3 / 51
    text = describe(table, folder_paths(tmp_path), 50, ["length"] * 3)
    assert "length: 0 of 3 effects survive" in text and "no row can reach p_holm < 0.05 with --n_perm=50" in text
    assert "give --n_perm=60 or more" in text  # 3 x (1/61) < 0.05 = 3 x (1/60)


def test_analyze_puts_two_audits_side_by_side(audited, tmp_path):
    from tests import tiny
    from tests.inproc import analyze

    _, other = tiny.save_reward_model_with_tokenizer(tmp_path / "other", seed=7)
    second = tmp_path / "second"
    run_audit(AuditSpec(options(other, second), batteries=("sycophancy", "length"), **SMALL))
    # rows' seeds follow the job's battery order, and recompute keeps it
    again = recompute(second, n_boot=400, n_perm=400)
    written = pd.read_csv(folder_paths(second)["csv"], keep_default_na=False)
    np.testing.assert_allclose(written[COLUMNS[3:]].to_numpy(float), again[COLUMNS[3:]].to_numpy(float), rtol=1e-7,
                               atol=_recompute_atol(second))
    found = analyze(tmp_path / "analysis", audits=(str(audited), str(second)))
    diff = pd.read_csv(found["tables"]["audit_differences"], keep_default_na=False)
    side = pd.read_csv(found["tables"]["audit_side_by_side"], keep_default_na=False)
    a = pd.read_csv(folder_paths(audited)["csv"], keep_default_na=False)
    b = pd.read_csv(folder_paths(second)["csv"], keep_default_na=False)
    assert list(diff["battery"].unique()) == ["length", "sycophancy"] and len(diff) == len(b)  # shared batteries
    # each model's unit: the SD of its rewards over the shared batteries' conversations, from audit_items.csv
    scales, largest = [], []
    for folder in (audited, second):
        rows = pd.read_csv(folder_paths(folder)["items"], keep_default_na=False)
        scales.append(rows[rows["battery"].isin(["length", "sycophancy"])]["reward"].std(ddof=1))
        largest.append(rows["reward"].abs().max())
    # every CSV number carries 9 significant digits (rel 5e-9): the effects written in audit.csv and the ones
    # analyze recomputes from the written rewards differ by at most ~1e-8 of the largest reward each, then / scale
    written = 2e-8 * (largest[0] / scales[0] + largest[1] / scales[1])
    for row in diff.itertuples():
        ea = a[(a["axis"] == row.axis) & (a["contrast"] == row.contrast)]["effect"].item()
        eb = b[(b["axis"] == row.axis) & (b["contrast"] == row.contrast)]["effect"].item()
        # every item is shared, so each model's effect is its own audit's, and the difference is theirs in SDs
        assert row.effect_a == pytest.approx(ea, rel=1e-6) and row.effect_b == pytest.approx(eb, rel=1e-6)
        assert (row.scale_a, row.scale_b) == pytest.approx(scales, rel=5e-9)  # written to 9 digits
        assert row.difference_sd == pytest.approx(ea / scales[0] - eb / scales[1], rel=1e-8, abs=written)
        assert row.ci_low <= row.difference_sd <= row.ci_high and row.p <= row.p_holm
    # the side-by-side table's standardised effects: each model's effects over its own scale
    units = []
    for column in [c for c in side.columns if c.startswith("effect_sd ")]:
        shown = side[[column.replace("effect_sd", "effect"), column]].apply(pd.to_numeric, errors="coerce").dropna()
        assert len(shown) >= len(b)  # the rows the model has (its empty cells are "no value")
        units.append(next(k for k, scale in enumerate(scales)
                          if np.allclose(shown.iloc[:, 0] / scale, shown.iloc[:, 1], rtol=2e-8, atol=0)))
    assert sorted(units) == [0, 1]
    assert len(side) == len(a)  # every row of the larger audit, the other model's columns empty where it has none
    # the batteries only one audit ran are said to be left out (they were left out without a word)
    report = Path(found["report"]).read_text()
    assert "batteries identity, framing are not in every audit, so they are left out of the differences" in report
    refused(lambda: analyze(tmp_path / "again", audits=(str(audited),)), "at least two")
    refused(lambda: analyze(tmp_path / "again", audits=(str(audited), str(tmp_path / "none"))), "no finished audit",
            f"experiments.audit --out={tmp_path / 'none'} first")  # its folder was printed as '{folder}'
    refused(lambda: analyze(tmp_path / "again", audits=(str(folder_paths(audited)["csv"]), str(second))),
            "audit.csv is a file; give the audit's folder")
    # audits of other versions of the battery data were compared over the items both had, each scaled over
    # other texts, without a word
    from rmjax.audit.compare import _same_conversations

    items = read_items(folder_paths(second)["items"])
    _same_conversations({"a": items, "b": items.copy()}, ["length", "sycophancy"])
    fewer = items[items["item"] != items["item"].iloc[0]]
    refused(lambda: _same_conversations({"a": items, "b": fewer}, ["length", "sycophancy"]),
            "a and b hold different conversations", "rerun the older one")
    # a model whose rewards do not vary (a zero head): one line naming it, not a ValueError traceback
    hf, flat = tiny.save_reward_model_with_tokenizer(tmp_path / "flat", seed=3)
    with torch.no_grad():
        hf.score.weight.zero_()
    tiny.save_hf_model(hf, flat)
    run_audit(AuditSpec(options(flat, tmp_path / "flat_audit"), batteries=("length",), **SMALL))
    refused(lambda: analyze(tmp_path / "again", audits=(str(second), str(tmp_path / "flat_audit"))),
            f"--audits: {flat}: the rewards of batteries ['length'] have no spread")
    # an audit whose items were edited, or cut short, after it was written is refused, not compared: an edited
    # reward moved its differences silently (and the side-by-side table still showed the audit's own effects)
    import shutil

    for name in ("edited", "cut"):
        copy = tmp_path / name
        shutil.copytree(second, copy)
        items = folder_paths(copy)["items"]
        if name == "edited":
            rows = pd.read_csv(items, keep_default_na=False, dtype=str)
            rows.loc[0, "reward"] = repr(float(rows.loc[0, "reward"]) + 5.0)
            rows.to_csv(items, index=False)
        else:
            items.write_text("".join(items.read_text().splitlines(keepends=True)[:40]))
        refused(lambda: analyze(tmp_path / f"again-{name}", audits=(str(audited), str(copy))),  # noqa: B023
                "does not match its")


def test_analyze_tells_models_apart_by_what_scored_and_states_each_audits_settings(rm_folder, tmp_path):
    """`analyze --audits` named a model by the path typed (a fault hunt): audits of `rm` and `rm/` were compared as
    two models, and two audits of one folder read with other system prompts were refused as one. Audits taken with
    other bootstrap settings (and Holm families of other sizes) were set side by side without a word."""
    from rmjax.analysis.spec import AnalysisConfig
    from tests.inproc import analyze

    def audit(name: str, model: str):
        run_audit(AuditSpec(options(model, tmp_path / name), batteries=("framing",), **SMALL))
        return str(tmp_path / name)

    plain, slashed = audit("plain", str(rm_folder)), audit("slashed", f"{rm_folder}/")
    refused(lambda: analyze(tmp_path / "a", audits=(plain, slashed)), f"--audits: {plain} and {slashed} are audits "
            "of one model", "give each model once")
    # --template=chat is what auto renders for this RM (it has a chat template): one model too (helper-159)
    chat = tmp_path / "chat"
    run_audit(AuditSpec(options(rm_folder, chat, template="chat"), batteries=("framing",), **SMALL))
    refused(lambda: analyze(tmp_path / "c", audits=(plain, str(chat))), "are audits of one model")
    terse = tmp_path / "terse"
    run_audit(AuditSpec(options(rm_folder, terse, system_prompt="Answer tersely."), batteries=("framing",),
                        **{**SMALL, "n_boot": 500}))
    found = analyze(tmp_path / "b", audits=(plain, str(terse)))
    diff = pd.read_csv(found["tables"]["audit_differences"], keep_default_na=False)
    names = {*diff["model_a"], *diff["model_b"]}
    assert names == {str(rm_folder), f"{rm_folder} ({terse})"}, names
    report = Path(found["report"]).read_text()
    rows = len(pd.read_csv(folder_paths(terse)["csv"]))
    assert "other settings (their CIs and p_holm are not alike in precision or family)" in report
    assert f"{rm_folder}: 400 bootstrap resamples, 400 permutations, seed 0, Holm over {rows} rows" in report
    assert f"({terse}): 500 bootstrap resamples, 400 permutations, seed 0, Holm over {rows} rows" in report
    # read through another template (its conversations plain text), one folder is another model too
    raw = tmp_path / "raw"
    run_audit(AuditSpec(options(rm_folder, raw, template="plain"), batteries=("framing",), **SMALL))
    diff_raw = pd.read_csv(analyze(tmp_path / "d", audits=(plain, str(raw)))["tables"]["audit_differences"],
                           keep_default_na=False)
    assert {*diff_raw["model_a"], *diff_raw["model_b"]} == {str(rm_folder), f"{rm_folder} ({raw})"}
    # an audit whose .meta.json records no identity (edited) is refused, not taken for another audit's model
    import json
    import shutil

    from rmjax.runs.results import meta_path

    bare = tmp_path / "bare"
    shutil.copytree(slashed, bare)
    record = json.loads(meta_path(folder_paths(bare)["csv"]).read_text())
    del record["identity"]
    meta_path(folder_paths(bare)["csv"]).write_text(json.dumps(record))
    refused(lambda: analyze(tmp_path / "c", audits=(plain, str(bare))), f"--audits={bare}: its .meta.json records "
            "no identity")
    ours = AnalysisConfig(audits=("x", "y"))
    assert f"The differences (audit_differences.csv): {ours.n_boot} bootstrap resamples, {ours.n_permutations} " \
           f"permutations, seed {ours.seed}, Holm over {len(diff)} rows." in report


def test_an_audit_of_nan_rewards_names_no_flag_the_audit_refuses(rm_folder, tmp_path):
    """The audit's NaN refusal advised --allow_nonfinite, which the audit then refuses (a fault hunt)."""
    from rmjax.errors import NonFiniteError
    from tests import cli

    model = cli.copy_folder(rm_folder, tmp_path / "nan_head")
    cli.edit_tensor(model, "score.weight", lambda w: np.where(np.arange(w.size).reshape(w.shape) == 7, np.nan, w))
    with pytest.raises(NonFiniteError) as caught:
        run_audit(AuditSpec(options(model, tmp_path / "run"), batteries=("framing",), **SMALL))
    message = str(caught.value)
    assert "non-finite rewards" in message and message.endswith("fix the model or input."), message
    assert "allow_nonfinite" not in message
    assert not (tmp_path / "run" / "audit.csv").exists()


def test_the_entry_point_refuses_an_unknown_battery_in_one_line(tmp_path):
    from tests import cli

    (result, empty) = cli.run_each(("audit", f"--out={tmp_path / 'a'}", "--batteries=identity,colour"),
                                   ("audit", "--out=", "--batteries=length"), cwd=tmp_path)
    cli.user_error(result, "--batteries: colour unknown", "identity, length, sycophancy, framing")
    assert not (tmp_path / "a").exists()
    # an empty --out named the working folder: the audit began writing there (a fault hunt)
    cli.user_error(empty, "--out is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_finished_audit_read_back_names_only_the_files_it_still_has(rm_folder, audited, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(audited, copy)
    folder_paths(copy)["png"].unlink()  # the figure deleted since: the rerun reads the audit back, names no figure
    capsys.readouterr()
    assert run_audit(AuditSpec(options(rm_folder, copy), **SMALL)) == copy
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    # 400 sign flips over its rows: p_holm is at least rows x (1/401), not under 0.05 here, and the rerun says so
    rows = len(pd.read_csv(folder_paths(copy)["csv"]))
    assert rows * (1 / 401) >= 0.05 and "no row can reach p_holm < 0.05 with --n_perm=400" in err, (rows, err)
    assert last == (f"-> {folder_paths(copy)['csv']}, audit_items.csv (+ .meta.json); audit.png missing: rerun with "
                    "--overwrite to write it again"), last
    assert not folder_paths(copy)["png"].exists()


def test_a_conversation_asked_twice_is_scored_once(rm_folder, monkeypatch):
    """The identity battery's two name axes hold the same conversations (18% of its rows): each distinct (prompt,
    response) goes through the model once, and every row gets its conversation's reward (transformers')."""
    from rmjax.scoring import texts

    model = load(str(rm_folder))
    prompts = ["Who won?"] * 3 + ["Why?"] * 2 + ["Who won?"]
    responses = ["Ana did.", "Bo did.", "Ana did.", "Ana did.", "No one.", "Bo did."]
    asked, real = [], texts.calls.rewards  # every row here runs whole (fewer than CACHED_PROMPT_ROWS a prompt)
    monkeypatch.setattr(texts.calls, "rewards", lambda m, ids, mask: asked.extend(
        tuple(int(t) for t, keep in zip(row, kept, strict=True) if keep)
        for row, kept in zip(np.asarray(ids).tolist(), np.asarray(mask).tolist(), strict=True)) or real(m, ids, mask))
    got = texts.score_conversations(model, prompts, responses)
    distinct = list(dict.fromkeys(zip(prompts, responses, strict=True)))
    conversations = [tuple(Conversations(model.tokenizer, p, "auto").token_ids([r])[0]) for p, r in distinct]
    assert sorted(row for row in asked if row) == sorted(conversations)  # each conversation once, padding aside
    torch_model = AutoModelForSequenceClassification.from_pretrained(rm_folder, torch_dtype=torch.float32).eval()
    for (prompt, text), reward in zip(zip(prompts, responses, strict=True), got, strict=True):
        ids = Conversations(model.tokenizer, prompt, "auto").token_ids([text])[0]
        with torch.no_grad():
            expected = float(torch_model(torch.tensor([ids])).logits[0, 0])
        assert abs(reward - expected) <= tolerance.any_rewards_atol(model.params, model.config, len(ids))
    assert got[0] == got[2] and got[1] == got[5] and len({got[0], got[1], got[3], got[4]}) == 4


def test_the_summary_shows_the_largest_effects_among_ties_at_the_floor_and_says_it_cut_the_list(tmp_path):
    """Many rows tie at the permutation floor's p_holm: the 8 printed are the largest effects among them (the
    order was the table's, and the largest four of 32 went unprinted), and the heading says 8 of them are shown."""
    from rmjax.audit.job import SHOWN, describe

    effects = np.linspace(0.01, 0.3, 12) * np.where(np.arange(12) % 2, -1, 1)
    n = len(effects)
    table = pd.DataFrame({"battery": ["identity"] * n, "axis": ["age"] * n,
                          "contrast": [f"G{i} vs axis mean" for i in range(n)], "n_items": [30] * n,
                          "effect": effects, "ci_low": effects - 0.01, "ci_high": effects + 0.01,
                          "p": [1e-4] * n, "p_holm": [0.0075] * n, "null_effect": [0.0] * n})
    lines = describe(table, folder_paths(tmp_path), 10000, ["length"] * n).split("\n")
    assert lines[0].startswith(f"identity: {n} of {n} effects survive") and f"the {SHOWN} with" in lines[0]
    shown = [float(line.split(": ")[2].split(" ")[0]) for line in lines[1 : 1 + SHOWN]]
    want = sorted(effects, key=lambda e: -abs(e))[:SHOWN]  # brute force: by size
    assert shown == pytest.approx(want, abs=5e-4)
    assert not lines[1 + SHOWN].startswith("  ")  # no ninth row
