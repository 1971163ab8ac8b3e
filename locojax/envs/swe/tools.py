"""The SWE file tools, `view` and `replace`, acting on an in-memory repository.

The repository is a `{relative posix path: text}` dict held by the environment. The model's
edits never touch the host disk: the tools only rewrite strings, and the repository is written
out into a fresh sandbox work dir each time tests run. Path rules are still enforced here so
that the model gets a clear error instead of a surprise (and so the sandbox never sees
`../` paths).

Call syntax (inside the `<tool>...</tool>` of `locojax.envs.base`):

    <tool>view</tool>                      list every file
    <tool>view src</tool>                  list files under a directory
    <tool>view src/calc.py</tool>          show a file
    <tool>replace src/calc.py
    <old>
        return a - b
    </old>
    <new>
        return a + b
    </new></tool>                          replace the one exact occurrence of old with new

One newline right after `<old>`/`<new>` and one right before `</old>`/`</new>` are not part of
the text, so blocks can sit on their own lines. `old` must occur exactly once.

Reference: SWE-agent's `str_replace` edit tool (exact, unique match; errors that say why).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath

MAX_FILE_CHARS = 200_000
"""A replace may not grow a file beyond this (keeps observations and sandbox copies small)."""

_REPLACE_RE = re.compile(r"<old>\n?(.*?)\n?</old>\s*<new>\n?(.*?)\n?</new>\s*\Z", re.DOTALL)


class ToolError(ValueError):
    """A bad tool call; its message becomes the observation."""


def check_path(raw: str) -> str:
    """Normalise a repository path, rejecting anything that could leave the repository."""
    raw = raw.strip()
    if not raw:
        raise ToolError("missing path")
    if "\x00" in raw or "\\" in raw:
        raise ToolError(f"invalid path {raw!r}")
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts:
        raise ToolError(f"path {raw!r} is outside the repository; use a relative path such as "
                        f"'src/module.py'")
    return str(p)


def list_files(files: Mapping[str, str], under: str = ".") -> str:
    prefix = "" if under == "." else under.rstrip("/") + "/"
    names = sorted(p for p in files if p.startswith(prefix))
    if not names:
        raise ToolError(f"no such file or directory: {under!r}")
    return "\n".join(names)


def view(files: Mapping[str, str], args: str) -> str:
    """`view [path]`: a file's text, or the files under a directory (all files when empty)."""
    if not args.strip():
        return list_files(files)
    path = check_path(args)
    if path in files:
        return files[path] if files[path] else "(empty file)"
    return list_files(files, path)


def parse_replace(args: str) -> tuple[str, str, str]:
    """Split `replace` arguments into (path, old, new)."""
    head, sep, _ = args.partition("<old>")
    path = head.strip()
    if not sep:
        raise ToolError("replace needs: replace PATH <old>old text</old><new>new text</new>")
    m = _REPLACE_RE.search(args, len(head))
    if m is None:
        raise ToolError("replace: could not find <old>...</old> followed by <new>...</new>")
    if not path:
        raise ToolError("replace: missing PATH before <old>")
    return check_path(path), m.group(1), m.group(2)


def replace(files: Mapping[str, str], args: str) -> tuple[str, str, str]:
    """`replace PATH <old>..</old><new>..</new>` -> (path, new file text, message for the model)."""
    path, old, new = parse_replace(args)
    if path not in files:
        raise ToolError(f"no such file: {path!r} (replace edits existing files only)")
    if not old:
        raise ToolError("replace: <old> text is empty")
    text = files[path]
    count = text.count(old)
    if count == 0:
        raise ToolError(f"replace: old text not found in {path}; view the file and copy the "
                        f"text exactly, including indentation")
    if count > 1:
        raise ToolError(f"replace: old text occurs {count} times in {path}; include more "
                        f"surrounding lines so it is unique")
    start = text.index(old)
    updated = text[:start] + new + text[start + len(old):]
    if len(updated) > MAX_FILE_CHARS:
        raise ToolError(f"replace: {path} would exceed {MAX_FILE_CHARS} characters")
    return path, updated, f"edited {path}:\n{_snippet(updated, start, len(new))}"


def _snippet(text: str, start: int, length: int, context: int = 2) -> str:
    """The edited lines with a little context, numbered, so the model can check the result."""
    lines = text.split("\n")
    first = text.count("\n", 0, start)
    last = text.count("\n", 0, start + length)
    lo, hi = max(0, first - context), min(len(lines), last + context + 1)
    return "\n".join(f"{i + 1:4d}| {lines[i]}" for i in range(lo, hi))
