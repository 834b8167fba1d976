"""Whole numbers written in text that a user, a job or another program gave: ASCII digits only."""


def is_digits(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits. `str.isdigit` alone says yes to "²", which `int` refuses
    (a ValueError where a refusal in words, or a line skipped, was meant), and to "١٢", which `int` reads as 12."""
    return text.isascii() and text.isdigit()
