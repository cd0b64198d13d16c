"""The `alfworld` package's text games (ALFWorld, TextWorld engine) behind the harness's Environment protocol.

Why: at paper scale the companion study trains on real ALFWorld. The embedded default uses `textgame`, which
speaks the same protocol and prints observations in the same layout, so a run switches between the two by
swapping the task source and environment, nothing else.

Design choices:
- **Lazy and checked.** `alfworld` is imported only when a game is listed or started. Before that the data is
  checked on disk: `import alfworld` itself creates `~/.cache/alfworld`, so an existing folder proves nothing;
  we look for `json_2.1.1/<split>` with games in it. A missing package or missing data raises
  `AlfworldUnavailable` naming what is missing and how to get it (`pip install alfworld`, then
  `alfworld-download`, which needs internet access; or point $ALFWORLD_DATA at a copy).
- **Task lists** come from alfworld's own `AlfredTWEnv.collect_game_files` (its task-type, solvability and
  "no movable/sliced" filters), then sorted, because that walks the file system in whatever order it returns.
  "train" is json_2.1.1/train; "heldout" is valid_seen by default (the GraphGPO reproduction validates on the
  first 128 valid_seen games), valid_unseen when `heldout_split` says so. A task id is the game's folder
  relative to its split folder, so it is stable across machines.
- **One game per reset**, registered with `textworld.gym` the way `AlfredTWEnv.init_env` does (the demangler
  without name shuffling, the gamefile info, `won` and `admissible_commands` requested) but unbatched: one
  `AlfworldEnv` plays one episode, as the protocol wants. By default the game runs in a child process of its
  own, because fast-downward's state is per process and two live games in one process silently corrupt each
  other (found by this module's tests; alfworld's batched env also uses a process per game).
- **Observations** drop the "-= Welcome to TextWorld, ALFRED! =-" banner, join paragraphs with single
  newlines, and end with `textgame.format_observation`'s "Admissible actions: a | b" line. "help" is left out
  of the list (as verl-agent does) and the list is sorted, so GraphGPO's state key does not depend on the order
  TextWorld happens to return.
- **Outcome.** reward 1.0 when `infos["won"]`, else 0.0; the 10x scale of verl-agent (R_s = 10) belongs to the
  advantage estimators. At most `max_steps` (50) steps, counted here as well as by TextWorld's limit.
- **Invalid actions.** ALFWorld does not check admissibility; the game answers "Nothing happens.", which sets
  `invalid_action`. With `action_format="tagged"` the model's text goes through verl-agent's projection
  (`project_action`): a reply without `<action>...</action>` (or, by default, without `<think>...</think>`), or
  with CJK characters, is invalid even if the game happens to accept what was sent.
"""

from __future__ import annotations

import importlib.util
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

from trainer.environments.protocol import StepInfo, StepResult
from trainer.environments.textgame import format_observation, natural_key, normalize_action

ALFWORLD_TASK_TYPES: dict[int, str] = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
"""alfworld's task-type ids (alfred_tw_env.TASK_TYPES), repeated here so configs validate without the package."""

_TRAIN_EVAL = {"train": "train", "valid_seen": "eval_in_distribution", "valid_unseen": "eval_out_of_distribution"}
"""Folder under json_2.1.1 -> the `train_eval` name AlfredTWEnv uses for it."""
REQUIRED_MODULES = ("alfworld", "textworld", "fast_downward")
"""Modules a game needs: alfworld, its engine, and the PDDL planner that textworld[pddl] brings
(PyPI: fast-downward-textworld; it and textworld's `jericho` dependency build from source, about 3 min on 2 cores)."""
ALFWORLD_VERBS = frozenset(
    {
        "go",
        "open",
        "close",
        "take",
        "move",
        "put",
        "clean",
        "heat",
        "cool",
        "slice",
        "use",
        "examine",
        "inventory",
        "look",
        "help",
    }
)
"""First words of ALFWorld 0.4's command templates (alfred.twl2); StepInfo.tool is "" for any other first word."""
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
NOTHING = "Nothing happens."
INSTALL_HINT = (
    "install the package with `pip install alfworld` (it brings textworld[pddl]; or this project's "
    "`[alfworld]` extra), then fetch the games with `alfworld-download` (needs internet; writes to "
    "$ALFWORLD_DATA or ~/.cache/alfworld), or set ALFWORLD_DATA / AlfworldConfig.data_dir to a folder "
    "that holds json_2.1.1/"
)


class AlfworldUnavailable(RuntimeError):
    """The `alfworld` package or its game data is missing; the message says which and how to get it."""


