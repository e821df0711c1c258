"""The ``dead_letter=`` argument of the API's steps: an OutputTag typed as dead letters."""

from __future__ import annotations

from typing import Any

from ember.errors import PipelineError
from ember.functions import DEAD_LETTER_SCHEMA, OutputTag

__all__ = ["dead_letter_tag", "optional_dead_letter_tag"]


def dead_letter_tag(tag: Any, what: str, name: str | None) -> Any:
    """``tag`` typed as a dead-letter output (``raw string, error string``)."""
    if not isinstance(tag, OutputTag):
        raise PipelineError(f"{what} must be an OutputTag, got {tag!r}", name or what.split()[0])
    if tag.schema not in (None, DEAD_LETTER_SCHEMA):
        raise PipelineError(
            f"{what}: tag '{tag.name}' carries dead letters ({DEAD_LETTER_SCHEMA}); declare it without a schema",
            name or what.split()[0],
        )
    return OutputTag(tag.name, DEAD_LETTER_SCHEMA)


def optional_dead_letter_tag(tag: Any, what: str, name: str | None) -> Any:
    """:func:`dead_letter_tag` for a step whose ``dead_letter`` may be left out (None)."""
    return None if tag is None else dead_letter_tag(tag, what, name)
