"""A process's identity: its pid and start time, so that a pid the kernel has since given to another process is
not mistaken for the one watched (the workflow's head for `--exit-with`, a container's owner for cleanup)."""

from __future__ import annotations

from pathlib import Path


def process_start_time(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22); None when it is gone, a zombie, or
    cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, ValueError, IndexError):
        return None
