"""Synthetic CTR data with planted ground truth: the embedded default dataset
(:mod:`~recsys.data.synthetic.planted`, its plan in :mod:`~recsys.data.synthetic.plan`) and the
industrial-shaped wide data (:mod:`~recsys.data.synthetic.wide`).

The default dataset's public names are importable from here, as configs name them
(``class_path: recsys.data.synthetic.SyntheticReader``).
"""

from recsys.data.synthetic.planted import *  # noqa: F403  (its public names, as configs and callers name them)
from recsys.data.synthetic.planted import __all__ as __all__
