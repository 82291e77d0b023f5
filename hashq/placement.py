"""Which bucket a key lands in, without publishing: a twin of how RabbitMQ's consistent-hash
exchange routes, for ``hashq where`` (the ring of N bucket queues that hashq binds in index
order, weight 1 each, so that bucket i is the i-th binding).

The plugin (rabbitmq-server v3.10.8 ``deps/rabbitmq_consistent_hash_exchange/src/
rabbit_exchange_type_consistent_hash.erl``; the same in every 3.10 to 4.2 release read) routes a
key to ``jump_consistent_hash(erlang:phash2(Key), N)``: Lamping and Veach's jump hash, its
random numbers drawn from Erlang's ``rand`` with the ``exs1024`` algorithm seeded by the hash.
Ported here from Erlang/OTP: ``make_hash2`` of a binary (``erts/emulator/beam/utils.c``, Bob
Jenkins' lookup2 mix), ``phash2`` (``bif.c``), and ``exs1024``'s seed, step and ``uniform_s``
(``lib/stdlib/src/rand.erl``). Checked against the broker's own VM (OTP 25) for 1,629 keys of
every length 0 to 40 and 255, ASCII and UTF-8 (``tests/unit/test_placement.py`` keeps some), and
against real routing (``tests/integration/test_ring.py``). It holds only for a ring bound in
index order, which is how hashq builds and rebuilds it (``hashq.provision``).
"""

from __future__ import annotations

__all__ = ["bucket_of", "jump_consistent_hash", "phash2"]

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF

# ----------------------------------------------------------------------------- erlang:phash2

_HCONST = 0x9E3779B9  # the golden ratio; HCONST_13 = HCONST * 13 mod 2^32
_HCONST_13 = 0x08D12E65


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' lookup2 MIX(a, b, c) on unsigned 32-bit words."""
    for ra, lb, rc in ((13, 8, 13), (12, 16, 5), (3, 10, 15)):
        a = ((a - b - c) & _M32) ^ (c >> ra)
        b = ((b - c - a) & _M32) ^ ((a << lb) & _M32)
        c = ((c - a - b) & _M32) ^ (b >> rc)
    return a, b, c


