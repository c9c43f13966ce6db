"""The round loop and what it keeps on disk.

`run_training(algorithm, task, RunConfig(...))` (`loop`) trains any
`FederatedAlgorithm` on any `Task` (`task`: the protocol `tasks/` implements),
with sampling (`sampling`), client states on disk (`client_state`), a
checksummed run directory (`run_dir`), checkpoints, metrics and TensorBoard
(`outputs`). `RunConfig` (`config`) imports no TensorFlow; the loop does.
"""

from tff_algos import lazy
from tff_algos.training.config import RunConfig

__getattr__, __dir__ = lazy.attributes(__name__, 'loop', 'evaluation', 'initial_weights', 'task')
