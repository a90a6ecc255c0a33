"""Loading score tables and metadata; the shared vocabulary; alignment by decoded string, not row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rmjax.analysis import data, model_metadata, paper1, stats
from rmjax.data import DATA_DIR
from rmjax.errors import InputFileError, UsageError
from rmjax.runs import results

TRICKY = ["None", "NaN", "null", "", " ", "\n", '"', ",", " love", "love"]


def write_model(path: Path, strings: list[str], columns: dict[str, np.ndarray], order: np.ndarray | None = None,
                ids: list[int] | None = None) -> Path:
    order = np.arange(len(strings)) if order is None else order
    ids = list(range(len(strings))) if ids is None else ids
    return results.write_scores_csv(path, np.array(ids)[order], [strings[i] for i in order],
                                    [strings[i] for i in order], {k: v[order] for k, v in columns.items()})


def test_tokens_like_none_and_nan_stay_strings(tmp_path):
    path = write_model(tmp_path / "m.csv", TRICKY, {"greatest": np.arange(len(TRICKY), dtype=float)})
    (table,) = data.load_score_tables(tmp_path)
    assert table.strings.tolist() == TRICKY
    assert table.prompts == ["greatest"]
    assert table.model == "m" and table.path == path
    assert table.frame["greatest"].dtype == np.float64


def test_text_tables_are_read_too(tmp_path):
    results.write_table(tmp_path / "texts.csv", {"text": ["None", "Love"]}, {"greatest": np.array([1.0, 2.0])})
    (table,) = data.load_score_tables(tmp_path / "texts.csv")
    assert table.string_column == "text" and table.strings.tolist() == ["None", "Love"]
    assert table.prompts == ["greatest"]


def test_model_name_from_meta_json_or_stem_and_nickname(tmp_path):
    meta = model_metadata.load_model_metadata(DATA_DIR / "reward_models.yaml")
    write_model(tmp_path / "a.csv", ["x"], {"p": np.zeros(1)})
    results.write_meta(tmp_path / "a.csv", kind="sweep", model="Ray2333/GRM-gemma2-2B-rewardmodel-ft")
    write_model(tmp_path / "Skywork--Skywork-Reward-Gemma-2-27B.csv", ["x"], {"p": np.ones(1)})
    write_model(tmp_path / "c.csv", ["x"], {"p": np.full(1, 2.0)})
    results.write_meta(tmp_path / "c.csv", kind="sweep", model="/ckpt/run7/")
    labels = [t.model for t in data.load_score_tables(tmp_path, meta)]
    assert labels == ["S-Gem-27B", "R-Gem-2B", "run7"]
    assert model_metadata.metadata_for(["S-Gem-27B", "R-Gem-2B"], meta)["parameters_b"].tolist() == [27.0, 2.0]
    assert model_metadata.metadata_for(["S-Gem-27B", "run7"], meta) is None
    # a copy without its .meta.json read as a second model: tau 1 with its original, double weight in every mean
    (tmp_path / "copy.csv").write_bytes((tmp_path / "c.csv").read_bytes())
    with pytest.raises(UsageError, match="c.csv and .*copy.csv hold the same rows and scores"):
        data.load_score_tables(tmp_path, meta)



def test_a_name_two_orgs_share_is_found_by_its_full_id_or_refused(tmp_path):
    """A fault hunt: with orgA/RM-8B and orgB/RM-8B in the YAML, orgB's table was labelled orgA's and given orgA's
    size (the first row whose short name matched)."""
    yaml = tmp_path / "models.yaml"
    yaml.write_text("- {name: orgA/RM-8B, nickname: A-RM, base_model: Llama, size: 70B}\n"
                    "- {name: orgB/RM-8B, nickname: B-RM, base_model: Gemma, size: 2B}\n")
    meta = model_metadata.load_model_metadata(yaml)
    for folder, model in (("b", "orgB/RM-8B"), ("c", "/models/orgb/RM-8B/")):
        write_model(tmp_path / folder / "t.csv", ["x"], {"p": np.zeros(1)})
        results.write_meta(tmp_path / folder / "t.csv", kind="sweep", model=model)
        (table,) = data.load_score_tables(tmp_path / folder, meta)
        assert table.model == "B-RM"
        assert model_metadata.metadata_for([table.model], meta)["parameters_b"].tolist() == [2.0]
    write_model(tmp_path / "d" / "t.csv", ["x"], {"p": np.zeros(1)})
    results.write_meta(tmp_path / "d" / "t.csv", kind="sweep", model="/models/RM-8B")
    with pytest.raises(InputFileError, match="matches orgA/RM-8B and orgB/RM-8B in --models_yaml by name"):
        data.load_score_tables(tmp_path / "d", meta)

def test_model_metadata_from_yaml():
    meta = model_metadata.load_model_metadata(DATA_DIR / "reward_models.yaml")
    assert len(meta) == 10
    row = meta.loc["Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"]
    assert (row.nickname, row.base_model, row.developer, row.parameters_b, row.reward_bench_rank) == \
        ("S-Lla-8B-v0.2", "Llama", "Skywork", 8.0, 10.0)
    assert meta.loc["Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", "parameters_b"] == 3.0
    assert model_metadata.parameters_in_billions("270M") == pytest.approx(0.27)
    assert model_metadata.parameters_in_billions("1.5B") == 1.5
    with pytest.raises(ValueError, match="parameter count"):
        model_metadata.parameters_in_billions("big")
    for bad in ("1.2.3B", ".", "1..5B", True, float("nan"), 0, "0B", -1):  # '1.2.3B' was float()'s ValueError traceback
        with pytest.raises(UsageError, match="parameter count"):
            model_metadata.parameters_in_billions(bad)  # (0: a count of none)
    assert model_metadata.parameters_in_billions(".5B") == 0.5
    assert model_metadata.parameters_in_billions("2.B") == 2.0


def test_a_base_model_left_empty_is_unknown(tmp_path):
    """A fault hunt: `base_model:` left empty (YAML's null) was read as the text 'None', so every model without one
    was of one base model ('same_base_model' similarity 1.0 in the RSA) and one Big Two family 'None'."""
    from rmjax.analysis import stats

    path = tmp_path / "models.yaml"
    path.write_text("- {name: o/m1, base_model: , family: , size: 8B}\n- {name: o/m2, base_model: null, size: 3B}\n"
                    "- {name: o/m3, base_model: Gemma, family: Gemma 2, size: 27B}\n")
    meta = model_metadata.load_model_metadata(path)
    assert meta.base_model.tolist() == ["", "", "Gemma"] and meta.family.tolist() == ["", "", "Gemma 2"]
    assert stats.unknown_metadata(meta)["same_base_model"] == ["o/m1", "o/m2"]
    path.write_text("- {name: o/m1, size: 1.2.3B}\n")
    with pytest.raises(InputFileError, match="models.yaml: model 'o/m1': cannot read a parameter count from size"):
        model_metadata.load_model_metadata(path)
    path.write_text("- {name: o/m1, base_model: [Llama, Gemma]}\n")
    with pytest.raises(InputFileError, match="base_model \\['Llama', 'Gemma'\\]"):
        model_metadata.load_model_metadata(path)


def test_shared_vocabulary_drops_missing_and_duplicated_strings(tmp_path):
    write_model(tmp_path / "m1.csv", ["a", "b", "c", "d", "None"], {"p": np.arange(5.0)})
    write_model(tmp_path / "m2.csv", ["a", "b", "b", "c", "None", "e"], {"p": np.arange(6.0)})  # "b" twice
    write_model(tmp_path / "m3.csv", ["None", "c", "b", "a"], {"p": np.arange(4.0)})  # no "d"
    tables = data.load_score_tables(tmp_path)
    assert data.shared_vocabulary(tables) == ["None", "a", "c"]


def _tables(tmp_path: Path, shuffle: bool) -> list[data.ScoreTable]:
    rng = np.random.default_rng(0)
    strings = TRICKY + [f"w{i}" for i in range(60)]
    folder = tmp_path / ("shuffled" if shuffle else "ordered")
    for m in range(3):
        columns = {p: rng.normal(size=len(strings)) for p in ("greatest", "best", "worst")}
        order = np.random.default_rng(100 + m).permutation(len(strings)) if shuffle else None
        write_model(folder / f"m{m}.csv", strings, columns, order, ids=list(range(1000 * m, 1000 * m + len(strings))))
    return data.load_score_tables(folder)


def test_shuffled_row_order_gives_identical_results(tmp_path):
    results_by_order = []
    for shuffle in (False, True):
        tables = _tables(tmp_path, shuffle)
        vocab = data.shared_vocabulary(tables)
        aligned = data.aligned_scores(tables, "greatest", vocab)
        results_by_order.append({
            "aligned": aligned,
            **paper1.heterogeneity(aligned, 0.9, 20),
            "moments": paper1.moments_table(tables, ["greatest"], n_boot=20),
            "top": paper1.top_bottom_table(tables, ["greatest", "worst"], 5, vocab),
            "framing": paper1.framing_tables(tables, k=5)[1],
        })
    ordered, shuffled = results_by_order
    assert len(ordered["aligned"]) == 70
    for key in ordered:
        if key == "moments":  # bootstrap draws index rows, so only the point estimates must agree
            cols = ["mean", "variance", "skewness"]
            pd.testing.assert_frame_equal(ordered[key][cols], shuffled[key][cols], rtol=1e-12)
        else:
            pd.testing.assert_frame_equal(ordered[key], shuffled[key])
    # and the aligned values are the scores each model gave that very string
    tables = _tables(tmp_path, True)
    for t in tables:
        by_string = dict(zip(t.strings, t.frame["greatest"], strict=True))
        assert np.array_equal(ordered["aligned"][t.model].to_numpy(), [by_string[s] for s in ordered["aligned"].index])
    assert ordered["kendall_tau"].loc["m0", "m1"] == pytest.approx(
        stats.kendall_tau_matrix(ordered["aligned"][["m0", "m1"]]).loc["m0", "m1"])


def test_dedupe_keeps_the_highest_value_per_string(tmp_path):
    write_model(tmp_path / "m.csv", ["a", "b", "a", "c"], {"p": np.array([-3.0, -1.0, -0.5, -2.0]),
                                                          "q": np.array([-0.1, -1.0, -0.9, -2.0])})
    (table,) = data.load_score_tables(tmp_path)
    deduped = data.dedupe_keep_max(table, ["p", "q"])
    assert deduped.to_dict() == {"p": {"a": -0.5, "b": -1.0, "c": -2.0}, "q": {"a": -0.1, "b": -1.0, "c": -2.0}}


def test_top_bottom_table_equals_a_full_sort_with_ties(tmp_path):
    rng = np.random.default_rng(3)
    strings = [f"s{i:03d}" for i in range(200)]
    scores = rng.integers(0, 12, size=200).astype(float)  # many ties at the cut
    write_model(tmp_path / "m.csv", strings, {"p": scores}, order=rng.permutation(200))
    (table,) = data.load_score_tables(tmp_path)
    got = paper1.top_bottom_table([table], ["p"], k=15)
    full = sorted(zip(strings, scores, strict=True), key=lambda item: (-item[1], item[0]))
    top = got[got.side == "top"]
    bottom = got[got.side == "bottom"]
    assert top.token_decoded.tolist() == [s for s, _ in full[:15]]
    assert bottom.token_decoded.tolist() == [s for s, _ in full[::-1][:15]]
    assert top.rank_in_vocabulary.tolist() == list(range(1, 16))
    assert bottom.rank_in_vocabulary.tolist() == list(range(200, 185, -1))
    assert top.score.tolist() == [v for _, v in full[:15]]
