"""What a plan needs from the user's flags: the model's config (no weights), the slice, the job's shapes."""

from __future__ import annotations

from pathlib import Path

from rmjax.config import ModelConfig
from rmjax.errors import RmjaxError, UsageError
from rmjax.hf_config import load_config_file
from rmjax.loading.reward_head import SEQUENCE_CLASSIFIERS
from rmjax.model import require_reward_model
from rmjax.parallel.mesh_spec import parse_mesh_spec
from rmjax.plan.chips import Slice, parse_slice
from rmjax.plan.shapes import (
    AuditShape,
    BeamShape,
    GcgShape,
    InspectShape,
    LogprobsShape,
    ScoreShape,
    SweepShape,
    TrainShape,
)
from rmjax.text.candidates import candidate_count

DEFAULT_PREFIX_TOKENS, DEFAULT_SUFFIX_TOKENS = 64, 8  # a short chat prompt and an end-of-turn, with no tokenizer
# train_rm's conversations, by default: the prompts' prefix and this many response tokens, about what the shipped Elo
# pairs take (SmolLM2's rows pad to 34 after the prefix); a fixed 64 was no longer than a 64-token prefix: no response
DEFAULT_RESPONSE_TOKENS = 32
# The jobs each job-specific size applies to (as experiments.plan's help says): given for another job it would
# change nothing, so the plan refuses it.
JOBS_SIZED_BY = {"limit": ("sweep", "beam"), "depth": ("beam",), "beam": ("beam",), "direction": ("beam",),
                 "exhaustive": ("beam",), "num_tokens": ("gcg",), "search_width": ("gcg",),
                 "buffer_size": ("gcg",), "lm": ("beam", "gcg"), "batteries": ("audit",),
                 "steps": ("train_rm", "gcg"), "texts": ("score",),
                 "text_tokens": ("score", "inspect", "train_rm"),
                 "items": ("inspect",), "ig_steps": ("inspect",),
                 **{name: ("train_rm",) for name in ("trainable", "last_k", "fsdp", "remat", "n_train", "responses",
                                                      "sequence_tokens", "n_heldout", "heldout_responses",
                                                      "checkpoint_every")}}


def model_config(spec: str, reward: bool = True, flag: str = "--model", job: str | None = None,
                 output_column: int = 0, chosen: bool = True):
    """(config as a reward model, tokenizer or None) of a zoo hub id or nickname, a zoo backbone (e.g.
    llama-3.1-70b), a config.json, a checkpoint folder or a builtin name, reading no weights. A causal LM gets a
    one-label score head (as train_rm adds); without `reward`, a zoo backbone is its causal LM (an --lm). With a
    `job` that scores with the head (not train_rm), a checkpoint or config.json is refused as the job refuses it: a
    causal LM, or an --output_column its head lacks (a zoo backbone is a shape to size, given a one-label head)."""
    from rmjax import zoo
    from rmjax.hf_config import SUPPORTED_ARCHITECTURES, config_from_hf

    tokenizer = None
    entry = next((e for e in zoo.ZOO if spec in (e.hf_id, e.nickname)), None)
    if entry is None and spec in zoo.BACKBONES and not reward:
        raw = dict(zoo.BACKBONES[spec])
        causal = next(a for a, t in SUPPORTED_ARCHITECTURES.items() if t == raw["model_type"] and "ForCausalLM" in a)
        return config_from_hf(raw | {"architectures": [causal]}, source=spec), None
    if entry is None and spec in zoo.BACKBONES:  # a backbone's shape with a one-label score head
        entry = zoo.ZooEntry(spec, spec, spec, "score")
    if entry is not None:
        cfg = zoo.architecture_config(entry)
    elif spec.endswith(".json"):
        if not Path(spec).is_file():
            raise UsageError(f"{flag}={spec}: no such config file.")
        cfg = load_config_file(spec)
    else:
        from rmjax.loading import config_and_tokenizer

        cfg, tokenizer = config_and_tokenizer(spec)
    if reward and job not in (None, "train_rm") and not (entry is not None and entry.hf_id in zoo.BACKBONES):
        require_reward_model(cfg, spec, f"plan --job={job}", output_column, chosen)  # the job's own refusal
    if reward and not cfg.is_reward_model:
        cfg = cfg.replace(num_labels=1, architecture=SEQUENCE_CLASSIFIERS[cfg.model_type])
    return cfg, tokenizer


