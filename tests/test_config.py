"""config.py: defaults < TOML < --key=value, types checked, every mistake named."""

from dataclasses import dataclass, fields

import pytest

import config
from config import opt
from model import GPTConfig
from train import TrainConfig


@dataclass
class A:
    n: int = opt(3, "an int")
    rate: float = opt(0.5, "a float")
    name: str = opt("x", "a string")
    flag: bool = opt(False, "a bool")


@dataclass
class B:
    limit: int | None = opt(None, "an optional int")
    auto: bool | None = opt(None, "an optional bool")


def parse(*argv):
    return config.parse(argv, A, B)


def toml(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


def test_defaults_then_toml_then_command_line(tmp_path):
    a, b = parse()
    assert (a.n, a.rate, a.name, a.flag, b.limit, b.auto) == (3, 0.5, "x", False, None, None)
    path = toml(tmp_path, 'n = 5\nrate = 2\nname = "toml"\nlimit = 7\n')
    a, b = parse(path)
    assert (a.n, a.rate, a.name, b.limit) == (5, 2.0, "toml", 7) and isinstance(a.rate, float)
    a, b = parse(path, "--n=9", "--limit=none", "--auto=true")
    assert (a.n, a.name, b.limit, b.auto) == (9, "toml", None, True)


def test_command_line_values_are_converted_by_type():
    a, b = parse("--n=-4", "--rate=1e-3", "--name=42", "--flag=no", "--limit=auto", "--auto=0")
    assert (a.n, a.rate, a.name, a.flag, b.limit, b.auto) == (-4, 1e-3, "42", False, None, False)
    assert parse("--flag=YES")[0].flag is True


def test_a_bare_flag_sets_a_bool_and_only_a_bool():
    assert parse("--flag")[0].flag is True
    assert parse("--auto")[1].auto is True
    with pytest.raises(ValueError, match=r"argument '--n' should look like --key=value"):
        parse("--n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n=ten"], "n='ten' is not a valid int"),
        (["--n=1.5"], "n='1.5' is not a valid int"),
        (["--rate=fast"], "rate='fast' is not a valid float"),
        (["--flag=maybe"], "flag='maybe' is not a valid bool; use true or false"),
        (["--limit=lots"], "limit='lots' is not a valid int"),
        (["--nn=3"], "unknown config key 'nn'; did you mean 'n'?"),
        (["--zzzzzz=3"], "unknown config key 'zzzzzz'; --help lists every key"),
        (["n=3"], "config file 'n=3' does not exist; settings go as --n=3"),
        (["--n=1", "extra"], "argument 'extra' should look like --key=value"),
    ],
)
def test_command_line_mistakes_name_the_value_and_what_is_valid(argv, message):
    with pytest.raises(ValueError) as e:
        parse(*argv)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("n = 1.5\n", "n=1.5 is not a valid int"),
        ("rate = true\n", "rate=True is not a valid float"),
        ('flag = "yes"\n', "flag='yes' is not a valid bool"),
        ('n = "5"\n', "n='5' is not a valid int"),  # TOML has numbers; a string is a mistake
        ('limit = "none"\n', "limit='none' is not a valid int"),
        ("n = [1]\n", "n=[1] is not a valid int"),
        ("nme = 'y'\n", "unknown config key 'nme'; did you mean 'name'?"),
        ("n = = 3\n", "is not valid TOML: "),
    ],
)
def test_toml_mistakes_name_the_value(tmp_path, text, message):
    with pytest.raises(ValueError) as e:
        parse(toml(tmp_path, text))
    assert message in str(e.value)


def test_missing_unreadable_and_binary_config_files(tmp_path):
    with pytest.raises(ValueError, match=r"config file '.*nope.toml' does not exist \(configs/ lists"):
        parse(str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match="does not exist"):
        parse(str(tmp_path))  # a folder is not a config file
    (tmp_path / "bin.toml").write_bytes(b"n = 1\n\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not valid TOML"):
        parse(str(tmp_path / "bin.toml"))


def test_the_shipped_training_configs_parse_into_the_real_dataclasses():
    from conftest import ROOT

    configs = [
        p for p in sorted((ROOT / "configs").glob("*.toml")) if not p.name.startswith(("ablate", "extend", "recipe"))
    ]  # their tools' own
    assert configs
    for path in configs:
        model_cfg, train_cfg = config.parse([str(path)], GPTConfig, TrainConfig)
        for key, value in config.read_toml(path).items():  # each setting lands in its dataclass field
            assert getattr(model_cfg if hasattr(model_cfg, key) else train_cfg, key) == value, (path, key)


def test_keys_are_unique_across_classes_and_all_have_help():
    @dataclass
    class Clash:
        n: int = opt(1, "same name as A.n")

    with pytest.raises(AssertionError, match="defined twice"):
        config.known_keys([A, Clash])
    text = config.help_text(GPTConfig, TrainConfig)
    keys = config.known_keys([GPTConfig, TrainConfig])
    assert len(text.splitlines()) == len(keys) and all(f"--{k}=" in text for k in keys)
    assert all(f.metadata["help"] for cls in (GPTConfig, TrainConfig) for f in fields(cls))


def test_a_key_may_take_its_value_as_the_next_argument_and_a_bool_its_word():
    (a,) = config.parse(["--n", "7", "--flag", "--name", "x"], A)
    assert (a.n, a.flag, a.name) == (7, True, "x")
    (a,) = config.parse(["--flag", "false", "--n=-3"], A)
    assert (a.flag, a.n) == (False, -3)
    with pytest.raises(ValueError, match="argument 'stray' should look like --key=value"):
        config.parse(["--flag", "stray"], A)


def test_a_declared_check_names_the_setting_and_what_is_valid():
    @dataclass
    class Checked:
        k: int = opt(1, "a count", check=config.POSITIVE)
        c: str = opt("a", "a choice", check=config.one_of(("a", "b")))

        def __post_init__(self):
            config.validate(self)

    with pytest.raises(ValueError, match="^k=0 must be a positive integer$"):
        config.parse(["--k=0"], Checked)
    with pytest.raises(ValueError, match="^c='z' must be one of a, b$"):
        config.parse(["--c=z"], Checked)
