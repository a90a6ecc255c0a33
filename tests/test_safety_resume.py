"""Resume and reuse only what the same inputs produced; never overwrite or share an output unasked.

Each test runs the entry points as a user does and reproduces one way a result used to come out
wrong with exit status 0 (issue 11: 1, 2, 4, 8).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tests import cli, tiny


def _pairs(path, adjective: str, n: int = 48):
    nouns = ["apple", "river", "house", "music", "dog", "book", "tree", "city", "light", "stone", "garden", "road"]
    rng = np.random.default_rng(len(adjective))
    a, b = rng.choice(nouns, n), rng.choice(nouns, n)
    pd.DataFrame({"prompt": "Which is better?", "chosen": [f"{adjective} {x}" for x in a],
                  "rejected": [f"bad {x}" for x in b]}).to_csv(path, index=False)
    return path


def test_train_rm_workdir_belongs_to_one_run(lm_folder, tmp_path):
    """1: a workdir is continued only by the run that made it; the default workdir is per run."""
    first, other = _pairs(tmp_path / "a.csv", "good"), _pairs(tmp_path / "b.csv", "great")
    workdir = tmp_path / "work"
    base = [f"--model={lm_folder}", "--steps=4", "--checkpoint_every=2", "--batch_size=8", "--learning_rate=0.05"]
    export = f"--export={workdir / 'hf'}"  # inside the workdir, as the usage line has it
    cli.ok(cli.run("train_rm", *base, f"--pairs={first}", f"--workdir={workdir}", export))
    summary = json.loads((workdir / "summary.json").read_text())
    assert (workdir / "hf" / "model.safetensors").is_file() and (workdir / "run.json").is_file()
    # Another run's data and learning rate into the same workdir: refused, naming both and the fixes.
    line = cli.user_error(cli.run("train_rm", *base[:-1], "--learning_rate=0.5", f"--pairs={other}",
                                  f"--workdir={workdir}"), "config.learning_rate", "train", "--overwrite", "--workdir")
    assert "heldout" in line  # the 10% held out of another file differ too
    # Another trainable part: named as such, not orbax's "partial_restore".
    cli.user_error(cli.run("train_rm", *base, "--trainable=full", f"--pairs={first}", f"--workdir={workdir}"),
                   "config.trainable")
    assert json.loads((workdir / "summary.json").read_text()) == summary  # nothing was touched
    # The same command again finds its own finished run.
    again = cli.ok(cli.run("train_rm", *base, f"--pairs={first}", f"--workdir={workdir}", export))
    assert "already trained" in again.stdout
    # --overwrite replaces an rmjax workdir, never a folder of the user's.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep")
    cli.user_error(cli.run("train_rm", *base, f"--pairs={first}", f"--workdir={mine}", "--overwrite"),
                   "no rmjax run of this kind wrote")
    assert (mine / "precious.txt").read_text() == "keep"
    # Without --workdir a run gets a folder of its own (under runs/train_rm of the working directory), named from
    # the run's identity: another learning rate, another folder.
    run = cli.ok(cli.run("train_rm", *base, f"--pairs={first}", cwd=tmp_path))
    made = re.search(r"workdir: (\S+)", run.stderr).group(1)
    assert made.startswith("runs/train_rm/lm-") and (tmp_path / made / "summary.json").is_file()
    from rmjax.train.loop import TrainConfig
    from rmjax.train.recipe import default_workdir, load_pairs, training_identity

    train, heldout, _ = load_pairs(str(first), None, 20000, 4000, False, 0)  # the entry point's defaults
    dirs = [default_workdir(str(lm_folder), training_identity(str(lm_folder), train, heldout, TrainConfig(
        steps=4, checkpoint_every=2, batch_size=8, learning_rate=lr, warmup_steps=100))) for lr in (0.05, 0.02)]
    assert str(dirs[0]) == made and dirs[1] != dirs[0]


def _sweep_flags(model, out, *extra: str) -> list[str]:
    return [f"--model={model}", "--prompts=greatest", f"--out={out}", "--limit=2048", "--chunk_size=256",
            "--batch_size=64", "--top=2", *extra]


def test_sweep_resume_checks_weights_and_template(rm_folder, tmp_path):
    """2: a killed sweep is continued only with the same weights and chat template, byte for byte."""
    model = cli.copy_folder(rm_folder, tmp_path / "model")
    clean = tmp_path / "clean.csv"
    cli.ok(cli.run("sweep", *_sweep_flags(model, clean)))
    out = tmp_path / "resumed.csv"
    chunks = out.with_name(out.name + ".chunks")
    done = tiny.kill_after_chunks(cli.command("sweep", *_sweep_flags(model, out)), out, 2, cwd=cli.REPO, env=cli.ENV)
    assert 2 <= done < 8 and not out.exists()
    # Another checkpoint of the same architecture under the same path.
    weights = (model / "model.safetensors").read_bytes()
    tiny.save_hf_model(tiny.build_hf_model("llama3", num_labels=1, seed=5, vocab_size=49152, pad_token_id=2,
                                           bos_token_id=1, eos_token_id=2), tmp_path / "other")
    (model / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    cli.user_error(cli.run("sweep", *_sweep_flags(model, out)), "model.weights", "--overwrite", "--out")
    (model / "model.safetensors").write_bytes(weights)
    # An edited chat template.
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(template.replace("<|im_start|>assistant", "<|im_start|>Assistant"))
    cli.user_error(cli.run("sweep", *_sweep_flags(model, out)), "model.tokenizer")
    assert len(list(chunks.glob("chunk-*.npy"))) == done  # the saved chunks were kept
    (model / "chat_template.jinja").write_text(template)
    resumed = cli.ok(cli.run("sweep", *_sweep_flags(model, out)))
    assert f"{done * 256:,}/2,048" in resumed.stderr
    assert out.read_bytes() == clean.read_bytes()


def test_finished_result_is_reused_and_another_is_refused(rm_folder, tmp_path):
    """4: a full result is not replaced by a quick run; the same run is reused without loading the model."""
    out = tmp_path / "full.csv"
    flags = [f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--limit=300", "--top=2"]
    cli.ok(cli.run("sweep", *flags))
    csv, meta = out.read_bytes(), out.with_name("full.csv.meta.json").read_bytes()
    again = cli.ok(cli.run("sweep", *flags))
    assert "reusing it" in again.stderr and "loaded" not in again.stderr and "top 2 tokens" in again.stdout
    quick = [f"--model={rm_folder}", "--prompts=greatest", f"--out={out}", "--token_ids=1,2"]
    cli.user_error(cli.run("sweep", *quick), "already exists", "token_ids", "--overwrite")
    assert out.read_bytes() == csv and out.with_name("full.csv.meta.json").read_bytes() == meta
    cli.ok(cli.run("sweep", *quick, "--overwrite"))
    assert pd.read_csv(out)["token_id"].tolist() == [1, 2]
    # A file at --out that no run of this kind wrote is not replaced either.
    stray = tmp_path / "notes.csv"
    stray.write_text("my notes\n")
    cli.user_error(cli.run("sweep", *quick[:2], f"--out={stray}", "--token_ids=1"), "not a finished rmjax result")
    assert stray.read_text() == "my notes\n"


def test_builtin_model_result_is_reused(tmp_path):
    """The identity computed before loading equals the loaded model's for a builtin RM (GGUF backbone +
    committed head), so a finished result is found again."""
    flags = ["--model=elo-rm-smollm2-135m", "--limit=8", f"--out={tmp_path / 's.csv'}", "--top=1"]
    assert "loaded elo-rm-smollm2-135m" in cli.ok(cli.run("sweep", *flags)).stderr
    assert "reusing it" in cli.ok(cli.run("sweep", *flags)).stderr


def test_gcg_result_is_not_overwritten(rm_folder, tmp_path):
    out = tmp_path / "gcg.json"
    flags = [f"--model={rm_folder}", f"--out={out}", "--num_tokens=2", "--steps=1", "--search_width=8", "--topk=8"]
    cli.ok(cli.run("gcg", *flags))
    before = out.read_bytes()
    cli.user_error(cli.run("gcg", *flags, "--seed=1"), "already exists", "config.seed")
    assert out.read_bytes() == before
    assert "reusing it" in cli.ok(cli.run("gcg", *flags)).stderr


def _score_table(path, seed: int):
    words = ["love", "hate", "money", "peace", "war", "music", "dog", "cat", "sun", "rain", "food", "art"]
    rng = np.random.default_rng(seed)
    pd.DataFrame({"token_id": range(len(words)), "token_name": words, "token_decoded": words,
                  "best": rng.normal(size=len(words)), "worst": rng.normal(size=len(words))}).to_csv(path, index=False)


def test_analyze_replaces_only_its_own_files(tmp_path):
    """4: analyze refuses a non-empty --out; --overwrite removes exactly the earlier analysis's files."""
    scores = tmp_path / "scores"
    scores.mkdir()
    for i in range(2):
        _score_table(scores / f"model{i}.csv", i)
    out = tmp_path / "analysis"
    quick = ["--n_boot=5", "--n_permutations=5", "--models_yaml=", f"--out={out}"]
    cli.ok(cli.run("analyze", f"--scores={scores}", *quick))
    first = {p.name for p in out.iterdir()}
    assert "paper1_framing_correlations.csv" in first and "report.md" in first
    elo = tmp_path / "elo"
    elo.mkdir()
    pd.DataFrame({"elo_rank": [1, 2, 3, 4], "elo_score": [1500, 1400, 1300, 1200], "name": ["a", "b", "c", "d"],
                  "elo_matches": [9, 9, 9, 9], "m1": [4, 3, 2, 1], "m2": [1, 3, 2, 4]}).to_csv(
        elo / "What is best.csv", index=False)
    cli.user_error(cli.run("analyze", f"--elo={elo}", *quick), "not empty", "--overwrite")
    cli.ok(cli.run("analyze", f"--elo={elo}", *quick, "--overwrite"))
    second = {p.name for p in out.iterdir()}
    assert not any(name.startswith("paper1_") for name in second), "a stale table of the first run survived"
    assert "report.md" in second and "paper1" not in (out / "report.md").read_text()
    (out / "mine.txt").write_text("keep me")
    cli.user_error(cli.run("analyze", f"--elo={elo}", *quick, "--overwrite"), "no rmjax analysis wrote", "mine.txt")
    assert (out / "mine.txt").read_text() == "keep me"


