"""R2E-Gym's four tools with R2E-Gym's observation strings, byte for byte by default.

The reference is R2E-Gym/R2E-Gym at 69bc953 (its agent loop, environment, Docker runtime and the tool scripts in
`src/r2egym/agenthub/tools/`); `tests/unit/test_swe_tools.py` replays 72 actions whose observations were recorded by
running that code (`tests/data/r2e_tools/record.py`). How R2E-Gym turns a response into an observation, and so
does this module:

- The call (`Agent.parse_response`, `Action.from_string`): the first `<function=...</function>` block (without
  `</function>` there is no call); its name is the first `<function=NAME>`; its parameters every
  `<parameter=KEY>VALUE</parameter>` in the block, keys and values `strip()`ped (so a str_replace loses the
  indentation of its first line on both sides), a repeated key keeping its last value.
- No call: R2E-Gym's reminder (NO_CALL_MESSAGE). A name that is not one of the four tools (`submit` too):
  R2E-Gym's agent loop shows the Python error its environment raises then (UNKNOWN_TOOL_MESSAGE).
- A tool is a script run as `TOOL [COMMAND] --KEY VALUE ...` (`command` positional, the other parameters as
  options in the order given) that parses them with argparse. So each tool here parses them with an argparse
  parser of the script's options: a missing, unknown, ambiguous or ill-typed parameter gives argparse's usage and
  error lines, an option's prefix stands for it (`<parameter=c>` is `--cmd`), a value that looks like an option
  (`--verbose`) is refused as argparse refuses it.
- The runtime (`DockerRuntime.run`): exit status 124 reads as a timeout ("The command took too long to execute
  (>Ts)", code -1), another nonzero status as "Error: Exit code N", and on exit 0 ANSI colour codes and \\r are
  removed. `Observation.__str__`: "Exit code: {code}\\nExecution output of [execute_bash]:\\n{output}" with an
  output of more than 2*40 lines cut to its first and last 40 around R2E-Gym's marker;
  "Execution output of [TOOL]:\\n{output}" for file_editor and search; "<<< Finished >>>" for finish. An output
  ends with the newline the script's print() adds.
- execute_bash (`cmd`): a first word in `cd ipython jupyter pip nohup` is refused (exit 1); otherwise the command
  runs with /bin/sh (the script's subprocess has shell=True), its stdout and stderr are read as text (universal
  newlines), stripped and shown as "[STDOUT]\\n\\n{out} \\n\\n[STDERR]\\n\\n{err}\\n", after
  "Error executing command:\\n\\n" when it exits nonzero; the script exits with the command's status.
- file_editor (view / create / str_replace / insert / undo_edit, R2E-Gym's file_editor.py): only .py files can be
  viewed, a directory view lists directories and *.py files two levels deep, a .py file of more than 110 lines is
  condensed unless a view_range is given, a view is clipped at 10,000 characters, files are read with universal
  newlines (an edit writes \\n line ends), the undo history is kept per path as spelled, `enable_linting` refuses
  an edit of a .py file that does not parse.
- search (search.py): in a directory, the lines containing the term in its non-hidden .py files (`python_only` is
  a string, so only an empty value widens it to all files), counted per file, more than 100 files refused; in a
  file, `grep -n TERM FILE`.

Deliberate differences are options of ToolSettings, with R2E-Gym's behaviour as their default: `shell`,
`view_non_python`, `require_function_close`, `explain_unknown_tool`, `clean_control_characters` and
`max_observation_chars` (see each). The sandbox's own limits (per-command timeout and process-group kill, the
backends' output caps) show only when hit: a command stopped for flooding its output gets a note after its
output, and output past the backend's `capture_bytes` is cut in the middle with a note.

Where R2E-Gym's string depends on its image or is a crash, this module cannot match it byte for byte:
- Listings and search results are sorted within each directory; R2E-Gym's follow the file system's order.
- Python's own texts (argparse's usage lines, SyntaxError messages, the two tracebacks kept below) are those of
  Python 3.11; R2E-Gym runs its scripts with the image's Python.
- file_editor without `path`: R2E-Gym prints a traceback through the image's pathlib before the "ERROR: Unhandled
  exception: ..." line; only that line is shown here. A read or write that fails shows the sandbox's message
  where R2E-Gym shows Python's OSError text. A path that is neither a file nor a directory (a FIFO) is refused.
- Files are read as UTF-8 (R2E-Gym guesses the encoding with chardet): a view shows undecodable bytes as U+FFFD,
  an edit refuses the file. Command output that is not UTF-8 shows U+FFFD where R2E-Gym's script crashes.
- A command killed by signal N exits 128+N (R2E-Gym: 256-N when the shell execs the command).
- search does not resolve symlinks in the path it shows and, in a directory, skips symlinks it meets inside.
- Parameter names are not passed through a shell (R2E-Gym's command line leaves them unquoted); help output
  (`<parameter=h>`) lacks the scripts' descriptions.
- An unknown tool at the first step ends R2E-Gym's agent loop with a NameError; here it is an observation.
"""

