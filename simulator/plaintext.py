"""Names drawn by matplotlib as they are written: a ``$`` in a run, pool, node or model
name is text, never the start of TeX mathtext (which renders ``a$b$c`` as an italic ``b``,
or fails on an odd count of ``$``)."""

from __future__ import annotations

import functools


def plain_text(draw):
    """Run a figure-drawing function with ``text.parse_math`` off (every text it creates
    keeps the setting, so saving later draws it plain too)."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        import matplotlib  # noqa: PLC0415 - on use: commands without plots never load it

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)
    return drawn
