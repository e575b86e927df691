"""Where the sweep's points go: points.json (the record) and points.csv (for
spreadsheets), both updated as each point finishes.

points.json is rewritten whole through a temporary file and os.replace, so a
kill at any moment leaves either the old or the new list, never half of one;
points.csv is rebuilt from it when the sweep starts and then appended to.
A sweep started again on the same folder skips every key already recorded.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterable

#: CSV columns, in order (the JSON records hold these and a few more).
CSV_FIELDS = [
    "mode", "ranks", "link", "elements", "algorithm", "codec", "resolved_algorithm", "resolved_codec",
    "wire_bytes_per_rank", "ratio", "encode_ms", "comm_ms", "decode_ms", "total_ms", "baseline_ms", "speedup",
    "link_bound_ms", "rel_error", "ok", "accuracy", "wire_bytes_per_step", "finished_at", "key",
]


class Results:
    """The recorded points of one sweep folder."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.json_path = self.folder / "points.json"
        self.csv_path = self.folder / "points.csv"
        self.records: list[dict[str, Any]] = []
        self._keys: set[str] = set()

    def load(self) -> "Results":
        """Reads points.json if there is one and rebuilds points.csv from it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.json_path.exists():
            with open(self.json_path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, list):
                raise ValueError(f"{self.json_path}: expected a JSON list of points")
            self.records = [r for r in data if isinstance(r, dict) and "key" in r]
        self._keys = {r["key"] for r in self.records}
        self._write_csv(self.records, mode="w")
        return self

    def done(self, key: str) -> bool:
        return key in self._keys

    def add(self, record: dict[str, Any]) -> None:
        """Records one finished point (a key seen before replaces the old record)."""
        key = record["key"]
        replaced = key in self._keys
        if replaced:
            self.records = [r for r in self.records if r["key"] != key]
        self.records.append(record)
        self._keys.add(key)
        tmp = self.json_path.with_name(self.json_path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.records, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.json_path)
        if replaced:
            self._write_csv(self.records, mode="w")
        else:
            self._write_csv([record], mode="a")

    def _write_csv(self, records: Iterable[dict[str, Any]], mode: str) -> None:
        new = mode == "w" or not self.csv_path.exists()
        with open(self.csv_path, "w" if new else "a", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            for r in records:
                w.writerow(r)
