"""Atomic file and directory writes: a reader (or a resumed run) never sees half a file.

Files and folders written here follow the process umask like any other output (``mkstemp`` and
``mkdtemp`` create private 0600/0700 entries, which would hide a model from a colleague or a
serving process running as another user). A write that fails for a reason outside the tool (a
full disk, a read-only folder, a path that is a file) becomes one :class:`OutputError` line
naming the path, and leaves no partial file behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

from finetune_cli.errors import FinetuneError, OutputError, error_text


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux /proc)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def _public(path: Path, is_dir: bool) -> None:
    """Give a temp entry the permissions a plain ``open``/``mkdir`` would have given it."""
    with contextlib.suppress(OSError):
        os.chmod(path, (0o777 if is_dir else 0o666) & ~current_umask())


def public_files(folder: str | Path) -> None:
    """Give every file under ``folder`` the permissions ``open`` gives under the process umask:
    libraries that write weights privately (safetensors 0.8 writes 0600) would otherwise leave the
    weights unreadable to the group that can read the rest of the folder."""
    mode = 0o666 & ~current_umask()
    for p in Path(folder).rglob("*"):
        if p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                os.chmod(p, mode)


def _free_space(path: Path) -> str:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return ""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if free < 1024 or unit == "TB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return ""


def is_write_failure(e: BaseException) -> bool:
    """An OSError, the RuntimeError ``torch.save`` raises when its writer fails (a full disk), or
    the I/O error safetensors reports (``SafetensorError: ... I/O error: ... (os error 28)``)."""
    if isinstance(e, OSError):
        return True
    msg = str(e)
    if type(e).__name__ == "SafetensorError":
        return "I/O error" in msg or "IoError" in msg
    return isinstance(e, RuntimeError) and ("inline_container" in msg or "file write failed" in msg
                                             or "unexpected pos" in msg)


def _disk_full(e: BaseException) -> bool:
    msg = str(e)
    return (getattr(e, "errno", None) == errno.ENOSPC or "No space left" in msg or "os error 28" in msg
            or "StorageFull" in msg or "unexpected pos" in msg or "file write failed" in msg)


def output_error(e: BaseException, path: Optional[str | Path], doing: str = "write") -> OutputError:
    """One line for a failed write of ``path``: what, where, and the free space on its disk (None:
    a path the error does not name either, so no disk is named rather than a wrong one)."""
    path = path or getattr(e, "filename", None)
    target = str(getattr(e, "filename", None) or path or "a file")
    code = getattr(e, "errno", None)
    if _disk_full(e):
        where = f"the disk holding {path} while writing {target} ({_free_space(Path(path))} free)" if path else "a disk"
        return OutputError(f"no space left on {where}; free some space or choose another output, then rerun")
    if code == errno.EROFS:
        return OutputError(f"cannot {doing} {target}: read-only file system")
    if code in (errno.EACCES, errno.EPERM):
        return OutputError(f"cannot {doing} {target}: permission denied")
    if code == errno.ENOTDIR:
        return OutputError(f"cannot {doing} {target}: a part of that path is a file, not a folder")
    if code == errno.EEXIST or code == errno.EISDIR:
        return OutputError(f"cannot {doing} {target}: {getattr(e, 'strerror', None) or e}")
    reason = getattr(e, "strerror", None) or error_text(e, 160)
    return OutputError(f"cannot {doing} {target}: {reason}")


def _refuse_file_ancestor(p: Path, what: str) -> None:
    """Refuse ``p`` when its nearest existing ancestor is a file (then nothing can be made under it)."""
    blocker = next((parent for parent in p.parents if parent.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputError(f"{what} {p} lies under {blocker}, which is a file")


def ensure_dir(path: str | Path, what: str = "output folder") -> Path:
    """Create folder ``path`` (and its parents), or raise one line saying why it cannot be one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file, not a folder")
    _refuse_file_ancestor(p, what)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(e, p, "create") from None
    return p