@dataclass(frozen=True)
class AlfworldConfig:
    """Where the ALFWorld games are, which of them to play, and how actions are read."""

    data_dir: str = ""
    """Folder holding json_2.1.1/; "" means $ALFWORLD_DATA, else ~/.cache/alfworld (alfworld's own default)."""
    heldout_split: str = "valid_seen"
    """json_2.1.1 folder used as the "heldout" split: "valid_seen" or "valid_unseen"."""
    task_types: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    """alfworld task-type ids to keep (see ALFWORLD_TASK_TYPES)."""
    max_steps: int = 50
    """Steps per episode (verl-agent's env.max_steps); reaching it ends the episode with reward 0."""
    action_format: str = "plain"
    """"plain": the reply is the command. "tagged": verl-agent's <think>...</think><action>...</action> reply."""
    require_think: bool = True
    """With "tagged": a reply without a <think>...</think> block is invalid (verl-agent's rule)."""
    isolate: bool = True
    """Play each game in a child process of its own (see IsolatedGame); False plays in this process, which is
    faster but allows only one live game per process (a second one raises)."""

    def __post_init__(self):
        if isinstance(self.task_types, list):
            object.__setattr__(self, "task_types", tuple(self.task_types))
        if self.heldout_split not in ("valid_seen", "valid_unseen"):
            raise ValueError(
                f"AlfworldConfig.heldout_split must be 'valid_seen' or 'valid_unseen', got {self.heldout_split!r}"
            )
        if (
            not isinstance(self.task_types, tuple)
            or not self.task_types
            or any(t not in ALFWORLD_TASK_TYPES for t in self.task_types)
        ):
            raise ValueError(
                f"AlfworldConfig.task_types must be a non-empty tuple of ids in "
                f"{sorted(ALFWORLD_TASK_TYPES)}, got {self.task_types!r}"
            )
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or self.max_steps < 1:
            raise ValueError(f"AlfworldConfig.max_steps must be an integer >= 1, got {self.max_steps!r}")
        if self.action_format not in ("plain", "tagged"):
            raise ValueError(f"AlfworldConfig.action_format must be 'plain' or 'tagged', got {self.action_format!r}")
        if not isinstance(self.isolate, bool) or not isinstance(self.require_think, bool):
            raise ValueError(
                f"AlfworldConfig.isolate and .require_think must be bools, "
                f"got {self.isolate!r} and {self.require_think!r}"
            )
        if not isinstance(self.data_dir, (str, os.PathLike)):
            raise ValueError(f"AlfworldConfig.data_dir must be a path string, got {self.data_dir!r}")


def alfworld_data_dir(data_dir: str | os.PathLike = "") -> Path:
    """The data folder alfworld would use: `data_dir`, else $ALFWORLD_DATA, else ~/.cache/alfworld."""
    chosen = str(data_dir) or os.environ.get("ALFWORLD_DATA", "") or "~/.cache/alfworld"
    return Path(os.path.expandvars(chosen)).expanduser()