def _block_hash(k: bytes, initval: int) -> int:
    """utils.c block_hash(k, length, initval)."""
    length = len(k)
    a = b = _HCONST
    c = initval & _M32
    i = 0
    n = length
    while n >= 12:
        a = (a + int.from_bytes(k[i : i + 4], "little")) & _M32
        b = (b + int.from_bytes(k[i + 4 : i + 8], "little")) & _M32
        c = (c + int.from_bytes(k[i + 8 : i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        i += 12
        n -= 12
    c = (c + length) & _M32
    # The C switch falls through from case n down to case 1; the lowest byte of c holds the
    # length, so tail bytes 8..10 go to c's bytes 1..3.
    t = k[i:]
    # (word, shift) for tail byte 0..10, as the C switch's cases 1..11 add them
    places = (
        (0, 0),
        (0, 8),
        (0, 16),
        (0, 24),
        (1, 0),
        (1, 8),
        (1, 16),
        (1, 24),
        (2, 8),
        (2, 16),
        (2, 24),
    )
    words = [a, b, c]
    for pos in range(n):
        w, shift = places[pos]
        words[w] = (words[w] + (t[pos] << shift)) & _M32
    a, b, c = words
    a, b, c = _mix(a, b, c)
    return c


def make_hash2_binary(data: bytes) -> int:
    """make_hash2() of a whole-byte binary as a top-level term (hash starts at 0)."""
    con = (_HCONST_13 + 0) & _M32
    if len(data) == 0:
        return con
    return _block_hash(data, con)


def phash2(term: bytes | str, range_: int | None = None) -> int:
    """erlang:phash2/1 (range None: 0 .. 2^27-1) or /2 (1 =< range_ =< 2^32) of a binary.

    A ``str`` is taken as the UTF-8 binary of that text (as an AMQP routing key is), not as an
    Erlang list/charlist.
    """
    data = term.encode("utf-8") if isinstance(term, str) else bytes(term)
    h = make_hash2_binary(data)
    if range_ is None:
        return h & ((1 << 27) - 1)
    if not 1 <= range_ <= 1 << 32:
        raise ValueError("range must be in 1 .. 2^32 (erlang:phash2/2 raises badarg)")
    return h if range_ == 1 << 32 else h % range_


# ----------------------------------------------------------------------------- rand, exs1024

_TWO_POW_64 = float(1 << 64)


def _exs64_next(r: int) -> tuple[int, int]:
    """rand:exs64_next/1 (xorshift64*): returns (output, new state)."""
    r1 = r ^ (r >> 12)
    r2 = r1 ^ ((r1 & ((1 << 39) - 1)) << 25)  # ?BSL(64, R1, 25)
    r3 = r2 ^ (r2 >> 27)
    return (r3 * 2685821657736338717) & _M64, r3


class _Exs1024:
    """rand's exs1024 state {L, RL} (xorshift1024*), kept as the same two Erlang lists."""

    __slots__ = ("l", "rl")

    def __init__(self, a1: int, a2: int, a3: int) -> None:
        # exs1024_seed({A1, A2, A3})
        m21 = (1 << 21) - 1
        b1 = (((a1 & m21) + 1) * 2097131) & m21
        b2 = (((a2 & m21) + 1) * 2097133) & m21
        b3 = (((a3 & m21) + 1) * 2097143) & m21
        r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
        # exs1024_gen1024: 16 outputs of xorshift64*, each prepended: the list is newest-first.
        out: list[int] = []
        for _ in range(16):
            x, r = _exs64_next(r)
            out.insert(0, x)
        self.l = out  # Erlang list L, head first
        self.rl: list[int] = []  # Erlang list RL, head first

    def next(self) -> int:
        # exs1024_next({[H], RL}) -> exs1024_next({[H | lists:reverse(RL)], []})
        if len(self.l) == 1:
            self.l = [self.l[0], *self.rl[::-1]]
            self.rl = []
        s0, s1 = self.l[0], self.l[1]
        # exs1024_calc(S0, S1)
        s11 = s1 ^ ((s1 & ((1 << 33) - 1)) << 31)  # ?BSL(64, S1, 31)
        s12 = s11 ^ (s11 >> 11)
        s01 = s0 ^ (s0 >> 30)
        ns1 = s01 ^ s12
        x = (ns1 * 1181783497276652981) & _M64
        # {[NS1 | L3], [S0 | RL]}
        self.l = [ns1, *self.l[2:]]
        self.rl.insert(0, s0)
        return x

    def uniform(self) -> float:
        # uniform_s({#{max := Max, next := Next}, R0}) -> {V / (Max + 1), ...}, Max = 2^64-1.
        # Erlang converts both operands to doubles (float(V) rounds to nearest; 2^64 is exact).
        return float(self.next()) / _TWO_POW_64


# ----------------------------------------------------------------------------- the plugin


def jump_consistent_hash(key: int, buckets: int) -> int:
    """The plugin's jump_consistent_hash/2 for an integer key (already phash2'ed)."""
    if buckets < 1:
        raise ValueError("the ring has no buckets (the plugin routes to nothing)")
    if buckets == 1:
        return 0
    state = _Exs1024(key, key, key)
    b, j = -1, 0
    while j < buckets:
        b = j
        r = state.uniform()
        if r == 0.0:  # Erlang would raise badarith here; probability ~2^-64 per draw
            raise ArithmeticError("rand:uniform_s returned 0.0; the broker's route/2 would crash")
        j = int((b + 1) / r)  # trunc/1 of a positive float
    return b


def bucket_of(key: str | bytes, buckets: int) -> int:
    """Index of the bucket queue a message with routing key ``key`` is routed to, for a ring of
    ``buckets`` queues bound in index order with weight 1 each (bucket i = i-th binding)."""
    return jump_consistent_hash(phash2(key), buckets)
