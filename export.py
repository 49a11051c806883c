"""Export a trained run to a Hugging Face transformers model folder that loads with no custom code.

    python export.py out hf-out                          best.pt of out/ (else ckpt.pt) into hf-out/
    python export.py out hf-out --checkpoint=latest      ckpt.pt
    python export.py out hf-out --rope_scaling=dynamic --rope_scaling_factor=4    set up for 4x the context

then, in Python:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, tok = AutoModelForCausalLM.from_pretrained("hf-out"), AutoTokenizer.from_pretrained("hf-out")
    print(tok.decode(model.generate(**tok("ROMEO:", return_tensors="pt"), max_new_tokens=58)[0]))

What maps to what:
  pos_emb=rope     GPT-NeoX, sequential residual (use_parallel_residual=false), partial_rotary_factor from
                   rope_fraction; the interleaved layout's q/k rows permuted into NeoX's half layout. Scalings
                   linear, dynamic, llama3 and yarn as transformers' own, ntk as a larger rope_theta
  pos_emb=none     GPT-NeoX with no rotary dims (partial_rotary_factor=0): nothing positional, like NoPE
  pos_emb=learned  GPT-2 (its Conv1D weights are ours transposed), activation "gelu", the exact one we use
  other schemes    refused with one line: GPT-NeoX and GPT-2 have nothing that computes them
  p-RoPE (rope_p < 1), qk_norm and logit_softcap are refused too. Missing biases (bias=false) are written
  as zeros where the architecture has them; mlp_act gelu and relu2 are transformers' own; an untied head
  (tie_embeddings=false) is written as its own weight (tie_word_embeddings=false).

Files: config.json, generation_config.json, model.safetensors (float32), and tokenizer.json with
tokenizer_config.json: for gpt2 and bpe a byte-level BPE (tiktoken's ranks through transformers'
TikTokenConverter, the same ids), for char a word-level vocabulary of single characters (a character
outside it is an error, as in nanorope). Before anything is written the transformers model's logits are
checked against nanorope's on a probe and the largest difference printed. transformers generates past
block_size without nanorope's window slide (and GPT-2 cannot: its positions stop at block_size).
"""

import argparse
import inspect
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import TikTokenConverter

import config
import positions
import rope
from checkpoint import CHECKPOINTS, load_run, model_from_checkpoint
from data.tokenizer import tokenizer_from_meta

RUN_FILES = ("ckpt.pt", "best.pt", "metrics.jsonl")  # a folder holding one is a run: its config.json is not ours
# what GPT-NeoX and GPT-2 lack for each scheme that export refuses; a scheme not named here is refused too
LACKS = {
    "sinusoidal": "a fixed sinusoidal table added to sqrt(n_embd)-scaled token embeddings",
    "alibi": "ALiBi's per-head linear score biases",
    "xpos": "xPos's distance decay of queries and keys",
    "kerple": "KERPLE's learned logarithmic score biases",
    "fire": "FIRE's learned function of normalised distances",
    "rnope": "layers without RoPE among layers with it (GPT-NeoX rotates in every layer)",
}
# mlp_act -> the activation's name in transformers (hidden_act, activation_function): the same functions
HIDDEN_ACTS = {"gelu": "gelu",  # the exact erf GELU of model.MLP's F.gelu; GPT-2's own gelu_new is the tanh one
               "relu2": "relu2"}  # transformers' ReLUSquaredActivation
PROBE_TOKENS = 32  # tokens past block_size in the logit check of a RoPE or NoPE model, so length scalings act
PROBE_TOLERANCE = 1e-3  # largest logit difference, relative to the largest logit, that float32 rounding explains


# ----------------------------------------------------------------------------- what can be exported