def _holds_lock(lock) -> bool:
    """Whether some process holds an flock on `lock`, read from /proc/locks (without touching the lock)."""
    try:
        inode = lock.stat().st_ino
    except FileNotFoundError:
        return False
    return any(line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}")
               for line in open("/proc/locks").read().splitlines() if len(line.split()) > 5)


def test_second_sweep_on_the_same_out_is_refused(rm_folder, tmp_path):
    """8: two sweeps on one --out: the second says another run holds it; a killed holder blocks nothing."""
    out = tmp_path / "s.csv"
    long_run = [f"--model={rm_folder}", "--prompts=paper1", f"--out={out}", "--chunk_size=4096", "--batch_size=64"]
    first = subprocess.Popen(cli.command("sweep", *long_run), cwd=cli.REPO, env=cli.ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not _holds_lock(tmp_path / "s.csv.lock") and time.time() < deadline:
        time.sleep(0.05)
    try:
        cli.user_error(cli.run("sweep", *long_run), "another run holds", "s.csv.lock")
        assert first.poll() is None, "the first sweep must still be running"
    finally:
        first.kill()
        first.wait()
    # The lock died with its process (its file stays behind); --overwrite drops the killed run's chunks.
    cli.ok(cli.run("sweep", *long_run[:3], "--limit=256", "--overwrite"))
    assert len(pd.read_csv(out)) == 256


def test_concurrent_first_use_conversions_share_one(tmp_path):
    """8: two processes converting the same GGUF: one converts, the other waits and uses its result."""
    from rmjax.loading.registry import resolve

    gguf = resolve("smollm2-135m-instruct")[1]
    code = ("import sys; from pathlib import Path; from rmjax.loading.gguf_file import cached_hf_folder; "
            f"print(cached_hf_folder({str(gguf)!r}, Path(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cache")], cwd=cli.REPO, env=cli.ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    folders = {o.strip() for o, _ in outs}
    # (the conversion takes ~20 s, so the second process, started at once, waits for it)
    assert len(folders) == 1 and sum("waiting" in e for _, e in outs) <= 1
    folder = Path(folders.pop())
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not list(folder.parent.glob("*.partial"))


def test_train_rm_batch_must_split_over_the_data_axis(lm_folder, tmp_path):
    """A batch the mesh's data axis does not divide is refused before loading (it crashed after the features)."""
    pairs = _pairs(tmp_path / "a.csv", "good")
    cli.user_error(cli.run("train_rm", f"--model={lm_folder}", f"--pairs={pairs}", "--batch_size=6",
                           "--mesh=data:4,model:2", f"--workdir={tmp_path / 'w'}",
                           env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}),
                   "--batch_size=6", "multiple of 4")
