"""The cost model: a candidate's time predicted from calibrations, without a GPU.

- :mod:`~syncopate.cost_model.calibration`: the measured curves it predicts from, and which source
  answers for a topology (:func:`resolve_calibration`);
- :mod:`~syncopate.cost_model.calibration_defaults`: the documented defaults where nothing was measured;
- :mod:`~syncopate.cost_model.simulate` and :mod:`~syncopate.cost_model.model`: a call simulated
  rank by rank, and :class:`CostModel`, which predicts, ranks and prunes candidates with it;
- :mod:`~syncopate.cost_model.host_time`: the host's time to enqueue a call, for mode `eager`.

Pure values and arithmetic (Python and numpy; no torch), below everything that predicts: the
strategies and the `model` runner, the lookup's cost-model rung and `syncopate calibrate`'s
defaults all import it from here.
"""

from syncopate.cost_model.calibration import Calibration, resolve_calibration
from syncopate.cost_model.calibration_defaults import default_calibration
from syncopate.cost_model.host_time import candidate_host_us, eager_us
from syncopate.cost_model.model import CostModel, Prediction

__all__ = [
    "Calibration",
    "CostModel",
    "Prediction",
    "candidate_host_us",
    "default_calibration",
    "eager_us",
    "resolve_calibration",
]