def refusal(cfg):
    """Why transformers cannot run this model as nanorope does, or None."""
    if cfg.qk_norm:
        return "qk_norm=True: GPT-NeoX and GPT-2 have no norm of queries and keys"
    if cfg.logit_softcap:
        return f"logit_softcap={cfg.logit_softcap}: GPT-NeoX and GPT-2 have no soft cap of the logits"
    if cfg.mlp_act not in HIDDEN_ACTS:
        return f"mlp_act={cfg.mlp_act!r} has no transformers activation here"
    if cfg.pos_emb not in ARCHITECTURES:
        lacks = LACKS.get(cfg.pos_emb, "this scheme")
        return (f"pos_emb={cfg.pos_emb!r} has no transformers architecture here: GPT-NeoX and GPT-2 lack {lacks} "
                "(export writes rope and none as GPT-NeoX, learned as GPT-2)")
    if cfg.pos_emb != "rope":
        return None
    if scaled(cfg) and cfg.rope_scaling == "yarn" and cfg.rope_fraction < 1:
        return (f"rope_scaling='yarn' with rope_fraction={cfg.rope_fraction} < 1: transformers puts YaRN's attention "
                "temperature on the rotated dims alone, nanorope on the whole score; export with another "
                "--rope_scaling, or a model that rotates every dim")
    if cfg.rope_p < 1:
        return (f"rope_p={cfg.rope_p} < 1 (p-RoPE leaves the slowest frequencies unrotated): GPT-NeoX's rotary "
                "rotates every frequency of its rotary dims")
    return None


def scaled(cfg):
    """Whether a RoPE scaling changes anything: every scaling is plain RoPE at factor 1."""
    return cfg.rope_scaling != "none" and cfg.rope_scaling_factor != 1


def rope_parameters(cfg):
    """GPT-NeoX's rope_parameters for a RoPE (or NoPE) config; transformers names the scalings as we do."""
    if cfg.pos_emb == "none":  # no rotary dims at all: queries and keys pass through unchanged
        return {"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": 0.0}
    # the fraction itself, not rot_dim / head_dim: both sides take int(head_dim * fraction) dims
    out = {"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": cfg.rope_fraction}
    if not scaled(cfg):
        return out
    s, rot_dim = cfg.rope_scaling_factor, int(cfg.head_dim * cfg.rope_fraction)
    if cfg.rope_scaling == "ntk":  # a fixed base change (rope.SCALINGS["ntk"]): plain RoPE with a larger base
        return out | {"rope_theta": cfg.rope_base * s ** (rot_dim / (rot_dim - 2))}
    out |= {"rope_type": cfg.rope_scaling, "factor": s}
    if cfg.rope_scaling in ("llama3", "yarn"):
        bands = inspect.signature(rope.SCALINGS[cfg.rope_scaling]).parameters  # its band edges, as rope.py's defaults
        names = ("low_freq_factor", "high_freq_factor") if cfg.rope_scaling == "llama3" else ("beta_fast", "beta_slow")
        out |= {"original_max_position_embeddings": cfg.original_len, **{n: bands[n].default for n in names}}
    return out


def token_ids(meta):
    """bos (the start token nanorope samples from), eos (gpt2's end of text; the others have none) and pad."""
    eos = meta.get("eot")
    return {"bos_token_id": meta["start_id"], "eos_token_id": eos, "pad_token_id": eos}


# ----------------------------------------------------------------------------- weights

def weights(model):
    """Our state dict with the biases bias=False leaves out as zeros, for architectures that always have them."""
    sd = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module.bias is None:
            sd[f"{name}.bias"] = torch.zeros(module.weight.shape[0])  # one per output feature
    return sd


def neox_qkv(t, cfg, rot_dim):
    """c_attn's rows (3, nh, hs) as GPT-NeoX's query_key_value wants them, (nh, 3, hs), with the rotated dims of q
    and k in the half layout: rope.half_to_interleaved maps half to interleaved, its inverse back."""
    order = torch.arange(cfg.head_dim)
    if cfg.pos_emb == "rope" and cfg.rope_layout == "interleaved":
        order[:rot_dim] = rope.half_to_interleaved(rot_dim).argsort()
    t = t.unflatten(0, (3, cfg.n_head, cfg.head_dim))  # (3, nh, hs, ...)
    t = torch.cat((t[:2, :, order], t[2:]))  # q and k re-paired; values carry no position
    return t.transpose(0, 1).flatten(0, 2)  # (nh, 3, hs, ...) -> (3 * C, ...)


