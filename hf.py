"""Hugging Face transformers interop, both ways, weights mapped name by name with no custom code on either side.

Out (export.py): pos_emb=rope or none -> GPT-NeoX, or Persimmon where qk_norm is on (its qk_layernorm is ours:
a LayerNorm of each head's queries and keys before the rotation); pos_emb=learned -> GPT-2. In (train.py and
sample.py --init_from=hf:NAME_OR_PATH): a GPT-2 checkpoint -> learned positions with the tanh GELU; the
GPT-NeoX family (Pythia) -> RoPE in the half layout with partial rotary and the parallel residual. What one
side cannot compute as the other does is refused in one line naming it. transformers is imported where it is
used: nothing else of nanorope needs it.
"""

import torch

import config
import positions
import rope
import scalings
from data.hub import hf_checkpoint, hf_tokenizer_fields
from model import GPTConfig, scheme_class

# mlp_act -> the activation's name in transformers (hidden_act, activation_function): the same functions
HIDDEN_ACTS = {
    "gelu": "gelu",  # the exact erf GELU
    "gelu_tanh": "gelu_new",  # GPT-2's tanh approximation
    "relu2": "relu2",
}  # transformers' ReLUSquaredActivation
PROBE_TOKENS = 32  # tokens past block_size in the logit check of a RoPE or NoPE model, so length scalings act


def transformers():
    """The transformers module, or one line saying how to install (or reinstall) it."""
    transformers = config.optional_package("transformers", "export and hf: imports", "pip install -e '.[hf]'")
    transformers.logging.set_verbosity_error()  # its notes on configs and one-file progress bars are noise here
    transformers.logging.disable_progress_bar()
    return transformers


# ----------------------------------------------------------------------------- out: a nanorope model in transformers


def refusal(cfg):
    """Why transformers cannot run this model as nanorope does, or None."""
    if cfg.logit_softcap:
        return (
            f"logit_softcap={cfg.logit_softcap}: GPT-NeoX, Persimmon and GPT-2 have no soft cap of the logits "
            "(Gemma 2's has one, in a block of RMSNorms and gated MLPs, not ours)"
        )
    if cfg.mlp_act not in HIDDEN_ACTS:
        return f"mlp_act={cfg.mlp_act!r} has no transformers activation here"
    scheme = scheme_class(cfg.pos_emb)
    family, lacks = scheme.transformers()
    if family is None:
        return (
            f"pos_emb={cfg.pos_emb!r} has no transformers architecture here: GPT-NeoX, Persimmon and GPT-2 lack "
            f"{lacks} (export writes rope and none as GPT-NeoX or Persimmon, learned as GPT-2)"
        )
    learned = ARCHITECTURES[family] is gpt2
    if cfg.qk_norm and (learned or cfg.parallel_residual):
        return (
            f"qk_norm=True with {'learned positions' if learned else 'parallel_residual=True'}: of the "
            "architectures here only Persimmon normalises queries and keys, and it has RoPE and a sequential "
            "residual"
        )
    if cfg.parallel_residual and learned:
        return "parallel_residual=True with learned positions: GPT-2's residual is sequential"
    if not issubclass(scheme, positions.RoPE):
        return None
    if scalings.scaling_of(cfg).tempered and cfg.rope_fraction < 1:
        return (
            f"rope_scaling={cfg.rope_scaling!r} with rope_fraction={cfg.rope_fraction} < 1: transformers puts its "
            "attention temperature on the rotated dims alone, nanorope on the whole score; export with another "
            "--rope_scaling, or a model that rotates every dim"
        )
    if cfg.rope_p < 1:
        return (
            f"rope_p={cfg.rope_p} < 1 (p-RoPE leaves the slowest frequencies unrotated): the rotary of "
            "transformers rotates every frequency of its rotary dims"
        )
    return None


def rope_parameters(cfg, rotates):
    """transformers' rope_parameters for a config whose scheme rotates (RoPE) or not (NoPE: no rotary dims)."""
    if not rotates:
        return {"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": 0.0}
    # the fraction itself, not rot_dim / head_dim: both sides take int(head_dim * fraction) dims
    rot_dim = int(cfg.head_dim * cfg.rope_fraction)
    return scalings.scaling_of(cfg).hf_parameters(rot_dim, cfg.rope_base, cfg.rope_scaling_factor, cfg.L0) | {
        "partial_rotary_factor": cfg.rope_fraction
    }


def token_ids(meta):
    """bos (the start token nanorope samples from), eos (the end of text, where the tokenizer has one) and pad."""
    eos = meta.get("eot")
    return {"bos_token_id": meta["start_id"], "eos_token_id": eos, "pad_token_id": eos}


