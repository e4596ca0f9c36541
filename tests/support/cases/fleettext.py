"""Pieces of fleet file text (protocol §9): a backend table, a TOML value."""

from __future__ import annotations


def backend(url: str, name: str | None = None) -> str:
    """One ``[[backend]]`` table of the llama.cpp facade."""
    named = f'name = "{name}"\n' if name else ""
    return f'[[backend]]\nengine = "llamacpp"\nurl = "{url}"\n{named}'


def tomlValue(value: object) -> str:
    """``value`` (a bool, an integer, a string or a list of them) written as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert isinstance(value, list)
    return "[" + ", ".join(tomlValue(v) for v in value) + "]"
