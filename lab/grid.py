"""The runs of a grid of settings x seeds: their folders, the check that a folder holds the settings asked for, their
training and summary, JSON records written atomically and read back with errors that name the file, and the parsing
of the lists and entries the lab's settings are written in.

A run is one train.py training in its own folder, resumed where an interrupted one stopped; a folder is reused only
when the settings it records are the ones asked for, so a rerun never mixes two grids, and an evaluation cached in it
only with the lab settings it read (`evaluated`); the paths a run records are read against its folder, which may have
moved. Where runs train is lab/launch.py's; the frame of a tool that sweeps rates and tests seeds, lab/sweep.py's. The
lab's tools (ablate, extend, recipe) build on these modules and never on each other.
"""

import contextlib
import json
import math
import os
import statistics
import sys
import typing
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import config
import train
from checkpoint import load_checkpoint
from config import opt
from data.batches import BatchConfig
from data.tokenizer import HF_PREFIX
from files import atomic_write, open_log, read_log
from lab.pool import Failed, Interrupted
from model import GPTConfig

NOT_SETTINGS = config.weightless(train.TrainConfig)  # train fields declared to change no weight of a run
# the train settings that name a file or folder: a lab folder that moved (into an archive, from a cluster to a laptop)
# still records them as they were, a fine-tune's base inside the lab folder under its old path
PATHS = ("train.data_dir", "train.init_from")
PROJECT = Path(__file__).resolve().parent.parent  # the checkout, which a results.json's paths are relative to
MADE_WITH = "made_with"  # the key of a cached evaluation's JSON under which it records the lab settings it read


@dataclass
class SeedSettings:
    """The seeds every run of a grid trains on; each lab tool's settings class inherits it."""

    seeds: int = opt(
        3, "test seeds: seed, seed+1, ..., fixed before the run; every comparison pairs them", check=config.POSITIVE
    )

    def __post_init__(self):
        config.validate(self)

    def test_seeds(self, train_cfg):
        return [train_cfg.seed + i for i in range(self.seeds)]


# ----------------------------------------------------------------------------- settings text


