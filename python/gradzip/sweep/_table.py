"""The sweep's tables (markdown): the headline table and the modelled scaling efficiency.

Scaling-efficiency model (weak scaling: every rank keeps its batch, so P
ranks do P times the work per step). One step on one rank takes the compute
time T_c; on P ranks it also waits for the gradient allreduce, of which a
fraction of the compute can hide (DDP overlaps bucket allreduces with the
backward pass):

    T_step(P)   = T_c + max(0, T_allreduce - overlap * T_c)
    efficiency  = (P * T_c / T_step(P)) / P = T_c / T_step(P)

T_allreduce is the measured total (encode + communication + decode) of the
codec on the emulated links, so a codec's CPU cost counts against it. The
model leaves out what it cannot see from here: contention of encode/decode
with the compute itself, and stragglers.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ._grid import fp32_link_bound_s


def _fmt_bytes(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def _fmt_ms(ms: float) -> str:
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def _fmt_n(n: int) -> str:
    return f"{n / 1e6:g}M" if n % 100_000 == 0 and n >= 1_000_000 else f"{n:,}"


def _groups(records: Iterable[dict[str, Any]]) -> dict[tuple[int, str, int], list[dict[str, Any]]]:
    out: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("mode") == "allreduce":
            out.setdefault((r["ranks"], r["link"], r["elements"]), []).append(r)
    return out


def _gloo(records: Sequence[dict[str, Any]], ranks: int, link: str, n: int) -> dict[str, Any] | None:
    for r in records:
        if r.get("mode") == "gloo" and (r["ranks"], r["link"], r["elements"]) == (ranks, link, n):
            return r
    return None


def _codec_label(r: dict[str, Any]) -> str:
    codec = r.get("resolved_codec") or r["codec"]
    return f"{codec} ({r.get('resolved_algorithm') or r['algorithm']})"


def baseline_check(records: Sequence[dict[str, Any]]) -> str:
    """The emulation check: gradzip's fp32 allreduce against the link bound and against gloo."""
    lines = [
        "| ranks | link | floats | link bound 2(P-1)/P x 4n / rate | gradzip fp32 (none, scatter_reduce) "
        "| / bound | gloo allreduce | / bound | gradzip fp32 / gloo |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (p, link, n), rs in sorted(_groups(records).items()):
        base = rs[0].get("baseline_ms")
        bound = fp32_link_bound_s(p, n, link)
        g = _gloo(records, p, link, n)
        gms = g["total_ms"] if g else None
        cells = [str(p), link, _fmt_n(n),
                 f"{bound * 1e3:,.0f} ms" if bound else "-",
                 f"{base:,.0f} ms" if base else "-",
                 f"{base / (bound * 1e3):.3f}" if base and bound else "-",
                 f"{gms:,.0f} ms" if gms else "-",
                 f"{gms / (bound * 1e3):.3f}" if gms and bound else "-",
                 f"{base / gms:.3f}" if base and gms else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def headline(records: Sequence[dict[str, Any]], codecs: Sequence[str] | None = None) -> str:
    """Per (ranks, link, size) and codec: wire bytes, time, speedups, error."""
    lines = [
        "| ranks | link | floats | codec (algorithm) | wire bytes/rank | ratio | allreduce ms "
        "(enc / comm / dec) | link time of its bytes | vs fp32 | vs gloo | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (p, link, n), rs in sorted(_groups(records).items()):
        g = _gloo(records, p, link, n)
        order = {c: i for i, c in enumerate(codecs or [])}
        rs = sorted(rs, key=lambda r: (order.get(r["codec"], len(order)), r["codec"], r["algorithm"]))
        for r in rs:
            if codecs is not None and r["codec"] not in order:
                continue
            vs_gloo = f"{g['total_ms'] / r['total_ms']:.2f}x" if g and r.get("total_ms") else "-"
            link_ms = r.get("link_bound_ms")
            cells = [
                str(p), link, _fmt_n(n), _codec_label(r), _fmt_bytes(r["wire_bytes_per_rank"]),
                f"{r['ratio']:.1f}x",
                f"{_fmt_ms(r['total_ms'])} ({_fmt_ms(r['encode_ms'])} / {_fmt_ms(r['comm_ms'])} / "
                f"{_fmt_ms(r['decode_ms'])})",
                f"{_fmt_ms(link_ms)} ms" if link_ms else "-",
                f"{r['speedup']:.2f}x", vs_gloo, f"{r['rel_error']:.2g}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def efficiency(t_allreduce_ms: float, compute_ms: float, overlap: float) -> float:
    """T_c / (T_c + max(0, T_ar - overlap * T_c)): the fraction of ideal speedup kept."""
    step = compute_ms + max(0.0, t_allreduce_ms - overlap * compute_ms)
    return compute_ms / step


def compute_for(target: float, t_allreduce_ms: float, overlap: float) -> float:
    """The compute time per step at which the model reaches `target` efficiency
    (T_c = T_ar / (1/target - 1 + overlap))."""
    return t_allreduce_ms / (1.0 / target - 1.0 + overlap)


def scaling(records: Sequence[dict[str, Any]], compute_ms: Sequence[float], overlap: float,
            codecs: Sequence[str] | None = None) -> str:
    """Modelled scaling efficiency per (ranks, link, size) and codec, for each
    compute time, and the compute time per step that keeps 90%."""
    heads = " | ".join(f"T_c = {c:g} ms" for c in compute_ms)
    lines = [f"| ranks | link | floats | codec | allreduce ms | {heads} | T_c for 90% |",
             "|---|---|---|---|---|" + "---|" * len(compute_ms) + "---|"]
    order = {c: i for i, c in enumerate(codecs or [])}
    for (p, link, n), rs in sorted(_groups(records).items()):
        rows: list[tuple[str, float]] = []
        for r in sorted(rs, key=lambda r: (order.get(r["codec"], len(order)), r["codec"])):
            if codecs is not None and r["codec"] not in order:
                continue
            rows.append((_codec_label(r), r["total_ms"]))
        g = _gloo(records, p, link, n)
        if g:
            rows.append(("torch gloo (fp32)", g["total_ms"]))
        for label, t in rows:
            effs = " | ".join(f"{100 * efficiency(t, c, overlap):.1f}%" for c in compute_ms)
            need = compute_for(0.9, t, overlap)
            lines.append(f"| {p} | {link} | {_fmt_n(n)} | {label} | {_fmt_ms(t)} | {effs} | "
                         f"{need / 1e3:.2g} s |" if need >= 1e3 else
                         f"| {p} | {link} | {_fmt_n(n)} | {label} | {_fmt_ms(t)} | {effs} | {need:.0f} ms |")
    return "\n".join(lines) + "\n"


def training(records: Sequence[dict[str, Any]]) -> str:
    """The --train digits points: accuracy and bytes per step."""
    rs = [r for r in records if r.get("mode") == "train" and r.get("experiment") != "lm"]  # lm: _lm
    if not rs:
        return ""
    lines = ["| method | ranks | test accuracy | wire bytes/step/rank | ratio vs fp32 |", "|---|---|---|---|---|"]
    for r in rs:
        acc = r.get("accuracy")
        lines.append(f"| {r['codec']} | {r['ranks']} | {100 * acc:.2f}% | "
                     f"{_fmt_bytes(r.get('wire_bytes_per_step') or 0)} | {(r.get('ratio') or 0):.1f}x |"
                     if acc is not None else f"| {r['codec']} | {r['ranks']} | - | - | - |")
    return "\n".join(lines) + "\n"


def report(records: Sequence[dict[str, Any]], compute_ms: Sequence[float], overlap: float,
           codecs: Sequence[str] | None = None, title: str = "") -> str:
    """Everything as one markdown document."""
    machines = sorted({r.get("machine", "?") for r in records})
    dates = sorted(r.get("finished_at", "") for r in records if r.get("finished_at"))
    parts = [f"# {title or 'gradzip sweep'}", "",
             f"Machine: {', '.join(machines)}; measured {dates[0] if dates else '?'} .. {dates[-1] if dates else '?'}.",
             "", "## fp32 baseline against the link bound and torch's gloo", "", baseline_check(records),
             "## Codecs", "",
             "Times are per call, the mean over the timed calls, max over ranks. `vs fp32`: gradzip's own "
             "uncompressed allreduce (none, scatter_reduce) measured in the same run; `vs gloo`: "
             "torch.distributed's gloo allreduce on the same links. `link time of its bytes`: the row's "
             "wire bytes per rank at the link rate (the time the network alone needs).", "",
             headline(records, codecs),
             f"## Modelled scaling efficiency (overlap = {overlap:g})", "",
             "T_step = T_c + max(0, T_allreduce - overlap x T_c); efficiency = T_c / T_step "
             "(the fraction of the ideal P-fold speedup kept). `T_c for 90%`: the compute per step at which "
             "the efficiency is 90%, T_allreduce / (1/0.9 - 1 + overlap).", "",
             scaling(records, compute_ms, overlap, codecs)]
    train = training(records)
    if train:
        parts += ["## Training (digits)", "", train]
    return "\n".join(parts)