from __future__ import annotations

import argparse
import ast
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from trainer.environments.swe.pyparse import parse
from trainer.environments.swe.sandbox import ExecResult, Sandbox, SandboxFileError

TOOL_NAMES = ("execute_bash", "file_editor", "search", "finish")
"""The tools, in the order the instruction lists them."""

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")

BLOCKED_COMMANDS = ("cd", "ipython", "jupyter", "pip", "nohup")
"""First words execute_bash refuses (R2E-Gym's BLOCKED_BASH_COMMANDS)."""

NO_CALL_MESSAGE = (
    "\nYou forgot to use a function call in your response. \nYOU MUST USE A FUNCTION CALL IN EACH "
    "RESPONSE.\n\nIMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n"
)
"""R2E-Gym's CONTINUE_MSG, the observation of a response without a call."""
UNKNOWN_TOOL_MESSAGE = "cannot access local variable 'bash_output' where it is not associated with a value"
"""What R2E-Gym's agent shows for a call to another tool: `RepoEnv.run_action` catches its own "Invalid Action"
assertion and then returns a variable it never set; the agent loop makes the error the observation."""
UNKNOWN_TOOL_EXPLAINED = (
    "Invalid Action: input action must be one of allowed actions \n Allowed actions: "
    "['file_editor', 'search', 'execute_bash', 'finish'] \n Input action: {name}\t"
)
"""The message of that assertion, shown with `explain_unknown_tool`."""
FINISHED = "<<< Finished >>>"
TRUNCATION_DIVIDER = "-" * 50
LINE_TRUNCATION_MARKER = "<Observation truncated in middle for saving context>"
CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
    "numbers of what you are looking for.</NOTE>"
)
SNIPPET_LINES = 4
CONCISE_AFTER_LINES = 110
"""R2E-Gym views .py files longer than this in condensed form unless a view_range is given."""
LINT_ERROR = (
    "Your proposed edit has introduced new syntax error(s).\nPlease read this error message carefully "
    "and then retry editing the file.\nERRORS:\n"
)
OUTPUT_LIMIT_NOTE = "[The command was stopped: its output passed the sandbox's limit.]\n"
"""Ours: added after the output of a command the sandbox stopped for flooding it."""

# The two tracebacks of R2E-Gym's scripts a plausible call triggers (Python 3.11, the scripts at 69bc953 installed
# in /usr/local/bin): an empty `cmd` (R2E-Gym's prompt suggests one to "retrieve more logs"), an insert without
# `insert_line`.
EMPTY_CMD_TRACEBACK = (
    'Traceback (most recent call last):\n  File "/usr/local/bin/execute_bash", line 66, in <module>\n    main()\n'
    '  File "/usr/local/bin/execute_bash", line 41, in main\n    first_token = args.cmd.strip().split()[0]\n'
    "                  ~~~~~~~~~~~~~~~~~~~~~~~~^^^\nIndexError: list index out of range\n"
)
_NONE_LT_INT = "'<' not supported between instances of 'NoneType' and 'int'"
INSERT_WITHOUT_LINE_TRACEBACK = (
    'Traceback (most recent call last):\n  File "/usr/local/bin/file_editor", line 711, in main\n'
    "    result = editor.run(\n             ^^^^^^^^^^^\n"
    '  File "/usr/local/bin/file_editor", line 174, in run\n    return self.insert(path, insert_line, new_str)\n'
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/usr/local/bin/file_editor", line 516, in insert\n'
    "    if insert_line < 0 or insert_line > len(file_text_lines):\n       ^^^^^^^^^^^^^^^\n"
    f"TypeError: {_NONE_LT_INT}\nERROR: Unhandled exception: {_NONE_LT_INT}\n"
)


class ActionParseError(ValueError):
    """The text holds no function call."""

    def __init__(self, message: str, name: str = "", no_call: bool = True):
        super().__init__(message)
        self.name = name
        self.no_call = no_call


