"""The bundled trainer of the harness: `python -m trainer {train,warm-start,eval,plan}` (see trainer/__main__.py).

`TRAINER_VERSION` names the behaviour of the trainer's results, not the package release. The Snakemake workflow
passes it as a parameter of every training and warm-start job, so bumping it marks every cell and base policy out
of date and the next `snakemake` run retrains them. Bump it deliberately, in the same change, whenever a change to
the trainer would change the numbers a cell produces (an algorithm, a default, the environment); leave it alone
for refactors, logging and speed work. The workflow imports it from here when it builds the DAG, so this file
imports nothing (in particular no torch).
"""

TRAINER_VERSION = "6"