def split_list(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def field_types(cls, names):
    """{name: its type} of the named fields of dataclass cls."""
    hints = typing.get_type_hints(cls)
    return {f: hints[f] for f in names}


def parse_changes(text, types, what="variant"):
    """'name: key=value, key=value; name: ...' -> [(name, {key: value})], the keys those of types ({key: type},
    e.g. field_types of GPTConfig's); what names an entry in errors (a variant, a recipe)."""
    out = []
    for part in filter(str.strip, text.split(";")):
        name, colon, body = (s.strip() for s in part.partition(":"))
        if not colon or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(
                f"{what} {part.strip()!r} should look like 'name: key=value, ...', the name made of "
                f"letters, digits, '-', '_' and '.'"
            )
        overrides = {}
        for item in split_list(body):
            key, eq, value = (s.strip() for s in item.partition("="))
            if key not in types or not eq:
                raise ValueError(f"{what} {name!r}: {item!r} should be key=value, the key one of {', '.join(types)}")
            overrides[key] = config.coerce(key, value, types[key])
        if not overrides:
            raise ValueError(f"{what} {name!r} changes nothing; give at least one key=value")
        out.append((name, overrides))
    return out


def numbers(key, text, kind, low, example):
    """A comma-separated list of numbers of kind, each finite and >= low, sorted and distinct."""
    values = sorted({config.coerce(key, v, kind) for v in split_list(text)})
    if not values or not all(low <= v < math.inf for v in values):  # nan too: it compares false with anything
        raise ValueError(f"{key}={text!r} must list finite numbers >= {low}, e.g. {example}")
    return values


def number_list(kind, low, example):
    """The check of a setting that lists numbers (see numbers), for opt: it is checked where it is declared."""

    def ok(text):
        try:
            return bool(numbers("", text, kind, low, example))
        except ValueError:
            return False

    return f"list finite numbers >= {low}, e.g. {example}", ok


# ----------------------------------------------------------------------------- runs and their folders


def run_dir(train_cfg, name, seed):
    return Path(train_cfg.out_dir) / "runs" / f"{name}-seed{seed}"


def train_settings(model_cfg, train_cfg, batch_cfg=None, schedule=None):
    """What determines a run's result: the resolved model, training and batch settings and the schedule's."""
    return {
        "model": model_cfg.asdict(),
        "train": {k: v for k, v in asdict(train_cfg).items() if k not in NOT_SETTINGS},
        "batches": asdict(batch_cfg or BatchConfig()),
        "schedule": schedule.settings() if schedule else {},
    }


def portable(settings):
    """train_settings as a results.json records them: each path (PATHS) relative to the project, so that no committed
    file names the machine that ran it; hf:NAME and empty values as they are."""
    out = {group: dict(values) for group, values in settings.items()}
    for name in PATHS:
        group, key = name.split(".")
        value = out.get(group, {}).get(key)
        if value and not value.startswith(HF_PREFIX):
            out[group][key] = os.path.relpath(os.path.abspath(value), PROJECT)
    return out


def check_run(out, settings, grown=()):
    """Refuse the run folder out unless the settings it records (its config.json, written as training starts) are
    settings (train_settings'), naming those that differ and the folder; grown names the settings ("group.key") of
    a run grown stage by stage, which it records as it goes (its max_iters, a step its schedule fixes on the way)
    and are taken as recorded; a path (PATHS) is the same where it names the same place relative to the folder, which
    may have moved (same_place). A folder without them (nothing trained yet) passes."""
    if (out / "config.json").is_file():
        saved = read_json(out / "config.json", delete=out)
        for group, key in (name.split(".") for name in grown):
            settings = settings | {group: settings[group] | {key: saved.get(group, {}).get(key)}}
        check_same_settings(out, settings, saved)


def check_same_settings(path, settings, saved):
    # the run folder's own path as it was recorded, against which the paths it records are read once it has moved
    there = saved.get("train", {}).get("out_dir")
    # a setting renamed since the run folder was made is read under its name now, and one newer than the folder was
    # there at its default (how every option starts), unless it declares what the folder's settings imply (`older`)
    saved = saved | {group: config.current_names(cls, saved.get(group, {})) for group, cls in train.RECORD.items()}
    defaults = train_settings(GPTConfig(), train.TrainConfig())
    saved = {group: defaults[group] | saved.get(group, {}) for group in settings}
    diff = [
        f"{group}.{k}: {saved[group].get(k)!r} there, {v!r} now"
        for group in settings
        for k, v in settings[group].items()
        if not same_place(f"{group}.{k}", saved[group].get(k), v, there, path)
    ]
    if diff:
        raise ValueError(
            f"{path} was made with other settings ({'; '.join(diff[:4])}); use another out_dir, "
            f"or delete that run folder to redo it"
        )


def same_place(name, a, b, there, here):
    """Whether setting name is a there and b here (a run folder, recorded at path there): the same value, or for a
    path (PATHS) the same place relative to the run folder, which has moved with what it holds."""
    if a == b:
        return True
    return name in PATHS and bool(a and b and there) and os.path.relpath(a, there) == os.path.relpath(b, here)


def differences(saved, now):
    """["key: its value there, its value now"] for each key of saved or now ({key: value} each) where they differ."""
    return [
        f"{k}: {saved.get(k)!r} there, {now.get(k)!r} now"
        for k in dict.fromkeys([*now, *saved])
        if saved.get(k) != now.get(k)
    ]


def check_records(out, rebuilt=()):
    """Refuse the run folder out if a JSON record in it cannot be read, naming it: a finished run's result is
    reused only with the records it was made from intact. Those named in rebuilt are made again when damaged."""
    for path in sorted(out.glob("*.json")):
        if path.name not in rebuilt:
            read_json(path, delete=out)


def train_run(name, model_cfg, train_cfg, out, batch_cfg=None, schedule=None):
    """Train (or resume) one run into out, its batches as batch_cfg says and on schedule (train.train's defaults: plain
    text, train.Schedule); its summary. Raises Interrupted when training stopped early, Failed when its metrics log
    lacks what the summary reads (damaged)."""
    ckpt_path = out / "ckpt.pt"
    at = load_checkpoint(ckpt_path)["iter"] if ckpt_path.is_file() else 0
    if at < train_cfg.max_iters:  # else training ended and only the summary is missing
        out.mkdir(parents=True, exist_ok=True)
        with open_log(out / "train.log") as log, contextlib.redirect_stdout(log):
            train.train(
                model_cfg, replace(train_cfg, out_dir=str(out), resume=at > 0, progress=False), batch_cfg, schedule
            )
        at = load_checkpoint(ckpt_path)["iter"]
    if at < train_cfg.max_iters:
        raise Interrupted(f"run {out.name} stopped at iteration {at} of {train_cfg.max_iters}")
    try:
        # a resumed run's log was trimmed back to its checkpoint and its elapsed_s continues: one line per iteration
        metrics = {m["iter"]: m for m in read_log(out / "metrics.jsonl")}
        final = metrics[train_cfg.max_iters]
        return {
            "scheme": name,
            "seed": train_cfg.seed,
            "settings": train_settings(model_cfg, train_cfg, batch_cfg, schedule),
            "final_val_loss": final["val_loss"],
            "val_bpb": final["val_bpb"],
            "train_s": final["elapsed_s"],
            "tokens_per_s": statistics.median(m["tokens_per_s"] for m in metrics.values()),
            # the scheduled evaluations only: a stop and its resume add one at the stop
            "val_curve": [
                [it, m["val_loss"]]
                for it, m in sorted(metrics.items())
                if it % train_cfg.eval_interval == 0 or it == train_cfg.max_iters
            ],
        }
    except (KeyError, TypeError) as e:  # a line edited or lost: the log is not one this run wrote
        raise Failed(
            f"{out / 'metrics.jsonl'} is damaged (no {e} where iteration {train_cfg.max_iters}'s evaluation should "
            f"be); delete {out} and rerun the same command to redo that run"
        ) from None


# ----------------------------------------------------------------------------- JSON records


def write_json(path, obj):
    """Write atomically: these files mark a finished step, so a half-written one must never exist. Compact: the
    lab's results.json keep every probe cell, and indenting them nearly doubled the files the guides commit."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, separators=(",", ":")) + "\n").encode()))


def read_json(path, delete=None):
    """The JSON at path. One that cannot be read (truncated, not JSON, unreadable) raises Failed naming it and what
    to delete (delete; default: the file) so that rerunning the command redoes that run."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise Failed(
            f"{path} cannot be read ({why}); delete {delete or 'it'} and rerun the same command to redo that run"
        ) from None


