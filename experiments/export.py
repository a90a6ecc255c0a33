"""Write any loadable model (a builtin name, a checkpoint folder, a .gguf file) as a Hugging Face folder:
config.json, model.safetensors, tokenizer files, and rmjax_export.json (what was exported, when). A reward model's
loads with transformers' AutoModelForSequenceClassification, a causal LM's with AutoModelForCausalLM (it has no
score head: a sequence-classification load adds a random one, which transformers reports as missing).

python -m experiments.export --model=elo-rm-smollm2-135m --out=results/export/elo-rm-smollm2-135m

A folder of another model is refused unless --overwrite; the same model's finished export is kept.
"""

from __future__ import annotations

from absl import flags

from experiments import common
from rmjax.errors import UsageError

OUT = flags.DEFINE_string("out", None, "Folder to write (config.json, model.safetensors, tokenizer files, "
                          "rmjax_export.json).")
flags.mark_flag_as_required("out")

for _name in ("model", "dtype", "mesh", "coordinator", "num_processes", "process_id", "overwrite", "compile_cache"):
    flags.declare_key_flag(_name)


def check_flags() -> None:
    """What the job refuses from its flags alone: first thing in main, and where a launch reads its line."""
    common.check_out(OUT.value)
    if common.OUTPUT_COLUMN.present:  # a given --output_column is a mistake, not something to ignore
        raise UsageError(f"--output_column={common.OUTPUT_COLUMN.value}: export writes the whole model, every "
                         "output of its reward head; leave --output_column out.")
    common.refuse_system_prompt("export", "writes the tokenizer's own chat template, which sets the system turn")
    common.refuse_given("export", ("prompts", "prompt", "template", "allow_nonfinite"),
                        "writes the model as it is and scores nothing")


def main(argv):
    del argv
    from rmjax.loading.export import run_export
    from rmjax.parallel import distributed

    check_flags()
    folder = run_export(common.options(OUT.value))
    if distributed.is_main():
        print(f"Hugging Face folder: {folder}")


if __name__ == "__main__":
    common.run(main)
