"""Token-weighting losses for semantic-ID generation (docs/methods.md §5.3–§5.5).

The generative head predicts an item's ``L`` semantic-ID tokens, one level per position. Every
loss here takes the decoder's logits and the target codes::

    logits  [B, L, V]   float; V >= max(level_sizes); entries beyond a level's size are very
                        negative (e.g. -1e9, never NaN)
    labels  [B, L]      int64; labels[b, l] in 0..level_sizes[l]-1

and returns a scalar. The weights are precomputed from data by :meth:`TokenWeighting.fit`
(never hard-coded per dataset, unlike the reference code)::

    weighting = TokenWeighting.create("multi", front_gain="entropy")
    weighting.fit(codebook.codes, codebook.level_sizes, split.train_target, item_vectors)
    loss = weighting(logits, labels)          # in the LightningModule's training_step
    weighting.weights_table()                 # JSON-able, for MLflow

Registered names: ``plain`` (:class:`PlainCE`), ``front`` (:class:`FrontGreater`),
``frequency`` (:class:`Frequency`) and ``multi`` (:class:`MultiTarget`).

**No EOS.** Our targets are exactly the ``L`` semantic-ID tokens; decoding is fixed-length, so
there is no EOS token. The reference's EOS rules (EOS weight forced to 1, the other weights
scaled to sum to 4) drop out: Front-Greater weights sum to ``L`` over the ``L`` positions and
frequency weights are renormalised to sum to ``L`` in every sample.

Adding a weighting is one :class:`TokenWeighting` subclass with a ``name`` (one module of this
package, imported below so that it registers); nothing else names it.

Every weighting runs on CPU and is deterministic: the fit is plain numpy over the data, the
weights are buffers (saved in the ``state_dict``, moved by ``.to(device)``).
"""

from generative.weighting.base import TokenWeighting, token_cross_entropy
from generative.weighting.frequency import Frequency, effective_number_weights
from generative.weighting.front import (
    FrontGain,
    FrontGreater,
    dispersion_gains,
    front_position_weights,
    prefix_entropy_gains,
)
from generative.weighting.multi import MixSchedule, MultiTarget
from generative.weighting.plain import PlainCE

__all__ = [
    "FrontGain",
    "FrontGreater",
    "Frequency",
    "MixSchedule",
    "MultiTarget",
    "PlainCE",
    "TokenWeighting",
    "dispersion_gains",
    "effective_number_weights",
    "front_position_weights",
    "prefix_entropy_gains",
    "token_cross_entropy",
]
