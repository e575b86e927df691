"""gradzip.sweep without a network: the grid grammar, sizes and links, and the
record/resume logic against stand-ins for gradzip-run and gradzip-bench."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from gradzip.sweep import _grid as grid
from gradzip.sweep import _registry as registry
from gradzip.sweep import _table as table
from gradzip import sweep


# --- grid grammar (the same as gz::expand_spec_grid) --------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("topk:density=0.1,0.01,0.001", ["topk:density=0.1", "topk:density=0.01", "topk:density=0.001"]),
    ("onebit:block=256,1024,4096", ["onebit:block=256", "onebit:block=1024", "onebit:block=4096"]),
    ("none,fp16,bf16", ["none", "fp16", "bf16"]),
    ("topk:density=0.1,0.01,onebit:block=256,1024",
     ["topk:density=0.1", "topk:density=0.01", "onebit:block=256", "onebit:block=1024"]),
    ("onebit:block=256,1024,ef=on,off",
     ["onebit:block=256,ef=on", "onebit:block=256,ef=off", "onebit:block=1024,ef=on", "onebit:block=1024,ef=off"]),
    ("topk:density=0.01,ef=off", ["topk:density=0.01,ef=off"]),
    (" fp16 , onebit ", ["fp16", "onebit"]),
    ("fp16,fp16", ["fp16"]),
])
def test_expand_spec_grid(text: str, expected: list[str]) -> None:
    assert grid.expand_spec_grid(text) == expected


def test_expand_spec_grid_takes_a_list_of_grids() -> None:
    assert grid.expand_spec_grid(["none", "topk:density=0.1,0.01"]) == ["none", "topk:density=0.1",
                                                                       "topk:density=0.01"]


@pytest.mark.parametrize("text", ["0.1,0.01", "density=0.1", "zstd", "zstd:level=3", "topk:density="])
def test_expand_spec_grid_rejects(text: str) -> None:
    with pytest.raises(grid.GridError):
        grid.expand_spec_grid(text)


def test_grid_grammar_matches_the_cpp_one_when_the_extension_is_there() -> None:
    gz = sys.modules.get("gradzip")
    cpp, canonical = getattr(gz, "expand_spec_grid", None), getattr(gz, "canonical_spec", None)
    if cpp is None or canonical is None:
        pytest.skip("gradzip's compiled extension is not installed")
    # The C++ one also canonicalizes (onebit -> onebit:block=512); the grid is the same.
    for text in ("topk:density=0.1,0.01,onebit:block=256,1024", "none,fp16,bf16,onebit",
                 "onebit:block=256,1024,ef=on,off"):
        assert [canonical(s) for s in grid.expand_spec_grid(text)] == list(cpp(text))


@pytest.mark.parametrize("value, n", [(1048576, 1048576), ("1M", 1 << 20), ("16m", 16 << 20), ("64K", 65536),
                                      ("25.6e6", 25_600_000), (1e8, 100_000_000), ("100000000", 100_000_000)])
def test_parse_size(value: object, n: int) -> None:
    assert grid.parse_size(value) == n  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", "1.5", "M", "-3", 0, True, "1T"])
def test_parse_size_rejects(value: object) -> None:
    with pytest.raises(grid.GridError):
        grid.parse_size(value)  # type: ignore[arg-type]


def test_links() -> None:
    assert grid.parse_link(" 1Gbit ") == "1gbit"
    assert grid.parse_link("10gbit,50us") == "10gbit,50us"
    assert grid.parse_link("local") == "local"
    assert grid.link_rate_bps("2.5gbit") == 2.5e9
    assert grid.link_rate_bps("local") is None
    assert grid.fp32_link_bound_s(4, 100_000_000, "1gbit") == pytest.approx(4.8)
    for bad in ("1gbps", "fast", "1gbit,50"):
        with pytest.raises(grid.GridError):
            grid.parse_link(bad)


def test_sizes_links_and_grids_parse_alike_through_the_extension_and_gradzip_bench(monkeypatch) -> None:
    # One parser (C++): the extension's bindings, or gradzip-bench's
    # --parse-count / --parse-link / --expand-grid without the extension;
    # the sweep has no parser of its own to drift.
    core = registry.core()
    if core is None:
        pytest.skip("gradzip's compiled extension (with comm) is not installed")
    if registry.find_binary("gradzip-bench") is None:
        pytest.skip("gradzip-bench is not built")
    assert registry.algorithm_names() == tuple(core.allreduce_algorithm_names())
    assert "hierarchical" in registry.algorithm_names()
    sizes = ["1048576", "1M", "16m", "64K", "25.6e6", "100000000", "1e8", "", "1.5", "M", "-3", "1T", "0", "2.5K"]
    links = ["1gbit", "10gbit,50us", "2.5gbit", "1gbps", "fast", "1gbit,50", "10kbit", "5tbit"]
    grids = ["topk:density=0.1,0.01,onebit:block=256,1024", "none,fp16,bf16,onebit", "zstd", "topk:density=",
             "0.1,fp16", "onebit:block=256,1024,ef=on,off"]

    def outcomes() -> list:  # type: ignore[type-arg]
        return ([_outcome(grid.parse_size, v) for v in sizes] + [_outcome(grid.parse_link, v) for v in links]
                + [_outcome(grid.expand_spec_grid, v) for v in grids] + [_outcome(grid.link_rate_bps, "2.5gbit")])

    with_extension = outcomes()
    monkeypatch.setattr(registry, "core", lambda: None)  # as without the extension: gradzip-bench parses
    assert outcomes() == with_extension
    assert with_extension[-1] == 2.5e9


def _outcome(fn, value):  # type: ignore[no-untyped-def]
    try:
        return fn(value)
    except grid.GridError:
        return "error"


def test_points_put_gloo_first_and_keys_are_unique() -> None:
    g = grid.make_grid("none,topk:density=0.1,0.01", ["auto"], ["1M", "2M"], [2, 4], ["1gbit"], gloo=True)
    pts = g.points()
    assert len(pts) == 2 * 2 * (1 + 3)
    assert len({p.key for p in pts}) == len(pts)
    assert pts[0].mode == "gloo" and pts[1].codec == "none"


def test_efficiency_model() -> None:
    assert table.efficiency(0.0, 100.0, 0.0) == 1.0
    assert table.efficiency(100.0, 100.0, 0.0) == pytest.approx(0.5)
    assert table.efficiency(50.0, 100.0, 0.5) == 1.0  # fully hidden behind the overlappable compute
    assert table.efficiency(150.0, 100.0, 0.5) == pytest.approx(100 / 200)
    for overlap in (0.0, 0.5):
        assert table.efficiency(176.0, table.compute_for(0.9, 176.0, overlap), overlap) == pytest.approx(0.9)


# --- record and resume, with stand-ins for the binaries -----------------------------------------

FAKE_RUN = """\
#!{python}
# gradzip-run stand-in: runs the command after '--' as rank 0 of WORLD_SIZE=-n.
import os, sys
a = sys.argv[1:]
n = a[a.index("-n") + 1]
cmd = a[a.index("--") + 1:]
os.environ.update(RANK="0", WORLD_SIZE=n)
os.execv(cmd[0], cmd)
"""

FAKE_BENCH = """\
#!{python}
# gradzip-bench stand-in: one JSON line per codec, then the fp32 baseline row
# unless it was asked for; logs each call; exits 3 after FAKE_FAIL_AFTER rows
# (once: it leaves a marker file).
import json, os, sys
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
codecs = []
for item in opt("--codecs").split(","):
    if codecs and "=" in item and ":" not in item:
        codecs[-1] += "," + item
    else:
        codecs.append(item)