def neox(model, meta):
    c = model.config
    rotary = model.pos.rotary if isinstance(model.pos, positions.RoPE) else None
    hf = transformers.GPTNeoXConfig(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
        intermediate_size=model.blocks[0].mlp.c_fc.out_features, hidden_act=HIDDEN_ACTS[c.mlp_act],
        attention_dropout=c.dropout, hidden_dropout=c.dropout, layer_norm_eps=model.ln_f.eps,
        use_parallel_residual=False,  # x + attn(ln_1(x)), then + mlp(ln_2(.)), as model.Block
        attention_bias=c.bias, tie_word_embeddings=c.tie_embeddings, rope_parameters=rope_parameters(c),
        # the context a scaling stretches L0 to; dynamic reads it as L0, its threshold
        max_position_embeddings=(c.original_len if c.rope_scaling == "dynamic" and scaled(c) else
                                 max(c.block_size, round(c.original_len * c.rope_scaling_factor)) if scaled(c)
                                 else c.block_size),
        **token_ids(meta))
    sd, rot_dim = weights(model), rotary.rot_dim if rotary else 0
    out = {"gpt_neox.embed_in.weight": sd["wte.weight"], "lm_head.weight": sd["lm_head.weight"],  # tied: the same
           "gpt_neox.final_layer_norm.weight": sd["ln_f.weight"], "gpt_neox.final_layer_norm.bias": sd["ln_f.bias"]}
    parts = {"input_layernorm": "ln_1", "post_attention_layernorm": "ln_2", "attention.query_key_value": "attn.c_attn",
             "attention.dense": "attn.c_proj", "mlp.dense_h_to_4h": "mlp.c_fc", "mlp.dense_4h_to_h": "mlp.c_proj"}
    for i in range(c.n_layer):
        for theirs, ours in parts.items():
            for kind in ("weight", "bias"):
                t = sd[f"blocks.{i}.{ours}.{kind}"]
                if theirs.startswith("attention.") and kind == "bias" and not c.bias:
                    continue  # attention_bias=False: GPT-NeoX's attention then has none either
                out[f"gpt_neox.layers.{i}.{theirs}.{kind}"] = neox_qkv(t, c, rot_dim) if ours == "attn.c_attn" else t
    model_hf = load(transformers.GPTNeoXForCausalLM(hf), out)
    if rotary is not None:  # the frequencies, computed by transformers from the config, are ours
        theirs = model_hf.gpt_neox.rotary_emb.inv_freq
        assert torch.allclose(theirs, rotary.inv_freq.float(), rtol=1e-6, atol=0), f"RoPE frequencies differ: {theirs}"
    return model_hf


def gpt2(model, meta):
    c = model.config
    hf = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        n_inner=model.blocks[0].mlp.c_fc.out_features, activation_function=HIDDEN_ACTS[c.mlp_act],
        resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout, layer_norm_epsilon=model.ln_f.eps,
        tie_word_embeddings=c.tie_embeddings, **token_ids(meta))
    sd = weights(model)
    out = {"transformer.wte.weight": sd["wte.weight"], "lm_head.weight": sd["lm_head.weight"],
           "transformer.wpe.weight": sd["pos.wpe.weight"],
           "transformer.ln_f.weight": sd["ln_f.weight"], "transformer.ln_f.bias": sd["ln_f.bias"]}
    for i in range(c.n_layer):
        for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            for kind in ("weight", "bias"):
                t = sd[f"blocks.{i}.{part}.{kind}"]
                # Conv1D keeps its weight (in, out), nn.Linear (out, in); q, k, v stay in our order
                out[f"transformer.h.{i}.{part}.{kind}"] = t.t() if kind == "weight" and "ln" not in part else t
    return load(transformers.GPT2LMHeadModel(hf), out)


def load(model_hf, state):
    """model_hf with every parameter from state; anything missing or left over is a mapping bug."""
    missing, unexpected = model_hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    assert not missing and not unexpected, f"weight mapping: missing {missing}, unexpected {unexpected}"
    return model_hf.eval()


ARCHITECTURES = {"rope": neox, "none": neox, "learned": gpt2}  # pos_emb -> the model transformers runs


