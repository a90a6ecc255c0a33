"""Issue 22, no silent wrong results: inputs never silently reduced, and flag values and input files that
cannot work refused in one line naming the problem and the fix, before any model loads.

Cases of one class share a test. What the command line checks (flag values and validators, multi-process flags,
train_rm's own refusals) runs as the commands (a subprocess); what the job's library code checks (prompt and model
YAML files, --vocab_file, a pairs file, --init_from, the chat template before a sweep loads) runs in-process as
the entry points call it (tests/inproc.py).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rmjax.search.sweep import SweepSpec, run_sweep
from tests import cli, inproc

MISSING_MODEL = "/nonexistent/model"
NO_MODEL = f"--model={MISSING_MODEL}"  # every check here runs before the model is looked for


def test_yaml_files_refuse_a_key_given_twice(tmp_path):
    """1a: PyYAML keeps the last of two equal keys, so a prompt file or model list lost an entry silently. (`sweep
    --prompts=FILE` and `analyze --elo=DIR --models_yaml=FILE`, in-process.)"""
    (tmp_path / "prompts.yaml").write_text("greatest: What is the greatest thing?\nbest: Best?\n"
                                           "greatest: What is the worst thing?\n")
    (tmp_path / "numbers.yaml").write_text('007: "What, in one word, is number seven?"\n1: One?\n"1": Also one?\n')
    (tmp_path / "models.yaml").write_text("- name: org/a\n  nickname: A\n  size: 8B\n  nickname: B\n")
    (tmp_path / "elo").mkdir()
    out = tmp_path / "s.csv"

    def sweep(prompts):
        return run_sweep(SweepSpec(inproc.options(MISSING_MODEL, out), inproc.prompts(str(prompts))))

    inproc.refused(lambda: sweep(tmp_path / "prompts.yaml"), str(tmp_path / "prompts.yaml"),
                   "key 'greatest' is given twice", "lines 1 and 3")
    # names are kept as written: `1:` and `"1":` are one column name (and `007:` used to become the prompt "7")
    inproc.refused(lambda: sweep(tmp_path / "numbers.yaml"), "numbers.yaml", "key '1' is given twice",
                   "lines 2 and 3")
    inproc.refused(lambda: inproc.analyze(tmp_path / "a", elo=str(tmp_path / "elo"),
                                          models_yaml=str(tmp_path / "models.yaml")),
                   "models.yaml", "key 'nickname' is given twice", "lines 2 and 4")
    assert not out.exists()


BAD_TOKEN_IDS = [
    ("28,28,198,7,007", "token ids 28, 7 are given more than once"),  # ranked twice, the set's size wrong
    ("\u0662\u0668", "'\u0662\u0668'"),  # Arabic-Indic 28: int() takes it
    ("\uff12\uff18", "'\uff12\uff18'"),  # fullwidth 28
    ("1,\u00b2", "'\u00b2'"),  # superscript two: isdigit() but not int(), a traceback
]


@pytest.fixture(scope="module")
def bad_token_ids_runs():
    """`sweep --token_ids=VALUE` of each BAD_TOKEN_IDS value, all in one interpreter (tests.cli.run_each)."""
    procs = cli.run_each(*[("sweep", NO_MODEL, f"--token_ids={value}") for value, _ in BAD_TOKEN_IDS])
    return {value: proc for (value, _), proc in zip(BAD_TOKEN_IDS, procs, strict=True)}


@pytest.mark.parametrize("value,fragment", BAD_TOKEN_IDS)
def test_token_ids_are_a_set_of_ascii_integers(bad_token_ids_runs, value, fragment):
    """1b: --token_ids=28,28,198 ranked 28 twice; non-ASCII digits passed as ids."""
    cli.user_error(bad_token_ids_runs[value], "--token_ids", fragment)


def test_vocab_file_reports_every_line_it_leaves_out(rm_folder, tmp_path, capsys):
    """1c: blank and whitespace-only lines, repeats and lines that are not one token used to vanish uncounted (a
    Windows line end made every line 'not one token', a byte-order mark the first). (`beam --vocab_file=F --depth=1
    --top=2`, in-process.)"""
    from rmjax.search.beam import BeamConfig
    from rmjax.search.beam_job import BeamSpec, run_beam

    words = tmp_path / "words.txt"
    words.write_bytes("\ufeffcat\r\n\r\n   \r\ncat\r\n dog\r\nnot one token here\r\n".encode())
    out = tmp_path / "b.csv"
    capsys.readouterr()
    run_beam(BeamSpec(inproc.options(rm_folder, out), inproc.prompts(), BeamConfig(depth=1, top=2),
                      vocab_file=str(words)))
    stderr = capsys.readouterr().err
    flag = f"--vocab_file={words}"
    assert f"{flag}: 2 blank or whitespace-only lines skipped" in stderr, stderr
    assert f"{flag}: 1 line that is not one token of this tokenizer skipped (first: 'not one token here')" \
        in stderr
    assert f"{flag}: 1 duplicate line skipped (the token of an earlier line; first: 'cat')" in stderr
    assert sorted(pd.read_csv(out, keep_default_na=False).decoded.unique()) == ['" dog"', '"cat"']


def test_seeds_outside_32_bits_are_refused(tmp_path):
    """2a: jax.random.key keeps a seed's low 32 bits (2**32 + 5 was seed 5, -1 seed 2**32 - 1); numpy refused -1
    with a traceback after the model loaded."""
    cases = (("gcg", "-1", []), ("analyze", "4294967296", [f"--out={tmp_path / 'a'}"]),
             ("train_rm", "-7", [f"--elo={tmp_path / 'e.csv'}"]))
    procs = cli.run_each(*[(job, *([] if job == "analyze" else [NO_MODEL]), f"--seed={seed}", *extra)
                           for job, seed, extra in cases])  # in one interpreter: refused while parsing
    for (_, seed, _), proc in zip(cases, procs, strict=True):
        cli.user_error(proc, f"--seed={seed}", "[0, 4294967295]")


def test_multiprocess_flags_that_would_run_alone_are_refused():
    """2b: --num_processes/--process_id without --coordinator used to run one process that wrote the result alone."""
    checked = ((["--num_processes=2", "--process_id=1"], ["--num_processes=2", "without --coordinator",
                                                           "--coordinator=HOST:PORT"]),
               (["--coordinator=127.0.0.1:1234", "--num_processes=2", "--process_id=2"],
                ["--process_id=2", "from 0 to 1"]),
               (["--coordinator=auto", "--num_processes=4"], ["--coordinator=auto", "leave out"]))
    # the flags' own checks, in one interpreter (tests.cli.run_each); the last reaches jax.distributed: its own
    procs = cli.run_each(*[("sweep", NO_MODEL, "--token_ids=1", *flags) for flags, _ in checked])
    for (_, fragments), proc in zip(checked, procs, strict=True):
        cli.user_error(proc, *fragments)
    cli.user_error(cli.run("sweep", NO_MODEL, "--token_ids=1", "--coordinator=127.0.0.1:1"),
                   "Number of processes must be", "--num_processes")


def test_chat_template_syntax_error_is_one_line_before_loading(rm_folder, tmp_path, monkeypatch):
    """2c: a jinja syntax error in the chat template was a traceback from inside jinja, after the weights loaded.
    (`sweep --token_ids=1,2` in-process: the sweep job checks the template; train_rm's check is its entry point's,
    so it runs as the command.)"""
    broken = cli.copy_folder(rm_folder, tmp_path / "broken")
    template = broken / "chat_template.jinja"
    template.write_text(template.read_text().replace("{% endfor %}", "", 1))
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"prompt": "Q?", "chosen": "a", "rejected": "b"}) + "\n")
    heldout = tmp_path / "h.jsonl"
    heldout.write_text(json.dumps({"prompt": "H?", "chosen": "c", "rejected": "d"}) + "\n")
    fragments = (str(template), "is not valid jinja", "'endfor'", "line 6", "--template=plain")
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        inproc.refused(lambda: run_sweep(SweepSpec(inproc.options(broken, tmp_path / "s.csv"), inproc.prompts(),
                                                   (1, 2))), *fragments)
    cli.user_error(cli.run("train_rm", f"--model={broken}", f"--pairs={pairs}", f"--heldout_pairs={heldout}",
                           f"--workdir={tmp_path / 'w'}"), *fragments)


def test_pairs_that_are_one_conversation_or_read_as_another_file(tmp_path, lm_folder, monkeypatch, capsys):
    """A fault hunt: 'gold' and 'gold ' are one conversation under Gemma's template, which trims the response: held-out
    accuracy 0 and loss ln 2 whatever the model does (equal strings were refused already). An --elo file given as
    --head_out with --overwrite was deleted as an output, then reread at the end. A .JSONL file was read as CSV,
    and a JSON line holding U+2028 was cut in two."""
    from rmjax.train.data import Pairs, read_pairs
    from rmjax.train.recipe import check_context, train_from_data

    trimmed = Pairs(["What is best?"] * 2, ["iron", "gold"], ["gold", " gold "], [1.0, 1.0])
    inproc.refused(lambda: check_context("gemma-3-270m", (trimmed,), "auto"), "training pair 2", "'gold'",
                   "' gold '", "one conversation once the template renders them")
    check_context("gemma-3-270m", (Pairs(["What is best?"], ["iron"], ["gold"], [1.0]),), "auto")
    # a held-out pair that is a training pair once rendered: sides swapped (a label 0 pair) and ' gold ' trimmed
    train = Pairs(["Q?", "What is best?"], ["a", "iron"], ["b", "gold"], [1.0, 1.0])
    held = Pairs(["H?", "What is best?"], ["c", " gold "], ["d", "iron"], [1.0, 1.0])
    inproc.refused(lambda: check_context("gemma-3-270m", (train, held), "auto"), "1 of the 2 held-out pairs",
                   "held-out pair 2 is training pair 2", "hold out pairs not trained on")
    check_context("gemma-3-270m", (train, Pairs(["H?", "What is best?"], ["c", "gold"], ["d", "tin"], [1.0] * 2)),
                  "auto")
    elo = tmp_path / "What is greatest.csv"
    elo.write_text("elo_rank,elo_score,name,elo_matches\n" + "".join(f"{i},{1600 - 10 * i},w{i},3\n"
                                                                    for i in range(1, 13)))
    with monkeypatch.context() as patch:
        inproc.no_weights_read(patch)
        cfg = inproc.train_config(steps=2, warmup_steps=1, batch_size=4)
        inproc.refused(lambda: train_from_data(str(lm_folder), cfg, elo=str(elo), n_train=8, n_heldout=4, head_out=elo,
                                               overwrite=True, workdir=tmp_path / "w"), "which this run reads (--elo=")
    assert elo.is_file() and "its pairs answer the prompt 'What is greatest?'" in capsys.readouterr().err
    row = {"prompt": "Q?", "chosen": "a\u2028b", "rejected": "c\x85d"}
    for name in ("u.jsonl", "U.JSONL"):
        (tmp_path / name).write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
        pairs = read_pairs(tmp_path / name)
        assert (pairs.chosen, pairs.rejected) == (["a\u2028b"], ["c\x85d"])


def test_malformed_pairs_jsonl_names_the_line(tmp_path):
    """2d: a line that is not a pair object was a TypeError traceback, or became the text 'nan' or 'None'.
    (`train_rm --pairs=FILE`, in-process: the pairs are read before the model is looked for.)"""
    good = json.dumps({"prompt": "Q?", "chosen": "a", "rejected": "b"})
    cases = (("{not json", "line 2 is not JSON"),
             ("[1, 2]", "line 2 is a JSON array"),
             (json.dumps({"prompt": "Q?", "chosen": "a"}), "line 2 lacks rejected"),  # used to train on 'nan'
             (json.dumps({"prompt": "Q?", "chosen": None, "rejected": "b"}), "line 2: chosen is null, not a string"),
             # half of an escaped emoji: read, then a tokenizer TypeError once the model had loaded (a fault hunt)
             ('{"prompt": "Q?", "chosen": "good \\ud800", "rejected": "b"}', "line 2: chosen holds a lone surrogate"))
    for i, (line, fragment) in enumerate(cases):
        pairs = tmp_path / f"p{i}.jsonl"
        pairs.write_text(f"{good}\n{line}\n")
        inproc.refused(lambda pairs=pairs: inproc.train_rm(MISSING_MODEL, pairs=pairs), str(pairs), fragment)


def _beam_csv(path, ids: list[str]):
    """A beam CSV of depth-2 optimal rows with these space-separated ids, with the .meta.json a beam writes."""
    from rmjax.runs import results

    keys = {"depth": [2] * len(ids), "direction": ["optimal"] * len(ids), "rank": list(range(1, len(ids) + 1)),
            "ids": ids, "tokens": ['["a", "b"]'] * len(ids), "decoded": ['"ab"'] * len(ids)}
    results.write_table(path, keys, {"greatest": np.linspace(1.0, 0.0, len(ids))})
    results.write_meta(path, kind="beam")
    return path


def test_init_from_ids_outside_the_vocabulary_are_named(rm_folder, tmp_path, monkeypatch):
    """2e: a beam of another model (ids past this vocabulary, or negative) was an IndexError inside the search, or
    silently the last token of the vocabulary. (`gcg --init_from=F --num_tokens=2 [--steps=1]`, in-process, before
    any weight is read.)"""
    from rmjax.search.gcg_config import GCGConfig
    from rmjax.search.gcg_job import GcgSpec, run_gcg

    def gcg(model, init_from, **settings):
        return run_gcg(GcgSpec(inproc.options(model, tmp_path / "g.json"), inproc.prompts(),
                               GCGConfig(num_tokens=2, init_from=str(init_from), **settings)))

    inproc.no_weights_read(monkeypatch)
    other = _beam_csv(tmp_path / "other.csv", ["5 -1", "50000 7"])
    inproc.refused(lambda: gcg(rm_folder, other, steps=1), str(other), "[-1, 50000]", "vocabulary [0, 49152)")
    unreadable = _beam_csv(tmp_path / "bad.csv", ["5 x"])
    inproc.refused(lambda: gcg(MISSING_MODEL, unreadable), str(unreadable), "cannot be read as a beam result CSV")


def test_from_sweep_rows_repeating_a_token_are_refused():
    """2e: two rows of one token in a sweep table: depth 1 silently took the last."""
    from rmjax.errors import UsageError
    from rmjax.search.beam_job import depth1_scores

    table = pd.DataFrame({"token_id": [3, 4, 3], "greatest": [0.1, 0.2, 0.3]})
    with pytest.raises(UsageError, match=r"s\.csv: token ids \[3\] have more than one row"):
        depth1_scores(table, np.asarray([3, 4]), {"greatest": "?"}, "s.csv")
    with pytest.raises(UsageError, match="token_id -2 is not a token id"):
        depth1_scores(pd.DataFrame({"token_id": [-2, 4], "greatest": [0.1, 0.2]}), np.asarray([4]),
                      {"greatest": "?"}, "s.csv")


def test_more_inputs_never_silently_reduced(tmp_path, monkeypatch):
    """Further cases of the same classes, in-process (cheap): names renamed or dropped by YAML and JSON, unreadable
    files and environment values that were tracebacks."""
    from rmjax.analysis.model_metadata import load_model_metadata
    from rmjax.errors import InputFileError, MissingFileError, UsageError
    from rmjax.parallel import distributed
    from rmjax.text import candidates
    from rmjax.text.prompts import read_prompt_file
    from rmjax.train.data import read_pairs

    names = tmp_path / "names.yaml"
    names.write_text('007: "Seven?"\nyes: "Is it?"\n0x10: "Sixteen?"\n')  # were the prompts "7", refused, "16"
    assert read_prompt_file(names) == {"007": "Seven?", "yes": "Is it?", "0x10": "Sixteen?"}
    with pytest.raises(MissingFileError, match="m.yaml not found"):
        load_model_metadata(tmp_path / "m.yaml")  # was a FileNotFoundError traceback
    for text, match in (("- name: org/a\n- name: org/a\n", "name 'org/a' is given to two models"),
                        ("- {name: org/a, nickname: X}\n- {name: org/b, nickname: x}\n", "nickname 'x' is given"),
                        ("- name: org/a\n  reward_bench_rank: n/a\n", "reward_bench_rank 'n/a'")):  # a ValueError
        (tmp_path / "m.yaml").write_text(text)
        with pytest.raises(InputFileError, match=match):
            load_model_metadata(tmp_path / "m.yaml")
    good = '{"prompt": "q", "chosen": "a", "rejected": "b"'
    for name, text, match in (("twice.jsonl", good + ', "chosen": "c"}\n', "line 1 gives key chosen twice"),
                              ("mixed.jsonl", good + ', "label": 0.2}\n' + good + "}\n", "line 1 has a label but"),
                              ("twice.csv", "prompt,chosen,rejected,chosen\nq,a,b,c\n", "column chosen more than"),
                              ("blank.csv", "prompt,chosen,rejected,label\nq,a,b,0.5\nq,a,b,\n", "pair 2 has label"),
                              # a misspelt label was no label: every pair 1.0 (the 0 below would flip the pair)
                              *((f"{n}.csv", f"prompt,chosen,rejected,{n}\nq,a,b,0\n", f"'{n}' looks like one")
                                for n in ("lable", "Label", "labels", "labl", " label")),
                              ("lable.jsonl", good + ', "lable": 0}\n', "'lable' looks like one"),
                              # which is meant? Label was ignored (a fault hunt)
                              ("both.csv", "prompt,chosen,rejected,label,Label\nq,a,b,1,0\n", "both label and 'Label'"),
                              # past a float's range: an OverflowError traceback (a fault hunt)
                              ("huge.jsonl", good + ', "label": 1' + "0" * 400 + "}\n", "pair 1 has label")):
        (tmp_path / name).write_text(text)
        with pytest.raises(InputFileError, match=match):
            read_pairs(tmp_path / name)
    (tmp_path / "table.csv").write_text("prompt,chosen,rejected,table,level\nq,a,b,x,y\n")  # other columns stay
    assert read_pairs(tmp_path / "table.csv").label.tolist() == [1.0]
    (tmp_path / "list.json").write_text("[" + good + "}]")  # a .json file of one list was 'missing columns'
    assert read_pairs(tmp_path / "list.json").chosen == ["a"]
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))  # was a UnicodeDecodeError traceback
    with pytest.raises(UsageError, match="latin1.txt: not UTF-8 text"):
        candidates.read_vocab_file(tmp_path / "latin1.txt")
    monkeypatch.setenv("RMJAX_NUM_PROCESSES", "two")  # was int('two'): a ValueError traceback
    with pytest.raises(UsageError, match=r"\$RMJAX_NUM_PROCESSES='two'"):
        distributed.initialize()


def test_train_rm_refuses_allow_nonfinite_it_would_ignore(tmp_path):
    """train_rm took --allow_nonfinite and ignored it (a NaN loss stops a training run whatever it says)."""
    cli.user_error(cli.run("train_rm", "--model=smollm2-135m-instruct", "--elo=builtin", "--allow_nonfinite",
                           f"--workdir={tmp_path / 'w'}"), "--allow_nonfinite does not apply to train_rm")
    assert not (tmp_path / "w").exists()


def test_pairs_and_ratings_read_as_written_or_refused(tmp_path):
    """A trailing comma on every row made pandas take the prompt column as the index: each pair was read shifted one
    column left (prompt = the chosen text, rejected = ''), silently; a short row got rejected ''; a pair of one
    response twice, a rating given twice for one item and an Elo file too small to split were read as if fine (the last
    a ValueError traceback). Held-out pairs that are training pairs: test_pairs_that_are_one_conversation_…."""
    from rmjax.errors import RmjaxError
    from rmjax.train.data import elo_pairs, read_pairs

    def refused(text: str, suffix: str, *fragments: str, read=read_pairs) -> None:
        path = tmp_path / f"f{len(list(tmp_path.iterdir()))}{suffix}"
        path.write_text(text)
        with pytest.raises(RmjaxError) as error:
            read(path)
        for fragment in fragments:
            assert fragment in str(error.value), (fragment, str(error.value))

    header = "prompt,chosen,rejected\n"
    refused(header + "p1,a,b,\np2,c,d,\n", ".csv", "row 1 has 4 fields", "header has 3")
    refused(header + "p1,a,b\np2,c\n", ".csv", "row 2 has 2 fields")
    refused(header + "p1,a,b\np2,c,c\n", ".csv", "pair 2 has the same chosen and rejected")
    refused(header + "p1,a,b\n\" \",c,d\n,e,f\n", ".csv", "pair 2 has an empty prompt (2 pairs in all)")
    refused('{"prompt": "\\t", "chosen": "a", "rejected": "b"}\n', ".jsonl", "pair 1 has an empty prompt")
    # pandas read True/false as booleans, then 1/0: the false pair flipped silently (JSON lines refuse them)
    refused("prompt,chosen,rejected,label\np1,a,b,True\np2,c,d,false\n", ".csv", "pair 1 has label 'True'")
    good = tmp_path / "good.csv"
    good.write_text(header + 'p1,"a, with a comma",b\np2,"two\nlines",d\n')
    pairs = read_pairs(good)
    assert (pairs.prompt, pairs.chosen, pairs.rejected) == (["p1", "p2"], ["a, with a comma", "two\nlines"], ["b", "d"])
    blank = tmp_path / "blank.csv"  # a blank first line, which pandas skips: refused as "a header of 0 fields"
    blank.write_text("\n" + header + "p1,a,b\n")
    assert (read_pairs(blank).prompt, read_pairs(blank).chosen) == (["p1"], ["a"])
    long = tmp_path / "long.csv"  # a field past csv's default 128 KiB, and a whitespace-only line pandas skips
    long.write_text(header + f"p1,{'x' * 200_000},b\n   \np2,c,d\n")
    assert read_pairs(long).chosen == ["x" * 200_000, "c"]
    refused("name,elo_score\na,1000\nb,1500\na,1500\nc,900\n", ".csv", "'a' has more than one row",
            read=lambda p: elo_pairs(p, 4, 4))
    refused("name,elo_score\na,1000\nb,1500\nc,900\n", ".csv", "each side needs at least 2 items",
            read=lambda p: elo_pairs(p, 4, 4))
    # a trailing comma on every row: pandas took name as the index, items named by their scores (a fault hunt)
    refused("name,elo_score,elo_matches\na,1000,3,\nb,1500,4,\n", ".csv", "row 1 has 4 fields where the header has 3",
            read=lambda p: elo_pairs(p, 4, 4))
    refused("name,elo_score,elo_score\na,1000,3\nb,1500,4\n", ".csv", "elo_score", read=lambda p: elo_pairs(p, 4, 4))
