"""`RecordStore`: a list of JSON records on disk, read one at a time through memory maps.

The catalogue of 1.18M products is several GB as Python dicts. Stored as one JSONL blob plus an ``int64`` offsets
array, both memory-mapped read-only, every process on a node reads the same page-cache pages: N runners cost one
copy, not N. A record is decoded only when a page shows it.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RecordStore", "write_records"]


def write_records(records: Iterable[dict[str, Any]], blob_path: Path, offsets_path: Path) -> int:
    """Write `records` as JSONL to `blob_path` and their byte offsets (N + 1 of them) to `offsets_path`.

    Returns:
        The number of records written.
    """
    offsets = [0]
    with open(blob_path, "wb") as blob:
        for record in records:
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
            blob.write(line)
            offsets.append(offsets[-1] + len(line))
    np.save(offsets_path, np.asarray(offsets, dtype=np.int64))
    return len(offsets) - 1


class RecordStore:
    """Read-only, memory-mapped access to records written by `write_records`.

    Args:
        blob_path: the JSONL file.
        offsets_path: the ``.npy`` file of N + 1 byte offsets.
    """

    def __init__(self, blob_path: Path, offsets_path: Path):
        self.blob_path = Path(blob_path)
        self.offsets = np.load(offsets_path, mmap_mode="r")
        with open(self.blob_path, "rb") as f:
            # An empty file cannot be mapped; an empty store has nothing to read anyway.
            self._blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.offsets[-1] > 0 else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Decode record `index` (negative indices count from the end)."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a store of {n} records ({self.blob_path})")
        index %= n
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return json.loads(self._blob[start:end])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]
