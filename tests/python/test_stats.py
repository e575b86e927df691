"""The statistics every entry point reports with one meaning (_stats.py):
wire_bytes, baseline_wire_bytes, wire_ratio, on 2 real ranks."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import resume_workers as w  # noqa: E402
from dist_util import run_ranks  # noqa: E402
from gradzip.torch import _stats  # noqa: E402


def test_every_entry_point_reports_the_shared_keys() -> None:
    for r in run_ranks(w.shared_stats, 2):
        n = r["elements"]
        for name in ("hook", "CompressedAdamW", "BlockMomentum"):
            s = r[name]
            assert set(_stats.KEYS) <= set(s), (name, sorted(s))
            assert s["wire_bytes"] > 0, (name, s)
            assert math.isclose(s["wire_ratio"], s["baseline_wire_bytes"] / s["wire_bytes"]), (name, s)
        # fp32 DDP's ring on 2 ranks sends the whole gradient once per step
        assert r["hook"]["baseline_wire_bytes"] == 4.0 * n * 3
        assert r["CompressedAdamW"]["baseline_wire_bytes"] == 4.0 * n * 4
        assert r["BlockMomentum"]["baseline_wire_bytes"] == 4.0 * n * 4
        assert r["CompressedAdamW"]["wire_ratio"] > 1.0 and r["BlockMomentum"]["wire_ratio"] > 1.0
