"""The tester's view of the trusted test tree: what the task has, never what is on disk.

The code under test runs beside the tests under the same uid and may rewrite, delete or
replace any file of the work dir while they run. So in the tester (`harness.py`), every way
a test reaches a file of the tree answers from the task's copy in memory:

- `open` (builtins and `io`) serves a data file's text, read-only (`.py` files are imported
  from the copy by the harness's finder);
- `os.path.realpath` (and so `Path.resolve`) resolves a tree path, or a directory above one,
  lexically: a symlink planted in place of `tests/` cannot lead a test to the code's files;
- `os.stat`/`os.lstat` (and so `os.path.exists`, `isfile`, `isdir`, `Path.exists`) see a tree
  file as a read-only file of its size and a tree directory as a directory, deleted or not;
- `os.listdir`/`os.scandir` (and so `glob`, `os.walk`, `Path.iterdir`, `Path.glob`) list a
  directory that holds only trusted files (`owned`, e.g. `tests/`) exactly as the task has it,
  and any other directory above a tree file with the tree's entries added to the disk's, so
  deleting a placeholder cannot hide a case from a test that lists its data.

Stdlib only: it runs inside the sandbox, copied there as `.locojax/treeview.py`. Paths are
compared after `abspath`, which reads nothing from disk. A file descriptor passed instead of
a path, and every path outside the tree, reach the real function.
"""

import builtins
import io
import os
import stat


def serve_tree(tree, owned, work):
    """Install the view. `tree`: {absolute path: text} of every trusted file; `owned`: the
    absolute directories that hold only trusted files; `work`: the work dir (the cwd)."""
    dirs = _tree_dirs(tree, work)
    _serve_from_memory({p: src for p, src in tree.items() if not p.endswith(".py")})
    _resolve_lexically(set(tree) | (dirs - {work}))
    _stat_from_tree(tree, dirs - {work})
    _list_from_tree(_children(tree, dirs), set(owned))


def _tree_dirs(tree, work):
    """Every directory above a tree file, up to and including the work dir."""
    dirs = set()
    for path in tree:
        while path.startswith(work + os.sep):
            path = os.path.dirname(path)
            dirs.add(path)
    return dirs


def _children(tree, dirs):
    """{directory: {name: is_dir}} of the tree's entries."""
    out = {d: {} for d in dirs}
    for path in (*tree, *dirs):
        parent = os.path.dirname(path)
        if parent in out and path != parent:
            out[parent][os.path.basename(path)] = path in dirs
    return out


def _tree_path(path):
    """The absolute str path of a path argument, or None for a file descriptor."""
    if isinstance(path, int):
        return None
    return os.path.abspath(os.fsdecode(path))


def _serve_from_memory(data):
    """The tester's `open` (builtins and io) answers a trusted data file's path from `data`
    (its text as the task has it), read-only; the work dir holds only a blank placeholder,
    which the code may rewrite at will."""
    real_open = io.open

    def trusted_open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None,
                     closefd=True, opener=None):
        if isinstance(file, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(file))
            if path in data:
                if set(mode) & set("wax+"):
                    raise PermissionError(f"{path}: a trusted test file is read-only")
                raw = io.BytesIO(data[path].encode())
                if "b" in mode:
                    return raw
                return io.TextIOWrapper(raw, encoding=encoding or "utf-8", errors=errors,
                                        newline=newline)
        return real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)

    builtins.open = io.open = trusted_open


def _resolve_lexically(known):
    """`os.path.realpath` of a known path is the path itself, never read through the disk,
    where the code may have swapped a directory for a symlink to its own files
    (`realpath(__file__)` then led a test to forged data). The work dir itself is real."""
    real = os.path.realpath

    def realpath(filename, *, strict=False):
        path = os.path.abspath(os.fsdecode(filename))
        if path in known:
            return path if isinstance(os.fspath(filename), str) else os.fsencode(path)
        return real(filename, strict=strict)

    os.path.realpath = realpath


def _stat_from_tree(tree, dirs):
    """`os.stat`/`os.lstat` of a tree path: a read-only file of the task's size, or a
    directory, whatever the disk holds there now."""
    real_stat, real_lstat = os.stat, os.lstat
    uid, gid = os.getuid(), os.getgid()

    def fake(path):
        if path in tree:
            mode, size = stat.S_IFREG | 0o444, len(tree[path].encode())
        elif path in dirs:
            mode, size = stat.S_IFDIR | 0o555, 0
        else:
            return None
        return os.stat_result((mode, 0, 0, 1, uid, gid, size, 0, 0, 0))

    def trusted_stat(path, *, dir_fd=None, follow_symlinks=True):
        got = fake(_tree_path(path)) if dir_fd is None else None
        return got or real_stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    def trusted_lstat(path, *, dir_fd=None):
        got = fake(_tree_path(path)) if dir_fd is None else None
        return got or real_lstat(path, dir_fd=dir_fd)

    os.stat, os.lstat = trusted_stat, trusted_lstat


class _Entry:
    """A `os.DirEntry` of the tree: its type from the task, its stat from `os.stat`."""

    def __init__(self, parent, name, is_dir):
        self.name, self.path, self._is_dir = name, os.path.join(parent, name), is_dir

    def __fspath__(self):
        return self.path

    def is_dir(self, *, follow_symlinks=True):
        return self._is_dir

    def is_file(self, *, follow_symlinks=True):
        return not self._is_dir

    def is_symlink(self):
        return False

    def stat(self, *, follow_symlinks=True):
        return os.stat(self.path)

    def inode(self):
        return 0


class _Listing:
    """What `os.scandir` returns: an iterator and a context manager."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _list_from_tree(children, owned):
    """`os.listdir`/`os.scandir` of a tree directory: the task's entries (an owned
    directory), or the task's entries added to the disk's (a directory the code shares)."""
    real_listdir, real_scandir = os.listdir, os.scandir

    def names(path, given):
        tree = children[path]
        if path in owned:
            return tree, []
        try:
            with real_scandir(given) as it:  # as given: entries' paths keep its form
                disk = [e for e in it if os.fsdecode(e.name) not in tree]
        except OSError:  # the code removed it or made it unreadable: the tree still lists
            disk = []
        return tree, disk

    def trusted_listdir(path="."):
        where = _tree_path(path)
        if where not in children:
            return real_listdir(path)
        tree, disk = names(where, path)
        out = sorted(tree) + [os.fsdecode(e.name) for e in disk]
        return [os.fsencode(n) for n in out] if isinstance(path, bytes) else out

    def trusted_scandir(path="."):
        where = _tree_path(path)
        if where not in children:
            return real_scandir(path)
        tree, disk = names(where, path)
        as_given = os.fsencode if isinstance(path, bytes) else str
        return _Listing([_Entry(as_given(os.fspath(path)), as_given(n), d)
                         for n, d in sorted(tree.items())] + disk)

    os.listdir, os.scandir = trusted_listdir, trusted_scandir
