"""The machinery of typed config sections: a knob's range beside its default, and a mapping turned into a typed
section with every key, type and range checked, the message naming the key (`rl.spo.rho_timing`).

Torch-free, so the workflow builds a study's DAG without torch, and imported by every module that owns a config
section (trainer/config.py composes them; trainer/rl/config.py, trainer/rollout/config.py, ...): the one place a
knob is defined is the section beside the code that uses it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

LIMITS: dict[str, int] = {
    "updates": 1_000_000,
    "epochs": 100,
    "episodes": 65_536,
    "tokens": 1_048_576,
    "tasks": 1_000_000,
}
"""Upper bounds far above any study (the papers: 100-300 updates, 64-1024 episodes per update, 32k-token
episodes) and below what would only fail hours later or exhaust the machine (`batch_size: 10**9` allocates at run
time): a value above one is a typo, caught before the first cell."""
LIMITS_NOTE = "trainer.knobs.LIMITS: far above any study; a typo?"


@dataclass(frozen=True)
class Bounds:
    """A knob's allowed range (None: no bound on that side); `most` names a `LIMITS` entry as the upper bound."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    most: str | None = None


def knob(default: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """A config field with its allowed range beside its default (`ge`, `gt`, `le`, `lt`, `most`), so the range has
    one definition: a `Section` enforces it whenever it is built, a cell's and a study's shared block alike. A None
    value is not checked (it means "off"); a tuple is checked item by item. No default: a required key."""
    return field(default=default, metadata={"bounds": Bounds(**bounds)})


def _bound_error(key: str, value: Any, b: Bounds) -> str | None:
    if b.ge is not None and not value >= b.ge:
        return f"{key}: must be >= {b.ge}, got {value!r}"
    if b.gt is not None and not value > b.gt:
        return f"{key}: must be > {b.gt}, got {value!r}"
    if b.le is not None and not value <= b.le:
        return f"{key}: must be <= {b.le}, got {value!r}"
    if b.lt is not None and not value < b.lt:
        return f"{key}: must be < {b.lt}, got {value!r}"
    if b.most is not None and value > LIMITS[b.most]:
        return f"{key}: {value:,} is above {LIMITS[b.most]:,} ({LIMITS_NOTE})"
    return None


def check_bounds(cfg: Any, where: str) -> None:
    """ConfigError naming the first field of `cfg` (`where.field`) outside its `knob` bounds (nested sections are
    not entered: they checked themselves)."""
    for f in dataclasses.fields(cfg):
        value, bounds = getattr(cfg, f.name), f.metadata.get("bounds")
        if bounds is None or value is None:
            continue
        for item in value if isinstance(value, tuple) else (value,):
            error = _bound_error(f"{where}.{f.name}", item, bounds)
            if error:
                raise ConfigError(error)


@dataclass
class Section:
    """A config section that checks its fields whenever it is built, from YAML or in code (types, then `knob`
    ranges), so a runtime object never holds a value the study file could not; nested sections check themselves.
    A subclass's `validate` adds its rules across fields after calling this one's; code that may have changed a
    section since (a test, a reference helper) calls it again."""

    blank_is_absent: typing.ClassVar[bool] = False
    """True for a section whose None defaults only mean "not given" (a study file's own keys): `build_config` then
    refuses an explicit blank (null) value, which would otherwise read as the key left out."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_fields(self, type(self).__name__)

    def refuse(self, key: str | None, message: str) -> typing.NoReturn:
        """Raise ConfigError for a rule across this section's keys, naming `key` (None: the section itself); the
        message is relative to the section, and `build_config` puts the section's path before it."""
        raise ConfigError(f"{key or type(self).__name__}: {message}")


def check_fields(cfg: Any, where: str) -> None:
    """ConfigError naming the first field of `cfg` (`where.field`) of the wrong type or outside its range; nested
    sections are not entered (they checked themselves)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(value):
            _check_value(hints[f.name], value, f"{where}.{f.name}")
    check_bounds(cfg, where)


class ConfigError(ValueError):
    """A bad configuration: the message names the key and the value."""


def _yaml_1_1_number(text: str) -> bool:
    """`3e-4`, `1E5`: what a reader takes for a number and PyYAML (YAML 1.1) for a string."""
    return re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", text.strip()) is not None and "." not in text


def _with_dot(text: str) -> str:
    """`3e-4` as YAML 1.1 reads it as a number: `3.0e-4`."""
    mantissa, exponent = re.split(r"[eE]", text.strip(), maxsplit=1)
    return f"{mantissa}.0e{exponent}"


def _check_value(tp, value, where: str):
    """Coerce `value` to annotation `tp` or raise ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, where)
            except ConfigError as e:
                errors.append(str(e))
        names = [_article(getattr(arg, "__name__", str(arg))) for arg in args if arg is not type(None)]
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} is not {' or '.join(names)}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if tp is tuple or origin is tuple:
        args = typing.get_args(tp)
        if not args or args[-1] is Ellipsis:  # a tuple of any length
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where}: expected a list, got {value!r}")
            return tuple(v if not args else _check_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_check_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _yaml_1_1_number(value):
            raise ConfigError(
                f"{where}: expected a finite number, got the string {value!r}: YAML 1.1 reads a number in exponent "
                f"form without a dot as a string; write {_with_dot(value)}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool):
            raise ConfigError(
                f"{where}: {value!r} is true/false, not a string: YAML reads yes, no, on, off, true and false as "
                "such; quote the value as written"
            )
        if isinstance(value, (int, float)):
            raise ConfigError(
                f"{where}: {value!r} is {_article(type(value).__name__)}, not a string: YAML read it as one; quote "
                "the value as written"
            )
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        args = typing.get_args(tp)
        if not args:
            return dict(value)
        return {_check_value(args[0], k, where): _check_value(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else build_config(tp, value, where)  # a built section checked itself
    raise ConfigError(f"{where}: unsupported annotation {tp!r}")


def _article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def build_config(cls, data, where: str = ""):
    """`cls` (a config dataclass) from a mapping, nested dataclasses too, every value type-checked; ConfigError naming
    an unknown key (with its path after `where`) or a value of the wrong type. Ranges are `check_bounds`'s."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"unknown config key {key!r} (known keys{' of ' + where if where else ''}: {sorted(names)})")
    fields = dataclasses.fields(cls)
    if getattr(cls, "blank_is_absent", False):
        blank = next((key for key, value in data.items() if value is None), None)
        if blank is not None:
            key = f"{where}.{blank}" if where else blank
            raise ConfigError(f"{key}: a blank value (null); give a value or leave the key out")
    missing = [
        f.name
        for f in fields
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        key = f"{where}.{missing[0]}" if where else missing[0]
        raise ConfigError(f"{key}: required (keys{' of ' + where if where else ''}: {sorted(names)})")
    kwargs = {k: _check_value(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:  # a Section's own check: its path in place of its class name
        message, name = str(e), cls.__name__
        if message.startswith(f"{name}:"):  # about the section itself
            raise ConfigError(f"{where or name}{message.removeprefix(name)}") from None
        message = message.removeprefix(f"{name}.")
        raise ConfigError(f"{where}.{message}" if where else message) from None


def merge(base: dict, override: dict) -> dict:
    """`override` deep-merged over `base` (mappings key by key; anything else replaced)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
