"""Where a model comes from: a run folder, a checkpoint file or hf:NAME_OR_PATH (`load_source`), what a fine-tune
takes from it (`fine_tune_config`), and the settings with which sample.py and export.py name one and the RoPE scaling
to read it with (no tool imports another's helpers). A training run reads this only when it starts from a model.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import scalings
from checkpoint import CHECKPOINTS, checkpoint_in, load_checkpoint, same_tokenizer
from config import check_of, one_of, opt, validate, weightless
from data.tokenizer import HF_PREFIX
from model import GPT, GPTConfig, scheme_class


@dataclass
class Source:
    """A model to sample, export or fine-tune: its config, its tokenizer (meta), what it is (label, e.g. the
    checkpoint's path), its run's figures (iter, best_val_loss) and how its weights go into a model."""

    config: GPTConfig
    meta: dict
    label: str
    info: dict
    load_into: Callable  # a GPT of a config fine_tune_config allows -> the same GPT holding the source's weights

    def model(self, device="cpu"):
        return self.load_into(GPT(self.config)).to(device)


def load_source(spec, flag, which="latest"):
    """The Source spec names: a run folder (its `which` checkpoint), a checkpoint file, or hf:NAME_OR_PATH (a
    transformers GPT-2 or GPT-NeoX checkpoint, with its own tokenizer). Every error is one line naming the setting
    the user typed, flag=spec."""
    where = f"{flag}={spec}"
    if spec.startswith(HF_PREFIX):
        import hf  # transformers is imported where it is used

        config, meta, load_into = hf.source(spec.removeprefix(HF_PREFIX), where)
        return Source(config, meta, spec, {}, load_into)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"{where}: no such run folder or checkpoint file")
    if path.is_dir():
        found = checkpoint_in(path, which)
        if found is None:
            raise ValueError(
                f"{where}: no checkpoint in that folder (looked for {' or '.join(CHECKPOINTS[which])}); "
                f"train first (python train.py --out_dir={spec}) or name the run's folder"
            )
        path = found
    try:
        ckpt = load_checkpoint(path)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if "tokenizer" not in ckpt:
        raise ValueError(f"{where}: {str(path)!r} holds weights alone, without the tokenizer train.py saves")

    def load_into(model):
        try:
            model.load_trained(ckpt["model"])
        except RuntimeError as e:  # weights of another shape: a config fine_tune_config would not allow
            raise ValueError(
                f"{where}: its weights do not fit this model ({str(e).splitlines()[-1].strip()[:200]})"
            ) from None
        return model

    try:
        config = GPTConfig(**ckpt["model_config"])
    except TypeError as e:  # settings of another program or version
        raise ValueError(f"{where}: {str(path)!r} does not fit nanorope's model ({e})") from None
    return Source(config, ckpt["tokenizer"], str(path), {k: ckpt.get(k) for k in ("iter", "best_val_loss")}, load_into)


def tokenizer_name(meta):
    return f"the {meta['tokenizer']} tokenizer" + (f" of {meta['hf_name']}" if meta["tokenizer"] == "hf" else "")


def fine_tune_config(source, config, meta, where):
    """The model config of a fine-tune from source on a dataset (its meta): the source's architecture with config's
    settings that no weight depends on (config.weightless: context, dropout, RoPE scaling), and L0 the source's own
    wherever block_size grows past it (a typed original_len must equal it). Any other setting of config that is not
    at its default must equal the source's, and the dataset must be tokenized as the source was. A block_size below
    the source's is allowed: a learned position table is cut to it (GPT.load_trained)."""
    if not same_tokenizer(source.meta, meta):
        hint = (
            f"; prepare it with python -m data.prepare --tokenizer hf:{source.meta['hf_name']} --input CORPUS "
            "--dataset NAME"
            if source.meta["tokenizer"] == "hf"
            else ""
        )
        raise ValueError(
            f"{where} reads the ids of {tokenizer_name(source.meta)}, but dataset {meta['dataset']!r} was "
            f"prepared with {tokenizer_name(meta)}{hint}"
        )
    defaults, kept = GPTConfig(), weightless(GPTConfig)
    clash = [
        f"{k}: {where} has {v!r}, this run {getattr(config, k)!r}"
        for k, v in source.config.asdict().items()
        if k not in kept and k != "vocab_size" and getattr(config, k) not in (v, getattr(defaults, k))
    ]
    if clash:
        raise ValueError(
            f"{where} is another model ({'; '.join(clash)}); a fine-tune keeps its architecture and may "
            f"change only {', '.join(kept)}"
        )
    if not scheme_class(source.config.pos_emb).extrapolates and config.block_size > source.config.block_size:
        raise ValueError(
            f"block_size={config.block_size} is past {where}'s learned position table "
            f"({source.config.block_size} positions); use block_size <= {source.config.block_size}"
        )
    L0 = min(source.config.L0, config.block_size)
    if config.original_len not in (None, L0):
        raise ValueError(
            f"original_len={config.original_len} contradicts {where}, which learned L0 = "
            f"{source.config.L0}: a fine-tune keeps the length its model first learned"
            + (f" (at block_size={config.block_size}, L0 = {L0})" if L0 != source.config.L0 else "")
        )
    return replace(source.config, **{k: getattr(config, k) for k in kept} | {"original_len": L0})


def start_model(init_from, config, meta):
    """A fine-tune's model config on a dataset (its meta), from config and init_from's model (fine_tune_config), and
    that model's Source."""
    source = load_source(init_from, "init_from")
    return fine_tune_config(source, config, meta, f"init_from={init_from}"), source


@dataclass
class SourceSettings:
    """The settings of a tool that reads one model (sample.py, export.py): where it comes from (load_source) and the
    RoPE scaling to read it with."""

    out_dir: str = opt(
        "",
        "the model: a run folder (best.pt, else ckpt.pt), a checkpoint file, or hf:NAME_OR_PATH; "
        "default out/, else the newest out*/ folder here with a checkpoint",
    )
    checkpoint: str = opt("best", "best.pt or ckpt.pt (latest) of a run folder", check=one_of(tuple(CHECKPOINTS)))
    rope_scaling: str | None = opt(
        None,
        "a RoPE scaling to read the model with, for RoPE models (default: each model's own)",
    )
    rope_scaling_factor: float | None = opt(
        None,
        "its factor s: L0 stretched to s L0 (export.py needs it; sample.py's default: max_context / L0, at least 1)",
        check=check_of(GPTConfig, "rope_scaling_factor"),
    )

    def __post_init__(self):
        validate(self)
        # a scaling's name is checked here; one without its factor takes the tool's stretch (rescale)
        scalings.scaling_pair(self.rope_scaling, self.rope_scaling_factor, stretch=1.0)

    def spec(self):
        """What out_dir names, else out/ (train.py's default) or the newest out*/ folder in the working directory
        with a checkpoint: the run just trained."""
        if self.out_dir:
            return self.out_dir
        runs = [p for p in Path().glob("out*") if p.is_dir() and checkpoint_in(p, self.checkpoint)]
        if not runs:
            raise ValueError(
                "no checkpoint in out/ or any other out*/ folder here; train a model first "
                "(python train.py ...) or name its folder with --out_dir"
            )
        out = Path("out")
        return str(out if out in runs else max(runs, key=lambda p: checkpoint_in(p, self.checkpoint).stat().st_mtime))

    def rescale(self, model, stretch=None):
        """Reconfigure model to the RoPE scaling asked for (none asked: it keeps its own); a scaling without its
        factor takes stretch, or is refused where there is none (scalings.scaling_pair)."""
        if self.rope_scaling is not None:
            scaling, factor = scalings.scaling_pair(self.rope_scaling, self.rope_scaling_factor, stretch)
            model.reconfigure(rope_scaling=scaling, rope_scaling_factor=factor)
