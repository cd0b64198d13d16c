"""The project's own settings agree with what it depends on: the Python floor is the dependencies', every path the
settings name exists, and the lock pins what the install asks for. (Lint and format run before the tests, in
`.ci/lint`.)"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_python_floor_is_the_one_the_dependencies_set_and_every_path_named_exists():
    """pyproject's requires-python is Snakemake's own floor (the project cannot run below it), ruff targets it, and
    the scripts its pytest markers and the envs name exist."""
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    floor = project["project"]["requires-python"]
    assert floor == importlib.metadata.metadata("snakemake")["Requires-Python"]
    assert project["tool"]["ruff"]["target-version"] == "py" + floor.removeprefix(">=").replace(".", "")
    for marker in project["tool"]["pytest"]["ini_options"]["markers"]:
        for path in re.findall(r"[\w./-]+\.(?:sh|py|yaml)\b", marker):
            assert (REPO / path).exists(), (marker, path)


def test_the_lock_pins_every_dependency_and_the_install_uses_it():
    """requirements.lock (envs/lock.sh) pins each of pyproject's dependencies and extras to one version, torch to
    the README's 2.13.0, without local labels; README's two commands install with it."""
    import re
    import tomllib

    from trainer.logs.provenance import read_lock

    pins = read_lock(REPO / "requirements.lock")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [
        d for extra in ("test", "docker", "trackers") for d in project["optional-dependencies"][extra]
    ]
    names = {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("_", "-") for d in wanted}
    assert names - set(pins) == set()
    assert pins["torch"] == "2.13.0" and not any("+" in v for v in pins.values())
    readme = (REPO / "README.md").read_text()
    assert readme.count("pip install -q -c requirements.lock -e ") == 2
    lint = (REPO / ".ci" / "lint").read_text()
    assert "-c requirements.lock ruff snakefmt" in lint and {"ruff", "snakefmt"} <= set(pins)
