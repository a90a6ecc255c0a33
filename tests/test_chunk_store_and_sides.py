"""The chunk store (rmjax.runs.chunks) and the disagreement search's sides (rmjax.search.sides): gaps a hand mutation
test found (s98, 13 survivors of 34 mutants, 4 equivalent): each test fails on the mutant its docstring names."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from rmjax.loading import load
from rmjax.runs.chunks import ChunkStore, open_store, store_dir
from rmjax.text import chat
from tests import cli, tiny

IDENTITY = {"job": "sweep", "model": {"weights": "w", "tokenizer": "t"}}


def test_open_store_says_a_kept_chunk_size_only_when_it_differs(tmp_path, capsys):
    """"resuming … with its chunk size N" is said only where a resume keeps a saved chunk size other than the one
    asked (a mutant said it on every run, fresh or resumed alike)."""
    out = tmp_path / "s.csv"
    open_store(out, IDENTITY, 8, batch_size=4)  # a fresh store
    assert capsys.readouterr().err == ""
    open_store(out, IDENTITY, 8, batch_size=4)  # a resume with the same sizes
    assert capsys.readouterr().err == ""
    store = open_store(out, IDENTITY, 32, batch_size=4)  # another chunk size asked: the saved one is kept, and said
    assert store.chunk_size == 8 and capsys.readouterr().err.strip() == f"resuming {store.dir} with its chunk size 8"


# A process killed while a chunk's bytes are on their way to the disk (os.fsync is where the write is proven).
_KILLED_AT_FSYNC = (
    "import os, sys, numpy as np\n"
    "from rmjax.runs.chunks import ChunkStore\n"
    "store = ChunkStore(sys.argv[1], {'job': 'sweep', 'model': {'weights': 'w', 'tokenizer': 't'}}, 4)\n"
    "store.write(0, np.ones((4, 1), np.float32))\n"
    "os.fsync = lambda fd: os._exit(9)\n"
    "store.write(4, np.ones((4, 1), np.float32))\n")


def test_a_process_killed_mid_write_leaves_no_chunk_under_its_name(tmp_path):
    """A chunk is written under a temp name and renamed into place once proven: a crash during the write leaves at
    most the temp file, never a file under the chunk's name that a resume would take as complete (a mutant wrote
    straight to the chunk's name)."""
    out = tmp_path / "s.csv"
    proc = subprocess.run([sys.executable, "-c", _KILLED_AT_FSYNC, str(out)], cwd=cli.REPO, env=cli.subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr
    assert sorted(p.name for p in store_dir(out).glob("chunk-*.npy")) == ["chunk-0000000000.npy"]
    store = ChunkStore(out, IDENTITY, 4)
    assert store.names() == {"0000000000"} and not store.has(4)
    assert store.read(0, (4, 1), lambda *args: None).tolist() == [[1.0]] * 4


def test_a_store_of_another_run_is_refused_by_the_store_itself(tmp_path):
    """ChunkStore refuses a manifest of another identity (every job's claim refuses it first; a mutant that dropped
    the store's own check was caught by no test)."""
    import pytest

    from rmjax.errors import ResumeMismatchError

    out = tmp_path / "s.csv"
    ChunkStore(out, IDENTITY, 4).write(0, np.zeros((4, 1), np.float32))
    other = {"job": "sweep", "model": {"weights": "other", "tokenizer": "t"}}
    with pytest.raises(ResumeMismatchError, match="saved progress"):
        ChunkStore(out, other, 4)
    assert ChunkStore(out, IDENTITY, 4).has(0)


# --- rmjax.search.sides ----------------------------------------------------------------------------------------------

SIDE_PROMPT = "Name a fruit."


def test_a_side_spec_is_read_stripped_and_an_implicit_side_needs_both_lms():
    """A side given with spaces around it (a library caller's: only the command line's pass through absl, which
    strips them) is the same side; implicit:CHOSEN: or implicit::REFERENCE names one LM and is refused in one line
    (mutants: no strip; only the count of parts checked, so an empty LM name went on to the load)."""
    import pytest

    from rmjax.errors import UsageError
    from rmjax.search.sides import SideSpec

    spec = SideSpec.parse("  implicit:chosen-lm:reference-lm ")
    assert spec.implicit and spec.models == ("chosen-lm", "reference-lm") and spec.each == 2
    for text in ("implicit:chosen-lm:", "implicit::reference-lm"):
        with pytest.raises(UsageError, match="implicit:CHOSEN_LM:REFERENCE_LM"):
            SideSpec.parse(text)


def test_a_text_round_trips_in_the_plain_template_up_to_its_one_leading_space():
    """The plain template puts one space before a response (its tokens decode to " Love"): such a text round-trips,
    one with whitespace at an edge does not (a mutant compared the decoded tokens unstripped: no text ever round-
    tripped in the plain template)."""
    from transformers import AutoTokenizer

    from rmjax.search.sides import round_trips_in

    tok = AutoTokenizer.from_pretrained(str(tiny.smollm2_tokenizer_folder()))
    plain = chat.Conversations(tok, SIDE_PROMPT, "plain")
    assert tok.decode(plain.response_ids(["Love"])[0]) == " Love"  # the template's space, as the docstring says
    assert round_trips_in(plain, "Love") and round_trips_in(plain, "cats and dogs")
    assert not any(round_trips_in(plain, t) for t in (" Love", "Love ", "cats\n"))


def test_a_reward_side_reads_only_its_tokenizers_ids_where_the_embedding_is_padded(tmp_path):
    """A model whose embedding has more rows than its tokenizer has tokens (padded, as many real models are): the
    side's vocabulary is the tokenizer's (a mutant took config.vocab_size: the map and yardstick read ids that are no
    token)."""
    from rmjax.search.sides import RewardSide, SideSpec

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path / "padded", vocab_size=49152 + 64)
    model = load(str(folder))
    assert model.config.vocab_size == 49152 + 64 and len(model.tokenizer) == 49152
    assert RewardSide(SideSpec.parse(str(folder)), model, SIDE_PROMPT, "auto").vocab == 49152


