"""Per-round traffic in model sizes, from TFF types, against paper 004 Table 1.

download / upload per client: FedAvg x / x; FedGBO x+s / x; MFL x+s / x+s;
Mimelite x+s / x+grad f. s is one model size for SGDm and RMSProp, two for
Adam. Sizes come from `accounting.client_traffic` (the per-client TFF
computation's parameter and result types); scalars (learning rate, counters,
metrics) are allowed up to 1% of a model with the digits MLP (9,610 weights).
"""

import pytest

from tasks import TaskOptions, get_task
from tff_algos.algorithms import fedgbo
from tff_algos.algorithms import fedopt
from tff_algos.algorithms import mfl
from tff_algos.algorithms import mime
from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
from tff_algos.core import optimizers


@pytest.fixture(scope='module')
def task():
  return get_task('digits', TaskOptions(batch_size=16, num_clients=20, model='mlp'))


BUILDERS = {
    'fedavg': lambda f: fedopt.build_fedopt(f, fedopt.FedOptConfig(local_steps=5)),
    'fedgbo_sgdm': lambda f: fedgbo.build_fedgbo(f, fedgbo.FedGBOConfig(client_optimizer='sgdm')),
    'fedgbo_rmsprop': lambda f: fedgbo.build_fedgbo(f, fedgbo.FedGBOConfig(
        client_optimizer='rmsprop')),
    'fedgbo_adam': lambda f: fedgbo.build_fedgbo(f, fedgbo.FedGBOConfig(client_optimizer='adam')),
    'mfl_sgdm': lambda f: mfl.build_mfl(f, mfl.MFLConfig(client_optimizer='sgdm')),
    'mfl_adam': lambda f: mfl.build_mfl(f, mfl.MFLConfig(client_optimizer='adam')),
    'mfl_tff_adam': lambda f: mfl.build_mfl(f, mfl.MFLConfig(
        tff_optimizer=optimizers.OptimizerSpec('adam', 0.1))),
    'mimelite_sgdm': lambda f: mime.build_mime(f, mime.MimeConfig(client_optimizer='sgdm')),
    'mimexlite_adam': lambda f: mime.build_mime(f, mime.MimeConfig(
        client_optimizer='adam', gradient=mime.ONE_BATCH)),
}

# (download, upload) in model sizes.
TABLE_1 = {
    'fedavg': (1, 1),
    'fedgbo_sgdm': (2, 1),
    'fedgbo_rmsprop': (2, 1),
    'fedgbo_adam': (3, 1),
    'mfl_sgdm': (2, 2),
    'mfl_adam': (3, 3),
    'mfl_tff_adam': (3, 3),
    'mimelite_sgdm': (2, 2),
    'mimexlite_adam': (3, 2),
}


@pytest.mark.parametrize('name', sorted(TABLE_1))
def test_traffic_matches_table_1(task, name):
  traffic = BUILDERS[name](task.model_fn).traffic
  assert traffic.model_bytes == 9610 * 4
  download, upload = TABLE_1[name]
  assert download <= traffic.download_models <= download + 0.01, traffic
  assert upload <= traffic.upload_models <= upload + 0.01, traffic
