"""MLflow logging of generative runs: the ranking run layout plus codebook and token-weight records."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from recsys.tracking import MlflowTracking, RunTracker
from recsys.trainer_attrs import model_checkpoint

__all__ = ["GenerativeTracking", "plot_training_curve", "plot_weight_history", "weight_view"]


def plot_training_curve(history: list[dict[str, float]]) -> Any:
    """Training loss and validation Recall/NDCG@10 per epoch."""
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_rank) = plt.subplots(1, 2, figsize=(9, 3.2))
    epochs = [h["epoch"] for h in history]
    ax_loss.plot(epochs, [h.get("train_loss_epoch") for h in history], marker="o")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Training loss")
    for key, label in (("val_recall_10", "Recall@10"), ("val_ndcg_10", "NDCG@10")):
        ax_rank.plot(epochs, [h.get(key) for h in history], marker="o", label=label)
    ax_rank.set(xlabel="epoch", title="Validation")
    ax_rank.legend()
    fig.tight_layout()
    return fig


def weight_view(table: dict[str, Any]) -> tuple[dict[str, float] | None, list[float] | None]:
    """(loss-mixture weights by component, per-position weights) of a ``weights_table()`` entry."""
    mixture = None
    if table.get("mixture_weights") is not None:
        mixture = dict(zip(table["components"], table["mixture_weights"], strict=True))
    positions = table.get("position_weights")
    if positions is None and isinstance(table.get("front"), dict):
        positions = table["front"].get("position_weights")
    return mixture, positions


def plot_weight_history(history: list[dict[str, Any]]) -> Any:
    """Token weights over training: mixture weights (multi-target) and per-position weights."""
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    views = [weight_view(h) for h in history]
    mixtures = [v[0] for v in views]
    positions = [v[1] for v in views]
    panels = [p for p in ("mixture", "position") if (mixtures[0] if p == "mixture" else positions[0]) is not None]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=False):
        series: list[Any] = mixtures if panel == "mixture" else positions  # no None: the panel is shown
        first = series[0]
        keys = list(first) if isinstance(first, dict) else list(range(len(first)))
        for key in keys:
            ax.plot(steps, [s[key] for s in series], marker="o", label=str(key))
        ax.set(xlabel="optimiser step", ylabel="weight", title="Loss mixture" if panel == "mixture" else "SID position weights")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


class GenerativeTracking(MlflowTracking):
    """:class:`~recsys.tracking.MlflowTracking` for ``salience gen``: also logs the codebook
    statistics, the token-weight tables of every epoch and a plot of the weights over training."""

    def start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> RunTracker | None:
        tracker = super().start(trainer, pl_module)
        catalog = getattr(pl_module, "catalog", None)
        if tracker is not None and catalog is not None:
            tracker.log_params({"data.num_items": catalog.num_items, "data.train_examples": len(catalog.train_targets)})
            if catalog.level_sizes is not None:
                tracker.log_params({"codebook.level_sizes": catalog.level_sizes})
                stats = {k: v for k, v in catalog.codebook_stats.items() if isinstance(v, (int, float))}
                tracker.log_metrics({f"codebook.{k}": float(v) for k, v in stats.items()})
                tracker.log_dict(catalog.codebook_stats, "codebook_stats.json")
        return tracker

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # the model (and its catalogue) is built in configure_model, after setup: start later
        pass

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.start(trainer, pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.start(trainer, pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.start(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        history = getattr(pl_module, "weight_history", [])
        if self.tracker is not None and history:
            mixture, _ = weight_view(history[-1])
            flat = {f"weights.mixture.{k}": float(v) for k, v in (mixture or {}).items()}
            self.tracker.log_metrics(flat, step=trainer.current_epoch)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.tracker is None:
            return
        import matplotlib.pyplot as plt

        if self.history:
            fig = plot_training_curve(self.history)
            self.tracker.log_figure(fig, "training_curve.png")
            plt.close(fig)
        weights = getattr(pl_module, "weight_history", [])
        if weights:
            self.tracker.log_dict(weights, "token_weights.json")
            fig = plot_weight_history(weights)
            self.tracker.log_figure(fig, "token_weights.png")
            plt.close(fig)
        ckpt = model_checkpoint(trainer)
        if ckpt is not None and ckpt.best_model_score is not None:
            self.tracker.log_metrics({f"best_{ckpt.monitor}": float(ckpt.best_model_score)})
            self.tracker.set_tags({"salience.best_checkpoint": ckpt.best_model_path})
