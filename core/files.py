"""Files and folders stepscope creates: never writable by others, whatever the umask.

Folders are made with mode 0o755 and files with 0o644; a stricter umask narrows
them further (it is honoured), a permissive one (``umask 000``) never widens them.
Files that a library writes itself (Parquet through pyarrow) are narrowed after
the fact with ``narrow``/``narrow_tree``.
"""

from __future__ import annotations

import os

DIR_MODE = 0o755
FILE_MODE = 0o644
OTHERS_WRITE = 0o022  # group and other write: never granted


def make_dir(path: str) -> None:
    """``os.mkdir`` with mode 0o755 (raises FileExistsError like it)."""
    os.mkdir(path, DIR_MODE)


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each missing level made with mode 0o755
    (os.makedirs gives the intermediate levels the umask's default)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent and parent != os.path.abspath(path):
        make_dirs(parent)
    try:
        make_dir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def open_new(path: str, mode: str = "w", encoding=None):
    """Opens ``path`` for writing (created, or truncated) with mode 0o644; a file that
    existed keeps its mode, less any write permission for others. ``mode``: "w" or "wb"."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        _narrow_fd(fd)
        return os.fdopen(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def narrow(path: str) -> None:
    """Takes write permission for group and others away from ``path`` if it has it."""
    try:
        st = os.lstat(path)
        if st.st_mode & OTHERS_WRITE and not os.path.islink(path):
            os.chmod(path, st.st_mode & 0o7777 & ~OTHERS_WRITE)
    except OSError:
        pass


def narrow_tree(root: str) -> None:
    """``narrow`` on a folder and everything in it (what pyarrow or a copy created)."""
    narrow(root)
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            narrow(os.path.join(folder, name))


def _narrow_fd(fd: int) -> None:
    st = os.fstat(fd)
    if st.st_mode & OTHERS_WRITE:
        os.fchmod(fd, st.st_mode & 0o7777 & ~OTHERS_WRITE)
