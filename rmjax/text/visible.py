"""Tokens and responses as a reader can see them, on a figure or in Markdown: a token " " or " the" printed as is
shows nothing or loses its space (a blank tick label; Markdown trims a table cell and collapses spaces)."""

from __future__ import annotations

import functools
import re
import textwrap

SPACE = "\u2423"  # ␣ (OPEN BOX): each space at either end of a text


def visible(text: str) -> str:
    """`text` as repr writes it inside its quotes (\\n, \\t, \\x00, \\u200b, a backslash doubled), its glyphs kept
    (═, é, 中), and every space at either end as ␣ (a literal ␣ as \\u2423, so the two stay apart). An empty text is
    ''."""
    inner = repr(text)[1:-1].replace(SPACE, "\\u2423")
    core = inner.strip(" ")
    if not core:
        return SPACE * len(inner) if inner else "''"
    return SPACE * (len(inner) - len(inner.lstrip(" "))) + core + SPACE * (len(inner) - len(inner.rstrip(" ")))


def markdown_code(text: str) -> str:
    """`text` made visible, as a Markdown code span (so `*`, `_`, `<b>` in a token are not read as Markdown)."""
    shown = visible(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", shown)), default=0) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


@functools.lru_cache(maxsize=1)
def _font_glyphs() -> frozenset[int]:
    from matplotlib import font_manager, ft2font

    return frozenset(ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap())


def figure_text(text: str, cut: int | None = None) -> str:
    """`text` made visible for a matplotlib label: at most `cut` characters (… marks a cut), characters the default
    font has no glyph for (CJK, Bengali, ... with only DejaVu installed) escaped (\\u539f) rather than drawn as empty
    boxes, and `$` not read as mathtext."""
    shown = visible(text)
    if cut is not None and len(shown) > cut:
        shown = shown[: cut - 1] + "…"
    glyphs = _font_glyphs()
    shown = "".join(c if ord(c) in glyphs or c == "\n" else ascii(c)[1:-1] for c in shown)
    return shown.replace("$", r"\$")


def wrap(text: str, inches: float, fontsize: float = 12) -> str:
    """`text` broken into lines that fit `inches` at `fontsize` on a figure (a long prompt or model name in a title
    or axis label; DejaVu Sans: about 0.6 em a character), its own line breaks kept."""
    width = max(12, int(inches * 72 / (0.6 * fontsize)))
    return "\n".join("\n".join(textwrap.wrap(line, width) or [""]) for line in str(text).split("\n"))