_CONFIG_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}  # config.json's torch_dtype names


def stored_itemsize(spec: str) -> int | None:
    """Bytes a checkpoint stores each weight element in, which each host reads whatever --dtype the run takes: a
    folder's safetensors headers (the floating dtype most of its bytes are in), else its config.json's dtype
    (torch_dtype); a GGUF file or builtin name 4 (the loader reads its conversion, dequantized to float32); None
    where nothing says (a zoo id: the run's dtype is assumed)."""
    from rmjax.hf_config import read_json_file
    from rmjax.loading.registry import BUILTIN_RMS, resolve
    from rmjax.loading.safetensors_io import checkpoint_files, float_itemsize, read_header

    try:  # where the loader reads the spec from (a zoo id downloaded, a folder holding one GGUF), as it resolves it
        kind, path = resolve(spec)
    except RmjaxError:  # a config.json, or a zoo id not downloaded: sized from the config alone
        kind, path = None, Path(spec)
    if kind == "gguf" or spec in BUILTIN_RMS:
        return 4
    if path.is_dir():
        spans: dict[str, int] = {}
        try:
            for file in checkpoint_files(path):
                for info in read_header(file)[0].values():
                    start, end = info["data_offsets"]
                    spans[info["dtype"]] = spans.get(info["dtype"], 0) + end - start
        except (RmjaxError, OSError, KeyError, TypeError, ValueError):
            spans = {}  # the job's load names what is wrong; the plan falls back on the config
        floats = {d: n for d, n in spans.items() if float_itemsize(d)}
        if floats:
            return float_itemsize(max(floats, key=floats.get))
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        raw = read_json_file(path, "model config")
        raw = raw if isinstance(raw, dict) else {}
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
        value = raw.get("torch_dtype") or raw.get("dtype") or text.get("torch_dtype") or text.get("dtype")
        return _CONFIG_ITEMSIZE.get(value) if isinstance(value, str) else None
    return None


def _prompt_sizes(tokenizer, prompts: dict[str, str], template: str, prefix_tokens: int,
                  suffix_tokens: int) -> list[tuple[str, int, int]]:
    """(prompt, prefix tokens, suffix tokens) of each prompt: measured with the model's tokenizer and template (or
    the defaults without one), each overridden by a given --prefix_tokens / --suffix_tokens."""
    from rmjax.text import chat

    if tokenizer is not None:
        splits = [chat.split_chat(tokenizer, text, template) for text in prompts.values()]
        measured = [(s.prompt, len(s.prefix), len(s.suffix)) for s in splits]
    else:
        measured = [(text, DEFAULT_PREFIX_TOKENS, DEFAULT_SUFFIX_TOKENS) for text in prompts.values()]
    return [(text, prefix_tokens or prefix, suffix if suffix_tokens < 0 else suffix_tokens)
            for text, prefix, suffix in measured]