@torch.inference_mode()
def max_logit_difference(model, model_hf):
    """(largest |logit difference|, largest |logit| of ours) on a random probe, past block_size where positions
    reach."""
    c = model.config
    n = c.block_size + (PROBE_TOKENS if positions.scheme(c.pos_emb).extrapolates else 0)
    idx = torch.randint(0, c.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    ours = model(idx, targets=idx)[0]  # targets: every position's logits
    theirs = model_hf(idx).logits
    return (ours - theirs).abs().max().item(), ours.abs().max().item()


# ----------------------------------------------------------------------------- tokenizer

def hf_tokenizer(meta, max_length):
    """The checkpoint's tokenizer as a transformers tokenizer with the same ids."""
    tok = tokenizer_from_meta(meta)  # gpt2 needs tiktoken's files: its ValueError says how to get them
    if meta["tokenizer"] == "char":
        backend = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(tok.chars)}, unk_token=None))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # each character
        backend.decoder = decoders.Fuse()  # joined with nothing between
        specials = {}
    else:
        backend = RanksConverter(tok.encoding).converted()
        eot = {i: s for s, i in tok.encoding._special_tokens.items()}.get(meta.get("eot"))
        specials = {"bos_token": eot, "eos_token": eot, "pad_token": eot} if eot else {}
    # clean_up_tokenization_spaces would drop the space before punctuation on decoding
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False,
                                                model_max_length=max_length, **specials)


class RanksConverter(TikTokenConverter):
    """transformers' tiktoken conversion (merges rebuilt from the ranks, tiktoken's whole-piece lookup kept) of an
    Encoding in memory: its own reads a ranks file through tiktoken's cache, which is keyed by path."""

    def __init__(self, encoding):
        super().__init__(pattern=encoding._pat_str, extra_special_tokens=encoding._special_tokens)
        self.ranks = encoding._mergeable_ranks

    def load_tiktoken_bpe(self, _):
        return self.ranks


# ----------------------------------------------------------------------------- the command

def export(out_dir, hf_dir, which="best", rope_scaling=None, rope_scaling_factor=None):
    """Write hf_dir from out_dir's checkpoint; returns the largest logit difference of the check."""
    hf_dir = Path(hf_dir)
    if hf_dir.is_file() or any((hf_dir / name).exists() for name in RUN_FILES):
        raise ValueError(f"{str(hf_dir)!r} is a file or a training run's folder; name a new folder for the export")
    if (rope_scaling is None) != (rope_scaling_factor is None):
        raise ValueError("--rope_scaling and --rope_scaling_factor go together: name the scaling and its factor")
    path, ckpt = load_run(out_dir, which)
    model = model_from_checkpoint(ckpt, path=path).float().eval()  # written, and checked, in float32
    if rope_scaling is not None:
        model.reconfigure(rope_scaling=rope_scaling, rope_scaling_factor=rope_scaling_factor)
    why = refusal(model.config)
    if why:
        raise ValueError(f"cannot export {str(path)!r}: {why}")
    # transformers' notes on configs and its progress bars for a one-file write are noise here
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model_hf = ARCHITECTURES[model.config.pos_emb](model, ckpt["tokenizer"])
    tok = hf_tokenizer(ckpt["tokenizer"], model_hf.config.max_position_embeddings)
    diff, scale = max_logit_difference(model, model_hf)
    assert diff <= PROBE_TOLERANCE * max(1.0, scale), f"exported logits differ from nanorope's by {diff:.3g}"
    model_hf.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    print(f"{path} -> {hf_dir}/ as {type(model_hf).__name__} ({model.config.pos_emb}"
        + (f", {model.config.rope_scaling} x{model.config.rope_scaling_factor:g}" if scaled(model.config) else "")
        + f"; tokenizer {ckpt['tokenizer']['tokenizer']}): logits agree with nanorope's to {diff:.2g}")
    return diff


def arg_parser():
    p = config.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", help="the training run's folder (best.pt / ckpt.pt)")
    p.add_argument("hf_dir", help="the transformers model folder to write (created; files of an earlier export "
                                  "there are replaced)")
    p.add_argument("--checkpoint", choices=tuple(CHECKPOINTS), default="best", help="best.pt or ckpt.pt (latest)")
    p.add_argument("--rope_scaling", choices=tuple(rope.SCALINGS), default=None,
                   help="a RoPE scaling to export the model with (RoPE models)")
    p.add_argument("--rope_scaling_factor", type=config.checked(float, lambda v: v >= 1, "a factor >= 1"),
                   default=None, help="its factor s: the model is set up for s times block_size")
    return p


def main(argv=None):
    args = arg_parser().parse_args(argv)
    try:
        export(args.out_dir, args.hf_dir, args.checkpoint, args.rope_scaling, args.rope_scaling_factor)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
