"""The language model's token mixers (NaLaFormer Table 5's rows): incremental decoding, the CPU forms against the
recurrences, Mamba against FLA's own layer, rotary against FLA's reference, the 340M parameter counts against
FLA's models, and the variants' names and errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.models.lm import LAYER_KINDS, LMConfig, build_lm
from attnbench.models.mixers import GLAMixer, MambaMixer, ShortConv, rotary, rotary_reference
from attnbench.suites.lm.config import load_preset, parse_variant, parse_variants

from .helpers import max_err, scale_of

REL = 1e-10

SMALL = {
    "transformer": dict(head_dim=16),
    "retnet": dict(head_dim=16, expand_v=2.0, use_gate=True, use_short_conv=False),
    "gla": dict(head_dim=16, expand_v=2.0, use_gate=True, use_short_conv=True),
    "mamba": dict(ssm_state=4),
    "deltanet": dict(head_dim=16),
    "gated_deltanet": dict(head_dim=16, expand_v=2.0, use_gate=True),
}


def small_model(layer: str, **over):
    torch.manual_seed(0)
    cfg = LMConfig(layer=layer, vocab_size=40, hidden=32, layers=2, heads=2, chunk_size=8,
                   **{**SMALL[layer], **over})
    return build_lm(cfg).double()


def close(a, b, what, rel=REL):
    err = max_err(a, b)
    assert err <= rel * scale_of(b), f"{what}: max error {err:.3e} (scale {scale_of(b):.3e})"


def same_as_theirs(mine, theirs, x: torch.Tensor, what: str) -> None:
    """``mine(x)`` equals ``theirs(x)[0]`` (an FLA layer returns a tuple), and so does the gradient of a fixed
    functional of the output with respect to ``x``."""
    y_theirs = theirs(x)[0]
    weight = y_theirs.detach().sin()
    (g_theirs,) = torch.autograd.grad((y_theirs * weight).sum(), x)
    y_mine = mine(x)
    (g_mine,) = torch.autograd.grad((y_mine * weight).sum(), x)
    close(y_mine, y_theirs, f"{what} forward")
    close(g_mine, g_theirs, f"{what} input gradient")


def test_every_layer_kind_has_its_small_config():
    assert sorted(SMALL) == sorted(LAYER_KINDS)


@pytest.mark.parametrize("layer", LAYER_KINDS)
def test_decoding_token_by_token_equals_one_forward(layer):
    model = small_model(layer)
    ids = torch.randint(0, 40, (2, 13))
    full = model(ids)
    caches, outs = model.init_caches(), []
    for piece in (ids[:, :5], ids[:, 5:6], ids[:, 6:]):       # a prefix, one token, the rest
        out, caches = model(piece, caches=caches)
        outs.append(out)
    close(torch.cat(outs, dim=1), full, f"{layer}: decoding in pieces")


@pytest.mark.parametrize("layer", ["gla", "retnet", "deltanet", "gated_deltanet"])
def test_the_chunked_cpu_form_equals_the_recurrence_through_the_model(layer):
    """The whole model, forward and backward, with the mixer's chunked form and with its token-by-token one."""
    model = small_model(layer)
    ids = torch.randint(0, 40, (2, 21))                        # 21: not a multiple of the chunk
    losses, grads = {}, {}
    for impl in ("torch", "recurrent"):
        model.zero_grad()
        logits = model(ids, impl=impl)
        losses[impl] = logits
        (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
        grads[impl] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    close(losses["torch"], losses["recurrent"], f"{layer}: logits")
    for name, g in grads["recurrent"].items():
        close(grads["torch"][name], g, f"{layer}: d{name}")


def test_the_mamba_mixer_is_flas_layer():
    """Same weights, float64: the mixer against FLA's ``Mamba`` layer on its CPU path (``slow_forward``), forward
    and the input's gradient; FLA's Triton SiLU is swapped for torch's (no Triton driver on a CPU)."""
    pytest.importorskip("fla")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.layers.mamba import Mamba

    cfg = LMConfig(layer="mamba", hidden=24, heads=1, head_dim=24, ssm_state=5, ssm_expand=2, dt_rank=3)
    torch.manual_seed(0)
    theirs = Mamba(hidden_size=24, state_size=5, intermediate_size=48, conv_kernel=4, dt_rank=3, use_bias=False,
                   use_conv_bias=True).double()
    theirs.act = torch.nn.SiLU()
    mine = MambaMixer(cfg).double()
    state = {n: p for n, p in theirs.state_dict().items()}
    mapped = {"conv.conv.weight": state["conv1d.weight"], "conv.conv.bias": state["conv1d.bias"],
              **{k: v for k, v in state.items() if not k.startswith("conv1d")}}
    assert mine.load_state_dict(mapped, strict=True)
    same_as_theirs(mine, theirs, torch.randn(2, 17, 24, dtype=torch.float64, requires_grad=True), "mamba")


def test_rotary_is_flas_reference():
    pytest.importorskip("fla")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.modules.rotary.ops import rotary_embedding_ref

    x = torch.randn(2, 3, 11, 16, dtype=torch.float64)         # [B, H, T, d]
    inv = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    freqs = torch.outer(torch.arange(4, 15, dtype=torch.float64), inv)                 # positions 4 .. 14
    ref = rotary_embedding_ref(x.transpose(1, 2), freqs.cos(), freqs.sin(), False).transpose(1, 2)
    close(rotary(x, 4, 10000.0), ref, "rotary at positions 4..14")


def test_rotary_tables_are_kept_and_give_the_same_bits_as_building_them():
    """The cos / sin tables are built once per (positions, width, dtype) and kept: the rotation is the one of
    tables built in the call, to the bit, at every start and length; the cache stays bounded while decoding."""
    from attnbench.models import mixers

    def built(x, start, theta):
        d = x.shape[-1]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        freqs = torch.outer(torch.arange(start, start + x.shape[-2], dtype=torch.float64), inv)
        cos, sin = (torch.cat([f, f], dim=-1).to(x.dtype) for f in (freqs.cos(), freqs.sin()))
        return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1) * sin

    for dtype in (torch.float32, torch.float64):
        for start, T in ((0, 64), (0, 7), (5, 1), (61, 3)):
            x = torch.randn(2, 3, T, 16, dtype=dtype)
            assert torch.equal(rotary(x, start, 10000.0), built(x, start, 10000.0)), (dtype, start, T)
            assert torch.equal(rotary(x, start, 10000.0), built(x, start, 10000.0)), "from the kept table"
    for start in range(600):
        rotary(torch.randn(1, 1, 1, 8), start, 10000.0)
    assert len(mixers._ROTARY_TABLES) <= 256
    # the tables are a constant to torch.compile: the mark set without importing dynamo is torch's own
    marked = torch.compiler.assume_constant_result(lambda: None)
    assert {k for k in vars(marked)} == {k for k in vars(mixers._rotary_table) if k.startswith("_dynamo")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotarys_gradient_is_the_composed_forms_to_the_bit(dtype):
    """Outputs and input gradients equal the composed form's to the bit, in the same layouts (the output in x's, the
    gradient contiguous), for heads as the mixers make them (a transposed view of ``[B, T, H*d]``) and contiguous,
    one head and three, incoming gradients contiguous and transposed, at a start past 0 and an odd length."""
    from attnbench.models.mixers import _heads

    for H in (1, 3):
        for heads_view in (True, False):
            for g_transposed in (False, True):
                torch.manual_seed(H)
                x0 = torch.randn(2, 9, H * 16, dtype=dtype)
                g = torch.randn(2, 9, H, 16, dtype=dtype).transpose(1, 2)
                g = g if g_transposed else g.contiguous()
                got = []
                for form in (rotary_reference, rotary):
                    x = x0.clone().requires_grad_()
                    xh = _heads(x, H) if heads_view else _heads(x, H).contiguous()
                    xh.retain_grad()
                    y = form(xh, 5, 10000.0)
                    y.backward(g)
                    # one head: the output's size-1 head dim has a stride of no consequence, which may differ
                    got.append((y.detach(), xh.grad, xh.grad.stride(), y.stride() if H > 1 else None))
                (y0, g0, gs0, ys0), (y1, g1, gs1, ys1) = got
                case = (H, heads_view, g_transposed)
                assert torch.equal(y1, y0), f"output {case}"
                assert torch.equal(g1, g0), f"gradient {case}"
                assert (gs1, ys1) == (gs0, ys0), f"layouts {case}"


@pytest.mark.parametrize("bias,activation", [(False, False), (True, True), (False, True)])
def test_short_conv_is_the_composed_form_to_the_bit(bias, activation):
    """The window built channels-first (one copy less) gives the composed form's outputs, window and gradients (of
    the input, the previous window, the weight and bias) to the bit, from zeros and from a carried window; with
    ``contiguous`` the output is a contiguous copy of the same numbers."""
    torch.manual_seed(0)
    for contiguous in (False, True):
        conv = ShortConv(24, 4, activation=activation, bias=bias, contiguous=contiguous)
        x0, prev0, g = torch.randn(3, 11, 24), torch.randn(3, 3, 24), torch.randn(3, 11, 24)
        for with_prev in (False, True):
            got = []
            for form in (ShortConv.forward_reference, ShortConv.forward):
                conv.zero_grad(set_to_none=True)
                x, prev = x0.clone().requires_grad_(), prev0.clone().requires_grad_()
                y, window = form(conv, x, prev if with_prev else None)
                y.backward(g)
                got.append([y.detach(), window.detach(), x.grad, conv.conv.weight.grad]
                           + ([prev.grad] if with_prev else []) + ([conv.conv.bias.grad] if bias else []))
            for i, (a, b) in enumerate(zip(*got)):
                assert torch.equal(b, a), f"tensor {i} (contiguous={contiguous}, carried window={with_prev})"
        assert y.is_contiguous() == contiguous


def test_the_blocks_contiguous_convolution_changes_no_number():
    """Every block's convolution (Zoology's, before the mixer) hands the mixer a contiguous copy, which only its
    linear projections read: logits and every gradient are the same to the bit as with the transposed view, for
    every layer kind, in float32 (where a change of order would show)."""
    for layer in LAYER_KINDS:
        model = small_model(layer, block_conv=3).float()
        ids = torch.randint(0, 40, (2, 13))
        got = []
        for contiguous in (True, False):
            for block in model.blocks:
                block.block_conv.contiguous = contiguous
            model.zero_grad(set_to_none=True)
            logits = model(ids)
            (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
            got.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        (l1, g1), (l0, g0) = got
        assert torch.equal(l1, l0), f"{layer}: logits"
        for name in g0:
            assert torch.equal(g1[name], g0[name]), f"{layer}: d{name}"


def test_the_340m_rows_count_as_flas_models():
    """Every row of the 340m preset, built on the meta device, has the parameters of FLA's model of the same
    config (flame's transformer_340M and gla_340M; FLA's RetNet and Mamba configs at width 1024)."""
    pytest.importorskip("fla")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import fla.layers.attn as fla_attn
        from fla.models import (DeltaNetConfig, DeltaNetForCausalLM, GLAConfig, GLAForCausalLM, MambaConfig,
                                MambaForCausalLM, RetNetConfig, RetNetForCausalLM, TransformerConfig,
                                TransformerForCausalLM)

    if getattr(fla_attn, "flash_attn_func", None) is None:      # building (not running) needs the name only
        fla_attn.flash_attn_func = lambda *a, **k: None
    common = dict(hidden_size=1024, num_hidden_layers=24, vocab_size=32000, tie_word_embeddings=False)
    theirs = {
        "transformer": (TransformerForCausalLM, TransformerConfig(num_heads=16, **common)),
        "retnet": (RetNetForCausalLM, RetNetConfig(num_heads=8, expand_k=1, expand_v=2, hidden_ratio=2, **common)),
        "gla": (GLAForCausalLM, GLAConfig(num_heads=4, expand_k=0.5, expand_v=1, hidden_ratio=4, **common)),
        "mamba": (MambaForCausalLM, MambaConfig(state_size=16, expand=2, conv_kernel=4,
                                                **{**common, "num_hidden_layers": 48})),
        "deltanet": (DeltaNetForCausalLM, DeltaNetConfig(num_heads=8, expand_k=1, expand_v=1, **common)),
    }
    pre = load_preset("340m")
    for layer, (model_cls, config) in theirs.items():
        with torch.device("meta"):
            fla_count = sum(p.numel() for p in model_cls(config).parameters())
        mine = build_lm(pre.model_config(parse_variant(layer), 32000), "meta").num_params()
        assert mine == fla_count, f"{layer}: {mine:,} parameters here, {fla_count:,} in FLA's model"


# --- variants ----------------------------------------------------------------------------------------------------
def test_variant_names_and_their_cells():
    labels = ["transformer", "transformer+nala", "retnet", "gla", "gla+nala", "mamba", "deltanet",
              "gated_deltanet+nala:qk_norm=k"]
    variants = parse_variants(",".join(labels))
    assert [v.label for v in variants] == labels                        # each parses back to itself
    by = {v.label: v for v in variants}
    assert by["deltanet"].options() == {"feature_map": "silu"}         # the delta rows' cells as before
    assert by["transformer"].options() == {"attention": "softmax"} and by["gla"].options() == {}
    pre = load_preset("tiny")
    assert pre.model_config(by["transformer+nala"], 100).attention == "nala"
    assert pre.model_config(by["gla"], 100).qk_map == "" and pre.model_config(by["gla+nala"], 100).qk_map == "nala"


@pytest.mark.parametrize("text, err, match", [
    ("mamba+nala", AttnbenchError, "mamba has no q/k slot"),
    ("transformer+linformer", AttnbenchError, "no causal form"),
    ("transformr", UnknownNameError, "did you mean 'transformer'"),
    ("gla+nal", UnknownNameError, "nal"),
    ("retnet:chunk=4", AttnbenchError, "chunk"),
])
def test_a_wrong_variant_is_one_line_naming_it(text, err, match):
    with pytest.raises(err, match=match) as e:
        parse_variant(text)
    assert "\n" not in str(e.value)


def test_a_transformer_needs_its_heads_to_fill_the_width():
    with pytest.raises(AttnbenchError, match="heads \\* head_dim == hidden"):
        LMConfig(layer="transformer", hidden=32, heads=2, head_dim=8)
    with pytest.raises(AttnbenchError, match="mamba has no q/k feature map"):
        LMConfig(layer="mamba", feature_map="nala")


def test_the_gla_mixer_is_flas_layer(monkeypatch):
    """Same weights, float64: the mixer against FLA's ``GatedLinearAttention`` (its projections, low-rank gate,
    head split and output gate), with what needs a GPU stood in for by plain torch: its recurrent kernel by its
    naive reference (run in float64) and its Triton RMSNorm and SiLU by torch's."""
    pytest.importorskip("fla")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import fla.layers.gla as fla_gla
    from .test_gla import fla_naive_fp64

    naive = fla_naive_fp64("gla").naive_recurrent_gla
    monkeypatch.setattr(fla_gla, "fused_recurrent_gla",
                        lambda q, k, v, gk, initial_state=None, output_final_state=False, **kw:
                        naive(q, k, v, gk, initial_state=initial_state, output_final_state=output_final_state))
    torch.manual_seed(0)
    theirs = fla_gla.GatedLinearAttention(hidden_size=32, num_heads=2, expand_k=1.0, expand_v=2.0, fuse_norm=False,
                                          norm_eps=1e-6, layer_idx=0).double()
    theirs.g_norm = torch.nn.RMSNorm(32, eps=1e-6).double()
    theirs.gate_fn = torch.nn.functional.silu
    cfg = LMConfig(layer="gla", hidden=32, heads=2, head_dim=16, expand_v=2.0, use_gate=True, use_short_conv=False)
    mine = GLAMixer(cfg).double()
    state = theirs.state_dict()
    assert mine.load_state_dict({("o_norm.weight" if k == "g_norm.weight" else k): v for k, v in state.items()},
                                strict=True)
    same_as_theirs(mine, theirs, torch.randn(2, 19, 32, dtype=torch.float64, requires_grad=True), "gla")