n, alg, out = int(opt("--sizes")), opt("--algorithm"), opt("--jsonl")
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({{"codecs": codecs, "n": n, "algorithm": alg}}) + "\\n")
fail_after = int(os.environ.get("FAKE_FAIL_AFTER", "-1"))
marker = log + ".failed"
rows = [(c, alg if alg != "auto" else "scatter_reduce") for c in codecs]
if not any(c == "none" and r == "scatter_reduce" for c, r in rows):
    rows.append(("none", "scatter_reduce"))
for i, (c, r) in enumerate(rows):
    if i == fail_after and not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(3)
    ratio = {{"none": 1.0, "fp16": 2.0}}.get(c.split(":")[0], 25.0)
    row = dict(codec=c, algorithm=r, transport="ucx", ranks=int(os.environ["WORLD_SIZE"]), elements=n,
               wire_bytes_per_rank=int(6 * n / ratio), ratio=ratio, encode_ms=1.0, comm_ms=10.0 / ratio,
               decode_ms=1.0, total_ms=2 + 10.0 / ratio, baseline_ms=12.0, speedup=12.0 / (2 + 10.0 / ratio),
               rel_error=0.5 if ratio > 2 else 1e-4, error_bound=1.0, workspace_bytes=0, identical=True, ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\\n")
"""


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name, text in (("gradzip-run", FAKE_RUN), ("gradzip-bench", FAKE_BENCH)):
        p = d / name
        p.write_text(textwrap.dedent(text).format(python=sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    return d


def _calls(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "calls.log").read_text().splitlines()]


def _sweep(fake_bin: Path, out: Path, *extra: str) -> int:
    return sweep.main(["--bin-dir", str(fake_bin), "--out", str(out), "--links", "local", "--no-gloo",
                       "--ranks", "4", "--codecs", "none,fp16,topk:density=0.1,0.01", "--sizes", "1K,2K",
                       *extra])


def test_points_are_recorded_and_a_rerun_skips_them(fake_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _sweep(fake_bin, out) == 0
    recs = json.loads((out / "points.json").read_text())
    assert len(recs) == 8 and all(r["ok"] for r in recs)
    assert len((out / "points.csv").read_text().splitlines()) == 1 + 8
    assert (out / "report.md").exists() and (out / "speedup_vs_size.png").exists()
    assert (out / "error_vs_ratio.png").exists()
    assert len(_calls(tmp_path)) == 2  # one bench per size, all codecs in it
    assert _sweep(fake_bin, out) == 0
    assert len(_calls(tmp_path)) == 2  # nothing left to do


def test_without_matplotlib_the_sweep_still_records_and_reports(fake_bin: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ModuleNotFoundError
    out = tmp_path / "out"
    assert _sweep(fake_bin, out) == 0
    assert len(json.loads((out / "points.json").read_text())) == 8 and (out / "report.md").exists()
    assert not list(out.glob("*.png"))
    assert "matplotlib is not installed: no plots" in capsys.readouterr().err


def test_an_interrupted_group_resumes_with_only_the_missing_codecs(fake_bin: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_FAIL_AFTER", "2")  # the first bench dies after two rows
    assert _sweep(fake_bin, out) == 1
    first = json.loads((out / "points.json").read_text())
    assert {r["codec"] for r in first if r["elements"] == 1024} == {"none", "fp16"}
    assert len(first) == 2 + 4  # the second size ran whole
    assert _sweep(fake_bin, out) == 0
    last = _calls(tmp_path)[-1]
    assert last["codecs"] == ["topk:density=0.1", "topk:density=0.01"] and last["n"] == 1024
    recs = json.loads((out / "points.json").read_text())
    assert len(recs) == 8 + 1  # + the bench's own fp32 baseline row of the resumed group
    assert len({r["key"] for r in recs}) == len(recs)


def test_toml_config_and_flags(tmp_path: Path, fake_bin: Path) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text('[sweep]\ncodecs = ["onebit:block=256,1024"]\nsizes = [2048, "1K"]\nranks = [3]\n'
                   'links = ["local"]\ngloo = false\niters = 1\nwarmup = 0\n')
    out = tmp_path / "o"
    assert sweep.main(["--config", str(cfg), "--bin-dir", str(fake_bin), "--out", str(out), "--sizes", "4K"]) == 0
    recs = json.loads((out / "points.json").read_text())
    assert {(r["codec"], r["elements"], r["ranks"]) for r in recs if r["algorithm"] == "auto"} == {
        ("onebit:block=256", 4096, 3), ("onebit:block=1024", 4096, 3)}
    bad = tmp_path / "bad.toml"
    bad.write_text("codecz = 'none'\n")
    assert sweep.main(["--config", str(bad), "--out", str(out)]) == 2


# --- where the programs come from ------------------------------------------------------------------

def _programs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("gradzip-run", "gradzip-bench"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_programs_come_from_this_gradzip_then_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "checkout"
    _programs(checkout / "build" / "bin")
    installed = _programs(tmp_path / "venv" / "bin")
    on_path = _programs(tmp_path / "elsewhere")
    monkeypatch.delenv("GRADZIP_BIN_DIR", raising=False)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(registry, "CHECKOUT", checkout)
    monkeypatch.setattr(registry, "installed_programs", lambda: {"gradzip-bench": installed / "gradzip-bench"})
    assert registry.find_binary("gradzip-bench") == str(checkout / "build" / "bin" / "gradzip-bench")
    monkeypatch.setattr(registry, "CHECKOUT", None)  # an installed package: its own programs
    assert registry.find_binary("gradzip-bench") == str(installed / "gradzip-bench")
    assert registry.find_binary("gradzip-run") == str(on_path / "gradzip-run")  # not installed with it: PATH
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    path, looked = registry.find_program("gradzip-run")
    assert path is None and looked == ["the programs installed with the gradzip package", "PATH"]
    # An explicit folder wins, and nothing stands in for a program it lacks.
    monkeypatch.setenv("GRADZIP_BIN_DIR", str(on_path))
    assert registry.find_binary("gradzip-bench") == str(on_path / "gradzip-bench")
    assert registry.find_binary("gradzip-bench", str(tmp_path / "empty")) is None


def test_missing_programs_are_named_with_where_the_sweep_looked(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sweep.main(["--bin-dir", str(empty), "--out", str(tmp_path / "o"), "--links", "local", "--no-gloo",
                       "--codecs", "none", "--sizes", "1K"]) == 2
    err = capsys.readouterr().err
    assert f"cannot find gradzip-run (looked in: --bin-dir {empty} ({empty / 'gradzip-run'}))" in err, err
    assert f"gradzip-bench (looked in: --bin-dir {empty} ({empty / 'gradzip-bench'}))" in err, err


def test_emulated_links_need_root(fake_bin: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root")
    assert sweep.main(["--bin-dir", str(fake_bin), "--out", str(tmp_path / "o"), "--links", "1gbit",
                       "--no-gloo"]) == 2


FAKE_DIGITS = """\
#!{python}
# The digits experiment's stand-in: its command line and its JSON summary.
import json, sys
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
methods = [opt("--methods")]
acc = {{"fp32": 0.97, "onebit": 0.965}}
summary = [dict(method=m, seeds=[0], accuracy=[acc.get(m, 0.9)], accuracy_mean=acc.get(m, 0.9),
                payload_bytes_per_step=1000.0, payload_ratio=28.0 if m != "fp32" else 1.0,
                wire_bytes_per_step=1500.0, wire_ratio=28.0 if m != "fp32" else 1.0, seconds=1.0,
                identical_on_all_ranks=True) for m in methods]
json.dump(dict(settings=dict(epochs=int(opt("--epochs")) if "--epochs" in a else 40), ranks=int(opt("--ranks")),
               results=[], summary=summary), open(opt("--json"), "w"))
"""


def test_train_digits_runs_the_experiment_per_codec_setting(fake_bin: Path, tmp_path: Path) -> None:
    script = tmp_path / "digits.py"
    script.write_text(textwrap.dedent(FAKE_DIGITS).format(python=sys.executable))
    out = tmp_path / "t"
    assert sweep.main(["--bin-dir", str(fake_bin), "--out", str(out), "--train", "digits", "--codecs", "onebit,fp16",
                       "--train-cmd", f"{sys.executable} {script}", "--train-epochs", "2", "--links", "local"]) == 0
    recs = {r["codec"]: r for r in json.loads((out / "points.json").read_text())}
    assert set(recs) == {"fp32", "onebit", "fp16"} and all(r["mode"] == "train" for r in recs.values())
    assert recs["onebit"]["accuracy"] == pytest.approx(0.965) and recs["onebit"]["ratio"] == 28.0
    assert recs["fp32"]["epochs"] == 2
    assert (out / "accuracy_vs_ratio.png").exists()
    assert "## Training (digits)" in (out / "report.md").read_text()


FAKE_LM = """\
#!{python}
# The lm experiment's stand-in: its command line and its JSON (settings, per-run results, summary).
import json, sys
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
m, p, steps = opt("--methods"), int(opt("--ranks")), int(opt("--steps")) if "--steps" in a else 400
loss = {{"fp32": 2.5, "onebit@cm": 2.55}}.get(m, 3.0) - 0.1 * p
wire = 1e6 if m == "fp32" else 1e5
results = [dict(method=m, seed=0, ranks=p, steps=steps, val_loss=loss, train_loss=loss, wire_bytes=wire,
                fp32_wire_bytes=1e6, seconds=1.0, curve=[[steps // 2, loss + 1], [steps, loss]],
                extra=dict(identical_on_all_ranks=True))]
summary = [dict(method=m, ranks=p, val_loss=loss, vs_fp32_percent=float("nan"), wire_bytes=wire,
                wire_ratio=1e6 / wire, seconds=1.0, identical_on_all_ranks=True, extra={{}})]
json.dump(dict(settings=dict(steps=steps), results=results, summary=summary), open(opt("--json"), "w"))
"""


def test_train_lm_is_a_grid_of_methods_by_ranks_with_the_experiments_json_and_plot(fake_bin: Path,
                                                                                    tmp_path: Path) -> None:
    script = tmp_path / "lm.py"
    script.write_text(textwrap.dedent(FAKE_LM).format(python=sys.executable))
    out = tmp_path / "t"
    assert sweep.main(["--bin-dir", str(fake_bin), "--out", str(out), "--train", "lm", "--codecs", "onebit@cm",
                       "--train-ranks", "2,4", "--train-cmd", f"{sys.executable} {script}", "--train-steps", "20",
                       "--links", "local"]) == 0
    recs = {(r["ranks"], r["codec"]): r for r in json.loads((out / "points.json").read_text())}
    assert set(recs) == {(2, "fp32"), (2, "onebit@cm"), (4, "fp32"), (4, "onebit@cm")}
    assert recs[(4, "onebit@cm")]["val_loss"] == pytest.approx(2.15) and recs[(4, "onebit@cm")]["ratio"] == 10.0
    assert recs[(2, "fp32")]["steps"] == 20
    for p in (2, 4):
        data = json.loads((out / f"lm_{p}ranks.json").read_text())
        assert {r["method"] for r in data["results"]} == {"fp32", "onebit@cm"}
        row = next(r for r in data["summary"] if r["method"] == "onebit@cm")
        assert row["vs_fp32_percent"] == pytest.approx(100 * (2.55 - 0.1 * p) / (2.5 - 0.1 * p) - 100)
        assert (out / f"lm_{p}ranks.png").exists()
    text = (out / "report.md").read_text()
    assert "## Training (lm)" in text and "## Training (digits)" not in text
    assert "| 4 | `onebit@cm` | 2.1500 | +2.38% |" in text


def test_train_ranks_and_experiment_are_checked() -> None:
    assert sweep.main(["--train", "lm", "--train-ranks", "1", "--dry-run"]) == 2
    assert sweep.main(["--train", "lm", "--train-ranks", "four", "--dry-run"]) == 2


def test_lm_methods_keep_their_commas_without_the_extension() -> None:
    assert grid.split_lm_methods("onebit,onebit@bmuf:h=8,mu=0,algorithm=scatter_reduce,server=onebit,"
                                 "topk:density=0.01,ef=off,onebit@cm:warmup=30,refresh=20,fp32") == [
        "onebit", "onebit@bmuf:h=8,mu=0,algorithm=scatter_reduce,server=onebit", "topk:density=0.01,ef=off",
        "onebit@cm:warmup=30,refresh=20", "fp32"]
