"""Everything one analysis reads, read and checked before its output folder is touched."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from rmjax.analysis import beams, bigtwo, data, disagreements, lexicons, model_metadata
from rmjax.analysis import elo as elo_lib
from rmjax.analysis.files import MODEL
from rmjax.analysis.spec import AnalysisConfig, elo_folder
from rmjax.errors import InputFileError, MissingFileError, UsageError, require_file
from rmjax.runs import results, stages


def _load_optional(skipped: list[str], what: str, loader: Callable, *args):
    try:
        return loader(*args)
    except (lexicons.MissingLexiconError, FileNotFoundError) as error:
        skipped.append(f"{what}: {error}")
        return None


@dataclasses.dataclass
class Inputs:
    """Everything one analysis reads, read and checked before its folder is touched: a bad input neither removes
    an earlier analysis (--overwrite) nor leaves half of a new one."""

    metadata: pd.DataFrame | None = None
    lexicon: lexicons.StemMatcher | None = None
    afinn: dict | None = None
    frequencies: dict | None = None
    scores: list[data.ScoreTable] = dataclasses.field(default_factory=list)
    beams: list[beams.BeamTable] = dataclasses.field(default_factory=list)
    elo: list[elo_lib.EloPrompt] = dataclasses.field(default_factory=list)
    implicit: tuple[data.ScoreTable, data.ScoreTable] | None = None
    checkpoints: list[tuple[int, data.ScoreTable]] = dataclasses.field(default_factory=list)
    disagreements: list[disagreements.DisagreementRun] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AnalysisConfig)}


def load_inputs(cfg: AnalysisConfig) -> Inputs:
    """Read every input `cfg` names; a missing, partial, wrong-kind or empty one stops the run in one line."""
    elo, elo_prompt = elo_folder(cfg.elo)
    named = (("--elo", elo), ("--models_yaml", cfg.models_yaml), ("--bigtwo_checkpoints", cfg.bigtwo_checkpoints),
             ("--bigtwo_dictionary", cfg.bigtwo_dictionary), ("--implicit_chosen", cfg.implicit_chosen),
             ("--implicit_reference", cfg.implicit_reference),
             ("--frequencies", cfg.frequencies if cfg.scores else None))  # the shipped list unless given
    files = ("--models_yaml", "--bigtwo_dictionary", "--implicit_chosen", "--implicit_reference", "--frequencies")
    for what, path in named:
        if path and what in files:  # a folder was an IsADirectoryError traceback; a pipe is read more than once
            require_file(path, f"{what}={path}")
        elif path and not Path(path).exists():
            raise MissingFileError(f"{what}={path} not found.")
    found = Inputs()
    found.metadata = model_metadata.load_model_metadata(cfg.models_yaml) if cfg.models_yaml else None
    if cfg.scores or cfg.implicit_chosen or cfg.bigtwo_checkpoints:
        lexicon = _load_optional(found.skipped, "Big Two", lexicons.load_bigtwo, cfg.bigtwo_dictionary)
        found.lexicon = None if lexicon is None else lexicons.StemMatcher(lexicon)  # one memo for every table
    score_paths, beam_paths = beams.split_paths(data.expand_paths(cfg.scores)) if cfg.scores else ([], [])
    if beam_paths and cfg.roundtrip_only:
        raise UsageError(f"--roundtrip_only cannot restrict beam results ({beam_paths[0]} has no roundtrip column); "
                         "analyze beam results in a run without --roundtrip_only.")
    found.beams = beams.load_beam_tables(beam_paths, found.metadata)
    if score_paths:
        found.scores = data.load_score_tables(score_paths, found.metadata, cfg.roundtrip_only)
        found.afinn = _load_optional(found.skipped, "sentiment and frequency", lexicons.load_afinn)
        if cfg.frequencies:
            found.frequencies = lexicons.load_bnc_frequencies(cfg.frequencies)
            if not found.frequencies:  # a slope over no words: NaN in a table, exit 0
                raise InputFileError(f"--frequencies={cfg.frequencies}: no word frequencies read; give the BNC list "
                                     "(1_1_all_alpha.txt: Word, PoS, marker, Freq per million, tab-separated).")
        else:
            found.skipped.append(f"frequency: BNC word-frequency list {cfg.frequencies or '(none given)'} not found "
                                 "(give --frequencies=PATH/1_1_all_alpha.txt).")
    if elo:
        found.elo = [ep for ep in elo_lib.load_elo(elo, found.metadata)
                     if elo_prompt is None or ep.prompt.removesuffix("?") == elo_prompt]
        if not any(ep.models for ep in found.elo) and (
                not found.scores or elo_lib.add_score_tables(found.elo, found.scores).coverage.empty):
            raise InputFileError(f"--elo={cfg.elo}: its CSVs have no model columns (beside elo_rank, elo_score, name, "
                                 "elo_matches) and no --scores table scores their prompts: no model to compare with "
                                 "the human ranking.")
    if cfg.implicit_chosen:
        if Path(cfg.implicit_chosen).resolve() == Path(cfg.implicit_reference).resolve():  # MWLR 0 everywhere
            raise UsageError(f"--implicit_chosen and --implicit_reference are one file ({cfg.implicit_chosen}); give "
                             "the log-prob tables of two models.")
        (chosen,), (reference,) = (data.load_score_tables([p], kinds=data.LOGPROB_KINDS, flag=flag, bare=False)
                                   for p, flag in ((cfg.implicit_chosen, "--implicit_chosen"),
                                                   (cfg.implicit_reference, "--implicit_reference")))  # same name ok
        _two_models(chosen.path, reference.path)
        found.implicit = chosen, reference
        differ = implicit_templates(chosen, reference)
        if differ:
            print(f"warning: {differ}", file=sys.stderr)
    if cfg.bigtwo_checkpoints and found.lexicon is not None:
        found.checkpoints = bigtwo.load_checkpoints(cfg.bigtwo_checkpoints, cfg.roundtrip_only)
    if cfg.disagreements:
        found.disagreements = disagreements.load_runs(cfg.disagreements)
    tables = [*found.scores, *(found.implicit or ()), *(t for _, t in found.checkpoints)]
    for table in tables:
        if table.frame.empty:  # every statistic of it would be NaN, reported as if computed
            raise InputFileError(f"{table.path}: the table has no rows (a header only); give the finished table.")
    # RBO compares models: set for one score table it changes nothing (a fault hunt)
    changed = [f"--{name}={getattr(cfg, name)}" for name in ("rbo_p", "rbo_depth")
               if getattr(cfg, name) != _DEFAULTS[name]]
    if changed and len(found.scores) < 2:
        raise UsageError(f"{changed[0]} sets the rank-biased overlap between models, and {len(found.scores)} score "
                         f"table{'s' * (len(found.scores) != 1)} {'is' if len(found.scores) == 1 else 'are'} given "
                         "(RBO needs two or more --scores tables); leave it out.")
    # refused here, before --out is touched, not by the analysis that compares them
    for what, group in (("the --scores tables", found.scores), ("the --implicit_chosen and --implicit_reference "
                        "tables", found.implicit or ()), ("the --bigtwo_checkpoints tables",
                                                          [t for _, t in found.checkpoints])):
        if group and not data.common_prompts(group):
            raise UsageError(f"{what} have no prompt column in common: {[t.prompts for t in group]}; give tables "
                             "of one prompt set.")
    same_prompt_texts(found)
    for label, path in [(t.model, t.path) for t in found.scores] + [(t.model, t.path) for t in found.beams]:
        if label == MODEL:
            raise UsageError(f"--scores={path}: its model is labelled {MODEL!r}, the name of the model column of every "
                             "model x model table; give it another name (its .meta.json model, or a --models_yaml "
                             "nickname).")
    return found


def _two_models(chosen: Path, reference: Path) -> None:
    """The implicit RM compares two models: two tables of one model content, dtype and template (two files, or a
    copy of the model) have MWLR 0 for every token, and its 'optimal' tokens would be the ties' order."""
    metas = [results.read_meta(p) or {} for p in (chosen, reference)]
    same = [{**(m.get("identity") or {})} for m in metas]
    for meta, identity in zip(metas, same, strict=True):  # --template=auto and chat (or plain) render alike
        identity["template"] = stages.recorded_template(meta)
    keys = ("model", "dtype", "template")
    if all(same[0].get(k) is not None and same[0].get(k) == same[1].get(k) for k in keys):
        raise UsageError(f"--implicit_chosen={chosen} and --implicit_reference={reference} are log-probs of one model "
                         "(same weights, tokenizer, dtype and template: MWLR is 0 for every token); give the tables "
                         "of two models.")


