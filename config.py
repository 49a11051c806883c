"""Settings as dataclasses: defaults < a TOML file < --key=value, with types checked; every command parses this way.

Each field carries a one-line help string (`opt`) and may declare where it applies and whether it changes any
weight, so every reader asks the declaration rather than keeping a list of its own. Keys are unique across the
dataclasses parsed together, so a flat TOML file or command line can set any of them. `--key=value` and
`--key value` both work; a bare --flag sets a bool field to true.
"""

import contextlib
import difflib
import math
import sys
import tomllib
import types
import typing
from dataclasses import field, fields
from pathlib import Path


# the checks a field may declare: (what the error says the value must be, the test it passes)
POSITIVE = ("be a positive integer", lambda v: v > 0)
NON_NEGATIVE = ("be a finite number >= 0", lambda v: 0 <= v < math.inf)
RATE = ("be a finite number > 0", lambda v: 0 < v < math.inf)
FRACTION = ("lie in [0, 1)", lambda v: 0 <= v < 1)
SHARE = ("lie in [0, 1]", lambda v: 0 <= v <= 1)


def one_of(choices):
    return "be one of " + ", ".join(choices), lambda v: v in choices


def opt(default, help, applies=None, weights=True, check=None, built=False, resume=False, renamed=()):
    """A dataclass field with its help string. applies: what the setting acts on (the owner checks a setting that
    is not at its default against it); weights=False: no weight depends on it, so it may change on a built or
    loaded model, unless built=True: modules are built with it; resume=True: a resume may change it; renamed: the
    names it had before, which older files may carry; check: one of the checks above, which `validate` applies
    (None values pass: a default rule)."""
    return field(default=default, metadata={"help": help, "applies": applies, "weights": weights, "check": check,
                                            "built": built, "resume": resume, "renamed": renamed})


def check_of(cls, name):
    """The check dataclass cls declares for its field name: a tool's setting that overrides it reuses it."""
    return cls.__dataclass_fields__[name].metadata["check"]


def weightless(cls):
    """The fields of cls declared weights=False."""
    return tuple(f.name for f in fields(cls) if not f.metadata.get("weights", True))


def declared(cls, what):
    """The fields of cls whose declaration says what (built, resume: opt's flags)."""
    return tuple(f.name for f in fields(cls) if f.metadata.get(what))


def current_names(cls, settings):
    """settings (a dict, e.g. read from an older file) with every renamed field of cls under its name now."""
    now = {old: f.name for f in fields(cls) for old in f.metadata.get("renamed", ())}
    return {now.get(k, k): v for k, v in settings.items()}


def validate(settings):
    """A dataclass's __post_init__ check: every field that declares a check passes it, or one ValueError names it."""
    for f in fields(settings):
        what, ok = f.metadata.get("check") or ("", None)
        value = getattr(settings, f.name)
        if ok and value is not None and not ok(value):
            raise ValueError(f"{f.name}={value!r} must {what}")


def known_keys(classes):
    """Every settable key, mapped to (dataclass, its type): a type, even where a module's annotations are strings."""
    out = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            assert f.name not in out, f"config key {f.name} is defined twice"
            out[f.name] = (cls, hints[f.name])
    return out


BOOL_WORDS = ("true", "1", "yes", "false", "0", "no")  # what a bool setting reads from the command line, true first


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
        if from_cli and value.lower() in BOOL_WORDS:
            return value.lower() in BOOL_WORDS[:3]
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


def command_line(args, known):
    """{key: text} of [--key=value | --key value | --flag ...]."""
    cli, i = {}, 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.removeprefix("--").partition("=")
        following = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        if arg.startswith("--") and not eq and key in known:
            if takes_bool(known[key][1]) and (following or "").lower() not in BOOL_WORDS:
                value, eq = "true", "="  # a bare flag
            elif following is not None:
                i, value, eq = i + 1, following, "="
        if not arg.startswith("--") or not eq:
            raise ValueError(f"argument {arg!r} should look like --key=value (one optional CONFIG.toml may come first)")
        cli[key] = value
        i += 1
    return cli


def parse(argv, *classes):
    """One instance of each dataclass from [CONFIG.toml] [--key=value ...]."""
    known = known_keys(classes)
    args = list(argv)
    values = read_toml(args.pop(0)) if args and not args[0].startswith("--") else {}
    cli = command_line(args, known)
    kwargs = {cls: {} for cls in classes}
    for key, value in (values | cli).items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown config key {key!r}; {hint}--help lists every key")
        cls, type_ = known[key]
        kwargs[cls][key] = coerce(key, value, type_, key in cli)
    return tuple(cls(**kwargs[cls]) for cls in classes)


def help_text(*classes):
    return "\n".join(f"  {f'--{f.name}={f.default}':<34} {f.metadata['help']}" for cls in classes for f in fields(cls))


def main(argv, doc, classes, run):
    """A command's main: --help prints doc and every setting of classes; else run(*their parsed values). Bad input
    (any ValueError) is one `error:` line and exit 1; Ctrl-C exits 130."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(doc + "\nSettings (defaults < CONFIG.toml < --key=value):\n" + help_text(*classes))
        return
    try:
        run(*parse(argv, *classes))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(130)
