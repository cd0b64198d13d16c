"""RNG state for `--resume`: global and named generators as plain data (so a checkpoint loads with weights_only).

Python `random`, numpy's global generator, torch CPU and every CUDA device, plus generators the caller names
(torch.Generator, numpy Generator or random.Random). Restoring requires exactly the same names: a generator silently
left unrestored would break determinism without a trace.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

Generator = torch.Generator | np.random.Generator | random.Random


def _lists(value: Any) -> Any:
    """numpy arrays inside a bit-generator state as lists (so the state is plain data)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def _generator_state(name: str, gen: Generator) -> dict:
    if isinstance(gen, torch.Generator):
        return {"kind": "torch", "state": gen.get_state()}
    if isinstance(gen, np.random.Generator):
        return {"kind": "numpy", "state": _lists(gen.bit_generator.state)}
    if isinstance(gen, random.Random):
        return {"kind": "python", "state": gen.getstate()}
    raise TypeError(
        f"generator {name!r}: {type(gen).__name__} is not a torch.Generator, numpy Generator or random.Random"
    )


def _python_state(state: Any) -> tuple:
    version, internal, gauss = state
    return version, tuple(internal), gauss


def capture_rng_state(generators: Mapping[str, Generator] | None = None) -> dict:
    """Python, numpy (global), torch CPU and CUDA RNG states, and those of the named generators; plain data."""
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": _lists(numpy_state),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: _generator_state(name, gen) for name, gen in (generators or {}).items()},
    }


def restore_rng_state(state: Mapping, generators: Mapping[str, Generator] | None = None) -> None:
    """Set every RNG to `state` (from `capture_rng_state`); `generators` must have exactly the saved names."""
    generators = dict(generators or {})
    saved = state["generators"]
    if set(saved) != set(generators):
        raise ValueError(f"generator names differ: saved {sorted(saved)}, given {sorted(generators)}")
    for name, gen in generators.items():
        entry = saved[name]
        if _generator_state(name, gen)["kind"] != entry["kind"]:
            raise ValueError(f"generator {name!r}: saved a {entry['kind']} generator, given {type(gen).__name__}")
    python_state = _python_state(state["python"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": np.asarray(numpy_state["state"]["key"], dtype=np.uint32)}
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"]:
        if not torch.cuda.is_available():
            warnings.warn(
                "the checkpoint has CUDA RNG states but CUDA is not available; they are not restored", stacklevel=2
            )
        elif len(state["cuda"]) != torch.cuda.device_count():
            raise ValueError(
                f"the checkpoint has {len(state['cuda'])} CUDA RNG states, "
                f"this machine has {torch.cuda.device_count()} devices"
            )
        else:
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    for name, gen in generators.items():
        entry = saved[name]
        if entry["kind"] == "torch":
            gen.set_state(entry["state"].cpu())
        elif entry["kind"] == "numpy":
            gen.bit_generator.state = entry["state"]
        else:
            gen.setstate(_python_state(entry["state"]))
