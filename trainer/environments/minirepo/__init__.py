"""MiniRepo: a procedurally generated repository-repair task, small enough for a ~1M-parameter policy on CPU.

Why it looks like this. The papers train SWE agents on R2E-Gym: a repository, an issue that describes a
symptom, hidden fail-to-pass (F2P) and pass-to-pass (P2P) tests, a handful of tools, and a reward of 1 only when
every test passes at submit. MiniRepo keeps that structure and shrinks everything else so that observations are
tens of word-level tokens over a small, closed vocabulary:

* The "code" is a tiny expression language with an interpreter written here, so tests are really executed.
  A function is a `def` line, one or more assignments, and a `ret` line; the only operators are `+ - *`::

      def f12 x y          # name and parameters
      a = x + 3            # VAR = ATOM | ATOM OP ATOM | FUNC ATOM...  (a call)
      b = f7 a y
      ret b * 2            # ret EXPR ends the function

  Atoms are variables or integer literals. All names are global, files are only containers. Loading fails on a
  malformed line or a duplicate definition; a call fails on an unknown name, a wrong argument count, recursion
  deeper than 32, or a value beyond +-99999; a step budget per command turns runaway recursion into a timeout.
* A task is a repository of several files (`m0`..`m9`) of such functions. Bugs (a swapped operator, a constant off
  by one, a swapped variable) are injected at the end of a call chain that starts at an *entry* function, one no
  other function calls. Only entry functions have tests (by default), so a bug `depth` calls below the issue's
  function is invisible to `test` except through it: the agent must follow the chain. The issue names the entry
  function, an input, the wrong output and the expected one, never the file or line.
* F2P tests are the tests the buggy repository fails; P2P tests are the rest. Expected values come from the
  correct (gold) repository, so any edit that makes every test pass earns the reward, and an edit that breaks
  another function (a P2P test) earns 0.

Command language (one command per turn; words separated by spaces)::

    ls                      -> the file names:                        m0 m3 m5
    open FILE [LINE]        -> `view_lines` numbered lines from LINE (default 1), `eof` after the last line
    search WORD...          -> lines holding the words (whole, in order), as `FILE LINE : text`, at most
                               `max_hits` then `more N`; or `no match`. `search def f3` finds a definition
    edit FILE LINE TEXT...  -> replace that one line by TEXT (line numbers never shift) -> `edited FILE LINE`
    run FUNC INT...         -> evaluate a call:                       f3 2 5 returns 9
    test                    -> run every test: `pass P fail F` then up to `max_fail_lines` lines like
                               `fail : f3 2 5 returns 9 , expected 7` (or `raises error , expected 7`)
    submit                  -> end the episode; reward 1.0 iff every F2P and P2P test passes -> `submitted`

The instruction is one line per bug: `issue : f3 2 5 returns 9 , expected 7`.

Flags (the paper's tool penalty reads them). `invalid_action`: the text does not parse as a command: empty,
several lines, an unknown command word, a wrong number of arguments, or a LINE / INT argument that is not an
integer. Observation `invalid : unknown command` or `invalid : usage ...`. `exec_error`: the command parsed but failed:
a missing file, a line out of range (for `open` and `edit`), a program that does not load when running `test`
or `run` (`error : syntax m1 6`), a runtime error in `run`, or a timeout (`timed_out` is set too). Failing tests
are *not* an execution error: the test tool worked. `edit` accepts any text; a syntax error surfaces at the
next `test` or `run`, as a linter-free editor would. The episode ends at `submit` (reward per tests) or after
`max_turns` steps (reward 0, `turn limit` appended to the last observation). Observations depend only on the
task and the actions, so equal histories give equal states (GiGPO/GraphGPO anchor states). `StepInfo.extra`
holds the turn number, `truncated` at the turn limit, and at submit the passed / total F2P and P2P counts.

Horizon. The scripted expert (noise 0) spends a search and an open per function of the chain, then edit,
test, submit: `2 * (depth + 1) + 3` turns for one bug, one more when a body outruns the `open` window, one
fewer when an open already showed the next definition, and the sum over bugs when there are several. With the
defaults (depth uniform in 0..3) episodes take 5-13 turns and 53-212 words; at noise 0.3, 3-24 turns and up
to ~430 words (measured on 200 train + 200 held-out tasks). `max_depth`, `max_bugs`, `max_body_lines` and a
smaller `view_lines` stretch the tail (`min_files=3, min_funcs_per_file=4, max_depth=4, max_bugs=2,
max_turns=48` gives 5-24 expert turns); repository size mostly lengthens search results, and browsing for a
policy that does not search.

Difficulty. The defaults are a starting point for a ~1M-parameter policy after the supervised warm start, meant
to be tuned (with `max_depth`, `bug_kinds`, `test_helpers`, `max_turns`) until it starts at roughly 20-35%
success; that number depends on the policy and cannot be measured here. `test_helpers=True` makes the bug
easier to locate (the helper's own test fails); more bug kinds and deeper chains make it harder.

Vocabulary. `vocabulary()` lists every word (about 145: 64 function names `f0..f63`, 10 file names, commands,
keywords, operators, observation words, digits); integers appear as digit strings with an optional `-`. A
character-level tokenizer needs 55 symbols (every character of `vocabulary()`, space and newline; expert
transcripts use 37 of them: the usage placeholders of invalid-action messages are upper case).
`sample_texts()` returns expert transcripts to build or check a tokenizer.

Splits. One deterministic stream of candidate tasks per seed. A candidate belongs to the held-out split iff a
hash of its layout (file names, functions per file, the set of function names, all readable from the repository
text) falls in the `heldout_fraction` bucket, so equal repositories always land in the same split: the splits are
disjoint by content, not only by seed. The expert knows the gold fix; it follows the chain as a careful agent
would (search, open, edit where the bug is, test, submit) and with `noise` > 0 replaces an action by a plausible
mistake (wrong file, wrong search, wrong edit, a submit without testing), recovering from wrong edits after a
test shows them.

Modules: `lang` (parser, interpreter), `tasks` (config, records, generator, task source), `env` (the
environment), `expert` (scripted expert, transcripts, vocabulary). Pure Python; a step costs tens of
microseconds (`benchmarks/bench_env_step.py`: about 2% of a tiny model's decode time per episode).
"""

from trainer.environments.minirepo.env import COMMANDS, MiniRepoEnv
from trainer.environments.minirepo.expert import Transcript, expert_action, play_expert, sample_texts, vocabulary
from trainer.environments.minirepo.lang import EvalError, EvalTimeout, ProgramError, call, parse_file
from trainer.environments.minirepo.tasks import Bug, MiniRepoConfig, MiniRepoTask, MiniRepoTasks, TestCase

__all__ = [
    "COMMANDS",
    "Bug",
    "EvalError",
    "EvalTimeout",
    "MiniRepoConfig",
    "MiniRepoEnv",
    "MiniRepoTask",
    "MiniRepoTasks",
    "ProgramError",
    "TestCase",
    "Transcript",
    "call",
    "expert_action",
    "parse_file",
    "play_expert",
    "sample_texts",
    "vocabulary",
]
