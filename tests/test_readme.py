"""The README's commands, every one in order, as a reader types them: each runs (on tiny settings appended to it, the
shared corpus for a download), or, where it needs what a test cannot have (the network, a GPU cluster, a long run),
its settings parse as the command's own main reads them; a lab command with a dry run runs it (its checks, no
training)."""

import re
import runpy
import shlex
import signal
import subprocess
import sys

import pytest

import config
import train
from conftest import CORPUS, ROOT, TINY

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["--max_iters=2", "--eval_iters=1"]  # appended to a training command, with TINY
SHORT = ["--max_new_tokens=8"]  # appended to a sampling command


SHELL, OTHER = ("sh", "bash"), ("text", "")  # a fenced block's language: commands, or what is no command


def commands():
    """The command lines of README.md's fenced sh blocks, in order, comments dropped. A block of any other language
    fails: a command retagged (```console, ```shell) would drop out of this test unseen."""
    lines, fenced, opening = [], False, True
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            language = line.strip()[3:]
            assert not opening or language in SHELL + OTHER, (
                f"README.md: a ```{language} block, not one of {SHELL + OTHER}"
            )
            fenced, opening = opening and language in SHELL, not opening
            continue
        if fenced and shlex.split(line, comments=True):
            lines.append(shlex.split(line, comments=True))
    return lines


class Parsed(Exception):
    """A command's settings were read; nothing of it ran."""


def parse_only(monkeypatch):
    """Every command's main reads its settings and stops there (config.main, or config.parse where a tool calls it
    itself)."""
    real_main, real_parse = config.main, config.parse

    def main(argv, doc, classes, run, **hooks):
        real_main(argv, doc, classes, lambda *settings: (_ for _ in ()).throw(Parsed()), **hooks)

    def parse(argv, *classes):
        real_parse(argv, *classes)
        raise Parsed

    monkeypatch.setattr(config, "main", main)
    monkeypatch.setattr(config, "parse", parse)


def how(argv, out):
    """(what to append to the command, whether it runs or only parses); out: a fresh folder for a lab's out_dir."""
    text = " ".join(argv)
    if argv[1:3] in (["-m", "lab.ablate"], ["-m", "lab.extend"]):  # their dry run: the grid and its checks, no run
        # few probe trials and evaluation tokens: the plan and its checks are the same, its windows quicker to build
        return [
            *([] if "--dry_run=true" in argv else ["--dry_run=true"]),
            f"--out_dir={out}",
            "--probe_trials=2",
            "--eval_tokens=1024",
        ], True
    if "hf:" in text or argv[0] == "torchrun" or "lab." in text or argv[1] == "bench.py":
        return [], False  # the network, several GPUs, or runs of minutes: read their settings
    if argv[1:3] == ["-m", "data.prepare"]:
        # the repository's data/ folder is the default: the test's own instead, and the shared corpus, not a download
        return ["--data_dir=data", "--num_proc=1", *([] if "--input" in argv else ["--input", str(CORPUS)])], True
    if argv[1] == "train.py":
        if "--resume" in argv:  # the run's own settings: only what a resume may change can be appended
            free = config.declared("resume", *train.SETTINGS)
            return [a for a in TINY if a[2:].partition("=")[0] in free] + ["--max_iters=4"], True
        return [*TINY, *RUN], True
    return (SHORT if argv[1] == "sample.py" else []), True


@pytest.mark.slow
def test_every_readme_command_runs_in_order_as_written(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "corpus").mkdir()  # the README's own corpus folder: a slice of the shared one
    (tmp_path / "corpus" / "a.txt").write_text(corpus.read_text()[:60_000])
    ran, parsed = [], []
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for argv in commands():
        if argv[0] == "pip" or argv[1:3] == ["-m", "pytest"]:
            continue  # installs, and the suite this test is part of
        extra, runs = how(argv, tmp_path / f"lab{len(ran) + len(parsed)}")
        script = argv[argv.index("train.py") :] if argv[0] == "torchrun" else argv[1:]  # torchrun: one process
        if not runs:
            parse_only(monkeypatch)
        try:
            if script[0] == "-m":
                monkeypatch.setattr(sys, "argv", script[1:] + extra)
                monkeypatch.delitem(sys.modules, script[1], raising=False)  # run afresh, as python -m does
                runpy.run_module(script[1], run_name="__main__", alter_sys=True)
            else:
                monkeypatch.setattr(sys, "argv", [*script, *extra])
                runpy.run_path(str(ROOT / script[0]), run_name="__main__")
            assert runs, f"{shlex.join(argv)} ran instead of stopping once its settings were read"
        except Parsed:
            pass
        except SystemExit as e:
            assert e.code in (0, None), f"{shlex.join(argv)} exited {e.code}: {capsys.readouterr().err}"
        if "--resume" in argv:  # it continued the run before it, not a fresh one
            assert re.search(r"resuming from \S+ at iteration [1-9]", capsys.readouterr().out), shlex.join(argv)
        (ran if runs else parsed).append(shlex.join(argv))
        for sig, handler in handlers.items():  # what a command's process set for itself ends with it
            signal.signal(sig, handler)
        monkeypatch.undo()
        monkeypatch.chdir(tmp_path)
    assert (
        any("--resume" in c for c in ran)
        and any("lab.extend" in c for c in ran)
        and any("lab.recipe" in c for c in parsed)
    ), (ran, parsed)


# ----------------------------------------------------------------------------- facts on the front page

README = (ROOT / "README.md").read_text()


def table_rows(first_cells):
    """{first cell: the other cells} of README.md's table rows whose first cell is one of first_cells."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in README.splitlines() if line[:2] == "| "]
    return {cells[0]: cells[1:] for cells in rows if cells[0] in first_cells}


def test_every_lab_command_shows_its_time_and_what_its_results_stand_on():
    configs = set(re.findall(r"python -m lab\.\w+ configs/(\w+)\.toml", README))
    rows = table_rows(configs)
    assert configs and configs <= rows.keys(), configs - rows.keys()
    for name, (time, results) in rows.items():
        measured = re.search(r"\d+ (h|min)", time) and re.search(r"AVX|EPYC|Xeon", time)
        assert measured or "projected" in time or time == "not run", (name, time)
        assert "protocol" in results or results == "none", (name, results)
        for link in re.findall(r"\]\(([^)]+)\)", results):
            assert (ROOT / link).is_file(), (name, link)


def test_the_file_tree_names_every_module_there_is():
    listed = set(re.findall(r"^([a-z_]+\.py) ", README, flags=re.MULTILINE))
    assert listed == {p.name for p in ROOT.glob("*.py")}


@pytest.mark.slow
def test_the_suites_size_on_the_front_page_is_the_collected_one():
    stated = int(re.search(r"one test per core: (\d[\d,]*) tests", README).group(1).replace(",", ""))
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-o", "addopts="],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert f"{stated} tests collected" in collected, collected.splitlines()[-1:]