@dataclass(frozen=True)
class Action:
    name: str
    params: dict[str, str]
    n_calls: int = 1
    """How many `<function=` tags the text had (only the first call is executed)."""


_CALL = re.compile(r"(?s)(<function=.*?</function>)")
_FUNCTION = re.compile(r"<function\s*=\s*([^>]+)>")
_PARAMETER = re.compile(r"<parameter\s*=\s*([^>]+)>(.*?)</parameter>", re.DOTALL)


def parse_action(text: str, require_close: bool = True) -> Action:
    """The first call in `text`, as R2E-Gym reads it; raises ActionParseError when there is none.
    `require_close=False` also takes a call whose `</function>` is missing (up to the end of the text)."""
    if not isinstance(text, str):
        raise TypeError(f"action must be a str, got {type(text).__name__}")
    match = _CALL.search(text)
    if match:
        block = match.group(1)
    else:
        start = text.find("<function=")
        block = text[start:] if start >= 0 and not require_close else ""
    name_match = _FUNCTION.search(block)
    name = name_match.group(1).strip() if name_match else ""
    if not name:
        raise ActionParseError("no function call found")
    params = {key.strip(): value.strip() for key, value in _PARAMETER.findall(block)}
    return Action(name, params, n_calls=text.count("<function="))


def format_action(name: str, params: dict[str, str] | None = None) -> str:
    """The text of a call, as a policy would write it (used by scripted agents and tests)."""
    lines = [f"<function={name}>"]
    lines += [f"<parameter={key}>{value}</parameter>" for key, value in (params or {}).items()]
    lines.append("</function>")
    return "\n".join(lines)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_R2E_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")
"""What R2E-Gym's runtime removes from the output of a call that exits 0."""


def sanitize(text: str) -> str:
    """Drop ANSI escape sequences and \\r; replace other control characters (except \\n and \\t) by U+FFFD."""
    return _CONTROL.sub("\ufffd", _ANSI.sub("", text).replace("\r", ""))


def decode_output(data: bytes) -> str:
    """Bytes from a command -> clean text (invalid UTF-8 becomes U+FFFD), for logs."""
    return sanitize(data.decode("utf-8", errors="replace"))


def _text(data: bytes) -> str:
    """Bytes -> text as Python's text mode reads them: UTF-8 (U+FFFD where invalid), universal newlines."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def truncate_lines(text: str, keep: int = 40) -> str:
    """R2E-Gym's bash rule: more than 2*keep lines keep the first and last `keep` around a marker."""
    lines = text.splitlines()
    if len(lines) <= 2 * keep:
        return text
    return "\n".join(lines[:keep] + [TRUNCATION_DIVIDER, LINE_TRUNCATION_MARKER, TRUNCATION_DIVIDER] + lines[-keep:])