def weights(model):
    """Our state dict with the biases bias=False leaves out as zeros, for architectures that always have them."""
    sd = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module.bias is None:
            sd[f"{name}.bias"] = torch.zeros(module.weight.shape[0])  # one per output feature
    return sd


def head_dims(cfg, rot_dim):
    """The permutation of a head's dims into the half layout of GPT-NeoX's and Persimmon's rotary: the rotated dims
    of q and k re-paired (rope.half_to_interleaved maps half to interleaved, its inverse back), the rest kept."""
    dims = torch.arange(cfg.head_dim)
    if rot_dim and cfg.rope_layout == "interleaved":
        dims[:rot_dim] = rope.half_to_interleaved(rot_dim).argsort()
    return dims


def qkv_order(cfg, rot_dim):
    """The permutation of c_attn's rows (3 nh hs) into the (nh 3 hs) order of the fused query_key_value, q's and k's
    dims permuted by head_dims (values carry no position). Import applies its inverse (argsort)."""
    rows = torch.arange(3 * cfg.n_embd).view(3, cfg.n_head, cfg.head_dim)  # (3, nh, hs)
    rows = torch.cat((rows[:2, :, head_dims(cfg, rot_dim)], rows[2:]))
    return rows.transpose(0, 1).flatten()  # (nh, 3, hs) -> (3 C,)


def permuted(ours, t, cfg, rot_dim, inverse=False):
    """Our weight named ours as the fused architectures hold it: c_attn's rows by qkv_order, QK-norm's gains and
    biases by head_dims (they act on the dims before the rotation); the rest as it is."""
    if ".c_attn." in ours:
        order = qkv_order(cfg, rot_dim)
    elif ".ln_q." in ours or ".ln_k." in ours:
        order = head_dims(cfg, rot_dim)
    else:
        return t
    return t[order.argsort() if inverse else order]


# Our block's parts under the names of each architecture with a fused query_key_value (layer prefix first)
ROTARY_ARCHITECTURES = {
    "GPTNeoXForCausalLM": dict(
        base="gpt_neox",
        embed="embed_in",
        final="final_layer_norm",
        head="lm_head",
        attn="attention",
        parts={
            "input_layernorm": "ln_1",
            "post_attention_layernorm": "ln_2",
            "attention.query_key_value": "attn.c_attn",
            "attention.dense": "attn.c_proj",
        },
    ),
    "PersimmonForCausalLM": dict(
        base="model",
        embed="embed_tokens",
        final="final_layernorm",
        head="lm_head",
        attn="self_attn",
        parts={
            "input_layernorm": "ln_1",
            "post_attention_layernorm": "ln_2",
            "self_attn.query_key_value": "attn.c_attn",
            "self_attn.dense": "attn.c_proj",
            "self_attn.q_layernorm": "attn.ln_q",
            "self_attn.k_layernorm": "attn.ln_k",
        },
    ),
}
MLP_PARTS = {"mlp.dense_h_to_4h": "mlp.c_fc", "mlp.dense_4h_to_h": "mlp.c_proj"}


def rotary_names(arch, cfg):
    """{transformers name: our name} of every weight of a GPT-NeoX or Persimmon model, and the qkv rows' order."""
    a = ROTARY_ARCHITECTURES[arch]
    names = {
        f"{a['base']}.{a['embed']}.weight": "wte.weight",
        f"{a['base']}.{a['final']}.weight": "ln_f.weight",
        f"{a['base']}.{a['final']}.bias": "ln_f.bias",
        f"{a['head']}.weight": "lm_head.weight",
    }
    parts = a["parts"] | MLP_PARTS
    for i in range(cfg.n_layer):
        for theirs, ours in parts.items():
            for kind in ("weight", "bias"):
                names[f"{a['base']}.layers.{i}.{theirs}.{kind}"] = f"blocks.{i}.{ours}.{kind}"
    return names


def gpt2_names(cfg):
    """{transformers name: our name} of every weight of a GPT-2 model (q, k, v keep our order)."""
    names = {
        "transformer.wte.weight": "wte.weight",
        "transformer.wpe.weight": "scheme.wpe.weight",
        "transformer.ln_f.weight": "ln_f.weight",
        "transformer.ln_f.bias": "ln_f.bias",
        "lm_head.weight": "lm_head.weight",
    }
    for i in range(cfg.n_layer):
        for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            for kind in ("weight", "bias"):
                names[f"transformer.h.{i}.{part}.{kind}"] = f"blocks.{i}.{part}.{kind}"
    return names


def conv1d(name):
    """Whether GPT-2 keeps this weight in a Conv1D, (in, out), where nn.Linear keeps (out, in)."""
    return name.endswith(".weight") and any(p in name for p in (".c_attn.", ".c_proj.", ".c_fc."))


