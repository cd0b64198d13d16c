"""Shared test builders, one definition each, imported by the tests as `from builders import ...` (pytest puts this
folder on sys.path; a plain module, since pytest advises against importing from conftest.py).

`trajectory` builds the estimators' input (trainer/rl/trajectory.py) from turn lengths, the shape every
advantage, shaping and SPO test starts from.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.rl.trajectory import Trajectory, Turn


def turns(
    lengths: Sequence[int],
    gap: int = 0,
    invalid: Sequence[int] = (),
    exec_error: Sequence[int] = (),
    states: Sequence[str] | None = None,
) -> list[Turn]:
    """Consecutive turns with the given generated lengths, `gap` observation tokens between them; turn k has an
    invalid action if k is in `invalid`, a failed command if in `exec_error`, and state `states[k]`."""
    out, pos = [], 0
    for k, length in enumerate(lengths):
        out.append(
            Turn(
                start=pos,
                end=pos + length,
                state=states[k] if states else "",
                invalid_action=k in invalid,
                exec_error=k in exec_error,
            )
        )
        pos += length + gap
    return out


def trajectory(
    task_id: str = "t",
    reward: float = 0.0,
    lengths: Sequence[int] = (1,),
    gap: int = 0,
    invalid: Sequence[int] = (),
    exec_error: Sequence[int] = (),
    states: Sequence[str] | None = None,
    **fields,
) -> Trajectory:
    """A trajectory of `turns(...)` whose length ends with its last turn; other Trajectory fields by keyword."""
    spans = turns(lengths, gap, invalid, exec_error, states)
    return Trajectory(task_id=task_id, reward=reward, turns=spans, length=spans[-1].end if spans else 0, **fields)
