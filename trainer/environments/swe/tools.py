"""R2E-Gym's four tools, parsed from its text format, with its observation strings.

An action is R2E-Gym's non-function-calling format:

    <function=file_editor>
    <parameter=command>str_replace</parameter>
    <parameter=path>/testbed/roman.py</parameter>
    <parameter=old_str>...</parameter>
    <parameter=new_str>...</parameter>
    </function>

Parsing follows R2E-Gym's `Action.from_string`: the first `<function=NAME>` names the tool, every
`<parameter=KEY>VALUE</parameter>` after it (up to the next `<function=`) is a parameter, values are
`strip()`ped (so a str_replace drops the leading indentation of its first line on both sides, as in R2E-Gym),
and a missing `</function>` is tolerated (generation often stops on it). Stricter than R2E-Gym, and reported
as invalid actions: a `<parameter=` that is never closed, a parameter given twice, a parameter the tool does not
take, a missing required parameter.

Observation strings (R2E-Gym's `Observation.__str__`):
- execute_bash: "Exit code: {code}\\nExecution output of [execute_bash]:\\n{out}", where code is "0",
  "Error: Exit code N" or "-1" (timeout: out is "The command took too long to execute (>Ts)"), and out is the
  tool's "[STDOUT]\\n\\n...\\n\\n[STDERR]\\n\\n..." text, prefixed by "Error executing command:\\n\\n" on a
  nonzero exit. More than 2*40 lines keep the first and last 40 around R2E-Gym's marker.
- other tools: "Execution output of [{name}]:\\n{out}"; finish: "<<< Finished >>>";
  no function call: a reminder to call one.
- file_editor's texts (cat -n views, "The file ... has been edited.", "ERROR: ..." lines, the 10,000-character
  clip with <response clipped>) follow R2E-Gym's r2egym/file_editor.py, without its restriction to viewing
  .py files only (our fixtures have .ini and .md files) and without linting. Directory listings and search hits
  are sorted so that both backends give identical observations.
Our additions, for robustness: ANSI codes and \\r are removed and other control characters become U+FFFD
(R2E-Gym does the first on success only), and an observation longer than `max_observation_chars` keeps its
head and tail (a single 10 MB line would otherwise pass the 40+40 line rule whole).

Tool outputs are shown without a trailing newline. `path` may be relative; it is taken from the repository
root, the tools' working directory, as in R2E-Gym.
"""
from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass, field

from trainer.environments.swe.sandbox import ExecResult, Sandbox, SandboxFileError

TOOL_NAMES = ("execute_bash", "file_editor", "search", "finish")
"""The tools, in the order the instruction lists them. `submit` is accepted as another name for `finish`."""

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")

TOOL_PARAMETERS = {
    "execute_bash": ("cmd", "command"),
    "file_editor": ("command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range", "concise"),
    "search": ("search_term", "path", "python_only"),
    "finish": ("command", "result"),
}
"""Parameters each tool accepts (execute_bash's `command` is rllm's alias of `cmd`)."""

NO_CALL_MESSAGE = ("You forgot to use a function call in your response.\n"
                   "YOU MUST USE A FUNCTION CALL IN EACH RESPONSE, in this format:\n"
                   "<function=TOOL_NAME>\n<parameter=KEY>VALUE</parameter>\n</function>")
FINISHED = "<<< Finished >>>"
TRUNCATION_DIVIDER = "-" * 50
LINE_TRUNCATION_MARKER = "<Observation truncated in middle for saving context>"
CLIPPED = ("<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
           "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
           "numbers of what you are looking for.</NOTE>")
SNIPPET_LINES = 4
CONCISE_AFTER_LINES = 110
"""R2E-Gym views .py files longer than this in concise form unless a view_range is given."""


class ActionParseError(ValueError):
    """The text holds no usable function call."""

    def __init__(self, message: str, name: str = "", no_call: bool = False):
        super().__init__(message)
        self.name = name
        self.no_call = no_call


