"""Export a trained run to a Hugging Face transformers model folder that loads with no custom code.

    python export.py --out_dir=out --hf_dir=hf-out            best.pt of out/ (else ckpt.pt) into hf-out/
    python export.py --out_dir=out --hf_dir=hf-out --checkpoint=latest      ckpt.pt
    python export.py --out_dir=out --hf_dir=hf-out --rope_scaling=dynamic --rope_scaling_factor=4    for 4x the context

then, in Python:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, tok = AutoModelForCausalLM.from_pretrained("hf-out"), AutoTokenizer.from_pretrained("hf-out")
    print(tok.decode(model.generate(**tok("ROMEO:", return_tensors="pt"), max_new_tokens=58)[0]))

What maps to what (hf.py; docs/interop.md has the table):
  pos_emb=rope     GPT-NeoX (use_parallel_residual as parallel_residual), or Persimmon with qk_norm (its
                   qk_layernorm); partial_rotary_factor from rope_fraction; the interleaved layout's q/k rows
                   permuted into the half layout. Scalings linear, dynamic, llama3 and yarn as transformers'
                   own, ntk as a larger rope_theta
  pos_emb=none     the same with no rotary dims (partial_rotary_factor=0): nothing positional, like NoPE
  pos_emb=learned  GPT-2 (its Conv1D weights are ours transposed)
  other schemes    refused with one line naming what the architectures lack
  p-RoPE (rope_p < 1) and logit_softcap are refused too. Missing biases (bias=false) are written as zeros
  where the architecture has them; mlp_act gelu, gelu_tanh and relu2 are transformers' own; an untied head
  (tie_embeddings=false) is written as its own weight (tie_word_embeddings=false).

Files: config.json, generation_config.json, model.safetensors (float32), and tokenizer.json with
tokenizer_config.json: for gpt2 and bpe a byte-level BPE (tiktoken's ranks through transformers'
TikTokenConverter, the same ids), for char a word-level vocabulary of single characters (a character
outside it is an error, as in nanorope). Before anything is written the transformers model's logits are
checked against nanorope's on a probe and the largest difference printed. transformers generates past
block_size without nanorope's window slide (and GPT-2 cannot: its positions stop at block_size).
"""

from dataclasses import dataclass
from pathlib import Path

import config
import hf
import scalings
from config import opt
from data.tokenizer import tokenizer_from_meta
from source import SourceSettings, load_source

RUN_FILES = ("ckpt.pt", "best.pt", "metrics.jsonl")  # a folder holding one is a run: its config.json is not ours
PROBE_TOLERANCE = 1e-3  # largest logit difference, relative to the largest logit, that float32 rounding explains


def hf_tokenizer(meta, max_length):
    """The checkpoint's tokenizer as a transformers tokenizer with the same ids."""
    tf = hf.transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # installed with transformers

    tok = tokenizer_from_meta(meta)  # gpt2 needs tiktoken's files: its ValueError says how to get them
    specials = {}
    if meta["tokenizer"] == "hf":  # an imported model's own tokenizer, as it came
        backend = tok.backend
    elif meta["tokenizer"] == "char":
        backend = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(tok.chars)}, unk_token=None))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # each character
        backend.decoder = decoders.Fuse()  # joined with nothing between
    else:
        backend = ranks_converter(tf)(tok.encoding).converted()
        eot = {i: s for s, i in tok.encoding._special_tokens.items()}.get(meta.get("eot"))
        specials = {"bos_token": eot, "eos_token": eot, "pad_token": eot} if eot else {}
    # clean_up_tokenization_spaces would drop the space before punctuation on decoding
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=backend, clean_up_tokenization_spaces=False, model_max_length=max_length, **specials
    )


def ranks_converter(tf):
    """transformers' tiktoken conversion (merges rebuilt from the ranks, tiktoken's whole-piece lookup kept) of an
    Encoding in memory: its own reads a ranks file through tiktoken's cache, which is keyed by path."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class RanksConverter(TikTokenConverter):
        def __init__(self, encoding):
            super().__init__(pattern=encoding._pat_str, extra_special_tokens=encoding._special_tokens)
            self.ranks = encoding._mergeable_ranks

        def load_tiktoken_bpe(self, _):
            return self.ranks

    return RanksConverter


# ----------------------------------------------------------------------------- the command


@dataclass
class ExportConfig(SourceSettings):
    hf_dir: str = opt(
        "", "the transformers model folder to write (created; files of an earlier export there are replaced)"
    )

    def __post_init__(self):
        super().__post_init__()
        if not self.hf_dir:
            raise ValueError("hf_dir is empty; name the folder to write, e.g. --hf_dir=hf-out")
        if self.rope_scaling is not None:  # export has no length to stretch L0 to: no factor, refused before loading
            scalings.scaling_pair(self.rope_scaling, self.rope_scaling_factor)


def export(export_cfg):
    """Write export_cfg.hf_dir from export_cfg.out_dir's checkpoint; returns the check's largest logit difference."""
    hf_dir = Path(export_cfg.hf_dir)
    if hf_dir.is_file() or any((hf_dir / name).exists() for name in RUN_FILES):
        raise ValueError(
            f"hf_dir={export_cfg.hf_dir}: a file or a training run's folder; name a new folder for the export"
        )
    source = load_source(export_cfg.spec(), "out_dir", export_cfg.checkpoint)
    model = source.model().float().eval()  # written, and checked, in float32
    export_cfg.rescale(model)
    try:
        model_hf = hf.exported(model, source.meta)
    except ValueError as e:
        raise ValueError(f"cannot export {source.label}: {e}") from None
    tok = hf_tokenizer(source.meta, model_hf.config.max_position_embeddings)
    diff, scale = hf.max_logit_difference(model, model_hf)
    assert diff <= PROBE_TOLERANCE * max(1.0, scale), f"exported logits differ from nanorope's by {diff:.3g}"
    model_hf.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    c = model.config
    print(
        f"{source.label} -> {hf_dir}/ as {type(model_hf).__name__} ({c.pos_emb}"
        + (f", {c.rope_scaling} x{c.rope_scaling_factor:g}" if scalings.is_scaled(c) else "")
        + f"; tokenizer {source.meta['tokenizer']}): logits agree with nanorope's to {diff:.2g}"
    )
    return diff


def main(argv=None):
    config.main(argv, __doc__, (ExportConfig,), export)


if __name__ == "__main__":
    main()
