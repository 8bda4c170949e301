"""backends/c/jit_ffi.registered_token: the one token search of the XLA handler's callers
(runtime/jit_ffi.py's ef.jit kernels, runtime/jax_groups.py's fusion groups).  A token
is a salted digest of what a kernel is; a token kept for another identity, or one the
handler says is taken, moves on to the next salt; what is kept for a token stays the
value it was first given, and that is what gets registered."""

import hashlib
import threading

from einfuse.backends.c.jit_ffi import TOKEN_TRIES, registered_token


def salted(identity, salt):
    """The token of ``identity`` at ``salt``, restated: the same in every process."""
    return int.from_bytes(hashlib.sha256(repr((identity, salt)).encode()).digest()[:7],
                          "little")


class Handler:
    """A stand-in for the handler's table: register_kept records what it was given."""

    def __init__(self, taken=()):
        self.taken = set(taken)
        self.calls = []

    def __call__(self, token, kept):
        self.calls.append((token, kept))
        return token not in self.taken


IDENTITY = ("kernel.so", 4096, ("layout",), ("digest",))


def test_a_free_first_salt_is_the_token_and_the_value_is_held():
    held, handler = {}, Handler()
    value = ["constants"]
    token = registered_token(IDENTITY, value, held, threading.Lock(), handler)
    assert token == salted(IDENTITY, 0)
    assert held == {token: (IDENTITY, value)}
    assert handler.calls == [(token, value)]


def test_a_token_held_for_another_identity_moves_to_the_next_salt():
    first = salted(IDENTITY, 0)
    other = ("another kernel",)
    held, handler = {first: (other, "its arrays")}, Handler()
    token = registered_token(IDENTITY, "mine", held, threading.Lock(), handler)
    assert token == salted(IDENTITY, 1)
    # the other identity's entry is untouched, and never registered for this one
    assert held == {first: (other, "its arrays"), token: (IDENTITY, "mine")}
    assert handler.calls == [(token, "mine")]


def test_the_same_identity_gets_the_same_token_and_registers_the_value_kept_first():
    held, lock = {}, threading.Lock()
    first = registered_token(IDENTITY, "first", held, lock, Handler())
    handler = Handler()
    again = registered_token(IDENTITY, "second", held, lock, handler)
    assert again == first
    assert held == {first: (IDENTITY, "first")}
    assert handler.calls == [(first, "first")]


def test_a_token_the_handler_has_taken_moves_on_but_stays_held():
    taken = salted(IDENTITY, 0)
    held, handler = {}, Handler(taken={taken})
    token = registered_token(IDENTITY, "mine", held, threading.Lock(), handler)
    assert token == salted(IDENTITY, 1)
    assert [t for t, _ in handler.calls] == [taken, token]
    # (kept before the record was asked for: a record may point at it)
    assert held == {taken: (IDENTITY, "mine"), token: (IDENTITY, "mine")}


def test_every_salt_taken_is_none():
    tokens = {salted(IDENTITY, salt) for salt in range(TOKEN_TRIES)}
    held, handler = {}, Handler(taken=tokens)
    assert registered_token(IDENTITY, "mine", held, threading.Lock(), handler) is None
    assert len(handler.calls) == TOKEN_TRIES == 8
    assert set(held) == tokens
