"""Argument types the examples share: a bad value is an argparse usage error, not a torch traceback."""

import argparse


def at_least(least: int):
    """An argparse type: an int of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse
