"""The model a tool reads, declared once for sample.py and export.py (no tool imports another's helpers): where it
comes from, for checkpoint.load_source, and the RoPE scaling to read it with. A training run never imports this.
"""

from dataclasses import dataclass
from pathlib import Path

import scalings
from checkpoint import CHECKPOINTS, checkpoint_in
from config import check_of, one_of, opt, validate
from model import GPTConfig


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
