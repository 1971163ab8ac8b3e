"""Reading a JSON file a user handed us: one place for the error that names it.

Model configs, safetensors indexes and tokenizer files all arrive from outside; a corrupt
one must be refused with its path (and line and column), not a bare `JSONDecodeError`.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_object(path: Path) -> dict:
    """A JSON object from `path`; a corrupt file is a ValueError naming it, with the line."""
    try:
        d = json.loads(Path(path).read_bytes())  # bytes: JSON's own UTF-8/16/32 detection
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: must hold a JSON object, not a {type(d).__name__}")
    return d
