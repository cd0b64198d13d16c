"""The `swe` environment: R2E-Gym's tool interface on a local or Docker sandbox, with shipped bug-fix tasks.

Modules, each readable alone: `tools` (action parsing, the four tools, observation strings), `sandbox` (the
protocol the tools run on and its shared types), `supervisor` (the program every command runs under),
`local_backend` and `docker_backend` (the two sandboxes), `containers` (the Docker containers' ownership and
cleanup, the engine client), `grading` (pytest log or the launcher's report -> statuses -> reward),
`report_launcher` (pytest run inside the sandbox, its outcomes reported), `workdiff` (what the agent changed; the
tree the hidden tests run on, its test infrastructure restored), `tamper` (tamper flags), `tasks` (task entries from
JSONL or Parquet; the shipped tasks), `oracle` (scripted agents acting through the tools), `env` (SWEEnv, the
protocol), `image` (building the shipped Docker images: `python -m trainer.environments.swe.image`), `standins`
(R2E-Gym-layout stand-in images and rows), `pull` (a task file's images), `preflight` (each repository's rows
graded with their own fix and none, before a study).
"""

from trainer.environments.swe.containers import cleanup_stale_containers
from trainer.environments.swe.docker_backend import DockerBackend, DockerConfig
from trainer.environments.swe.env import SWEConfig, SWEEnv
from trainer.environments.swe.grading import grade, parse_pytest_report
from trainer.environments.swe.local_backend import LocalBackend, LocalConfig
from trainer.environments.swe.oracle import noop_actions, oracle_actions, patch_actions
from trainer.environments.swe.sandbox import ExecResult, SandboxError
from trainer.environments.swe.tasks import SWETask, SWETasks, load_tasks, shipped_tasks_path
from trainer.environments.swe.tools import Action, ToolSettings, format_action, parse_action

__all__ = [
    "Action",
    "DockerBackend",
    "DockerConfig",
    "ExecResult",
    "LocalBackend",
    "LocalConfig",
    "SWEConfig",
    "SWEEnv",
    "SWETask",
    "SWETasks",
    "SandboxError",
    "ToolSettings",
    "cleanup_stale_containers",
    "format_action",
    "grade",
    "load_tasks",
    "noop_actions",
    "oracle_actions",
    "parse_action",
    "parse_pytest_report",
    "patch_actions",
    "shipped_tasks_path",
]
