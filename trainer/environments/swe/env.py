"""SWEEnv: R2E-Gym's bug-fixing episode behind the harness's Environment protocol.

reset(task) starts a sandbox (a temporary copy of the repository, or a container from the task's image) and
returns the instruction: the repository root, the issue, the tool format. Each step parses one action, runs it
with the tools and returns R2E-Gym's observation string. The episode ends at `finish` or at
`max_turns`; it is then graded by running the hidden tests (R2E-Gym grades a trajectory that ran out of steps
as well, so `grade_on_turn_limit` defaults to True) and the sandbox is released at once, so a container never
outlives its episode. Step rewards are 0; the final step carries 1.0 or 0.0. An episode the rollout engine cuts at
its token budget is graded too (`truncated_reward`, `grade_on_truncation`), since R2E-Gym grades every trajectory;
so is one that passes `max_episode_s` of sandbox time (R2E-Gym's `max_total_time`, off by default here).

StepInfo flags, for the paper's tool penalty: `invalid_action` for no call, a malformed call, an unknown tool,
a missing or unknown parameter, a blocked command; `exec_error` for a tool error (file not found, no unique
match, ...), a timeout, an output flood, or a sandbox failure. A nonzero bash exit counts as an execution error
only with `nonzero_exit_is_error=True`: reproducing a bug legitimately exits nonzero, so the default is the
lenient reading (the flag keeps the strict reading available); `info.extra["exit_code"]` has it either way.
A sandbox that fails (not the agent's doing, e.g. the engine dies) ends the episode with reward 0 and
`extra["sandbox_error"]` set, rather than raising inside the rollout loop. A container that does not start, or a
grading that fails, is tried once more; then the episode fails alone (EpisodeStartError from `reset`, `failed` in
`last_grading`), and the rollout leaves it out of the batch with the reason.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

from trainer.environments.protocol import EpisodeStartError, StepInfo, StepResult
from trainer.environments.swe.docker_backend import DockerBackend, DockerConfig
from trainer.environments.swe.grading import (
    GRADINGS,
    Grade,
    grade,
    grade_swebench,
    parse_pytest_report,
    parse_swebench_log,
    read_report,
)
from trainer.environments.swe.local_backend import LocalBackend, LocalConfig
from trainer.environments.swe.sandbox import SandboxError
from trainer.environments.swe.tamper import TAMPER_POLICIES, dynamic_flags
from trainer.environments.swe.tasks import ROW_KINDS, SWETask
from trainer.environments.swe.tools import Tools, ToolSettings, decode_output

BACKENDS = ("local", "docker")
log = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = """Repository root: {repo_dir}

<github_issue>
{issue}
</github_issue>

Make minimal changes to non-test files in {repo_dir} so that the issue is resolved; hidden tests decide success.
Call exactly one tool per turn, in this format:
<function=TOOL_NAME>
<parameter=KEY>VALUE</parameter>
</function>
Tools and their parameters:
- execute_bash: cmd (a shell command, run with /bin/sh in {repo_dir}, at most {timeout:g}s; cd, pip, ipython,
  jupyter, nohup are refused)
- search: search_term, path (optional; default: the repository root)
- file_editor: command (view | create | str_replace | insert | undo_edit), path,
  file_text, old_str, new_str, insert_line, view_range, concise
