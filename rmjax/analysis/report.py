"""`run_analyses`: run every analysis whose inputs are given, write each table (CSV) and figure (PNG)
to one folder, and a short report of the headline numbers (report.md, also printed)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from rmjax.analysis import beams, bigtwo, data, disagreements, lexicons, model_metadata, paper1, plots, stats
from rmjax.analysis import elo as elo_lib
from rmjax.analysis import implicit as implicit_lib
from rmjax.analysis.files import Outputs, markdown
from rmjax.analysis.inputs import Inputs, implicit_labels, implicit_templates, load_inputs
from rmjax.analysis.spec import AnalysisConfig
from rmjax.errors import UsageError
from rmjax.runs import locks
from rmjax.runs.paths import check_writable
from rmjax.text.visible import markdown_code


def item_counts(agreement: pd.DataFrame, models: list[str]) -> list[str]:
    """How many items each model's τ with humans is over: one number, or the range where its prompts' differ."""
    counts = agreement.groupby("model", sort=False)["n_items"].agg(["min", "max"]).loc[models]
    return [str(lo) if lo == hi else f"{lo}–{hi}" for lo, hi in zip(counts["min"], counts["max"], strict=True)]


def paper1_analyses(outputs: Outputs, tables: list[data.ScoreTable], metadata: pd.DataFrame | None,
                    afinn: dict | None, frequencies: dict | None, cfg: AnalysisConfig) -> None:
    prompts = data.common_prompts(tables)  # not empty: rmjax.analysis.inputs.load_inputs refuses that first
    labels = [t.model for t in tables]
    outputs.skip_unshared("--scores", {t.model: t.prompts for t in tables}, prompts,
                          "of every table; analyze that model alone to see them")
    parts = data.file_parts(prompts)
    vocabulary = data.shared_vocabulary(tables)
    outputs.keyed_table("paper1_shared_vocabulary", {"token_decoded": vocabulary}, {})
    outputs.headline["shared_vocabulary_size"] = len(vocabulary)
    outputs.say("## Paper 1: score tables", "",
                f"{len(tables)} models ({', '.join(labels)}), prompts {prompts}; shared vocabulary "
                f"{len(vocabulary)} decoded strings (in every model, none duplicated within a model).", "")
    for t in tables:
        subset = data.candidate_subset(t.path)
        if subset:  # a quick or targeted sweep read as the model's whole distribution would mislead
            outputs.say(f"- {t.model} is a sweep of part of its vocabulary ({subset}): its moments, ranks, "
                        "percentiles and EloEverything agreement are over those tokens only, and the EloEverything "
                        "items it did not score count as not_a_single_token.", "")

    moments = outputs.table("paper1_moments", paper1.moments_table(tables, prompts, cfg.n_boot, cfg.seed))
    outputs.say("Moments of each table's score distribution, over all its rows (variance ddof=0, biased skewness; "
                f"95% bootstrap CIs, {cfg.n_boot} resamples, in paper1_moments.csv):", "",
                markdown(moments[["prompt", "model", "n_tokens", "mean", "variance", "skewness"]]), "")
    for prompt in prompts:
        outputs.figure(f"paper1_violin_{parts[prompt]}", plots.violin,
                       {t.model: t.frame[prompt].to_numpy() for t in tables}, f"Score distributions: {prompt}")
    outputs.table("paper1_top_bottom_raw", paper1.top_bottom_table(tables, prompts, cfg.top))
    shared_top = outputs.table("paper1_top_bottom_shared",
                               paper1.top_bottom_table(tables, prompts, cfg.top, vocabulary))
    first = shared_top[(shared_top["prompt"] == prompts[0]) & (shared_top["rank"] <= 5)]
    outputs.say(f"Top and bottom 5 tokens on the shared vocabulary for {prompts[0]!r} (␣: a space):", "")
    for model in labels:
        part = first[first.model == model]
        top = ", ".join(map(markdown_code, part[part.side == "top"].token_decoded))
        bottom = ", ".join(map(markdown_code, part[part.side == "bottom"].token_decoded))
        outputs.say(f"- {model}: top {top}; bottom {bottom}")
    outputs.say("")

    if len(tables) >= 2 and len(vocabulary) >= stats.MIN_ITEMS:
        heterogeneity_section(outputs, tables, prompts, vocabulary, metadata, n_permutations=cfg.n_permutations,
                              rbo_p=cfg.rbo_p, rbo_depth=cfg.rbo_depth, seed=cfg.seed)
    else:
        outputs.skip(f"heterogeneity/MDS/RSA: needs at least two models sharing at least {stats.MIN_ITEMS} strings.")

    best, worst = cfg.framing
    # a prompt of one score has no z-scores (its SD is 0): that model's framing is undefined, said and left out
    framed = [t for t in tables if all(t.frame[p].nunique() > 1 for p in (best, worst) if p in prompts)]
    for t in tables:
        if t not in framed:
            outputs.skip(f"framing: {t.model} gives one score to every string for {best!r} or {worst!r}, so its "
                         "framing (z-scores per prompt) is undefined.")
    if best in prompts and worst in prompts and framed:
        correlations, rankings = paper1.framing_tables(framed, best, worst, cfg.top)
        outputs.table("paper1_framing_correlations", correlations)
        outputs.table("paper1_framing_rankings", rankings)
        outputs.figure("paper1_framing_scatter", plots.framing_scatter,
                       {t.model: (t.frame[best].to_numpy(), t.frame[worst].to_numpy()) for t in framed}, best, worst)
        outputs.say(f"Framing: correlation of {best!r} and {worst!r} scores per model:", "",
                    markdown(correlations), "")
    elif framed:
        outputs.skip(f"framing: needs prompts {best!r} and {worst!r} (have {prompts}).")

    collapse = cfg.collapse_variants
    if afinn is not None:
        slopes = outputs.table("paper1_sentiment_slopes",
                               paper1.sentiment_regressions(tables, prompts, afinn, collapse))
        outputs.figure("paper1_sentiment_slopes", plots.slope_plot, slopes, ["prompt", "valence"], "slope", "se",
                       "Score ~ AFINN-111 sentiment, by valence", "slope (score per sentiment point)")
        for prompt in prompts:
            outputs.figure(f"paper1_sentiment_scatter_{parts[prompt]}", plots.sentiment_scatter,
                           {t.model: paper1.sentiment_points(t, prompt, afinn, collapse) for t in tables},
                           f"Score vs AFINN-111 sentiment: {prompt}")
        mean = slopes.groupby(["prompt", "valence"], sort=False)["slope"].agg(["mean", "count"]).reset_index()
        outputs.say(f"Sentiment: OLS slope of score on AFINN-111 value (mean over models; word variants: "
                    f"{collapse}):", "", markdown(mean), "")
        if frequencies is not None:
            freq = outputs.table("paper1_frequency_slopes", paper1.frequency_regressions(
                tables, prompts, afinn, frequencies, collapse, cfg.frequency_scale))
            scale = paper1.FREQUENCY_SCALES[cfg.frequency_scale]
            outputs.figure("paper1_frequency_slopes", plots.slope_plot, freq, ["prompt"], "slope_frequency",
                           "se_frequency", "Score ~ word frequency + sentiment", f"slope (score per unit of {scale})")
            mean = freq.groupby("prompt", sort=False)["slope_frequency"].agg(["mean", "count"]).reset_index()
            per_sd = " (each model's own SD: the mean mixes units)" if cfg.frequency_scale == "zscore" else ""
            outputs.say(f"Frequency: slope of score on {scale} controlling for sentiment (mean over models{per_sd}; "
                        f"word variants: {collapse}):", "", markdown(mean), "")


def heterogeneity_section(outputs: Outputs, tables: list[data.ScoreTable], prompts: Sequence[str],
                          vocabulary: Sequence[str], metadata: pd.DataFrame | None, *, n_permutations: int,
                          rbo_p: float, rbo_depth: int, seed: int) -> None:
    labels = [t.model for t in tables]
    model_meta = model_metadata.metadata_for(labels, metadata)
    groups = None if model_meta is None else dict(zip(labels, model_meta["base_model"], strict=True))
    rsa_rows = []
    parts = data.file_parts(prompts)
    for prompt in prompts:
        slug = parts[prompt]
        aligned = data.aligned_scores(tables, prompt, vocabulary)
        matrices = paper1.heterogeneity(aligned, rbo_p, rbo_depth)
        for name, matrix in matrices.items():
            outputs.matrix(f"paper1_{name}_{slug}", matrix)
            outputs.figure(f"paper1_{name}_{slug}", plots.heatmap, matrix, f"{name.replace('_', ' ')}: {prompt}",
                           vmin=0 if name in ("rbo", "epic_distance") else None, vmax=1)
        tau = matrices["kendall_tau"]
        constant = [c for c in aligned.columns if aligned[c].nunique() < 2]
        if constant:  # a rank correlation with one value is undefined (NaN): no MDS, no RSA, no summary of it
            outputs.skip(f"MDS/RSA for {prompt!r}: Kendall tau is undefined for {', '.join(map(str, constant))}, "
                         f"whose score is one value on all {len(aligned)} shared strings.")
            continue
        coords = stats.mds_embedding(1.0 - tau, seed)
        outputs.table(f"paper1_mds_{slug}", coords.rename_axis("model").reset_index())
        outputs.figure(f"paper1_mds_{slug}", plots.mds_scatter, coords, groups, f"MDS of 1 - Kendall tau: {prompt}")
        pairs = stats.upper_triangle(tau)
        outputs.say(f"Kendall tau-b between models for {prompt!r} on {len(aligned)} shared strings: mean "
                    f"{pairs.mean():.3f}, min {pairs.min():.3f}, max {pairs.max():.3f}.")
        if model_meta is not None and len(tables) >= 3:
            rsa = paper1.rsa_table(tau, model_meta, n_permutations, seed)
            rsa.insert(0, "prompt", prompt)
            rsa_rows.append(rsa)
    outputs.say("")
    if model_meta is not None and len(tables) >= 3:
        for theory, models in stats.unknown_metadata(model_meta).items():
            outputs.skip(f"RSA {theory}: --models_yaml gives no {stats.THEORY_FIELDS[theory]} for "
                         f"{', '.join(models)}.")
    if rsa_rows and any(len(r) for r in rsa_rows):
        rsa = outputs.table("paper1_rsa", pd.concat(rsa_rows, ignore_index=True))
        theory = stats.theoretical_similarities(model_meta)
        for name, matrix in theory.items():
            outputs.matrix(f"paper1_rsa_theoretical_{name}", matrix)
        outputs.figure("paper1_rsa_theoretical_matrices", plots.matrix_panels, theory,
                       "RSA theoretical similarity matrices")
        outputs.say("RSA: Spearman rho between model dissimilarity (1 - tau, upper triangle) and each theoretical "
                    "similarity matrix, permutation p (model labels permuted); rho < 0 means models alike in "
                    "theory score alike:", "", markdown(rsa), "")
    else:
        outputs.skip("RSA: needs >= 3 models and --models_yaml metadata for every model "
                     "(nickname, base_model, size, reward_bench_rank).")


def bigtwo_section(outputs: Outputs, tables: list[data.ScoreTable], lexicon: bigtwo.Lexicon,
                   metadata: pd.DataFrame | None, collapse: str, name: str = "bigtwo") -> None:
    prompts = data.common_prompts(tables)
    parts = data.file_parts(prompts, clashes=lambda slug: slug in ("variants", "families", "checkpoints"))
    every = {how: bigtwo.bigtwo_comparison(tables, prompts, lexicon, how) for how in data.COLLAPSE_MODES}
    comparison = outputs.table(name, every[collapse])
    categories = {t.model: lexicons.categorize(t.normalized, lexicon, normalized=True) for t in tables}
    for prompt in prompts:
        points = {t.model: bigtwo.bigtwo_points(t, prompt, lexicon, categories[t.model], collapse) for t in tables}
        outputs.figure(f"{name}_{parts[prompt]}", plots.bigtwo_boxes, points,
                       f"Big Two: agency vs communion, {prompt}")
    outputs.say(f"Big Two ({name}): agency vs communion, Mann-Whitney U on within-model score percentiles; "
                f"rank-biserial r > 0 means agency words score higher; word variants: {collapse} (n counts "
                f"{'tokens' if collapse == 'none' else 'words'}):", "",
                markdown(comparison[["prompt", "model", "n_agency", "n_communion", "median_rank_agency",
                                     "median_rank_communion", "rank_biserial", "p_value"]]), "")
    variants = outputs.table(f"{name}_variants", pd.concat(every.values(), ignore_index=True))
    wide = variants.pivot_table(index=["prompt", "model"], columns="collapse", values=["rank_biserial", "p_value"],
                                sort=False, dropna=False)  # a model without matched words stays, as NaN
    wide.columns = [f"{value} ({how})" for value, how in wide.columns]
    outputs.say("The same test with each word counted once per variant token (none, the papers' counting) or "
                "once per normalized word (its best variant: max; the mean of its variants: mean):", "",
                markdown(wide.reset_index()), "")
    model_meta = model_metadata.metadata_for([t.model for t in tables], metadata)
    unknown = [] if model_meta is None else stats.unknown_metadata(model_meta).get("same_base_model", [])
    if unknown:  # pooled as one family named ''
        outputs.skip(f"Big Two per base-model family: --models_yaml gives no base_model for {', '.join(unknown)}.")
    elif model_meta is not None:
        families = dict(zip(model_meta.index, model_meta["base_model"], strict=True))
        family = outputs.table(f"{name}_families",
                               bigtwo.bigtwo_family_comparison(tables, prompts, lexicon, families, collapse))
        outputs.say("Per base-model family (pooled percentiles):", "",
                    markdown(family[["prompt", "family", "n_agency", "n_communion", "rank_biserial", "p_value"]]), "")


def elo_section(outputs: Outputs, prompts: list[elo_lib.EloPrompt], top_k: int,
                tables: Sequence[data.ScoreTable] = ()) -> None:
    published = elo_lib.all_models(prompts)
    added = elo_lib.add_score_tables(prompts, tables) if tables else None
    if added is not None:
        prompts = added.prompts
    user_models = [] if added is None or added.coverage.empty else list(dict.fromkeys(added.coverage["model"]))
    models = published + user_models  # the --scores models in the order of their tables
    trained = {} if added is None else {label: elo_lib.table_training(t)  # by the label the tables give it
                                        for t, label in zip(tables, added.labels, strict=True) if label}
    agreement = outputs.table("elo_human_agreement", elo_lib.human_agreement(prompts, trained))
    in_sample = list(dict.fromkeys(agreement.model[agreement.trained_on_elo != ""]))
    outputs.headline["elo_human_agreement"] = agreement
    median_of = "models only" if not user_models else f"the {len(published)} published models only"
    for ep in prompts:
        ranks = outputs.table(f"elo_ranks_{ep.slug}", elo_lib.ranks_table(ep))
        tau = outputs.matrix(f"elo_kendall_tau_{ep.slug}", elo_lib.tau_matrix(ep))
        inside = [m for m in tau.index if m in in_sample]  # as the Spearman heatmap marks them
        names = {m: f"{m} *" for m in inside}
        marked = tau.rename(index=names, columns=names)
        outputs.figure(f"elo_kendall_tau_{ep.slug}", plots.heatmap, marked,
                       f"Kendall tau-b, humans + models:\n{ep.prompt}"
                       + ("\n(* trained on this data: partly in-sample)" if inside else ""))
        partial = [m for m in ep.models if m not in ep.user_models and not ep.scores[m].notna().all()]
        over = median_of
        if partial:  # ranked over fewer items: not comparable with the others' ranks
            outputs.say(f"{ep.prompt!r}: {', '.join(partial)} leave{'s' * (len(partial) == 1)} items unscored and "
                        "are left out of the median model rank.", "")
            over = f"the {len(published) - len(partial)} published models that score every item"
        gaps = outputs.table(f"elo_human_vs_median_model_{ep.slug}", elo_lib.human_vs_median_model(ranks, top_k))
        if len(gaps):
            outputs.figure(f"elo_human_vs_median_model_{ep.slug}", plots.diverging_bars, gaps, "name",
                           "median_model_rank_minus_human_rank",
                           f"Median model rank (over {over}) minus human rank:\n{ep.prompt}")
        elif ranks["median_model_rank"].isna().all():
            outputs.skip(f"elo_human_vs_median_model for {ep.prompt!r}: no published model scores every item.")
        else:
            outputs.say(f"{ep.prompt!r}: the median model ranks every item as humans do.", "")
        stats_of = agreement[agreement.prompt == ep.prompt].set_index("model")
        columns = ["human_rank"] + [f"{m}_rank" for m in ep.models]
        labels = ["Human"] + [f"{m}\n(rho {stats_of.spearman_rho[m]:.2f}" + (
            f", {stats_of.n_items[m]} items)" if m in ep.user_models else ")") for m in ep.models]
        outputs.figure(f"elo_rank_trajectories_{ep.slug}", plots.rank_trajectories, ranks, columns, labels,
                       elo_lib.trajectory_items(ranks, ep.models), f"Rank trajectories: {ep.prompt}")
    cross = outputs.table("elo_cross_prompt_tau", elo_lib.cross_prompt_tau(prompts))
    if len(cross):
        cross["prompts"] = cross["prompt_a"].str[:25] + " | " + cross["prompt_b"].str[:25]
        grid = cross.pivot(index="model", columns="prompts", values="kendall_tau")
        grid = grid.loc[[m for m in models if m in grid.index]]
        outputs.figure("elo_cross_prompt_tau", plots.heatmap, grid, "Each model's Kendall tau between prompts")
    grid = agreement.pivot(index="model", columns="prompt", values="spearman_rho").loc[models]
    grid.index = [f"{m} (trained on this data)" if m in in_sample else m for m in grid.index]
    outputs.figure("elo_spearman_to_human", plots.heatmap, grid, "Spearman rho with the human ranking"
                   + ("\n(models trained on this data are partly in-sample)" if in_sample else ""))
    table = agreement.pivot(index="model", columns="prompt", values="kendall_tau").loc[models]
    table.columns = [f"tau: {c}" for c in table.columns]
    if user_models:  # a --scores model may score only some items: its τ is over those, which differ by prompt
        table["n_items"] = item_counts(agreement, models)
    counted = f"{len(published)} models" if not user_models else \
        f"{len(published)} published models and {len(user_models)} from --scores ({', '.join(user_models)})"
    sizes = sorted({len(ep.items) for ep in prompts})  # the prompts' files may list different items
    items = f"{sizes[0]} items" if len(sizes) == 1 else \
        "items " + ", ".join(f"{len(ep.items)} ({ep.slug})" for ep in prompts)
    outputs.say("## EloEverything", "", f"{items}, {counted}, "
                f"{len(prompts)} prompts. Kendall tau-b (and Spearman rho in elo_human_agreement.csv) of each "
                "model with the human Elo ranking:", "", markdown(table.reset_index()), "")
    for model in in_sample:
        data_name = agreement.trained_on_elo[agreement.model == model].iloc[0]
        outputs.say(f"- **{model} was trained on EloEverything pairs** (`--elo={data_name}`): its agreement with "
                    "the human ranking is partly in-sample (training pairs come from these items' Elo scores), not "
                    "an independent comparison with the published models.")
    if in_sample:
        outputs.say("")
    spearman = agreement.pivot(index="model", columns="prompt", values="spearman_rho").loc[models]
    spearman.columns = [f"rho: {c}" for c in spearman.columns]
    outputs.say(markdown(spearman.reset_index()), "")
    if added is not None:
        _elo_scores_coverage(outputs, added)
    if len(cross):
        mean = cross.groupby("model", sort=False)["kendall_tau"].mean()
        outputs.say("Each model's mean Kendall tau between its own scores under the different prompts: "
                    + ", ".join(f"{m} {v:.3f}" for m, v in mean.items()) + ".", "")
    outputs.say(f"Items humans rank far above / below the median model (median over {median_of}) are in "
                "elo_human_vs_median_model_*.csv.", "")


def _elo_scores_coverage(outputs: Outputs, added: elo_lib.ScoresAdded) -> None:
    """The --scores models in the EloEverything tables: which column scored which prompt, and how many
    items a row of the table scores (the others are counted, and left out of that model's statistics)."""
    for note in added.notes:
        outputs.say(f"- {note}")
    if added.notes:
        outputs.say("")
    if added.coverage.empty:
        outputs.skip("EloEverything: no --scores table has a column for an EloEverything prompt (match is by "
                     "prompt text, from the .meta.json beside the table; e.g. sweep with "
                     "--prompt='humans=What is the single thing, person, or concept that humans most prefer?').")
        return
    coverage = outputs.table("elo_scores_coverage", added.coverage)
    outputs.table("elo_scores_item_tokens", added.items)
    shown = coverage.assign(prompt=coverage.prompt.str[:40])
    shown = shown[["model", "column", "prompt", "n_items", "n_scored", *elo_lib.MATCHED, *elo_lib.UNMATCHED]]
    shown = shown.loc[:, [c for c in shown.columns if c not in (*elo_lib.MATCHED, *elo_lib.UNMATCHED)
                          or shown[c].any()]]
    outputs.say("--scores models: a model scores an item when one row of its table scores the item as the whole "
                "response (sweeps: the token decoding to the item (exact), else to ' ' + the item "
                "(leading_space), among the tokens with roundtrip = 1 when the table has that column). The other "
                "items (not_a_single_token: several tokens or not in the table; not_roundtrip: a token decodes to "
                "it but a conversation tokenizes it otherwise; ambiguous: several rows decode to it; absent: not "
                "in a table of texts) have no score: that model's tau, rho and ranks are over the n_scored items "
                "(item by item in elo_scores_item_tokens.csv), and it is not part of the median model rank.", "",
                markdown(shown), "")


def implicit_section(outputs: Outputs, chosen: data.ScoreTable, reference: data.ScoreTable,
                     lexicon: bigtwo.Lexicon | None, cfg: AnalysisConfig) -> None:
    rewards = implicit_lib.implicit_reward(chosen, reference)
    named_c, named_r = implicit_labels(chosen, reference)
    outputs.skip_unshared("implicit", {f"--implicit_chosen ({named_c})": chosen.prompts,
                                       f"--implicit_reference ({named_r})": reference.prompts},
                          data.common_prompts([chosen, reference]), "the implicit reward needs both log-probs")
    values = {c: rewards[c].to_numpy() for c in rewards.columns}
    outputs.keyed_table("implicit_rm", {"text": list(rewards.index)}, values)
    top_bottom = outputs.table("implicit_rm_top_bottom", implicit_lib.implicit_top_bottom(rewards, cfg.top))
    title = f"chosen {named_c} over reference {named_r}"
    outputs.say(f"## Implicit RM: {title}", "",
                f"MWLR = 1/2 (p_c + p_r)(log p_c - log p_r), p_c = {named_c} (chosen), p_r = {named_r} "
                f"(reference): > 0 where {named_c} gives the token more probability; on {len(rewards)} shared "
                "decoded strings (max prob per duplicate string); ␣ in a token is a space.", "")
    differ = implicit_templates(chosen, reference)
    if differ:
        outputs.say(f"**Warning**: {differ}", "")
    prompts = implicit_lib.mwlr_columns(rewards)
    parts = data.file_parts(prompts, clashes=lambda slug: slug == "top_bottom" or slug.split("_")[0] == "bigtwo")
    for prompt in prompts:
        part = top_bottom[top_bottom.prompt == prompt]
        outputs.figure(f"implicit_rm_{parts[prompt]}", plots.top_bottom_bars, part, "text", "mwlr",
                       f"Implicit RM, {title}: {prompt}")
        top = ", ".join(map(markdown_code, part[part.side == "top"].text.head(10)))
        bottom = ", ".join(map(markdown_code, part[part.side == "bottom"].text.head(10)))
        outputs.say(f"- {prompt}: optimal {top}; pessimal {bottom}")
    outputs.say("")
    if lexicon is not None:
        table = implicit_lib.implicit_table(rewards, f"{named_c} over {named_r}")
        bigtwo_section(outputs, [table], lexicon, None, cfg.collapse_variants, name="implicit_rm_bigtwo")


def run_analyses(cfg: AnalysisConfig, out: str | Path = "results/analysis", *, overwrite: bool = False,
                 echo: bool = True, sections: Sequence[Callable[[Outputs], None]] = (),
                 framing_given: bool = False) -> dict:
    """Run the analyses whose inputs `cfg` gives; returns {'out', 'report', 'tables', 'figures', 'skipped',
    'headline'} (tables and figures map output names to paths). Every input is read before --out is touched;
    `sections` (read already, such as rmjax.audit.compare.AuditSection, a job above this package) write after
    the analyses of `cfg`. `framing_given`: the user named cfg.framing (refused where no table has its prompts;
    the default is skipped there, said in the report)."""
    start = time.perf_counter()
    inputs = load_inputs(cfg)
    if framing_given and inputs.scores:
        prompts = data.common_prompts(inputs.scores)
        missing = [p for p in cfg.framing if p not in prompts]
        if missing:
            raise UsageError(f"--framing={','.join(cfg.framing)}: {', '.join(map(repr, missing))} is not a prompt "
                             f"of every --scores table (they share {prompts}); name two of those, or leave --framing "
                             "out.")
    out = Path(out)
    check_writable(out, "--out", folder=True)  # a read-only --out in one line, before its lock is made beside it
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locks.hold(out, what=f"--out={out}"))  # one analysis per folder at a time
        except OSError as error:
            raise UsageError(f"--out={out}: cannot create its lock {locks.lock_path(out)} ({error.strerror or error}); "
                             "choose an --out whose parent folder is writable.") from None
        outputs = Outputs(out, overwrite)
        stack.callback(outputs.abandon)  # a refusal or failure halfway leaves the folder as it found it
        outputs.skipped.extend(inputs.skipped)
        _sections(outputs, inputs, cfg)
        for section in sections:
            section(outputs)
        if outputs.skipped:
            outputs.say("## Skipped", "", *(f"- {s}" for s in outputs.skipped), "")
        outputs.say(f"{len(outputs.tables)} tables and {len(outputs.figures)} figures written to {outputs.out} in "
                    f"{time.perf_counter() - start:.1f} s.")
        text = "# rmjax analysis report\n\n" + "\n".join(outputs.lines) + "\n"
        report_path = outputs.finish(text)
        if echo:
            print(text)
        return {"out": str(outputs.out), "report": str(report_path), "tables": outputs.tables,
                "figures": outputs.figures, "skipped": outputs.skipped, "headline": outputs.headline}


