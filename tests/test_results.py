"""Score tables round-trip every token string and score exactly (float32)."""

from __future__ import annotations

import numpy as np

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