def check_job(cfg: ModelConfig, tokenizer, job: str, sizes: list[tuple[str, int, int]], *, candidates: int,
              limit: int, batch_size: int, depth: int, beam: int, direction: str, exhaustive: bool, num_tokens: int,
              steps: int, search_width: int, text_tokens: int, buffer_size: int = 8) -> None:
    """What the job itself would refuse before its model loads, refused here before anything compiles, by the
    job's own checks (the same functions): a plan is never more permissive than its job. `sizes`: each prompt's
    (text, prefix, suffix) tokens as planned."""
    from rmjax.search import sweep
    from rmjax.text import chat

    context = cfg.max_position_embeddings
    if job in ("sweep", "beam"):
        config = None
        if job == "beam":
            from rmjax.search.beam import BeamConfig, check_candidate_set, check_enumeration

            config = BeamConfig(depth=depth, beam=beam, direction=direction, exhaustive=exhaustive)
            check_candidate_set(config, bool(limit))
        for text, prefix, suffix in sizes:
            sweep.check_room(text, prefix, suffix, context, depth if job == "beam" else 1, "--depth")
        if config is not None:
            check_enumeration(config, candidates)
        if batch_size:  # the job rounds its limit up to the data axis: the plan, not knowing it, allows the least
            sweep.check_batch_size(batch_size, candidates, None)
    elif job == "gcg":
        from rmjax.search.gcg_config import GCGConfig, check_context, check_search_width

        config = GCGConfig(num_tokens=num_tokens, steps=steps or 100, search_width=search_width,
                           eval_batch_size=batch_size or 256, buffer_size=buffer_size)
        for text, prefix, suffix in sizes:
            check_context(config, text, prefix, suffix, context)
        check_search_width(config, min(cfg.vocab_size, len(tokenizer)) if tokenizer is not None else cfg.vocab_size)
    else:  # score, inspect: each text after the prompt; logprobs: the prompt alone
        response = 0 if job == "logprobs" else text_tokens
        for text, prefix, suffix in sizes:
            chat.check_fits(text, prefix, response, suffix, context)
        if job == "inspect" and batch_size:  # every batch is padded to its size
            from rmjax.inspect.attribution import check_batch_size

            check_batch_size(batch_size)


ELO_ITEMS, ELO_TRAINING_ITEMS = 7530, 6024  # EloEverything's items, and those train_rm's split trains on (80%)


def elo_responses(trainable: str) -> int:
    """The distinct responses a train_rm run on EloEverything keeps: a head-only run's features cover the training
    and the held-out pairs (all 7,530 items); last_k keeps states for the training items (80%) alone."""
    return ELO_ITEMS if trainable == "head" else ELO_TRAINING_ITEMS


def heldout_responses(n_heldout: int) -> int:
    """The distinct responses of `n_heldout` EloEverything held-out pairs: two a pair, at most the held-out items."""
    return min(2 * n_heldout, ELO_ITEMS - ELO_TRAINING_ITEMS)


TEMPLATE_TOKENS, CHARACTERS_A_TOKEN = 16, 3  # without a tokenizer: a chat turn's markers; English runs about 4