def test_two_rms_sharing_layers_fork_only_where_they_read_the_prompt_alike(rm_folder):
    """One RM read in the chat template and in the plain one: its layers are alike but its prompt's tokens are not,
    so no forward can be shared (a mutant compared the layers alone: the plain side's tokens ran through the chat
    side's shared forward)."""
    from rmjax.scoring.forked import shared_layers
    from rmjax.search.sides import RewardSide, SideSpec

    model, spec = load(str(rm_folder)), SideSpec.parse(str(rm_folder))
    auto, again, plain = (RewardSide(spec, model, SIDE_PROMPT, t) for t in ("auto", "auto", "plain"))
    assert auto.context.split != plain.context.split
    assert auto.shared_layers(again) == shared_layers(model, model) > 0
    assert auto.shared_layers(plain) == 0 and plain.shared_layers(auto) == 0


def test_a_reward_side_of_another_chat_template_does_not_read_like_it(rm_folder, tmp_path):
    """The same weights and tokenizer with a chat template that renders the response otherwise (q read as k) and the
    prompt alike (the same split): the two read a text differently, so one side's read-back cannot serve the other
    (a mutant compared split and tokenizer only)."""
    import shutil

    from rmjax.search.sides import RewardSide, SideSpec

    other = tmp_path / "other"
    shutil.copytree(rm_folder, other)
    template = (other / "chat_template.jinja").read_text()
    assert template.count("message['content']") == 1
    (other / "chat_template.jinja").write_text(template.replace("message['content']",
                                                                "(message['content'] | replace('q', 'k'))"))
    a = RewardSide(SideSpec.parse(str(rm_folder)), load(str(rm_folder)), SIDE_PROMPT, "auto")
    b = RewardSide(SideSpec.parse(str(other)), load(str(other)), SIDE_PROMPT, "auto")
    assert a.scorer.split == b.scorer.split  # the prompt (no q) is rendered alike
    assert a.round_trips("quiet") and not b.round_trips("quiet")  # but a response is not
    twin = RewardSide(SideSpec.parse(str(rm_folder)), load(str(rm_folder)), SIDE_PROMPT, "auto")
    assert a.reads_like(twin) and not a.reads_like(b) and not b.reads_like(a)


def test_an_implicit_side_counts_a_text_only_where_both_lms_read_it_back(lm_folder, tmp_path):
    """implicit:CHOSEN:REFERENCE whose reference lowercases its input: "Love" comes back from the chosen LM but not
    from the reference, so it does not round-trip; "love" does. A single token's read-back is the chosen LM's
    (its first-token log-prob): the candidates rule on the chosen LM's conversation. (Mutants: any LM reading it back
    sufficed; the token mode read the reference's conversation.)"""
    import shutil

    from rmjax.search.sides import ImplicitSide, SideSpec
    from rmjax.text.candidates import token_round_trips

    lower = tmp_path / "lower"
    shutil.copytree(lm_folder, lower)
    data = json.loads((lower / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Lowercase"}
    (lower / "tokenizer.json").write_text(json.dumps(data))
    chosen, reference = load(str(lm_folder)), load(str(lower))
    side = ImplicitSide(SideSpec.parse(f"implicit:{lm_folder}:{lower}"), chosen, reference, SIDE_PROMPT, "auto")
    assert side.round_trips("love") and side.round_trips("cats and dogs")
    assert not side.round_trips("Love") and not side.round_trips("Cats and dogs")
    ids = np.asarray([chosen.tokenizer(w, add_special_tokens=False).input_ids[0] for w in ("Love", "love", "The")])
    texts = [chosen.tokenizer.decode([int(i)]) for i in ids]
    want = token_round_trips(chat.Conversations(chosen.tokenizer, SIDE_PROMPT, "auto"), ids, texts)
    assert want.tolist() == [True, True, True]  # the chosen LM reads its own tokens back
    np.testing.assert_array_equal(side.tokens_read_back(ids, texts), want)
