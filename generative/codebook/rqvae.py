"""``rq-vae``: an MLP autoencoder with a residual vector quantiser (§5.1, §5.6)."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn

from generative.codebook.artifact import collision_stats
from generative.codebook.builder import CodebookBuilder
from generative.codebook.rqkmeans import residual_kmeans
from recsys.kmeans import nearest_centroid

__all__ = ["RQVAE", "RQVAECheckpoint"]

#: which epoch's weights encode the items: the lowest collision rate (``best_collision``) or the ``last``
RQVAECheckpoint = Literal["best_collision", "last"]


def _mlp(dims: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _ResidualVQ(nn.Module):
    """Residual vector quantiser: one codebook ``[K_l, D]`` per level, nearest-code assignment."""

    def __init__(self, sizes: Sequence[int], dim: int) -> None:
        super().__init__()
        self.books = nn.ParameterList([nn.Parameter(torch.zeros(s, dim)) for s in sizes])

    def forward(self, z: Tensor, beta: float) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
        """``z`` ``[B, D]`` -> straight-through quantised ``[B, D]``, codes ``[B, L]``, the VQ loss
        (mean over levels of codebook + β·commitment) and the residual entering each level."""
        residual = z
        quantised = torch.zeros_like(z)
        codes, residuals = [], []
        loss = z.new_zeros(())
        for book in self.books:
            residuals.append(residual.detach())
            idx, _ = nearest_centroid(residual.detach(), book.detach())
            q = book[idx]
            loss = loss + ((q - residual.detach()) ** 2).mean() + beta * ((residual - q.detach()) ** 2).mean()
            quantised = quantised + q
            residual = residual - q.detach()
            codes.append(idx)
        st = z + (quantised - z).detach()
        return st, torch.stack(codes, 1), loss / len(self.books), residuals


@dataclass
class RQVAE(CodebookBuilder):
    """RQ-VAE semantic IDs (§5.1, §5.6): MLP encoder ``d -> hidden -> latent``, residual VQ with
    ``levels × codebook_size`` codes, mirrored decoder.

    Codebooks are initialised by residual k-means on the untrained encoder's latents of all
    items. Loss = MSE reconstruction + mean over levels of ``‖sg(r_l) − q_l‖² + β‖r_l − sg(q_l)‖²``
    with the straight-through estimator; AdamW. Training assigns the nearest code (the
    reference's Sinkhorn-balanced assignment is not reproduced). Every epoch records the loss,
    code usage and perplexity per level (over the epoch's assignments) and the collision rate
    (nearest codes of all items); ``stats["training"]`` keeps the curves so collapse is visible.

    Args:
        hidden: encoder hidden widths (decoder mirrors them); TIGER: 512, 256, 128.
        latent: latent width (TIGER: 32).
        epochs, batch_size, lr, weight_decay: AdamW training (reference: lr 1e-3, wd 1e-4,
            batch 1024, thousands of epochs).
        beta: commitment weight (0.25).
        dead_code_reset: after an epoch, codes no item used are moved onto random residuals of
            their level (a cheap stand-in for balanced assignment; off shows raw collapse).
        checkpoint: ``"best_collision"`` keeps the epoch with the lowest collision rate (the
            reference's ``best_collision_model.pth``; ties -> later epoch), ``"last"`` the last.
    """

    name: ClassVar[str] = "rq-vae"

    hidden: list[int] = field(default_factory=lambda: [512, 256, 128])
    latent: int = 32
    epochs: int = 100
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 1e-4
    beta: float = 0.25
    dead_code_reset: bool = True
    checkpoint: RQVAECheckpoint = "best_collision"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.checkpoint not in get_args(RQVAECheckpoint):
            raise ValueError(f"checkpoint must be one of {list(get_args(RQVAECheckpoint))}, got {self.checkpoint!r}")
        if self.epochs < 0 or self.batch_size < 1 or self.latent < 1:
            raise ValueError("epochs must be >= 0, batch_size >= 1, latent >= 1")

    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        dev = torch.device(self.device)
        x = x.to(dev)
        gen = self._generator(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            encoder = _mlp([x.shape[1], *self.hidden, self.latent]).to(dev)
            decoder = _mlp([self.latent, *reversed(self.hidden), x.shape[1]]).to(dev)
        vq = _ResidualVQ(sizes, self.latent).to(dev)
        with torch.no_grad():
            _, books, _, _ = residual_kmeans(encoder(x), sizes, gen)
            for param, book in zip(vq.books, books):
                param.copy_(book)

        def evaluate() -> tuple[float, np.ndarray, list[Tensor]]:
            with torch.no_grad():
                z = encoder(x)
                st, codes, _, residuals = vq(z, self.beta)
                recon = float(((decoder(st) - x) ** 2).mean())
            return recon, codes.cpu().numpy(), residuals

        recon0, codes0, _ = evaluate()
        params = [*encoder.parameters(), *decoder.parameters(), *vq.parameters()]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        curves: dict[str, list[Any]] = {k: [] for k in ("epoch", "loss", "reconstruction_loss", "usage", "perplexity",
                                                       "collision_rate", "dead_codes_reset")}  # fmt: skip
        n = len(x)
        best_state: dict[str, Any] | None = None
        best_rate = math.inf
        for epoch in range(1, self.epochs + 1):
            counts = [torch.zeros(s, dtype=torch.long, device=dev) for s in sizes]
            perm = torch.randperm(n, generator=gen).to(dev)
            total = recon_total = 0.0
            for i in range(0, n, self.batch_size):
                xb = x[perm[i : i + self.batch_size]]
                st, codes, vq_loss, _ = vq(encoder(xb), self.beta)
                recon = ((decoder(st) - xb) ** 2).mean()
                loss = recon + vq_loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(xb)
                recon_total += float(recon.detach()) * len(xb)
                for lvl, c in enumerate(counts):
                    c += torch.bincount(codes[:, lvl], minlength=len(c))
            usage, ppl = [], []
            for c in counts:
                p = c[c > 0].double() / c.sum()
                usage.append(float((c > 0).double().mean()))
                ppl.append(float(torch.exp(-(p * p.log()).sum())))
            _, eval_codes, residuals = evaluate()
            reset = 0
            if self.dead_code_reset:
                with torch.no_grad():
                    for lvl, (c, book) in enumerate(zip(counts, vq.books)):
                        dead = torch.nonzero(c == 0).flatten()
                        if len(dead):
                            pick = torch.randint(n, (len(dead),), generator=gen).to(dev)
                            book[dead] = residuals[lvl][pick]
                            reset += len(dead)
                if reset:
                    _, eval_codes, _ = evaluate()  # the state that a checkpoint of this epoch holds
            rate = collision_stats(eval_codes)["collision_rate_before"]
            for key, value in (("epoch", epoch), ("loss", total / n), ("reconstruction_loss", recon_total / n),
                               ("usage", usage), ("perplexity", ppl), ("collision_rate", rate),
                               ("dead_codes_reset", reset)):  # fmt: skip
                curves[key].append(value)
            if self.checkpoint == "best_collision" and rate <= best_rate:
                best_rate = rate
                snapshot: dict[str, Any] = copy.deepcopy(
                    {"encoder": encoder.state_dict(), "decoder": decoder.state_dict(), "vq": vq.state_dict()}
                )
                snapshot["epoch"] = epoch
                best_state = snapshot
        chosen = self.epochs
        if best_state is not None:
            encoder.load_state_dict(best_state["encoder"])
            decoder.load_state_dict(best_state["decoder"])
            vq.load_state_dict(best_state["vq"])
            chosen = best_state["epoch"]
        recon, codes, _ = evaluate()
        return codes.astype(np.int64), {
            "reconstruction_loss_initial": recon0,
            "reconstruction_loss": recon,
            "collision_rate_initial": collision_stats(codes0)["collision_rate_before"],
            "checkpoint_epoch": chosen,
            "training": curves,
        }
