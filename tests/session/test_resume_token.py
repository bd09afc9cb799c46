"""The resume token: hashed, bound to the key, single use, one retry until proven."""

from __future__ import annotations

from duplex_actors.session.resume_token import ResumeCredential, fingerprint

KEY = fingerprint("sk-1")


def test_a_token_is_256_bits_kept_only_as_a_hash_and_bound_to_its_key() -> None:
    credential = ResumeCredential(KEY)
    token = credential.issue()
    assert len(token) >= 43  # token_urlsafe(32): 256 bits
    assert token not in repr(credential) and token not in repr(
        vars(credential) if hasattr(credential, "__dict__") else ""
    )
    assert credential.matches(token, KEY)
    assert not credential.matches(token, fingerprint("sk-2"))
    assert not credential.matches(token + "x", KEY)


def test_each_resume_rotates_and_the_previous_token_retries_once_until_proven() -> None:
    credential = ResumeCredential(KEY)
    first = credential.issue()
    second = credential.consume(first)
    assert credential.matches(second, KEY) and credential.matches(first, KEY)  # the retry
    third = credential.consume(first)  # session.resumed with `second` was lost
    assert not credential.matches(first, KEY) and not credential.matches(second, KEY)
    assert credential.matches(third, KEY)
    fourth = credential.consume(third)
    credential.proven()  # the client acked on the new connection
    assert not credential.matches(third, KEY) and credential.matches(fourth, KEY)
