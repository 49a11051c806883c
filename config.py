"""Settings as dataclasses: defaults < a TOML file < --key=value, with types checked.

Each field carries a one-line help string (`opt`). Keys are unique across the dataclasses
parsed together, so a flat TOML file or command line can set any of them. A bare --flag
sets a bool field to true.
"""

import argparse
import contextlib
import difflib
import sys
import tomllib
import types
from dataclasses import field, fields
from pathlib import Path


def opt(default, help):
    """A dataclass field with its help string."""
    return field(default=default, metadata={"help": help})


def require_positive(settings, *names):
    """A dataclass's __post_init__ check: each named field is a positive integer (None allowed: a default rule)."""
    for name in names:
        value = getattr(settings, name)
        if value is not None and value <= 0:
            raise ValueError(f"{name}={value} must be a positive integer")


def known_keys(classes):
    """Every settable key, mapped to (dataclass, field)."""
    out = {}
    for cls in classes:
        for f in fields(cls):
            assert f.name not in out, f"config key {f.name} is defined twice"
            out[f.name] = (cls, f)
    return out


def takes_bool(type_):
    return bool in getattr(type_, "__args__", (type_,))  # bool, or bool | None


def coerce(key, value, type_, from_cli=True):
    """value (a TOML value, or text from the command line) as type_, or a ValueError naming both."""
    if isinstance(type_, types.UnionType):  # X | None: 'none' or 'auto' on the command line picks the default rule
        if from_cli and value.lower() in ("none", "auto"):
            return None
        type_ = next(t for t in type_.__args__ if t is not type(None))
    if type_ is bool:
        if not from_cli and isinstance(value, bool):
            return value
        if from_cli and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key}={value!r} is not a valid bool; use true or false")
    if type_ in (int, float):
        if from_cli:
            with contextlib.suppress(ValueError):
                return type_(value)
        # TOML: an int is fine where a float is wanted, never the reverse; bools and strings are not numbers
        elif isinstance(value, (int, type_)) and not isinstance(value, bool):
            return type_(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"{key}={value!r} is not a valid {type_.__name__}")


def read_toml(path):
    path = Path(path)
    if not path.is_file():
        hint = f"; settings go as --{path}" if "=" in str(path) else " (configs/ lists the shipped ones)"
        raise ValueError(f"config file {str(path)!r} does not exist{hint}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    except OSError as e:
        raise ValueError(f"config file {str(path)!r} cannot be read: {e.strerror}") from None


def parse(argv, *classes):
    """One instance of each dataclass from [CONFIG.toml] [--key=value ...]."""
    known = known_keys(classes)
    args = list(argv)
    values = read_toml(args.pop(0)) if args and not args[0].startswith("--") else {}
    cli = {}
    for arg in args:
        key, eq, value = arg.removeprefix("--").partition("=")
        if arg.startswith("--") and not eq and key in known and takes_bool(known[key][1].type):
            value, eq = "true", "="
        if not arg.startswith("--") or not eq:
            raise ValueError(f"argument {arg!r} should look like --key=value (one optional CONFIG.toml may come first)")
        cli[key] = value
    kwargs = {cls: {} for cls in classes}
    for key, value in (values | cli).items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown config key {key!r}; {hint}--help lists every key")
        cls, f = known[key]
        kwargs[cls][key] = coerce(key, value, f.type, key in cli)
    return tuple(cls(**kwargs[cls]) for cls in classes)


def help_text(*classes):
    return "\n".join(f"  {f'--{key}={f.default}':<34} {f.metadata['help']}" for key, (_, f) in known_keys(classes).items())


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the commands that take flags (sample.py, bench.py): one `error:` line and exit 1 on a
    bad flag, like every other error here, instead of argparse's usage block and exit 2."""

    def error(self, message):
        print(f"error: {message} (python {self.prog} --help lists the options)", file=sys.stderr)
        sys.exit(1)


def checked(convert, valid, what):
    """An argparse type: convert the text, then insist on valid(value), naming the bad value and `what`."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


positive_int = checked(int, lambda v: v > 0, "a positive integer")
