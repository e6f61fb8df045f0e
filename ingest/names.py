"""Nearest-name hints for names typed by hand: flags, columns, features, type names.

Pure (no TensorFlow, no Beam), so that the conversion and the runtime give the same hint:
`--lable` and `features=["specis"]` are answered with the name that was meant.
"""

from __future__ import annotations

import difflib

__all__ = ["nearest", "did_you_mean"]


def nearest(name, names) -> str | None:
    """The name of `names` closest to `name`: one that differs only in case first, then
    difflib's closest (similarity 0.6 at least, its default); None if none is close."""
    names = [str(n) for n in names]
    text = str(name)
    same = [n for n in names if n.casefold() == text.casefold()]
    if same:
        return same[0]
    close = difflib.get_close_matches(text, names, n=1)
    return close[0] if close else None


def did_you_mean(name, names, *, quote=repr) -> str:
    """' (did you mean 'x'?)' for the nearest name, or '' where none is close; `quote=str` for flags."""
    found = nearest(name, names)
    return "" if found is None else f" (did you mean {quote(found)}?)"
