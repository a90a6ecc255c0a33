"""YAML input files read strictly: a key given twice is an error, not the last value silently kept.

PyYAML's safe_load keeps the last of two equal keys, so a prompt file or model list edited by hand
could lose an entry with no sign. Every YAML file rmjax reads goes through `load`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rmjax.errors import MissingFileError, UsageError

MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a repeated key (merge keys `<<:` keep their YAML meaning)."""

    path: str = "<yaml>"
    keys_as_written: bool = False

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            if self.keys_as_written:  # names: `007:` is "007", not 7; `yes:` is "yes", not True
                for key_node, _ in node.value:
                    if isinstance(key_node, yaml.ScalarNode) and key_node.tag != MERGE_TAG:
                        key_node.tag = STR_TAG
            seen: dict[Any, tuple[Any, int]] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # the base class reports an unhashable key
                line = key_node.start_mark.line + 1
                if key in seen:
                    first, first_line = seen[key]
                    where = f"line {line}" if line == first_line else f"lines {first_line} and {line}"
                    same = f"key {key!r}" if repr(first) == repr(key) else f"key {first!r} (also as {key!r})"
                    raise UsageError(f"{self.path}: {same} is given twice ({where}); YAML would keep only the last "
                                     "value. Remove or rename one of them.")
                seen[key] = (key, line)
        return super().construct_mapping(node, deep=deep)


def loads(text: str, path: str | Path = "<yaml>", keys_as_written: bool = False) -> Any:
    """The YAML document in `text` (from `path`, named in errors); a repeated mapping key is a UsageError.
    With `keys_as_written`, every plain mapping key is the string written (for keys that are names)."""
    loader = _StrictLoader(text)
    loader.path, loader.keys_as_written = str(path), keys_as_written
    try:
        node = loader.get_single_node()
        _refuse_expansion(node, path)
        return None if node is None else loader.construct_document(node)
    except RecursionError:
        raise UsageError(f"{path}: invalid YAML (values nested too deeply to read).") from None
    finally:
        loader.dispose()


MAX_NODES = 1_000_000  # values a document may stand for once its aliases are expanded (rmjax's files hold hundreds)


def _refuse_expansion(root: yaml.Node | None, path: str | Path) -> None:
    """Refuse a document whose aliases expand past MAX_NODES values (a "billion laughs": a few lines that stand for
    9^9 strings, which printing or hashing the value would spell out) or refer to themselves."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, open_: set[int]) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise UsageError(f"{path}: invalid YAML (an alias refers to the value that contains it).")
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) \
            else node.value if isinstance(node, yaml.SequenceNode) else []
        open_.add(id(node))
        total = 1 + sum(size(child, open_) for child in children)
        open_.discard(id(node))
        if total > MAX_NODES:
            raise UsageError(f"{path}: its aliases (*name) expand to more than {MAX_NODES:,} values; write the "
                             "values out.")
        sizes[id(node)] = total
        return total

    if root is not None:
        size(root, set())


def load(path: str | Path, error: type[Exception] = UsageError, keys_as_written: bool = False) -> Any:
    """The YAML document of file `path`: unreadable or invalid YAML is `error` naming the file, a repeated key a
    UsageError naming the file, the key and its lines."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{path} not found.") from None
    except OSError as problem:
        raise error(f"{path}: cannot read it ({problem.strerror or problem}).") from None
    except UnicodeDecodeError as problem:
        raise error(f"{path}: invalid YAML (not UTF-8 text: {problem.reason} at byte {problem.start}).") from None
    try:
        return loads(text, path, keys_as_written)
    except yaml.YAMLError as problem:
        raise error(f"{path}: invalid YAML ({' '.join(str(problem).split())}).") from None

