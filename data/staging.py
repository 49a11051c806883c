"""A prepared dataset's files written whole: each file streamed a piece at a time into a temporary folder, which is
published into the dataset's folder only once every file is complete, so a reader never takes a mix of old and new.
Failures are files.py's one clear WriteError.
"""

import contextlib
import os
import shutil
from pathlib import Path

from files import write_failure


class Stream:
    """A binary file written a piece at a time, for output too large to hand to atomic_write in one go. It belongs in
    a staged_folder, which publishes it only once it is whole. A failed open or write raises WriteError."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self.f = open(self.path, "wb")  # noqa: SIM115 (a stream: the caller closes it, through close or a with)
        except OSError as e:
            raise write_failure(self.path, e) from None

    def write(self, data):
        try:
            self.f.write(data)
        except OSError as e:
            raise write_failure(self.path, e) from None

    def close(self):
        """Flush to the device (the rename that publishes the file must not overtake its data)."""
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
        except OSError as e:
            raise write_failure(self.path, e) from None
        finally:
            self.f.close()


@contextlib.contextmanager
def staged_folder(path, last, drop=()):
    """A temporary folder beside path, to fill with a set of files that belong together (a prepared dataset). When
    the block ends without error they are published into path: its `last` file is taken away first, the others are
    moved in (and those named in drop that the new set lacks are removed), and `last` is moved in last. Until then
    path is untouched, and a crash while publishing leaves it without `last`, so a reader that needs `last` never
    takes a mix of old and new files. However the block ends, Ctrl-C included, no temporary folder stays."""
    path = Path(path)
    stage = path.with_name(f".{path.name}.tmp")  # one fixed name, so a killed run leaves no pile of them
    try:
        shutil.rmtree(stage, ignore_errors=True)  # left by a killed run
        stage.mkdir(parents=True)
    except OSError as e:
        raise write_failure(stage, e) from None
    try:
        yield stage
        publish(stage, path, last, drop)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(stage, path, last, drop):
    try:
        if not path.exists():
            os.rename(stage, path)  # the whole folder appears at once
        else:
            (path / last).unlink(missing_ok=True)
            for name in sorted(set(drop) - {p.name for p in stage.iterdir()}):
                (path / name).unlink(missing_ok=True)
            for file in sorted(stage.iterdir(), key=lambda p: p.name == last):  # last at the end
                os.replace(file, path / file.name)
        for folder in (path, path.parent):  # make the renames durable
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as e:
        raise write_failure(path, e) from None
