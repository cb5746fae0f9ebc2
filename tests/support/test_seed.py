"""The seed of a Python test's random choices, as tests/support/test_seed.hpp decides it for C++:
fixed (the caller's default) unless $L3_TEST_SEED says otherwise: a number replays that seed,
"random" draws a fresh one. Print the seed the test used with any failure."""
import os
import random


def test_seed(default):
    text = os.environ.get("L3_TEST_SEED", "")
    if text == "":
        return default
    if text == "random":
        return random.SystemRandom().getrandbits(64)
    if not (text.isascii() and text.isdigit()) or int(text) >= 2 ** 64:
        raise SystemExit("L3_TEST_SEED=%s: expected a number from 0 to 2^64-1, or 'random'" % text)
    return int(text)