def real_path(path: str | Path) -> Path:
    """``path`` with ``~``, ``..`` and symbolic links resolved as far as they go: never raises (a
    link loop stays a path, where ``Path.resolve`` raises ``RuntimeError``)."""
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def check_apart(output: str | Path, inputs: Iterable[tuple[str, Optional[str | Path]]],
                what: str = "output folder", around: Iterable[tuple[str, str | Path]] = ()) -> None:
    """Refuse an output that *is* one of ``inputs`` (``(what it is, path)``; None skipped), *holds*
    it or *lies inside* it: replacing such an output (``--overwrite``, a fresh run, an export)
    would delete what the command reads. Links are followed, so a second name is caught too. Every
    command that writes a folder or a file checks its output here before any work. ``around``:
    folders the output may lie inside but must not be or hold (the current folder: a folder
    replaced whole cannot be the one the process stands in)."""
    out = real_path(output)
    # A data input (its name says `file` or `data`) that is a folder is left to its reader, which
    # refuses it in its own words ("is a directory") rather than here as a folder the output is in.
    inputs = [(n, p) for n, p in inputs
              if p is not None and not (("file" in n or "data" in n) and Path(p).is_dir())]
    found = []  # (rank, how, name, input): the closest relation is the one named
    for name, inp in inputs:
        if inp is None or str(inp) == "":
            continue
        src = real_path(inp)
        if out == src:
            found.append((0, "is", name, inp))
        elif out in src.parents:
            found.append((1, "holds", name, inp))
        elif src in out.parents:
            found.append((2, "lies inside", name, inp))
    if found:
        _, how, name, inp = min(found, key=lambda f: f[0])
        raise FinetuneError(f"{what} {output} {how} the {name} {inp}; writing it would replace what the command "
                            f"reads: choose an output outside it")
    for name, folder in around:
        if out == real_path(folder) or out in real_path(folder).parents:
            raise FinetuneError(f"{what} {output} {'is' if out == real_path(folder) else 'holds'} the {name} "
                                f"({real_path(folder)}), which cannot be replaced: choose a new folder")


def own_dir(path: str | Path, what: str = "folder") -> Path:
    """A sub-folder the tool owns inside its output (a run's ``figures/``), made a real folder: a
    symbolic link there is replaced (removed, not followed), so that nothing is written into the
    folder it points to; then :func:`ensure_dir`."""
    p = Path(path)
    if p.is_symlink():
        try:
            p.unlink()
        except OSError as e:
            raise output_error(e, p, "replace the link") from None
    return ensure_dir(p, what)


WRITE_TEST_PREFIX = ".finetune-write-test."


def check_writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """``ensure_dir`` plus a real write (a temp file, removed): read-only folders fail here, before
    any work is done, instead of after it."""
    p = ensure_dir(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=p, prefix=WRITE_TEST_PREFIX, suffix=".tmp")
    except OSError as e:
        raise output_error(e, p, "write into") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return p


def check_output_file(path: str | Path, what: str = "output") -> Path:
    """An output *file* path: not a folder, and its folder writable."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what} {p} is a folder, not a file")
    _refuse_file_ancestor(p, what)
    check_writable_dir(p.parent, f"folder of {what}")
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_file(target: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path (same suffix) to write with any library; on success it
    replaces ``target`` in one rename. On failure nothing is left (and an OSError becomes one
    :class:`OutputError` line)."""
    target = Path(target)
    ensure_dir(target.parent)
    try:
        fd, tmp_s = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=f".tmp{target.suffix}")
    except OSError as e:
        raise output_error(e, target) from None
    os.close(fd)
    tmp = Path(tmp_s)
    try:
        yield tmp
        _public(tmp, is_dir=False)
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not isinstance(e, FinetuneError) and is_write_failure(e):
            raise output_error(e, target) from None
        raise


@contextlib.contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``target`` in one rename.

    If the block raises, the temporary directory is removed and ``target`` is untouched; a write
    failure (full disk, read-only folder) becomes one :class:`OutputError` line naming the file.
    """
    target = Path(target)
    ensure_dir(target.parent)
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    except OSError as e:
        raise output_error(e, target) from None
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, FinetuneError) and is_write_failure(e):
            raise output_error(e, target) from None
        raise
    _public(tmp, is_dir=True)
    old: Optional[Path] = None
    try:
        if target.exists():
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(tmp, target)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():
            with contextlib.suppress(OSError):
                os.replace(old, target)
        raise output_error(e, target) from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def clean_stale_temps(directory: str | Path) -> None:
    """Remove leftovers of interrupted atomic writes (hidden ``.*.tmp[.ext]`` / ``.*.old-*`` entries)."""
    d = Path(directory)
    if not d.is_dir():
        return
    for p in d.iterdir():
        if p.name.startswith(".") and (p.name.endswith(".tmp") or ".tmp." in p.name or ".old-" in p.name):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
