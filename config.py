"""Settings as dataclasses: defaults < a TOML file < --key=value, with types checked; every command parses this way.

Each field carries a one-line help string (`opt`) and may declare where it applies and whether it changes any
weight, so every reader asks the declaration rather than keeping a list of its own. Keys are unique across the
dataclasses parsed together, so a flat TOML file or command line can set any of them. `--key=value` and
`--key value` both work; a bare --flag sets a bool field to true.
"""

import contextlib
import difflib
import importlib
import itertools
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
AT_LEAST_1 = ("be a finite number >= 1", lambda v: 1 <= v < math.inf)


def one_of(choices):
    return "be one of " + ", ".join(choices), lambda v: v in choices


def opt(default, help, applies=None, weights=True, check=None, built=False, resume=False, renamed=(), older=None):
    """A dataclass field with its help string. applies: what the setting acts on (the owner checks a setting that
    is not at its default against it); weights=False: no weight depends on it, so it may change on a built or
    loaded model, unless built=True: modules are built with it; resume=True: a resume may change it; renamed: the
    names it had before, which older files may carry; older: for a file recorded before the setting existed, its
    value there, a function of the file's settings; check: one of the checks above, which `validate` applies
    (None values pass: a default rule)."""
    return field(
        default=default,
        metadata={
            "help": help,
            "applies": applies,
            "weights": weights,
            "check": check,
            "built": built,
            "resume": resume,
            "renamed": renamed,
            "older": older,
        },
    )


def check_of(cls, name):
    """The check dataclass cls declares for its field name: a tool's setting that overrides it reuses it."""
    return cls.__dataclass_fields__[name].metadata["check"]


def weightless(cls):
    """The fields of cls declared weights=False."""
    return tuple(f.name for f in fields(cls) if not f.metadata.get("weights", True))


def declared(what, *classes):
    """The fields of classes whose declaration says what (built, resume: opt's flags)."""
    return tuple(f.name for cls in classes for f in fields(cls) if f.metadata.get(what))


def current_names(cls, settings):
    """settings (a dict, e.g. read from an older file) with every renamed field of cls under its name now, and each
    field of cls that declares its value in files older than it (`older`) added where settings lack it."""
    now = {old: f.name for f in fields(cls) for old in f.metadata.get("renamed", ())}
    out = {now.get(k, k): v for k, v in settings.items()}
    return {
        f.name: f.metadata["older"](out) for f in fields(cls) if f.metadata.get("older") and f.name not in out
    } | out


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


def optional_package(name, needed_by, install=None):
    """The optional package (or module) name, imported, or one ValueError line naming it and what needed_by (the
    setting or tool that asks for it) should do: install it if it is missing (install: the command, default pip
    install NAME), reinstall it if it is installed but its import fails, whatever that failure raises."""
    install = install or f"pip install {name.partition('.')[0]}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name + ".").startswith(e.name + "."):  # name itself, or a package above it
            raise ValueError(f"{needed_by} needs the {name} package, which is not installed: {install}") from None
        broken = e  # a module that name imports is missing: a broken install
    except Exception as e:  # a broken install fails in any way (ImportError, AttributeError, OSError, ...)
        broken = e
    why = (str(broken).strip().splitlines() or [""])[0][:160]
    raise ValueError(
        f"{needed_by} needs the {name} package, which is installed but fails to import "
        f"({type(broken).__name__}: {why}); reinstall it: {install}"
    ) from None


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


def split(argv):
    """(the settings of the TOML file, the --key=value arguments) of [CONFIG.toml] [--key=value ...]."""
    args = list(argv)
    return (read_toml(args.pop(0)) if args and not args[0].startswith("--") else {}), args


def chosen(classes, values, args=()):
    """classes, each one that declares a `chooser` (a field naming an object with settings of its own, as
    data.batches' task) swapped for the class cls.chosen(name) that holds them: name as the last --chooser=NAME of
    args gives it, else values (a TOML file's, or settings already typed), else the field's default."""
    out = []
    for cls in classes:
        key = getattr(cls, "chooser", None)
        if key is not None:
            name = values.get(key, cls.__dataclass_fields__[key].default)
            for arg, following in itertools.pairwise([*args, None]):
                typed, eq, value = arg.partition("=")
                if typed == f"--{key}" and (eq or following is not None):
                    name = value if eq else following
            cls = cls.chosen(name)
        out.append(cls)
    return tuple(out)


def chosen_by(key, classes):
    """What to type to choose the object whose setting key is (a hint for an unknown key), or ""."""
    for cls in classes:
        for name in getattr(cls, "choices", ()):
            if key in cls.chosen(name).__dataclass_fields__:
                return f"it is a setting of {cls.chooser}={name}: give --{cls.chooser}={name}; "
    return ""


def given(argv, *classes):
    """{key: value} of what [CONFIG.toml] [--key=value ...] sets, each value of its field's type: the settings typed,
    told apart from defaults even where they are equal."""
    values, args = split(argv)
    known = known_keys(chosen(classes, values, args))
    cli = command_line(args, known)
    out = {}
    for key, value in (values | cli).items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = chosen_by(key, classes) or (f"did you mean {close[0]!r}? " if close else "")
            raise ValueError(f"unknown config key {key!r}; {hint}--help lists every key")
        out[key] = coerce(key, value, known[key][1], key in cli)
    return out


def build(values, *classes):
    """One instance of each dataclass (or of the class its chooser picks) from {key: value}, defaults elsewhere."""
    return tuple(
        cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values}) for cls in chosen(classes, values)
    )


def resumed(typed, run, classes, where):
    """The settings a resume continues with: the run's own (run: {key: value}, as recorded in where) but for those
    typed, each of which must be one a resume may change (declared resume=True) or equal the run's."""
    built = build(run | typed, *classes)  # a typed value is checked where it is declared first
    free = declared("resume", *classes)
    clash = [
        f"{k}: the run has {run[k]!r}, now {v!r}"
        for k, v in typed.items()
        if k in run and k not in free and run[k] != v
    ]
    if clash:
        raise ValueError(
            f"cannot resume: this command contradicts the run in {where} ({'; '.join(clash)}); leave "
            f"them out to continue with the run's, which a resume keeps but for {', '.join(sorted(free))}"
        )
    return built


def parse(argv, *classes):
    """One instance of each dataclass from [CONFIG.toml] [--key=value ...]."""
    return build(given(argv, *classes), *classes)


def help_text(*classes):
    return "\n".join(f"  {f'--{f.name}={f.default}':<34} {f.metadata['help']}" for cls in classes for f in fields(cls))


def main(argv, doc, classes, run, read=None, error=lambda e: f"error: {e}", interrupted=lambda e: ""):
    """Every command's main: --help prints doc and every setting of classes (with those of the objects the other
    arguments choose); else run(*read(argv)), by default run(*parse(argv, *classes)). Bad input (any ValueError e)
    prints the one line error(e) (None: nothing, another process says it) and exits 1; Ctrl-C (KeyboardInterrupt)
    prints interrupted(e) and exits 130."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if "-h" in argv or "--help" in argv:
            shown = chosen(classes, *split(a for a in argv if a not in ("-h", "--help")))
            print(doc + "\nSettings (defaults < CONFIG.toml < --key=value):\n" + help_text(*shown))
            return
        run(*(read(argv) if read else parse(argv, *classes)))
    except ValueError as e:
        line = error(e)
        if line is not None:
            print(line, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as e:
        print(interrupted(e), file=sys.stderr)
        sys.exit(130)
