"""What the trainer needs of an environment family, behind one small record.

`make_suite(env_cfg)` turns `env.name` + `env.options` into: the task source (train / held-out splits), a
factory of fresh environment instances (one per concurrent episode), texts to build a tokenizer from, and the
scripted expert for the supervised warm start. `swe` reads its tasks from `options.tasks_file` (a JSONL/Parquet
task file, e.g. R2E-Gym's; default: the six shipped tasks) and takes SWEConfig's nested sections (`docker`,
`local`, `tools`) as nested dicts; `alfworld` needs the `alfworld` package and its games on disk (its
`data_dir` option) and, having no expert transcripts, a checkpoint rather than a tiny model. The families stay
independent modules; `family_config` and `make_suite` are the only places that know all of them, plain if/elif
rather than a registry. A family with a scripted expert (minirepo, textgame, recall) exposes it in one shape,
`expert_action(env, rng, noise) -> str`, and its tokenizer corpus as `sample_texts(config, n, noise, seed)`, so
`make_suite` builds their suites alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from trainer.environments.protocol import Environment, StepResult, TaskSource
from trainer.knobs import ConfigError, build_config


@dataclass
class Demonstration:
    """An expert episode: the first observation, then (action, result) per turn."""

    first_observation: str
    steps: list[tuple[str, StepResult]]

    @property
    def reward(self) -> float:
        return self.steps[-1][1].reward if self.steps else 0.0


@dataclass
class EnvSuite:
    name: str
    tasks: TaskSource
    make_env: Callable[[], Environment]
    sample_texts: Callable[[], list[str]]
    """Texts (expert transcripts) to train the tiny models' tokenizer on; deterministic."""
    demonstrate: Callable[[object, float, random.Random], Demonstration] | None = None
    """Play `task` with the scripted expert at a noise level (for the warm start); None if the family has none."""


def family_config(name: str, options: dict):
    """The family's config dataclass built from `env.options` (typed like the cell's own config, `build_config`),
    and nothing else: no task, no environment. An unknown key, a value of the wrong type or one the family rejects
    raises ValueError, named. Light (no torch, no Docker, no ALFWorld):
    the workflow calls it before any job starts, `make_suite` when one does."""
    options = dict(options)
    if name == "minirepo":
        from trainer.environments.minirepo import MiniRepoConfig as config_class
    elif name == "textgame":
        from trainer.environments.textgame import TextGameConfig as config_class
    elif name == "swe":
        from trainer.environments.swe.env import SWEConfig as config_class

        options.pop("tasks_file", None)  # the task source's, not the sandbox's
    elif name == "alfworld":
        from trainer.environments.alfworld_adapter import AlfworldConfig as config_class
    elif name == "recall":
        from trainer.environments.recall import RecallConfig as config_class
    else:
        raise ValueError(
            f"env.name {name!r}: known families are 'minirepo', 'textgame', 'swe', 'alfworld' and 'recall'"
        )
    try:
        return build_config(config_class, options, "env.options")
    except ConfigError as e:
        raise ConfigError(f"{e} ({name})") from None


def _no_tokenizer_corpus(family: str):
    def texts() -> list[str]:
        raise ValueError(
            f"env.name {family!r} has no corpus to build a tiny model's tokenizer from: give the "
            "model as a checkpoint (model.path), as paper-scale studies do"
        )

    return texts


def _demonstrator(
    make_env: Callable[[], Environment], expert_action: Callable, episode_rng: bool = False
) -> Callable[[object, float, random.Random], Demonstration]:
    """`demonstrate(task, noise, rng)`: one episode of `task` on a fresh environment, every action
    `expert_action(env, rng, noise)`. With `episode_rng` the expert draws from its own Random per episode, seeded
    by one `rng.randrange(2 ** 31)` (textgame's demonstrations are drawn so), else from `rng` itself."""

    def demonstrate(task, noise: float, rng: random.Random) -> Demonstration:
        env = make_env()
        if episode_rng:
            rng = random.Random(rng.randrange(2**31))
        demo = Demonstration(env.reset(task), [])
        while not env.done:
            action = expert_action(env, rng, noise)
            demo.steps.append((action, env.step(action)))
        return demo

    return demonstrate


def _leave_out_absent_images(tasks, config, probe_tasks: int) -> None:
    """Drop the swe tasks (and the `probe_tasks` probe variants the cell will play) whose image cannot be had by
    `docker.pull`, saying so on stderr, so one absent image costs its task, not the cell."""
    import sys

    from trainer.environments.swe.containers import docker_client
    from trainer.environments.swe.docker_backend import missing_images
    from trainer.environments.swe.tasks import impossible_variant

    variants = [v for v in map(impossible_variant, tasks.tasks("heldout", probe_tasks)) if v is not None]
    absent = missing_images(docker_client(config.docker.start_timeout_s), tasks.all + variants, config.docker)
    for task_id, why in absent.items():
        print(f"[swe] task {task_id!r} left out: {why}", file=sys.stderr, flush=True)
    tasks.keep(absent)


def make_suite(env_cfg) -> EnvSuite:
    name, options = env_cfg.name, dict(env_cfg.options)
    config = family_config(name, options)  # an unknown family, option or value raises here, named
    if name in ("minirepo", "textgame", "recall"):  # the families with a scripted expert, all of one shape
        if name == "minirepo":
            from trainer.environments import minirepo as family

            env_class, tasks_class, texts = family.MiniRepoEnv, family.MiniRepoTasks, {"n": 300, "noise": 0.2}
        elif name == "textgame":
            from trainer.environments import textgame as family

            env_class, tasks_class, texts = family.TextGameEnv, family.TextGameTasks, {"n": 300, "noise": 0.3}
        else:
            from trainer.environments import recall as family

            env_class, tasks_class, texts = family.RecallEnv, family.RecallTasks, {"n": 200, "noise": 0.3}

        def make_env():
            return env_class(config)

        return EnvSuite(
            name,
            tasks_class(config),
            make_env,
            lambda: family.sample_texts(config, seed=0, **texts),
            _demonstrator(make_env, family.expert_action, episode_rng=name == "textgame"),
        )
    if name == "swe":
        from trainer.environments.swe.env import SWEEnv
        from trainer.environments.swe.tasks import SWETasks

        tasks = SWETasks(options.get("tasks_file"), config.row_kind)
        if config.backend == "docker":
            _leave_out_absent_images(tasks, config, env_cfg.probe_tasks)
        return EnvSuite(name, tasks, lambda: SWEEnv(config), lambda: [task.issue for task in tasks.tasks("train")])
    from trainer.environments.alfworld_adapter import AlfworldEnv, AlfworldTasks  # family_config knows no other

    return EnvSuite(name, AlfworldTasks(config), lambda: AlfworldEnv(config), _no_tokenizer_corpus(name))