def _audit_shape(cfg: ModelConfig, tokenizer, template: str, batteries: tuple[str, ...] | None, batch_size: int
                 ) -> AuditShape:
    """The audit's conversations (its batteries, length joining as the audit joins it), grouped as
    score_conversations groups them, measured with the model's tokenizer and template (the job's refusal of a
    conversation longer than the context included), or estimated without one (CHARACTERS_A_TOKEN)."""
    from rmjax.audit import batteries as battery_lib
    from rmjax.audit.job import AuditSpec, check_settings
    from rmjax.scoring.texts import conversation_groups
    from rmjax.text import chat

    batteries = battery_lib.BATTERIES if batteries is None else tuple(batteries)
    batch_size = batch_size or AuditSpec.batch_size  # the audit's own defaults, as its flags give them
    check_settings(batteries, AuditSpec.n_boot, AuditSpec.n_perm, AuditSpec.seed, batch_size)
    variants = [v for battery in battery_lib.build(battery_lib.with_calibration(batteries)) for v in battery.variants]
    groups = conversation_groups([v.prompt for v in variants], [v.response for v in variants])
    cached, whole, prefix, suffix = [], [], 0, 0
    for is_cached, by_prompt in zip((True, False), groups, strict=True):
        for prompt, responses in by_prompt.items():
            if tokenizer is not None:
                conversations = chat.Conversations(tokenizer, prompt, template, False, cfg.max_position_embeddings)
                lengths = [len(ids) for ids in conversations.token_ids(responses)]
                for response, n in zip(responses, lengths, strict=True):
                    chat.check_response_fits(response, n, cfg.max_position_embeddings)
                head, tail = len(conversations.prefix), len(conversations.split.suffix)
            else:
                head, tail = TEMPLATE_TOKENS + -(-len(prompt) // CHARACTERS_A_TOKEN), DEFAULT_SUFFIX_TOKENS
                lengths = [head + -(-len(r) // CHARACTERS_A_TOKEN) + tail for r in responses]
            if is_cached:
                cached.append((len(responses), max(lengths) - head - tail))
                prefix, suffix = max(prefix, head), max(suffix, tail)
            else:
                whole.extend(lengths)
    return AuditShape(len(cached), prefix, suffix, max((n for n, _ in cached), default=0),
                      max((t for _, t in cached), default=1), len(whole), max(whole, default=0), batch_size)


def _completion_lm(lm: str, model: str, tokenizer, prompts: dict[str, str], template: str,
                   prefix_tokens: int) -> tuple[ModelConfig, int]:
    """The config of a beam or GCG job's --lm, refused as the job refuses it (no LM head; both tokenizers known,
    another vocabulary than the RM's), and the longest prompt prefix it prefills: in its own tokenizer and template
    as the job's completion check renders it (another template, or a system turn, is another length), or given
    (--prefix_tokens); 0 (the RM's, in the tokenizer the job requires both share) without its tokenizer."""
    from rmjax.search.completion import require_prior_config, require_same_vocabulary

    cfg, lm_tokenizer = model_config(lm, reward=False, flag="--lm")
    require_prior_config(cfg, lm, "--lm")
    if tokenizer is not None and lm_tokenizer is not None:
        require_same_vocabulary(tokenizer, model, lm_tokenizer, lm)
    if lm_tokenizer is None:
        return cfg, 0
    return cfg, max(prefix for _, prefix, _ in _prompt_sizes(lm_tokenizer, prompts, template, prefix_tokens, -1))


def slice_and_mesh(topology: str, mesh: str = "") -> tuple[Slice, dict | None]:
    """--topology's slice and --mesh's sizes over its chips (None without --mesh), refused from the flags alone
    (plan_inputs, and the plan's check_flags where a launch reads its line)."""
    piece = parse_slice(topology)
    sizes = None
    if mesh:
        try:
            sizes = parse_mesh_spec(mesh)
        except ValueError as error:
            raise UsageError(f"--mesh={mesh}: {error}") from None
        if -1 in sizes.values():
            known = sizes["data"] * sizes["model"] * -1
            sizes = {k: (piece.chips // known if v == -1 else v) for k, v in sizes.items()}
        if sizes["data"] * sizes["model"] != piece.chips:
            raise UsageError(f"--mesh={mesh}: {sizes['data'] * sizes['model']} chips; {piece.topology} has "
                             f"{piece.chips}.")
    return piece, sizes


def plan_inputs(model: str, topology: str, job: str, *, mesh: str = "", prompts=("greatest",),
                extra_prompts=(), template: str = "auto", limit: int = 0, prefix_tokens: int = 0,
                suffix_tokens: int = -1, trainable: str = "head", last_k: int = 2, steps: int = 0,
                batch_size: int = 0, n_train: int = 20000, n_heldout: int = 4000, heldout_responses_count: int = 0,
                checkpoint_every: int = 250,
                responses: int = 0, sequence_tokens: int = 0,
                depth: int = 2, beam: int = 64, direction: str = "both", exhaustive: bool = False,
                num_tokens: int = 8, search_width: int = 128, buffer_size: int = 8, lm: str = "",
                batteries: tuple[str, ...] | None = None,
                texts_count: int = 1000,
                text_tokens: int = 8, items: int = 4, ig_steps: int = 64, output_column: int = 0,
                column_chosen: bool = True) -> tuple[ModelConfig, Slice, object, dict | None]:
    """(config, slice, job shape, mesh or None), every flag checked before anything compiles. `steps` 0: the
    job's default (train_rm 1500, gcg 100); `batch_size` 0: the plan picks (train_rm 256, gcg 256 rows);
    `responses` 0: EloEverything's (`elo_responses`); `heldout_responses_count` 0: `n_heldout` EloEverything
    pairs' (`heldout_responses`)."""
    from rmjax.text.prompts import resolve_prompts

    piece, sizes = slice_and_mesh(topology, mesh)
    cfg, tokenizer = model_config(model, reward=job != "logprobs", job=job, output_column=output_column,
                                  chosen=column_chosen)
    if job == "train_rm":
        from rmjax.train.settings import TrainConfig, check_batch_size

        batch = batch_size or 256
        TrainConfig(trainable=trainable, last_k=last_k, steps=steps or 1500, batch_size=batch,
                    checkpoint_every=checkpoint_every)  # the job's checks
        check_batch_size(batch, n_train)
        if trainable == "last_k" and last_k > cfg.num_layers:
            raise UsageError(f"--last_k={last_k}: the model has {cfg.num_layers} layers.")
        suffix = 0
        # a head-only run's feature pass, and the others' steps: each prompt's prefix through the layers once
        measured = _prompt_sizes(tokenizer, resolve_prompts(list(prompts), list(extra_prompts)), template,
                                 prefix_tokens, suffix_tokens)
        prompts_planned, prefix = len(measured), max(p for _, p, _ in measured)
        given = sequence_tokens
        sequence_tokens = sequence_tokens or prefix + DEFAULT_RESPONSE_TOKENS
        if trainable != "head" and sequence_tokens > cfg.max_position_embeddings:
            what = "" if given else f" (the prompts' {prefix}-token prefix, {DEFAULT_RESPONSE_TOKENS} response tokens)"
            raise UsageError(f"--sequence_tokens={sequence_tokens}{what} is more than the model's context of "
                             f"{cfg.max_position_embeddings} positions (max_position_embeddings).")
        if trainable == "head":
            from rmjax.text import chat

            suffix = max(s for _, _, s in measured)
            for text, head, tail in measured:
                chat.check_fits(text, head, text_tokens, tail, cfg.max_position_embeddings)
        return cfg, piece, TrainShape(trainable, last_k, steps or 1500, batch, n_train,
                                      responses or elo_responses(trainable),
                                      sequence_tokens, prompts=prompts_planned, prefix_tokens=prefix,
                                      text_tokens=text_tokens, suffix_tokens=suffix, heldout_pairs=n_heldout,
                                      heldout_responses=heldout_responses_count or heldout_responses(n_heldout),
                                      checkpoint_every=checkpoint_every), sizes
    if job == "audit":
        return cfg, piece, _audit_shape(cfg, tokenizer, template, batteries, batch_size), sizes
    texts = resolve_prompts(list(prompts), list(extra_prompts))
    per_prompt = _prompt_sizes(tokenizer, texts, template, prefix_tokens, suffix_tokens)
    prefix = max(p for _, p, _ in per_prompt)
    suffix = max(s for _, _, s in per_prompt)
    candidates = candidate_count(cfg, tokenizer, None, limit or None)  # a --limit keeping all is the job's refusal
    check_job(cfg, tokenizer, job, per_prompt, candidates=candidates, limit=limit, batch_size=batch_size, depth=depth,
              beam=beam, direction=direction, exhaustive=exhaustive, num_tokens=num_tokens, steps=steps,
              search_width=search_width, text_tokens=text_tokens, buffer_size=buffer_size)
    if job == "logprobs":
        if cfg.is_reward_model:
            raise UsageError(f"--model={model}: logprobs needs a causal LM (an LM head); this is a reward model.")
        return cfg, piece, LogprobsShape(len(texts), prefix), sizes
    if job == "inspect":
        return cfg, piece, InspectShape(items, prefix + text_tokens + suffix, ig_steps, batch_size or 16), sizes
    if job == "score":
        return cfg, piece, ScoreShape(len(texts), prefix, suffix, texts_count, text_tokens, batch_size or 256), sizes
    lm_cfg, lm_prefix = _completion_lm(lm, model, tokenizer, texts, template, prefix_tokens) if lm else (None, 0)
    if job == "gcg":
        return cfg, piece, GcgShape(len(texts), prefix, suffix, num_tokens, steps or 100, search_width,
                                    batch_size or 256, buffer_size, lm_cfg, lm_prefix), sizes
    if job == "beam":
        return cfg, piece, BeamShape(len(texts), prefix, suffix, candidates, depth, beam, direction,
                                     exhaustive, lm_cfg, lm_prefix), sizes
    return cfg, piece, SweepShape(len(texts), prefix, suffix, candidates), sizes
