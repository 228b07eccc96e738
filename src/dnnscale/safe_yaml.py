"""A YAML loader for untrusted files: size, depth and alias-expansion limits, string keys.

PyYAML's safe loader still lets a 500-byte file with nested aliases ("billion laughs") stand for
billions of values, composes nesting recursively (a deep file overflows Python's stack, or the C
stack with libyaml), and accepts keys of any type and repeated keys. Here the file is first read
as a flat stream of parser events (no recursion, nothing built), which checks every limit below;
only then is it built into Python objects (with libyaml when present: the depth is bounded by
then, so its recursive composer is safe).

Limits (docs/formats.md lists them):
- MAX_FILE_BYTES: the largest file read;
- MAX_DEPTH: nested mappings and lists;
- MAX_NODES: values of the document with every alias expanded (what a reader that walks the
  data will see), and MAX_ALIASES alias uses;
- mapping keys are strings, each once per mapping.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from dnnscale.errors import InputError, short_repr

MAX_FILE_BYTES = 4 * 2**20
"""4 MiB: far more than the largest workload (10,000 layers, about 0.5 MB) needs."""
MAX_DEPTH = 32
"""Nested mappings and lists (dnnscale's formats need at most 6)."""
MAX_NODES = 500_000
"""Values in a document, every alias expanded (the largest workload, 10,000 layers, has about
70,000; a file this big takes a few seconds to read)."""
MAX_ALIASES = 10_000
"""Alias uses (*name) in a document."""

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_limited(path: Path, what: str) -> str:
    """The text of the regular file `path` (UTF-8, at most MAX_FILE_BYTES); errors name `what`."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise InputError(what, f"cannot read {short_repr(str(path))}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(what, f"{short_repr(str(path))} is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(what, f"{short_repr(str(path))} is not a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise InputError(what, f"{short_repr(str(path))} is {info.st_size:,} bytes; the limit is "
                         f"{MAX_FILE_BYTES:,} bytes")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(what, f"cannot read {short_repr(str(path))}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(what, f"{short_repr(str(path))} is over the limit of "
                         f"{MAX_FILE_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(what, f"{short_repr(str(path))} is not UTF-8 text (byte {exc.start} "
                         f"is 0x{data[exc.start]:02x})") from None


def _where(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _Frame:
    """An open mapping or list while scanning events."""

    __slots__ = ("anchor", "size", "mapping", "keys", "position")

    def __init__(self, anchor: str | None, mapping: bool) -> None:
        self.anchor, self.size, self.mapping = anchor, 1, mapping
        self.keys: set[str] = set()
        self.position = 0  # items seen; in a mapping, even positions are keys


_RESOLVER = yaml.resolver.Resolver()
_TEXT, _MERGE = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"
_NOT_TEXT = object()
"""Stands for a key that is a mapping, a list or an alias: never text."""


def _scalar_key(event: Any) -> Any:
    """A scalar used as a key: its text if YAML reads it as text (or as the merge key <<), else
    a stand-in that shows it as written."""
    if event.tag in (_TEXT, "!") or (event.tag is None and event.style):
        return event.value
    if event.tag is None and _RESOLVER.resolve(yaml.ScalarNode, event.value,
                                               (True, False)) in (_TEXT, _MERGE):
        return event.value
    return _Written(f"{event.tag} {event.value}" if event.tag else event.value)


class _Written:
    """A key YAML reads as a number, bool, null or date: shown as written."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def check_events(text: str, what: str, source: str) -> None:
    """Scan `text`'s parser events and raise InputError at the first limit broken."""
    sizes: dict[str, int] = {}  # anchor -> values in its node, aliases expanded
    stack: list[_Frame] = []
    total = aliases = 0

    def item(event: Any, size: int, key: Any) -> None:
        """One more value (of `size` values expanded) in the innermost open collection."""
        nonlocal total
        total += size
        if total > MAX_NODES:
            raise InputError(what, f"{source} expands to more than {MAX_NODES:,} values "
                             f"(each alias counts in full){_where(event)}")
        if not stack:
            return
        frame = stack[-1]
        if frame.mapping and frame.position % 2 == 0:
            if not isinstance(key, str):
                shown = "a list, a mapping or an alias" if key is _NOT_TEXT else short_repr(key)
                raise InputError(what, f"{source}: mapping keys must be text, got "
                                 f"{shown}{_where(event)}")
            if key in frame.keys:
                raise InputError(what, f"{source}: key {key!r} appears twice in one "
                                 f"mapping{_where(event)}")
            frame.keys.add(key)
        frame.position += 1

    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise InputError(what, f"{source} nests deeper than {MAX_DEPTH} "
                                     f"levels{_where(event)}")
                item(event, 1, _NOT_TEXT)
                stack.append(_Frame(event.anchor, isinstance(event, yaml.MappingStartEvent)))
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                size, anchor = frame.size, frame.anchor
            elif isinstance(event, yaml.ScalarEvent):
                size, anchor = 1, event.anchor
                item(event, 1, _scalar_key(event))
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise InputError(what, f"{source} uses more than {MAX_ALIASES:,} "
                                     f"aliases{_where(event)}")
                if event.anchor not in sizes:
                    raise InputError(what, f"{source}: alias *{event.anchor} refers to no "
                                     f"finished anchor (undefined or recursive){_where(event)}")
                size, anchor = sizes[event.anchor], None
                item(event, size, _NOT_TEXT)
            else:
                continue
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1].size += size
    except yaml.YAMLError as exc:
        raise _malformed(exc, what, source) from None


def _malformed(exc: yaml.YAMLError, what: str, source: str) -> InputError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None)
    detail = f": {' '.join(str(problem).split())}" if problem else ""
    return InputError(what, f"malformed YAML in {source}{where}{detail}")


def load_yaml_text(text: str, what: str, source: str = "the file") -> Any:
    """Parse untrusted YAML within the limits above; errors name `what`."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise InputError(what, f"{source} is over the limit of {MAX_FILE_BYTES:,} bytes")
    check_events(text, what, source)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (CSafeLoader)
    except yaml.YAMLError as exc:
        raise _malformed(exc, what, source) from None
    except RecursionError:
        raise InputError(what, f"{source} nests too deeply") from None
    return data
