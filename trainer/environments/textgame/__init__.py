"""A procedurally generated household text game in ALFWorld's style, for the companion study (GiGPO, GraphGPO).

Why it exists: the companion paper trains on ALFWorld, whose game files come from the web, not from a package
registry, so the embedded default cannot fetch them. This module generates games of the same shape (rooms of
numbered receptacles, numbered objects, goals such as "put a clean mug in coffeemachine.") from a seed, with
the same command grammar, feedback sentences and "Nothing happens." for anything inadmissible. About a hundred
word types appear (punctuation, digits and capitalised forms included; `vocabulary()` lists them), so a
~1M-parameter policy with a word-level tokenizer can read it.

Design choices (and which reading of an ambiguous spec is the default):
- **Determinism.** All randomness is spent when a task is generated; `step()` is a pure function of the world
  state and the action. The same task and the same actions give byte-identical observations in any instance, so
  GiGPO's anchor states (equal observation text) and GraphGPO's graph (observation + admissible list) are
  meaningful across rollouts of one task.
- **Observation = feedback + admissible list.** Every observation is the feedback sentence, a newline, then
  "Admissible actions: a | b | c" with the commands in natural order ("cabinet 2" before "cabinet 10"). The
  list shows where the agent stands and what it holds; the rest (what was cleaned, what lies elsewhere) is in
  the history, as in ALFWorld, and the same history always gives the same observation. The first observation
  also carries the goal ("Your task is to: ..."), as ALFWorld's does; later ones do not.
- **Grammar.** ALFWorld's commands: "go to R", "open R", "close R", "take O from R", "put O in/on R",
  "clean O with sinkbasin 1", "heat O with microwave 1", "cool O with fridge 1", "use desklamp 1",
  "examine R|O" (the receptacle one stands at, the object one holds: what ALFWorld 0.4 lists), "inventory",
  "look". We keep ALFWorld 0.3's "put O in/on R" (the form the issue names); ALFWorld 0.4 renamed it
  "move O to R". "look" in the middle of the room lists the receptacles again (ALFWorld 0.4 says "you see
  nothing" there, a quirk not copied). Input is lower-cased, whitespace-collapsed and stripped of one trailing
  period, then must equal an admissible command; anything else gets "Nothing happens." and
  `invalid_action=True`, and the episode goes on (ALFWorld semantics).
- **World rules** (as ALFWorld's PDDL): one object in hand at most; cabinets, drawers, the fridge and the
  microwave start closed and hide their contents; take/put need the receptacle open; clean/heat/cool need the
  agent at the sink basin/microwave/fridge holding the object (the appliance may stay closed); hot and cool
  exclude each other; the desk lamp sits on a desk, dresser or side table and cannot be taken.
- **Goals name types, not instances**, as ALFWorld's do: "put a clean mug in countertop." is met by any clean
  mug in any countertop; "put two mug in shelf." needs two mugs in the *same* shelf; "look at book under the
  desklamp." is met while the agent holds a book at the lamp's receptacle with the lamp on. Goals are checked
  on the state after every step; no goal holds in a generated initial state.
- **Knobs.** `n_receptacles` counts storage receptacles; the fridge, microwave and sink basin are always there
  (every task type can then be posed in every room, and rooms do not give away the task type).
  `n_objects` is the number of instances of the goal's object type; `n_distractors` is the number of objects of
  other types (TextWorld's meaning of "distractor": present, irrelevant).
- **Splits.** One seeded stream of layouts; a layout belongs to "heldout" when its content digest falls in one
  bucket of five, else to "train". Membership is a property of the layout, so the splits are disjoint by
  construction, duplicates are dropped, and changing one split's size never changes the other split.
- **Expert.** A planner with full knowledge of the world (like ALFWorld's PDDL planner expert), replanning from
  the current state every step, so with noise it recovers from the random actions it took.

Modules: `tasks` (the type catalogue, config, task records, generator, task source), `world` (command grammar,
world state, the rules and feedback, the goal check), `env` (the environment), `expert` (scripted expert,
transcripts, vocabulary).
"""

from trainer.environments.textgame.env import TextGameEnv
from trainer.environments.textgame.expert import (
    WORD_PATTERN,
    expert_action,
    planned_action,
    play_expert,
    sample_texts,
    vocabulary,
)
from trainer.environments.textgame.tasks import (
    APPLIANCES,
    LAMP_HOLDERS,
    OBJECT_TYPES,
    STORAGE_TYPES,
    TASK_TYPES,
    TextGameConfig,
    TextGameTask,
    TextGameTasks,
    natural_key,
)
from trainer.environments.textgame.world import (
    LAMP,
    NOTHING,
    OPENABLE,
    WorldState,
    admissible_commands,
    format_observation,
    goal_reached,
    normalize_action,
    parse_command,
)

__all__ = [
    "APPLIANCES",
    "LAMP",
    "LAMP_HOLDERS",
    "NOTHING",
    "OBJECT_TYPES",
    "OPENABLE",
    "STORAGE_TYPES",
    "TASK_TYPES",
    "TextGameConfig",
    "TextGameEnv",
    "TextGameTask",
    "TextGameTasks",
    "WORD_PATTERN",
    "WorldState",
    "admissible_commands",
    "expert_action",
    "format_observation",
    "goal_reached",
    "natural_key",
    "normalize_action",
    "parse_command",
    "planned_action",
    "play_expert",
    "sample_texts",
    "vocabulary",
]
