"""Bad input to the entry points (helper-116's fault hunt, 547 command lines): blank output paths written as folders
named ' ' or into the working folder, model flags refused under another flag's name, a stray comma that dropped a
model unsaid, floats finite in float64 that overflow or vanish in float32, and a refusal whose advice is refused."""

from __future__ import annotations

import pytest

from rmjax.errors import UsageError
from tests import cli


def test_a_limit_keeping_its_one_candidate_advises_no_limit_below_one():
    """`sweep --token_ids=5 --limit=1` (or a --vocab_file of one usable line) said 'give a --limit below 1', a value
    --limit's own lower bound (1) refuses."""
    from rmjax.text.candidates import refuse_limit_keeping_all

    with pytest.raises(UsageError) as refused:
        refuse_limit_keeping_all(1, 1)
    assert "below" not in str(refused.value) and "leave it out" in str(refused.value)
    with pytest.raises(UsageError, match="give a --limit below 3"):
        refuse_limit_keeping_all(5, 3)


def test_blank_outputs_stray_commas_and_other_model_flags_are_refused_by_their_own_name(tmp_path):
    """Each refused in one line before any model loads, naming its own flag, writing nothing:
    - `analyze --elo=builtin --out=` wrote its 23 tables, figures and report.md into the working folder (exit 0),
      `--out=' '` into a folder named ' ' (every job run through common.options refuses an empty --out);
    - `plan --out=' '` compiled for a minute, then wrote a file named ' ';
    - `train_rm --workdir=' '` (--export, --head_out) trained into a folder named ' ' (exit 0);
    - `beam --lm=' '` was refused as '--model is empty', `gcg --lm=a,b` as '--model=a,b: this job takes one model';
    - `gcg --model=elo-rm-smollm2-135m,` loaded the model and searched it alone (exit 0); `--model=,` an IndexError."""
    train = ("train_rm", "--elo=builtin", "--steps=2", "--warmup_steps=0")
    gcg = ("gcg", "--steps=1", "--out=g.json")
    cases = [(("analyze", "--elo=builtin", "--out="), "--out is empty"),
             (("analyze", "--elo=builtin", "--out= "), "--out is empty"),
             (("plan", "--job=score", "--out= "), "--out=' ' is blank"),
             *[((*train, f"--{name}= "), f"--{name}=' ' is blank") for name in ("workdir", "export", "head_out")],
             (("beam", "--lm= "), "--lm is empty"), (("gcg", "--lm= "), "--lm is empty"),
             (("frontier", "--judge= "), "--judge is empty"),
             (("gcg", "--lm=a,b"), "--lm=a,b: this job takes one model"),
             (("disagree", "--models=elo-rm-smollm2-135m,elo-rm-gemma3-270m", "--judge= "), "--judge is empty"),
             *[((*gcg, f"--model={models}"), "an item is empty")
               for models in ("elo-rm-smollm2-135m,", ",elo-rm-smollm2-135m", ",")]]
    procs = cli.run_each(*[command for command, _ in cases], cwd=tmp_path)
    for (command, expected), proc in zip(cases, procs, strict=True):
        line = cli.user_error(proc, expected)
        if "--lm" in expected or "--judge" in expected:
            assert line.startswith(f"error: {expected}"), (command, line)  # its own flag first, not --model
    assert list(tmp_path.iterdir()) == []


def test_float_settings_past_float32_are_refused():
    """`gcg --embed_reg=1e39` passed the finiteness check (finite in float64) and became inf on the device: every
    swap scored NaN/inf, each step sampled 0 candidates, and the job wrote its start as the result (exit 0), its
    warning blaming --topk and --search_width. `--temperature=1e-300` is 0 in float32 (a division by 0), and
    `--best_of_n_temperatures=inf` passed its rule (inf > 0): the frontier loaded and sampled at it."""
    from rmjax.search.fluent import FluentConfig
    from rmjax.search.gcg_config import GCGConfig

    with pytest.raises(UsageError, match="--embed_reg=1e\\+39: must be within float32's range"):
        GCGConfig(embed_reg=1e39)
    with pytest.raises(UsageError, match="--temperature=1e\\+300"):
        FluentConfig(temperature=1e300)
    with pytest.raises(UsageError, match="--temperature=1e-300: is 0 in float32"):
        FluentConfig(temperature=1e-300)
    with pytest.raises(UsageError, match="--best_of_n_temperatures=1.0,inf: must be a finite number"):
        FluentConfig(best_of_n_temperatures=(1.0, float("inf")))
    GCGConfig(embed_reg=1e3)  # ordinary values pass, 0 too
    GCGConfig(embed_reg=0.0)
    FluentConfig(best_of_n_temperatures=(0.7, 1.0))