def implicit_templates(chosen: data.ScoreTable, reference: data.ScoreTable) -> str | None:
    """What to say when the two models' log-probs were taken under different templates (--template=chat and
    plain) or --system_prompt values: the two models then saw the prompt in different forms, and MWLR measures
    that too."""
    metas = [(results.read_meta(t.path) or {}) if t.path else {} for t in (chosen, reference)]
    templates = [stages.recorded_template(m) if m else None for m in metas]
    if templates[0] != templates[1]:
        return (f"the implicit RM's log-probs were taken under different templates ({chosen.model}: {templates[0]}, "
                f"{reference.model}: {templates[1]}): the two models saw the prompt in different forms, and the MWLR "
                "measures that difference too; rerun experiments.logprobs with one --template for both.")
    # one --system_prompt given to one side only (or two): a difference in the conversation, as a template's
    systems = [m.get("system_prompt") for m in metas]
    if all(metas) and systems[0] != systems[1]:
        said = [repr(x) if x is not None else "its template's default" for x in systems]
        return (f"the implicit RM's log-probs were taken under different system prompts ({chosen.model}: {said[0]}, "
                f"{reference.model}: {said[1]}): the two models saw different conversations, and the MWLR measures "
                "that difference too; rerun experiments.logprobs with one --system_prompt for both.")
    return None