def rotary_architecture(model, meta):
    """A GPT-NeoX model (Persimmon with qk_norm) that computes what model computes."""
    tf, c = transformers(), model.config
    rope_scheme = model.scheme if isinstance(model.scheme, positions.RoPE) else None  # NoPE: no rotary dims
    common = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=model.blocks[0].mlp.c_fc.out_features,
        hidden_act=HIDDEN_ACTS[c.mlp_act],
        attention_dropout=c.dropout,
        hidden_dropout=c.dropout,
        layer_norm_eps=model.ln_f.eps,
        tie_word_embeddings=c.tie_embeddings,
        rope_parameters=rope_parameters(c, rope_scheme is not None),
        max_position_embeddings=scalings.scaling_of(c).hf_context(c.block_size, c.L0, c.rope_scaling_factor),
        **token_ids(meta),
    )
    if c.qk_norm:
        arch, hf = "PersimmonForCausalLM", tf.PersimmonForCausalLM(tf.PersimmonConfig(qk_layernorm=True, **common))
    else:
        arch = "GPTNeoXForCausalLM"
        hf = tf.GPTNeoXForCausalLM(
            tf.GPTNeoXConfig(use_parallel_residual=c.parallel_residual, attention_bias=c.bias, **common)
        )
    sd, rot_dim = weights(model), rope_scheme.rot_dim if rope_scheme else 0
    state = {theirs: permuted(ours, sd[ours], c, rot_dim) for theirs, ours in rotary_names(arch, c).items()}
    if arch == "GPTNeoXForCausalLM" and not c.bias:  # attention_bias=False: GPT-NeoX's attention then has none
        state = {k: v for k, v in state.items() if not (".attention." in k and k.endswith(".bias"))}
    hf = load(hf, state)
    if rope_scheme is not None:  # the frequencies, computed by transformers from the config, are ours
        theirs = hf.base_model.rotary_emb.inv_freq
        assert torch.allclose(theirs, rope_scheme.inv_freq.float(), rtol=1e-6, atol=0), (
            f"RoPE frequencies differ: {theirs}"
        )
    return hf


def gpt2(model, meta):
    """A GPT-2 model that computes what model (learned positions) computes."""
    tf, c = transformers(), model.config
    hf = tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=c.vocab_size,
            n_positions=c.block_size,
            n_embd=c.n_embd,
            n_layer=c.n_layer,
            n_head=c.n_head,
            n_inner=model.blocks[0].mlp.c_fc.out_features,
            activation_function=HIDDEN_ACTS[c.mlp_act],
            resid_pdrop=c.dropout,
            embd_pdrop=c.dropout,
            attn_pdrop=c.dropout,
            layer_norm_epsilon=model.ln_f.eps,
            tie_word_embeddings=c.tie_embeddings,
            **token_ids(meta),
        )
    )
    sd = weights(model)
    return load(hf, {theirs: sd[ours].t() if conv1d(theirs) else sd[ours] for theirs, ours in gpt2_names(c).items()})


def load(model_hf, state):
    """model_hf with every parameter from state; anything missing or left over is a mapping bug."""
    missing, unexpected = model_hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    assert not missing and not unexpected, f"weight mapping: missing {missing}, unexpected {unexpected}"
    return model_hf.eval()


# a scheme's hf_family -> the writer of a model that runs it
ARCHITECTURES = {"rotary": rotary_architecture, "gpt2": gpt2}


def exported(model, meta):
    """The transformers model that runs model, or a ValueError saying why none can."""
    why = refusal(model.config)
    if why:
        raise ValueError(why)
    return ARCHITECTURES[scheme_class(model.config.pos_emb).transformers()[0]](model, meta)


