"""A regular expression whose leftmost match is the longest vocab token at that position.

Every trie node becomes an alternation over its children, with an empty alternative last
when the node itself is a token, e.g. tokens ``a, ab, abc, b`` give ``(?:a(?:b(?:c|)|)|b)``.
Children start with distinct bytes, so at most one alternative can match and backtracking
returns to the deepest token node on the walked path: a leftmost-first (Perl-style)
engine yields exactly the greedy longest-match tokens. Python's ``re``, Oniguruma (the
Hugging Face ``tokenizers`` crate), ICU and JavaScript ``RegExp`` all alternate that way.

The engine tries alternatives one after another, so their order matters for speed (never
for the result): children that are tokens with nothing below them are merged into one
character class tried first (one bitmap test), then the other children by subtree size, a
rough proxy for how often a byte comes next.

One generator serves two alphabets: the World tokenizer matches raw bytes (each byte a
latin-1 character of the pattern), the Hugging Face ``tokenizer.json`` matches the
byte-level characters of GPT-2's byte-to-unicode map. ``atom(byte, in_class)`` spells one
byte, escaped for where it stands.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

Atom = Callable[[int, bool], str]


def trie_regex(tokens: Iterable[bytes], atom: Atom) -> str:
    """Regex source (no fallback alternative) matching the longest token at a position."""
    toks = sorted(tokens)
    out: list[str] = []

    def byte_class(values: list[int]) -> str:
        if len(values) == 1:
            return atom(values[0], False)
        return "[" + "".join(atom(b, True) for b in sorted(values)) + "]"

    def node(lo: int, hi: int, depth: int) -> None:
        # toks[lo:hi] share the prefix toks[lo][:depth], already matched; emit the rest.
        while True:
            if len(toks[lo]) > depth:
                # A run of bytes all of toks[lo:hi] share is a plain chain: emitted at once, not
                # byte by byte (each step slices a prefix, so one long token was quadratic).
                # A lone token's last byte is a leaf, which the steps below spell.
                end = len(toks[lo]) - 1 if hi - lo == 1 else _common_prefix(toks[lo], toks[hi - 1], depth)
                if end > depth:
                    out.extend(atom(b, False) for b in toks[lo][depth:end])
                    depth = end
            terminal = len(toks[lo]) == depth  # sorted: the prefix itself comes first
            start = lo + 1 if terminal else lo
            branches: list[tuple[int, int, int, int]] = []  # (-size, byte, lo, hi)
            leaves: list[int] = []  # children that are tokens with nothing below
            i = start
            while i < hi:
                byte = toks[i][depth]
                j = hi if byte == 255 else bisect.bisect_left(toks, toks[i][:depth] + bytes((byte + 1,)), i, hi)
                if j - i == 1 and len(toks[i]) == depth + 1:
                    leaves.append(byte)
                else:
                    branches.append((i - j, byte, i, j))
                i = j
            if not branches and not leaves:
                return
            if not terminal and not leaves and len(branches) == 1:
                # A plain chain of bytes: no group and no recursion, so long tokens do not nest.
                _, byte, lo, hi = branches[0]
                out.append(atom(byte, False))
                depth += 1
                continue
            break
        if terminal and not branches:
            out.append(byte_class(leaves) + "?")
            return
        out.append("(?:")
        if leaves:
            out.append(byte_class(leaves))
        for k, (_, byte, i, j) in enumerate(sorted(branches)):
            if k or leaves:
                out.append("|")
            out.append(atom(byte, False))
            node(i, j, depth + 1)
        out.append("|)" if terminal else ")")

    if toks:
        node(0, len(toks), 0)
    return "".join(out)


def _common_prefix(a: bytes, b: bytes, start: int) -> int:
    """Length of the common prefix of `a` and `b`, known to be at least `start`: a binary
    search over slice comparisons (done in C), O(n log n) in the worst case, not O(n^2)."""
    lo, hi = start, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
