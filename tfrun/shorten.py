"""Cutting a message to a length: at a word, with … after it, so that what is left reads as cut and no word
turns into another (a download's `Name or service not known`, cut at 120 characters, read `Name or s`)."""

from __future__ import annotations


def shorten(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters; else the words of it that fit, then …. A last word that
    reaches back over half the limit (a URL, a digest, a value with no space in it) is cut inside, with …
    all the same: the limit holds whatever the text."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    if not text[limit - 1].isspace():  # the cut falls inside a word: end before that word
        before = head.rsplit(None, 1)
        if len(before) == 2 and len(before[0]) >= limit // 2:
            head = before[0]
    return head.rstrip() + "…"
