"""Reading a scenario's keys: TOML's numeric table keys as stage indices; a validation
error as one line (:mod:`schedsim.util.validation`). Used by
:func:`schedsim.scenario.parse_scenario`."""
from __future__ import annotations

from typing import Any

from schedsim.util.validation import allowed_keys, format_validation

__all__ = ["allowed_keys", "format_validation", "index_keys"]


def index_keys(data: Any) -> Any:
    """``data`` with every table key that is a whole number (``[costs.stage.3]``: TOML
    keys are strings) as an int, the per-stage tables' index; the rest as given."""
    if isinstance(data, dict):
        return {int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k:
                index_keys(v) for k, v in data.items()}
    if isinstance(data, list):
        return [index_keys(v) for v in data]
    return data