def implicit_labels(chosen: data.ScoreTable, reference: data.ScoreTable) -> tuple[str, str]:
    """How the report names the two sides. Two tables of one model in two dtypes or templates (allowed: MWLR then
    measures that difference) were both named by the model ("X over X"): each is told by what differs."""
    if chosen.model != reference.model:
        return chosen.model, reference.model
    metas = [(results.read_meta(t.path) or {}) if t.path else {} for t in (chosen, reference)]
    dtypes = [(m.get("identity") or {}).get("dtype") for m in metas]
    if dtypes[0] != dtypes[1] and None not in dtypes:
        return f"{chosen.model} ({dtypes[0]})", f"{reference.model} ({dtypes[1]})"
    templates = [stages.recorded_template(m) for m in metas]
    if templates[0] != templates[1] and None not in templates:
        return f"{chosen.model} ({templates[0]} template)", f"{reference.model} ({templates[1]} template)"
    return f"{chosen.model} ({chosen.path})", f"{reference.model} ({reference.path})"


def same_prompt_texts(found: Inputs) -> None:
    """Each group of tables compared column by column (the score tables, the beam results, the implicit pair, the
    checkpoints) uses a prompt name for one prompt text (rmjax.runs.stages.same_prompt_texts): two models' columns
    of one name scored for different texts are refused in one line, not compared."""
    implicit = zip(("--implicit_chosen", "--implicit_reference"), found.implicit or (), strict=False)
    for group in ([("--scores", t.path) for t in found.scores], [("--scores", t.path) for t in found.beams],
                  [(flag, t.path) for flag, t in implicit],
                  [("--bigtwo_checkpoints", t.path) for _, t in found.checkpoints]):
        stages.same_prompt_texts([(flag, path) for flag, path in group if path is not None])
