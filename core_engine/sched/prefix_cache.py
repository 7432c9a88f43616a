"""Block-level prefix caching: which full KV blocks hold which tokens, so a request that starts with
tokens another one already computed reuses that KV instead of computing it again (vLLM's automatic
prefix caching).

A full block's key is sha256 over its parent block's digest and its own token ids (packed as 8-byte
integers): the same tokens after the same prefix give the same key, and a key names its whole prefix,
not only its own tokens. sha256 is what vLLM trusts for the same job; no collision of it is known, so
a hit serves KV computed for exactly these tokens. Keys never leave the process, so native byte order
is fine. Imports no torch, so it tests anywhere.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT_DIGEST = b""  # the parent of a sequence's first block


def block_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block holding `tokens` after the prefix whose last block's key is `parent`."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def extend_digests(digests: list[bytes], token_ids: Sequence[int], block_size: int, num_tokens: int) -> None:
    """Append the keys of the full blocks among the first num_tokens tokens that have none yet."""
    for i in range(len(digests), num_tokens // block_size):
        parent = digests[i - 1] if i else ROOT_DIGEST
        digests.append(block_digest(parent, token_ids[i * block_size:(i + 1) * block_size]))


class PrefixIndex:
    """Key -> block and block -> key for the full blocks whose KV is known, in use or free.

    One block per key: a second block computed with the same tokens (the last block of a prompt that
    is recomputed so the step can sample) stays unkeyed, and goes back to plain free when released.
    A block keeps its key while free, until the allocator hands it out again (eviction).
    """

    def __init__(self, num_blocks: int) -> None:
        self._block_of: dict[bytes, int] = {}
        self._digest: list[bytes | None] = [None] * num_blocks

    def clear(self) -> None:
        self._block_of.clear()
        self._digest = [None] * len(self._digest)

    def __len__(self) -> int:
        return len(self._block_of)

    def digest_of(self, block: int) -> bytes | None:
        return self._digest[block]

    def register(self, block: int, digest: bytes) -> bool:
        """Key `block` by `digest`; False (and nothing changes) when it has a key or another block has
        this one."""
        if self._digest[block] is not None or digest in self._block_of:
            return False
        self._digest[block] = digest
        self._block_of[digest] = block
        return True

    def forget(self, block: int) -> bool:
        """The block is being reused for other tokens: drop its key. True if it had one."""
        digest = self._digest[block]
        if digest is None:
            return False
        self._digest[block] = None
        del self._block_of[digest]
        return True

    def longest_prefix(self, digests: Sequence[bytes], max_blocks: int) -> list[int]:
        """The blocks of the longest run of leading keys that are cached, at most max_blocks of them."""
        out: list[int] = []
        for digest in digests[:max_blocks]:
            block = self._block_of.get(digest)
            if block is None:
                break
            out.append(block)
        return out

    def check_invariants(self) -> None:
        """Both maps agree: a key names one block, and that block carries that key."""
        for digest, block in self._block_of.items():
            assert self._digest[block] == digest, f"key of block {block} disagrees with the index"
        assert sum(d is not None for d in self._digest) == len(self._block_of), "a keyed block is not indexed"
