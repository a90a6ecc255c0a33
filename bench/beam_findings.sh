#!/bin/bash
# Issue 14 findings (BUILD_NOTES, Search: beam, GCG and exhaustive search): both default RMs, prompt greatest,
# candidate set = 500 BNC nouns (bench/nouns.py). About 45 minutes on 2 CPU cores.
set -e
cd "$(dirname "$0")/.."
R=${1:-results/findings}
W=$R/words500.txt
[ -f $W ] || .venv/bin/python bench/nouns.py $W
for m in elo-rm-smollm2-135m elo-rm-gemma3-270m; do
  mkdir -p $R/$m
  .venv/bin/python -m experiments.beam --model=$m --prompts=greatest --vocab_file=$W --depth=2 --exhaustive \
      --direction=optimal --top=250000 --show=3 --out=$R/$m/exhaustive2.csv
  .venv/bin/python -m experiments.beam --model=$m --prompts=greatest --vocab_file=$W --depth=3 --beam=64 \
      --direction=both --top=64 --show=3 --out=$R/$m/beam3.csv
  for n in 2 3; do for d in optimal pessimal; do
    .venv/bin/python -m experiments.gcg --model=$m --prompts=greatest --num_tokens=$n --steps=40 --direction=$d \
        --vocab_file=$W --noretokenize_filter --out=$R/$m/gcg_${n}_${d}.json
    .venv/bin/python -m experiments.gcg --model=$m --prompts=greatest --num_tokens=$n --steps=40 --direction=$d \
        --vocab_file=$W --noretokenize_filter --init_from=$R/$m/beam3.csv --out=$R/$m/gcg_${n}_${d}_seeded.json
  done; done
  .venv/bin/python -m experiments.inspect --model=$m --prompts=greatest --from_beam=$R/$m/exhaustive2.csv --depth=1 \
      --top=1 --steps=128 --out=$R/$m/inspect
done
