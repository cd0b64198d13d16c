"""Logs and provenance: Parquet metrics tables that carry their own origin (`parquet_log`), the rows the trainer
writes into them (`rows`), and the provenance record the tables embed (`provenance`). Checkpoints are
`trainer.checkpoints`.

The package exports only what reading and writing logs needs, which imports no torch, so the analysis side can
read logs without it; import rows from its module (`from trainer.logs.rows import ...`).
"""

from trainer.logs.parquet_log import EPISODE_COLUMNS, METRIC_COLUMNS, MetricsLog, read_log
from trainer.logs.provenance import collect_provenance

__all__ = ["EPISODE_COLUMNS", "METRIC_COLUMNS", "MetricsLog", "collect_provenance", "read_log"]
