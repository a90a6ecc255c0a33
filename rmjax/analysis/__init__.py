"""Analyses of score tables (paper 1, EloEverything, paper 2), run by `python -m experiments.analyze`.

Modules: `data` (loading, model metadata, alignment by decoded string), `stats` (pure statistics),
`lexicons` (AFINN-111, BNC frequencies, Big Two stems), `paper1`, `elo`, `bigtwo`, `implicit`
(the analyses, each returning tables), `plots` (matplotlib figures) and `report` (`run_analyses`,
which writes every table, figure and the text report).
"""
