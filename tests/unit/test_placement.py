"""``hashq.placement``, the twin of the consistent-hash exchange's routing: erlang:phash2 of a
binary as the broker's own VM computed it (RabbitMQ 3.10.8 on OTP 25, a sample of the 1,629 keys
checked when the port was written), and the jump hash's properties. Real routing is checked
against the broker in tests/integration/test_ring.py."""

from __future__ import annotations

import collections

import pytest

from hashq.placement import bucket_of, jump_consistent_hash, phash2

# (key, erlang:phash2(Key, 4294967296)) from the VM: ASCII, UTF-8, and the tail lengths 1 to 11
# past each 12-byte block.
FROM_THE_VM = [
    (b"k0", 495067479),
    (b"k1", 2339110514),
    (b"k42", 4035630936),
    (b"k999", 840965209),
    (b"\xac", 3575438562),
    (b"A", 1312404142),
    (b"\xe7\xb3\x8b", 2591188773),
    (b"\xf0\x9f\x8f\xbe", 1627900208),
    (b"\xc5\x9f\xf0\x9f\x97\xb6", 1233275123),
    (b"\xe9\xa9\xae\xc7\x90p\xd3\xa0", 2907133975),
    (b"\xe4\xac\xfa&\xfe\xf3\xb9\xfd0\xed\x03\xb3", 1656428127),
    (b"\x00" * 40, 2640016791),
]


@pytest.mark.parametrize(("key", "expected"), FROM_THE_VM)
def test_phash2_of_a_binary_is_the_vm_s(key: bytes, expected: int) -> None:
    assert phash2(key, 1 << 32) == expected
    assert phash2(key) == expected & ((1 << 27) - 1)


def test_a_str_key_is_hashed_as_its_utf8_bytes() -> None:
    assert phash2("k42") == phash2(b"k42")
    assert phash2("Zürich") == phash2("Zürich".encode())


def test_the_jump_hash_moves_only_what_a_new_bucket_takes_and_spreads_evenly() -> None:
    keys = [f"user-{n}" for n in range(20_000)]
    before = [bucket_of(key, 16) for key in keys]
    after = [bucket_of(key, 17) for key in keys]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == 16 for _, a in moved)  # a key moves only to the new bucket
    assert 0.04 < len(moved) / len(keys) < 0.08  # about 1/17 of them
    counts = collections.Counter(before)
    assert min(counts.values()) > 0.8 * len(keys) / 16
    assert jump_consistent_hash(12345, 1) == 0
