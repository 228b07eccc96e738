"""A small TOML writer: tables of strings, integers, booleans and lists of strings.

Enough for a job config (TOML 1.0: basic strings with escapes, dotted table headers); the
standard library reads TOML (tomllib) but does not write it.
"""

from __future__ import annotations

from typing import Union

TomlValue = Union[str, int, bool, list[str]]


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "[" + ", ".join(toml_string(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_text(tables: dict[str, dict[str, TomlValue]], header: tuple[str, ...] = ()) -> str:
    """`tables` as TOML, one ``[name]`` per table (names may be dotted), after `header` as
    comment lines."""
    lines = [f"# {' '.join(line.split())}" if line.strip() else "#" for line in header]
    for name, entries in tables.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in entries.items()]
    return "\n".join(lines) + "\n"