@dataclass(frozen=True)
class Action:
    name: str
    params: dict[str, str]
    n_calls: int = 1
    """How many `<function=` tags the text had (only the first is executed)."""


_FUNCTION = re.compile(r"<function\s*=\s*([^>\n]*)>")
_PARAMETER = re.compile(r"<parameter\s*=\s*([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_PARAMETER_OPEN = re.compile(r"<parameter\s*=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def parse_action(text: str) -> Action:
    """Parse the first function call in `text`; raises ActionParseError (`no_call` when there is none)."""
    if not isinstance(text, str):
        raise TypeError(f"action must be a str, got {type(text).__name__}")
    calls = list(_FUNCTION.finditer(text))
    if not calls:
        raise ActionParseError("no function call found", no_call=True)
    name = calls[0].group(1).strip()
    if not _NAME.fullmatch(name):
        raise ActionParseError(f"invalid function name {name!r}")
    body = text[calls[0].end(): calls[1].start() if len(calls) > 1 else len(text)]
    params: dict[str, str] = {}
    for match in _PARAMETER.finditer(body):
        key = match.group(1).strip()
        if not _NAME.fullmatch(key):
            raise ActionParseError(f"invalid parameter name {key!r}", name)
        if key in params:
            raise ActionParseError(f"parameter {key!r} is given twice", name)
        params[key] = match.group(2).strip()
    if _PARAMETER_OPEN.search(_PARAMETER.sub("", body)):
        raise ActionParseError("a <parameter=...> tag is not closed with </parameter>", name)
    return Action(name, params, n_calls=len(calls))


def format_action(name: str, params: dict[str, str] | None = None) -> str:
    """The text of a call, as a policy would write it (used by scripted agents and tests)."""
    lines = [f"<function={name}>"]
    lines += [f"<parameter={key}>{value}</parameter>" for key, value in (params or {}).items()]
    lines.append("</function>")
    return "\n".join(lines)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sanitize(text: str) -> str:
    """Drop ANSI escape sequences and \\r; replace other control characters (except \\n and \\t) by U+FFFD."""
    return _CONTROL.sub("\ufffd", _ANSI.sub("", text).replace("\r", ""))


def decode_output(data: bytes) -> str:
    """Bytes from a command -> clean text (invalid UTF-8 becomes U+FFFD)."""
    return sanitize(data.decode("utf-8", errors="replace"))


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
    return f"{text[:half]}\n<... {len(text) - 2 * half} characters omitted ...>\n{text[len(text) - half:]}"


def _clip_file_text(content: str, limit: int) -> str:
    return content if len(content) <= limit else content[:limit] + CLIPPED


@dataclass
class ToolSettings:
    """How the tools run and how much of their output an observation keeps."""

    command_timeout_s: float = 90.0
    """Wall-clock limit of one command (R2E-Gym: 120 s; rllm's step_timeout: 90 s)."""
    observation_lines: int = 40
    """execute_bash keeps this many first and last lines of a longer output (R2E-Gym: 40)."""
    max_observation_chars: int = 20_000
    """Hard cap on one observation's characters (head and tail kept); ours, R2E-Gym has none."""
    file_view_chars: int = 10_000
    """file_editor output clip (R2E-Gym's MAX_RESPONSE_LEN)."""
    blocked_commands: tuple[str, ...] = ("ipython", "jupyter", "pip", "nohup")
    """First words execute_bash refuses (R2E-Gym's list; rllm blocks git instead of pip)."""
    max_search_files: int = 100
    """search over a directory gives up listing when more files than this match (R2E-Gym: 100)."""

    def __post_init__(self) -> None:
        if self.command_timeout_s <= 0:
            raise ValueError(f"ToolSettings.command_timeout_s must be positive, got {self.command_timeout_s}")
        for name in ("observation_lines", "max_observation_chars", "file_view_chars", "max_search_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"ToolSettings.{name} must be >= 1, got {getattr(self, name)}")
        self.blocked_commands = tuple(self.blocked_commands)


@dataclass
class ToolResult:
    """One executed (or refused) action."""

    observation: str
    tool: str = ""
    invalid: bool = False
    """Unparseable, unknown tool, missing/unknown parameter, blocked command."""
    error: bool = False
    """Parsed and admissible, but the tool reported an error (not counting a nonzero bash exit)."""
    nonzero_exit: bool = False
    """execute_bash: the command exited with a nonzero status (not a timeout)."""
    timed_out: bool = False
    done: bool = False
    """The action was `finish` (or `submit`)."""
    exit_code: int | None = None
    """execute_bash's exit status (-1 on timeout); None for other tools."""
    extra: dict = field(default_factory=dict)


class _ToolError(Exception):
    """A tool refused or failed; `invalid` tells which."""

    def __init__(self, message: str, invalid: bool = False):
        super().__init__(message)
        self.invalid = invalid


def _flag(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise _ToolError(f"Parameter '{name}' must be true or false, got {value!r}.", invalid=True)


def _view_range(value: str) -> tuple[int, int]:
    parts = value.strip().strip("[]()").replace(",", " ").split()
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise _ToolError(f"Invalid view_range {value!r}: expected two integers like [1, 20].", invalid=True) from None


def _concise_lines(text: str) -> list[tuple[int, str]] | None:
    """(0-based line, text) of a .py file with long function bodies replaced by '... eliding lines a-b ...'."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            start, end = node.body[0].lineno - 1, node.body[-1].end_lineno - 1
            if end - start >= 3:
                spans.append((start, end))
    spans.sort()
    outer: list[tuple[int, int]] = []
    for start, end in spans:
        if outer and start <= outer[-1][1]:
            continue  # nested in an elided body
        outer.append((start, end))
    hidden = {line for start, end in outer for line in range(start, end + 1)}
    kept = [(i, line) for i, line in enumerate(text.splitlines()) if i not in hidden]
    notes = [(start, f"... eliding lines {start + 1}-{end + 1} ...") for start, end in outer]
    return sorted(kept + notes, key=lambda item: item[0])


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
            action = parse_action(text)
        except ActionParseError as exc:
            if exc.no_call:
                return ToolResult(NO_CALL_MESSAGE, invalid=True)
            if exc.name in TOOL_NAMES or exc.name == "submit":
                return ToolResult(f"Execution output of [{exc.name}]:\nERROR: Malformed function call: {exc}",
                                  tool=exc.name, invalid=True)
            return ToolResult(f"ERROR: Malformed function call: {exc}.\n{NO_CALL_MESSAGE}", invalid=True)
        name = "finish" if action.name == "submit" else action.name
        extra = {"n_calls": action.n_calls} if action.n_calls > 1 else {}
        if name not in TOOL_NAMES:
            return ToolResult(f"Execution output of [{action.name}]:\nInvalid Action: '{action.name}' is not an "
                              f"allowed function. Allowed functions: {', '.join(TOOL_NAMES)}.",
                              tool=action.name, invalid=True, extra=extra)
        if name == "finish":
            return ToolResult(FINISHED, tool="finish", done=True, extra=extra)
        unknown = sorted(set(action.params) - set(TOOL_PARAMETERS[name]))
        try:
            if unknown:
                raise _ToolError(f"Unknown parameter(s) for {name}: {', '.join(unknown)}. "
                                 f"Allowed: {', '.join(TOOL_PARAMETERS[name])}.", invalid=True)
            if name == "execute_bash":
                result = self.execute_bash(action.params)
            else:
                output = self.file_editor(action.params) if name == "file_editor" else self.search(action.params)
                result = ToolResult(self._observation(name, output), tool=name)
        except _ToolError as exc:
            observation = (self._bash_observation("Error: Exit code 2", f"ERROR: {exc}") if name == "execute_bash"
                           else self._observation(name, f"ERROR: {exc}"))
            result = ToolResult(observation, tool=name, invalid=exc.invalid, error=not exc.invalid)
        except SandboxFileError as exc:
            result = ToolResult(self._observation(name, f"ERROR: {exc}"), tool=name, error=True)
        result.extra.update(extra)
        return result

    def _observation(self, name: str, output: str) -> str:
        return clip_chars(sanitize(f"Execution output of [{name}]:\n{output}"), self.settings.max_observation_chars)

    def _path(self, params: dict[str, str], tool: str, default: str | None = None) -> str:
        path = params.get("path", default)
        if not path:
            raise _ToolError(f"Missing required parameter 'path' for {tool}.", invalid=True)
        return posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(self.sandbox.repo_dir, path))

    def _exec(self, argv: list[str]) -> ExecResult:
        return self.sandbox.exec(argv, self.settings.command_timeout_s)

    # -- execute_bash ----------------------------------------------------------------------------------------
    def execute_bash(self, params: dict[str, str]) -> ToolResult:
        cmd = params.get("cmd", params.get("command"))
        if not cmd:
            raise _ToolError("Missing required parameter 'cmd' for execute_bash.", invalid=True)
        first = cmd.split()[0]
        if first in self.settings.blocked_commands:
            output = f"Bash command '{first}' is not allowed. Please use a different command or tool."
            return ToolResult(self._bash_observation("Error: Exit code 1", output), tool="execute_bash",
                              invalid=True, exit_code=1)
        result = self._exec(["bash", "-c", cmd])
        if result.timed_out:
            output = f"The command took too long to execute (>{self.settings.command_timeout_s:g}s)"
            return ToolResult(self._bash_observation("-1", output), tool="execute_bash", error=True,
                              timed_out=True, exit_code=-1)
        stdout, stderr = decode_output(result.stdout).strip(), decode_output(result.stderr).strip()
        output = f"[STDOUT]\n\n{stdout}\n\n[STDERR]\n\n{stderr}"
        code = "0" if result.exit_code == 0 else f"Error: Exit code {result.exit_code}"
        if result.exit_code != 0:
            output = "Error executing command:\n\n" + output
        if result.output_limited:
            output = truncate_lines(output, self.settings.observation_lines)
            output += "\n[The command was stopped: its output passed the sandbox's limit.]"
        return ToolResult(self._bash_observation(code, output), tool="execute_bash",
                          error=result.output_limited, nonzero_exit=result.exit_code != 0,
                          exit_code=result.exit_code)

    def _bash_observation(self, code: str, output: str) -> str:
        text = f"Exit code: {code}\nExecution output of [execute_bash]:\n"
        text += truncate_lines(sanitize(output), self.settings.observation_lines)
        return clip_chars(text, self.settings.max_observation_chars)

    # -- search ----------------------------------------------------------------------------------------------
    def search(self, params: dict[str, str]) -> str:
        term = params.get("search_term")
        if not term:
            raise _ToolError("Missing required parameter 'search_term' for search.", invalid=True)
        python_only = _flag(params.get("python_only", "true"), "python_only")
        path = self._path(params, "search", default=".")
        kind = self.sandbox.path_kind(path)
        if kind == "file":
            result = self._exec(["grep", "-n", "-e", term, "--", path])
            if result.exit_code == 1:
                return f'No matches found for "{term}" in {path}'
            if result.exit_code != 0:
                raise _ToolError(f"Error executing grep:\n{decode_output(result.stderr).strip()}")
            return f'Matches for "{term}" in {path}:\n{decode_output(result.stdout).strip()}'
        if kind != "dir":
            raise _ToolError(f"Directory '{path}' not found or not a directory.")
        argv = ["grep", "-r", "-c", "-F", "-e", term] + (["--include=*.py"] if python_only else [])
        argv += ["--exclude-dir=.*", "--exclude=.*"]  # after --include: with GNU grep the last matching one wins
        result = self._exec(argv + ["--", path])
        counts = {}
        for line in decode_output(result.stdout).splitlines():
            file, _, count = line.rpartition(":")
            if file and count.isdigit() and int(count) > 0:
                counts[file] = int(count)
        if not counts:
            return f'No matches found for "{term}" in {path}'
        if len(counts) > self.settings.max_search_files:
            return f'More than {len(counts)} files matched for "{term}" in {path}. Please narrow your search.'
        lines = [f'Found {sum(counts.values())} matches for "{term}" in {path}:']
        for file in sorted(counts):
            relative = posixpath.relpath(file, self.sandbox.repo_dir)
            lines.append(f"{relative if relative.startswith('./') else './' + relative} ({counts[file]} matches)")
        lines.append(f'End of matches for "{term}" in {path}')
        return "\n".join(lines)

    # -- file_editor -----------------------------------------------------------------------------------------
    def file_editor(self, params: dict[str, str]) -> str:
        command = params.get("command")
        if not command:
            raise _ToolError("Missing required parameter 'command' for file_editor.", invalid=True)
        if command not in EDITOR_COMMANDS:
            raise _ToolError(f"Unrecognized command '{command}'. Allowed commands: {', '.join(EDITOR_COMMANDS)}.",
                             invalid=True)
        path = self._path(params, "file_editor")
        required = {"create": ("file_text",), "str_replace": ("old_str",), "insert": ("insert_line", "new_str")}
        for name in required.get(command, ()):
            if name not in params:
                raise _ToolError(f"Missing required parameter '{name}' for '{command}'.", invalid=True)
        kind = self.sandbox.path_kind(path)
        if command == "create":
            if kind != "missing":
                raise _ToolError(f"File already exists at: {path}. Cannot overwrite with 'create'.")
        elif kind == "missing":
            raise _ToolError(f"The path '{path}' does not exist.")
        elif kind == "dir" and command != "view":
            raise _ToolError(f"The path '{path}' is a directory. Only 'view' can be used on directories.")
        elif kind == "other":
            raise _ToolError(f"The path '{path}' is not a regular file or directory.")
        if command == "view":
            return self._view_dir(path) if kind == "dir" else self._view_file(path, params)
        if command == "create":
            return self._create(path, params["file_text"])
        if command == "str_replace":
            return self._str_replace(path, params["old_str"], params.get("new_str", ""))
        if command == "insert":
            try:
                line = int(params["insert_line"])
            except ValueError:
                raise _ToolError(f"insert_line must be an integer, got {params['insert_line']!r}.",
                                 invalid=True) from None
            return self._insert(path, line, params["new_str"])
        return self._undo(path)

    def _read_text(self, path: str, strict: bool = True) -> str:
        data = self.sandbox.read_file(path)
        try:
            return data.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError as exc:
            raise _ToolError(f"Failed to read file {path}: not UTF-8 text ({exc.reason} at byte {exc.start}).") \
                from None

    def _write_text(self, path: str, text: str) -> None:
        try:
            self.sandbox.write_file(path, text.encode("utf-8"))
        except SandboxFileError as exc:
            raise _ToolError(f"Failed to write file {path}: {exc}") from None

    def _numbered(self, content: str, descriptor: str, first_line: int = 1) -> str:
        content = _clip_file_text(content, self.settings.file_view_chars).expandtabs()
        numbered = "\n".join(f"{i + first_line:6}\t{line}" for i, line in enumerate(content.split("\n")))
        return f"Here's the result of running `cat -n` on {descriptor}:\n{numbered}\n"

    def _view_dir(self, path: str) -> str:
        result = self._exec(["find", "-L", path, "-maxdepth", "2", "-not", "-path", "*/.*"])
        if result.exit_code != 0 and not result.stdout:
            raise _ToolError(decode_output(result.stderr).strip() or f"cannot list {path}")
        listing = "\n".join(sorted(decode_output(result.stdout).splitlines()))
        text = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n{listing}"
        return _clip_file_text(text, self.settings.file_view_chars)

    def _view_file(self, path: str, params: dict[str, str]) -> str:
        text = self._read_text(path, strict=False)
        view_range = _view_range(params["view_range"]) if params.get("view_range") else None
        concise = _flag(params.get("concise", "false"), "concise")
        if path.endswith(".py") and view_range is None and len(text.splitlines()) > CONCISE_AFTER_LINES:
            concise = True
        lines = _concise_lines(text) if concise and path.endswith(".py") else None
        concise = lines is not None
        if lines is None:
            lines = list(enumerate(text.splitlines()))
        if view_range is not None:
            start, end = view_range
            total = len(lines)
            if not 1 <= start <= max(total, 1):
                raise _ToolError(f"Invalid view_range {list(view_range)}: start line must be in [1, {total}]")
            if end != -1 and (end < start or end > total):
                raise _ToolError(f"Invalid view_range {list(view_range)}: end must be >= start and <= {total}, "
                                 "or -1 to view until end.")
            lines = [(i, line) for i, line in lines if i + 1 >= start and (end == -1 or i + 1 <= end)]
        if concise:
            header = (f"Here is a condensed view for file: {path}; [Note: Useful for understanding file structure "
                      "in a concise manner. Please use specific view_range without concise cmd if you want to "
                      "explore further into the relevant parts.]\n")
        else:
            header = f"Here's the result of running `cat -n` on the file: {path}:\n"
        body = "\n".join(f"{i + 1:6d} {line}" for i, line in lines)
        return _clip_file_text(header + body, self.settings.file_view_chars)

    def _create(self, path: str, file_text: str) -> str:
        self._write_text(path, file_text)
        self.history.setdefault(path, []).append("")
        return (f"File created at {path}. " + self._numbered(file_text, path)
                + "Review the file and make sure that it is as expected. Edit the file if necessary.")

    def _str_replace(self, path: str, old: str, new: str) -> str:
        if not old:
            raise _ToolError("Parameter 'old_str' of str_replace must not be empty.", invalid=True)
        text = self._read_text(path)
        count = text.count(old)
        if count == 0:
            raise _ToolError(f"No occurrences of '{old}' found in {path} for replacement.")
        if count > 1:
            raise _ToolError(f"Multiple occurrences of '{old}' found in {path}. "
                             "Please ensure it is unique before using str_replace.")
        updated = text.replace(old, new)
        self._write_text(path, updated)
        self.history.setdefault(path, []).append(text)
        line = text.split(old)[0].count("\n")
        start, end = max(0, line - SNIPPET_LINES), line + SNIPPET_LINES + new.count("\n")
        snippet = "\n".join(updated.split("\n")[start:end + 1])
        return (f"The file {path} has been edited. " + self._numbered(snippet, f"a snippet of {path}", start + 1)
                + "Review the changes and make sure they are as expected. Edit the file again if necessary.")

    def _insert(self, path: str, line: int, new: str) -> str:
        text = self._read_text(path)
        lines = text.split("\n")
        if not 0 <= line <= len(lines):
            raise _ToolError(f"Invalid insert_line {line}. Must be in [0, {len(lines)}].")
        new_lines = new.split("\n")
        self._write_text(path, "\n".join(lines[:line] + new_lines + lines[line:]))
        self.history.setdefault(path, []).append(text)
        snippet = "\n".join(lines[max(0, line - SNIPPET_LINES):line] + new_lines + lines[line:line + SNIPPET_LINES])
        return (f"The file {path} has been edited. "
                + self._numbered(snippet, "a snippet of the edited file", max(1, line - SNIPPET_LINES + 1))
                + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
                  "lines, etc). Edit the file again if necessary.")

    def _undo(self, path: str) -> str:
        if not self.history.get(path):
            raise _ToolError(f"No previous edits found for {path} to undo.")
        previous = self.history[path].pop()
        self._write_text(path, previous)
        return f"Last edit to {path} undone successfully. " + self._numbered(previous, path)