def _sections(outputs: Outputs, inputs: Inputs, cfg: AnalysisConfig) -> None:
    if cfg.roundtrip_only:
        outputs.say("Score tables restricted to tokens whose token-mode sequence a real conversation produces "
                    "(roundtrip = 1); tables of scored texts are conversations already and kept whole.", "")
    if inputs.beams:
        beams.beam_section(outputs, inputs.beams, cfg.top)
    if inputs.scores:
        paper1_analyses(outputs, inputs.scores, inputs.metadata, inputs.afinn, inputs.frequencies, cfg)
        if inputs.lexicon is not None:
            bigtwo_section(outputs, inputs.scores, inputs.lexicon, inputs.metadata, cfg.collapse_variants)
    if inputs.elo:
        elo_section(outputs, inputs.elo, cfg.top, inputs.scores)  # the --scores models beside the published
    if inputs.implicit is not None:
        implicit_section(outputs, *inputs.implicit, inputs.lexicon, cfg)
    if inputs.checkpoints:
        outputs.skip_unshared("--bigtwo_checkpoints", {t.path.name: t.prompts for _, t in inputs.checkpoints},
                              data.common_prompts([t for _, t in inputs.checkpoints]),
                              "a curve over steps needs the prompt at every step")
        frame = outputs.table("bigtwo_checkpoints",
                              bigtwo.bigtwo_checkpoints(inputs.checkpoints, inputs.lexicon,
                                                        collapse=cfg.collapse_variants))
        outputs.figure("bigtwo_checkpoints", plots.checkpoint_lines, frame)
        columns = ["step", "prompt", "median_rank_agency", "median_rank_communion", "rank_biserial"]
        outputs.say("## Big Two across checkpoints", "", markdown(frame[columns]), "")
    if inputs.disagreements:
        disagreements.section(outputs, inputs.disagreements)
