"""Persistent, preallocated step inputs: one host staging buffer, one host-to-device copy per step.

Everything a forward needs from the host (token ids, positions, slot mapping, logits rows, context
lengths, prefill block tables, sampling parameters, and the decode block-table rows that changed) is
written into one int64 staging tensor (pinned on CUDA) through a numpy view - no torch.tensor(list)
per step - and copied to the device in one transfer. Decode block tables live on the device in a
persistent table, one row per decode row; a step sends only the rows whose table changed (a new
block, a new sequence in that row), about one row in `block_size` steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence as Seq

import numpy as np
import torch


class StagedInputs:
    """A growable int64 host buffer mirrored on the device; regions are (offset, length) pairs."""

    def __init__(self, device: torch.device, capacity: int = 4096) -> None:
        self.device = device
        self._pin = device.type == "cuda"
        self._alloc(capacity)
        self.cursor = 0

    def _alloc(self, capacity: int) -> None:
        host = torch.zeros(capacity, dtype=torch.long, pin_memory=self._pin)
        if getattr(self, "cursor", 0):
            host[:self.cursor] = self.host[:self.cursor]
        self.host = host
        self.np = host.numpy()
        self.np_f64 = self.np.view(np.float64)
        self.dev = host if self.device.type == "cpu" else torch.zeros(capacity, dtype=torch.long, device=self.device)

    def begin(self) -> None:
        self.cursor = 0

    def _reserve(self, n: int) -> int:
        start = self.cursor
        if start + n > self.np.shape[0]:
            self._alloc(max(2 * self.np.shape[0], start + n))
        self.cursor = start + n
        return start

    def put(self, values: Seq[int] | np.ndarray) -> tuple[int, int]:
        start = self._reserve(len(values))
        self.np[start:self.cursor] = values
        return start, len(values)

    def put_floats(self, values: Seq[float]) -> tuple[int, int]:
        start = self._reserve(len(values))
        self.np_f64[start:self.cursor] = values
        return start, len(values)

    def put_rows(self, rows: Iterable[Seq[int]], width: int, fill: int) -> tuple[int, int]:
        """Lists of ints as rows of `width`, padded with `fill`; returns the region of all of them."""
        rows = list(rows)
        start = self._reserve(len(rows) * width)
        block = self.np[start:self.cursor].reshape(len(rows), width)
        block.fill(fill)
        for r, values in enumerate(rows):
            block[r, :len(values)] = values
        return start, len(rows) * width

    def commit(self) -> None:
        """The one host-to-device copy of this step (asynchronous from pinned memory on CUDA: the
        step's one device-to-host read, the sampled tokens, orders it before the next step writes)."""
        if self.dev is not self.host and self.cursor:
            self.dev[:self.cursor].copy_(self.host[:self.cursor], non_blocking=True)

    def view(self, region: tuple[int, int]) -> torch.Tensor:
        start, n = region
        return self.dev[start:start + n]

    def view_f32(self, region: tuple[int, int]) -> torch.Tensor:
        return self.view(region).view(torch.float64).to(torch.float32)


class DecodeTables:
    """Decode block tables on the device, one persistent row per decode row, rewritten only on change
    (on the CPU kernel's path the step's prompt-chunk sequences take the rows after them)."""

    def __init__(self, device: torch.device, rows: int, width: int, fill: int) -> None:
        self.device, self.width, self.fill = device, width, fill
        self.table = torch.full((rows, width), fill, dtype=torch.long, device=device)
        self._known: list[list[int] | None] = [None] * rows

    def stage_changes(self, staged: StagedInputs, tables: list[list[int]]) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """Write the rows whose table differs from what the device holds; None when none changed."""
        if len(tables) > len(self._known):
            grown = torch.full((max(len(tables), 2 * len(self._known)), self.width), self.fill,
                               dtype=torch.long, device=self.device)
            grown[:self.table.shape[0]] = self.table
            self.table = grown
            self._known += [None] * (grown.shape[0] - len(self._known))
        changed = [r for r, t in enumerate(tables) if self._known[r] != t]
        if not changed:
            return None
        for r in changed:
            self._known[r] = list(tables[r])
        return staged.put(changed), staged.put_rows((tables[r] for r in changed), self.width, self.fill)

    def apply(self, staged: StagedInputs, change: tuple[tuple[int, int], tuple[int, int]] | None) -> None:
        """After the staged copy: scatter the changed rows into the persistent table (on the device)."""
        if change is not None:
            rows, data = staged.view(change[0]), staged.view(change[1])
            self.table.index_copy_(0, rows, data.view(-1, self.width))

    def forget(self) -> None:
        """The device table may no longer match (a reset): rewrite every row on its next use."""
        self._known = [None] * len(self._known)
