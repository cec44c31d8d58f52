"""What a simulation leaves behind, written for people: CSV tables of result rows."""

from __future__ import annotations

import csv
from pathlib import Path


def write_rows(rows: list[dict], path: Path, skip: str) -> None:
    """One CSV line per result row, every key but ``skip`` (a nested value written elsewhere)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, [k for k in rows[0] if k != skip], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
