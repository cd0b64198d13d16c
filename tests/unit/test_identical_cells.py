"""benchmarks/identical_cells.py, the study-model refactors' check that every study makes the same cells."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("identical_cells", ROOT / "benchmarks" / "identical_cells.py")
identical_cells = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identical_cells)


def test_two_dumps_of_one_tree_are_identical_and_a_changed_key_is_named(tmp_path, capsys):
    files = [str(ROOT / "configs" / "smoke.yaml"), str(ROOT / "configs" / "paper.yaml")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert identical_cells.main(["dump", *files, "--out", str(out)]) == 0
    dump = json.loads(a.read_text())
    smoke = dump["configs/smoke.yaml"]
    assert len(smoke["cells"]) == 28 and set(smoke["warm_starts"]) == {"minicpm-tiny", "qwen-tiny"}
    assert (
        "checkpoints/" in dump["configs/paper.yaml"]["error"]
    )  # paper scale: named, not loaded, without its checkpoints
    assert identical_cells.main(["compare", str(a), str(b)]) == 0
    folder = "model=qwen-tiny/recipe=full/optimizer=muon/seed=0"
    smoke["cells"][folder]["optim"]["lr"] = 1.0
    b.write_text(json.dumps(dump))
    capsys.readouterr()
    assert identical_cells.main(["compare", str(a), str(b)]) == 1
    assert f"configs/smoke.yaml: cells.{folder}.optim.lr:" in capsys.readouterr().out