def require_alfworld(data_dir: str | os.PathLike = "", splits=("train",)) -> Path:
    """Check that the package and the games of `splits` are there, without importing alfworld; returns the folder.

    Raises AlfworldUnavailable naming everything that is missing.
    """
    missing = [f"the Python package `{name}`" for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    root = alfworld_data_dir(data_dir)
    for split in splits:
        folder = root / "json_2.1.1" / split
        if not folder.is_dir() or not any(folder.iterdir()):
            missing.append(f"the ALFWorld games of split {split!r} (no games in {folder})")
    if missing:
        raise AlfworldUnavailable(
            "ALFWorld cannot run here: missing " + "; ".join(missing) + ". To fix: " + INSTALL_HINT + "."
        )
    return root


_CJK = re.compile(r"[\u4e00-\u9fff]")


def project_action(text: str, require_think: bool = True) -> tuple[str, bool]:
    """verl-agent's ALFWorld projection: (command to send, whether the reply was well-formed).

    The reply is lower-cased and the text between the first "<action>" and the first "</action>" is the
    command. Without both tags (or with "</action>" before "<action>", which verl-agent would turn into an empty
    command) the last 30 characters are sent and the reply is invalid. It is also invalid when it contains CJK
    characters or, with `require_think`, lacks "<think>" or "</think>".
    """
    if not isinstance(text, str):
        raise TypeError(f"project_action needs the model's reply as str, got {type(text).__name__}")
    lowered = text.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    if start == -1 or end < start:
        return lowered[-30:], False
    command = lowered[start + len("<action>") : end].strip()
    valid = not _CJK.search(text)
    if require_think and ("<think>" not in text or "</think>" not in text):
        valid = False
    return command, valid


@dataclass(frozen=True)
class AlfworldTask:
    """One ALFWorld game file."""

    task_id: str
    """"alfworld-<split>/<game folder relative to the split folder>"."""
    gamefile: str
    """Path of the game.tw-pddl file."""
    task_type: str
    """alfworld's task-type name, from the game folder's name."""
    split: str
    """json_2.1.1 folder: "train", "valid_seen" or "valid_unseen"."""


def _alfworld_settings(root: Path, config: AlfworldConfig) -> dict:
    """The parts of alfworld's base_config.yaml that AlfredTWEnv reads."""
    games = root / "json_2.1.1"
    return {
        "dataset": {
            "data_path": str(games / "train"),
            "eval_id_data_path": str(games / "valid_seen"),
            "eval_ood_data_path": str(games / "valid_unseen"),
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "logic": {"domain": str(root / "logic" / "alfred.pddl"), "grammar": str(root / "logic" / "alfred.twl2")},
        "env": {
            "type": "AlfredTWEnv",
            "goal_desc_human_anns_prob": 0.0,
            "task_types": list(config.task_types),
            "domain_randomization": False,
            "expert_type": "handcoded",
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": config.max_steps}},
    }


class AlfworldTasks:
    """Train and held-out ALFWorld games, in a fixed (sorted) order."""

    SPLITS = ("train", "heldout")

    def __init__(self, config: AlfworldConfig | None = None):
        self.config = config or AlfworldConfig()
        self.root = require_alfworld(self.config.data_dir, ("train", self.config.heldout_split))
        self._cache: dict[str, list[AlfworldTask]] = {}

    def _list(self, folder: str) -> list[AlfworldTask]:
        from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv  # lazy: heavy, optional dependency

        listing = AlfredTWEnv(_alfworld_settings(self.root, self.config), train_eval=_TRAIN_EVAL[folder])
        split_dir = self.root / "json_2.1.1" / folder
        tasks = []
        for gamefile in sorted(listing.game_files, key=natural_key):
            game_dir = Path(gamefile).parent.relative_to(split_dir).as_posix()
            tasks.append(
                AlfworldTask(
                    task_id=f"alfworld-{folder}/{game_dir}",
                    gamefile=str(gamefile),
                    task_type=game_dir.split("-", 1)[0],
                    split=folder,
                )
            )
        return tasks

    def tasks(self, split: str, n: int | None = None) -> list[AlfworldTask]:
        """The first `n` games of `split` ("train" or "heldout"); all of them when `n` is None."""
        if split not in self.SPLITS:
            raise ValueError(f"split must be one of {self.SPLITS}, got {split!r}")
        folder = "train" if split == "train" else self.config.heldout_split
        if folder not in self._cache:
            self._cache[folder] = self._list(folder)
        tasks = self._cache[folder]
        if n is None:
            return list(tasks)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(tasks):
            raise ValueError(f"n must be an integer in [0, {len(tasks)}] for split {split!r}, got {n!r}")
        return tasks[:n]


def clean_observation(text: str) -> str:
    """Drop ALFWorld's welcome banner and blank lines; keep the sentences as the game wrote them."""
    text = text.replace(BANNER, "")
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


_ENV_IDS: dict[tuple[str, int], str] = {}
"""(gamefile, max_steps) -> textworld.gym id, so replaying a game does not register it again."""


def open_game(gamefile: str, max_steps: int):
    """A textworld gym env for one game in this process: reset() -> (obs, infos), step(cmd) -> (obs, score,
    done, infos). Registered as AlfredTWEnv.init_env does, but unbatched and without name shuffling."""
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    key = (gamefile, max_steps)
    if key not in _ENV_IDS:
        request = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        _ENV_IDS[key] = textworld.gym.register_game(
            gamefile,
            request,
            batch_size=None,
            asynchronous=False,
            max_episode_steps=max_steps,
            wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
        )
    return textworld.gym.make(_ENV_IDS[key])


def _serve_game(conn, gamefile: str, max_steps: int) -> None:
    """Child process: plays one game, answering ("reset",) / ("step", command) / ("close",) over `conn`."""
    game = None
    try:
        while True:
            request = conn.recv()
            try:
                if request[0] == "close":
                    conn.send(("ok", None))
                    return
                if game is None:
                    game = open_game(gamefile, max_steps)
                reply = game.reset() if request[0] == "reset" else game.step(request[1])
                conn.send(("ok", reply))
            except Exception as error:  # report it to the parent, which raises it
                conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        if game is not None:
            game.close()
        conn.close()


class IsolatedGame:
    """One game in a child process of its own, with the gym env's reset/step/close.

    Why: fast-downward (textworld's PDDL engine) keeps its state in its shared library, and every copy of the
    library has the same SONAME, so all games of one process share one state: two live games corrupt each other
    without an error. alfworld's own batched env avoids this the same way, with a process per game. The child
    is spawned (not forked), which is safe next to threads and CUDA; it costs the import of alfworld per episode.
    """

    def __init__(self, gamefile: str, max_steps: int):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_game, args=(child, gamefile, max_steps), daemon=True)
        self._process.start()
        child.close()

    def _ask(self, *request):
        try:
            self._conn.send(request)
            status, reply = self._conn.recv()
        except (EOFError, OSError) as error:
            self._process.join(timeout=5)  # reaped, so the exit code is known (else it reads None)
            raise RuntimeError(f"the ALFWorld game process died (exit code {self._process.exitcode})") from error
        if status == "error":
            raise RuntimeError(f"the ALFWorld game failed: {reply}")
        return reply

    def reset(self):
        return self._ask("reset")

    def step(self, command: str):
        return self._ask("step", command)

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._ask("close")
            except RuntimeError:
                pass
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


_IN_PROCESS_OWNER: list[weakref.ref] = []
"""Weak reference to the AlfworldEnv (at most one) with a live in-process game; see IsolatedGame for why."""


class AlfworldEnv:
    """One ALFWorld game at a time (the `Environment` protocol)."""

    def __init__(self, config: AlfworldConfig | None = None):
        self.config = config or AlfworldConfig()
        self.max_turns = self.config.max_steps
        self.task: AlfworldTask | None = None
        self.admissible: tuple[str, ...] = ()
        self.steps = 0
        self.done = False
        self._game = None

    def _start(self, gamefile: str):
        """The game for one episode: in a child process (`isolate`), else in this process if no other is live."""
        require_alfworld(self.config.data_dir, splits=())
        if self.config.isolate:
            return IsolatedGame(gamefile, self.config.max_steps)
        owner = _IN_PROCESS_OWNER[0]() if _IN_PROCESS_OWNER else None
        if owner is not None and owner is not self:
            raise RuntimeError(
                "another AlfworldEnv has a live in-process ALFWorld game; fast-downward's state is "
                "per process, so a second one would corrupt it: close() the first, or use "
                "AlfworldConfig(isolate=True)"
            )
        game = open_game(gamefile, self.config.max_steps)
        _IN_PROCESS_OWNER[:] = [weakref.ref(self)]
        return game

    def _observe(self, text: str, infos: dict) -> str:
        commands = [c for c in infos.get("admissible_commands", []) if c != "help"]
        self.admissible = tuple(sorted(set(commands), key=natural_key))
        return format_observation(clean_observation(text), self.admissible)

    def reset(self, task: AlfworldTask) -> str:
        """Load `task`'s game; returns the room, the goal and the admissible commands."""
        if not isinstance(task, AlfworldTask):
            raise TypeError(f"AlfworldEnv.reset needs an AlfworldTask, got {type(task).__name__}")
        self.close()
        self.task, self.admissible, self.steps, self.done = None, (), 0, False
        self._game = self._start(task.gamefile)
        try:
            text, infos = self._game.reset()
        except BaseException:
            # A game that failed to load (a bad game file, a dead child) must not take the next step: closed,
            # step() says "before reset" instead of textworld's error from a half-loaded env.
            self.close()
            raise
        self.task = task
        return self._observe(text, infos)

    def step(self, action: str) -> StepResult:
        """Send one reply to the game; see the module docstring for how it is read and judged."""
        if self._game is None:
            raise RuntimeError("AlfworldEnv.step called before reset(task)")
        if self.done:
            raise RuntimeError(f"AlfworldEnv.step called after the episode ended (task {self.task.task_id})")
        if not isinstance(action, str):
            raise TypeError(f"AlfworldEnv.step needs the action as str, got {type(action).__name__}")
        if self.config.action_format == "tagged":
            command, well_formed = project_action(action, self.config.require_think)
        else:
            command, well_formed = normalize_action(action), True
        text, _score, game_over, infos = self._game.step(command)
        self.steps += 1
        won = bool(infos.get("won", False))
        truncated = not won and (self.steps >= self.max_turns or bool(game_over))
        self.done = won or truncated
        nothing = text.strip() == NOTHING
        verb = command.split()[0] if command.split() else ""
        info = StepInfo(
            tool=verb if well_formed and verb in ALFWORLD_VERBS else "",
            invalid_action=nothing or not well_formed,
            extra={"won": won, "truncated": truncated, "steps": self.steps, "command": command},
        )
        return StepResult(observation=self._observe(text, infos), done=self.done, reward=1.0 if won else 0.0, info=info)

    def close(self) -> None:
        """Close the running game (and its process), if any."""
        if self._game is not None:
            self._game.close()
        self._game = None
        if _IN_PROCESS_OWNER and _IN_PROCESS_OWNER[0]() in (self, None):
            _IN_PROCESS_OWNER.clear()
