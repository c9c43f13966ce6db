"""Datasets, preprocessing and models: `get_task(name, TaskOptions(...))`.

Importing the package, listing tasks and checking a request
(`check_options`) load no TensorFlow; `Task` and `get_task`'s builders do.
"""

from tasks.options import MissingData, TaskError, TaskOptions
from tasks.registry import check_options, get_task, list_tasks


def __getattr__(name):
  if name == 'Task':  # imports TensorFlow, so only when asked for
    from tasks.base import Task  # pylint: disable=g-import-not-at-top
    return Task
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
