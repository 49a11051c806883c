"""A run's files written safely: atomic writes whose failures are one clear error, and a lock per run folder.

Checkpoints, config.json, metrics.jsonl, ablation results and prepared datasets (through data/staging.py) all go
through here, so a full or read-only device is reported the same way everywhere and never leaves a half-written file
that a later command would accept.
"""

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

LOCK_FILE = ".lock"


class WriteError(ValueError):
    """A file could not be written; whatever stood at its path before is left as it was."""


def size(n):
    """n bytes for people: 196.1 KiB, 1.2 GiB."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


class _Counter:
    """A write-only sink that counts bytes: how large a file would have been."""

    def __init__(self):
        self.n = 0

    def write(self, data):
        self.n += len(data)
        return len(data)

    def flush(self):
        pass


def write_failure(path, e, write=None):
    """The WriteError for an OSError e met writing path: what failed, and for a full device how much the file
    needed (measured by writing it to a counter) against what was free."""
    path = Path(path)
    why = os.strerror(e.errno) if e.errno else str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        needed = ""
        if write is not None:
            counter = _Counter()
            with contextlib.suppress(Exception):  # a writer that insists on a real file: the free space alone
                write(counter)
                needed = f"it needs {size(counter.n)}, "
        free = shutil.disk_usage(path.parent).free
        return WriteError(f"cannot write {path}: the device is full ({why}; {needed}{size(free)} free there)")
    if e.errno == errno.EROFS:
        return WriteError(f"cannot write {path}: the device is read-only ({why}); give a folder on a writable one")
    return WriteError(f"cannot write {path}: {why}")


def atomic_write(path, write):
    """write(file) to path through a temporary file in the same folder, flushed, fsynced and renamed over
    path: a crash at any moment leaves either the old file or the new one, whole. A failed write (a full or
    read-only device) raises WriteError and leaves the old file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # one fixed name, so a killed write leaves no pile of them
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except Exception as e:
        cause = os_error(e)
        if cause is None:
            raise
        tmp.unlink(missing_ok=True)  # first, so the free space reported counts its room
        raise write_failure(path, cause, write) from None
    finally:  # whatever stopped the write, Ctrl-C included, no temporary stays
        tmp.unlink(missing_ok=True)


def os_error(e):
    """The OSError behind e, if any: torch.save's writer turns a failed write into a RuntimeError of its own
    ("enforce fail ... unexpected pos"), raised while the OSError is handled."""
    while e is not None and not isinstance(e, OSError):
        e = e.__cause__ or e.__context__
    return e


def open_log(path):
    """path opened to append text lines; a device that refuses raises WriteError."""
    try:
        return open(path, "a")
    except OSError as e:
        raise write_failure(path, e) from None


def read_log(path):
    """The lines of a metrics log written with append_line: JSON objects, each with its integer "iter". The last
    line, if torn by a crash, is skipped; any other line that is not one is damage, refused naming the file and the
    line, as is a file that is not text."""
    path = Path(path)
    try:
        texts = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is damaged: it is not text ({e.reason} at byte {e.start}); delete it, or the run "
            "folder, to start afresh"
        ) from None
    lines = []
    for n, text in enumerate(texts, 1):
        try:
            line = json.loads(text)
        except ValueError:
            if n == len(texts):  # what a crash mid-write leaves: a prefix of an object, which never parses
                break
            line = None
        if not (isinstance(line, dict) and isinstance(line.get("iter"), int)):
            raise ValueError(
                f"{path} is damaged: line {n} is not a metrics line ({text[:60]!r}); delete that line, "
                "or the file to start its log afresh"
            )
        lines.append(line)
    return lines


def trim_log(path, upto):
    """Keep the log lines of iterations up to upto (a torn last one dropped): the resumed run logs the later ones
    again."""
    kept = "".join(json.dumps(m) + "\n" for m in read_log(path) if m["iter"] <= upto)
    atomic_write(path, lambda f: f.write(kept.encode()))


def append_line(f, line):
    """Append one text line to the open log f and flush it; a torn last line is what a crash leaves (readers skip
    it). A failed write raises WriteError."""
    try:
        f.write(line + "\n")
        f.flush()
    except OSError as e:
        raise write_failure(f.name, e) from None


class RunLock:
    """An exclusive lock on a run folder for as long as the run lives: a second run there is refused at once,
    naming the process that holds it. The OS drops the lock when its process ends, however it ends, so a
    killed run never blocks the next one (the file it leaves behind holds no lock)."""

    def __init__(self, folder, what):
        self.path, self.what, self.fd = Path(folder) / LOCK_FILE, what, None

    def __enter__(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_failure(self.path, e) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace")
            os.close(self.fd)
            raise ValueError(
                f"{self.path.parent} is in use by another {self.what} ({describe_holder(holder)}); "
                "wait for it to finish, stop it, or use another folder"
            ) from None
        holder = {
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        }
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder).encode(), 0)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the lock


def describe_holder(text):
    try:
        h = json.loads(text)
        return f"pid {h['pid']}, started {h['started']}: {h['command']}"
    except (ValueError, KeyError, TypeError):  # written by a run that was killed while writing it
        return "a process that left no details"