@torch.inference_mode()
def max_logit_difference(model, model_hf):
    """(largest |logit difference|, largest |logit| of ours) on a random probe, past block_size where positions
    reach."""
    c = model.config
    n = c.block_size + (PROBE_TOKENS if scheme_class(c.pos_emb).extrapolates else 0)
    idx = torch.randint(0, c.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    ours = model(idx, targets=idx)[0]  # targets: every position's logits
    theirs = model_hf(idx).logits
    return (ours - theirs).abs().max().item(), ours.abs().max().item()


# ----------------------------------------------------------------------------- in: a transformers checkpoint as ours


def pretrained_config(name, where):
    """The transformers config of NAME_OR_PATH (downloaded and cached by transformers as usual), or one line."""
    tf, found = transformers(), hf_checkpoint(name, where)
    try:
        return tf.AutoConfig.from_pretrained(found)
    except (OSError, ValueError) as e:  # not a model folder, or a name the hub does not know
        raise ValueError(
            f"{where}: no transformers model of that name or path could be loaded ({str(e).splitlines()[0][:160]})"
        ) from None


def require(where, what, value, wanted):
    if value != wanted:
        raise ValueError(f"{where}: {what}={value!r} has no nanorope equivalent (it needs {wanted!r})")


def activation(where, hidden_act):
    acts = {v: k for k, v in HIDDEN_ACTS.items()} | {"gelu_pytorch_tanh": "gelu_tanh"}
    if hidden_act not in acts:
        raise ValueError(f"{where}: activation {hidden_act!r} has no nanorope equivalent; supported: {', '.join(acts)}")
    return acts[hidden_act]


def import_config(where, hf):
    """The GPTConfig of the architecture hf (a transformers config) describes, at its own context; one line for
    anything that does not map."""
    arch = (hf.architectures or [type(hf).__name__])[0]
    if hf.model_type == "gpt2":
        require(where, "n_inner", hf.n_inner or 4 * hf.n_embd, 4 * hf.n_embd)
        require(where, "scale_attn_by_inverse_layer_idx", hf.scale_attn_by_inverse_layer_idx, False)
        require(where, "layer_norm_epsilon", hf.layer_norm_epsilon, 1e-5)
        return GPTConfig(
            vocab_size=hf.vocab_size,
            block_size=hf.n_positions,
            n_layer=hf.n_layer,
            n_head=hf.n_head,
            n_embd=hf.n_embd,
            bias=True,
            pos_emb="learned",
            mlp_act=activation(where, hf.activation_function),
            tie_embeddings=hf.tie_word_embeddings,
        )
    if hf.model_type == "gpt_neox":
        require(where, "intermediate_size", hf.intermediate_size, 4 * hf.hidden_size)
        require(where, "layer_norm_eps", hf.layer_norm_eps, 1e-5)
        require(where, "attention_bias", hf.attention_bias, True)
        rp = hf.rope_parameters
        try:
            base, scaling, factor, L0 = scalings.from_hf(rp, hf.max_position_embeddings)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        config = GPTConfig(
            vocab_size=hf.vocab_size,
            block_size=hf.max_position_embeddings,
            n_layer=hf.num_hidden_layers,
            n_head=hf.num_attention_heads,
            n_embd=hf.hidden_size,
            bias=True,
            pos_emb=positions.RoPE.name,
            original_len=L0,
            rope_base=base,
            rope_scaling=scaling,
            rope_scaling_factor=factor,
            rope_fraction=float(rp.get("partial_rotary_factor", 1.0)),
            rope_layout="half",
            mlp_act=activation(where, hf.hidden_act),
            parallel_residual=hf.use_parallel_residual,
            tie_embeddings=hf.tie_word_embeddings,
        )
        why = refusal(config)  # what transformers computes otherwise than nanorope, as on the way out
        if why:
            raise ValueError(f"{where}: {why}")
        return config
    raise ValueError(
        f"{where} is a {arch} ({hf.model_type}); nanorope imports GPT-2 (gpt2) and the GPT-NeoX family "
        "(gpt_neox: Pythia)"
    )


def load_pretrained(model, name, where):
    """model (of a config source.fine_tune_config allows) with the checkpoint's weights; a learned position
    table is cut to the model's block_size. A damaged weights file is one line naming it."""
    from safetensors import SafetensorError  # installed with transformers

    tf = transformers()
    try:
        hf = tf.AutoModelForCausalLM.from_pretrained(hf_checkpoint(name, where), dtype=torch.float32)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(
            f"{where}: its weights cannot be read ({str(e).splitlines()[0][:200]}); the file is damaged "
            "or incomplete: download it again"
        ) from None
    theirs, c = hf.state_dict(), model.config
    if ARCHITECTURES[scheme_class(c.pos_emb).transformers()[0]] is gpt2:
        names = gpt2_names(c)
        state = {ours: theirs[t].t() if conv1d(t) else theirs[t] for t, ours in names.items()}
    else:
        rot_dim = int(c.head_dim * c.rope_fraction)
        state = {
            ours: permuted(ours, theirs[t], c, rot_dim, inverse=True)
            for t, ours in rotary_names(type(hf).__name__, c).items()
        }
    if c.tie_embeddings:
        state["lm_head.weight"] = state["wte.weight"]
    return model.load_trained(state)


def source(name, where):
    """hf:name's model config (its architecture at its own context), its own tokenizer (meta) and how its weights go
    into a model: what source.load_source makes a Source of."""
    config = import_config(where, pretrained_config(name, where))
    return config, hf_tokenizer_fields(name, where), lambda model: load_pretrained(model, name, where)
