"""ViT-AdaLA (Sec. 3.2, Eqs. 3-4, Table 3): attention alignment alone (stage 1) leaves errors that accumulate
through depth; feature alignment of the whole model (stage 2) is needed.

``adala-depth``. Stage 1 aligns every layer's linear attention to the softmax layer *on the teacher's own input*
(teacher forcing, Eq. 3), so each layer's error is measured in isolation; once the linear layers are stacked, each
layer's input carries the errors of the layers before it. Measured on a trained softmax ViT of the vision suite
(none: the check is skipped, never run on a made-up teacher): the student (the teacher with every attention built
from the spec, weights copied, ELU+1 ``linear`` by default as in the paper) is stage-1 aligned (Eq. 3: W_Q, W_K, W_V
only, AdamW at a fixed learning rate, the teacher's block inputs), then run on held-out images beside the teacher:

- teacher-forced attention error per layer, ‖f_LA(X_l) − f_SA(X_l)‖ / ‖f_SA(X_l)‖ on the teacher's X_l;
- free-running attention error per layer, the same with the student's own X̂_l;
- hidden-state error after each block, ‖x̂_l − x_l‖ / ‖x_l‖ (the residual stream).

Statistic: the growth of the hidden-state error from the first block to the last (ratio of the means over images),
with a bootstrap interval over images. The same numbers before stage 1 (the plain swap) are recorded beside.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.image.classify import build_classifier
from attnbench.models.vit import load_pretrained

from .. import figures
from ..criteria import Criterion, bootstrap
from ..inputs import images, load_teacher
from .base import ClaimCheck, Context, Result, Skip


def _capture(model, x):
    """One forward of ``model`` on ``x``: per block, the attention's input and output and the block's output."""
    att_in, att_out, blk_out = [], [], []

    def on_attn(_m, args, out):  # returns None: the forward is unchanged
        att_in.append(args[0])
        att_out.append(out)

    hooks = []
    for b in model.blocks:
        hooks.append(b.attn.register_forward_hook(on_attn))
        hooks.append(b.register_forward_hook(lambda _m, _a, out: blk_out.append(out) and None))
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return att_in, att_out, blk_out


def _rel(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Per image: ‖a − b‖ / ‖b‖ over tokens x channels."""
    return ((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1).clamp_min(1e-30)).numpy()


def errors(teacher, student, x) -> dict[str, np.ndarray]:
    """``[layers, images]`` arrays: teacher-forced and free-running attention errors, hidden-state errors."""
    with torch.no_grad():
        t_in, t_out, t_blk = _capture(teacher, x)
        s_in, s_out, s_blk = _capture(student, x)
        forced = [_rel(b.attn(xi), o) for b, xi, o in zip(student.blocks, t_in, t_out)]
    return {"forced": np.array(forced), "free": np.array([_rel(a, o) for a, o in zip(s_out, t_out)]),
            "hidden": np.array([_rel(a, o) for a, o in zip(s_blk, t_blk)])}


def stage1(teacher, student, train_x: torch.Tensor, *, steps: int, lr: float, batch: int, seed: int) -> list[float]:
    """Eq. 3: per layer, MSE between the student's and the teacher's attention outputs on the teacher's block
    inputs, summed over layers; only the student's W_Q, W_K, W_V (``qkv``) are trained."""
    student.requires_grad_(False)
    params = []
    for b in student.blocks:
        b.attn.qkv.requires_grad_(True)
        params += list(b.attn.qkv.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        xb = train_x[torch.randint(0, len(train_x), (batch,), generator=g)]
        with torch.no_grad():
            t_in, t_out, _ = _capture(teacher, xb)
        loss = sum(F.mse_loss(b.attn(xi), o) for b, xi, o in zip(student.blocks, t_in, t_out))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    student.requires_grad_(False)
    return losses


def run_depth(ctx: Context) -> Result:
    s = ctx.settings
    crit = Criterion("hidden-state error growth, last block / first block", ">", 1.0, 1.0,
                     f"after stage 1 only, the relative hidden-state error grows from the first block to the last: "
                     f"the 99% bootstrap interval (over {s['test_images']} held-out images) of the ratio of mean "
                     f"errors lies above 1; fails if it lies at or below 1")
    if ctx.teacher is None:
        raise Skip("no trained model for real inputs")

    teacher, splits, pre = load_teacher(ctx.teacher)
    teacher.requires_grad_(False)
    torch.manual_seed(ctx.seed)
    student = build_classifier(ctx.spec, pre, splits.num_classes)
    load_pretrained(student, ctx.teacher.path, allow_missing_mechanism=True)
    student.eval()
    train_x = images(splits.train, s["train_images"])
    test_x = images(splits.test, s["test_images"])
    before = errors(teacher, student, test_x)
    losses = stage1(teacher, student, train_x, steps=s["steps"], lr=s["lr"], batch=s["batch"], seed=ctx.seed)
    after = errors(teacher, student, test_x)
    h = after["hidden"]
    stat = bootstrap(lambda ix: h[-1][ix].mean() / h[0][ix].mean(), h.shape[1], seed=ctx.seed)
    mean = lambda e: e.mean(axis=1).tolist()  # noqa: E731
    desc = (f"real: {ctx.teacher.describe()}; student = the teacher with {ctx.spec.label} attention, stage 1 (Eq. 3) "
            f"for {s['steps']} steps x {s['batch']} of {len(train_x)} training images (AdamW, lr {s['lr']}), "
            f"measured on {len(test_x)} test images")
    res = Result(crit, stat, desc,
                 {"layers": int(h.shape[0]), "stage1_forced": mean(after["forced"]), "stage1_free": mean(after["free"]),
                  "stage1_hidden": mean(after["hidden"]), "swap_forced": mean(before["forced"]),
                  "swap_free": mean(before["free"]), "swap_hidden": mean(before["hidden"]),
                  "stage1_loss_first": losses[0], "stage1_loss_last": losses[-1]})
    fig, axs = figures.axes(2)
    layers = np.arange(1, h.shape[0] + 1)
    for ax, (name, e) in zip(axs, (("plain swap", before), ("after stage 1", after))):
        ax.plot(layers, mean(e["forced"]), "o-", label="attention, teacher-forced")
        ax.plot(layers, mean(e["free"]), "s-", label="attention, free-running")
        ax.plot(layers, mean(e["hidden"]), "^-", label="hidden state (residual stream)")
        ax.set_xticks(layers)
        ax.set_xlabel("block")
        ax.set_ylabel("relative error vs the softmax teacher")
        ax.set_yscale("log")
        ax.set_title(f"{ctx.spec.label}: {name}", fontsize=8)
        ax.legend(fontsize=7)
    res.figure = figures.save(fig, ctx.figure, f"adala-depth ({ctx.spec.label})", res.verdict)
    return res


CHECKS = [
    ClaimCheck("adala-depth", "ViT-AdaLA Sec. 3.2 (Eqs. 3-4), Table 3",
          "without stage 2, the per-layer alignment errors of stage 1 accumulate with depth", ("linear",), ("real",),
          run_depth, {"train_images": 512, "test_images": 128, "steps": 150, "batch": 32, "lr": 1e-3}),
]
