"""Score tables round-trip every token string and score exactly (float32)."""

from __future__ import annotations

import numpy as np
import pytest

from rmjax.runs import results

TRICKY = ["None", "NaN", "null", "nan", "NA", "#N/A", "", ",", '"', '""', "\n", "\r", "\r\n", " ,\"x\n",
          "True", "-inf", "1e5", "\t", "ĠNone", "😀", "\ufffd"]


def test_round_trip_keeps_tricky_tokens(tmp_path):
    n = len(TRICKY)
    ids = np.arange(n) * 7
    names = [f"name{t}" for t in TRICKY]
    rng = np.random.default_rng(0)
    cols = {"greatest": rng.normal(size=n).astype(np.float32), "a,b \"q\"": rng.normal(size=n).astype(np.float32)}
    path = results.write_scores_csv(tmp_path / "s.csv", ids, names, TRICKY, cols)
    df = results.read_scores_csv(path)
    assert list(df.columns) == ["token_id", "token_name", "token_decoded", "greatest", 'a,b "q"']
    assert df["token_id"].tolist() == ids.tolist()
    assert df["token_decoded"].tolist() == TRICKY
    assert df["token_name"].tolist() == names
    for name, values in cols.items():
        # float32 scores survive exactly (9 significant digits).
        assert np.array_equal(df[name].to_numpy().astype(np.float32), values)


def test_meta_written_beside(tmp_path):
    path = results.write_scores_csv(tmp_path / "x.csv", np.arange(1), ["a"], ["a"], {"p": np.zeros(1)})
    meta = results.write_meta(path, model="m", seconds=1.5)
    assert meta.name == "x.csv.meta.json"
    import json

    record = json.loads(meta.read_text())
    assert record["model"] == "m" and record["seconds"] == 1.5 and "jax" in record["environment"]


def test_a_table_of_number_like_tokens_reads_back_as_strings(tmp_path):
    """A vocabulary slice of digit tokens (--limit, a beam's candidates) has token strings that all look like
    numbers: they read back as the same strings, not as the numbers pandas would infer ('007' is not 7)."""
    names = ["007", "1", "-0", "1e5", "2.50"]
    decoded = ["007", " 1", "1.50", "1e5", "-0"]
    path = results.write_scores_csv(tmp_path / "d.csv", np.arange(5), names, decoded, {"p": np.zeros(5)},
                                    roundtrip=np.asarray([True, False, True, True, False]))
    df = results.read_scores_csv(path)
    assert df["token_name"].tolist() == names and df["token_decoded"].tolist() == decoded
    assert df[results.ROUNDTRIP].tolist() == [1, 0, 1, 1, 0] and df[results.ROUNDTRIP].dtype == np.int64


def test_json_values_are_plain_json_with_no_value_for_nan(tmp_path):
    """NaN and ±Inf become null (strict readers refuse bare NaN), arrays and tuples lists, numpy scalars numbers."""
    import json

    value = {"a": np.asarray([1.0, np.nan, np.inf]), "b": np.float32(2.5), "c": (np.int64(3), -np.inf), "d": "x"}
    want = {"a": [1.0, None, None], "b": 2.5, "c": [3, None], "d": "x"}
    assert results.json_safe(value) == want
    path = results.dump_json(value, tmp_path / "v.json", allow_nonfinite=True)
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}")) == want


def test_a_table_with_a_repeated_column_is_refused_by_name(tmp_path):
    """pandas would read a second `greatest` as `greatest.1`: a hand-merged table is refused instead."""
    from rmjax.errors import InputFileError

    path = tmp_path / "merged.csv"
    path.write_text('"token_id","token_name","token_decoded","greatest","greatest"\n0,"a","a",1.5,2.5\n')
    with pytest.raises(InputFileError, match="column 'greatest' appears more than once"):
        results.read_scores_csv(path)


def test_a_table_with_a_nameless_column_is_refused(tmp_path):
    """A fault hunt: a published table saved with pandas' default `to_csv` (its row index first, header empty) was
    read with a prompt `Unnamed: 0` whose scores were the row numbers, analysed alone as if a model had scored them."""
    import pandas as pd

    from rmjax.errors import InputFileError

    frame = pd.DataFrame({"token_id": [0, 1], "token_name": ["a", "b"], "token_decoded": ["a", "b"],
                          "greatest": [1.5, 2.5]})
    frame.to_csv(tmp_path / "indexed.csv")
    with pytest.raises(InputFileError, match=r"indexed.csv: column 1 has no name .*index=False"):
        results.read_scores_csv(tmp_path / "indexed.csv")
    frame.to_csv(tmp_path / "plain.csv", index=False)
    assert list(results.read_scores_csv(tmp_path / "plain.csv").columns) == list(frame.columns)


def test_a_scale_survives_pickle_and_copies_with_what_it_records():
    """A review (helper-110): tuple's own reduce rebuilt a Scale from (mean, SD) alone, so pickle, copy and
    deepcopy raised TypeError; each now gives back the same mean, SD, count and left-out record."""
    import copy
    import pickle

    from rmjax.scoring.finite import Scale

    scale = Scale(1.5, 0.25, 7, {"values": 1})
    for twin in (pickle.loads(pickle.dumps(scale)), copy.copy(scale), copy.deepcopy(scale)):
        assert twin == (1.5, 0.25) and twin.record() == scale.record() == {
            "mean": 1.5, "sd": 0.25, "values": 7, "nonfinite": {"values": 1}}
