"""comm/'s folders are layers (docs/ARCHITECTURE.md, "Inside comm/"): each
includes only from itself and the layers before it, so that e.g. the store
never reaches into the engine. Reads the checkout's sources."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["base", "security", "store", "transports", "engine", "cost", "algorithms"]
# The engine calls its algorithms through their descriptor, as compressors/ does its codecs' (and
# its Algorithm enum is made from the registry's list), and asks the cost model (which prices the
# engine's choices) for `auto`'s choice. The cost model reads each algorithm's formula through its
# descriptor too; the formulas, in the algorithms' files, are built from the cost model's blocks.
EXCEPTIONS = {
    "engine": {"comm/algorithms/algorithm.h", "comm/algorithms/registry.h", "comm/cost/cost_model.h",
               "comm/cost/auto_choice.h"},
    "cost": {"comm/algorithms/algorithm.h"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"(comm/[^"]+)"', re.M)


@pytest.mark.skipif(not (ROOT / "comm").is_dir(), reason="not run from a checkout")
def test_each_comm_folder_includes_only_the_layers_before_it() -> None:
    bad = []
    for layer_index, layer in enumerate(LAYERS):
        allowed = LAYERS[:layer_index + 1]
        for path in sorted((ROOT / "comm" / layer).rglob("*")):
            if path.suffix not in (".h", ".cc", ".cu"):
                continue
            for inc in INCLUDE.findall(path.read_text(encoding="utf-8")):
                top = inc.split("/")[1]
                if top not in allowed and inc not in EXCEPTIONS.get(layer, set()):
                    bad.append(f"{path.relative_to(ROOT)} includes {inc}")
    assert not bad, "\n".join(bad)
    assert sorted(p.name for p in (ROOT / "comm").iterdir() if p.is_dir()) == sorted(LAYERS)
