"""Task name -> `TaskSpec` (`tasks.catalog`); `get_task` builds one from
`TaskOptions`.

Everything up to building a task imports no TensorFlow: `check_options`
refuses an unknown name, model or option combination before any data is
touched or any task module is imported.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from tasks.catalog import TASKS, TaskSpec
from tasks.options import TaskError, TaskOptions

if TYPE_CHECKING:
  from tasks.base import Task

_REGISTRY: dict[str, TaskSpec] = {spec.name: spec for spec in TASKS}
if len(_REGISTRY) != len(TASKS):
  raise ValueError('a task is declared twice in tasks.catalog.TASKS')


def list_tasks() -> dict[str, TaskSpec]:
  return dict(sorted(_REGISTRY.items()))


def get_spec(name: str) -> TaskSpec:
  if name not in _REGISTRY:
    raise TaskError(f'unknown task {name!r}; known tasks: {", ".join(list_tasks())}')
  return _REGISTRY[name]


def check_options(name: str, options: TaskOptions) -> TaskSpec:
  """Validates a task request cheaply (before any data is loaded)."""
  spec = get_spec(name)
  if options.batch_size < 1:
    raise TaskError(f'--client_batch_size must be >= 1, got {options.batch_size}')
  if options.model is not None and options.model not in spec.models:
    raise TaskError(f'task {name!r} has no model {options.model!r}; '
                    f'choose one of {", ".join(spec.models)}')
  if options.num_clients is not None and options.num_clients < 1:
    raise TaskError(f'--num_clients must be >= 1, got {options.num_clients}')
  cap = options.max_elements_per_user
  if cap is not None and cap < 1:
    raise TaskError(f'--max_elements_per_user must be >= 1, got {cap}')
  if options.unbalanced_sigma < 0:
    raise TaskError(f'--unbalanced_sigma must be >= 0, got {options.unbalanced_sigma}')
  for field in ('max_client_examples', 'test_examples'):
    value = getattr(options, field)
    if value is not None and value < 1:
      raise TaskError(f'--{field} must be >= 1, got {value}')
  if spec.check is not None:
    spec.check(options)
  return spec


def get_task(name: str, options: Optional[TaskOptions] = None) -> Task:
  options = options or TaskOptions()
  spec = check_options(name, options)
  task = limit_examples(spec.builder(options), options.max_client_examples,
                        options.test_examples)
  return cap_per_round(task, options.max_elements_per_user)


def limit_examples(task: Task, max_client_examples: Optional[int],
                   test_examples: Optional[int]) -> Task:
  """`task` with each client's training data cut to its first
  `max_client_examples` examples (as stored, before any shuffling: a fixed
  subset) and the test set cut to its first `test_examples` examples, so that
  every evaluation of a run uses the same test examples."""
  changes = {}
  if max_client_examples is not None:
    if hasattr(task.train_data, 'client_arrays'):  # in-memory splits read the arrays
      raise TaskError(f'max_client_examples is not supported by task {task.name!r} '
                      '(its clients are split here: set their sizes with its own options)')
    changes['train_data'] = task.train_data.preprocess(
        lambda ds: ds.take(max_client_examples))
  if test_examples is not None and task.test_data is not None:
    batch = task.info.get('eval_batch_size', 100)
    changes['test_data'] = task.test_data.unbatch().take(test_examples).batch(batch)
  if not changes:
    return task
  info = dict(task.info, max_client_examples=max_client_examples,
              test_examples=test_examples)
  return dataclasses.replace(task, info=info, **changes)


def cap_per_round(task: Task, cap: Optional[int]) -> Task:
  """Each round a client trains on at most `cap` of its examples: the first `cap`
  of its shuffled examples (TFF baselines' `ClientSpec.max_elements`, taken after
  the shuffle as there), so a fresh subset every round when it reshuffles.
  google-research's max_elements_per_user takes before its shuffle, a fixed
  subset: `limit_examples`."""
  if cap is None:
    return task
  preprocess, augment = task.preprocess_fn, task.augment_fn
  return dataclasses.replace(
      task, preprocess_fn=lambda ds: preprocess(ds.take(cap)),
      augment_fn=None if augment is None else (
          lambda ds, seed: augment(ds.take(cap), seed)),
      info=dict(task.info, max_elements_per_user=cap))