class Gone(ValueError):
    """The model an evaluation scores is gone: training has moved past the step it was at."""


def evaluated(path, compute, settings):
    """The JSON object at path, computed and written (atomically: it marks a finished step) the first time, recording
    settings ({name: value}: every lab setting compute reads beyond the run's own, which check_run compares) under
    MADE_WITH, which the object returned leaves out. A copy made with other settings is computed again, and so is one
    that cannot be read (truncated when a device filled, edited), which is named on stderr: a rerun with other
    settings asks for them, and an evaluation costs a fraction of the training it reads. Where it cannot be (Gone:
    training has moved past the step it scored) the rerun is refused, naming the settings that differ; a copy that
    records none, made before copies recorded them, is then kept, so that a lab begun then still resumes."""
    settings = json.loads(json.dumps(settings))  # as a copy reads them back: tuples as lists, keys as strings
    kept, why = None, "is missing"
    if path.is_file():
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            why = f"cannot be read ({e})"
            print(f"{path} {why}; computing it again", file=sys.stderr)
        else:
            made_with = kept.pop(MADE_WITH, None)
            if made_with == settings:
                return kept
            if made_with is not None:
                kept, why = None, f"was made with other settings ({'; '.join(differences(made_with, settings))})"
    try:
        obj = compute()
    except Gone as e:
        if kept is not None:
            return kept
        raise ValueError(
            f"{path} {why} and cannot be made again: {e}; use another out_dir, or delete {path.parent} to redo that run"
        ) from None
    assert MADE_WITH not in obj, f"{path}: {MADE_WITH} is the key of the settings it records"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj | {MADE_WITH: settings})
    obj = read_json(path)
    del obj[MADE_WITH]
    return obj
