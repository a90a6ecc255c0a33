"""Planted-bias recovery (issue 46, part 3): does the disagreement finder recover word preferences planted in a
reward model, without being told the words?

python bench/planted_biases.py --out=DIR [--words=w1,...,w9] [--seed=S] [--stage=train|all]

Trains PLANTED (EloEverything pairs + synthetic pairs planting 3 liked, 3 disliked and 3 framed words) and CLEAN
(the same Elo pairs, in PLANTED's batch sequence with the synthetic pairs weightless; --no-matched: its own batches)
from SmolLM2-135M-Instruct with train_rm's recipe, the last 4 layers and head trainable for 160 steps, the framed words
with 3x the pairs (rmjax.train.planted: 2 layers, 80 steps and 1x planted no framing), checks each
planted word's z among the control words under both RMs, then (--stage=all) runs the disagreement job PLANTED vs
CLEAN after the Elo and the framing prompts and counts the planted words its rows recover. Writes DIR/planted.json
(planted, trained_check, found, recovered, n_recovered, n_recovered_by_string, seconds per stage);
DIR/<planted|clean>/hf are the two RMs (model specs for any rmjax job), DIR/disagree the job's output; beside the
seconds, the day's f32 matmul rate (matmul_gflops), since the 2-core machine's speed moves from day to day.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import sweep_vs_reference  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="Output folder.")
    ap.add_argument("--words", default=None, help="Plant these 9 words (liked x3, disliked x3, framed x3, in that "
                    "order) instead of drawing them.")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the words, controls, pairs, head and batches.")
    ap.add_argument("--stage", choices=("train", "all"), default="all", help="train: train and check only.")
    ap.add_argument("--lm", default=None, help="Base LM (default: train_rm's, smollm2-135m-instruct).")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--learning_rate", type=float, default=5e-4)
    ap.add_argument("--last_k", type=int, default=4, help="Trained layers below the head: 4 let the framed words "
                    "separate the two prompts (2 did not).")
    ap.add_argument("--n_elo", type=int, default=1200, help="Elo training pairs sampled (before long items go).")
    ap.add_argument("--per_prompt", type=int, default=30, help="Synthetic pairs per planted word and prompt.")
    ap.add_argument("--framed_factor", type=int, default=3, help="Framed words get this many times --per_prompt pairs "
                    "(half of them ties after the Elo prompt).")
    ap.add_argument("--framed_elsewhere", choices=("tie", "loses"), default="tie",
                    help="A framed word after the Elo prompt: loses to the control, or ties with it.")
    ap.add_argument("--matched", action=argparse.BooleanOptionalAction, default=True,
                    help="CLEAN trains on PLANTED's batch sequence, the synthetic pairs weightless (equal sides), so "
                    "the two RMs differ by the planted pairs' gradient alone (--no-matched: CLEAN draws its own "
                    "batches from the Elo pairs).")
    ap.add_argument("--forwards", type=int, default=400, help="The disagreement search's forwards budget.")
    ap.add_argument("--num_tokens", type=int, default=4, help="The disagreement search's response length.")
    ap.add_argument("--map_top", type=int, default=10, help="Vocabulary-map words counted at each end, per "
                    "prompt, and at each end of its shifts from the other prompt (the first spelling of each, up to "
                    "case and edge space; n_recovered_by_string counts strings).")
    ap.add_argument("--search", action=argparse.BooleanOptionalAction, default=True,
                    help="Run the disagreement search (--no-search: the vocabulary map only).")
    ap.add_argument("--overwrite", action="store_true")
    return ap.parse_args()


def main() -> int:
    args = parse()
    from experiments.common import DEFAULT_LM
    from rmjax.errors import RmjaxError
    from rmjax.loading import config_and_tokenizer, load
    from rmjax.runs.results import dump_json
    from rmjax.train import planted as P
    from rmjax.train import planted_find as F

    start, seconds = time.perf_counter(), {}
    out = Path(args.out)
    lm = args.lm or DEFAULT_LM
    try:
        tokenizer = config_and_tokenizer(lm)[1]
        words = P.draw_words(tokenizer, args.seed,
                             words=args.words.split(",") if args.words is not None else None)
        seconds["draw"] = time.perf_counter() - start
        cfg = P.bench_config(args.seed, args.steps, args.batch_size, args.learning_rate, args.last_k)
        trained = P.train_planted_and_clean(out, lm, words, cfg, n_elo=args.n_elo, per_prompt=args.per_prompt,
                                            framed_factor=args.framed_factor, framed_elsewhere=args.framed_elsewhere,
                                            matched=args.matched, overwrite=args.overwrite,
                                            log=lambda m: print(m, file=sys.stderr))
        seconds.update(trained.seconds)
        out.mkdir(parents=True, exist_ok=True)
        trained.pairs.to_frame().to_csv(out / "synthetic_pairs.csv", index=False)
        t = time.perf_counter()
        models = {name: load(str(path)) for name, path in (("planted", trained.planted), ("clean", trained.clean))}
        check = {name: P.word_margins(model, words) for name, model in models.items()}
        texts = F.pool_texts(words, P.candidate_words(tokenizer))
        # the whole command reads the candidates' rewards from the map it computes anyway
        rewards = F.pool_rewards(models["planted"], models["clean"], words, texts) if args.stage == "train" else None
        del models
        seconds["check"] = time.perf_counter() - t
        report = {"seed": args.seed, "planted": words.to_json(), "controls": list(words.controls),
                  "framing_prompt": words.framing_prompt, "elo_prompt": words.elo_prompt,
                  "models": {"planted": str(trained.planted), "clean": str(trained.clean)},
                  "settings": {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")},
                  "training": {n: {k: s.get(k) for k in ("final", "elo", "train_pairs", "seconds", "written_at")}
                               for n, s in trained.summaries.items()},
                  "trained_check": check}
        if args.stage == "all":
            t = time.perf_counter()
            folder = F.find_disagreements(out / "disagree", trained.planted, trained.clean, words,
                                          forwards=args.forwards, num_tokens=args.num_tokens, map_top=args.map_top,
                                          search=args.search, overwrite=args.overwrite)
            seconds["find"] = time.perf_counter() - t
            found = F.found_rows(folder, args.map_top, by_word=True)
            recovered = F.recovered_words(words, found)
            by_string = F.recovered_words(words, F.found_rows(folder, args.map_top))
            report.update(found=found, recovered=recovered, n_recovered=len(recovered),
                          recovered_by_string=sorted(by_string), n_recovered_by_string=len(by_string))
            t = time.perf_counter()
            rewards = F.pool_rewards_from_map(folder, texts)
            if rewards is None:  # a candidate the map does not hold: score them all
                rewards = F.pool_rewards(load(str(trained.planted)), load(str(trained.clean)), words, texts)
            seconds["check"] += time.perf_counter() - t
        report["pool_gaps"] = F.pool_gaps(words, texts, rewards)
    except RmjaxError as error:
        print(f"planted_biases: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    seconds["total"] = time.perf_counter() - start
    report["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    # the goal is minutes on 2 cores, whose speed moves from day to day (BUILD_NOTES): the day's matmul beside it
    report["matmul_gflops"] = round(sweep_vs_reference.jax_matmul_peak(), 1)
    dump_json(report, out / "planted.json")
    _summary(report, words)
    return 0


def _summary(report: dict, words) -> None:
    check = report["trained_check"]
    print(f"planted (seed {report['seed']}; framing prompt {words.framing_prompt!r}):")
    for word, kind in words.kinds.items():
        z = {f"{m}/{p}": check[m][p][word] for m in check for p in check[m]}
        found = "recovered" if word in report.get("recovered", {}) else ("not recovered" if "recovered" in report
                                                                        else "")
        ranks = ", ".join(f"{p} {g[word]['rank']}" for p, g in report["pool_gaps"].items())
        print(f"  {kind:8s} {word:14s} z among controls: " + ", ".join(f"{k} {v:+.2f}" for k, v in z.items())
              + f"; gap rank: {ranks}  {found}")
    for name, t in report["training"].items():
        acc = (t.get("final") or {}).get("heldout_accuracy")
        elo = (t.get("elo") or {}).get("heldout_accuracy_vs_elo_order")
        print(f"  {name}: held-out accuracy {acc}, agreement with Elo order {elo}")
    n = {p: sum(g["rank"] <= 10 for g in gaps.values()) for p, gaps in report["pool_gaps"].items()}
    print("planted words among the 10 candidate words moved most their way (PLANTED vs CLEAN, one-token responses): "
          + ", ".join(f"{p} {k}" for p, k in n.items()))
    if "n_recovered" in report:
        print(f"recovered {report['n_recovered']} of {len(words.kinds)} planted words (the map's "
              f"{report['settings']['map_top']} distinct words at each end and of its shifts; "
              f"{report['n_recovered_by_string']} counting its strings)")
    print("seconds: " + ", ".join(f"{k} {v}" for k, v in report["seconds"].items())
          + f"; this machine's f32 2048² matmul today: {report['matmul_gflops']} GFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