def clip_chars(text: str, limit: int) -> str:
    """Keep the first and last limit/2 characters of an over-long text, with a note of what was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n<... {len(text) - 2 * half} characters omitted ...>\n{text[len(text) - half :]}"


def _clip_file_text(content: str, limit: int) -> str:
    return content if len(content) <= limit else content[:limit] + CLIPPED


@dataclass
class ToolSettings:
    """How the tools run; every default is R2E-Gym's behaviour (the module docstring lists what it is)."""

    command_timeout_s: float = 90.0
    """Wall-clock limit of one tool call (R2E-Gym's agent runs each under `timeout 90`, its max_exec_time)."""
    observation_lines: int = 40
    """execute_bash keeps this many first and last lines of a longer output (R2E-Gym: 40)."""
    file_view_chars: int = 10_000
    """file_editor output clip (R2E-Gym's MAX_RESPONSE_LEN)."""
    blocked_commands: tuple[str, ...] = BLOCKED_COMMANDS
    """First words execute_bash refuses (R2E-Gym's list)."""
    max_search_files: int = 100
    """search over a directory gives up listing when more files than this match (R2E-Gym: 100)."""
    shell: str = "/bin/sh"
    """execute_bash runs `SHELL -c CMD`: R2E-Gym's script uses subprocess's shell=True, i.e. /bin/sh (dash on
    Debian and Ubuntu images: no `[[`, `source` or brace expansion); "bash" for bash."""
    view_non_python: bool = False
    """True: file_editor views any file and lists all files in a directory (R2E-Gym's editor with
    python_only=False, which its command line never sets); False: R2E-Gym's refusal."""
    require_function_close: bool = True
    """False: a call whose `</function>` is missing (say, an action cut at the token limit) runs up to the end of
    the text; R2E-Gym treats it as no call."""
    explain_unknown_tool: bool = False
    """True: a call to an unknown tool is answered with the allowed tools (R2E-Gym's own assertion message) instead
    of the Python error R2E-Gym's agent loop shows."""
    clean_control_characters: bool = False
    """True (ours, for robustness): ANSI escape sequences and \\r are removed from every observation and other
    control characters become U+FFFD; R2E-Gym removes ANSI colour codes and \\r only when a call exits 0."""
    max_observation_chars: int | None = None
    """A cap on one observation's characters (head and tail kept, ours: a single 10 MB line passes the 40+40 line
    rule whole); None, as in R2E-Gym: no cap beyond the backend's output capture."""

    def __post_init__(self) -> None:
        if self.command_timeout_s <= 0:
            raise ValueError(f"ToolSettings.command_timeout_s must be positive, got {self.command_timeout_s}")
        for name in ("observation_lines", "file_view_chars", "max_search_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"ToolSettings.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_observation_chars is not None and self.max_observation_chars < 1:
            raise ValueError(
                f"ToolSettings.max_observation_chars must be >= 1 or None, got {self.max_observation_chars}"
            )
        if not self.shell:
            raise ValueError("ToolSettings.shell must name a shell")
        self.blocked_commands = tuple(self.blocked_commands)


@dataclass
class ToolResult:
    """One executed (or refused) action."""

    observation: str
    tool: str = ""
    invalid: bool = False
    """No call, unknown tool, a parameter the tool's parser refuses or lacks, blocked command."""
    error: bool = False
    """Parsed and admissible, but the tool reported an error (not counting a nonzero bash exit)."""
    nonzero_exit: bool = False
    """execute_bash: the command exited with a nonzero status (not a timeout)."""
    timed_out: bool = False
    done: bool = False
    """The action was `finish`."""
    exit_code: int | None = None
    """execute_bash's exit status (-1 on timeout); None for other tools."""
    extra: dict = field(default_factory=dict)


@dataclass
class _Outcome:
    """What a tool script printed (stdout and stderr in one stream) and its exit status."""

    text: str
    code: int = 0
    invalid: bool = False
    error: bool = False
    timed_out: bool = False
    output_limited: bool = False
    ran: bool = False
    """execute_bash: the command itself ran (its status is the script's)."""


class _EditorError(Exception):
    """An error file_editor prints as "ERROR: ..." (R2E-Gym's EditorError)."""

    def __init__(self, message: str, invalid: bool = False):
        super().__init__(message)
        self.invalid = invalid


class _ParserExit(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


class _ToolParser(argparse.ArgumentParser):
    """argparse as the tool scripts run it, its messages collected instead of printed, at the 78 columns argparse
    uses without a terminal (R2E-Gym's `docker exec` has none)."""

    def __init__(self, prog: str):
        super().__init__(prog=prog, formatter_class=lambda prog: argparse.HelpFormatter(prog, width=78))
        self.written: list[str] = []

    def _print_message(self, message, file=None):
        if message:
            self.written.append(message)

    def exit(self, status=0, message=None):
        if message:
            self.written.append(message)
        raise _ParserExit(status, "".join(self.written))


def _view_range_type(value: str) -> list[int]:
    value = value.strip().strip("[]()")
    parts = value.replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"Expected two numbers, got: {value}")
    try:
        return [int(parts[0]), int(parts[1])]
    except ValueError:
        raise argparse.ArgumentTypeError(f"Could not convert {parts} to integers.") from None


def _parser(tool: str) -> _ToolParser:
    """A parser with the options of R2E-Gym's script for `tool`."""
    parser = _ToolParser(tool)
    if tool == "execute_bash":
        parser.add_argument("--cmd", required=True)
    elif tool == "search":
        parser.add_argument("--search_term", required=True)
        parser.add_argument("--path", default=".")
        parser.add_argument("--python_only", default=True)
    else:
        parser.add_argument("command", type=str)
        for name in ("path", "file_text"):
            parser.add_argument(f"--{name}", type=str, default=None)
        parser.add_argument("--view_range", type=_view_range_type, default=None)
        for name in ("old_str", "new_str"):
            parser.add_argument(f"--{name}", type=str, default=None)
        parser.add_argument("--insert_line", type=int, default=None)
        parser.add_argument("--enable_linting", type=bool, default=False)
        parser.add_argument("--concise", type=str, default="False")
        parser.add_argument("--python_only", type=bool, default=True)
    return parser


def _command_line(params: dict[str, str]) -> list[str]:
    """The script's arguments for a call (R2E-Gym's Action.to_bashcmd, after the shell has unquoted them)."""
    argv = [params["command"]] if "command" in params else []
    for key, value in params.items():
        if key != "command":
            argv += [f"--{key}", value]
    return argv


def _condensed_lines(text: str, filename: str) -> list[tuple[int, str]]:
    """(0-based line, text) of a .py file with function bodies of 4+ lines and class docstrings of 5+ lines
    replaced by '... eliding lines a-b ...' notes (one per span, nested spans included), as R2E-Gym condenses."""
    try:
        tree = parse(text, filename)
    except SyntaxError as exc:
        raise _EditorError(f"Syntax error for file {filename}: {exc}") from None
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            start, end = node.body[0].lineno - 1, node.body[-1].end_lineno - 1
            if end - start >= 3:
                spans.append((start, end))
        if isinstance(node, ast.ClassDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno - first.lineno >= 4
            ):
                spans.append((first.lineno, first.end_lineno - 2))
    hidden = {line for start, end in spans for line in range(start, end + 1)}
    notes = [(start, f"... eliding lines {start + 1}-{end + 1} ...") for start, end in spans]
    kept = [(i, line) for i, line in enumerate(text.splitlines()) if i not in hidden]
    return sorted(notes + kept, key=lambda item: item[0])


def _lint(text: str, filename: str) -> str:
    try:
        parse(text, filename)
    except SyntaxError as exc:
        return str(exc)
    return ""


def _walk_key(relative: str) -> list[tuple[int, str]]:
    """Sort key putting files in os.walk's order (a folder's files, then its subfolders'), names sorted."""
    *folders, name = relative.split("/")
    return [(1, folder) for folder in folders] + [(0, name)]


class Tools:
    """The four tools against one sandbox, with file_editor's undo history for the episode."""

    def __init__(self, sandbox: Sandbox, settings: ToolSettings | None = None):
        self.sandbox = sandbox
        self.settings = settings or ToolSettings()
        self.history: dict[str, list[str]] = {}

    # -- entry point -----------------------------------------------------------------------------------------
    def run(self, text: str) -> ToolResult:
        """Parse and execute one action; never raises for anything the action text contains."""
        try:
            action = parse_action(text, self.settings.require_function_close)
        except ActionParseError:
            return ToolResult(self._finish(NO_CALL_MESSAGE), invalid=True)
        extra = {"n_calls": action.n_calls} if action.n_calls > 1 else {}
        name = action.name
        if name not in TOOL_NAMES:
            message = (
                UNKNOWN_TOOL_EXPLAINED.format(name=name) if self.settings.explain_unknown_tool else UNKNOWN_TOOL_MESSAGE
            )
            return ToolResult(self._finish(message), tool=name, invalid=True, extra=extra)
        if name == "finish":
            return ToolResult(FINISHED, tool="finish", done=True, extra=extra)
        try:
            args = _parser(name).parse_args(_command_line(action.params))
        except _ParserExit as exc:
            outcome = _Outcome(exc.text, exc.status, invalid=True)
        else:
            try:
                outcome = (
                    self._execute_bash(args)
                    if name == "execute_bash"
                    else self._file_editor(args)
                    if name == "file_editor"
                    else self._search(args)
                )
            except SandboxFileError as exc:
                outcome = _Outcome(f"ERROR: {exc}\n", error=True)
        result = ToolResult(
            self._observation(name, outcome),
            tool=name,
            invalid=outcome.invalid,
            error=outcome.error or outcome.timed_out,
            timed_out=outcome.timed_out,
            extra=extra,
        )
        if name == "execute_bash":
            result.exit_code = -1 if outcome.timed_out else outcome.code
            result.nonzero_exit = outcome.ran and outcome.code != 0 and not outcome.timed_out
        return result

    def _observation(self, name: str, outcome: _Outcome) -> str:
        """What R2E-Gym's runtime and Observation make of a script's output and status."""
        if outcome.timed_out or outcome.code == 124:
            output, code = f"The command took too long to execute (>{self.settings.command_timeout_s:g}s)", "-1"
        elif outcome.code != 0:
            output, code = outcome.text, f"Error: Exit code {outcome.code}"
        else:
            output, code = _R2E_ANSI.sub("", outcome.text), "0"
        if outcome.output_limited:
            output += OUTPUT_LIMIT_NOTE
        if name == "execute_bash":
            return self._finish(
                f"Exit code: {code}\nExecution output of [execute_bash]:\n"
                + truncate_lines(output, self.settings.observation_lines)
            )
        return self._finish(f"Execution output of [{name}]:\n{output}")

    def _finish(self, text: str) -> str:
        if self.settings.clean_control_characters:
            text = sanitize(text)
        if self.settings.max_observation_chars is not None:
            text = clip_chars(text, self.settings.max_observation_chars)
        return text

    def _absolute(self, path: str) -> str:
        return posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(self.sandbox.repo_dir, path))

    def _exec(self, argv: list[str]) -> ExecResult:
        return self.sandbox.exec(argv, self.settings.command_timeout_s)

    # -- execute_bash ----------------------------------------------------------------------------------------
    def _execute_bash(self, args) -> _Outcome:
        words = args.cmd.strip().split()
        if not words:
            return _Outcome(EMPTY_CMD_TRACEBACK, 1, invalid=True)
        if words[0] in self.settings.blocked_commands:
            return _Outcome(
                f"Bash command '{words[0]}' is not allowed. Please use a different command or tool.\n", 1, invalid=True
            )
        result = self._exec([self.settings.shell, "-c", args.cmd])
        text = f"[STDOUT]\n\n{_text(result.stdout).strip()} \n\n[STDERR]\n\n{_text(result.stderr).strip()}\n"
        if result.exit_code != 0:
            text = "Error executing command:\n\n" + text
        return _Outcome(
            text,
            result.exit_code,
            error=result.output_limited,
            timed_out=result.timed_out,
            output_limited=result.output_limited,
            ran=True,
        )

    # -- search ----------------------------------------------------------------------------------------------
    def _search(self, args) -> _Outcome:
        term, path = args.search_term, self._absolute(args.path)
        kind = self.sandbox.path_kind(path)
        if kind == "file":
            result = self._exec(["grep", "-n", term, path])
            if result.timed_out:
                return _Outcome("", 124, timed_out=True)
            if result.exit_code == 0:
                return _Outcome(f'Matches for "{term}" in {path}:\n{_text(result.stdout).strip()}\n')
            if result.exit_code == 1:
                return _Outcome(f'No matches found for "{term}" in {path}\n')
            return _Outcome(f"Error executing grep:\n{_text(result.stderr)}\n", result.exit_code, error=True)
        if kind != "dir":
            return _Outcome(f"Directory '{path}' not found or not a directory.\n", 1, error=True)
        counts: dict[str, int] = {}
        if "\n" not in term and "\r" not in term:  # a line never holds a line break
            argv = ["grep", "-r", "-c", "-F", "-e", term] + (["--include=*.py"] if args.python_only else [])
            argv += ["--exclude-dir=.*", "--exclude=.*"]  # after --include: with GNU grep the last matching one wins
            result = self._exec(argv + ["--", path])
            if result.timed_out:
                return _Outcome("", 124, timed_out=True)
            for line in _text(result.stdout).splitlines():
                file, _, count = line.rpartition(":")
                if file and count.isdigit() and int(count) > 0:
                    counts[posixpath.relpath(file, path)] = int(count)
        if not counts:
            return _Outcome(f'No matches found for "{term}" in {path}\n')
        if len(counts) > self.settings.max_search_files:
            return _Outcome(
                f'More than {len(counts)} files matched for "{term}" in {path}. Please narrow your search.\n'
            )
        lines = [f'Found {sum(counts.values())} matches for "{term}" in {path}:']
        for relative in sorted(counts, key=_walk_key):
            shown = posixpath.relpath(posixpath.join(path, relative), self.sandbox.repo_dir)
            lines.append(f"{shown if shown.startswith('./') else './' + shown} ({counts[relative]} matches)")
        lines.append(f'End of matches for "{term}" in {path}')
        return _Outcome("\n".join(lines) + "\n")

    # -- file_editor -----------------------------------------------------------------------------------------
    def _file_editor(self, args) -> _Outcome:
        if args.path is None:
            return _Outcome(
                "ERROR: Unhandled exception: expected str, bytes or os.PathLike object, not NoneType\n", invalid=True
            )
        shown = str(PurePosixPath(args.path))
        try:
            return self._edit(args, shown, self._absolute(shown))
        except _EditorError as exc:
            return _Outcome(f"ERROR: {exc}\n", invalid=exc.invalid, error=not exc.invalid)

    def _edit(self, args, shown: str, path: str) -> _Outcome:
        command, kind = args.command, self.sandbox.path_kind(path)
        if command == "create":
            if kind != "missing":
                raise _EditorError(f"File already exists at: {shown}. Cannot overwrite with 'create'.")
        elif kind == "missing":
            raise _EditorError(f"The path '{shown}' does not exist.")
        if kind == "dir" and command != "view":
            raise _EditorError(f"The path '{shown}' is a directory. Only 'view' can be used on directories.")
        if kind == "other" and command != "create":
            raise _EditorError(f"The path '{shown}' is not a regular file or directory.")
        if command == "view":
            return self._view_dir(shown) if kind == "dir" else self._view_file(args, shown, path)
        if command == "create":
            return self._create(args, shown, path)
        if command == "str_replace":
            return self._str_replace(args, shown, path)
        if command == "insert":
            return self._insert(args, shown, path)
        if command == "undo_edit":
            return self._undo(shown, path)
        raise _EditorError(
            f"Unrecognized command '{command}'. Allowed commands: view, create, str_replace, insert, undo_edit.",
            invalid=True,
        )

    @staticmethod
    def _refused(error: str) -> _Outcome:
        """An EditorResult with an error and no output: an empty line, then the error."""
        return _Outcome(f"\nERROR: {error}\n", error=True)

    def _read(self, path: str, shown: str, strict: bool = True) -> str:
        data = self.sandbox.read_file(path)
        try:
            text = data.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError as exc:
            raise _EditorError(
                f"Failed to read file {shown}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def _write(self, path: str, text: str, failure: str) -> None:
        try:
            self.sandbox.write_file(path, text.encode("utf-8"))
        except SandboxFileError as exc:
            raise _EditorError(f"{failure}: {exc}") from None

    def _numbered(self, content: str, descriptor: str, first_line: int = 1) -> str:
        content = _clip_file_text(content, self.settings.file_view_chars).expandtabs()
        numbered = "\n".join(f"{i + first_line:6}\t{line}" for i, line in enumerate(content.split("\n")))
        return f"Here's the result of running `cat -n` on {descriptor}:\n{numbered}\n"

    def _linted(self, args, shown: str, text: str) -> str:
        return _lint(text, shown) if args.enable_linting and PurePosixPath(shown).suffix == ".py" else ""

    def _view_dir(self, shown: str) -> _Outcome:
        argv = ["find", shown, "-maxdepth", "2", "-not", "-path", "*/.*"]
        if not self.settings.view_non_python:
            argv += ["(", "-type", "d", "-o", "-name", "*.py", ")"]
        result = self._exec(argv)
        if result.timed_out:
            return _Outcome("", 124, timed_out=True)
        stderr = _text(result.stderr).strip()
        if stderr:
            return self._refused(stderr)
        listing = sorted(_text(result.stdout).splitlines(), key=lambda line: line.split("/"))
        text = f"Here's the files and directories up to 2 levels deep in {shown}, excluding hidden:\n" + "".join(
            line + "\n" for line in listing
        )
        return _Outcome(_clip_file_text(text, self.settings.file_view_chars) + "\n")

    def _view_file(self, args, shown: str, path: str) -> _Outcome:
        name = PurePosixPath(shown)
        if name.suffix != ".py" and not self.settings.view_non_python:
            return self._refused(
                f"ERROR: Viewing non-Python files is disallowed for saving context. File "
                f"'{name.name}' is not a .py file."
            )
        text = self._read(path, shown, strict=False)
        concise, view_range = args.concise.lower() == "true", args.view_range
        if name.suffix == ".py" and not view_range and not concise and len(text.splitlines()) > CONCISE_AFTER_LINES:
            concise = True
        if name.suffix == ".py" and concise:
            lines = _condensed_lines(text, shown)
        else:
            lines = list(enumerate(text.splitlines()))
        if view_range:
            start, end = view_range
            if not 1 <= start <= len(lines):
                return self._refused(f"Invalid view_range {view_range}: start line must be in [1, {len(lines)}]")
            if end != -1 and (end < start or end > len(lines)):
                return self._refused(
                    f"Invalid view_range {view_range}: end must be >= start and <= {len(lines)}, "
                    "or -1 to view until end."
                )
            lines = [(i, line) for i, line in lines if i + 1 >= start and (end == -1 or i + 1 <= end)]
        if concise:
            header = (
                f"Here is a condensed view for file: {shown}; [Note: Useful for understanding file structure "
                "in a concise manner. Please use specific view_range without concise cmd if you want to "
                "explore further into the relevant parts.]\n"
            )
        else:
            header = f"Here's the result of running `cat -n` on the file: {shown}:\n"
        body = "\n".join(f"{i + 1:6d} {line}" for i, line in lines)
        return _Outcome(_clip_file_text(header + body, self.settings.file_view_chars) + "\n")

    def _create(self, args, shown: str, path: str) -> _Outcome:
        if args.file_text is None:
            raise _EditorError("Cannot create file without 'file_text' parameter.", invalid=True)
        lint = self._linted(args, shown, args.file_text)
        if lint:
            return self._refused(LINT_ERROR + lint)
        self._write(path, args.file_text, f"Error creating file at {shown}")
        self.history.setdefault(shown, []).append("")
        return _Outcome(
            f"File created at {shown}. "
            + self._numbered(args.file_text, shown)
            + "Review the file and make sure that it is as expected. Edit the file if necessary.\n"
        )

    def _str_replace(self, args, shown: str, path: str) -> _Outcome:
        old, new = args.old_str, args.new_str or ""
        if old is None:
            raise _EditorError("Missing required parameter 'old_str' for 'str_replace'.", invalid=True)
        text = self._read(path, shown)
        count = text.count(old)
        if count == 0:
            raise _EditorError(f"No occurrences of '{old}' found in {shown} for replacement.")
        if count > 1:
            raise _EditorError(
                f"Multiple occurrences of '{old}' found in {shown}. "
                "Please ensure it is unique before using str_replace."
            )
        updated = text.replace(old, new)
        lint = self._linted(args, shown, updated)
        if lint:
            return self._refused(LINT_ERROR + lint)
        self.history.setdefault(shown, []).append(text)
        self._write(path, updated, f"Failed to write file {shown}")
        if not old:  # an empty old_str in an empty file: R2E-Gym's snippet code then fails
            return _Outcome("ERROR: Unhandled exception: empty separator\n", error=True)
        line = text.split(old)[0].count("\n")
        start, end = max(0, line - SNIPPET_LINES), line + SNIPPET_LINES + new.count("\n")
        snippet = "\n".join(updated.split("\n")[start : end + 1])
        return _Outcome(
            f"The file {shown} has been edited. "
            + self._numbered(snippet, f"a snippet of {shown}", start + 1)
            + "Review the changes and make sure they are as expected. Edit the file again if necessary.\n"
        )

    def _insert(self, args, shown: str, path: str) -> _Outcome:
        new = args.new_str
        if new is None:
            raise _EditorError("Missing required parameter 'new_str' for 'insert'.", invalid=True)
        text = self._read(path, shown)
        lines = text.split("\n")
        line = args.insert_line
        if line is None:
            return _Outcome(INSERT_WITHOUT_LINE_TRACEBACK, invalid=True)
        if not 0 <= line <= len(lines):
            raise _EditorError(f"Invalid insert_line {line}. Must be in [0, {len(lines)}].")
        new_lines = new.split("\n")
        updated = "\n".join(lines[:line] + new_lines + lines[line:])
        lint = self._linted(args, shown, updated)
        if lint:
            return self._refused(LINT_ERROR + lint)
        self.history.setdefault(shown, []).append(text)
        self._write(path, updated, f"Failed to write file {shown}")
        snippet = "\n".join(lines[max(0, line - SNIPPET_LINES) : line] + new_lines + lines[line : line + SNIPPET_LINES])
        return _Outcome(
            f"The file {shown} has been edited. "
            + self._numbered(snippet, "a snippet of the edited file", max(1, line - SNIPPET_LINES + 1))
            + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
            "lines, etc). Edit the file again if necessary.\n"
        )

    def _undo(self, shown: str, path: str) -> _Outcome:
        if not self.history.get(shown):
            raise _EditorError(f"No previous edits found for {shown} to undo.")
        previous = self.history[shown].pop()
        self._write(path, previous, f"Failed to write file {shown}")
        return _Outcome(f"Last edit to {shown} undone successfully. " + self._numbered(previous, shown) + "\n")