- finish: command=submit, when you are done (your changes are then tested)
You have at most {max_turns} turns."""


@dataclass
class SWEConfig:
    """Settings of the swe environment."""

    backend: str = "local"
    """"local" (temporary directory, subprocesses; not a security boundary) or "docker" (one container per episode)."""
    row_kind: Literal["auto", "r2e", "swebench"] = "auto"
    """How the task file's rows are read and graded: "r2e", "swebench", or "auto" (from each row's fields; see
    `tasks.py`)."""
    max_turns: int = 40
    """Actions per episode (R2E-Gym's README runs use max_steps 40)."""
    on_tamper: Literal["zero", "keep"] = "zero"
    """The reward of an episode with tamper flags (`tamper.py`): 0 ("zero", for training: a forged grade must not
    pay), or as graded ("keep", to measure how often a forgery would have paid). The flags are recorded either way."""
    grading: Literal["report", "r2e_gym_log"] = "report"
    """How an R2E-Gym row's test statuses are read. "report" (default): from the report of the launcher pytest runs
    through (`report_launcher.py`: each test's outcome from pytest's own objects, not the log's text), with the
    log's R2E-Gym reading made beside it (a disagreement is a tamper flag); a row whose test script does not run
    `python -m pytest` is read from its log, and says so (`grading_reading`). "r2e_gym_log": R2E-Gym's own way,
    the log read by substring, which the tested code can forge by printing. SWE-bench rows are always read from
    their log (their images' scripts run other test runners). Either way the agent's changes are scanned and
    compared (`tamper.py`)."""
    reward_timeout_s: float = 300.0
    """Wall-clock limit of the hidden test run (R2E-Gym and rllm: 300 s); a timeout grades 0."""
    grade_on_turn_limit: bool = True
    """Grade the final state when the turn or time limit ends the episode (R2E-Gym does); False gives 0 without
    testing."""
    max_episode_s: float | None = None
    """End (and grade) the episode once its tool calls have taken this many seconds together. R2E-Gym stops a
    trajectory at 1,200 s counting the model's time too; the model's time is the rollout engine's, not the
    environment's, so it is not counted here. None (default): no limit, so episodes do not depend on the machine's
    speed."""
    grade_on_truncation: bool = True
    """Grade the final state when the rollout's token budget ends the episode (R2E-Gym grades every trajectory);
    False gives 0 without testing."""
    nonzero_exit_is_error: bool = False
    """Count a nonzero bash exit status as an execution error (the literal reading of the tool penalty)."""
    tools: ToolSettings = field(default_factory=ToolSettings)
    local: LocalConfig = field(default_factory=LocalConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    instruction_template: str = DEFAULT_INSTRUCTION
    """Formatted with repo_dir, issue, timeout, max_turns."""
    steps_remaining: bool = True
    """Append R2E-Gym's countdown to the instruction and to every observation the episode goes on from
    ("\nSteps Remaining: N", then "\nYou have reached the maximum number of steps. Please submit your answer NOW."
    once N reaches 0), as its agent loop does."""
    countdown_steps: int | None = None
    """The N the countdown starts from: R2E-Gym's `max_steps` (40), while `max_turns` is its `max_steps_absolute`
    (50), so the last turns see the "submit NOW" line. None: `max_turns`."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"SWEConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.max_turns < 1:
            raise ValueError(f"SWEConfig.max_turns must be >= 1, got {self.max_turns}")
        if self.row_kind not in ROW_KINDS:
            raise ValueError(f"SWEConfig.row_kind must be one of {ROW_KINDS}, got {self.row_kind!r}")
        if self.countdown_steps is not None and self.countdown_steps < 1:
            raise ValueError(f"SWEConfig.countdown_steps must be >= 1 or None, got {self.countdown_steps}")
        if self.max_episode_s is not None and self.max_episode_s <= 0:
            raise ValueError(f"SWEConfig.max_episode_s must be positive or None, got {self.max_episode_s}")
        if self.grading not in GRADINGS:
            raise ValueError(f"SWEConfig.grading must be one of {GRADINGS}, got {self.grading!r}")
        if self.on_tamper not in TAMPER_POLICIES:
            raise ValueError(f"SWEConfig.on_tamper must be one of {TAMPER_POLICIES}, got {self.on_tamper!r}")
        if self.reward_timeout_s <= 0:
            raise ValueError(f"SWEConfig.reward_timeout_s must be positive, got {self.reward_timeout_s}")


class SWEEnv:
    """One episode at a time on one backend; create one instance per concurrent episode."""

    def __init__(self, config: SWEConfig | None = None, docker_client=None):
        self.config = config or SWEConfig()
        self.max_turns = self.config.max_turns
        self._docker_client = docker_client
        self.backend: LocalBackend | DockerBackend | None = None
        self.tools: Tools | None = None
        self.task: SWETask | None = None
        self.turn = 0
        self.elapsed_s = 0.0
        """Seconds the episode's tool calls have taken together (for `max_episode_s`)."""
        self.done = False
        self.last_grade: Grade | None = None
        self.last_test_log = ""
        self.last_grading: dict | None = None
        """What grading the last episode saw (reward, reading, tamper flags, changes); None until it is graded."""

    @property
    def repo_dir(self) -> str:
        """Where the repository is, as the agent sees it ("" before reset)."""
        return self.backend.repo_dir if self.backend is not None else ""

    def _make_backend(self) -> LocalBackend | DockerBackend:
        if self.config.backend == "docker":
            return DockerBackend(self.config.docker, client=self._docker_client)
        return LocalBackend(self.config.local)

    def reset(self, task: SWETask) -> str:
        """Start an episode on `task` in a fresh sandbox; returns the instruction."""
        if not isinstance(task, SWETask):
            raise TypeError(f"task must be an SWETask, got {type(task).__name__}")
        if task.kind == "swebench" and self.config.backend != "docker":
            raise ValueError(
                f"task {task.task_id!r} is a SWE-bench row: its tests run by its image's /run_tests.sh, "
                "so it needs env.options.backend: docker"
            )
        self.close()
        if self.backend is None:
            self.backend = self._make_backend()
        for attempt in (1, 2):  # a container that fails to start (the engine, a pull) is tried once more
            try:
                self.backend.start(task)
                break
            except SandboxError as exc:
                log.warning("task %s: the sandbox did not start (try %d of 2): %s", task.task_id, attempt, exc)
                if attempt == 2:
                    raise EpisodeStartError(
                        f"task {task.task_id!r}: the sandbox did not start (twice): {exc}"
                    ) from None
        self.tools = Tools(self.backend, self.config.tools)
        self.task, self.turn, self.done, self.elapsed_s = task, 0, False, 0.0
        self.last_grade, self.last_test_log, self.last_grading = None, "", None
        instruction = self.config.instruction_template.format(
            repo_dir=self.backend.repo_dir,
            issue=task.issue,
            timeout=self.config.tools.command_timeout_s,
            max_turns=self.max_turns,
        )
        return instruction + self._countdown()

    def _countdown(self) -> str:
        """R2E-Gym's line after each message the agent answers (`steps_remaining`), "" when it is off."""
        if not self.config.steps_remaining:
            return ""
        left = (self.config.countdown_steps or self.max_turns) - self.turn
        return (
            f"\nSteps Remaining: {left}"
            if left > 0
            else "\nYou have reached the maximum number of steps. Please submit your answer NOW."
        )

    def step(self, action: str) -> StepResult:
        """Execute one action; the last step of an episode carries the graded reward."""
        if self.task is None:
            raise RuntimeError("step() before reset(): start an episode first")
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset() for a new one")
        self.turn += 1
        started = time.monotonic()
        try:
            result = self.tools.run(action)
        except SandboxError as exc:
            self._finish_episode()
            return StepResult(
                f"The sandbox failed ({exc}); the episode ends.",
                True,
                0.0,
                StepInfo(exec_error=True, extra={"turn": self.turn, "sandbox_error": str(exc)}),
            )
        extra = dict(result.extra, turn=self.turn)
        if result.exit_code is not None:
            extra["exit_code"] = result.exit_code
        self.elapsed_s += time.monotonic() - started
        out_of_time = self.config.max_episode_s is not None and self.elapsed_s >= self.config.max_episode_s
        done = result.done or self.turn >= self.max_turns or out_of_time
        reward = 0.0
        if done:
            extra["turn_limit"] = not result.done and self.turn >= self.max_turns
            extra["time_limit"] = not result.done and out_of_time
            if result.done or self.config.grade_on_turn_limit:
                reward = self._grade(extra)
            self._finish_episode()
        exec_error = result.error or result.timed_out or (result.nonzero_exit and self.config.nonzero_exit_is_error)
        info = StepInfo(
            tool=result.tool,
            invalid_action=result.invalid,
            exec_error=exec_error,
            timed_out=result.timed_out,
            extra=extra,
        )
        return StepResult(result.observation if done else result.observation + self._countdown(), done, reward, info)

    def truncated_reward(self) -> float:
        """The reward of an episode the rollout engine cut at its token budget: the repository as it stands,
        graded (`grade_on_truncation`), and the sandbox released."""
        if self.task is None or self.done:
            return 0.0
        extra: dict = {}
        reward = self._grade(extra) if self.config.grade_on_truncation else 0.0
        self._finish_episode()
        return reward

    def _grade(self, extra: dict) -> float:
        """Run the hidden tests (a failed run is tried once more), read the statuses, collect the tamper flags
        (`tamper.py`) and apply `on_tamper`. What grading saw goes into `extra` and `self.last_grading`."""
        hardened = self.config.grading == "report" and self.task.kind != "swebench"
        key = secrets.token_hex(32).encode() if hardened else None
        test_run = None
        for attempt in (1, 2):
            try:
                test_run = self.backend.run_tests(self.config.reward_timeout_s, key, exempt=self.task.fix_files)
                break
            except SandboxError as exc:
                log.warning("task %s: grading failed (try %d of 2): %s", self.task.task_id, attempt, exc)
                extra["sandbox_error"] = str(exc)
        if test_run is None:
            extra["episode_failed"] = f"grading failed twice: {extra['sandbox_error']}"
            self.last_grading = {"failed": extra["episode_failed"]}
            return 0.0
        extra.pop("sandbox_error", None)
        run = test_run.log
        self.last_test_log = decode_output(run.stdout + b"\n" + run.stderr)
        flags = list(test_run.flags)
        reading = "log"
        readings: dict[str, float] = {}
        if self.task.kind == "swebench":
            parsed = (
                {} if run.timed_out else parse_swebench_log(self.last_test_log, self.task.repo_name, self.task.version)
            )
            self.last_grade = grade_swebench(
                parsed, self.task.repo_name, self.task.fail_to_pass, self.task.pass_to_pass
            )
        else:
            by_log = grade({} if run.timed_out else parse_pytest_report(self.last_test_log), self.task.expected)
            self.last_grade = by_log
            readings["log"] = by_log.reward
            if hardened and not test_run.launcher:
                reading = "log (the row's test script does not run python -m pytest)"
            elif test_run.launcher:
                reading = "report"
                report = read_report(test_run.report, key, run.exit_code)
                self.last_grade = grade({} if run.timed_out else report.statuses, self.task.expected)
                readings["report"] = self.last_grade.reward
                if report.problem and not run.timed_out:
                    extra["report_problem"] = report.problem
                    if report.problem.startswith(("line ", "the report's records")):
                        flags.append(f"report forged: {report.problem}")
                flags += dynamic_flags(report.observations, set(test_run.changed))
                if by_log.reward != self.last_grade.reward:
                    flags.append(
                        f"readings disagree: the report gives {self.last_grade.reward:.0f}, the log "
                        f"{by_log.reward:.0f} ({report.problem or 'the statuses differ'})"
                    )
        graded = self.last_grade.reward
        reward = 0.0 if flags and self.config.on_tamper == "zero" else graded
        if flags:
            log.warning("task %s: graded %.0f, tamper flags: %s", self.task.task_id, graded, "; ".join(flags))
        self.last_grading = {
            "reward": reward,
            "graded_reward": graded,
            "reading": reading,
            "readings": readings,
            "tamper_flags": flags,
            "changes": test_run.changes,
        }
        extra.update(
            tests_timed_out=run.timed_out,
            tests_missing=self.last_grade.missing,
            tests_unexpected=self.last_grade.unexpected,
            tests_mismatched=sorted(self.last_grade.mismatched),
            tamper_flags=flags,
            grading_reading=reading,
        )
        if test_run.changes is not None:
            extra["changes"] = test_run.changes
        return reward

    def _finish_episode(self) -> None:
        self.done = True
        if self.backend is not None:
            self.backend.close()

    def close(self) -> None:
        """Release the sandbox (the container or temporary directory) of the current episode, if any."""
        if self.backend is not None:
            self.backend.close()
        self.tools = None
        self.done = True
